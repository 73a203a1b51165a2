"""Aligned-pair representation shared by the decoder, the baselines, the metrics and formats.

An alignment of a query ``A`` (length ``Lq``) and a key ``B`` (length ``Lk``) is an int array
``pairs [n, 2]`` of 0-based ``(i, j)``: residue ``A[i]`` is aligned to ``B[j]``. A *proper*
alignment is strictly increasing in both columns (each residue used at most once, no crossing);
residues absent from ``pairs`` are gaps. Reference alignments come as ``target [Lq]``: key index
of query row i, or -1 (unaligned).
"""

from __future__ import annotations

import dataclasses

import numpy as np


def check_confidence(confidence, n_pairs: int) -> np.ndarray | None:
    """Per-pair confidences as float64 ``[n_pairs]`` (None stays None)."""
    if confidence is None:
        return None
    conf = np.asarray(confidence, dtype=np.float64)
    if conf.shape != (n_pairs,):
        raise ValueError(f"confidence must have shape ({n_pairs},) to match pairs, got {conf.shape}")
    if not np.isfinite(conf).all():
        raise ValueError("confidence must be finite (a probability per pair)")
    return conf


@dataclasses.dataclass(frozen=True, eq=False)
class PairAlignment:
    """A decoded or baseline pairwise alignment.

    Attributes:
      pairs: ``[n, 2]`` int64, 0-based ``(i, j)``, strictly increasing in both columns.
      confidence: ``[n]`` float64 per-pair confidence (plan mass for the MEA decoder), or None
        when the method has none (the substitution-matrix baselines).
      score: the method's objective value (summed plan mass minus gap costs for MEA; the
        BLOSUM62 alignment score for Needleman-Wunsch / Smith-Waterman).
      query_length: ``Lq``; key_length: ``Lk``.
    """

    pairs: np.ndarray  # [n, 2]
    confidence: np.ndarray | None  # [n]
    score: float
    query_length: int
    key_length: int

    def __post_init__(self):
        pairs = check_pairs(self.pairs, self.query_length, self.key_length, proper=True)
        object.__setattr__(self, "pairs", pairs)
        object.__setattr__(self, "confidence", check_confidence(self.confidence, len(pairs)))
        object.__setattr__(self, "score", float(self.score))


def check_pairs(pairs, query_length: int, key_length: int | None = None, *,
                proper: bool = True) -> np.ndarray:
    """Validates and returns ``pairs`` as an int64 ``[n, 2]`` array.

    Args:
      pairs: array-like of ``(i, j)``; an empty sequence is allowed.
      query_length, key_length: bounds for i and j (``key_length=None`` skips the j bound).
      proper: also require strictly increasing i and j (a proper alignment).
    """
    arr = np.asarray(pairs)
    if arr.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"pairs must have shape [n, 2], got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError("pairs must hold integer indices")
    arr = arr.astype(np.int64)
    if arr.min() < 0:
        raise ValueError(f"pair indices must be >= 0, got {arr.min()}")
    if arr[:, 0].max() >= query_length:
        raise ValueError(f"pair query index {arr[:, 0].max()} out of range [0, {query_length})")
    if key_length is not None and arr[:, 1].max() >= key_length:
        raise ValueError(f"pair key index {arr[:, 1].max()} out of range [0, {key_length})")
    if proper and len(arr) > 1:
        bad = np.flatnonzero((np.diff(arr[:, 0]) <= 0) | (np.diff(arr[:, 1]) <= 0))
        if bad.size:
            k = int(bad[0])
            raise ValueError(
                f"pairs are not a proper alignment (strictly increasing i and j): "
                f"{arr[k].tolist()} then {arr[k + 1].tolist()}")
    return arr


def check_target(target, *, key_length: int | None = None) -> np.ndarray:
    """Validates a reference ``target [Lq]`` (ints >= -1, < key_length) and returns int64."""
    arr = np.asarray(target)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"target must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"target must be integer, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.min() < -1:
        raise ValueError(f"target values must be >= -1 (-1 = unaligned), got {arr.min()}")
    if key_length is not None and arr.max() >= key_length:
        raise ValueError(f"target value {arr.max()} out of range for key length {key_length}")
    return arr


def pairs_from_target(target) -> np.ndarray:
    """Reference pairs ``[n, 2]`` from ``target [Lq]``: ``(i, target[i])`` for target[i] >= 0."""
    target = check_target(target)
    rows = np.flatnonzero(target >= 0)
    return np.stack([rows, target[rows]], axis=1).astype(np.int64)


def diagonal_target(query_length: int, key_length: int) -> np.ndarray:
    """docs/design.md §5 diagonal reference ``[Lq]``: row i -> ``round(i (Lk - 1) / (Lq - 1))``.

    ``round`` is Python's (half to even, as ``np.rint``); for ``Lq == 1`` the single row maps to
    key 0. When ``Lq > Lk`` several rows share a key (the map is monotone, not injective).
    """
    if query_length < 1 or key_length < 1:
        raise ValueError(f"lengths must be >= 1, got Lq={query_length}, Lk={key_length}")
    if query_length == 1:
        return np.zeros(1, dtype=np.int64)
    i = np.arange(query_length, dtype=np.float64)
    return np.rint(i * (key_length - 1) / (query_length - 1)).astype(np.int64)
