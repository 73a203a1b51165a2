"""From a parsed family to pair records: residues, column-based targets, identity, sampling.

Definitions (the pair-record contract, see pipelines/README.md):

* Residues of a row: its letters in order, gaps (``-``, ``.``, ``~``) removed, upper-cased.
* Aligned residue pair: query residue i and key residue j sit in the same alignment column
  and both are *match-state* residues. Match state follows the Pfam / HMMER convention:
  upper-case letters are match states, lower-case letters are insert states (hmmalign inserts,
  the lower-case stretches of old Pfam seeds) and are never aligned to anything. With
  ``inserts_aligned=True`` every residue counts, whatever its case.
* ``target[i]`` = index j of the key residue aligned to query residue i, else -1.
  Targets are strictly increasing where >= 0 (columns are ordered) and each j occurs once.
* ``pid`` = 100 * (aligned pairs with the same upper-case letter) / (aligned pairs), in
  percent; ``n_aligned`` = number of aligned pairs = count of ``target >= 0``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter

import numpy as np

from pfamalign.pipelines.records import seq_hash
from pfamalign.pipelines.stockholm import Family

_GAP_CODES = np.frombuffer(b"-.~", dtype=np.uint8)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Per-family pair sampling.

    Attributes:
      pairs_per_family: pairs drawn per family (all pairs when the family has fewer).
      min_len, max_len: residue-count limits on a sequence for it to be used at all.
      stratify_pid: draw a candidate pool of ``pool_factor * pairs_per_family`` pairs and take
        them round-robin across percent-identity bins (edges ``pid_bins``) instead of uniformly.
      inserts_aligned: count lower-case (insert-state) residues as aligned by column.
      min_aligned: pairs with fewer aligned residue pairs are dropped (and counted).
    """

    pairs_per_family: int = 50
    min_len: int = 10
    max_len: int = 1022
    stratify_pid: bool = False
    pid_bins: tuple[float, ...] = (30.0, 50.0)
    pool_factor: int = 8
    inserts_aligned: bool = False
    min_aligned: int = 1

    def __post_init__(self):
        if self.pairs_per_family < 1:
            raise ValueError(f"pairs_per_family must be >= 1, got {self.pairs_per_family}")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")
        if list(self.pid_bins) != sorted(self.pid_bins):
            raise ValueError(f"pid_bins must be increasing, got {self.pid_bins}")
        if not all(0 <= edge <= 100 for edge in self.pid_bins):  # percent; False for nan
            raise ValueError(f"pid_bins are percent identities in [0, 100], got {self.pid_bins}")
        if self.pool_factor < 1:
            raise ValueError(f"pool_factor must be >= 1, got {self.pool_factor}")


@dataclasses.dataclass(frozen=True)
class FamilyArrays:
    """Column views of a family. Shapes: n rows, C columns."""

    residues: tuple[str, ...]  # upper-case ungapped residue strings
    is_res: np.ndarray  # [n, C] bool: a residue sits here
    is_match: np.ndarray  # [n, C] bool: a residue that may be aligned (match state)
    upper: np.ndarray  # [n, C] uint8: upper-cased character codes
    pos: np.ndarray  # [n, C] int32: residue index of the row at this column (valid if is_res)


def family_arrays(family: Family, *, inserts_aligned: bool = False) -> FamilyArrays:
    n, c = len(family.rows), family.n_columns
    codes = np.frombuffer("".join(family.rows).encode("ascii"), dtype=np.uint8).reshape(n, c)
    is_res = ~np.isin(codes, _GAP_CODES)
    lower = (codes >= ord("a")) & (codes <= ord("z"))
    upper = np.where(lower, codes - 32, codes).astype(np.uint8)
    is_match = is_res if inserts_aligned else (is_res & ~lower)
    pos = (np.cumsum(is_res, axis=1, dtype=np.int32) - 1).astype(np.int32)
    residues = tuple(upper[i][is_res[i]].tobytes().decode("ascii") for i in range(n))
    return FamilyArrays(residues, is_res, is_match, upper, pos)


def pair_target(fa: FamilyArrays, q: int, k: int) -> np.ndarray:
    """``target[Lq]``: key residue index aligned to each query residue, or -1."""
    cols = np.nonzero(fa.is_res[q])[0]
    aligned = fa.is_match[q, cols] & fa.is_match[k, cols]
    return np.where(aligned, fa.pos[k, cols], -1).astype(np.int32)


