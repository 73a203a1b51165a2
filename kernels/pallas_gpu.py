"""GPU (Triton) wrapper of the banded kernels: one row block per program, band tiles in a loop.

Grid ``(N, nI)`` (the one-pass kernels: ``(N, Lp / G)`` row groups and ``(N, nI + 2 wb)`` key
blocks): GPU programs run in parallel, so each one owns a row block and walks its key
blocks ``max(I - wb, 0) .. min(I + wb, nI - 1)`` in a ``fori_loop`` with the running state
(online LSE or the product accumulator) as the loop carry. The problem's keys stay in global
memory and are sliced one tile at a time; each tile's scores are recomputed from q and k.

Triton wants every loaded array to be a power of two in size and ``tl.dot`` operands of at
least 16 in every dimension: the tile edge must be such a power of two, and feature dims are
zero-padded to one here (zero features change no inner product; padded output columns are
cut off).

Scores come from one of two sources (``source``, static): "qk" recomputes each tile as
``<q_i, k_j>`` (O(L) memory: nothing of the band is stored), "rows" / "cols" read it from a
band stored once by ``band_scores`` (O(L W) memory, as the XLA path; no matmul per pass: on a
GPU the recomputation runs at fp32 without tensor cores, 64 FMAs an entry for d = 64, in each
of ~40 passes). The stored band is ``[N, Lp, n_diag b]``: row i holds its row block's key
blocks ``I - wb .. I + wb`` side by side (``-inf`` off the band, on inactive lines and on key
blocks off the problem). "rows" walks a row block's own band row; "cols" walks a key block's
tiles down the band: the column LSE and vector product reduce each tile along its rows as it
is, the products with dots transpose it.
The gradient's modulated plan ``D = P ∘ <x_i, z_j>`` is stored the same way by the row product
that computes it (``stored_product(keep_band=True)``) and walked as it is
(``stored_linear_product``).

Dots (``dots``, static; ``TransportConfig.triton_dots``): "ieee" fp32 FMAs, or "tf32x3" on
tensor cores (three TF32 products, f32 accumulation), which interpret mode emulates in f32
operations (``tile_math.DOTS``) so that CPU tests check its arithmetic.

Shared memory: each call re-tiles the band with the edge, ``num_warps`` and ``num_stages`` that
``gpu_budget.choose`` picks for the device's budget (the band tiling's edge divided by a power
of two; the band mask is exact at any edge). Interpret mode runs the same tiling.
"""

from __future__ import annotations

import functools
import importlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pfamalign.kernels import gpu_budget, tile_math
from pfamalign.kernels.band import BandGeometry, make_geometry
from pfamalign.kernels.config import SAFE_LOG, TRITON_DOTS, pallas_triton, potential
from pfamalign.kernels.gpu_budget import MIN_DOT, GpuTiling, KernelShape

# The Pallas Triton backend, deprecated in jax 0.11: a jax without it still runs these kernels
# in interpret mode (no launch settings to give), and refuses to lower them for a GPU
# (``pallas_ops``).
pltriton = importlib.import_module("jax.experimental.pallas.triton") if pallas_triton() else None


def check_geometry(geom: BandGeometry) -> None:
    """Raises ValueError unless the tile edge is a legal Triton block."""
    b = geom.block
    if b < MIN_DOT or b & (b - 1):
        raise ValueError(f"Triton tiles must be powers of two >= {MIN_DOT}, got block={b}")


# ---- layouts, specs, the band loop ------------------------------------------------------------


def _pad_features(x, pieces: bool = False):
    """``[N, Lp, f]`` -> ``[N, Lp, f']``, zero filled: f' the next power of two >= max(f, 16),
    or with ``pieces`` the next multiple of 16, which the kernel reads as power-of-two pieces
    (``_pow2_pieces``; the modulation's d + 2R = 68 features: 64 + 16, not 128)."""
    f = x.shape[-1]
    fp = gpu_budget.in_pieces(f) if pieces else gpu_budget.padded(f)
    return x if fp == f else jnp.pad(x, ((0, 0), (0, 0), (0, fp - f)))


# True: every product pads a vector y (m = 1) to 16 columns and its modulation features to a power
# of two, and takes dots, as the kernels did when measured on an H100 (2026-11-24);
# ``scripts/triton_static_cost.py --calibrate`` compiles them so. Read at trace time.
PADDED_DOTS = False

# Launch settings forced per kernel shape ({KernelShape: GpuTiling}), for the tiling sweep of
# scripts/tune_triton.py; empty otherwise. Read at trace time.
FORCED_TILING: dict[KernelShape, GpuTiling] = {}


def tiling(geom: BandGeometry, shape: KernelShape) -> tuple[BandGeometry, GpuTiling]:
    """The band re-tiled for this device's shared memory, and the launch settings. Tiles below
    ``MIN_DOT`` (interpret mode only) are kept as they are; so is a stored band's tiling
    (``shape.stored``: only the launch settings are free)."""
    if geom.block < MIN_DOT:
        return geom, GpuTiling(geom.block, gpu_budget.num_warps(geom.block), gpu_budget.STAGES[0])
    fallback = "use impl='xla' (the banded XLA path: no kernel tiling), or narrower q / k / v"
    try:
        t = FORCED_TILING.get(shape) or gpu_budget.choose(shape, geom.block, gpu_budget.device_budget(),
                                                          max_edge=geom.block if shape.stored else None)
    except ValueError as err:
        raise ValueError(f"{err}: {fallback}") from None
    if not shape.stored:
        return make_geometry(geom.length, geom.half_band, t.block, pallas=True), t
    if t.block != geom.block:
        raise ValueError(f"a band stored at {geom.block}-wide tiles does not fit this GPU's shared "
                         f"memory for {shape}: {fallback}")
    return geom, t


def _dot_mode(dots: str, interpret) -> str:
    """The ``tile_math`` dot arithmetic of a call: interpret mode emulates "tf32x3"."""
    if dots not in TRITON_DOTS:
        raise ValueError(f"dots must be one of {TRITON_DOTS}, got {dots!r}")
    return "tf32x3-emulated" if interpret and dots == "tf32x3" else dots


def _rows(b: int, f: int | None = None):
    """Spec of this program's row block of a ``[N, Lp(, f)]`` operand."""
    if f is None:
        return pl.BlockSpec((None, b), lambda n, i, *_: (n, i))
    return pl.BlockSpec((None, b, f), lambda n, i, *_: (n, i, 0))


def _whole(lp: int, f: int | None = None):
    """Spec of a problem's whole ``[N, Lp(, f)]`` operand: the kernel slices its key tiles."""
    if f is None:
        return pl.BlockSpec((None, lp), lambda n, i, *_: (n, 0))
    return pl.BlockSpec((None, lp, f), lambda n, i, *_: (n, 0, 0))


def _key_range(i_blk, geom: BandGeometry):
    """``[lo, hi)`` of the key blocks that row block ``i_blk`` meets (no clipped duplicates)."""
    return jnp.maximum(i_blk - geom.wb, 0), jnp.minimum(i_blk + geom.wb + 1, geom.n_blocks)


# Band tiles a trip of the streaming walks (``STREAMING_KERNELS``: the fused half steps, the
# stored band's column LSE and its row vector product), whose loads are in flight together. Such a walk is bound by its
# band's bytes, and
# a program (4 warps, 32-wide f32 tiles) with one 4 KB tile in flight keeps L x 4 x 32 bytes in
# flight over the GPU (2 MB at L 16384) where an H100's 3.35 TB/s over its ~1 us loaded latency
# asks for ~3.3 MB: the walks would stream at ~60 % of the bandwidth. Two tiles a trip: 4 MB.
# Measured on an H200 (2026-11-29, L 16384, W 1024, fwd + bwd): 3.55 ms a call, 4.10 with one.
STREAMING_TILES_A_TRIP = 2


