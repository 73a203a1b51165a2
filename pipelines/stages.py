"""The prepare stages as plain functions. Each unit of work writes one file atomically, so
an engine (the local worker pool in ``prepare.py``, or Apache Beam in ``beam.py``) runs units
in any order and in any number of processes, and a re-run skips the files that exist.

Work directory (``OUT/work``)::

    config.json                          output config + hash (guards resume)
    chunks/chunk-IIII-CCCCCC.rec         stage 1 "ingest": families of input I, chunk C
    ingest.json                          stage 1 done: chunk list and totals
    plan/part-PPPPP.tsv, plan.json       stage 2 "plan": unique sequences per embedding part
    emb/part-PPPPP.array_record          stage 3 "embed": one file per part

Stage 4 ``finalize`` turns these into the dataset (see pipelines/README.md).

A chunk file holds one header record, then per family a ``family`` record, its ``seq``
records (unique used sequences) and its ``pair`` records. Embedding parts are hash buckets
of the unique sequences (``config.part_of``), sorted by (length, hash) inside a part; the
global embedding index is the part order then that order, so the dataset is a deterministic
function of the inputs and the config, whatever the engine, worker count or interruptions.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import shutil
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from pfamalign.outputs import TEMPORARY_GLOB
from pfamalign.pipelines import records as rec
from pfamalign.pipelines.config import part_of
from pfamalign.pipelines.pairs import SamplingConfig, sample_family
from pfamalign.pipelines.splits import SPLITS, assign_fold_split, assign_split
from pfamalign.pipelines.stockholm import RawFamily, StockholmError, accession_base, parse_family


def chunk_name(input_index: int, chunk_index: int) -> str:
    return f"chunk-{input_index:04d}-{chunk_index:06d}.rec"


def in_stream_order(chunks):
    """Chunk files (``chunk_name``'s) in stream order: by their numbers, so that chunk-10000-*
    (a 10,001st input) follows chunk-9999-*, where a sort by name would not."""
    return sorted(chunks, key=lambda p: tuple(int(x) for x in pathlib.Path(p).stem.split("-")[1:]))


def part_name(part: int) -> str:
    return f"part-{part:05d}"


@dataclasses.dataclass(frozen=True)
class WorkDir:
    root: pathlib.Path

    @property
    def config(self) -> pathlib.Path:
        return self.root / "config.json"

    @property
    def chunks(self) -> pathlib.Path:
        return self.root / "chunks"

    @property
    def ingest(self) -> pathlib.Path:
        return self.root / "ingest.json"

    @property
    def plan(self) -> pathlib.Path:
        return self.root / "plan"

    @property
    def plan_json(self) -> pathlib.Path:
        return self.root / "plan.json"

    @property
    def emb(self) -> pathlib.Path:
        return self.root / "emb"

    def make(self) -> None:
        for d in (self.chunks, self.plan, self.emb):
            d.mkdir(parents=True, exist_ok=True)

    def plan_file(self, part: int) -> pathlib.Path:
        return self.plan / f"{part_name(part)}.tsv"

    def emb_file(self, part: int) -> pathlib.Path:
        return self.emb / f"{part_name(part)}.array_record"


def clean_tmp(directory: pathlib.Path) -> None:
    """Removes temporary files left by a killed run."""
    if directory.is_dir():
        for p in directory.glob(TEMPORARY_GLOB):
            p.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------
# Stage 1: ingest (parse, split, sample pairs, targets)
# ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class IngestOptions:
    sampling: SamplingConfig
    seed: int
    split_fractions: tuple[float, float, float]
    fold: tuple[int, int] | None  # cross-validation fold (K, N): overrides split_fractions
    skip_bad: bool
    max_residues: int | None


def _family_meta(raw: RawFamily, **fields) -> dict:
    meta = {
        "kind": "family",
        "key": raw.key if raw.error is None else "",
        "accession_base": accession_base(raw.key) if raw.error is None else "",
        "name": raw.name or "",
        "source": raw.source,
        "input_index": raw.input_index,
        "index": raw.index,
        "start_line": raw.start_line,
        "split": "",
        "n_seqs": 0,
        "n_usable": 0,
        "n_pairs": 0,
        "n_seq_records": 0,
        "skip": "",
        "error": "",
        "seq_skips": "{}",
        "pairs_no_aligned": 0,
    }
    meta.update(fields)
    return meta


def process_family(raw: RawFamily, duplicate_of: str | None, opts: IngestOptions,
                   ) -> tuple[dict, list[dict], list[dict]]:
    """One family -> (family meta record, seq records, pair records)."""
    if raw.error is not None:
        return _family_meta(raw, skip="malformed Stockholm", error=str(raw.error)), [], []
    if duplicate_of is not None:
        return _family_meta(raw, skip="duplicate family key",
                            error=f"{raw.key} already read from {duplicate_of}"), [], []
    try:
        family = parse_family(raw)
    except StockholmError as err:
        if not opts.skip_bad:
            raise
        return _family_meta(raw, skip="malformed Stockholm", error=str(err)), [], []
    if opts.fold is None:
        split = assign_split(family.key, seed=opts.seed, fractions=opts.split_fractions)
    else:
        split = assign_fold_split(family.key, fold=opts.fold[0], n_folds=opts.fold[1],
                                  seed=opts.seed)
    fp = sample_family(family, opts.sampling, seed=opts.seed, split=split,
                       max_residues=opts.max_residues)
    meta = _family_meta(raw, split=split, n_seqs=fp.n_seqs, n_usable=fp.n_usable,
                        n_pairs=len(fp.pairs), n_seq_records=len(fp.seqs), skip=fp.skip or "",
                        seq_skips=json.dumps(dict(sorted(fp.seq_skips.items()))),
                        pairs_no_aligned=fp.pairs_no_aligned)
    if fp.skip is None and not fp.pairs:
        meta["skip"] = "no pair with aligned residues"
    seqs = [{"kind": "seq", "hash": h, "residues": s} for h, s in sorted(fp.seqs.items())]
    pairs = [{"kind": "pair", **p} for p in fp.pairs]
    return meta, seqs, pairs


def process_chunk(items: Sequence[tuple[RawFamily, str | None]], path: os.PathLike,
                  opts: IngestOptions) -> dict:
    """Stage-1 unit: processes a chunk of families and writes its chunk file atomically."""
    body: list[bytes] = []
    header = {"kind": "chunk", "n_families": 0, "n_seq_records": 0, "n_pairs": 0,
              **{f"pairs_{s}": 0 for s in SPLITS}}
    for raw, dup in items:
        meta, seqs, pairs = process_family(raw, dup, opts)
        header["n_families"] += 1
        header["n_seq_records"] += len(seqs)
        header["n_pairs"] += len(pairs)
        if pairs:
            header[f"pairs_{meta['split']}"] += len(pairs)
        body.append(rec.encode(meta))
        body.extend(rec.encode(s) for s in seqs)
        body.extend(rec.encode(p) for p in pairs)
    # work files are read back twice and then deleted: not worth compressing
    rec.write_array_record(path, [rec.encode(header), *body], options=rec.UNCOMPRESSED_OPTIONS)
    return header


def read_chunk_header(path: os.PathLike) -> dict:
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path))
    try:
        return rec.decode(reader.read([0])[0])
    finally:
        reader.close()


def iter_chunk(path: os.PathLike) -> Iterator[dict]:
    """Decoded records of a chunk file after its header."""
    it = rec.read_array_record(path)
    next(it)
    for raw in it:
        yield rec.decode(raw)


# ------------------------------------------------------------------------------------------
# Stage 2: plan the embedding parts (unique sequences, hash buckets)
# ------------------------------------------------------------------------------------------

def plan_parts(work: WorkDir, chunk_paths: Sequence[pathlib.Path], n_parts: int, *,
               max_open: int = 256) -> dict:
    """Scatters every chunk's sequences into ``n_parts`` hash buckets, deduplicates and sorts
    each by (length, hash); writes ``plan/part-*.tsv`` and ``plan.json``. Returns the plan."""
    clean_tmp(work.plan)
    counts = [0] * n_parts
    residues = [0] * n_parts
    for lo in range(0, n_parts, max_open):
        hi = min(n_parts, lo + max_open)
        scatter = {p: open(work.plan / f".scatter-{p:05d}.tmp", "w", encoding="ascii")
                   for p in range(lo, hi)}
        try:
            for path in chunk_paths:
                for r in iter_chunk(path):
                    if r["kind"] == "seq":
                        p = part_of(r["hash"], n_parts)
                        if lo <= p < hi:
                            scatter[p].write(f"{r['hash']}\t{r['residues']}\n")
        finally:
            for f in scatter.values():
                f.close()
        for p in range(lo, hi):
            tmp = work.plan / f".scatter-{p:05d}.tmp"
            unique = {}
            with open(tmp, encoding="ascii") as f:
                for line in f:
                    h, s = line.rstrip("\n").split("\t")
                    unique[h] = s
            rows = sorted(unique.items(), key=lambda hs: (len(hs[1]), hs[0]))
            rec.write_text(work.plan_file(p), "".join(f"{h}\t{s}\n" for h, s in rows))
            tmp.unlink()
            counts[p] = len(rows)
            residues[p] = sum(len(s) for _, s in rows)
    plan = {"n_parts": n_parts, "counts": counts, "residues": residues,
            "n_unique": sum(counts), "n_residues": sum(residues)}
    rec.write_json(work.plan_json, plan)
    return plan


def read_plan_part(path: os.PathLike) -> list[tuple[str, str]]:
    with open(path, encoding="ascii") as f:
        return [tuple(line.rstrip("\n").split("\t")) for line in f if line.strip()]


# ------------------------------------------------------------------------------------------
# Stage 3: embed one part
# ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EmbedderSpec:
    """How a worker process rebuilds the embedder (picklable)."""

    embedder_id: str
    weights: str | None
    long_policy: str
    toks_per_batch: int
    threads: int | None = None
    device: str = "cpu"

    def build(self):
        from pfamalign.pipelines.embed import get_embedder

        return get_embedder(self.embedder_id, self.weights, long_policy=self.long_policy,
                            toks_per_batch=self.toks_per_batch, threads=self.threads,
                            device=self.device)


_EMBEDDERS: dict[EmbedderSpec, object] = {}


def _embedder_for(spec_or_embedder):
    if not isinstance(spec_or_embedder, EmbedderSpec):
        return spec_or_embedder
    if spec_or_embedder not in _EMBEDDERS:
        _EMBEDDERS[spec_or_embedder] = spec_or_embedder.build()
    return _EMBEDDERS[spec_or_embedder]


def _damaged(dataset: str, err: Exception) -> ValueError:
    return ValueError(f"--reuse-embeddings {dataset}: its embeddings are damaged ({err}); "
                      f"`pfamalign verify {dataset}` checks its shards; re-run prepare for it, or "
                      "leave it out")


class EmbeddingCache:
    """Embeddings of earlier datasets, looked up by sequence hash (``--reuse-embeddings``).

    Only datasets with the same embedder id, weights fingerprint and storage dtype qualify
    (:meth:`validate`); a hit copies the stored record bytes instead of embedding again.
    Picklable: indexes load lazily in each process.
    """

    def __init__(self, datasets: Sequence[str | os.PathLike]):
        self.datasets = tuple(str(d) for d in datasets)
        self._loaded: list[tuple[str, dict[str, int], object]] | None = None

    def validate(self, *, embedder_id: str, fingerprint: str, dtype: str) -> None:
        """Raises ValueError naming the first dataset that cannot serve this run. The dataset
        an ``--overwrite`` replaces may serve it: the replacement is built beside it and swapped
        in after the embeddings are copied (``prepare._swap_in``)."""
        from pfamalign.pipelines.reader import PairDataset

        for d in self.datasets:
            try:  # a finished dataset of this format, its shards of the recorded sizes
                emb = PairDataset(d).manifest["embedder"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise ValueError(f"--reuse-embeddings {d}: {err}") from None
            want = {"id": embedder_id, "fingerprint": fingerprint, "dtype": dtype}
            got = {k: emb.get(k) for k in want}
            if got != want:
                differ = ", ".join(k for k in want if got[k] != want[k])
                describe = lambda e: f"{e['id']} (weights fingerprint {e['fingerprint']}, {e['dtype']})"
                raise ValueError(f"--reuse-embeddings {d}: its embeddings are {describe(got)}, this run "
                                 f"needs {describe(want)} (they differ in: {differ}); give a dataset "
                                 "prepared with this --embedder, --weights and --dtype, or leave it out")

    def _load(self):
        if self._loaded is None:
            self._loaded = []
            for d in self.datasets:
                root = pathlib.Path(d)
                manifest = json.loads((root / "manifest.json").read_text())
                files = [str(root / x) for x in manifest["embeddings"]["shards"]]
                try:
                    with open(root / manifest["embeddings"]["index"]) as f:
                        next(f)
                        index = {h: int(i) for h, _, i in (line.split("\t") for line in f)}
                    source = rec.array_records(files) if files else None
                except (OSError, UnicodeDecodeError, ValueError, StopIteration,
                        RuntimeError) as err:  # RuntimeError: array_record on a corrupt file
                    raise _damaged(d, err) from None
                self._loaded.append((d, index, source))
        return self._loaded

    def get(self, seq_hash: str, length: int) -> bytes | None:
        """The stored embedding record of ``seq_hash`` (a sequence of ``length`` residues),
        or None. Raises ValueError when a dataset's shards are damaged or its index points at
        another sequence's record (copying it would silently store wrong embeddings)."""
        for d, index, source in self._load():
            i = index.get(seq_hash)
            if i is None:
                continue
            try:
                raw = source[i]
                got = rec.decode(raw)
            except (RuntimeError, ValueError, IndexError, TypeError) as err:
                raise _damaged(d, err) from None
            if (got.get("hash"), got.get("length"), len(got.get("emb", ()))) != \
                    (seq_hash, length, length):
                raise ValueError(
                    f"--reuse-embeddings {d}: embeddings/index.tsv sends sequence {seq_hash} "
                    f"({length} residues) to record {i}, which holds {got.get('hash')} "
                    f"({got.get('length')} residues): the index does not match the shards; "
                    f"re-run prepare for {d}, or leave it out")
            return raw
        return None

    def __getstate__(self):
        return {"datasets": self.datasets, "_loaded": None}


def embed_part(plan_path: os.PathLike, out_path: os.PathLike, embedder, *, dtype: str,
               cache: EmbeddingCache | None = None, batch_residues: int = 65536) -> dict:
    """Stage-3 unit: embeds one part's sequences (in plan order) and writes its file.

    ``embedder`` is an :class:`~pfamalign.pipelines.embed.Embedder` or an
    :class:`EmbedderSpec` (built once per process). Sequences go to the embedder in groups of
    about ``batch_residues`` residues; the ESM embedder batches them by tokens inside a group.
    Sequences found in ``cache`` are copied instead. Returns counts (``n``, ``residues``,
    ``from_cache``).
    """
    emb = _embedder_for(embedder)
    rows = read_plan_part(plan_path)
    np_dtype = np.dtype(dtype)
    hits = 0

    def encode_group(group: list[tuple[str, str]]) -> Iterator[bytes]:
        nonlocal hits
        out: list[bytes | None] = [cache.get(h, len(s)) if cache is not None else None
                                   for h, s in group]
        missing = [i for i, raw in enumerate(out) if raw is None]
        hits += len(group) - len(missing)
        feats = emb.embed([group[i][1] for i in missing]) if missing else []
        for i, f in zip(missing, feats):
            h, s = group[i]
            if f.shape != (len(s), emb.dim):
                raise RuntimeError(f"embedder returned shape {f.shape} for a sequence of "
                                   f"{len(s)} residues (expected [{len(s)}, {emb.dim}])")
            out[i] = rec.encode({"hash": h, "length": len(s),
                                 "emb": np.asarray(f).astype(np_dtype)})
        yield from out

    def produce() -> Iterator[bytes]:
        group: list[tuple[str, str]] = []
        size = 0
        for h, s in rows:
            if group and size + len(s) > batch_residues:
                yield from encode_group(group)
                group, size = [], 0
            group.append((h, s))
            size += len(s)
        if group:
            yield from encode_group(group)

    compress = getattr(emb, "embedder_id", "").startswith("builtin/")
    n = rec.write_array_record(out_path, produce(), options=rec.WRITER_OPTIONS if compress
                               else rec.UNCOMPRESSED_OPTIONS)
    return {"n": n, "residues": sum(len(s) for _, s in rows), "from_cache": hits}


# ------------------------------------------------------------------------------------------
# Stage 4: finalize (dataset files, manifest)
# ------------------------------------------------------------------------------------------

def embedding_index(work: WorkDir, plan: dict) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """hash -> global embedding index, and the (hash, length) list in index order."""
    index: dict[str, int] = {}
    order: list[tuple[str, int]] = []
    for p in range(plan["n_parts"]):
        for h, s in read_plan_part(work.plan_file(p)):
            index[h] = len(order)
            order.append((h, len(s)))
    return index, order


def link_or_copy(src: pathlib.Path, dst: pathlib.Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


class _ShardedWriter:
    """Writes a split's pair records into ``n_shards`` files of ``per_shard`` records."""

    def __init__(self, directory: pathlib.Path, n_records: int, per_shard: int):
        from array_record.python.array_record_module import ArrayRecordWriter

        self._writer_cls = ArrayRecordWriter
        self.directory = directory
        self.per_shard = per_shard
        self.n_shards = -(-n_records // per_shard) if n_records else 0
        self.paths = [directory / f"pairs-{i:05d}-of-{self.n_shards:05d}.array_record"
                      for i in range(self.n_shards)]
        self.counts = [0] * self.n_shards
        self._cur = -1
        self._writer = None
        self._n = 0
        self.lengths: list[tuple[int, int]] = []

    def _tmp(self, i: int) -> pathlib.Path:
        return self.paths[i].with_name(f".{self.paths[i].name}.tmp")

    def write(self, data: bytes, q_len: int, k_len: int) -> None:
        shard = self._n // self.per_shard
        if shard != self._cur:
            if self._writer is not None:
                self._writer.close()
            self._cur = shard
            self._writer = self._writer_cls(str(self._tmp(shard)), rec.WRITER_OPTIONS)
        self._writer.write(data)
        self.counts[shard] += 1
        self._n += 1
        self.lengths.append((q_len, k_len))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        for i in range(self.n_shards):
            rec.commit(self._tmp(i), self.paths[i])
        np.save(self.directory / "lengths.npy",
                np.asarray(self.lengths, dtype=np.int32).reshape(-1, 2))


def finalize(work: WorkDir, out: pathlib.Path, chunk_paths: Sequence[pathlib.Path], plan: dict,
             *, pair_counts: dict[str, int], records_per_shard: int,
             progress: Iterable | None = None) -> dict:
    """Writes the dataset: embeddings (linked from the work dir), pair shards per split,
    ``lengths.npy`` per split and the per-family table. Returns counts for the manifest."""
    index, order = embedding_index(work, plan)
    emb_dir = out / "embeddings"
    emb_dir.mkdir(parents=True, exist_ok=True)
    clean_tmp(emb_dir)
    n_parts = plan["n_parts"]
    emb_files = []
    for p in range(n_parts):
        dst = emb_dir / f"emb-{p:05d}-of-{n_parts:05d}.array_record"
        link_or_copy(work.emb_file(p), dst)
        emb_files.append(dst)
    rec.write_text(emb_dir / "index.tsv", "hash\tlength\tindex\n" + "".join(
        f"{h}\t{n}\t{i}\n" for i, (h, n) in enumerate(order)))

    writers = {}
    for split in SPLITS:
        d = out / split
        d.mkdir(parents=True, exist_ok=True)
        clean_tmp(d)
        for old in d.glob("pairs-*.array_record"):
            old.unlink()
        writers[split] = _ShardedWriter(d, pair_counts.get(split, 0), records_per_shard)

    families: list[dict] = []
    residues = collections.Counter()
    for path in chunk_paths:
        for r in iter_chunk(path):
            kind = r.pop("kind")
            if kind == "family":
                families.append(r)
            elif kind == "pair":
                r["q_emb"] = index[r["q_hash"]]
                r["k_emb"] = index[r["k_hash"]]
                split = r["split"]
                writers[split].write(rec.encode(r), r["q_len"], r["k_len"])
                residues[split] += r["q_len"] + r["k_len"]
                if progress is not None:
                    progress(1)
    for w in writers.values():
        w.close()
    shard_files = {s: list(zip(w.paths, w.counts)) for s, w in writers.items()}
    return {"families": families, "emb_files": emb_files, "shard_files": shard_files,
            "pair_residues": dict(residues), "n_embeddings": len(order)}
