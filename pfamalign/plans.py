"""Transport plans of single pairs: ``PairPlan`` (the dense plan and its dustbin lines), its
sanity check, the symmetrized plan of both directions, and the unpadding of a batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# How far a plan's masses may stray from their bounds (``PairPlan.check``): the trained
# models' 17-step plans stay within 0.05, a solve at eps = 1e-6 reaches rows of mass 2.
PLAN_TOL = 0.25


@dataclasses.dataclass
class PairPlan:
    """The dense plan of one pair: ``plan [Lq + 1, Lk + 1]``, last column the rows' dustbin
    mass, last row the dustbin row (the keys' unaligned mass; zero without a dustbin). In a
    ``symmetrize``d plan both are the mean of the two directions' dustbin masses."""

    plan: np.ndarray

    @property
    def real(self) -> np.ndarray:
        return self.plan[:-1, :-1]

    @property
    def row_dustbin(self) -> np.ndarray:
        return self.plan[:-1, -1]

    def check(self, tol: float = PLAN_TOL, *, marginals: bool = True) -> None:
        """Raises ValueError unless the plan is one (docs/design.md §3.3, §9): finite,
        non-negative, no entry (a confidence; the dustbin corner is none) above 1 + ``tol``,
        no query row above ``max(1, r)`` and no key column above ``max(1, 1 / r)`` (times
        1 + ``tol``), and the mean row mass (real + dustbin) within ``tol`` of
        [min(1, r), max(1, r)], r = (Lk + 1) / (Lq + 1): with unbalanced targets the rows are
        off by about the ratio of the totals, and a plan of a fixed number of steps (or the
        mean of both directions) leaves single rows further off, so only the mean is bounded
        from below. A broken solve (too small an eps, overflow) is far outside these bounds,
        and its confidences would be meaningless. ``marginals=False``
        (``Predictor.checks_marginals``: the plans of a ``steps`` or ``asap`` engine, whose
        masses are what they approximate, and of a model with a free side): finite,
        non-negative and entries only."""
        plan = self.plan
        if not np.all(np.isfinite(plan)):
            raise ValueError("the transport plan is not finite (overflow in the solve); "
                             "the model's transport settings (eps) do not fit this pair")
        lq, lk = plan.shape[0] - 1, plan.shape[1] - 1
        ratio = (lk + 1) / (lq + 1)
        rows, cols = plan[:-1].sum(axis=1), plan[:, :-1].sum(axis=0)
        low, high = (1 - tol) * min(1.0, ratio), (1 + tol) * max(1.0, ratio)
        col_high = (1 + tol) * max(1.0, 1 / ratio)
        mean_row = float(rows.mean()) if len(rows) else 1.0
        entries = plan.ravel()[:-1]  # all but the dustbin corner (a capacity plan's may be > 1)
        # every engine's plan is an exponential (or a mean of them): any negative entry is a bug
        checks = [(f"negative mass ({plan.min(initial=0.0):.3g})", plan.min(initial=0.0) < 0),
                  (f"an entry of {entries.max(initial=0.0):.3g}", entries.max(initial=0.0) > 1 + tol)]
        if marginals:
            checks += [(f"a key column of mass {cols.max(initial=0.0):.3g}", cols.max(initial=0.0) > col_high),
                       (f"a query row of mass {rows.max(initial=0.0):.3g}", rows.max(initial=0.0) > high),
                       (f"mean query-row mass {mean_row:.3g} (expected {low:.3g} to {high:.3g})",
                        not low <= mean_row <= high)]
        bad = [what for what, failed in checks if failed]
        if bad:
            raise ValueError(f"the transport plan is not a plan ({'; '.join(bad)}); the solve did "
                             "not converge with the model's transport settings (eps, steps)")

    @property
    def col_dustbin(self) -> np.ndarray:
        return self.plan[-1, :-1]


def symmetrize(ab: PairPlan, ba: PairPlan) -> PairPlan:
    """The mean of a pair's plans in both directions, ``(P_AB + P_BA^T) / 2`` over the full
    ``[Lq + 1, Lk + 1]`` matrices: the aligner is not symmetric in its two inputs (the query
    and key projections differ), and a user swapping A and B must get the same alignment,
    transposed, with the same score. Each direction's dustbin row (the keys' unaligned mass) is
    the other's dustbin column, transposed."""
    if ab.plan.shape != ba.plan.shape[::-1]:
        raise ValueError(f"plans of one pair in both directions must be transposes in shape, got "
                         f"{ab.plan.shape} and {ba.plan.shape}")
    mean = ab.plan + ba.plan.T
    mean *= 0.5  # in place: the same values, one array fewer
    return PairPlan(mean)


def unpad(out: np.ndarray, lq: np.ndarray, lk: np.ndarray) -> list[PairPlan]:
    """The first ``len(lq)`` plans of a padded ``[B, pad + 1, pad + 1]`` batch (real lines,
    then the dustbin's) at their own sizes."""
    return [PairPlan(_own_lines(out[n], lq[n], lk[n])) for n in range(len(lq))]


def unpad_symmetric(ab: np.ndarray, ba: np.ndarray, lq: np.ndarray, lk: np.ndarray) -> list[PairPlan]:
    """``symmetrize`` of each pair's ``unpad``ed plans of both directions (padded batches
    ``ab [B, pad + 1, pad + 1]`` and ``ba``, the second with the sides exchanged)."""
    return [symmetrize(p, q) for p, q in zip(unpad(ab, lq, lk), unpad(ba, lk, lq))]


def _own_lines(padded: np.ndarray, lq: int, lk: int) -> np.ndarray:
    """``[lq + 1, lk + 1]`` float64 of a padded ``[pad + 1, pad + 1]`` plan: the real lines
    and the dustbin's (the last)."""
    full = np.empty((lq + 1, lk + 1))
    full[:lq, :lk] = padded[:lq, :lk]
    full[:lq, lk] = padded[:lq, -1]
    full[lq, :lk] = padded[-1, :lk]
    full[lq, lk] = padded[-1, -1]
    return full