def _walk_tiles(lo, hi, load, step, carry, tiles_a_trip: int = 1, wide: bool = False):
    """``carry = step(j, load(j), carry)`` for the walked blocks ``j`` in ``[lo, hi)`` (the same
    blocks in the same order), ``tiles_a_trip`` blocks a trip loaded before any is computed on.

    Apart (``wide`` False, a column walk: its blocks lie apart in the band) each block is
    loaded and stepped on its own; the rest of the trips one by one. ``wide`` (a row walk: a
    band row's blocks lie side by side) ``load(j, skip)`` reads blocks ``j .. j + T - 1`` (T
    ``tiles_a_trip``) as one tile, of which the first ``skip`` are masked off (their walked
    offsets ``-inf``), and ``step`` takes it whole; the last ``(hi - lo) % T`` blocks are the
    end of a trip at ``hi - T`` (``hi - lo >= T``: ``wide_trips``). ptxas keeps apart blocks'
    loads together in the column LSE walks, but issues a row walk's second block's loads only
    after its first block's exponentials (sm_90 SASS): one wide load keeps them together."""
    t = tiles_a_trip
    if t == 1:
        return jax.lax.fori_loop(lo, hi, lambda j, c: step(j, load(j) if not wide else load(j, 0), c), carry)
    trips = (hi - lo) // t
    if wide:
        carry = jax.lax.fori_loop(0, trips, lambda k, c: step(lo + k * t, load(lo + k * t, 0), c), carry)
        rest = (hi - lo) % t
        return jax.lax.fori_loop(0, jnp.minimum(rest, 1), lambda _, c: step(hi - t, load(hi - t, t - rest), c),
                                 carry)

    def trip(k, c):
        blocks = [lo + k * t + n for n in range(t)]
        loaded = [load(j) for j in blocks]
        for j, operands in zip(blocks, loaded):
            c = step(j, operands, c)
        return c

    carry = jax.lax.fori_loop(0, trips, trip, carry)
    return jax.lax.fori_loop(lo + trips * t, hi, lambda j, c: step(j, load(j), c), carry)


def wide_trips(tiles: int, geom: BandGeometry) -> int:
    """``tiles`` for a row walk's wide trips (``_walk_tiles``), or 1 where a row block may meet
    fewer key blocks (``wb + 1`` at the problem's ends)."""
    return tiles if geom.wb + 1 >= tiles else 1


def _stored_load(band_ref, c_ref, i_blk, geom: BandGeometry, source: str, tiles: int = 1):
    """``(load, tiles)`` of a walk of the stored band (``_walk_tiles``): "cols", ``load(j_blk)``
    reads one stored tile and its walked offsets ``c_ref`` (tiles as given: loaded apart);
    "rows", ``load(j_blk, skip)`` reads ``tiles`` (``wide_trips``) blocks side by side as one
    ``[b, tiles b]`` tile and their offsets, ``-inf`` on the first ``skip`` (Python 0: none)."""
    if source == "cols":
        return (lambda j_blk: (_stored_tile(band_ref, i_blk, j_blk, geom, source), _walked(c_ref, j_blk, geom))), tiles
    t = wide_trips(tiles, geom)

    def load(j_blk, skip):
        tile, c = _stored_tile(band_ref, i_blk, j_blk, geom, source, t), _walked(c_ref, j_blk, geom, t)
        if not (isinstance(skip, int) and skip == 0):
            c = jnp.where(jax.lax.broadcasted_iota(jnp.int32, c.shape, 0) < skip * geom.block, -jnp.inf, c)
        return tile, c

    return load, t


# The Triton kernels (``kernel_name``'s names) that walk ``STREAMING_TILES_A_TRIP`` tiles a
# trip: those whose sm_90 SASS issues a trip's band loads before its first exponential
# (``tests/test_gpu_budget.py`` checks each). ptxas interleaves the others' loads with their
# exponentials one load at a time however many tiles a trip holds (the column vector product,
# the exact row walk of ``stored_lse``), and the products with dots hold their registers.
STREAMING_KERNELS = frozenset({"stored_row_half", "stored_col_half", "stored_rows_vector_product",
                               "stored_cols_lse"})


def tiles_a_trip(kernel: str) -> int:
    """Band tiles a main-loop trip of the Triton kernel named ``kernel``."""
    return STREAMING_TILES_A_TRIP if kernel in STREAMING_KERNELS else 1


def _source_scores(source: str, ref0, ref1, i_blk, geom: BandGeometry, dots: str = "ieee"):
    """``(load, scores)``: ``load(j_blk)`` reads what the scores (unmasked) ``[b, b]`` of the
    program's line block ``i_blk`` against the walked block ``j_blk`` are made of, and
    ``scores(loaded)`` makes them (split so that a walk can issue several tiles' loads at
    once), from the source's two refs: "qk": q (this row block, scale applied) and all keys;
    "rows": this row block's stored band row and the score scale of its lines; "cols": the
    whole stored band and the scale of the program's lines (keys: each tile is read from the
    walked row block's band row and transposed)."""
    b = geom.block
    if source == "qk":
        q = ref0[...]  # [b, d]
        return lambda j_blk: ref1[pl.ds(j_blk * b, b), :], lambda k: tile_math.dot_nt(q, k, dots)
    load = lambda j_blk: _stored_tile(ref0, i_blk, j_blk, geom, source)
    tile = (lambda t: t) if source == "rows" else (lambda t: t.T)
    if ref1 is None:  # a band of plan entries (``stored_linear_product``): no scale
        return load, tile
    scale = ref1[...][:, None]  # [b, 1]
    return load, lambda t: scale * tile(t)


def _stored_tile(band_ref, i_blk, j_blk, geom: BandGeometry, source: str, tiles: int = 1):
    """``[b, b]`` stored tile of line block ``i_blk`` and walked block ``j_blk`` as it is
    stored: "rows", this program's band row (lines x walked; ``[b, tiles b]``: the walked
    blocks from ``j_blk`` on); "cols", the walked block's band row read at this column block
    (walked x lines: untransposed)."""
    b, wb = geom.block, geom.wb
    if source == "rows":
        return band_ref[:, pl.ds((j_blk - i_blk + wb) * b, tiles * b)]
    return band_ref[pl.ds(j_blk * b, b), pl.ds((i_blk - j_blk + wb) * b, b)]


def _walked(ref, j_blk, geom: BandGeometry, tiles: int = 1):
    """The walked blocks ``j_blk ..`` (``tiles`` of them)' lines of ``ref`` (whole over the
    problem's lines)."""
    return ref[pl.ds(j_blk * geom.block, tiles * geom.block)]


def _tile_logits(s, a, c, i_blk, j_blk, geom: BandGeometry, source: str, masked: bool = True):
    """Masked logits ``[b, b]`` of line block ``i_blk`` (scores ``s`` ``[b, b]`` from
    ``source``, row offsets ``a [b, 1]`` or None) against walked block ``j_blk`` (its offsets
    ``c [b]``). A stored band is -inf off the support already and its scale is positive
    (``stored_lse``): ``masked=False`` leaves the mask out (a fifth of a walk's instructions in
    sm_90 SASS)."""
    c, b = c[None, :], geom.block
    if not masked:
        return s + c if a is None else s + (a + c)  # as tile_math.mask_band: one rounding both ways
    return tile_math.mask_band(s, a, c, row0=i_blk * b, col0=j_blk * b, half_band=geom.half_band,
                               computed=source == "qk")


def _call(kernel, geom: BandGeometry, launch: GpuTiling, *, in_specs, out_spec, out_shape, interpret,
          name, grid=None):
    return pl.pallas_call(
        kernel,
        grid=grid or (jax.tree.leaves(out_shape)[0].shape[0], geom.n_blocks),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=out_shape,
        compiler_params=None if pltriton is None else pltriton.CompilerParams(num_warps=launch.num_warps,
                                                                              num_stages=launch.num_stages),
        interpret=interpret,
        name=name,
    )


def _source_operands(source: str, first, second, geom: BandGeometry):
    """(specs, operands) of a source's two refs: "qk": q and k ``[N, Lp, d]`` (features
    padded); "rows" / "cols": the stored band ``[N, Lp, n_diag b]`` and the score scale of each
    program line ``[N, Lp]`` (a vector, not a broadcast scalar: XLA sinks a broadcast constant
    into a loop body, where it costs a kernel launch per call on a GPU), or the band alone when
    ``second`` is None (a band of plan entries)."""
    lp, b = geom.length, geom.block
    if source == "qk":
        q, k = _pad_features(first), _pad_features(second)
        return [_rows(b, q.shape[-1]), _whole(lp, k.shape[-1])], [q, k]
    width = geom.n_diag * b
    band_spec = (pl.BlockSpec((None, b, width), lambda n, i: (n, i, 0)) if source == "rows"
                 else _whole(lp, width))
    if second is None:
        return [band_spec], [first]
    return [band_spec, _rows(b)], [first, second.astype(jnp.float32)]


