"""Family-level train / val / test assignment.

A family's split is a pure function of ``(seed, accession without version)``: BLAKE2b of
``"pfamalign-split:{seed}:{PFxxxxx}"`` read as a uniform number in [0, 1) and cut at the
cumulative fractions. Consequences: a family is wholly in one split; different versions of
the same family (PF00041.20 seed, PF00041.24 hmmalign) land together; adding or removing
other families never moves a family; a different seed gives an independent assignment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pfamalign.pipelines.stockholm import accession_base

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)


def split_fraction_of(key: str, seed: int) -> float:
    """The family's uniform hash value in [0, 1) (version-free accession)."""
    digest = hashlib.blake2b(f"pfamalign-split:{seed}:{accession_base(key)}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or any(f < 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
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
