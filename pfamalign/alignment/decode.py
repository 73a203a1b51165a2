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
``Lq`` vector operations of length ``Lk`` (for many plans at once: ``mea_decode_many``).
A block of rows of M is kept, plus two boolean tables (does ``M[i, j]`` equal its left /
upper neighbour); the traceback walks back from
``(Lq, Lk)`` in at most ``Lq + Lk`` steps, preferring gaps on ties (a pair is only taken when
it strictly adds mass). Memory: ``2 Lq Lk`` bytes (8 MB at 2000 x 2000) besides the plan.

Every decoder takes ``mode``: ``"global"`` charges unaligned residues at the ends like inner
ones; ``"local"`` looks for the best-scoring segment (Smith-Waterman: score floor at 0, best
cell anywhere), so flanks outside it stay unaligned for free. Local MEA and the affine-gap
decoders share the Gotoh engine (``_gotoh_pairs``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pfamalign.alignment import numba_jit
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


MODES = ("global", "local")


def _is_local(mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"mode must be 'global' or 'local', got {mode!r}")
    return mode == "local"


def _allowed(plan: np.ndarray, row_dustbin, col_dustbin, min_mass: float) -> np.ndarray:
    """Boolean ``[Lq, Lk]`` of the pairs the decoder may take, of a checked plan
    (``_check_plan``).

    A pair (i, j) is allowed iff ``P_ij > 0``, ``P_ij >= min_mass``, row i is not
    dustbin-dominated (``row_dustbin[i] > max_j P_ij``: the row's largest mass is its dustbin
    entry) and column j is not (``col_dustbin[j] > max_i P_ij``).
    """
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
               gap_cost: float = 0.0, pair_cost: float = 0.0, mode: str = "global",
               objective: str = "accuracy") -> PairAlignment:
    """Maximum-expected-accuracy alignment of a transport plan.

    Args:
      plan: ``[Lq, Lk]`` non-negative plan over the real rows / columns (no dustbin slots).
      row_dustbin: optional ``[Lq]`` mass each query row sends to the dustbin column.
      col_dustbin: optional ``[Lk]`` mass each key column receives from the dustbin row.
      min_mass: pairs with ``P_ij < min_mass`` are never aligned.
      gap_cost: linear cost per unaligned residue (>= 0); 0 is plain MEA.
      pair_cost: cost per aligned pair (>= 0); at ``gap_cost = 0`` a pair is taken only where
        ``P_ij`` exceeds it (a pair's weight is ``P_ij + 2 gap_cost - pair_cost`` in general).
      objective: ``"accuracy"`` maximizes the objective above; ``"f1"`` maximizes the
        expected F1 of the aligned pairs instead (``expected_f1``; the objective above with
        the pair cost that makes it so, ``pair_cost`` is then ignored); its ``score`` is the
        objective above at ``pair_cost = 0`` (the expected number of right pairs, less gaps).
      mode: ``"global"`` charges every unaligned residue; ``"local"`` only those between the
        first and the last pair (the flanks outside the aligned segment are free). Local runs
        the Gotoh engine with ``gap_open = gap_extend = gap_cost`` and free ends; with
        ``gap_cost = 0`` both modes reach the same value.

    Returns:
      ``PairAlignment`` with ``confidence = P_ij`` of each pair and ``score`` the objective
      above (summed pair mass minus gap costs).
    """
    return mea_decode_many([plan], row_dustbins=[row_dustbin], col_dustbins=[col_dustbin],
                           min_mass=min_mass, gap_cost=gap_cost, pair_cost=pair_cost, mode=mode,
                           objective=objective)[0]