def stored_geometry(geom: BandGeometry) -> BandGeometry:
    """The tiling a band is stored at for the "rows" / "cols" kernels: edge at most
    ``gpu_budget.MAX_EDGE`` (the stored band cannot be re-tiled per call)."""
    edge = min(geom.block, gpu_budget.MAX_EDGE)
    return geom if edge == geom.block else make_geometry(geom.length, geom.half_band, edge, pallas=True)


def stored_band_fits(geom: BandGeometry, d: int, dv: int, tail_steps: int) -> bool:
    """Whether this GPU's shared memory (``gpu_budget.device_budget``) holds the stored-band
    kernels' widest calls for features d (q, k) and dv (v): the scores (d), the output's
    product (y = v) and the gradient's modulated products (y = k or q; x and z of dv + 2R, the
    one-reference adjoint's, wider than the four-plan's dv). ``impl="auto"`` takes the XLA
    path where they do not fit (``config.resolve_impl``)."""
    stored = stored_geometry(geom)
    try:
        for shape in (KernelShape(d, stored=True), KernelShape(0, dv, stored=True),
                      KernelShape(0, d, dv + 2 * tail_steps, stored=True)):
            tiling(stored, shape)
    except ValueError:
        return False
    return True


# ---- the stored band ---------------------------------------------------------------------------


# Programs a row block of ``band_scores``: grid (N, nI, SCORE_GROUPS), each program writing
# ceil(n_diag / groups) of its row block's tiles, which are independent (no reduction): more
# programs in flight than the nI row blocks (512 at L 16384, W 1024 on 32-wide tiles, 4 warps
# each, for an H200's 132 SMs), where the kernel ran at 3.2x its static bound (2026-11-30,
# ``triton_static_cost.py``). 1, the measured kernel, until a GPU has timed others
# (``profile_transport.py --score-groups``). Read at trace time.
SCORE_GROUPS = 1


def _scores_kernel(q_ref, k_ref, a_ref, c_ref, out_ref, *, geom: BandGeometry, dots: str, groups: int):
    i_blk = pl.program_id(1)
    b = geom.block
    per = _tiles_a_group(geom, groups)
    first = pl.program_id(2) * per if groups > 1 else 0
    q, a = q_ref[...], a_ref[...][:, None]  # this row block's, loaded once

    def tile(t, carry):  # band tile kb of the row: key block j_blk
        # The last group's trip count is the others': past the band's last tile it writes that
        # tile again, the same bits (a static trip count, and no store off the band row).
        kb = t if groups == 1 else jnp.minimum(first + t, geom.n_diag - 1)
        j_blk = i_blk + kb - geom.wb
        keys = pl.ds(jnp.clip(j_blk, 0, geom.n_blocks - 1) * b, b)
        x = tile_math.band_logits(q, k_ref[keys, :], a, c_ref[keys][None, :], row0=i_blk * b, col0=j_blk * b,
                                  half_band=geom.half_band, dots=dots)
        # A key block off the problem (its operands are a clipped duplicate) holds no entry.
        out_ref[:, pl.ds(kb * b, b)] = jnp.where((j_blk >= 0) & (j_blk < geom.n_blocks), x, -jnp.inf)
        return carry

    jax.lax.fori_loop(0, per, tile, 0)


