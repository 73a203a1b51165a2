"""Certificates of docs/design.md §6 that need only scores and plans (numpy).

Projective contraction (docs/design.md §6.1)
    For a strictly positive kernel ``K = exp(S)`` (``S [n, m]``), Birkhoff's theorem gives the
    Hilbert-metric contraction ``tanh(Delta / 4)`` of ``x -> K x`` with
    ``Delta = max_{i,i',j,j'} (S_ij + S_i'j' - S_ij' - S_i'j)`` (the log of the largest cross
    ratio). A full Sinkhorn step applies K and K^T, hence ``rho_H = tanh^2(Delta / 4)``.
    ``Delta`` is computed in O(n m^2): for a column pair (j, j'), the maximum over (i, i') of
    ``(S_ij - S_ij') - (S_i'j - S_i'j')`` is the range (max - min) over i of ``S_ij - S_ij'``.
    Range bound: every cross term is at most ``2 Omega_S`` with ``Omega_S = max S - min S``
    over the block, so ``Delta <= 2 Omega_S`` and ``rho_H <= tanh^2(Omega_S / 2)``: a cruder
    certificate that needs only the score range (docs/design.md §6.1).
    Blocks: query rows in consecutive ranges of ``block_rows`` (128) rows, each keeping its
    *active* rows (rows with any support: a block may hold fewer); a block's active columns are the union of its rows' supports. The
    block is strictly positive iff every (row, active column) entry is in the support (and
    finite); only such blocks are certified. A banded support with ``W < Lk`` is generally
    not strictly positive on its row blocks (the band's corners are missing): those blocks are
    reported with ``strictly_positive=False`` and no bound (``Delta = inf``, ``rho_H = 1``).

Conservative transport
    Receiver-mass imbalance ``||A^T 1 - 1||_inf``: the largest deviation of a column's received
    mass from 1, for a plan or a row-softmax attention matrix ``A [..., n, m]``.

Tail mass (locking diagnostic of the softmax view): ``delta(P)_i = 1 - max_j P_i(j)``; a row is
locked when ``max_j P_i(j) >= LOCKED``.

Perturbation bounds of the transport plan and of the row softmax (docs/design.md §6.3):
``plan_perturbation`` and ``softmax_rows`` below.
"""

from __future__ import annotations

import dataclasses
import warnings
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


LOCKED = 0.9999  # a row is locked when its largest weight reaches this


def locked_fraction(pmax, *, locked: float = LOCKED) -> float:
    """The fraction of rows with ``p_max >= locked``, from the rows' largest weights ``pmax``
    (any shape; NaN when there are none)."""
    pmax = np.asarray(pmax, dtype=np.float64)
    return float(np.mean(pmax >= locked)) if pmax.size else float("nan")


# ---------------------------------------------------------------------------------------------
# Certificates of the transport plan itself (issue 15): float64 solves, marginals, the plan's
# perturbation bound, the softmax-as-semi-relaxed-OT bounds, stable matches
# ---------------------------------------------------------------------------------------------


class DenseSolve(NamedTuple):
    """A float64 solve of one problem: the plan, the steps taken, its marginal errors (the op's
    definition: ``kernels.reference.dense_marginal_errors``) and the l1 drift
    ``||P^(t+1) - P^(t)||_1`` of each step after the first."""

    plan: np.ndarray
    steps: int
    row_error: float
    col_error: float
    drift: np.ndarray


