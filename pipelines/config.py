"""The prepare configuration and its hash (what makes two datasets byte-identical)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from pfamalign.pipelines.pairs import SamplingConfig
from pfamalign.pipelines.splits import (DEFAULT_FRACTIONS, FOLD_VAL_FRACTION, check_fold,
                                        check_fractions)

FORMAT_VERSION = 1
DTYPES = ("float16", "float32")


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """Options of ``pfamalign prepare shards`` (the CLI maps its flags onto these fields).

    Output-determining fields enter :meth:`output_config` / the config hash; ``workers``,
    ``keep_work``, ``overwrite``, ``engine``, ``beam_args``, ``device``, ``threads``,
    ``reuse_embeddings`` and paths do not (any worker count gives the same bytes; reused embeddings are those of the same
    embedder and weights). ``toks_per_batch`` enters it, but a run recorded with another
    batch size and otherwise the same options resumes under its recorded one
    (``prepare._with_recorded_batch_size``).
    """

    inputs: tuple[str, ...]
    out: str
    embedder: str = "builtin/onehot"
    weights: str | None = None
    long_policy: str = "refuse"  # ESM-2 sequences > 1022 residues: "refuse" or "window"
    toks_per_batch: int = 4096
    dtype: str = "float16"
    sampling: SamplingConfig = SamplingConfig()
    split_fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
    fold: tuple[int, int] | None = None  # (K, N): cross-validation fold K of N, replaces the fractions
    seed: int = 0
    skip_bad: bool = False
    families_per_chunk: int = 64
    seqs_per_part: int = 2048
    records_per_shard: int = 20000
    workers: int = 1
    keep_work: bool = False
    overwrite: bool = False
    device: str = "cpu"
    threads: int | None = None  # torch intra-op threads per process (None: torch's default)
    engine: str = "local"  # "local" or "beam"
    beam_args: tuple[str, ...] = ()
    reuse_embeddings: tuple[str, ...] = ()  # finished datasets whose embeddings may be copied

    def __post_init__(self):
        if not self.inputs:
            raise ValueError("at least one --pfam input is required")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.long_policy not in ("refuse", "window"):
            raise ValueError(f"long_policy must be 'refuse' or 'window', got {self.long_policy!r}")
        if self.engine not in ("local", "beam"):
            raise ValueError(f"engine must be 'local' or 'beam', got {self.engine!r}")
        check_fractions(self.split_fractions)
        if self.fold is not None:
            check_fold(*self.fold)
        for name in ("families_per_chunk", "seqs_per_part", "records_per_shard", "workers",
                     "toks_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def output_config(self, *, input_digests: list[list[str]], embedder_id: str,
                      embedder_fingerprint: str, dim: int) -> dict:
        """Everything the output bytes depend on (inputs by content digest, not by path)."""
        return {
            "format_version": FORMAT_VERSION,
            "inputs": input_digests,
            "embedder": {"id": embedder_id, "fingerprint": embedder_fingerprint, "dim": dim,
                         "dtype": self.dtype, "long_policy": self.long_policy,
                         "toks_per_batch": self.toks_per_batch},
            "sampling": dataclasses.asdict(self.sampling),
            **self._split_rule(),
            "seed": self.seed,
            "skip_bad": self.skip_bad,
            "families_per_chunk": self.families_per_chunk,
            "seqs_per_part": self.seqs_per_part,
            "records_per_shard": self.records_per_shard,
        }

    def _split_rule(self) -> dict:
        """The split entries of the output config (without a fold, exactly the keys of
        datasets made before folds existed, so their hashes do not change)."""
        if self.fold is None:
            return {"split_fractions": list(self.split_fractions)}
        return {"fold": list(self.fold), "fold_val_fraction": FOLD_VAL_FRACTION}


def config_hash(output_config: dict) -> str:
    blob = json.dumps(output_config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def n_parts_for(n_seq_records: int, seqs_per_part: int) -> int:
    """Number of embedding parts (from the count of per-family sequence records)."""
    return max(1, math.ceil(n_seq_records / seqs_per_part))


def part_of(seq_hash_hex: str, n_parts: int) -> int:
    """Embedding part of a sequence: a hash bucket (needs no global sort; Beam-friendly)."""
    return int(seq_hash_hex[:12], 16) % n_parts