def _decoded_transposed(plan: np.ndarray, row_dustbin=None, col_dustbin=None) -> bool:
    """Whether a plan is decoded as its transpose, the alignment transposed back: exactly one
    of (plan, row dustbin, column dustbin) and (its transpose, column dustbin, row dustbin) is
    (the shorter sequence as the rows; for a square plan, the one whose first entry off its
    transpose is the smaller; for a symmetric one, the one whose first row-dustbin entry off
    its column dustbin is the smaller, a missing one the smallest), so that swapping the
    sequences swaps the alignment even where the DP meets exact ties, which it breaks by row
    order (poly-A 400 against 399 residues moved its gap by three)."""
    rows, cols = plan.shape
    if rows != cols:
        return rows > cols
    differ = plan != plan.T
    first = int(np.argmax(differ))  # row-major: above the diagonal, its mirror below comes later
    if differ.flat[first]:
        return bool(plan.flat[first] > plan.T.flat[first])
    if row_dustbin is None or col_dustbin is None:
        return row_dustbin is not None  # (None, c) stays, (r, None) turns: one of the two
    row_dustbin, col_dustbin = np.asarray(row_dustbin), np.asarray(col_dustbin)
    off = np.flatnonzero(row_dustbin != col_dustbin)
    return bool(off.size) and bool(row_dustbin[off[0]] > col_dustbin[off[0]])


def transposed(aln: PairAlignment) -> PairAlignment:
    """The alignment of the swapped sequences: each pair ``(i, j)`` as ``(j, i)``."""
    return PairAlignment(pairs=aln.pairs[:, ::-1], confidence=aln.confidence, score=aln.score,
                         query_length=aln.key_length, key_length=aln.query_length)


def mea_decode_many(plans, *, row_dustbins=None, col_dustbins=None, min_mass: float = 0.0,
                    gap_cost: float = 0.0, pair_cost: float = 0.0, mode: str = "global",
                    objective: str = "accuracy") -> list[PairAlignment]:
    """``mea_decode`` of each of ``plans`` (its dustbins in ``row_dustbins`` /
    ``col_dustbins``, lists or None): the same alignments, faster for many. In global mode
    the plans' DP rows advance together, one set of vector operations per row for all of
    them (on 300-residue pairs numpy's per-call overhead is most of a DP's cost); the
    expected-F1 rounds run in step, each plan leaving when its own value stops rising. Each
    plan is decoded in one orientation of the two (``_decoded_transposed``)."""
    plans = [_check_plan(plan) for plan in plans]
    count = len(plans)
    for name, given in (("row_dustbins", row_dustbins), ("col_dustbins", col_dustbins)):
        if given is not None and len(given) != count:
            raise ValueError(f"{name} must hold one entry (or None) per plan: {len(given)} for {count} plans")
    rows = [_check_dustbin(r, plan.shape[0], "row_dustbin") for plan, r in zip(plans, row_dustbins or [None] * count)]
    cols = [_check_dustbin(c, plan.shape[1], "col_dustbin") for plan, c in zip(plans, col_dustbins or [None] * count)]
    flips = [_decoded_transposed(plan, r, c) for plan, r, c in zip(plans, rows, cols)]  # (named as given, above)
    found = _mea_decode_many_as_given(
        [np.ascontiguousarray(plan.T) if flip else plan for plan, flip in zip(plans, flips)],
        row_dustbins=[c if flip else r for r, c, flip in zip(rows, cols, flips)],
        col_dustbins=[r if flip else c for r, c, flip in zip(rows, cols, flips)],
        min_mass=min_mass, gap_cost=gap_cost, pair_cost=pair_cost, mode=mode, objective=objective)
    return [transposed(aln) if flip else aln for aln, flip in zip(found, flips)]


