"""Batched, jitted forward-backward of the pair-HMM (``pairhmm``): the ``posterior`` decoder's
engine for one or a few pairs (its exported programs load in milliseconds; many pairs run on
``pairhmm_numba``, see ``numba_jit``), tested against ``pairhmm.match_posteriors`` (the
reference).

Differences from the reference, none of which changes the result beyond rounding:

* **Linear space with per-row scaling** instead of log space: every recurrence is linear in the
  previous row, so each row is divided by its largest value and the log of the factors is
  summed aside (the classic scaled forward-backward). The log-space version spends about 70
  exp / log per lattice cell; this one has none (emissions are a lookup in the exponentiated
  log-odds table, or the given table's ratios), only multiply-adds.
* The within-row gap recurrence ``y_j = c_j + e y_{j-1}`` (backward: ``y_{j+1}``) runs as
  small matrix products on blocks of columns (``_scan``), the gap type the leading axis.
* **Padding**: a batch of pairs runs on one ``[Pq, B, Pk]`` lattice (query rows outermost: the
  scans' own layout, so no transposes). The forward pass on cells
  ``(i, j) <= (Lq, Lk)`` does not read beyond them, and zeroes the cells past a pair's last
  column (their mass would grow along the padding and, through the per-row rescaling, drive
  the real cells to underflow); the backward pass starts its paths only at each pair's own
  end cell ``(Lq, Lk)`` (locally: at its own cells), so padded cells carry zero backward mass.
  Results are exact for every pair whatever the padding.
* **Local** (``local=True``, the segment model): the start and end weights enter each row in
  that row's scaled units (``exp(log_start - c)``, c the running log scale). Every row holds
  at least one fresh start (forward) or end (backward), so the scaled weight stays bounded.

Runs in float64 (``jax.enable_x64`` around the call: the rest of the package stays float32).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from pfamalign import resources
from pfamalign.alignment.pairhmm import (AnyPairHMM, check_many,
                                         checked_emissions, residue_indices)
from pfamalign.compile_cache import standard_rules

_UNKNOWN = 20  # residue index of non-standard letters (log-odds 0)
X64 = True


_BLOCK = 16  # the gap scans run as small matrix products on blocks of this many columns


def _width(columns: int) -> int:
    """The lattice width: ``columns`` rounded up to whole scan blocks."""
    return -(-columns // _BLOCK) * _BLOCK


def _scan_operators(log_decay, width: int):
    """The matrices of the gap scans over ``width`` columns (a multiple of ``_BLOCK``), per gap
    type (``log_decay [G]`` = log e): rightwards ``y_j = c_j + e y_{j-1}`` and leftwards
    ``y_j = c_j + e y_{j+1}``, each ``(within [G, K, K], between [G, nb, nb], lead [G, K])``:
    ``within[j, k] = e^|j-k|`` on the scan's side of the diagonal sums a block,
    ``between[n, m] = e^(K |n-m|)`` carries each block's far-end value across the blocks
    after it, and ``lead[j] = e^(steps from the block before)`` adds that carry in. Every
    entry is <= 1: no overflow whatever e (the closed form ``e^j cumsum(c e^-j)`` would
    overflow)."""
    import jax.numpy as jnp

    def toeplitz(size, step):  # [G, out, in]: e^(step (out - in)) for in <= out
        d = jnp.arange(size)[:, None] - jnp.arange(size)[None, :]
        return jnp.where(d >= 0, jnp.exp(log_decay[:, None, None] * step * jnp.maximum(d, 0)), 0.0)

    within, between = toeplitz(_BLOCK, 1), toeplitz(width // _BLOCK, _BLOCK)
    steps = jnp.arange(_BLOCK) + 1  # from the last column of the block before
    right = within, between, jnp.exp(log_decay[:, None] * steps)
    left = (within.transpose(0, 2, 1), between.transpose(0, 2, 1),
            jnp.exp(log_decay[:, None] * steps[::-1]))  # from the first column of the block after
    return right, left


def _scan(c, ops, *, leftwards: bool = False):
    """The gap scan of ``c [G, B, W]`` along its last axis (``_scan_operators``): per gap
    type, one batched product within the blocks and one across them (the gap type is the
    leading, batch, axis, so neither needs a transpose)."""
    import jax
    import jax.numpy as jnp

    within, between, lead = ops
    g, b, w = c.shape
    nb = w // _BLOCK
    batched = (((2,), (2,)), ((0,), (0,)))  # contract the last axes, batch over G
    local = jax.lax.dot_general(c.reshape(g, b * nb, _BLOCK), within, batched).reshape(g, b, nb, _BLOCK)
    ends = jax.lax.dot_general(local[..., 0 if leftwards else -1], between, batched)  # [G, B, nb]
    # each block takes the total at the near end of its neighbour on the scan's upstream side
    carry = (jnp.pad(ends[..., 1:], ((0, 0), (0, 0), (0, 1))) if leftwards
             else jnp.pad(ends[..., :-1], ((0, 0), (0, 0), (1, 0))))
    return (local + carry[..., None] * lead[:, None, None, :]).reshape(g, b, w)


def _posteriors(p, emit, lq, lk, local=False):
    """``[Pq, B, Pk]`` match posteriors (row-major: the scans' own layout) of padded emission
    ratios ``emit [Pq, B, Pk]`` (1 past each pair's ends; ``local``: the segment model,
    ``pairhmm.log_forward_backward``). Inside, M rows are ``[B, W]`` and the gap states'
    ``[G, B, W]`` (W: the columns 0..Pk rounded up to whole scan blocks)."""
    import jax
    import jax.numpy as jnp

    pq, b, pk = emit.shape
    g = p["open"].shape[0]
    w = _width(pk + 1)
    emit = jnp.pad(emit, ((0, 0), (0, 0), (0, w - 1 - pk)), constant_values=1.0)  # [Pq, B, W - 1]
    mm = p["mm"]
    opn, dec, close = (p[k][:, None, None] for k in ("open", "extend", "close"))  # [G, 1, 1]
    right, left = _scan_operators(jnp.log(p["extend"]), w)
    sw = p["switch"]  # [G, G]: X_g -> Y_h and Y_g -> X_h

    def switch(x, back=False):  # [G, B, W] through sw: sum_h sw[h, g] x_h (back: sw[g, h])
        # a sum of G = 1-3 products, not einsum or a reduction: elementwise, it fuses
        s = sw.T if back else sw
        return sum(s[h][:, None, None] * x[h][None] for h in range(g))

    def rescale(m, *gaps):  # divide each pair's rows by their largest value
        top = functools.reduce(jnp.maximum, [x.max(-1).max(0) for x in gaps], m.max(-1))  # [B]
        top = jnp.where(top > 0, top, 1.0)
        return (m / top[:, None], *(x / top[:, None] for x in gaps)), jnp.log(top)

    def shift_right(x):  # x[..., j - 1] at j, 0 at j = 0
        return jnp.pad(x[..., :-1], [(0, 0)] * (x.ndim - 1) + [(1, 0)])

    def fwd_y(m_row, x_row):  # Y_g along row i from M and X_h at (i, j - 1)
        return _scan(opn * shift_right(m_row)[None] + switch(shift_right(x_row)), right)

    cols = jnp.arange(w)
    log_start = -(jnp.log(lq.astype(emit.dtype)) + jnp.log(lk.astype(emit.dtype)))  # [B], local
    in_cols = ((cols[None, :] >= 1) & (cols[None, :] <= lk[:, None])).astype(emit.dtype)  # [B, W]
    # Forward cells past a pair's last column feed no cell of its lattice (every move goes
    # right or down), but left in, their mass grows along the padding (ratio 1 there) and, as
    # each row is rescaled by its largest cell, would drive the real cells to underflow: zeroed.
    lattice = (cols[None, :] <= lk[:, None]).astype(emit.dtype)  # [B, W]

    def forward_row(m, x):  # (M, X, Y) of a row within the lattice, rescaled
        m, x = m * lattice, x * lattice[None]
        return rescale(m, x, fwd_y(m, x) * lattice[None])

    # row 0: globally the path starts at the origin as if from M, leading key gaps along the
    # row; locally nothing is on row 0 (a segment starts with a pair)
    m0 = jnp.zeros((b, w)) if local else jnp.zeros((b, w)).at[:, 0].set(1.0)
    x0 = jnp.zeros((g, b, w))
    (m0, x0, y0), c0 = forward_row(m0, x0)

    rows = jnp.arange(b)

    def fwd_step(carry, inputs):
        m, x, y, c, z = carry
        i, e_row = inputs  # row i >= 1; e_row [B, W - 1]: emissions of query residue i - 1
        into = mm * m + (close * (x + y)).sum(0)  # before the pair
        if local:  # or a fresh segment starts with this pair
            into = into + jnp.exp(log_start - c)[:, None]
        m_new = jnp.pad(into[:, :-1] * e_row, ((0, 0), (1, 0)))
        x_new = opn * m[None] + dec * x + switch(y)
        (m_new, x_new, y_new), s = forward_row(m_new, x_new)
        ends = (m_new * in_cols).sum(-1) if local else None  # segments ending on this row
        if not local:  # globally Z is every state's mass at the pair's end cell (Lq, Lk)
            at_end = m_new[rows, lk] + x_new[:, rows, lk].sum(0) + y_new[:, rows, lk].sum(0)
            z = jnp.where(i == lq, jnp.log(at_end) + c + s, z)
        return (m_new, x_new, y_new, c + s, z), (m_new, c + s, ends)

    (*_, z_end), (fm, fc, ends) = jax.lax.scan(fwd_step, (m0, x0, y0, c0, jnp.zeros(b)),
                                               (jnp.arange(1, pq + 1), emit))
    if local:  # sum over the rows 1..Lq of each pair
        keep = (jnp.arange(1, pq + 1)[:, None] <= lq[None, :]) & (ends > 0)  # [Pq, B]
        log_rows = jnp.where(keep, jnp.log(jnp.where(keep, ends, 1.0)) + fc, -jnp.inf)
        log_z = jax.nn.logsumexp(log_rows, axis=0) + log_start
    else:
        log_z = z_end  # lq >= 1: rows 1..Pq scanned

    # backward, rows Pq .. 0; globally paths end at each pair's (Lq, Lk) in any state, locally
    # after any pair of the pair's own cells

    def bwd_step(carry, inputs):
        bm_next, bx_next, c = carry  # row i + 1
        i, e_row = inputs  # e_row: emissions of query residue i (zeros past the end)
        if local:
            end = jnp.zeros((b, w), bm_next.dtype)
            row_in = ((i >= 1) & (i <= lq)).astype(bm_next.dtype)  # [B]
            end_m = in_cols * (row_in * jnp.exp(log_start - c))[:, None]
        else:
            end = ((i == lq)[:, None] & (cols[None, :] == lk[:, None])).astype(bm_next.dtype)
            end_m = end
        diag = jnp.pad(e_row * bm_next[:, 1:], ((0, 0), (0, 1)))  # pair (i, j) then M at (i+1, j+1)
        by = _scan(close * diag[None] + end[None] + switch(bx_next, back=True), left, leftwards=True)
        y_right = jnp.pad(by[..., 1:], ((0, 0), (0, 0), (0, 1)))
        bm = mm * diag + end_m + (opn * (bx_next + y_right)).sum(0)
        bx = close * diag[None] + end[None] + dec * bx_next + switch(y_right, back=True)
        (bm, bx), s = rescale(bm, bx)
        return (bm, bx, c + s), (bm, c + s)

    # rows Pq .. 1 (row 0 carries no match); row i reads the emissions of residue i
    e_rows = jnp.concatenate([emit[1:], jnp.zeros((1, b, w - 1), emit.dtype)], 0)
    init = (jnp.zeros((b, w)), jnp.zeros((g, b, w)), jnp.zeros(b))
    _, (bm, bc) = jax.lax.scan(bwd_step, init, (jnp.arange(1, pq + 1), e_rows), reverse=True)
    log_scale = fc + bc - log_z[None, :]  # [Pq, B]
    post = fm[:, :, 1: pk + 1] * bm[:, :, 1: pk + 1] * jnp.exp(log_scale)[:, :, None]
    return jnp.minimum(post, 1.0), log_z


@functools.lru_cache(maxsize=None)
def _compiled():
    import jax

    return jax.jit(_posteriors, static_argnames="local")


def _posteriors_program(params: dict, emit: np.ndarray, local: bool):
    """``(params, emit, lq, lk) -> (posteriors, log Z)`` at these shapes: the program exported
    to the cache directory (``compile_cache.exported_program``: a warm run neither traces nor
    lowers it), or the jitted function when the cache is off."""
    from pfamalign.compile_cache import program_path

    gaps = len(params["open"])
    path = program_path("pairhmm", f"posteriors-{'local' if local else 'global'}-g{gaps}-"
                                   + "x".join(map(str, emit.shape)))
    shapes = tuple((name, np.shape(value)) for name, value in params.items())
    program = _exported_once(path, shapes, emit.shape, local) if path is not None else None
    return program.call if program is not None else functools.partial(_compiled(), local=local)


_EXPORT_LOCKS: dict = {}
_EXPORT_LOCKS_LOCK = threading.Lock()


def _exported_once(*key):
    """``_exported``, exported once when threads ask for the same program together (a
    mixture's components each ask on a thread of their own: every cold run exported it twice)."""
    with _EXPORT_LOCKS_LOCK:
        lock = _EXPORT_LOCKS.setdefault(key, threading.Lock())
    with lock:
        return _exported(*key)


@functools.lru_cache(maxsize=None)
def _exported(path, param_shapes: tuple, shape: tuple[int, int, int], local: bool):
    import jax

    from pfamalign.compile_cache import exported_program

    def export() -> bytes:
        params = {name: jax.ShapeDtypeStruct(dims, np.float64) for name, dims in param_shapes}
        lens = jax.ShapeDtypeStruct((shape[1],), np.int32)
        program = jax.jit(functools.partial(_posteriors, local=local))
        return bytes(jax.export.export(program)(params, jax.ShapeDtypeStruct(shape, np.float64),
                                                lens, lens).serialize())

    return exported_program(path, export)


def batched_match_posteriors(hmm: AnyPairHMM, pairs: list[tuple[str, str]], pad_q: int, pad_k: int,
                             *, local: bool = False, log_emissions: list | None = None) -> list[np.ndarray]:
    """``[Lq, Lk]`` match posteriors of each ``(seq_a, seq_b)``, computed in one jitted call on
    a ``[len(pairs), pad_q, pad_k]`` lattice per component (one compilation per batch shape);
    a mixture's components are weighted per pair (``PairHMMMixture.weights``); ``local``: the
    segment model; ``log_emissions``: per pair, ``[Lq, Lk]`` match log-odds in place of the
    substitution table's (``pairhmm.plan_log_odds``)."""
    import jax

    check_many(pairs, log_emissions)
    qi = np.full((len(pairs), pad_q), _UNKNOWN, np.int32)
    ki = np.full((len(pairs), pad_k), _UNKNOWN, np.int32)
    for n, (a, b) in enumerate(pairs):
        if len(a) > pad_q or len(b) > pad_k:
            raise ValueError(f"pair {n} ({len(a)} x {len(b)}) does not fit the padding {pad_q} x {pad_k}")
        qi[n, : len(a)], ki[n, : len(b)] = residue_indices(a), residue_indices(b)
    lq = np.array([len(a) for a, _ in pairs], np.int32)
    lk = np.array([len(b) for _, b in pairs], np.int32)
    given = None  # emissions are laid out [pad_q, pairs, pad_k]: query rows outermost, as scanned
    if log_emissions is not None:  # the same table for every component; 1 in the padding
        given = np.ones((pad_q, len(pairs), pad_k))
        for n, table in enumerate(log_emissions):
            given[: lq[n], n, : lk[n]] = np.exp(checked_emissions(table, lq[n], lk[n]))
    components = hmm.components

    @standard_rules  # on the pool's threads too
    def solve(component):
        with jax.enable_x64(X64):  # thread-local: the caller's threads stay float32
            params = {k: np.asarray(v, np.float64) for k, v in component.linear_transitions().items()}
            emit = given if given is not None else np.exp(component.log_odds())[qi.T[:, :, None], ki[None]]
            post, log_z = _posteriors_program(params, emit, local)(params, emit, lq, lk)
            return np.asarray(post), np.asarray(log_z)

    # a mixture's components are independent lattices: each on its own thread (a row scan
    # keeps one core busy; jax releases the GIL while it runs)
    pool = resources.thread_pool("mixture-components", min(4, resources.usable_cpus()))
    solved = (list(pool.map(solve, components)) if len(components) > 1
              else [solve(components[0])])
    if len(components) == 1:
        out = solved[0][0]
    else:  # [Lq, N, Lk] posteriors weighted per pair
        weights = hmm.weights(np.stack([log_z for _, log_z in solved], axis=-1))  # [N, K]
        out = sum(weights[None, :, k, None] * post for k, (post, _) in enumerate(solved))
    return [np.ascontiguousarray(out[: lq[n], n, : lk[n]]) for n in range(len(pairs))]