def _neg_lse(x, mask, axis):
    xm = np.where(mask, x, -np.inf)
    mx = np.max(xm, axis=axis, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    tot = np.sum(np.where(mask, np.exp(xm - mx), 0.0), axis=axis)
    with np.errstate(divide="ignore"):
        return np.where(tot > 0, -(np.log(tot) + np.squeeze(mx, axis)), 0.0)


def solve_dense(scores, mask, log_a, log_b, *, kappa=(1.0, 1.0), stages=((1.0, 17),), tol=None,
                max_steps: int = 20000, tol_stage: int = -1) -> DenseSolve:
    """The op's solve in float64 numpy on one ``[m, n]`` problem (``scores`` at unit
    temperature, -inf or masked off the support): full steps ``u = kappa_a (log a - LSE(S + v))``,
    ``v = kappa_b (log b - LSE(S + u))`` at each stage's temperature (``stages``: (eps, steps),
    potentials carried at fixed eps * potential); with ``tol`` stage ``tol_stage`` (the last by
    default; the op's base before its tail) goes on until both marginal errors are <= tol or
    ``max_steps`` steps in all, in place of its own count."""
    s = np.where(mask, np.asarray(scores, np.float64), 0.0)
    rows, cols = mask.any(1), mask.any(0)
    u, v = np.zeros(s.shape[0]), np.zeros(s.shape[1])
    ka, kb = kappa

    def plan_of(s_t):
        return np.where(mask, np.exp(np.where(mask, s_t + u[:, None] + v[None], -np.inf)), 0.0)

    def errors(p):
        def side(sums, pot, log_t, kap, has):
            if kap == 0.0 or not has.any():
                return 0.0
            target = np.exp(log_t - pot * (1 - kap) / kap)
            return float(np.abs(sums - target)[has].max())
        return side(p.sum(1), u, log_a, ka, rows), side(p.sum(0), v, log_b, kb, cols)

    drift, prev, steps, prev_eps = [], None, 0, None
    for n_stage, (eps, n) in enumerate(stages):
        if prev_eps is not None:
            v = v * prev_eps / eps
        prev_eps = eps
        to_tol = tol is not None and n_stage == tol_stage % len(stages)
        limit = max_steps - steps if to_tol else n
        for _ in range(limit):
            u = np.where(rows, ka * (log_a + _neg_lse(s / eps + v[None], mask, 1)), 0.0)
            v = np.where(cols, kb * (log_b + _neg_lse(s / eps + u[:, None], mask, 0)), 0.0)
            steps += 1
            p = plan_of(s / eps)
            if prev is not None:
                drift.append(float(np.abs(p - prev).sum()))
            prev = p
            if to_tol and max(errors(p)) <= tol:
                break
    p = plan_of(s / prev_eps) if prev is None else prev
    return DenseSolve(p, steps, *errors(p), np.asarray(drift))


def plan_marginals(plan, real_rows, real_cols, *, balanced: bool, total_rows: float,
                   total_cols: float, steps: int) -> dict:
    """The ``marginals`` certificate of a plan ``[m, n]``: the largest deviation of a real row's
    (sender) and a real column's (receiver) mass from 1, the total mass, and whether the unit
    targets can hold at all: a balanced problem needs equal row and column totals. When they
    differ the exact final column step leaves every row ``total_cols / total_rows`` on average
    (``expected_row_sum``)."""
    p = np.asarray(plan, np.float64)
    return {"sender_error": float(np.abs(p.sum(1) - 1)[real_rows].max(initial=0.0)),
            "receiver_error": float(np.abs(p.sum(0) - 1)[real_cols].max(initial=0.0)),
            "total_mass": float(p.sum()),
            "feasible": feasible(total_rows, total_cols, balanced=balanced),
            "expected_row_sum": float(total_cols / total_rows) if balanced else 1.0, "steps": int(steps)}


def feasible(total_rows: float, total_cols: float, *, balanced: bool) -> bool:
    """Whether the targets can all hold: a balanced problem needs equal row and column totals."""
    return (not balanced) or abs(total_rows - total_cols) <= 1e-6 * max(total_rows, total_cols)


def oscillation(x, mask) -> float:
    """``osc(x) = max x - min x`` over the masked entries."""
    x = np.asarray(x, np.float64)[np.asarray(mask, bool)]
    return float(x.max() - x.min()) if x.size else 0.0


def gauge_oscillation(x, mask, *, rows: bool = True, cols: bool = True, sweeps: int = 50) -> float:
    """An upper bound on ``min_{a, b} osc(x - a_i - b_j)`` over the masked entries (row and / or
    column constants change no plan): alternating mid-range centering of rows and columns.
    Any (a, b) gives a valid bound; the sweeps only tighten it."""
    x = np.where(mask, np.asarray(x, np.float64), np.nan)
    best = oscillation(np.nan_to_num(x), mask)
    for _ in range(sweeps if (rows or cols) else 0):
        for axis, on in ((1, rows), (0, cols)):
            if on:
                with warnings.catch_warnings():  # a line without support: all-NaN, its mid 0
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mid = 0.5 * (np.nanmax(x, axis, keepdims=True) + np.nanmin(x, axis, keepdims=True))
                x = x - np.nan_to_num(mid)
        best = min(best, oscillation(np.nan_to_num(x), mask))
    return best


def plan_perturbation(plan_s, plan_t, diff, mask, *, tau: float, gauge=(True, True)) -> dict:
    """The entropic transport plan's perturbation bound on its support:
    ``||P(S) - P(T)||_1 <= (M / tau) ||S - T||_inf`` (negative entropy is (1 / M)-strongly convex
    in l1 on plans of mass M: Pinsker), and its gauge-reduced form ``(M / 2 tau) osc(S - T)``
    after removing row / column constants (``gauge``: which ones leave the plan unchanged).
    ``vacuity_radius``: the sup-norm size ``2 tau`` beyond which the bound says less than
    ``||P - Q||_1 <= 2 M``."""
    ps, pt = np.asarray(plan_s, np.float64), np.asarray(plan_t, np.float64)
    mass = float(ps.sum())
    lhs = float(np.abs(ps - pt).sum())
    sup = float(np.abs(np.asarray(diff, np.float64)[mask]).max(initial=0.0))
    osc = gauge_oscillation(diff, mask, rows=gauge[0], cols=gauge[1])
    rhs_sup, rhs_gauge = mass / tau * sup, mass / (2 * tau) * osc
    return {"mass": mass, "perturbation_inf": sup, "perturbation_osc": osc, "lhs": lhs,
            "rhs_sup": rhs_sup, "rhs_gauge": rhs_gauge,
            "ratio": lhs / rhs_gauge if rhs_gauge > 0 else float("nan"),
            "holds": lhs <= rhs_gauge * (1 + 1e-9) + 1e-12, "vacuity_radius": 2 * tau}


def masked_softmax(z, mask, axis=-1) -> np.ndarray:
    """Softmax of ``z`` over the masked entries along ``axis`` (float64; empty lines 0)."""
    z, mask = np.asarray(z, np.float64), np.asarray(mask, bool)
    logp = np.where(mask, z, 0.0) + np.expand_dims(_neg_lse(z, mask, axis), axis)
    return np.where(mask, np.exp(np.where(mask, logp, -np.inf)), 0.0)


def local_constant(delta) -> np.ndarray:
    """The l_inf -> l_1 norm of the softmax Jacobian ``diag p - p p^T`` is ``max_A 4 p(A)(1 - p(A))``;
    with tail mass ``delta = 1 - max p <= 1/2`` every p(A) lies in [0, delta] or [1 - delta, 1],
    so it is exactly ``4 delta (1 - delta)``; above 1/2 only the bound 1 is given."""
    d = np.asarray(delta, np.float64)
    return np.where(d <= 0.5, 4 * d * (1 - d), 1.0)


def softmax_rows(z, z_pert, mask, *, locked: float = LOCKED) -> dict:
    """Softmax as semi-relaxed OT, per masked row of ``z [m, n]`` (logits at unit temperature):
    the half-oscillation bound ``||sm(z) - sm(z')||_1 <= (1/2) osc(z - z')`` and its per-row
    tightness; tail mass ``delta``; the exact local constant ``4 delta (1 - delta)``; the argmax
    margin (top-two logit gap: the argmax cannot change while ``osc(z - z') < margin``);
    ``locked_fraction`` (rows with ``p_max >= locked``, float64). ``per_row``: one entry per
    row of ``z``, NaN on a row without support (no softmax there)."""
    mask = np.asarray(mask, bool)
    rows = mask.sum(1) > 0

    def per_row(values) -> list:
        out = np.full(len(rows), np.nan)
        out[rows] = values
        return out.tolist()

    p, pp = masked_softmax(z, mask), masked_softmax(z_pert, mask)
    lhs = np.abs(p - pp).sum(1)[rows]
    diff = np.subtract(z_pert, z, out=np.zeros(np.shape(z)), where=mask)  # off the support: -inf - -inf
    osc = np.array([oscillation(diff[i], mask[i]) for i in np.flatnonzero(rows)])
    ratio = np.where(osc > 0, lhs / np.where(osc > 0, 0.5 * osc, 1.0), np.nan)
    pmax = p.max(1)[rows]
    delta = 1 - pmax
    top2 = np.sort(np.where(mask, z, -np.inf)[rows], 1)[:, -2:]
    margin = np.where(mask[rows].sum(1) > 1, top2[:, 1] - top2[:, 0], np.inf)
    return {"violations": int(np.sum(lhs > 0.5 * osc * (1 + 1e-9) + 1e-12)),
            "row_bound_ratio_median": float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else float("nan"),
            "row_bound_ratio_p90": float(np.nanpercentile(ratio, 90)) if np.isfinite(ratio).any() else float("nan"),
            "tail_mass": distribution_summary(delta),
            "local_constant": distribution_summary(local_constant(delta)),
            "margin": distribution_summary(margin),
            "locked_fraction": locked_fraction(pmax, locked=locked),
            "per_row": {"tail_mass": per_row(delta), "row_bound_ratio": per_row(ratio)}}


def stable_matches(plan, pairs, *, mass: float, tau: float, radius: float) -> dict:
    """Aligned pairs certified to stay their row's and column's winner under any score
    perturbation of gauge-reduced size ``osc <= radius``: for a plan with unit real marginals,
    ``P'_ij >= P_ij - ||P - P'||_1 >= P_ij - (M / 2 tau) radius``, and an entry above 1/2 of a
    unit row and column beats all the others together. ``plan`` must have those marginals
    (the caller checks)."""
    p = np.asarray(plan, np.float64)
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    threshold = 0.5 + mass / (2 * tau) * radius
    vals = p[pairs[:, 0], pairs[:, 1]] if len(pairs) else np.zeros(0)
    ok = vals > threshold
    return {"score_noise": radius, "threshold": threshold, "aligned": int(len(pairs)),
            "certified": int(ok.sum()), "pairs": pairs[ok].tolist(), "stable": ok.tolist()}