def _mea_decode_many_as_given(plans, *, row_dustbins, col_dustbins, min_mass: float, gap_cost: float,
                              pair_cost: float, mode: str, objective: str) -> list[PairAlignment]:
    """``mea_decode_many`` of the plans as they are (rows the rows of the DP)."""
    for name, value in (("gap_cost", gap_cost), ("pair_cost", pair_cost)):
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    local = _is_local(mode)
    count = len(plans)
    if not count:
        return []
    oks = [_allowed(plan, row_db, col_db, min_mass) for plan, row_db, col_db in zip(plans, row_dustbins, col_dustbins)]

    def decode(which: list[int], costs: list[float]) -> list[PairAlignment]:
        """The best alignments of ``sum (P_ij - cost) - gap_cost * unaligned`` (allowed pairs)."""
        if local:
            return [_gotoh_alignment(plans[n], np.where(oks[n], plans[n] - cost, -np.inf),
                                     gap_cost, gap_cost, mode) for n, cost in zip(which, costs)]
        found = _mea_pairs_many([plans[n] for n in which], [oks[n] for n in which],
                                [2.0 * gap_cost - cost for cost in costs])
        return [_scored(plans[n], pairs, gap_cost, cost) for n, pairs, cost in zip(which, found, costs)]

    if objective == "f1":
        # scored without the pair cost (it differs from pair to pair), so that scores compare
        # across pairs: search ranks hits by them
        # globally without gap costs the sure pairs are an alignment to start from (below)
        starts = ([_sure_pairs(plan, ok) for plan, ok in zip(plans, oks)] if not local and gap_cost == 0
                  else [None] * count)
        starts = [None if pairs is None else _scored(plan, pairs, gap_cost, 0.0)
                  for plan, pairs in zip(plans, starts)]
        return [dataclasses.replace(best, score=best.score + cost * len(best.pairs))
                for best, cost in _expected_f1_alignments(plans, decode, starts)]
    return decode(list(range(count)), [pair_cost] * count)


OBJECTIVES = ("accuracy", "f1")


def _scored(plan: np.ndarray, pairs: np.ndarray, gap_cost: float, pair_cost: float) -> PairAlignment:
    """The alignment of ``pairs`` scored ``sum (P_ij - pair_cost) - gap_cost * unaligned``."""
    lq, lk = plan.shape
    conf = plan[pairs[:, 0], pairs[:, 1]] if len(pairs) else np.zeros(0)
    score = float(conf.sum()) - pair_cost * len(pairs) - gap_cost * (lq + lk - 2 * len(pairs))
    return PairAlignment(pairs=pairs, confidence=conf, score=score, query_length=lq,
                         key_length=lk)


def expected_f1(plan, pairs) -> float:
    """``2 sum_A P_ij / (|A| + sum P)``: the F1 of the pairs ``A`` against a reference drawn
    from the posteriors ``P``, with expectations taken of numerator and denominator apart
    (the usual approximation; exact as the alignments grow)."""
    plan = np.asarray(plan, np.float64)
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    total = len(pairs) + plan.sum()
    return 2 * float(plan[pairs[:, 0], pairs[:, 1]].sum()) / total if total > 0 else 0.0


MAX_F1_ROUNDS = 50


def _sure_pairs(plan: np.ndarray, ok: np.ndarray) -> np.ndarray | None:
    """The allowed pairs of mass above 1/2, ``[n, 2]``, when they form an alignment (each row
    and column once, in order; posteriors' always do: two crossing pairs exclude each other),
    else None; None too when there are none (no better start than the empty alignment)."""
    pairs = np.argwhere((plan > 0.5) & ok)  # row-major: rows ascending
    if len(pairs) == 0 or np.any(np.diff(pairs[:, 0]) <= 0) or np.any(np.diff(pairs[:, 1]) <= 0):
        return None
    return pairs


def _expected_f1_alignments(plans: list[np.ndarray], decode,
                            starts: list[PairAlignment | None]) -> list[tuple[PairAlignment, float]]:
    """Maximizes each plan's ``expected_f1`` over the alignments ``decode`` can return, by
    Dinkelbach's method for ratios: with ``lam`` the value of the best alignment so far, the
    alignment maximizing ``sum_A (2 P_ij - lam) - lam sum P`` is the decode at pair cost
    ``lam / 2``; its ratio is at least ``lam`` (the best so far scores 0 there), and equal only
    at the optimum. Each round raises ``lam`` and there are finitely many alignments, so it
    stops (in 2-5 rounds on real pairs). The pair cost it settles on is F/2: a pair is worth
    taking when it is right with probability above half the F1 reached, not above 0 as plain
    MEA assumes. ``decode(which, costs)`` decodes the plans ``which`` at those pair costs;
    ``starts``: per plan, a feasible alignment (scored at pair cost 0) to start from -- any
    alignment's value is a valid first ``lam``, and one near the optimum saves the first
    round (the sure pairs reach 0.99 of the optimum's F1 on the median Pfam pair, which
    takes the decodes per pair from 3.1 to about 2) -- or None: the decode at cost 0.
    Returns each plan's alignment and pair cost."""
    cold = [n for n, start in enumerate(starts) if start is None]
    best = list(starts)
    for n, found in zip(cold, decode(cold, [0.0] * len(cold)) if cold else []):
        best[n] = found
    cost = [0.0] * len(plans)
    value = [expected_f1(plan, found.pairs) for plan, found in zip(plans, best)]
    rising = list(range(len(plans)))
    for _ in range(MAX_F1_ROUNDS):
        if not rising:
            break
        candidates = decode(rising, [value[n] / 2 for n in rising])
        still = []
        for n, nxt in zip(rising, candidates):
            reached = expected_f1(plans[n], nxt.pairs)
            if reached > value[n] + 1e-12:  # each value computed once, kept for the next round
                best[n], cost[n], value[n] = nxt, value[n] / 2, reached
                still.append(n)
        rising = still
    return list(zip(best, cost))


