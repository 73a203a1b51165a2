"""Maximum-expected-accuracy (MEA) decoding of a transport plan into a discrete alignment.

Given a plan ``P [Lq, Lk]`` over the real rows and columns, the decoder returns the proper
alignment (pairs strictly increasing in i and j) maximizing

    sum_{(i, j) aligned} P_ij  -  gap_cost * (number of unaligned residues, both sequences).

With ``gap_cost = 0`` and P read as pair posteriors this is the expected number of correct
pairs (MEA). A linear gap cost needs no extra DP state: an alignment with n pairs leaves
``Lq + Lk - 2n`` residues unaligned, so the objective equals ``sum (P_ij + 2 gap_cost) -
gap_cost (Lq + Lk)`` and the DP runs on the shifted weights with free gaps.

DP over ``M [Lq + 1, Lk + 1]`` (``M[0, :] = M[:, 0] = 0``):

    M[i, j] = max(M[i-1, j-1] + w_ij, M[i-1, j], M[i, j-1]).

Row i is computed at once: ``D_j = max(M[i-1, j-1] + w_ij, M[i-1, j])`` is elementwise and
``M[i, j] = max_{k <= j} D_k`` is a cumulative max (every D_k >= 0 = M[i, 0]), so the cost is
``Lq`` vector operations of length ``Lk``. Only two rows of M are kept, plus two boolean
tables (does ``M[i, j]`` equal its left / upper neighbour); the traceback walks back from
``(Lq, Lk)`` in at most ``Lq + Lk`` steps, preferring gaps on ties (a pair is only taken when
it strictly adds mass). Memory: ``2 Lq Lk`` bytes (8 MB at 2000 x 2000) besides the plan.
"""

from __future__ import annotations

import numpy as np

from pfamalign.alignment.pairs import PairAlignment


def _check_plan(plan) -> np.ndarray:
    arr = np.asarray(plan, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"plan must be [Lq, Lk] (real rows and columns only), got {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"plan is empty: shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise ValueError("plan must be finite and non-negative")
    return arr


def _check_dustbin(mass, length: int, name: str) -> np.ndarray | None:
    if mass is None:
        return None
    arr = np.asarray(mass, dtype=np.float64)
    if arr.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise ValueError(f"{name} must be finite and non-negative")
    return arr


def allowed_pairs(plan, *, row_dustbin=None, col_dustbin=None,
                  min_mass: float = 0.0) -> np.ndarray:
    """Boolean ``[Lq, Lk]`` of the pairs the decoder may take.

    A pair (i, j) is allowed iff ``P_ij > 0``, ``P_ij >= min_mass``, row i is not
    dustbin-dominated (``row_dustbin[i] > max_j P_ij``: the row's largest mass is its dustbin
    entry) and column j is not (``col_dustbin[j] > max_i P_ij``).
    """
    return _allowed(_check_plan(plan), row_dustbin, col_dustbin, min_mass)


def _allowed(plan: np.ndarray, row_dustbin, col_dustbin, min_mass: float) -> np.ndarray:
    lq, lk = plan.shape
    row_db = _check_dustbin(row_dustbin, lq, "row_dustbin")
    col_db = _check_dustbin(col_dustbin, lk, "col_dustbin")
    if not np.isfinite(min_mass) or min_mass < 0:
        raise ValueError(f"min_mass must be finite and >= 0, got {min_mass}")
    ok = (plan > 0) & (plan >= min_mass)
    if row_db is not None:
        ok &= ~(row_db > plan.max(axis=1))[:, None]
    if col_db is not None:
        ok &= ~(col_db > plan.max(axis=0))[None, :]
    return ok


def mea_decode(plan, *, row_dustbin=None, col_dustbin=None, min_mass: float = 0.0,
               gap_cost: float = 0.0) -> PairAlignment:
    """Maximum-expected-accuracy alignment of a transport plan.

    Args:
      plan: ``[Lq, Lk]`` non-negative plan over the real rows / columns (no dustbin slots).
      row_dustbin: optional ``[Lq]`` mass each query row sends to the dustbin column.
      col_dustbin: optional ``[Lk]`` mass each key column receives from the dustbin row.
      min_mass: pairs with ``P_ij < min_mass`` are never aligned.
      gap_cost: linear cost per unaligned residue (>= 0); 0 is plain MEA.

    Returns:
      ``PairAlignment`` with ``confidence = P_ij`` of each pair and ``score`` the objective
      above (summed pair mass minus gap costs).
    """
    plan = _check_plan(plan)
    if not np.isfinite(gap_cost) or gap_cost < 0:
        raise ValueError(f"gap_cost must be finite and >= 0, got {gap_cost}")
    lq, lk = plan.shape
    ok = _allowed(plan, row_dustbin, col_dustbin, min_mass)  # [Lq, Lk]
    pairs = _mea_pairs(plan, ok, 2.0 * gap_cost)
    conf = plan[pairs[:, 0], pairs[:, 1]] if len(pairs) else np.zeros(0)
    score = float(conf.sum()) - gap_cost * (lq + lk - 2 * len(pairs))
    return PairAlignment(pairs=pairs, confidence=conf, score=score, query_length=lq,
                         key_length=lk)


def _mea_pairs(plan: np.ndarray, ok: np.ndarray, bonus: float) -> np.ndarray:
    """Runs the row-vectorized DP on ``w = P + bonus`` (allowed pairs only); returns pairs.

    Only two DP rows are kept; the traceback needs, per cell, whether ``M[i, j]`` equals its
    left neighbour and whether it equals the cell above (two boolean ``[Lq, Lk]`` tables, an
    eighth of the memory of the float table).
    """
    lq, lk = plan.shape
    left = np.empty((lq, lk), dtype=bool)  # M[i+1, j+1] == M[i+1, j]
    up = np.empty((lq, lk), dtype=bool)  # M[i+1, j+1] == M[i, j+1]
    prev = np.zeros(lk + 1)  # M[i, :]
    cur = np.zeros(lk + 1)  # M[i + 1, :]; cur[0] stays 0
    w_row = np.empty(lk)
    diag = np.empty(lk)
    for i in range(lq):
        w_row.fill(-np.inf)
        np.add(plan[i], bonus, out=w_row, where=ok[i])  # w[i, :], -inf where not allowed
        np.add(prev[:-1], w_row, out=diag)  # M[i, j-1] + w[i, j]
        np.maximum(diag, prev[1:], out=diag)  # D_j = max(diagonal, up)
        np.maximum.accumulate(diag, out=cur[1:])  # M[i+1, j] = max_{k<=j} D_k
        np.equal(cur[1:], cur[:-1], out=left[i])
        np.equal(cur[1:], prev[1:], out=up[i])
        prev, cur = cur, prev
    return _traceback(left, up)


def _traceback(left: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Optimal pairs ``[n, 2]`` from the tie tables (gaps preferred on ties)."""
    i, j = left.shape
    out = []
    while i > 0 and j > 0:
        if left[i - 1, j - 1]:
            j -= 1
        elif up[i - 1, j - 1]:
            i -= 1
        else:  # neither gap move reaches M[i, j]: the diagonal move does
            out.append((i - 1, j - 1))
            i -= 1
            j -= 1
    if not out:
        return np.zeros((0, 2), dtype=np.int64)
    return np.asarray(out[::-1], dtype=np.int64)
