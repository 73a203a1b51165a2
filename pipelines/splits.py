"""Family-level train / val / test assignment.

A family's split is a pure function of ``(seed, accession without version)``: BLAKE2b of
``"pfamalign-split:{seed}:{PFxxxxx}"`` read as a uniform number in [0, 1) and cut at the
cumulative fractions. Consequences: a family is wholly in one split; different versions of
the same family (PF00041.20 seed, PF00041.24 hmmalign) land together; adding or removing
other families never moves a family; a different seed gives an independent assignment.

Cross-validation folds (``assign_fold_split``): fold k of N holds the families whose split
fraction falls in [k/N, (k+1)/N), so the N folds partition the families and each family is
the test set of exactly one fold. Within the other families a second hash, salted with the
fold, puts about ``FOLD_VAL_FRACTION`` of them in ``val`` and the rest in ``train``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pfamalign.pipelines.stockholm import accession_base

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
FOLD_VAL_FRACTION = 0.1


def split_fraction_of(key: str, seed: int, salt: str = "pfamalign-split") -> float:
    """The family's uniform hash value in [0, 1) (version-free accession)."""
    digest = hashlib.blake2b(f"{salt}:{seed}:{accession_base(key)}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or not all(f >= 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-6:  # f >= 0: False for nan
        raise ValueError(f"split fractions must be three non-negative numbers summing to 1 "
                         f"(train, val, test), got {fractions!r}")
    return fr  # type: ignore[return-value]


def assign_split(key: str, *, seed: int = 0,
                 fractions: Sequence[float] = DEFAULT_FRACTIONS) -> str:
    """``"train"``, ``"val"`` or ``"test"`` for a family key such as ``PF00041.24``."""
    train, val, _ = check_fractions(fractions)
    u = split_fraction_of(key, seed)
    if u < train:
        return "train"
    if u < train + val:
        return "val"
    return "test"


def check_fold(fold: int, n_folds: int) -> tuple[int, int]:
    if not (n_folds >= 2 and 0 <= fold < n_folds):
        raise ValueError(f"fold must be K/N with N >= 2 and 0 <= K < N, got {fold}/{n_folds}")
    return int(fold), int(n_folds)


def fold_of(key: str, *, seed: int, n_folds: int) -> int:
    """The fold (0 .. n_folds - 1) whose test set holds the family."""
    return min(int(split_fraction_of(key, seed) * n_folds), n_folds - 1)  # u may round to 1.0


def assign_fold_split(key: str, *, fold: int, n_folds: int, seed: int = 0,
                      val_fraction: float = FOLD_VAL_FRACTION) -> str:
    """The family's split in fold ``fold`` of ``n_folds``: ``"test"`` for the fold's own
    families, else ``"val"`` for about ``val_fraction`` of the others, ``"train"`` for the rest."""
    check_fold(fold, n_folds)
    if fold_of(key, seed=seed, n_folds=n_folds) == fold:
        return "test"
    val_hash = split_fraction_of(key, seed, salt=f"pfamalign-fold-val:{fold}/{n_folds}")
    return "val" if val_hash < val_fraction else "train"
