"""Certificates of docs/design.md §6 that need only scores and plans (numpy).

Projective contraction (seed paper, Prop. 4)
    For a strictly positive kernel ``K = exp(S)`` (``S [n, m]``), Birkhoff's theorem gives the
    Hilbert-metric contraction ``tanh(Delta / 4)`` of ``x -> K x`` with
    ``Delta = max_{i,i',j,j'} (S_ij + S_i'j' - S_ij' - S_i'j)`` (the log of the largest cross
    ratio). A full Sinkhorn step applies K and K^T, hence ``rho_H = tanh^2(Delta / 4)``.
    ``Delta`` is computed in O(n m^2): for a column pair (j, j'), the maximum over (i, i') of
    ``(S_ij - S_ij') - (S_i'j - S_i'j')`` is the range (max - min) over i of ``S_ij - S_ij'``.
    Range bound: every cross term is at most ``2 Omega_S`` with ``Omega_S = max S - min S``
    over the block, so ``Delta <= 2 Omega_S`` and ``rho_H <= tanh^2(Omega_S / 2)``: a cruder
    certificate that needs only the score range (docs/design.md §6.1).
    Blocks: query rows in consecutive blocks of ``block_rows`` (128) among the *active* rows
    (rows with any support); a block's active columns are the union of its rows' supports. The
    block is strictly positive iff every (row, active column) entry is in the support (and
    finite); only such blocks are certified. A banded support with ``W < Lk`` is generally
    not strictly positive on its row blocks (the band's corners are missing): those blocks are
    reported with ``strictly_positive=False`` and no bound (``Delta = inf``, ``rho_H = 1``).

Conservative transport
    * receiver-mass imbalance ``||A^T 1 - 1||_inf``: the largest deviation of a column's
      received mass from 1, for a plan or a row-softmax attention matrix ``A [..., n, m]``.
    * score perturbation: ``P(S) = row_softmax(S / tau)``; for ``S, T [n, m]``,
      ``||P(S) - P(T)||_1 <= (n / tau) ||S - T||_inf`` with the entrywise norms (sum of absolute
      values; largest absolute entry). Per row, softmax at temperature tau is
      ``1/tau``-Lipschitz from l_inf to l_1 (its Jacobian ``(diag p - p p^T) / tau`` has
      l_inf -> l_1 norm ``max_A 4 p(A)(1 - p(A)) / tau <= 1 / tau``); summing over the n rows
      gives the bound. It applies to the row-normalized softmax only, not to a Sinkhorn plan.

Tail mass (locking diagnostic of the softmax view): ``delta(P)_i = 1 - max_j P_i(j)``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

# ---------------------------------------------------------------------------------------------
# Projective contraction
# ---------------------------------------------------------------------------------------------


def contraction_delta(scores) -> float:
    """``Delta = max_{i,i',j,j'} (S_ij + S_i'j' - S_ij' - S_i'j)`` of a dense finite block
    ``[n, m]`` in O(n m^2) time and O(n m) memory."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or 0 in s.shape:
        raise ValueError(f"scores must be a non-empty [n, m] block, got {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite (restrict to a strictly positive block)")
    n, m = s.shape
    best = 0.0  # i = i' (or j = j') gives 0, so Delta >= 0
    for j in range(m - 1):  # column pairs (j, j') with j' > j; the range is symmetric
        diff = s[:, j:j + 1] - s[:, j + 1:]  # [n, m - j - 1]: S_ij - S_ij'
        best = max(best, float(np.max(diff.max(axis=0) - diff.min(axis=0))))
    return best


def hilbert_rate(delta) -> np.ndarray | float:
    """``rho_H = tanh^2(Delta / 4)`` (contraction of one full Sinkhorn step)."""
    return np.tanh(np.asarray(delta, dtype=np.float64) / 4.0) ** 2


def range_rate(omega) -> np.ndarray | float:
    """Range bound ``tanh^2(Omega_S / 2)`` with ``Omega_S = max S - min S`` (>= rho_H)."""
    return np.tanh(np.asarray(omega, dtype=np.float64) / 2.0) ** 2


@dataclasses.dataclass(frozen=True)
class BlockCertificate:
    """Contraction certificate of one row block ``[row_start, row_stop)``.

    ``n_rows`` counts the block's active rows (inactive rows in the range are skipped) and
    ``n_cols`` its active columns (the union of those rows' supports).
    """

    row_start: int
    row_stop: int
    n_rows: int
    n_cols: int
    strictly_positive: bool
    delta: float  # inf when not strictly positive
    rho_h: float  # tanh^2(delta / 4); 1 when not certified
    omega: float  # max - min of the block's scores; inf when not strictly positive
    range_bound: float  # tanh^2(omega / 2); 1 when not certified