def _tiles_a_group(geom: BandGeometry, groups: int) -> int:
    return -(-geom.n_diag // groups)


@functools.partial(jax.jit, static_argnames=("geom", "interpret", "dots", "groups"))
def band_scores(q, k, row_off, col_off, *, geom: BandGeometry, interpret=False, dots="ieee", groups=None):
    """The stored band ``[N, Lp, n_diag b]`` of the "rows" / "cols" sources: entry
    ``(i, kb b + c)`` is ``<q_i, k_j> + a_i + c_j`` for key ``j = (I + kb - wb) b + c`` (I the
    row block of i) on the band, ``-inf`` elsewhere. q, k ``[N, Lp, d]``; row_off, col_off
    ``[N, Lp]`` (0 active, -inf inactive). ``groups`` (default ``SCORE_GROUPS``, at most
    n_diag) programs a row block, each walking ceil(n_diag / groups) of the row block's tiles
    (q loaded once), as few programs as that takes (9 tiles in 4 groups: 3 programs of 3):
    grid (N, nI) for one, (N, nI, groups) for more. ``geom`` is the stored tiling
    (``stored_geometry``)."""
    n, lp, d = q.shape
    if groups is None:  # the default: at most a tile a program on a narrow band
        groups = min(SCORE_GROUPS, geom.n_diag)
    if not 1 <= groups <= geom.n_diag:
        raise ValueError(f"groups must be 1 .. n_diag = {geom.n_diag}, got {groups}")
    groups = -(-geom.n_diag // _tiles_a_group(geom, groups))  # no group left without a tile of its own
    if not interpret:
        check_geometry(geom)
    geom, launch = tiling(geom, KernelShape(d, stored=True))
    q, k = _pad_features(q), _pad_features(k)
    dp, b = q.shape[-1], geom.block
    return _call(
        functools.partial(_scores_kernel, geom=geom, dots=_dot_mode(dots, interpret), groups=groups), geom, launch,
        in_specs=[_rows(b, dp), _whole(lp, dp), _rows(b), _whole(lp)],  # q [b, d'], k [Lp, d'], a [b], c [Lp]
        # the band row [b, n_diag b]: a group's programs share it, each storing its own tiles
        out_spec=pl.BlockSpec((None, b, geom.n_diag * b), lambda n, i, *_: (n, i, 0)),
        out_shape=jax.ShapeDtypeStruct((n, lp, geom.n_diag * b), jnp.float32),
        interpret=interpret, name="band_scores", grid=(n, geom.n_blocks, groups) if groups > 1 else None,
    )(q, k, row_off.astype(jnp.float32), col_off.astype(jnp.float32))


# ---- band log-sum-exp ------------------------------------------------------------------------


def _walk_lse(ref0, ref1, c_ref, geom: BandGeometry, source: str, dots: str = "ieee", i_blk=None, tiles: int = 1):
    """``[b]`` band log-sum-exp of this program's line block: its tiles walked with an online
    max and sum, the walked lines' offsets in ``c_ref``. A "cols" walk reduces each stored
    tile over its rows (the walked lines) where it stands: transposing it in registers costs a
    shared-memory round trip a tile. ``i_blk``: the program's line block (given by a caller
    that walks in a ``cond`` branch, where interpret mode has no ``program_id``); ``tiles``:
    tiles a trip (``tiles_a_trip``)."""
    i_blk = pl.program_id(1) if i_blk is None else i_blk
    b, wide = geom.block, source == "rows"
    if source == "cols":
        scale = ref1[...][None, :]  # [1, b]: the program's lines are the tile's columns
        load, tiles = _stored_load(ref0, c_ref, i_blk, geom, source, tiles)

        def step(j_blk, loaded, carry):
            tile, c = loaded  # tile [walked, program]
            return tile_math.lse_update(*carry, scale * tile + c[:, None], axis=0)

        axis = 0
    else:
        load_scores, scores = _source_scores(source, ref0, ref1, i_blk, geom, dots)
        if wide:  # the stored tile itself: scores() scales it
            load, tiles = _stored_load(ref0, c_ref, i_blk, geom, source, tiles)
        else:
            load = lambda j_blk: (load_scores(j_blk), _walked(c_ref, j_blk, geom))

        def step(j_blk, loaded, carry):
            raw, c = loaded
            return tile_math.lse_update(*carry, _tile_logits(scores(raw), None, c, i_blk, j_blk, geom, source,
                                                             masked=source == "qk"))

        axis = 1
    lo, hi = _key_range(i_blk, geom)
    m, l = _walk_tiles(lo, hi, load, step, tile_math.lse_init(b, axis), tiles, wide)
    lse = tile_math.lse_finalize(m, l)
    return lse[0, :] if axis == 0 else lse[:, 0]


def _shifted_walk_lse(band_ref, scale_ref, c_ref, shift, geom: BandGeometry, source: str, tiles: int):
    """``_walk_lse`` of a stored band in one pass against a fixed stabilizer ``shift`` ``[b]``
    of the program's lines, a guess of the result: ``Σ exp(x - shift)`` and
    ``max(x - shift)`` kept per tile entry, reduced across the tile once, after the walk. No
    running max, no rescaling and no per-tile reduction: an entry costs an FFMA, two FADDs, a
    max and an exponential (64 instructions a tile against 100 for ``_walk_lse``'s row walk and
    158 for its column walk, sm_90 SASS at L 16384 W 1024). A line whose largest ``x - shift`` left
    ``[-SAFE_LOG, SAFE_LOG]`` (the sum could overflow, or lose its digits) sends the program
    back over its band with ``_walk_lse``: the result never depends on the shift beyond
    rounding."""
    i_blk = pl.program_id(1)
    b = geom.block
    rows = source == "rows"
    axis = 1 if rows else 0  # the walked lines' axis of a stored tile ("cols" walks it untransposed)
    line = (lambda v: v[:, None]) if rows else (lambda v: v[None, :])  # program lines, broadcast
    walked = (lambda v: v[None, :]) if rows else (lambda v: v[:, None])
    scale, shift_line = line(scale_ref[...]), line(shift)

    def step(j_blk, loaded, carry):
        (total, top), (tile, c) = carry, loaded
        z = scale * tile + (walked(c) - shift_line)
        return total + tile_math.exp(z), jnp.maximum(top, z)

    lo, hi = _key_range(i_blk, geom)
    load, t = _stored_load(band_ref, c_ref, i_blk, geom, source, tiles)  # rows: wide, entries kept [b, t b]
    zeros = jnp.zeros((b, t * b if rows else b), jnp.float32)
    total, top = _walk_tiles(lo, hi, load, step, (zeros, zeros - jnp.inf), t, rows)
    top = jnp.max(top, axis=axis)
    lse = jnp.log(jnp.sum(total, axis=axis)) + shift
    # -inf: a line without entries. (A sum, not jnp.all: Triton lowers no reduce_and.)
    safe = jnp.sum(jnp.where((top == -jnp.inf) | (jnp.abs(top) <= SAFE_LOG), 0, 1)) == 0
    return jax.lax.cond(safe, lambda: lse,
                        lambda: _walk_lse(band_ref, scale_ref, c_ref, geom, source, i_blk=i_blk, tiles=tiles))


def _lse_kernel(ref0, ref1, c_ref, out_ref, *, geom: BandGeometry, source: str, dots: str):
    out_ref[...] = _walk_lse(ref0, ref1, c_ref, geom, source, dots, tiles=tiles_a_trip(kernel_name(source, "lse")))


def _walk_operands(source: str, first, second, off, geom: BandGeometry, shape: KernelShape, interpret):
    """What every band-LSE call starts from: the launch tiling, and the specs and operands of
    its walk (the source's two refs, then the walked lines' offsets ``off`` whole: it may be
    longer than Lp, an extended potential, of which [0, Lp) is read). Returns (geom, launch,
    specs, operands)."""
    if not interpret:
        check_geometry(geom)
    geom, launch = tiling(geom, shape)
    specs, operands = _source_operands(source, first, second, geom)
    return geom, launch, specs + [_whole(first.shape[1])], operands + [off.astype(jnp.float32)]


def kernel_name(source: str, what: str, *, linear=False, modulated=False, vector=False, keep_band=False) -> str:
    """The Pallas name of an LSE (``what`` "lse") or product ("product") kernel: its source
    ("band_": recomputed scores; "stored_rows_" / "stored_cols_": the stored band walked along
    rows or columns) and, for products, its kind. Distinct names for distinct kernels, so that a
    GPU profile (``profile_transport``, summed by name) times each kernel on its own."""
    kind = ["linear"] if linear else ["modulated"] if modulated else []
    words = ["band" if source == "qk" else f"stored_{source}", *kind, *(["vector"] if vector else []), what,
             *(["keep_band"] if keep_band else [])]
    return "_".join(words)


def _lse(source: str, first, second, col_off, geom: BandGeometry, shape: KernelShape, interpret,
         dots: str = "ieee"):
    n, lp = first.shape[:2]
    geom, launch, specs, operands = _walk_operands(source, first, second, col_off, geom, shape, interpret)
    return _call(
        functools.partial(_lse_kernel, geom=geom, source=source, dots=_dot_mode(dots, interpret)), geom, launch,
        in_specs=specs, out_spec=_rows(geom.block),  # [b]
        out_shape=jax.ShapeDtypeStruct((n, lp), jnp.float32),
        interpret=interpret, name=kernel_name(source, "lse"),
    )(*operands)


@functools.partial(jax.jit, static_argnames=("geom", "interpret", "dots"))
def band_lse(q, k, col_off, *, geom: BandGeometry, interpret=False, dots="ieee"):
    """``out_i = LSE_{j: |i-j| <= W} (<q_i, k_j> + c_j)``; -inf where no entry is finite.

    Same contract as ``pallas_tpu.band_lse``: q, k ``[N, Lp, d]`` (scale applied to q),
    col_off ``[N, Lp]`` (-inf = inactive key). Returns ``[N, Lp]`` f32.
    """
    return _lse("qk", q, k, col_off, geom, KernelShape(q.shape[-1]), interpret, dots)


@functools.partial(jax.jit, static_argnames=("geom", "transposed", "interpret"))
def stored_lse(band, scale, off, *, geom: BandGeometry, transposed=False, interpret=False):
    """``band_lse`` on a stored band (``band_scores``): ``out_i = LSE_j (scale_i S_ij + c_j)``,
    or with ``transposed`` the columns' ``out_j = LSE_i (scale_j S_ij + a_i)``; ``scale`` holds
    the program lines' score scale (positive and finite, as every stored-band kernel's: the
    band's -inf must stay -inf) and ``off`` the walked lines' offsets, both ``[N, Lp]``.
    The band's -inf entries mask inactive lines: the offsets need no -inf of their own. ``off``
    may be longer than Lp (an extended potential): its first Lp entries are read."""
    return _lse("cols" if transposed else "rows", band, scale, off, geom, KernelShape(0, stored=True),
                interpret)


# ---- fused Sinkhorn half steps on a stored band -----------------------------------------------
# One Sinkhorn step as two kernels, the potentials and the centering computed in them: the
# unfused step is an LSE kernel, an XLA kernel for the potentials and the centering sum, a
# second LSE kernel and one more XLA kernel for the centered potentials (four launches).


def _half_walk(band_ref, scale_ref, c_ref, refs: list, geom: BandGeometry, source: str, kappa: float,
               shifted: bool):
    """A half step's band LSE: exact, or ``shifted`` against the LSE the program lines'
    previous potential gives (``-previous / kappa``; ``previous``: the first of ``refs``,
    taken off them)."""
    tiles = tiles_a_trip("stored_row_half" if source == "rows" else "stored_col_half")
    if shifted:
        shift = refs.pop(0)[...] * (-1.0 / kappa)
        return _shifted_walk_lse(band_ref, scale_ref, c_ref, shift, geom, source, tiles)
    return _walk_lse(band_ref, scale_ref, c_ref, geom, source, tiles=tiles)


def _centering_share(w_ref, u_hat):
    """These rows' share of the step's centering constant ``c = Σ_i weight_i û_i``."""
    return jnp.sum(w_ref[...] * u_hat, keepdims=True)


def _sum_of(ref, chunk: int):
    """The sum of a whole per-block operand, ``chunk`` entries (a Triton load's length) at a time."""
    return jax.lax.fori_loop(0, ref.shape[0] // chunk, lambda k, s: s + jnp.sum(ref[pl.ds(k * chunk, chunk)]),
                             jnp.float32(0.0))


def _lse_of(ref, chunk: int):
    """The LSE of a whole per-block operand of partial LSEs (``_block_lse``), ``chunk`` at a time."""
    n = ref.shape[0] // chunk
    top = jax.lax.fori_loop(0, n, lambda k, m: jnp.maximum(m, jnp.max(ref[pl.ds(k * chunk, chunk)])),
                            jnp.float32(-jnp.inf))
    top = jnp.where(top == -jnp.inf, 0.0, top)
    total = jax.lax.fori_loop(0, n, lambda k, t: t + jnp.sum(tile_math.exp(ref[pl.ds(k * chunk, chunk)] - top)),
                              jnp.float32(0.0))
    return jnp.log(total) + top


def _centered(share_ref, chunk: int, lse, u_hat, w, kappa: float, inside=True, extra=0.0):
    """The step's centering, in the kernel that ends it: ``c = Σ shares + extra`` (the
    dustbin row's share), ``v = v̂ + c`` on columns with entries and ``u = û - c`` on rows
    with entries (``w > 0``), 0 elsewhere and outside the problem (``inside`` false). The
    program's line block is also a row block: the padded problem is square. Returns (u, v, c)."""
    c = _sum_of(share_ref, chunk) + extra
    v = jnp.where(inside & jnp.isfinite(lse), potential(0.0, lse, kappa) + c, 0.0)
    return jnp.where(inside & (w > 0), u_hat - c, 0.0), v, c


def _block_lse(x, axis: int = 0, keepdims: bool = True):
    """The LSE of ``x`` along ``axis`` (-inf where no entry is finite): by default ``[1]``, a
    program's partial over its lines ``x [b]`` that ``_lse_of`` folds with the others'."""
    top = jnp.max(x, axis=axis, keepdims=True)
    top = jnp.where(top == -jnp.inf, 0.0, top)
    lse = jnp.log(jnp.sum(tile_math.exp(x - top), axis=axis, keepdims=True)) + top
    return lse if keepdims else jnp.squeeze(lse, axis)


class _SpokeRefs(NamedTuple):
    """A fused half step's spoke-dustbin operands in a kernel (``SpokeLines``)."""

    scores: object  # [b] the program lines' dustbin scores
    partials: object  # [nB] the other side's dustbin line, as per-block partial LSEs
    other: object  # [1] the other side's dustbin potential
    corner: object  # [1]
    log_target: object  # [1] this side's dustbin target
    weight: object = None  # [1] the dustbin row's centering weight (column half, centered)


def _spoke_refs(refs: list, spoke: bool, weighted: bool) -> _SpokeRefs | None:
    """Takes the spoke operands off ``refs`` (after the walk's), if any."""
    if not spoke:
        return None
    n = 6 if weighted else 5
    taken, refs[:n] = refs[:n], []
    return _SpokeRefs(*taken)


def _dustbin_step(sp: _SpokeRefs, lse, chunk: int, kappa: float):
    """(the band LSE with each line's dustbin entry folded in, this side's dustbin potential
    ``[1]``): the dustbin line's LSE runs over the other side's lines (their partials) and the
    corner, each program computing the same value."""
    other = sp.other[...]
    line = tile_math.logaddexp(jnp.zeros_like(other) + _lse_of(sp.partials, chunk), sp.corner[...] + other)
    return tile_math.logaddexp(lse, sp.scores[...] + other), potential(sp.log_target[...], line, kappa)


def _row_half_kernel(band_ref, scale_ref, v_ref, *refs, geom: BandGeometry, kappa: float, centered: bool,
                     shifted: bool, spoke: bool, chunk: int):
    refs = list(refs)
    lse = _half_walk(band_ref, scale_ref, v_ref, refs, geom, "rows", kappa, shifted)
    sp = _spoke_refs(refs, spoke, False)
    if sp is not None:
        lse, u_hat_db = _dustbin_step(sp, lse, chunk, kappa)
    u_hat = potential(0.0, lse, kappa)
    w_ref = refs.pop(0) if centered else None
    u_hat_ref = refs.pop(0)
    u_hat_ref[...] = u_hat
    if centered:
        refs.pop(0)[...] = _centering_share(w_ref, u_hat)
    if sp is not None:  # the dustbin column's partial over these rows; the dustbin row's û
        partial_ref, db_ref = refs
        partial_ref[...] = _block_lse(sp.scores[...] + u_hat)
        db_ref[...] = u_hat_db


def _col_half_kernel(band_ref, scale_ref, u_hat_ref, *refs, geom: BandGeometry, kappa: float, centered: bool,
                     chunk: int, shifted: bool, spoke: bool):
    """The column walk, then (centered) the step's centering (``_centered``)."""
    refs = list(refs)
    lse = _half_walk(band_ref, scale_ref, u_hat_ref, refs, geom, "cols", kappa, shifted)
    sp = _spoke_refs(refs, spoke, centered)
    u_hat_db = v_hat_db = c = 0.0
    if sp is not None:
        u_hat_db = sp.other[...]
        lse, v_hat_db = _dustbin_step(sp, lse, chunk, kappa)
    if centered:
        share_ref, w_ref, u_ref, v_ref = refs[:4]
        b = geom.block
        extra = 0.0 if sp is None else jnp.sum(sp.weight[...] * u_hat_db)
        u, v, c = _centered(share_ref, chunk, lse, u_hat_ref[pl.ds(pl.program_id(1) * b, b)], w_ref[...], kappa,
                            extra=extra)
        u_ref[...] = u
        refs = refs[4:]
    else:
        v, (v_ref, refs) = potential(0.0, lse, kappa), (refs[0], refs[1:])
    v_ref[...] = v
    if sp is not None:  # the dustbin row's partial over these columns; both dustbin potentials
        partial_ref, u_db_ref, v_db_ref = refs
        partial_ref[...] = _block_lse(sp.scores[...] + v)
        u_db_ref[...] = u_hat_db - c
        v_db_ref[...] = v_hat_db + c


def _pow2_divisor(n: int, cap: int = 1024) -> int:
    """The largest power of two dividing ``n``, at most ``cap`` (a Triton load's length)."""
    return min(n & -n, cap)


def _with_previous(specs: list, operands: list, previous, b: int, kappa: float) -> tuple[list, list]:
    """A half step's walk operands followed by its lines' previous potential, if any (which
    implies an LSE only where it is not 0 by definition: kappa > 0)."""
    if previous is None:
        return specs, operands
    if not kappa > 0:
        raise ValueError(f"a previous potential guesses the LSE of a side with kappa > 0; got kappa={kappa} "
                         f"(a free side's potential is 0: pass previous=None)")
    return specs + [_rows(b)], operands + [previous.astype(jnp.float32)]


def _per_problem():
    """Spec of a ``[N, 1]`` operand or output: one number a problem, read by all its programs
    (an output: written by all, the same value)."""
    return pl.BlockSpec((None, 1), lambda n, i: (n, 0))


def _per_block():
    """Spec of a ``[N, nB]`` output: one number a program."""
    return pl.BlockSpec((None, 1), lambda n, i: (n, i))


class SpokeLines(NamedTuple):
    """What a fused half step takes of the spoke dustbin (``stored_row_half``,
    ``stored_col_half``): its lines' dustbin scores ``scores [N, Lp]`` (``S_i,dustbin`` for the
    row half, ``S_dustbin,j`` for the column half; -inf on inactive lines); the other side's
    dustbin line as per-block partial LSEs ``partials [N, nB]`` (the previous half step's
    output, or ``dustbin_partials`` before the first); the other dustbin's potential ``other
    [N]`` (v_dustbin, û_dustbin); the corner score ``corner [N]``; this side's dustbin log target
    ``log_target [N]``; and for a centered column half the dustbin row's centering weight
    ``weight [N]``."""

    scores: jax.Array
    partials: jax.Array
    other: jax.Array
    corner: jax.Array
    log_target: jax.Array
    weight: jax.Array | None = None


def _with_spoke_operands(specs: list, operands: list, spoke: SpokeLines | None, b: int, n_blocks: int):
    """A half step's operands followed by the spoke dustbin's, if any."""
    if spoke is None:
        return specs, operands
    per_problem = [x for x in spoke[2:] if x is not None]
    return (specs + [_rows(b), _whole(n_blocks)] + [_per_problem()] * len(per_problem),
            operands + [spoke.scores.astype(jnp.float32), spoke.partials.astype(jnp.float32)]
            + [x.astype(jnp.float32)[:, None] for x in per_problem])


def _spoke_outputs(n: int, n_blocks: int, count: int) -> tuple[list, list]:
    """(specs, shapes) of a half step's spoke outputs: the partials of this side's dustbin
    line ``[N, nB]``, then ``count`` dustbin potentials ``[N, 1]``."""
    return ([_per_block()] + [_per_problem()] * count,
            [jax.ShapeDtypeStruct((n, n_blocks), jnp.float32)] + [jax.ShapeDtypeStruct((n, 1), jnp.float32)] * count)


def dustbin_partials(x, *, geom: BandGeometry):
    """``[N, nB]`` partial LSEs of ``x [N, Lp]`` over the half steps' line blocks (-inf on
    all-inf blocks): a dustbin line's ``SpokeLines.partials`` before the first half step."""
    geom, _ = tiling(geom, KernelShape(0, stored=True))
    blocks = x.reshape(x.shape[0], geom.n_blocks, geom.block)
    top = jax.lax.stop_gradient(jnp.max(blocks, -1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    return jnp.log(jnp.sum(jnp.exp(blocks - top), -1)) + top[..., 0]


@functools.partial(jax.jit, static_argnames=("geom", "kappa", "centered", "interpret"))
def stored_row_half(band, scale, v, weight, previous=None, spoke: SpokeLines | None = None, *, geom: BandGeometry,
                    kappa: float, centered: bool, interpret=False):
    """The row half step of a Sinkhorn step with unit row targets on a stored band:
    ``û_i = kappa (0 - LSE_j (scale_i S_ij + v_j))`` (0 on rows without entries), and with
    ``centered`` each row block's share of the centering constant, ``Σ_i weight_i û_i``
    ``[N, nI]`` (``weight``: 1 / (the number of rows with entries) on those rows, else 0).
    ``v`` may be longer than Lp (its first Lp entries are read). ``previous`` ``[N, Lp]``, when
    given, is the rows' potential before this step: the walk takes one pass against the LSE
    it implies, ``-previous / kappa`` (``_shifted_walk_lse``; exact either way). With
    ``spoke`` (``SpokeLines``) each row's LSE also runs over its dustbin entry ``S_i,dustbin +
    v_dustbin``, and the dustbin row is solved too (from the dustbin column's partials and the
    corner). Returns û ``[N, Lp]``, then the shares (centered), then with ``spoke`` the
    dustbin column's partials over the row blocks ``[N, nB]`` (for the column half) and the
    dustbin row's û ``[N]``."""
    n, lp = band.shape[:2]
    geom, launch, specs, operands = _walk_operands("rows", band, scale, v, geom, KernelShape(0, stored=True),
                                                   interpret)
    b = geom.block
    specs, operands = _with_spoke_operands(*_with_previous(specs, operands, previous, b, kappa), spoke, b,
                                           geom.n_blocks)
    out_specs, out_shape = [_rows(b)], [jax.ShapeDtypeStruct((n, lp), jnp.float32)]
    if centered:
        specs, operands = specs + [_rows(b)], operands + [weight.astype(jnp.float32)]
        out_specs, out_shape = out_specs + [_per_block()], out_shape + [jax.ShapeDtypeStruct((n, geom.n_blocks),
                                                                                             jnp.float32)]
    if spoke is not None:
        more_specs, more_shapes = _spoke_outputs(n, geom.n_blocks, 1)
        out_specs, out_shape = out_specs + more_specs, out_shape + more_shapes
    out = _call(
        functools.partial(_row_half_kernel, geom=geom, kappa=kappa, centered=centered, shifted=previous is not None,
                          spoke=spoke is not None, chunk=_pow2_divisor(geom.n_blocks)),
        geom, launch,
        in_specs=specs, out_spec=out_specs, out_shape=out_shape, interpret=interpret,
        name="stored_row_half",
    )(*operands)
    if spoke is not None:
        out = (*out[:-1], out[-1][:, 0])
    return out[0] if len(out) == 1 else tuple(out)


@functools.partial(jax.jit, static_argnames=("geom", "kappa", "centered", "interpret"))
def stored_col_half(band, scale, u_hat, shares, weight, previous=None, spoke: SpokeLines | None = None, *,
                    geom: BandGeometry, kappa: float, centered: bool, interpret=False):
    """The column half step after ``stored_row_half``: ``v̂_j = kappa (0 - LSE_i (scale_j S_ij
    + û_i))`` (0 on columns without entries; ``scale`` on the columns). With ``centered``
    (``shares``, ``weight`` from the row half) the step's centering: ``c = Σ shares``, returns
    ``(u, v) = (û - c on rows with entries, v̂ + c on columns with entries)``, each ``[N, Lp]``
    (0 elsewhere); without, returns v̂ (û is then the row potential). ``previous``: the
    columns' potential before this step, as ``stored_row_half``'s. With ``spoke``
    (``SpokeLines``: ``other`` is the dustbin row's û, ``partials`` the row half's) each
    column's LSE also runs over its dustbin entry, the dustbin column is solved, ``c`` takes
    the dustbin row's share, and the return adds the dustbin row's partials over the column
    blocks ``[N, nB]`` (for the next row half) and the dustbin potentials ``(u, v)`` ``[N]``
    each (centered as the lines are; û and v̂ without centering)."""
    n, lp = band.shape[:2]
    geom, launch, specs, operands = _walk_operands("cols", band, scale, u_hat, geom, KernelShape(0, stored=True),
                                                   interpret)
    b = geom.block
    if spoke is not None and not centered:
        spoke = spoke._replace(weight=None)
    specs, operands = _with_spoke_operands(*_with_previous(specs, operands, previous, b, kappa), spoke, b,
                                           geom.n_blocks)
    line = jax.ShapeDtypeStruct((n, lp), jnp.float32)
    if centered:
        specs += [_whole(shares.shape[-1]), _rows(b)]
        operands += [shares.astype(jnp.float32), weight.astype(jnp.float32)]
        out_specs, out_shape = [_rows(b), _rows(b)], [line, line]
    else:
        out_specs, out_shape = [_rows(b)], [line]
    if spoke is not None:
        more_specs, more_shapes = _spoke_outputs(n, geom.n_blocks, 2)
        out_specs, out_shape = out_specs + more_specs, out_shape + more_shapes
    kernel = functools.partial(_col_half_kernel, geom=geom, kappa=kappa, centered=centered,
                               chunk=_pow2_divisor(geom.n_blocks), shifted=previous is not None,
                               spoke=spoke is not None)
    out = _call(kernel, geom, launch, in_specs=specs, out_spec=out_specs, out_shape=out_shape,
                interpret=interpret, name="stored_col_half")(*operands)
    if spoke is not None:
        out = (*out[:-2], out[-2][:, 0], out[-1][:, 0])
    return out[0] if len(out) == 1 else tuple(out)


# ---- one-pass Sinkhorn steps on a stored band --------------------------------------------------
# The fused step reads the band twice: the column LSE needs the whole û. Here a program holds G
# rows of the band in registers (``gpu_budget.one_pass_launch``), computes their û, then each
# band column's LSE over those G rows (a partial); a second kernel folds a key block's partials
# (online LSE) into v̂ and centers. HBM a step at L 16384, W 1024: the band once (136 MB) and
# the partials twice (17 MB each at G 8), against the band twice. The potentials the rows
# kernel reads are carried padded by ``wb b`` zeros on each side (``one_pass_pad``), so that a
# band row's keys are one contiguous slice.


def one_pass_pad(geom: BandGeometry) -> int:
    """Zeros on each side of a potential or scale that the one-pass kernels read by band row."""
    return geom.wb * geom.block


def _pow2_pieces(width: int) -> list[tuple[int, int]]:
    """``[(offset, size)]``: ``width`` as powers of two, largest first (Triton loads)."""
    out, at = [], 0
    for bit in reversed(range(width.bit_length())):
        if width >> bit & 1:
            out.append((at, 1 << bit))
            at += 1 << bit
    return out


def _one_pass_rows_kernel(band_ref, srow_ref, scol_ref, v_ref, w_ref, u_hat_ref, partial_ref, *refs,
                          geom: BandGeometry, group: int, kappa: float):
    b = geom.block
    start = (pl.program_id(1) * group // b) * b  # the row block's first band key, in the padded v
    pieces = _pow2_pieces(geom.n_diag * b)
    tiles = [band_ref[:, pl.ds(o, s)] for o, s in pieces]  # the band slice, read once
    srow = srow_ref[...][:, None]  # [G, 1]
    m, l = tile_math.lse_init(group)
    for (o, s), tile in zip(pieces, tiles):
        m, l = tile_math.lse_update(m, l, srow * tile + v_ref[pl.ds(start + o, s)][None, :])
    u_hat = potential(0.0, tile_math.lse_finalize(m, l)[:, 0], kappa)  # [G], unit targets
    for (o, s), tile in zip(pieces, tiles):  # each band column's LSE over these G rows
        y = scol_ref[pl.ds(start + o, s)][None, :] * tile + u_hat[:, None]
        partial_ref[pl.ds(o, s)] = _block_lse(y, axis=0, keepdims=False)
    u_hat_ref[...] = u_hat
    if refs:  # centered
        (share_ref,) = refs
        share_ref[...] = _centering_share(w_ref, u_hat)


def _one_pass_combine_kernel(partial_ref, u_hat_ref, w_ref, *refs, geom: BandGeometry, group: int, kappa: float,
                             centered: bool, chunk: int):
    b, wb = geom.block, geom.wb
    j_blk = pl.program_id(1) - wb  # the grid covers the padding's blocks too: they get zeros
    inside = (j_blk >= 0) & (j_blk < geom.n_blocks)
    j_blk = jnp.clip(j_blk, 0, geom.n_blocks - 1)
    per_block = b // group

    def fold(g, carry):  # row group g's partials of key block j_blk
        return tile_math.lse_update(*carry, partial_ref[g, pl.ds((j_blk - g // per_block + wb) * b, b)][:, None])

    lo, hi = _key_range(j_blk, geom)
    hi = jnp.where(inside, hi, lo)  # a padding block folds nothing
    lse = tile_math.lse_finalize(*jax.lax.fori_loop(lo * per_block, hi * per_block, fold,
                                                    tile_math.lse_init(b)))[:, 0]
    if centered:
        share_ref, u_ref, v_ref = refs
        u_ref[...], v_ref[...], _ = _centered(share_ref, chunk, lse, u_hat_ref[...], w_ref[...], kappa, inside)
    else:
        (v_ref,) = refs
        v_ref[...] = jnp.where(inside, potential(0.0, lse, kappa), 0.0)


@functools.partial(jax.jit, static_argnames=("geom", "kappa", "centered", "interpret"))
def stored_one_pass_rows(band, scale_rows, scale_cols, v, weight, *, geom: BandGeometry, kappa: float,
                         centered: bool, interpret=False):
    """The rows kernel of a one-pass step: ``û_i = kappa (0 - LSE_j (scale_i S_ij + v_j))``
    ``[N, Lp]``, each band column's partial ``LSE_{i in g} (scale_j S_ij + û_i)`` over the
    program's row group g ``[N, Lp / G, n_diag b]``, and with ``centered`` each group's share
    ``Σ_i weight_i û_i`` ``[N, Lp / G]``. ``scale_cols`` and ``v`` are padded (``one_pass_pad``)."""
    n, lp, width = band.shape
    if not interpret:
        check_geometry(geom)
    group, warps = gpu_budget.one_pass_launch(width, geom.block)
    out_specs = [_rows(group), pl.BlockSpec((None, None, width), lambda n, g: (n, g, 0))]
    out_shape = [jax.ShapeDtypeStruct((n, lp), jnp.float32), jax.ShapeDtypeStruct((n, lp // group, width), jnp.float32)]
    if centered:
        out_specs.append(_rows(1))
        out_shape.append(jax.ShapeDtypeStruct((n, lp // group), jnp.float32))
    return _call(
        functools.partial(_one_pass_rows_kernel, geom=geom, group=group, kappa=kappa), geom,
        GpuTiling(geom.block, warps, 1), grid=(n, lp // group),
        in_specs=[_rows(group, width), _rows(group), _whole(scale_cols.shape[1]), _whole(v.shape[1]), _rows(group)],
        out_spec=out_specs, out_shape=out_shape, interpret=interpret, name="stored_one_pass_rows",
    )(band, scale_rows.astype(jnp.float32), scale_cols.astype(jnp.float32), v.astype(jnp.float32),
      weight.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("geom", "kappa", "centered", "interpret"))
def stored_one_pass_combine(partials, u_hat, shares, weight, *, geom: BandGeometry, kappa: float, centered: bool,
                            interpret=False):
    """The second kernel of a one-pass step: ``v̂_j = kappa (0 - LSE)`` of the folded partials.
    Centered (``shares`` from the rows kernel): ``(u, v)`` centered; else ``v̂``. Outputs are
    padded (``one_pass_pad``) with zeros, as the next rows kernel reads them."""
    n, lp = u_hat.shape
    b, wb = geom.block, geom.wb
    group = lp // partials.shape[1]
    padded = jax.ShapeDtypeStruct((n, lp + 2 * wb * b), jnp.float32)
    line = lambda n, j: (n, jnp.clip(j - wb, 0, geom.n_blocks - 1))  # the padding's blocks read a neighbour
    specs = [_whole(*partials.shape[1:]), pl.BlockSpec((None, b), line), pl.BlockSpec((None, b), line)]
    operands = [partials, u_hat, weight.astype(jnp.float32)]
    if centered:
        specs.append(_whole(shares.shape[1]))
        operands.append(shares)
    n_shares = shares.shape[1] if centered else 1
    result = _call(
        functools.partial(_one_pass_combine_kernel, geom=geom, group=group, kappa=kappa, centered=centered,
                          chunk=_pow2_divisor(n_shares)), geom,
        GpuTiling(b, 4, 1), grid=(n, geom.n_blocks + 2 * wb), in_specs=specs,
        out_spec=[_rows(b), _rows(b)] if centered else _rows(b),
        out_shape=[padded, padded] if centered else padded, interpret=interpret, name="stored_one_pass_combine",
    )(*operands)
    return tuple(result) if centered else result


# ---- plan products ---------------------------------------------------------------------------


def _product_kernel(*refs, geom: BandGeometry, modulated: bool, source: str, dots: str, linear: bool = False,
                    tiles: int = 1):
    """Refs: the source's two (one with ``linear``: the band of plan entries itself), the line
    and walk offsets (not with ``linear``), y, x and z (``modulated``), the output and, when the
    call keeps it (``_product(keep_band=True)``), the modulated plan's band (rows only)."""
    refs = list(refs)
    take = lambda n: [refs.pop(0) for _ in range(n)]
    ref0, ref1 = (take(1)[0], None) if linear else take(2)
    a_ref, c_ref = (None, None) if linear else take(2)
    y_ref, (x_ref, z_ref) = take(1)[0], take(2) if modulated else (None, None)
    out_ref, *band_out = refs
    i_blk = pl.program_id(1)
    b = geom.block
    load_scores, scores = _source_scores(source, ref0, ref1, i_blk, geom, dots)
    a = None if linear else a_ref[...][:, None]  # [b, 1]
    pieces = _pow2_pieces(x_ref.shape[-1]) if modulated else []
    # Unmasked stored tiles, except where the plan tile goes straight into a dot (y a matrix, no
    # modulation): unmasked, Triton computes its exponentials in the dot operand's layout, each
    # four times over (sm_90 SASS: 545 instructions a tile against 378 masked).
    masked = source == "qk" or not (modulated or len(y_ref.shape) == 1)
    x = [x_ref[:, pl.ds(o, s)] for o, s in pieces]  # [b, mx'] in power-of-two pieces

    # A vector product streams the stored band: a row walk in wide trips (``tiles_a_trip``); a
    # column walk keeps each stored tile where it stands and sums over its rows (the walked
    # lines) once, after the walk (as ``_shifted_walk_lse``; transposed, a shared-memory round
    # trip and two barriers a tile: 108 instructions a tile against 64, sm_90 SASS).
    streaming = source != "qk" and not (linear or modulated) and len(y_ref.shape) == 1
    wide, standing = streaming and source == "rows", streaming and source == "cols"
    if standing:
        scale_row, a_row = ref1[...][None, :], a_ref[...][None, :]  # [1, b]: the program's lines
    if wide:  # the stored tile itself: scores() scales it
        load, tiles = _stored_load(ref0, c_ref, i_blk, geom, source, tiles)
    else:  # the walked tile's scores' operands and its offsets
        load = lambda j_blk: (load_scores(j_blk), None if linear else _walked(c_ref, j_blk, geom))

    def step(j_blk, loaded, acc):
        raw, c = loaded
        if standing:  # raw [walked, program], acc [b, b]
            p = tile_math.plan_tile(scale_row * raw + (a_row + c[:, None]))
            return acc + p * _walked(y_ref, j_blk, geom)[:, None]
        if linear:  # the band holds the plan's entries (0 off the support)
            p = scores(raw)
        else:
            p = tile_math.plan_tile(_tile_logits(scores(raw), a, c, i_blk, j_blk, geom, source, masked))  # [b, b]
        if modulated:
            keys = pl.ds(j_blk * b, b)
            p = tile_math.modulate(p, x, [z_ref[keys, pl.ds(o, s)] for o, s in pieces], dots)
        if band_out:  # this tile of the modulated plan, where the stored band holds its scores
            band_out[0][:, pl.ds((j_blk - i_blk + geom.wb) * b, b)] = p
        # y read where it is used: read with the tile, a modulated product's y stays live
        # across its dots (sm_90, tf32x3 at 4 warps: a spill)
        y = _walked(y_ref, j_blk, geom, tiles if wide else 1)  # [b, m'], or a vector [b] (wide: [tiles b])
        return tile_math.accumulate(acc, p, y, dots)

    lo, hi = _key_range(i_blk, geom)
    if standing:  # summed over the walked lines once, after the walk (a reduction across warps)
        acc = _walk_tiles(lo, hi, load, step, jnp.zeros((b, b), jnp.float32), tiles)
        out_ref[...] = jnp.sum(acc, axis=0)
        return
    out_ref[...] = _walk_tiles(lo, hi, load, step, jnp.zeros(out_ref.shape, jnp.float32), tiles, wide)


def _product(source: str, first, second, row_off, col_off, y, x, z, geom: BandGeometry,
             shape: KernelShape, interpret, dots: str, keep_band: bool = False):
    """The product kernels' call; ``row_off`` None: a linear product (``first`` is a band of
    plan entries, ``second`` unused); ``keep_band``: also the modulated plan's band."""
    n, lp = y.shape[:2]
    m = y.shape[-1]
    modulated, linear = x is not None, row_off is None
    if not interpret:
        check_geometry(geom)
    geom, launch = tiling(geom, shape)
    specs, operands = _source_operands(source, first, second, geom)
    vector = m == 1 and not PADDED_DOTS  # a multiply and a row sum, not a 16-wide padded dot
    y = y[..., 0] if vector else _pad_features(y)
    mp, b = (None if vector else y.shape[-1]), geom.block
    if not linear:  # a [b], c [Lp]
        specs += [_rows(b), _whole(lp)]
        operands += [row_off.astype(jnp.float32), col_off.astype(jnp.float32)]
    specs.append(_whole(lp, mp))  # y [Lp, m'] or [Lp]
    operands.append(y)
    if modulated:
        x, z = _pad_features(x, pieces=not PADDED_DOTS), _pad_features(z, pieces=not PADDED_DOTS)
        specs += [_rows(b, x.shape[-1]), _whole(lp, z.shape[-1])]  # x [b, mx'], z [Lp, mx']
        operands += [x, z]
    out_spec = _rows(b, mp)  # [b, m'] or [b]
    out_shape = jax.ShapeDtypeStruct((n, lp) if vector else (n, lp, mp), jnp.float32)
    if keep_band:  # this row block's band row [b, n_diag b]
        width = geom.n_diag * b
        out_spec = [out_spec, pl.BlockSpec((None, b, width), lambda n, i: (n, i, 0))]
        out_shape = [out_shape, jax.ShapeDtypeStruct((n, lp, width), jnp.float32)]
    name = kernel_name(source, "product", linear=linear, modulated=modulated, vector=vector, keep_band=keep_band)
    out = _call(
        functools.partial(_product_kernel, geom=geom, modulated=modulated, source=source,
                          dots=_dot_mode(dots, interpret), linear=linear,
                          tiles=tiles_a_trip(name)), geom, launch,
        in_specs=specs, out_spec=out_spec, out_shape=out_shape, interpret=interpret, name=name,
    )(*operands)
    trim = (lambda o: o[..., None]) if vector else (lambda o: o[..., :m])
    return (trim(out[0]), out[1]) if keep_band else trim(out)


def _mx(x):
    return 0 if x is None else x.shape[-1]


@functools.partial(jax.jit, static_argnames=("geom", "interpret", "dots"))
def band_product(q, k, row_off, col_off, y, x=None, z=None, *, geom: BandGeometry, interpret=False,
                 dots="ieee"):
    """``out_i = Σ_j P_ij <x_i, z_j> y_j`` with ``P_ij = exp(<q_i, k_j> + a_i + c_j)`` on the band.

    Same contract as ``pallas_tpu.band_product``: row_off, col_off ``[N, Lp]``, y ``[N, Lp, m]``
    on keys, x ``[N, Lp, mx]`` on rows and z ``[N, Lp, mx]`` on keys (both or neither).
    Returns ``[N, Lp, m]`` f32.
    """
    shape = KernelShape(q.shape[-1], y.shape[-1], _mx(x))
    return _product("qk", q, k, row_off, col_off, y, x, z, geom, shape, interpret, dots)


@functools.partial(jax.jit, static_argnames=("geom", "transposed", "interpret", "dots", "keep_band"))
def stored_product(band, scale, line_off, walk_off, y, x=None, z=None, *, geom: BandGeometry,
                   transposed=False, interpret=False, dots="ieee", keep_band=False):
    """``band_product`` on a stored band: ``P = exp(scale S + a ⊕ c)`` (scale ``[N, Lp]`` on
    the program's lines, as ``stored_lse``). Rows: ``out_i = Σ_j
    P_ij <x_i, z_j> y_j`` with ``line_off`` = a, ``walk_off`` = c. With ``transposed`` the
    columns: ``out_j = Σ_i P_ij <z_i, x_j> y_i`` with ``line_off`` = c (the program's lines are
    keys), ``walk_off`` = a, and x on keys, y and z on rows. ``keep_band`` (rows, modulated):
    also returns the band of ``D_ij = P_ij <x_i, z_j>`` at the stored layout (tiles off the
    problem's key blocks unwritten: no walk reads them), for ``stored_linear_product``."""
    if keep_band and (transposed or x is None):
        raise ValueError("keep_band stores the modulated plan of a row walk: give x and z, transposed=False")
    shape = KernelShape(0, y.shape[-1], _mx(x), stored=True)
    return _product("cols" if transposed else "rows", band, scale, line_off, walk_off, y, x, z, geom,
                    shape, interpret, dots, keep_band)


@functools.partial(jax.jit, static_argnames=("geom", "transposed", "interpret", "dots"))
def stored_linear_product(band, y, *, geom: BandGeometry, transposed=False, interpret=False, dots="ieee"):
    """``out_i = Σ_j D_ij y_j`` for a band ``D`` of plan entries stored as ``band_scores``
    stores scores (``stored_product(keep_band=True)``): no scale, offsets or exponential; with
    ``transposed`` ``out_j = Σ_i D_ij y_i``. y ``[N, Lp, m]``."""
    shape = KernelShape(0, y.shape[-1], 0, stored=True)
    return _product("cols" if transposed else "rows", band, None, None, None, y, None, None, geom, shape,
                    interpret, dots)