def _mea_pairs_many(plans: list[np.ndarray], oks: list[np.ndarray], bonuses: list[float]) -> list[np.ndarray]:
    """Runs the row-vectorized DP on ``w = P + bonus`` (allowed pairs only) of every plan at
    once; returns each plan's pairs.

    The plans share one ``[N, Lq, Lk]`` lattice at the largest sizes, ``w = -inf`` beyond each
    plan's own rows and columns: a padded row repeats the row above it and a padded column
    only ever reads columns to its left, so each plan's cells hold exactly its own DP. Three
    vector operations per row. The DP rows of a block of ``_MEA_BLOCK`` rows are kept and the
    traceback's two boolean tables -- whether ``M[i, j]`` equals its left neighbour, whether it
    equals the cell above -- are filled a block at a time, so memory stays a quarter of a
    float table's.
    """
    if numba_jit.started():  # the same DP and traceback, compiled (a third of the time)
        tie_tables, traceback = _compiled_dp()
        return [traceback(*tie_tables(plan, ok, float(bonus))) for plan, ok, bonus in zip(plans, oks, bonuses)]
    count = len(plans)
    lq = max(plan.shape[0] for plan in plans)
    lk = max(plan.shape[1] for plan in plans)
    left = np.empty((count, lq, lk), dtype=bool)  # M[i+1, j+1] == M[i+1, j]
    up = np.empty((count, lq, lk), dtype=bool)  # M[i+1, j+1] == M[i, j+1]
    block = np.zeros((count, _MEA_BLOCK + 1, lk + 1))  # block[:, r] = M[start + r, :]; column 0 stays 0
    diag = np.empty((count, lk))
    w = np.empty((count, _MEA_BLOCK, lk))
    for start in range(0, lq, _MEA_BLOCK):
        rows = min(_MEA_BLOCK, lq - start)
        w.fill(-np.inf)
        for n, (plan, ok, bonus) in enumerate(zip(plans, oks, bonuses)):
            part = slice(start, min(start + rows, plan.shape[0]))
            mine = part.stop - part.start
            if mine > 0:
                w[n, :mine, : plan.shape[1]] = np.where(ok[part], plan[part] + bonus, -np.inf)
        for r in range(rows):
            np.add(block[:, r, :-1], w[:, r], out=diag)  # M[i, j-1] + w[i, j]
            np.maximum(diag, block[:, r, 1:], out=diag)  # D_j = max(diagonal, up)
            np.maximum.accumulate(diag, axis=1, out=block[:, r + 1, 1:])  # M[i+1, j] = max_{k<=j} D_k
        m = block[:, : rows + 1]
        np.equal(m[:, 1:, 1:], m[:, 1:, :-1], out=left[:, start: start + rows])
        np.equal(m[:, 1:, 1:], m[:, :-1, 1:], out=up[:, start: start + rows])
        block[:, 0] = block[:, rows]
    return [_traceback(left[n, : plan.shape[0], : plan.shape[1]], up[n, : plan.shape[0], : plan.shape[1]])
            for n, plan in enumerate(plans)]


_MEA_BLOCK = 64  # DP rows kept at once by ``_mea_pairs_many``


