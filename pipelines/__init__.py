"""pfamalign.pipelines: from Pfam Stockholm files to training-ready datasets.

Modules (contracts in pipelines/README.md):

* ``stockholm`` — streaming Stockholm reader (files, directories, Pfam-A.seed.gz).
* ``pairs`` — residues, column-based targets, percent identity, pair sampling.
* ``splits`` — family-level train / val / test assignment by accession hash.
* ``embed`` — ``get_embedder(id, weights)``: builtin featurizer and ESM-2 (fair-esm).
* ``records`` — record codec, sequence hash, atomic ArrayRecord files.
* ``stages`` / ``prepare`` / ``beam`` — the prepare stages and their local / Beam engines.
* ``reader`` — grain sources, padded batches and checkpointable iterators for training.

Nothing heavy is imported here: ``import pfamalign.pipelines.embed`` stays cheap.
"""