def pair_identity(fa: FamilyArrays, q: np.ndarray, k: np.ndarray, *, batch: int = 2048
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Percent identity and aligned-pair count for arrays of row indices ``q``, ``k`` [P],
    ``batch`` pairs at a time (a pool can grow to every pair of a large family: its ``[P, C]``
    masks at once took gigabytes)."""
    n_al = np.zeros(len(q), np.int64)
    n_id = np.zeros(len(q), np.int64)
    for start in range(0, len(q), batch):
        qb, kb = q[start:start + batch], k[start:start + batch]
        aligned = fa.is_match[qb] & fa.is_match[kb]  # [batch, C]
        n_al[start:start + batch] = aligned.sum(axis=1)
        n_id[start:start + batch] = (aligned & (fa.upper[qb] == fa.upper[kb])).sum(axis=1)
    pid = np.where(n_al > 0, 100.0 * n_id / np.maximum(n_al, 1), 0.0)
    return pid, n_al


def family_rng(seed: int, key: str, purpose: str) -> np.random.Generator:
    digest = hashlib.blake2b(f"pfamalign-{purpose}:{seed}:{key}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "big"))


def _draw_unordered(m: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct unordered pairs of ``range(m)`` as an array [count, 2] (a < b)."""
    total = m * (m - 1) // 2
    count = min(count, total)
    if total <= max(4 * count, 4096):
        a, b = np.triu_indices(m, k=1)
        pick = rng.choice(total, size=count, replace=False)
        return np.stack([a[pick], b[pick]], axis=1)
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    while len(out) < count:
        draw = rng.integers(0, m, size=(2 * (count - len(out)) + 8, 2))
        for a, b in draw.tolist():
            if a == b:
                continue
            pair = (a, b) if a < b else (b, a)
            if pair not in seen:
                seen.add(pair)
                out.append(pair)
                if len(out) == count:
                    break
    return np.asarray(out, dtype=np.int64)


@dataclasses.dataclass
class FamilyPairs:
    """Everything stage 1 keeps of a family: used sequences, pairs and per-family counts."""

    seqs: dict[str, str]  # hash -> residues, used sequences of this family
    pairs: list[dict]
    n_seqs: int
    n_usable: int
    seq_skips: Counter
    pairs_no_aligned: int  # candidate pairs rejected: fewer than min_aligned aligned residues
    skip: str | None  # reason the whole family was skipped, else None


def sample_family(family: Family, cfg: SamplingConfig, *, seed: int, split: str,
                  max_residues: int | None = None) -> FamilyPairs:
    """Builds the family's pair records (without embedding indices).

    ``max_residues`` is the embedder's hard limit when it refuses longer sequences; such
    sequences are left out and counted like the length limits.
    """
    n = len(family.rows)
    skips: Counter = Counter()
    if n < 2:
        return FamilyPairs({}, [], n, 0, skips, 0, "fewer than two sequences")
    fa = family_arrays(family, inserts_aligned=cfg.inserts_aligned)
    usable = []
    for i, res in enumerate(fa.residues):
        length = len(res)
        if length == 0:
            skips["empty (all gaps)"] += 1
        elif length < cfg.min_len:
            skips[f"shorter than min_len={cfg.min_len}"] += 1
        elif length > cfg.max_len:
            skips[f"longer than max_len={cfg.max_len}"] += 1
        elif max_residues is not None and length > max_residues:
            skips[f"longer than the embedder limit ({max_residues})"] += 1
        else:
            usable.append(i)
    if len(usable) < 2:
        return FamilyPairs({}, [], n, len(usable), skips, 0,
                           "fewer than two sequences within the length limits")

    u = np.asarray(usable)
    n_pool = cfg.pairs_per_family * (cfg.pool_factor if cfg.stratify_pid else 2)
    total = len(u) * (len(u) - 1) // 2
    while True:  # a pool short of usable pairs (fragments that share no column) is drawn again,
        # twice as large, until it holds pairs_per_family of them or every pair; the first draw
        # is the same whatever comes after, so a family it serves keeps its pairs
        rng = family_rng(seed, family.key, "pairs")
        pool = u[_draw_unordered(len(u), n_pool, rng)]  # [P, 2] row indices
        flip = rng.random(len(pool)) < 0.5
        q = np.where(flip, pool[:, 1], pool[:, 0])
        k = np.where(flip, pool[:, 0], pool[:, 1])
        pid, n_al = pair_identity(fa, q, k)
        keep = n_al >= cfg.min_aligned
        if keep.sum() >= cfg.pairs_per_family or n_pool >= total:
            break
        n_pool = min(2 * n_pool, total)
    no_aligned = int((~keep).sum())
    order = np.nonzero(keep)[0]
    if cfg.stratify_pid:
        bins = np.digitize(pid[order], cfg.pid_bins)
        queues = [list(order[bins == b]) for b in range(len(cfg.pid_bins) + 1)]
        chosen: list[int] = []
        while len(chosen) < cfg.pairs_per_family and any(queues):
            for qu in queues:
                if qu and len(chosen) < cfg.pairs_per_family:
                    chosen.append(qu.pop(0))
    else:
        chosen = list(order[: cfg.pairs_per_family])

    seqs: dict[str, str] = {}
    pairs: list[dict] = []
    for idx, p in enumerate(chosen):
        qi, ki = int(q[p]), int(k[p])
        q_seq, k_seq = fa.residues[qi], fa.residues[ki]
        target = pair_target(fa, qi, ki)
        q_hash, k_hash = seq_hash(q_seq), seq_hash(k_seq)
        seqs[q_hash] = q_seq
        seqs[k_hash] = k_seq
        pairs.append({
            "family": family.key,
            "family_id": family.name,
            "pair_index": idx,
            "split": split,
            "q_id": family.seq_ids[qi],
            "k_id": family.seq_ids[ki],
            "q_seq": q_seq,
            "k_seq": k_seq,
            "q_hash": q_hash,
            "k_hash": k_hash,
            "q_len": len(q_seq),
            "k_len": len(k_seq),
            "target": target.astype(np.int16 if len(k_seq) < 32767 else np.int32),
            "pid": float(pid[p]),
            "n_aligned": int(n_al[p]),
        })
    return FamilyPairs(seqs, pairs, n, len(usable), skips, no_aligned, None)