@numba_jit.kernel_factory
def _compiled_dp():
    """``_mea_pairs_many``'s DP of one plan compiled with numba (``numba_jit``):
    ``tie_tables(plan, ok, bonus) -> (left, up)`` with the same sums and maxima in the same
    order (so the same M and ties), and ``_traceback`` compiled."""

    @numba_jit.njit()
    def tie_tables(plan, ok, bonus):
        lq, lk = plan.shape
        prev, cur = np.zeros(lk + 1), np.zeros(lk + 1)  # M[i, :], M[i + 1, :]
        left = np.empty((lq, lk), dtype=np.bool_)  # M[i+1, j+1] == M[i+1, j]
        up = np.empty((lq, lk), dtype=np.bool_)  # M[i+1, j+1] == M[i, j+1]
        for i in range(lq):
            for j in range(lk):
                d = prev[j] + (plan[i, j] + bonus) if ok[i, j] else -np.inf
                v = max(max(d, prev[j + 1]), cur[j]) if j > 0 else max(d, prev[j + 1])
                cur[j + 1] = v
                left[i, j] = v == cur[j] if j > 0 else v == 0.0
                up[i, j] = v == prev[j + 1]
            prev, cur = cur, prev
        return left, up

    return tie_tables, numba_jit.njit()(_traceback)


