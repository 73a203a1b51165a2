"""The pair-HMM's forward-backward (``pairhmm``) compiled with numba, one pair at a time: the
engine of many pairs (``Predictor.hmm_posteriors``, ``numba_jit``), tested against
``pairhmm.match_posteriors`` (the reference).

Why a second fast engine beside ``pairhmm_batched`` (jitted XLA on padded batches): the XLA
lattice must run the within-row gap recurrence ``y_j = c_j + e y_{j-1}`` as small matrix
products on blocks of columns, and pays for the padding of its batch shapes; here that
recurrence is a plain loop, every pair runs at its own size, and a row's other states are
one vectorized pass. Per 300 x 300 pair and mixture component: 1.1-1.4 ms against the XLA
engine's 3.1 (its padded shape). The price is numba's start-up in each process (0.4 s), so
one or a few pairs (``pfamalign align A B``) keep the XLA engine, whose exported programs
load in milliseconds (``numba_jit.BULK_PAIRS``).

Numerics are those of ``pairhmm_batched``: linear space, float64, each row scaled by the
previous row's largest value with the log of the factors summed aside -- here the factor is
folded into the transition probabilities that read the previous row (so no pass rescales a
row). A pair's lattice is its own ``(Lq + 1) x (Lk + 1)`` cells: nothing is padded.

The kernel is compiled once per number of gap types (a compile-time constant: the gap-type
loops unroll and the column loops vectorize) and kept in numba's disk cache; it releases the
GIL, so pairs and mixture components run on a pool of threads.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pfamalign import resources
from pfamalign.alignment.numba_jit import kernel_factory, njit
from pfamalign.alignment.pairhmm import (AnyPairHMM, PairHMM, check_many,
                                         checked_emissions, residue_indices)

LATTICES_A_FUTURE = 32  # (pair, component) lattices a thread-pool task solves (``_solved``)


@kernel_factory
def _kernel(gaps: int):
    """``(mm, open, extend, close, switch, emit [Lq, Lk], local, posteriors) -> (posteriors
    [Lq, Lk], log Z)``: the linear-space transitions (``PairHMM.linear_transitions``) of a
    model with ``gaps`` gap types and the match emission ratios of one pair; ``posteriors``
    false: the forward pass alone (``log Z``; an empty table)."""
    G = gaps  # a closure constant: numba compiles it in, and keys its cache by it

    @njit(variant=f"{gaps}gaps", fastmath={"reassoc", "contract"})  # reassoc: the row maxima vectorize
    def forward_backward(mm, opn, dec, close, sw, emit, local, posteriors):
        lq, lk = emit.shape
        c = lk + 1
        log_start = -(math.log(lq) + math.log(lk))  # local: start and end weight of each cell
        fm = np.zeros((lq + 1, c))  # forward M; row i in units exp(units[i])
        units = np.zeros(lq + 1)
        x, y = np.zeros((G, c)), np.zeros((G, c))  # X_g, Y_g of the row above
        xn, yn = np.zeros((G, c)), np.zeros((G, c))
        ends = np.zeros(lq + 1)  # local: the M mass of each row (paths ending there)
        top = 0.0
        if not local:  # the path starts at the origin as if from M; leading key gaps on row 0
            fm[0, 0] = top = 1.0
            for j in range(1, c):
                for h in range(G):
                    y[h, j] = opn[h] * fm[0, j - 1] + dec[h] * y[h, j - 1]
                    top = max(top, y[h, j])
        for i in range(1, lq + 1):
            inv = 1.0 / top if top > 0.0 else 1.0  # the row above, scaled to a largest value of 1
            units[i] = units[i - 1] - math.log(inv)
            start = math.exp(log_start - units[i]) if local else 0.0
            s_mm, s_opn, s_dec, s_close, s_sw = mm * inv, opn * inv, dec * inv, close * inv, sw * inv
            prev, row = fm[i - 1], fm[i]
            top = 0.0
            for j in range(1, c):  # a pair at (i, j), after any state at (i - 1, j - 1)
                t = s_mm * prev[j - 1] + start
                for h in range(G):
                    t += s_close[h] * (x[h, j - 1] + y[h, j - 1])
                row[j] = emit[i - 1, j - 1] * t
                top = max(top, row[j])
            for j in range(c):  # a query residue against a gap, after (i - 1, j)
                for h in range(G):
                    v = s_opn[h] * prev[j] + s_dec[h] * x[h, j]
                    for k in range(G):
                        v += s_sw[k, h] * y[k, j]
                    xn[h, j] = v
                    top = max(top, v)
            for h in range(G):  # a key residue against a gap, after (i, j - 1): M and X there...
                yn[h, 0] = 0.0
            for j in range(1, c):
                for h in range(G):
                    v = opn[h] * row[j - 1]
                    for k in range(G):
                        v += sw[k, h] * xn[k, j - 1]
                    yn[h, j] = v
            for h in range(G):  # ... and Y_h there: the recurrence along the row
                d, v = dec[h], 0.0
                for j in range(1, c):
                    v = yn[h, j] + d * v
                    yn[h, j] = v
                    top = max(top, v)
            x, xn = xn, x
            y, yn = yn, y
            if local:
                s = 0.0
                for j in range(1, c):
                    s += row[j]
                ends[i] = s
        if local:  # log Z = log_end + log sum_i ends_i
            best = -np.inf
            for i in range(1, lq + 1):
                if ends[i] > 0:
                    best = max(best, math.log(ends[i]) + units[i])
            s = 0.0
            for i in range(1, lq + 1):
                if ends[i] > 0:
                    s += math.exp(math.log(ends[i]) + units[i] - best)
            log_z = best + math.log(s) + log_start
        else:  # every state at the end cell (Lq, Lk)
            at_end = fm[lq, lk]
            for h in range(G):
                at_end += x[h, lk] + y[h, lk]
            log_z = math.log(at_end) + units[lq]
        if not posteriors:
            return np.empty((0, 0)), log_z

        # backward, rows Lq .. 1; row i + 1's values are read scaled into row i's units
        post = np.empty((lq, lk))
        bm, bmn = np.zeros(c), np.zeros(c)
        bx, bxn = np.zeros((G, c)), np.zeros((G, c))
        by = np.zeros((G, c + 1))  # column Lk + 1 stays 0
        diag = np.zeros(c)
        unit, top = 0.0, 0.0
        for i in range(lq, 0, -1):
            inv = 1.0 / top if top > 0.0 else 1.0
            unit -= math.log(inv)
            s_mm, s_opn, s_dec, s_close, s_sw = mm * inv, opn * inv, dec * inv, close * inv, sw * inv
            for j in range(lk):  # a pair at (i + 1, j + 1), then on from M there
                diag[j] = emit[i, j] * bm[j + 1] if i < lq else 0.0
            diag[lk] = 0.0
            for j in range(c):  # the moves down and diagonally (to row i + 1)
                v = s_mm * diag[j]
                for h in range(G):
                    v += s_opn[h] * bx[h, j]
                    w = s_close[h] * diag[j]
                    bxn[h, j] = w + s_dec[h] * bx[h, j]
                    for k in range(G):
                        w += s_sw[h, k] * bx[k, j]
                    by[h, j] = w
                bmn[j] = v
            if local:  # a segment may end after any pair of the row
                end = math.exp(log_start - unit)
                for j in range(1, c):
                    bmn[j] += end
            elif i == lq:  # paths end at (Lq, Lk) in any state
                bmn[lk] += 1.0
                for h in range(G):
                    bxn[h, lk] += 1.0
                    by[h, lk] += 1.0
            for h in range(G):  # Y_h: the recurrence leftwards along the row
                d, v = dec[h], 0.0
                for j in range(lk, -1, -1):
                    v = by[h, j] + d * v
                    by[h, j] = v
            top = 0.0
            for j in range(c):  # the moves right (to Y at (i, j + 1))
                v = bmn[j]
                for h in range(G):
                    v += opn[h] * by[h, j + 1]
                    w = bxn[h, j]
                    for k in range(G):
                        w += sw[h, k] * by[k, j + 1]
                    bxn[h, j] = w
                    top = max(top, w)
                bmn[j] = v
                top = max(top, v)
            bm, bmn = bmn, bm
            bx, bxn = bxn, bx
            scale = math.exp(units[i] + unit - log_z)
            row = fm[i]
            for j in range(1, c):
                post[i - 1, j - 1] = min(row[j] * bm[j] * scale, 1.0)
        return post, log_z

    return forward_backward


def _solve(component: PairHMM, emit: np.ndarray, local: bool, posteriors: bool) -> tuple[np.ndarray, float]:
    t = component.linear_transitions()
    return _kernel(component.n_gap_types)(float(t["mm"]), t["open"], t["extend"], t["close"],
                                           t["switch"], emit, bool(local), bool(posteriors))


def _solved(hmm: AnyPairHMM, pairs: list[tuple[str, str]], local: bool, log_emissions: list | None,
            posteriors: bool) -> tuple[tuple[PairHMM, ...], dict]:
    """Every (pair, component) solved on the thread pool: ``{(n, k): (posteriors, log Z)}``."""
    check_many(pairs, log_emissions)
    components = hmm.components
    ratios = [np.exp(c.log_odds()) for c in components]

    def emissions(n: int, k: int) -> np.ndarray:
        a, b = pairs[n]
        if log_emissions is not None:  # the same table for every component
            return np.exp(checked_emissions(log_emissions[n], len(a), len(b)))
        return ratios[k][residue_indices(a)].take(residue_indices(b), axis=1)  # 4x a 2-d fancy index

    tasks = [(n, k) for n in range(len(pairs)) for k in range(len(components))]
    # A future per task cost a search more in Python (a lock each: 5.4 of 39 s in an
    # all-against-all search of 60 sequences) than many of its small lattices take: up to
    # LATTICES_A_FUTURE tasks a future, at least 4 futures a thread so that the threads
    # finish together.
    size = max(1, min(LATTICES_A_FUTURE, len(tasks) // (4 * resources.usable_cpus())))
    chunks = [tasks[at:at + size] for at in range(0, len(tasks), size)]
    solved = resources.thread_pool("lattices").map(
        lambda chunk: [_solve(components[k], emissions(n, k), local, posteriors) for n, k in chunk], chunks)
    return components, dict(zip(tasks, itertools.chain.from_iterable(solved)))


def match_posteriors_many(hmm: AnyPairHMM, pairs: list[tuple[str, str]], *, local: bool = False,
                          log_emissions: list | None = None) -> list[np.ndarray]:
    """``[Lq, Lk]`` match posteriors of each ``(seq_a, seq_b)`` (``pairhmm.match_posteriors``
    of each, to float64 rounding); ``local``: the segment model; ``log_emissions``: per pair,
    ``[Lq, Lk]`` match log-odds in place of the substitution table's."""
    components, solved = _solved(hmm, pairs, local, log_emissions, posteriors=True)
    return [hmm.mix(*zip(*(solved[n, k] for k in range(len(components))))) for n in range(len(pairs))]


def log_likelihood_ratios(hmm: AnyPairHMM, pairs: list[tuple[str, str]], *, local: bool = False) -> np.ndarray:
    """``pairhmm.log_likelihood_ratio`` of each ``(seq_a, seq_b)``, by the forward pass alone."""
    components, solved = _solved(hmm, pairs, local, None, posteriors=False)
    log_z = np.array([[solved[n, k][1] for k in range(len(components))] for n in range(len(pairs))])
    log_z = log_z.reshape(len(pairs), len(components))  # [N, components], no pairs included
    return hmm.log_z(log_z)