def block_contraction(scores, *, mask=None, block_rows: int = 128) -> list[BlockCertificate]:
    """Per-block contraction certificates of a score matrix.

    Args:
      scores: ``S [Lq, Lk]`` (one head; include dustbin row / column if the plan has them).
      mask: ``[Lq, Lk]`` support (default: where S is finite).
      block_rows: rows per block (128 = the kernels' tile).
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or 0 in s.shape:
        raise ValueError(f"scores must be a non-empty [Lq, Lk], got {s.shape}")
    support = np.isfinite(s)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != s.shape:
            raise ValueError(f"mask shape {mask.shape} differs from scores {s.shape}")
        support &= mask
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    out = []
    for start in range(0, s.shape[0], block_rows):
        stop = min(start + block_rows, s.shape[0])
        rows = start + np.flatnonzero(support[start:stop].any(axis=1))
        if rows.size == 0:
            continue  # no active row in this block
        cols = np.flatnonzero(support[rows].any(axis=0))
        sub_support = support[np.ix_(rows, cols)]
        if sub_support.all():
            block = s[np.ix_(rows, cols)]
            delta = contraction_delta(block)
            omega = float(block.max() - block.min())
            out.append(BlockCertificate(start, stop, rows.size, cols.size, True, delta,
                                        float(hilbert_rate(delta)), omega,
                                        float(range_rate(omega))))
        else:
            out.append(BlockCertificate(start, stop, rows.size, cols.size, False, np.inf, 1.0,
                                        np.inf, 1.0))
    return out


QUANTILES = (("min", 0.0), ("median", 50.0), ("p90", 90.0), ("max", 100.0))


def distribution_summary(values) -> dict:
    """``{"count", "min", "median", "p90", "max"}`` of the finite values (NaN when none)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    out = {"count": int(x.size)}
    for name, q in QUANTILES:
        out[name] = float(np.percentile(x, q)) if x.size else float("nan")
    return out


def contraction_table(certificates):
    """Distribution of ``delta``, ``rho_h``, ``omega``, ``range_bound`` over the strictly
    positive blocks (of any number of heads / pairs) as a pandas DataFrame: one row per
    quantity, columns ``count, min, median, p90, max, excluded`` (excluded = blocks that are
    not strictly positive)."""
    import pandas as pd

    certs = list(certificates)
    positive = [c for c in certs if c.strictly_positive]
    rows = {}
    for name in ("delta", "rho_h", "omega", "range_bound"):
        rows[name] = distribution_summary([getattr(c, name) for c in positive])
        rows[name]["excluded"] = len(certs) - len(positive)
    return pd.DataFrame.from_dict(rows, orient="index")[
        ["count", "min", "median", "p90", "max", "excluded"]]


# ---------------------------------------------------------------------------------------------
# Conservative transport, tail mass
# ---------------------------------------------------------------------------------------------


def receiver_mass_imbalance(matrix, *, col_mask=None) -> float:
    """``||A^T 1 - 1||_inf`` of ``A [..., n, m]`` (max over columns and leading axes).

    ``col_mask [m]`` (or broadcastable to ``[..., m]``) restricts to the active columns.
    """
    a = np.asarray(matrix, dtype=np.float64)
    if a.ndim < 2 or 0 in a.shape:
        raise ValueError(f"matrix must be a non-empty [..., n, m], got {a.shape}")
    dev = np.abs(a.sum(axis=-2) - 1.0)  # [..., m]
    if col_mask is not None:
        dev = np.where(np.broadcast_to(np.asarray(col_mask, dtype=bool), dev.shape), dev, 0.0)
    return float(dev.max())


def row_softmax(scores, *, tau: float) -> np.ndarray:
    """``P(S) = softmax(S / tau)`` over the last axis (stable)."""
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    z = np.asarray(scores, dtype=np.float64) / tau
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class PerturbationBound(NamedTuple):
    """Both sides of ``||P(S) - P(T)||_1 <= (n / tau) ||S - T||_inf``."""

    lhs: float  # sum_ij |P(S)_ij - P(T)_ij|
    rhs: float  # (n / tau) max_ij |S_ij - T_ij|

    @property
    def holds(self) -> bool:
        return self.lhs <= self.rhs * (1 + 1e-12) + 1e-15


def score_perturbation(scores_s, scores_t, *, tau: float) -> PerturbationBound:
    """Evaluates the score-perturbation bound for the row softmax at temperature ``tau``.

    ``S, T [..., n, m]`` finite; leading axes count as more rows (n = all rows).
    """
    s = np.asarray(scores_s, dtype=np.float64)
    t = np.asarray(scores_t, dtype=np.float64)
    if s.shape != t.shape or s.ndim < 2 or 0 in s.shape:
        raise ValueError(f"S and T must be non-empty [..., n, m] of one shape, got {s.shape} "
                         f"and {t.shape}")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        raise ValueError("S and T must be finite")
    lhs = float(np.abs(row_softmax(s, tau=tau) - row_softmax(t, tau=tau)).sum())
    n_rows = s.size // s.shape[-1]
    return PerturbationBound(lhs, n_rows / tau * float(np.abs(s - t).max()))


def tail_mass(plan, *, normalize: bool = False) -> np.ndarray:
    """``delta(P)_i = 1 - max_j P_i(j)`` per row ``[..., n]``.

    ``normalize=True`` first divides each row by its sum (for plans whose rows do not sum to
    1, e.g. a row's real part when it also sends mass to a dustbin); rows with no mass give NaN.
    """
    p = np.asarray(plan, dtype=np.float64)
    if p.ndim < 2 or 0 in p.shape:
        raise ValueError(f"plan must be a non-empty [..., n, m], got {p.shape}")
    if normalize:
        mass = p.sum(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(mass > 0, p / mass, np.nan)
    return 1.0 - p.max(axis=-1)