def _traceback(left: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Optimal pairs ``[n, 2]`` from the tie tables (gaps preferred on ties); plain Python
    that numba compiles too (``_compiled_dp``)."""
    lq, lk = left.shape
    out = np.empty((min(lq, lk), 2), dtype=np.int64)
    n, i, j = 0, lq, lk
    while i > 0 and j > 0:
        if left[i - 1, j - 1]:
            j -= 1
        elif up[i - 1, j - 1]:
            i -= 1
        else:  # neither gap move reaches M[i, j]: the diagonal move does
            out[n, 0], out[n, 1] = i - 1, j - 1
            n += 1
            i -= 1
            j -= 1
    return out[:n][::-1].copy()


def affine_decode(plan, *, gap_open: float, gap_extend: float, threshold: float = 0.0,
                  row_dustbin=None, col_dustbin=None, min_mass: float = 0.0,
                  mode: str = "global") -> PairAlignment:
    """Affine-gap alignment of a transport plan: a Gotoh DP on the shifted masses.

    Maximizes ``sum_{(i, j) aligned} (P_ij - threshold) - sum_gaps (gap_open + (len - 1)
    gap_extend)`` over proper alignments. ``mode="global"`` charges leading and trailing gaps
    like inner ones; ``mode="local"`` charges only gaps *between* aligned pairs, so the best
    segment wins (Smith-Waterman ends: pairs with ``P_ij < threshold`` score negative, which
    is what stops the segment; with ``threshold = 0`` every allowed pair adds and local keeps
    everything it can reach). MEA (``mea_decode``) is the case ``gap_open = gap_extend =
    threshold = 0``; the gap costs add the block structure of real alignments (one indel
    opening costs more than its extension), which a plan's independent pair masses do not carry.

    Row-vectorized like ``mea_decode``: the horizontal-gap state of a row is a cumulative max
    (a gap opened at column k and extended to j scores ``open_k + k e - (j - 1) e``), so the
    cost is ``Lq`` vector operations of length ``Lk``; the traceback keeps four ``[Lq, Lk]``
    tables (pointers int8, int8 and int32, and an int8 source table).

    Args:
      plan: ``[Lq, Lk]`` non-negative plan over the real rows / columns.
      gap_open, gap_extend: gap costs (``gap_open >= gap_extend >= 0``).
      threshold: mass subtracted from every pair (pairs below it cost more than they bring).
      row_dustbin, col_dustbin, min_mass: pairs excluded as in ``mea_decode``
        (dustbin-dominated rows and columns, masses below ``min_mass``): such residues are gaps
        (charged in global mode, free outside the segment in local mode).
      mode: ``"global"`` or ``"local"``.

    Returns:
      ``PairAlignment`` with ``confidence = P_ij`` of each pair and ``score`` the objective.
    """
    plan = _check_plan(plan)
    if not np.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold}")
    row_dustbin = _check_dustbin(row_dustbin, plan.shape[0], "row_dustbin")  # named as given, before a turn
    col_dustbin = _check_dustbin(col_dustbin, plan.shape[1], "col_dustbin")
    if _decoded_transposed(plan, row_dustbin, col_dustbin):  # one orientation of two: swapped sequences, ties
        return transposed(affine_decode(np.ascontiguousarray(plan.T), gap_open=gap_open, gap_extend=gap_extend,
                                        threshold=threshold, row_dustbin=col_dustbin, col_dustbin=row_dustbin,
                                        min_mass=min_mass, mode=mode))
    ok = _allowed(plan, row_dustbin, col_dustbin, min_mass)
    return _gotoh_alignment(plan, np.where(ok, plan - threshold, -np.inf), gap_open, gap_extend, mode)


def hybrid_decode(plan, seq_a: str, seq_b: str, *, plan_weight: float, gap_open: float = 11.0,
                  gap_extend: float = 1.0, min_mass: float = 0.0, mode: str = "global") -> PairAlignment:
    """Affine-gap alignment on BLOSUM62 scores plus the plan: ``BLOSUM62(a_i, b_j) +
    plan_weight * P_ij``, gaps in BLOSUM units (open / extend as Smith-Waterman's 11 / 1).

    The substitution matrix scores one residue pair at a time; the plan brings what the
    aligner learned from context. At ``plan_weight = 0`` this is Needleman-Wunsch on BLOSUM62
    (``mode="global"``, end gaps charged) or Smith-Waterman (``mode="local"``: the best-scoring
    segment, flanks unaligned); a large weight approaches the affine plan decoder. Same Gotoh
    DP and traceback as ``affine_decode``.

    Returns:
      ``PairAlignment`` with ``confidence = P_ij`` of each pair and ``score`` the objective.
    """
    from pfamalign.residues import substitution_scores

    plan = _check_plan(plan)
    if plan.shape != (len(seq_a), len(seq_b)):
        raise ValueError(f"plan shape {plan.shape} does not match the sequence lengths "
                         f"({len(seq_a)}, {len(seq_b)})")
    if not (np.isfinite(plan_weight) and plan_weight >= 0):
        raise ValueError(f"plan_weight must be finite and >= 0, got {plan_weight}")
    if not np.isfinite(min_mass) or min_mass < 0:
        raise ValueError(f"min_mass must be finite and >= 0, got {min_mass}")
    score = np.where(plan >= min_mass, substitution_scores(seq_a, seq_b) + plan_weight * plan, -np.inf)
    if _decoded_transposed(score):  # one orientation of two, by the scores (a zero plan is symmetric)
        return transposed(_gotoh_alignment(np.ascontiguousarray(plan.T), np.ascontiguousarray(score.T),
                                           gap_open, gap_extend, mode))
    return _gotoh_alignment(plan, score, gap_open, gap_extend, mode)


def _gotoh_alignment(plan: np.ndarray, score: np.ndarray, gap_open, gap_extend, mode: str) -> PairAlignment:
    """The best affine-gap alignment on ``score``, each pair with its plan mass as confidence."""
    local = _is_local(mode)
    if not (np.isfinite(gap_open) and np.isfinite(gap_extend) and gap_open >= gap_extend >= 0):
        raise ValueError(f"need gap_open >= gap_extend >= 0, got {gap_open}, {gap_extend}")
    pairs, value = _gotoh_pairs(score, float(gap_open), float(gap_extend), local)
    conf = plan[pairs[:, 0], pairs[:, 1]] if len(pairs) else np.zeros(0)
    return PairAlignment(pairs=pairs, confidence=conf, score=value, query_length=plan.shape[0],
                         key_length=plan.shape[1])


_START, _M, _X, _Y = 3, 0, 1, 2  # traceback codes: fresh start, pair, query gap, key gap


def _gotoh_pairs(score: np.ndarray, gap_open: float, gap_extend: float,
                 local: bool) -> tuple[np.ndarray, float]:
    """Best affine-gap path through ``score [Lq, Lk]`` (-inf = barred).

    States at cell (i, j) of the ``(Lq + 1) x (Lk + 1)`` lattice: M (pair (i-1, j-1) aligned
    last), X (query residue i-1 unaligned, a vertical move), Y (key residue j-1 unaligned, a
    horizontal move). ``local``: Smith-Waterman -- a path starts fresh at any pair whose best
    predecessor is not positive (the score floor at 0) and ends at the best M cell anywhere;
    the empty alignment (value 0) wins when no pair scores positive. This is the same optimum
    as freeing leading and trailing gaps in both sequences (an optimal local path starts and
    ends with a pair). Global: from the origin (an M state of value 0) to ``(Lq, Lk)``, end
    gaps charged like inner ones (Needleman-Wunsch's convention). Once a process uses numba
    (``numba_jit``) the DP runs compiled (``_compiled_gotoh``: the same tables; 30-50x faster
    a pair, where decoder tuning decodes every pair with every candidate).
    """
    score = np.ascontiguousarray(score, np.float64)
    dp = _compiled_gotoh() if numba_jit.started() else _gotoh_tables
    ptr_m, ptr_x, ptr_y, src_y, ends, best, best_i, best_j = dp(score, gap_open, gap_extend, local)
    lq, lk = score.shape
    if not local:
        state, best = int(np.argmax(ends)), float(np.max(ends))
        i, j = lq, lk
    elif best_i < 0:
        return np.zeros((0, 2), np.int64), 0.0
    else:
        i, j, state, best = int(best_i), int(best_j), _M, float(best)
    out = []
    while state != _START and (i, j) != (0, 0):
        if state == _M:
            out.append((i - 1, j - 1))
            state = int(ptr_m[i, j])
            i, j = i - 1, j - 1
        elif state == _X:
            state = int(ptr_x[i, j])
            i -= 1
        else:
            k = int(ptr_y[i, j])
            state = int(src_y[i, k])
            j = k
    return np.asarray(out[::-1], np.int64), best


def _gotoh_tables(score: np.ndarray, gap_open: float, gap_extend: float, local: bool):
    """``_gotoh_pairs``'s DP, a row at a time in numpy: ``(ptr_m, ptr_x, ptr_y, src_y, ends,
    best, best_i, best_j)`` -- the traceback's tables (``ptr_m``: the state before the pair,
    or _START; ``ptr_x``: the state at (i-1, j) before the vertical move; ``ptr_y``: the
    column k where the horizontal gap opened; ``src_y``: the state at (i, k) it opened from),
    the three states' values at (Lq, Lk), and local mode's best M cell (-1, -1 when none is
    positive)."""
    lq, lk = score.shape
    neg = -np.inf
    ks = np.arange(lk)
    m_prev, x_prev, y_prev = np.full(lk + 1, neg), np.full(lk + 1, neg), np.full(lk + 1, neg)
    ptr_m = np.zeros((lq + 1, lk + 1), np.int8)
    ptr_x = np.zeros((lq + 1, lk + 1), np.int8)
    ptr_y = np.zeros((lq + 1, lk + 1), np.int32)
    src_y = np.zeros((lq + 1, lk), np.int8)
    if not local:  # row 0: the origin, then a leading key gap
        m_prev[0] = 0.0
        y_prev[1:] = -gap_open - ks * gap_extend
        src_y[0, 0] = _M
    best, best_i, best_j = 0.0, -1, -1
    for i in range(1, lq + 1):
        prev = np.stack([m_prev[:-1], x_prev[:-1], y_prev[:-1]])  # states at (i-1, j-1)
        arg = prev.argmax(0)
        before = prev[arg, ks]
        fresh = ~(before > 0.0) if local else np.zeros(lk, bool)  # a fresh start beats all
        m_cur = np.full(lk + 1, neg)
        m_cur[1:] = np.where(fresh, 0.0, before) + score[i - 1]
        ptr_m[i, 1:] = np.where(fresh, _START, arg)
        cand = np.stack([m_prev - gap_open, x_prev - gap_extend, y_prev - gap_open])
        arg = cand.argmax(0)
        x_cur = cand[arg, np.arange(lk + 1)]
        ptr_x[i] = arg
        opener = np.maximum(m_cur[:-1], x_cur[:-1])  # open a key gap after (i, k)
        src_y[i] = np.where(m_cur[:-1] >= x_cur[:-1], _M, _X)
        t = opener - gap_open + ks * gap_extend
        run = np.maximum.accumulate(t)
        new = np.r_[True, t[1:] > run[:-1]]
        ptr_y[i, 1:] = np.maximum.accumulate(np.where(new, ks, 0))
        y_cur = np.full(lk + 1, neg)
        y_cur[1:] = run - ks * gap_extend
        if local:
            j = int(np.argmax(m_cur))
            if m_cur[j] > best:
                best, best_i, best_j = float(m_cur[j]), i, j
        m_prev, x_prev, y_prev = m_cur, x_cur, y_cur
    ends = np.array([m_prev[lk], x_prev[lk], y_prev[lk]])
    return ptr_m, ptr_x, ptr_y, src_y, ends, best, best_i, best_j


@numba_jit.kernel_factory
def _compiled_gotoh():
    """``_gotoh_tables`` compiled with numba (``numba_jit``), a cell at a time: the same sums in
    the same order, the same maxima and the same first-of-ties choices (M before X before Y,
    a gap's earliest opening), so the same tables and values."""

    @numba_jit.njit()
    def tables(score, gap_open, gap_extend, local):
        lq, lk = score.shape
        neg = -np.inf
        m_prev, x_prev, y_prev = np.full(lk + 1, neg), np.full(lk + 1, neg), np.full(lk + 1, neg)
        m_cur, x_cur, y_cur = np.full(lk + 1, neg), np.full(lk + 1, neg), np.full(lk + 1, neg)
        ptr_m = np.zeros((lq + 1, lk + 1), np.int8)
        ptr_x = np.zeros((lq + 1, lk + 1), np.int8)
        ptr_y = np.zeros((lq + 1, lk + 1), np.int32)
        src_y = np.zeros((lq + 1, lk), np.int8)
        if not local:
            m_prev[0] = 0.0
            for k in range(lk):
                y_prev[k + 1] = -gap_open - k * gap_extend
        best, best_i, best_j = 0.0, -1, -1
        for i in range(1, lq + 1):
            m_cur[0] = neg  # no pair ends in column 0 (the row swapped in may hold the origin)
            for j in range(1, lk + 1):  # M: a pair after the best state at (i-1, j-1)
                arg, before = 0, m_prev[j - 1]
                if x_prev[j - 1] > before:
                    arg, before = 1, x_prev[j - 1]
                if y_prev[j - 1] > before:
                    arg, before = 2, y_prev[j - 1]
                fresh = local and not before > 0.0
                m_cur[j] = (0.0 if fresh else before) + score[i - 1, j - 1]
                ptr_m[i, j] = 3 if fresh else arg
            for j in range(lk + 1):  # X: a vertical move from (i-1, j)
                arg, v = 0, m_prev[j] - gap_open
                if x_prev[j] - gap_extend > v:
                    arg, v = 1, x_prev[j] - gap_extend
                if y_prev[j] - gap_open > v:
                    arg, v = 2, y_prev[j] - gap_open
                x_cur[j] = v
                ptr_x[i, j] = arg
            run, at = neg, 0
            for k in range(lk):  # Y: a horizontal gap opened after (i, k), its best opening so far
                opener = max(m_cur[k], x_cur[k])
                src_y[i, k] = 0 if m_cur[k] >= x_cur[k] else 1
                t = opener - gap_open + k * gap_extend
                if k == 0 or t > run:
                    run, at = t, k
                ptr_y[i, k + 1] = at
                y_cur[k + 1] = run - k * gap_extend
            if local:
                jb, vb = 0, m_cur[0]
                for j in range(1, lk + 1):
                    if m_cur[j] > vb:
                        jb, vb = j, m_cur[j]
                if vb > best:
                    best, best_i, best_j = vb, i, jb
            m_prev, m_cur = m_cur, m_prev
            x_prev, x_cur = x_cur, x_prev
            y_prev, y_cur = y_cur, y_prev
        ends = np.array([m_prev[lk], x_prev[lk], y_prev[lk]])
        return ptr_m, ptr_x, ptr_y, src_y, ends, best, best_i, best_j

    return tables
