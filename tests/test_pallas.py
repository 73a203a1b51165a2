"""The Pallas backend of the transport op.

- every primitive of ``PallasBandOps`` against ``XlaBandOps`` (both kernel wrappers, interpret
  mode on CPU; the compiled twins run only on their own hardware);
- the public op with ``impl="pallas"`` against the dense autodiff reference, forward and
  gradients;
- the O(L) memory contract, the tile choice, the dispatch;
- cross-lowering from this CPU host: the real Mosaic (TPU) and Triton (CUDA) lowerings;
- one run under ``pltpu.InterpretParams`` (NaN-filled scratch, out-of-bounds reads raise).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
import pytest
from jax.experimental.pallas import tpu as pltpu

from pfamalign.kernels import BlockSizes, DustbinTokens, TransportConfig, transport
from pfamalign.kernels import gpu_budget, pallas_gpu, pallas_ops, pallas_tpu
from pfamalign.kernels.band import BandGeometry, make_geometry
from pfamalign.kernels.band_ops import BandOps
from pfamalign.kernels.banded_xla import XlaBandOps
from pfamalign.kernels.config import impl_variant
from pfamalign.kernels.pallas_ops import PallasBandOps, StoredBandOps
from pfamalign.kernels.sinkhorn import Spec, make_ops

OUT_ATOL = 1e-5  # float32, absolute: the public op's outputs and gradients vs the reference
GRAD_ATOL = 1e-5
PRIM_TOL = dict(rtol=1e-5, atol=1e-5)  # primitives vs XLA (plan products can be O(100))

_HARDWARE = {"tpu": ("tpu",), "gpu": ("gpu", "cuda", "rocm")}


def _skip_unless_runnable(wrapper: str, interpret: bool):
    if not interpret and jax.default_backend() not in _HARDWARE[wrapper]:
        pytest.skip(f"compiled {wrapper} kernels need a {wrapper} backend, "
                    f"have {jax.default_backend()!r}")


# ---- primitives vs XlaBandOps -------------------------------------------------------------------

# Problems in units of the tile edge, so the interpret cases (block 8) and the compiled ones
# (block 128) cover the same tilings: L = 2.5 blocks -> 3 row blocks; W from the main diagonal
# only, through partial diagonal tiles, to a band wider than the problem.
HALF_BANDS = {"diag": 0.0, "half_tile": 0.5, "1.5_tiles": 1.5, "full": 5.0}
ROW_LENS = (1.0, 0.65, 0.25)  # ragged, as fractions of L
COL_LENS = (0.85, 1.0, 0.0)  # the last problem has no active key: its rows are all -inf / 0


def _random_problem(geom: BandGeometry, length: int, *, seed=0, d=5, m=3, mx=36):
    rng = np.random.default_rng(seed)
    n, lp = len(ROW_LENS), geom.length
    arr = lambda *shape, s=1.0: jnp.asarray(s * rng.normal(size=shape), jnp.float32)
    pos = np.arange(lp)[None]
    return dict(
        q=arr(n, lp, d), k=arr(n, lp, d),  # [N, Lp, d]
        row_active=jnp.asarray(pos < np.round(np.array(ROW_LENS) * length)[:, None]),  # [N, Lp]
        col_active=jnp.asarray(pos < np.round(np.array(COL_LENS) * length)[:, None]),
        bias=arr(n, lp), row_pot=arr(n, lp, s=0.5), col_pot=arr(n, lp, s=0.5),  # [N, Lp]
        # mx 36: the Triton wrapper reads the modulation as 32 + 16 features (48, not 64)
        y=arr(n, lp, m), x=arr(n, lp, mx), z=arr(n, lp, mx),  # [N, Lp, m], [N, Lp, mx]
    )


def _all_primitives(ops, p):
    """Every compute primitive once; ``rescale`` is exercised by composing it with ``scores``."""
    s = ops.rescale(ops.scores(p["q"], p["k"], p["row_active"], p["col_active"], 0.5), 1.4)
    plan = ops.plan(s, p["row_pot"], p["col_pot"])
    both_rows, both_cols = ops.modulated_products(plan, p["x"], p["z"], p["y"], p["y"])
    return dict(
        modulated_products_rows=both_rows,  # a stored band: the modulated plan formed once, kept
        modulated_products_cols=both_cols,
        row_lse=ops.row_lse(s, p["bias"]),
        col_lse=ops.col_lse(s, p["bias"]),
        plan_rows=ops.plan_rows(plan, p["y"]),
        plan_cols=ops.plan_cols(plan, p["y"]),
        plan_rows_vector=ops.plan_rows(plan, p["y"][..., :1]),  # m = 1: no dot in the Triton kernel
        plan_cols_vector=ops.plan_cols(plan, p["y"][..., :1]),
        plan_rows_modulated=ops.plan_rows(plan, p["y"], p["x"], p["z"]),
        plan_cols_modulated=ops.plan_cols(plan, p["y"], p["x"], p["z"]),
    )


# Plan products are checked against float64 within a forward-error bound of f32 arithmetic:
# |got - exact| <= PRODUCT_ULPS * u * Σ_j P_ij (1 + |arg_ij|) (|x|·|z|)_ij |y_j|, u = 2^-24,
# arg the exponent of P (its rounding error is relative to |arg|). XLA's own f32 products on
# CPU reach 2.7 units; TF32 operands (2^-11) would miss it by two orders of magnitude.
PRODUCT_ULPS = 16.0
F32_UNIT = 2.0 ** -24


def _float64_products(p, geom: BandGeometry):
    """{name: (exact, error scale)} of the four plan products, dense in float64."""
    f = {name: np.asarray(v, np.float64) for name, v in p.items()}
    lp = f["q"].shape[1]
    pos = np.arange(lp)
    support = ((np.abs(pos[:, None] - pos[None, :]) <= geom.half_band)[None]
               & np.asarray(p["row_active"])[:, :, None] & np.asarray(p["col_active"])[:, None, :])
    # The primitives' scores: rescale(scores(q, k, ..., 0.5), 1.4).
    arg = np.where(support, 0.7 * np.einsum("nid,njd->nij", f["q"], f["k"])
                   + f["row_pot"][:, :, None] + f["col_pot"][:, None, :], 0.0)
    plan = np.where(support, np.exp(arg), 0.0)
    cond = plan * (1.0 + np.abs(arg))
    mod = np.einsum("nix,njx->nij", f["x"], f["z"])
    mod_abs = np.einsum("nix,njx->nij", np.abs(f["x"]), np.abs(f["z"]))
    y, y_abs, t = f["y"], np.abs(f["y"]), lambda a: np.swapaxes(a, 1, 2)
    out = {"plan_rows": (plan @ y, cond @ y_abs), "plan_cols": (t(plan) @ y, t(cond) @ y_abs),
           "plan_rows_modulated": ((plan * mod) @ y, (cond * mod_abs) @ y_abs),
           "plan_cols_modulated": (t(plan * mod) @ y, t(cond * mod_abs) @ y_abs)}
    vector = lambda pair: (pair[0][..., :1], pair[1][..., :1])  # y's first column alone
    return {**out, "modulated_products_rows": out["plan_rows_modulated"],
            "modulated_products_cols": out["plan_cols_modulated"],
            "plan_rows_vector": vector(out["plan_rows"]), "plan_cols_vector": vector(out["plan_cols"])}


def _float64_lses(p, geom: BandGeometry):
    """{"row_lse", "col_lse"}: ``LSE_j (S_ij + bias_j)`` and ``LSE_i (S_ij + bias_i)`` over the
    support, dense in float64 (-inf on lines without support)."""
    f = {name: np.asarray(v, np.float64) for name, v in p.items()}
    pos = np.arange(f["q"].shape[1])
    support = ((np.abs(pos[:, None] - pos[None, :]) <= geom.half_band)[None]
               & np.asarray(p["row_active"])[:, :, None] & np.asarray(p["col_active"])[:, None, :])
    s = 0.7 * np.einsum("nid,njd->nij", f["q"], f["k"])  # rescale(scores(q, k, ..., 0.5), 1.4)
    with np.errstate(divide="ignore"):  # log(0) = -inf on lines without support
        lse = lambda x, axis: np.log(np.sum(np.where(support, np.exp(x), 0.0), axis))
        return {"row_lse": lse(s + f["bias"][:, None, :], 2), "col_lse": lse(s + f["bias"][:, :, None], 1)}


def _error_units(got, exact, scale):
    """Largest |got - exact| in units of ``u * scale`` (exact zeros must come out exactly 0)."""
    err = np.abs(np.asarray(got, np.float64) - exact)
    assert not np.any(err[scale == 0]), "entries with no support must be exactly 0"
    return float(np.max(err[scale > 0] / (F32_UNIT * scale[scale > 0]), initial=0.0))


@functools.lru_cache(maxsize=None)
def _primitive_outputs(wrapper: str, interpret, band: str, block: int, resident: bool = False, dots: str = "ieee"):
    """{name: (pallas, xla)} for one tiling: one jit (one compilation) for all six primitives,
    and under "float64" the exact plan products with their error scales."""
    length = int(2.5 * block)
    geom = make_geometry(length, int(HALF_BANDS[band] * block), block)
    p = _random_problem(geom, length)
    pallas = (StoredBandOps if resident else PallasBandOps)(geom, interpret, wrapper=wrapper, dots=dots)
    got, want = jax.jit(lambda p: (_all_primitives(pallas, p), _all_primitives(XlaBandOps(geom), p)))(p)
    out = {name: (np.asarray(got[name]), np.asarray(want[name])) for name in got}
    return {**out, "float64": {**_float64_products(p, geom), **_float64_lses(p, geom)}}


class _PrimitivesCase:
    """``PallasBandOps`` primitive by primitive against ``XlaBandOps`` on the same inputs (the
    log-sum-exps) and against float64 (the plan products, where summation order matters)."""

    WRAPPER = ""
    INTERPRET = True
    RESIDENT = False  # read a stored score band instead of recomputing tiles (GPU wrapper)
    DOTS = "ieee"  # the Triton dots' arithmetic (TransportConfig.triton_dots)

    @pytest.fixture(scope="class", params=list(HALF_BANDS))
    @classmethod
    def outputs(cls, request):
        _skip_unless_runnable(cls.WRAPPER, cls.INTERPRET)
        block = 8 if cls.INTERPRET else 128  # interpret mode checks no tile legality
        return _primitive_outputs(cls.WRAPPER, cls.INTERPRET, request.param, block, cls.RESIDENT, cls.DOTS)

    @pytest.mark.parametrize("name", ["row_lse", "col_lse"])
    def test_lse(self, outputs, name):
        """Both backends against the dense float64 LSE, and against each other."""
        got, want = outputs[name]
        exact = outputs["float64"][name]
        assert np.isneginf(exact[2]).all()  # no active key in problem 2: empty lines are -inf
        for value in (got, want):  # assert_allclose also requires the same -inf pattern
            np.testing.assert_allclose(np.asarray(value, np.float64), exact, **PRIM_TOL)
        np.testing.assert_allclose(got, want, **PRIM_TOL)

    @pytest.mark.parametrize("name", ["plan_rows", "plan_cols", "plan_rows_modulated", "plan_cols_modulated",
                                      "modulated_products_rows", "modulated_products_cols", "plan_rows_vector",
                                      "plan_cols_vector"])
    def test_plan_products(self, outputs, name):
        """Both backends within f32's forward-error bound of the float64 products."""
        exact, scale = outputs["float64"][name]
        for backend, value in zip(("pallas", "xla"), outputs[name]):
            units = _error_units(value, exact, scale)
            assert units <= PRODUCT_ULPS, f"{backend} {name}: error {units:.1f} u * scale"


class TestPrimitivesTPUInterpret(_PrimitivesCase):
    WRAPPER = "tpu"


class TestPrimitivesGPUInterpret(_PrimitivesCase):
    WRAPPER = "gpu"


@pytest.mark.tpu
class TestPrimitivesTPU(TestPrimitivesTPUInterpret):
    INTERPRET = False


@pytest.mark.gpu
class TestPrimitivesGPU(TestPrimitivesGPUInterpret):
    INTERPRET = False


class TestPrimitivesGPUResidentInterpret(_PrimitivesCase):
    """The stored band at the kernels' own tiling (8 here; 32 under a compiled 128 band): the
    column primitives walk it transposed."""

    WRAPPER = "gpu"
    RESIDENT = True


@pytest.mark.gpu
class TestPrimitivesGPUResident(TestPrimitivesGPUResidentInterpret):
    INTERPRET = False


class _TF32x3Case(_PrimitivesCase):
    """``dots="tf32x3"``: three TF32 tensor-core products a dot (interpret mode emulates their
    arithmetic), held to the same f32 bounds as the "ieee" dots; plain TF32 operands miss them
    (``test_product_bound_rejects_tf32_operands``)."""

    WRAPPER = "gpu"
    DOTS = "tf32x3"

    def test_is_not_the_ieee_arithmetic(self, outputs, request):
        """Some product differs from the "ieee" kernels' on the same problem: the tf32x3 path
        (emulated here) really ran."""
        band, block = request.node.callspec.params["outputs"], 8 if self.INTERPRET else 128
        ieee = _primitive_outputs(self.WRAPPER, self.INTERPRET, band, block, self.RESIDENT)
        names = ("plan_rows", "plan_cols", "plan_rows_modulated", "plan_cols_modulated")
        assert any(not np.array_equal(outputs[n][0], ieee[n][0]) for n in names)


@pytest.mark.slow  # recomputed tiles with tf32x3 dots: by default test_transport's recomputed-spoke op case
class TestPrimitivesGPUTF32x3Interpret(_TF32x3Case):
    pass


class TestPrimitivesGPUResidentTF32x3Interpret(_TF32x3Case):
    RESIDENT = True


@pytest.mark.gpu
class TestPrimitivesGPUResidentTF32x3(TestPrimitivesGPUResidentTF32x3Interpret):
    INTERPRET = False


def _cold_plan_reads(ops, lp=32, d=8, half_band=6, seed=0):
    """A plan at cold scores (|S| ~ 1000: each exponent carries a rounding of u |S|) read off
    the products with y = I: the row walk's, a column walk's, both modulated by <1, 1>, and
    both as vector products (one column of y at a time)."""
    rng = np.random.default_rng(seed)
    q, k = (jnp.asarray(rng.normal(size=(1, lp, d)), jnp.float32) for _ in range(2))
    active = jnp.arange(lp)[None] < lp - 5
    scale = 300.0
    s64 = scale * np.einsum("id,jd->ij", *(np.asarray(x[0], np.float64) for x in (q, k)))
    pos = np.arange(lp)
    support = (np.abs(pos[:, None] - pos[None]) <= half_band) & np.asarray(active[0])[:, None] & np.asarray(active[0])
    top = np.where(support, s64, -np.inf).max(1)
    row_pot = jnp.asarray(np.where(np.isfinite(top), -top, 0.0)[None], jnp.float32)  # row maxima near 1
    plan = ops.plan(ops.scores(q, k, active, active, scale), row_pot, jnp.zeros((1, lp), jnp.float32))
    eye, ones = jnp.eye(lp)[None], jnp.ones((1, lp, 1))
    # a vector product (m = 1: a multiply and a row sum in the Triton kernels, no dot) with a
    # one-hot y reads one column of the plan exactly
    vector = lambda product: jnp.stack([product(plan, eye[..., j:j + 1])[..., 0] for j in range(lp)], -1)
    reads = {"rows": ops.plan_rows(plan, eye), "cols": jnp.swapaxes(ops.plan_cols(plan, eye), 1, 2),
             "rows_modulated": ops.plan_rows(plan, eye, ones, ones),
             "cols_modulated": jnp.swapaxes(ops.plan_cols(plan, eye, ones, ones), 1, 2),
             "rows_vector": vector(ops.plan_rows), "cols_vector": jnp.swapaxes(vector(ops.plan_cols), 1, 2)}
    return {name: np.asarray(x[0], np.float64) for name, x in reads.items()}, np.abs(s64[support]).max()


@pytest.mark.parametrize("kind", ["pallas-gpu", "pallas-tpu", "resident-gpu",
                                  *(pytest.param(k, marks=pytest.mark.gpu)
                                    for k in ("pallas-gpu-compiled", "resident-gpu-compiled"))])
def test_every_product_rounds_one_plan(kind):
    """At cold scores every product sees the row walk's plan, from a column walk, modulated and
    as a vector product too, within a few ulps (the exponential's own rounding: XLA's CPU code
    rounded one entry an ulp apart in two kernels of the stored band at W 0): the adjoint's
    cancellations rest on one plan (docs/design.md §3.5). A walk that rounds the exponent its own way is u |S| ~ 1000 ulps
    off: adding a stored tile's offsets after its mask (as the recomputing kernels now do) made
    the masked and unmasked stored walks so here, about 1e-4 relative (2026-11-30)."""
    name, wrapper, *compiled = kind.split("-")
    interpret = not compiled
    if compiled:
        pytest.importorskip("jax.experimental.pallas.triton")
        _skip_unless_runnable(wrapper, interpret)
    cls = StoredBandOps if name == "resident" else PallasBandOps
    ops = cls(make_geometry(32, 6, 8 if interpret else 16, pallas=True), interpret, wrapper=wrapper)
    reads, largest = _cold_plan_reads(ops)
    assert largest > 500  # cold: an exponent rounding of u |S| is hundreds of ulps
    rows = reads.pop("rows")
    assert rows.max() > 0.5  # the row maxima near 1, as the potentials were set
    for what, read in reads.items():
        rel = np.abs(read - rows)[rows > 0] / rows[rows > 0]
        assert np.array_equal(read == 0, rows == 0) and rel.max() <= 16 * F32_UNIT, (what, rel.max())  # 8 ulps


def _support(p, geom: BandGeometry):
    """``[N, Lp, Lp]`` bool: the band among active rows and columns."""
    pos = np.arange(geom.length)
    return ((np.abs(pos[:, None] - pos[None, :]) <= geom.half_band)[None]
            & np.asarray(p["row_active"])[:, :, None] & np.asarray(p["col_active"])[:, None, :])


def _float64_half_steps(p, geom: BandGeometry, scale: float, kappa: float, centered: bool):
    """One Sinkhorn step with unit targets from column potential ``bias``, dense in float64:
    (û, u, v) as ``sinkhorn._full_step`` defines them."""
    f = {name: np.asarray(v, np.float64) for name, v in p.items()}
    support = _support(p, geom)
    s = np.where(support, scale * np.einsum("nid,njd->nij", f["q"], f["k"]), -np.inf)

    def lse(x, axis):
        m = np.max(x, axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        with np.errstate(divide="ignore"):
            return np.squeeze(np.log(np.sum(np.exp(x - m), axis, keepdims=True)) + m, axis)

    rows, cols = support.any(2), support.any(1)
    u_hat = np.where(rows, -kappa * lse(s + f["bias"][:, None, :], 2), 0.0)
    v = np.where(cols, -kappa * lse(s + u_hat[:, :, None], 1), 0.0)
    if not centered:
        return u_hat, u_hat, v
    c = np.sum(u_hat, 1, keepdims=True) / np.maximum(rows.sum(1, keepdims=True), 1)
    return u_hat, np.where(rows, u_hat - c, 0.0), np.where(cols, v + c, 0.0)


def _stored_step_problem(band: str, block: int):
    """A ragged stored-band problem for one Sinkhorn step, and its centering weights (1 / the
    rows with entries, on those rows): (geom, problem, ops, scores, weight)."""
    length = int(2.5 * block)
    geom = make_geometry(length, int(HALF_BANDS[band] * block), block)
    p = _random_problem(geom, length)
    ops = StoredBandOps(geom, True)
    s = ops.rescale(ops.scores(p["q"], p["k"], p["row_active"], p["col_active"], 0.5), 1.4)
    band_rows = _support(p, geom).any(2)
    n_rows = np.maximum(band_rows.sum(1, keepdims=True), 1)
    return geom, p, ops, s, jnp.asarray(np.where(band_rows, 1.0 / n_rows, 0.0), jnp.float32)


@pytest.mark.parametrize("band", ["half_tile", "1.5_tiles", "full"])
@pytest.mark.parametrize("kappa, centered", [(1.0, True), (0.6, False)], ids=["balanced", "damped"])
def test_fused_half_steps_match_dense_float64(band, kappa, centered):
    """``StoredBandOps.row_half_step`` / ``col_half_step`` (``fused_steps``: the potentials and
    the centering inside the kernels; interpret mode) against one dense float64 Sinkhorn step,
    ragged masks and a problem without active keys included."""
    geom, p, ops, s, weight = _stored_step_problem(band, 8)
    row = ops.row_half_step(s, p["bias"], weight, kappa, centered)
    if centered:
        u_hat, shares = row
        u, v = ops.col_half_step(s, u_hat, shares, weight, kappa, True)
        assert shares.shape == (u_hat.shape[0], geom.n_blocks)
    else:
        u_hat = u = row
        v = ops.col_half_step(s, u_hat, None, weight, kappa, False)
    want = _float64_half_steps(p, geom, 0.7, kappa, centered)
    for name, got, exact in zip(("u_hat", "u", "v"), (u_hat, u, v), want):
        np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=1e-5, atol=1e-5, err_msg=name)
    assert not np.any(np.asarray(u)[2]) and not np.any(np.asarray(v)[2])  # no active key: all 0

@pytest.mark.parametrize("band", ["half_tile", "1.5_tiles"])
@pytest.mark.parametrize("kappa, centered", [(1.0, True), (0.6, False)], ids=["balanced", "damped"])
def test_fused_half_steps_solve_the_spoke_dustbin(band, kappa, centered):
    """The half steps with the spoke dustbin (``pallas_gpu.SpokeLines``) against a dense float64
    step on the extended problem: each real line's LSE runs over its band and its dustbin
    entry, the dustbin row and column are solved from the other side's lines (handed over as
    per-block partial LSEs) and the corner, and centered, the dustbin row's share enters the
    constant and both dustbin potentials are centered. Scores are -inf on inactive lines;
    problem 3 has no active key, so its rows have only their dustbin entry."""
    geom, p, ops, s, weight = _stored_step_problem(band, 8)
    rng = np.random.default_rng(3)
    row_active, col_active = np.asarray(p["row_active"]), np.asarray(p["col_active"])
    s_col = np.where(row_active, rng.normal(size=row_active.shape), -np.inf)  # S_i,dustbin
    s_row = np.where(col_active, rng.normal(size=col_active.shape), -np.inf)  # S_dustbin,j
    corner, v_db, log_a, log_b = (np.array(x) for x in ([0.4, -0.3, 0.1], [0.5, -1.0, 0.2],
                                                          [0.0, 1.5, 0.7], [0.0, 2.0, -0.5]))
    n_rows = row_active.sum(1) + 1  # the dustbin row is a row
    w_db = 1.0 / n_rows
    weight = jnp.asarray(np.where(row_active, 1.0 / n_rows[:, None], 0.0), jnp.float32)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    bias = np.asarray(p["bias"], np.float64)
    lines = ops.dustbin_partials(f32(s_row + bias))
    row = ops.row_half_step(s, f32(bias), weight, kappa, centered, None,
                            pallas_gpu.SpokeLines(f32(s_col), lines, f32(v_db), f32(corner), f32(log_a)))
    u_hat, shares = row[0], row[1] if centered else None
    col = ops.col_half_step(s, u_hat, shares, weight, kappa, centered, None,
                            pallas_gpu.SpokeLines(f32(s_row), row[-2], row[-1], f32(corner), f32(log_b), f32(w_db)))
    (u, v), (u_db, v_db_out) = (col[:2] if centered else (u_hat, col[0])), col[-2:]

    w64 = {name: np.asarray(x, np.float64) for name, x in p.items()}
    band64 = np.where(_support(p, geom), 0.7 * np.einsum("nid,njd->nij", w64["q"], w64["k"]), -np.inf)
    pot = lambda log_t, x: np.where(np.isfinite(x), kappa * (log_t - x), 0.0)
    lse = scipy.special.logsumexp
    with np.errstate(divide="ignore", invalid="ignore"):
        want_u_hat = pot(0.0, np.logaddexp(lse(band64 + bias[:, None, :], 2), s_col + v_db[:, None]))
        want_u_hat_db = pot(log_a, np.logaddexp(lse(s_row + bias, 1), corner + v_db))
        lse_v = np.logaddexp(lse(band64 + want_u_hat[:, :, None], 1), s_row + want_u_hat_db[:, None])
        want_v_hat_db = pot(log_b, np.logaddexp(lse(s_col + want_u_hat, 1), corner + want_u_hat_db))
    want = dict(u_hat=want_u_hat, u_hat_db=want_u_hat_db, u=want_u_hat, v=pot(0.0, lse_v),
                u_db=want_u_hat_db, v_db=want_v_hat_db)
    if centered:
        c = np.sum(np.asarray(weight, np.float64) * want_u_hat, 1) + w_db * want_u_hat_db
        want.update(u=np.where(np.asarray(weight) > 0, want_u_hat - c[:, None], 0.0),
                    v=np.where(np.isfinite(lse_v), want["v"] + c[:, None], 0.0),
                    u_db=want_u_hat_db - c, v_db=want_v_hat_db + c)
    got = dict(u_hat=u_hat, u_hat_db=row[-1], u=u, v=v, u_db=u_db, v_db=v_db_out)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name], np.float64), want[name], rtol=1e-5, atol=1e-5,
                                   err_msg=name)
    assert np.all(np.asarray(u_hat)[2][row_active[2]] != 0)  # problem 3: rows with their entry only


@pytest.mark.parametrize("guess", ["close", "one_line_far", "far"])
@pytest.mark.parametrize("band", ["half_tile", "full"])
@pytest.mark.parametrize("kappa, centered", [(1.0, True), (0.6, False)], ids=["balanced", "damped"])
def test_shifted_half_steps_take_one_pass_or_fall_back(band, kappa, centered, guess, monkeypatch):
    """The half steps given the previous potentials (``previous``: one pass against the LSE
    they imply, ``pallas_gpu._shifted_walk_lse``) against the dense float64 step. "close":
    the answer's own potentials, perturbed; "far": 500 off on every line, "one_line_far" on
    one row and one column, beyond ``SAFE_LOG``, so that those programs fall back to the exact
    walk. With the fallback switched off (``SAFE_LOG`` infinite), "close" still holds (the one
    pass alone is exact) and the far lines break (the fallback is what the test exercises)."""
    geom, p, ops, s, weight = _stored_step_problem(band, 8)
    want = _float64_half_steps(p, geom, 0.7, kappa, centered)
    rng = np.random.default_rng(7)
    prev = [(x + 0.3 * rng.standard_normal(x.shape)).astype(np.float32) for x in want[1:]]  # u, v
    if guess == "far":
        prev = [x + 500.0 for x in prev]
    elif guess == "one_line_far":  # row 3 and column 5 of the first problem
        prev[0][0, 3] += 500.0
        prev[1][0, 5] -= 500.0
    prev_u, prev_v = (jnp.asarray(x) for x in prev)

    def step(row):  # (û, u, v) after the row half's ``row``
        u_hat, shares = row if centered else (row, None)
        cols = ops.col_half_step(s, u_hat, shares, weight, kappa, centered, prev_v)
        return (u_hat, *cols) if centered else (u_hat, u_hat, cols)

    close = lambda x, w: np.allclose(np.asarray(x, np.float64), w, rtol=1e-5, atol=1e-5)
    row = ops.row_half_step(s, p["bias"], weight, kappa, centered, prev_u)
    got = step(row)
    for name, x, w in zip(("u_hat", "u", "v"), got, want):
        np.testing.assert_allclose(np.asarray(x, np.float64), w, rtol=1e-5, atol=1e-5, err_msg=name)
    # SAFE_LOG is read at trace time: the kernels run unjitted (traced afresh, no cache).
    monkeypatch.setattr(pallas_gpu, "SAFE_LOG", float("inf"))
    kernel = lambda name: functools.partial(getattr(pallas_gpu, name).__wrapped__, geom=ops.kernel_geom,
                                            interpret=True, kappa=kappa, centered=centered)
    u_hat = kernel("stored_row_half")(s.band, s.scale_rows, p["bias"], weight, prev_u)
    u_hat = u_hat[0] if centered else u_hat
    args = (row if centered else (row, None)) + (weight, prev_v)  # the column walk after the right row half
    v = kernel("stored_col_half")(s.band, s.scale_cols, *args)
    one_pass = u_hat, v[1] if centered else v
    # û is the row walk's alone; v̂ (or v, centered by û's constant) the column walk's.
    if guess == "close":
        assert close(one_pass[0], want[0]) and close(one_pass[1], want[2])
    elif guess == "far":
        assert not close(one_pass[0], want[0]) and not close(one_pass[1], want[2])
    else:  # row 3's and column 5's walks break; problem 1's are untouched
        assert not close(one_pass[0][0, 3], want[0][0, 3]) and not close(one_pass[1][0, 5], want[2][0, 5])
        assert close(one_pass[0][1], want[0][1]) and close(one_pass[1][1], want[2][1])



@pytest.mark.parametrize("block", [8, 16], ids=["one_group_a_block", "two_groups_a_block"])
@pytest.mark.parametrize("band", ["half_tile", "1.5_tiles", "full"])
@pytest.mark.parametrize("kappa, centered", [(1.0, True), (0.6, False)], ids=["balanced", "damped"])
def test_one_pass_steps_match_dense_float64(band, kappa, centered, block):
    """``StoredBandOps.one_pass_step`` (``one_pass_steps``: the band read once, the column LSE
    folded from 8-row partials; interpret mode) against one dense float64 Sinkhorn step, ragged
    masks and a problem without active keys included; its padded outputs' padding is 0."""
    geom, p, ops, s, weight = _stored_step_problem(band, block)
    pad = ops.one_pass_pad()
    bias = jnp.pad(p["bias"][:, :geom.length], ((0, 0), (pad, pad)))
    u_hat, u, v = ops.one_pass_step(s, bias, weight, kappa, kappa, centered)
    assert u.shape == v.shape == (u_hat.shape[0], geom.length + 2 * pad)
    for x in (u, v):
        assert not np.any(np.asarray(x)[:, :pad]) and not np.any(np.asarray(x)[:, pad + geom.length:])
    want = _float64_half_steps(p, geom, 0.7, kappa, centered)
    got = (u_hat, u[:, pad:pad + geom.length], v[:, pad:pad + geom.length])
    for name, x, exact in zip(("u_hat", "u", "v"), got, want):
        np.testing.assert_allclose(np.asarray(x, np.float64), exact, rtol=1e-5, atol=1e-5, err_msg=name)
    assert not np.any(np.asarray(got[1])[2]) and not np.any(np.asarray(got[2])[2])  # no active key: all 0


def test_product_bound_rejects_tf32_operands():
    """The plan-product bound is tight enough to catch a TF32 dot: the same products computed
    from operands rounded to TF32's 10-bit mantissa fail it."""
    geom = make_geometry(20, 4, 8)
    p = _random_problem(geom, 20)
    exact, scale = _float64_products(p, geom)["plan_rows"]
    tf32 = lambda a: (np.asarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    rounded = _float64_products({**p, "y": tf32(p["y"])}, geom)["plan_rows"][0]
    assert _error_units(rounded, exact, scale) > 10 * PRODUCT_ULPS


# ---- the public op vs the dense reference -----------------------------------------------------

# (Lq, Lk, q_len, k_len) per dustbin mode: rectangular both ways, ragged within the batch.
OP_SHAPES = {"none": (21, 17, (21, 15), (17, 11)), "spoke": (13, 19, (13, 8), (19, 16)),
             "widened": (13, 19, (13, 8), (19, 16)), "capacity": (13, 19, (13, 8), (19, 16))}
FAST_MODES = ("none", "spoke")


def _op_inputs(lq, lk, *, b=2, h=2, d=4, dv=3, seed=0):
    """q, k, v, dustbin tokens and an output cotangent (numpy RNG: no per-shape compilations)."""
    rng = np.random.default_rng(seed)
    arr = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    tokens = DustbinTokens(arr(h, d), arr(h, d), arr(h, dv))
    return arr(b, h, lq, d), arr(b, h, lk, d), arr(b, h, lk, dv), tokens, arr(b, h, lq, dv)


@functools.lru_cache(maxsize=None)
def _op_results(cfg: TransportConfig, wrapper: str | None):
    """(output, (dq, dk, dv, d_tokens)) of the public op under ``cfg``: one jit per config."""
    lq, lk, q_len, k_len = OP_SHAPES[cfg.dustbin]
    q, k, v, tokens, g = _op_inputs(lq, lk)

    def run(q, k, v, tokens, g):
        f = lambda q, k, v, tokens: transport(q, k, v, jnp.asarray(q_len), jnp.asarray(k_len), tokens,
                                              config=cfg)
        out, vjp = jax.vjp(f, q, k, v, tokens)
        return out, vjp(g)

    old = pallas_ops.CPU_WRAPPER
    pallas_ops.CPU_WRAPPER = wrapper or old  # which wrapper interprets on this CPU host
    try:
        return jax.tree.map(np.asarray, jax.jit(run)(q, k, v, tokens, g))
    finally:
        pallas_ops.CPU_WRAPPER = old


class _TransportCase:
    """``transport(..., impl="pallas")`` vs ``impl="reference"`` autodiff: B=2, H=2, R=2."""

    WRAPPER = ""
    RESIDENT = False

    @pytest.fixture(scope="class", params=FAST_MODES)
    @classmethod
    def results(cls, request):
        if jax.default_backend() != "cpu":
            pytest.skip("the wrapper is forced only for CPU interpret mode")
        cfg = TransportConfig(half_band=3, eps=0.7, base_steps=5, tail_steps=2, dustbin=request.param,
                              impl="pallas", blocks=BlockSizes(8),  # 3 row blocks, 3 diagonals
                              resident_scores=cls.RESIDENT)
        ref = _op_results(cfg.dense_reference(), None)
        return _op_results(cfg, cls.WRAPPER), ref

    def test_forward_matches_reference(self, results):
        (out, _), (ref, _) = results
        np.testing.assert_allclose(out, ref, atol=OUT_ATOL, rtol=0)

    @pytest.mark.parametrize("arg", ["q", "k", "v", "dustbin_q", "dustbin_k", "dustbin_v"])
    def test_gradient_matches_reference(self, results, arg):
        (_, grads), (_, ref_grads) = results
        flat = lambda g: dict(zip(["q", "k", "v", "dustbin_q", "dustbin_k", "dustbin_v"],
                                  jax.tree.leaves(g)))
        got, want = flat(grads)[arg], flat(ref_grads)[arg]
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=GRAD_ATOL, rtol=0)


class TestTransportTPUInterpret(_TransportCase):
    WRAPPER = "tpu"


class TestTransportGPUInterpret(_TransportCase):
    WRAPPER = "gpu"


class TestTransportGPUResidentInterpret(_TransportCase):
    WRAPPER = "gpu"
    RESIDENT = True


@pytest.mark.slow
@pytest.mark.parametrize("dustbin, adjoint, block, resident", [
    ("widened", "one_reference", None, False),  # the bridge: dense band through the kernels
    ("spoke", "four_plan", 8, False),  # the direct adjoint schedule: unmodulated products only
    ("none", "one_reference", None, False),  # default kernel tiles (one 32-wide tile here)
    ("widened", "one_reference", 8, True),  # a stored band covering the whole problem
    ("capacity", "four_plan", 8, True),  # stored band, capacity dustbin, every tail plan on its own
])
def test_transport_variants_match_reference(dustbin, adjoint, block, resident):
    cfg = TransportConfig(half_band=4, eps=0.6, base_steps=6, tail_steps=2, dustbin=dustbin,
                          adjoint=adjoint, impl="pallas", blocks=BlockSizes(block), resident_scores=resident)
    out, grads = _op_results(cfg, None)
    ref, ref_grads = _op_results(cfg.dense_reference(), None)
    np.testing.assert_allclose(out, ref, atol=OUT_ATOL, rtol=0)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(got, want, atol=GRAD_ATOL, rtol=0)


# ---- memory contract, tiles, dispatch --------------------------------------------------------------


def _equations(jpr):
    """Every equation of a jaxpr, sub-jaxprs included, kernel bodies not (a pallas_call's body
    works on tiles in VMEM / registers)."""
    for eqn in jpr.eqns:
        yield eqn
        if eqn.primitive.name == "pallas_call":
            continue
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (list, tuple)) else [param]):
                if hasattr(sub, "eqns"):
                    yield from _equations(sub)
                elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from _equations(sub.jaxpr)


def _largest_intermediate(jaxpr) -> int:
    """Most elements of any value outside kernel bodies (sub-jaxprs included, kernels not)."""
    return max((int(np.prod(getattr(var.aval, "shape", ()))) for eqn in _equations(jaxpr.jaxpr)
                for var in eqn.outvars), default=0)


@pytest.mark.parametrize("wrapper", ["tpu", "gpu"])
def test_no_band_is_materialized(wrapper, monkeypatch):
    """Forward + backward keep only O(L) arrays per problem; the XLA path (same trace, same
    measure) keeps the O(L W) band, which shows the measure can fail."""
    monkeypatch.setattr(pallas_ops, "CPU_WRAPPER", wrapper)
    L, W, block, d, dv = 400, 100, 16, 4, 3
    lanes = pallas_tpu.LANES  # widest per-row layout: TPU row vectors broadcast to 128 lanes
    q, k, v, tokens, g = _op_inputs(L, L, b=1, h=1, d=d, dv=dv)
    ql = kl = jnp.array([L])
    largest = {}
    for impl in ("pallas", "xla"):
        cfg = TransportConfig(half_band=W, base_steps=3, tail_steps=2, dustbin="spoke", impl=impl,
                              blocks=BlockSizes(block))
        loss = lambda q, k, v, t: jnp.sum(g * transport(q, k, v, ql, kl, t, config=cfg))
        largest[impl] = _largest_intermediate(jax.make_jaxpr(jax.grad(loss, (0, 1, 2, 3)))(q, k, v, tokens))
    o_l = (make_geometry(L, W, block).length + 1) * lanes
    assert largest["pallas"] <= o_l < largest["xla"], (largest, o_l)


def test_default_tiles_are_legal_for_both_wrappers():
    for length in (1, 5, 16, 17, 100, 128, 129, 300, 1000):
        for half_band in (0, 5, 64, length):
            geom = make_geometry(length, half_band, pallas=True)
            assert geom.length >= length
            pallas_tpu.check_geometry(geom)  # raise when illegal
            pallas_gpu.check_geometry(geom)
    assert make_geometry(20, 3).block == 24  # the XLA path keeps its own dense tile


def test_dispatch_follows_the_lowering_platform():
    """(wrapper, interpret) per lowering platform, whatever this host's backend is."""
    geom = make_geometry(20, 3, pallas=True)
    ops = PallasBandOps(geom)
    assert ops.branch("cpu") == (pallas_ops.CPU_WRAPPER, True)
    assert ops.branch("tpu") == ("tpu", False)
    assert ops.branch("cuda") == ops.branch("rocm") == ("gpu", False)
    forced = PallasBandOps(geom, wrapper="tpu")
    assert forced.branch("cpu") == ("tpu", True) and forced.branch("cuda") == ("tpu", False)
    assert PallasBandOps(geom, False).branch("cpu") is None  # no compiled kernels on CPU
    assert PallasBandOps(geom, True).branch("tpu") == ("tpu", True)  # forced interpret
    # An "auto" wrapper whose tile rules reject the tiling has no branch (block 8: neither).
    illegal = PallasBandOps(make_geometry(40, 3, 8))
    assert illegal.branch("tpu") is None and illegal.branch("cuda") is None
    assert illegal.branch("cpu") == (pallas_ops.CPU_WRAPPER, True)
    with pytest.raises(ValueError, match="wrapper must be one of"):
        PallasBandOps(geom, wrapper="mosaic")


def test_resident_scores_dispatch_to_the_triton_wrapper_only(monkeypatch):
    """The stored-band kernels exist in the Triton wrapper: interpret mode on CPU runs them
    whatever ``CPU_WRAPPER`` says, a TPU has no branch, and forcing the TPU wrapper is refused."""
    monkeypatch.setattr(pallas_ops, "CPU_WRAPPER", "tpu")
    geom = make_geometry(300, 70, pallas=True)
    ops = StoredBandOps(geom)
    assert ops.branch("cpu") == ("gpu", True)
    assert ops.branch("cuda") == ("gpu", False)
    assert ops.branch("tpu") is None
    assert ops.stored_g.block == gpu_budget.MAX_EDGE and ops.stored_g.length == geom.length
    assert StoredBandOps(make_geometry(20, 3, 8)).stored_g.block == 8  # kept when narrower
    with pytest.raises(ValueError, match="GPU"):
        StoredBandOps(geom, wrapper="tpu")
    for bad in (dict(impl="xla"), dict(impl="auto"), dict(impl="pallas", kernel="tpu"), dict(impl="pallas", resident_scores=1)):
        with pytest.raises(ValueError, match="resident_scores"):
            TransportConfig(half_band=3, **{"resident_scores": True, **bad})


def _kernel_calls(jaxpr, name: str) -> int:
    """Pallas calls of kernel ``name`` in a jaxpr (sub-jaxprs included; one per platform branch)."""
    return sum(str(eqn.params["name"]).split(" ")[0] == name
               for eqn in _equations(jaxpr.jaxpr) if eqn.primitive.name == "pallas_call")


def test_resident_scores_store_one_band():
    """With ``resident_scores`` the band is stored once per call (the forward's, kept for the
    backward: the gradient computes no band of its own) at the stored tiling's ``[N, Lp, n_diag
    b]``; without, nothing of size O(L W)."""
    L, W, d, dv = 400, 100, 4, 3
    q, k, v, tokens, g = _op_inputs(L, L, b=1, h=1, d=d, dv=dv)
    ql = kl = jnp.array([L])
    stored = {}
    for resident in (False, True):
        cfg = TransportConfig(half_band=W, base_steps=3, tail_steps=2, impl="pallas", resident_scores=resident)
        loss = lambda q, k, v: jnp.sum(g * transport(q, k, v, ql, kl, config=cfg))
        jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v)
        stored[resident] = _largest_intermediate(jaxpr)
    sg = pallas_gpu.stored_geometry(make_geometry(L, W, pallas=True))
    assert stored[True] == sg.length * sg.n_diag * sg.block > stored[False]
    forward = _kernel_calls(jax.make_jaxpr(loss)(q, k, v), "band_scores")
    assert forward >= 1 and _kernel_calls(jaxpr, "band_scores") == forward


@pytest.mark.parametrize("impl", ["xla", "pallas", "pallas-resident"])
def test_every_backend_implements_band_ops(impl):
    spec = Spec(TransportConfig(half_band=3, **impl_variant(impl)), make_geometry(20, 3, pallas=True), False, False)
    ops = make_ops(spec)
    assert isinstance(ops, BandOps)
    assert type(ops.keeps_plans) is bool and type(ops.takes_shift) is bool


@pytest.mark.parametrize("missing", sorted(BandOps.__abstractmethods__))
def test_a_backend_missing_a_member_is_refused(missing):
    members = {name: None for name in BandOps.__abstractmethods__ if name != missing}
    incomplete = type("Incomplete", (BandOps,), members)
    with pytest.raises(TypeError, match=missing):
        incomplete()


# ---- cross-lowering from this host -------------------------------------------------------------

LOWER_GEOM = make_geometry(320, 70, 128)  # realistic tiles: 3 row blocks, 3 block diagonals
_PLATFORM = {"tpu": "tpu", "gpu": "cuda"}
_CUSTOM_CALL = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}


def _kernel_specs(kernel: str, geom: BandGeometry, *, n=2, d=32, m=8, mx=12):
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    lp = geom.length
    qk = [f32(n, lp, d), f32(n, lp, d)]
    product = qk + [f32(n, lp), f32(n, lp), f32(n, lp, m)]  # q, k, row_off, col_off, y
    return {"band_lse": qk + [f32(n, lp)],  # q, k, col_off
            "band_product": product,
            "band_product_modulated": product + [f32(n, lp, mx), f32(n, lp, mx)]}[kernel]


def _lower(wrapper: str, kernel: str, geom: BandGeometry):
    mod = pallas_ops.WRAPPERS[wrapper]
    fn = getattr(mod, kernel.removesuffix("_modulated"))
    f = functools.partial(fn, geom=geom, interpret=False)
    return pallas_ops.lower(jax.jit(f), _PLATFORM[wrapper], *_kernel_specs(kernel, geom))


@pytest.mark.parametrize("wrapper", ["tpu", "gpu"])
@pytest.mark.parametrize("kernel", ["band_lse", "band_product", "band_product_modulated"])
def test_kernel_lowers_for_its_platform(wrapper, kernel):
    """The real Mosaic / Triton lowering of each kernel at 128-wide tiles."""
    text = _lower(wrapper, kernel, LOWER_GEOM).as_text()
    assert _CUSTOM_CALL[wrapper] in text


def _dot_takers(jpr) -> list[set]:
    """For every dot in the kernel bodies of a jaxpr's pallas_calls (their sub-jaxprs
    included), the primitives that take its result."""
    def walk(body):
        takers = {}
        for eqn in body.eqns:
            for var in eqn.invars:
                if isinstance(var, jax.extend.core.Var):
                    takers.setdefault(var, set()).add(eqn.primitive.name)
        found = [takers.get(eqn.outvars[0], set()) for eqn in body.eqns if eqn.primitive.name == "dot_general"]
        subs = [getattr(sub, "jaxpr", sub) for eqn in body.eqns for param in eqn.params.values()
                for sub in (param if isinstance(param, (list, tuple)) else [param])]
        return found + [t for sub in subs if hasattr(sub, "eqns") for t in walk(sub)]
    return [t for eqn in _equations(jpr.jaxpr) if eqn.primitive.name == "pallas_call"
            for t in walk(getattr(eqn.params["jaxpr"], "jaxpr", eqn.params["jaxpr"]))]


@pytest.mark.parametrize("wrapper, kernel", [("gpu", "band_lse"), ("gpu", "band_product"), ("tpu", "band_lse"),
                                             ("gpu", "band_scores")])
def test_computed_scores_take_their_offsets_after_the_mask(wrapper, kernel):
    """The kernels that compute score tiles add the potentials to the masked tile, not to the
    dot: Triton folds ``dot + x`` into the dot (its accumulator starts at x, about -|S|), and
    every partial sum of <q_i, k_j> then rounds at that size. On an H200 (2026-11-30, eps 1e-3,
    T 0) the recomputing kernels' dq was 7.1e-4 from float64 so, 15x dense autodiff's there, and
    2.2e-4 with the offsets added after the select. (The kernels here hold the score dot only:
    a product with a matrix y also adds its accumulator to a dot, as it should: the product
    here has a vector y.)"""
    specs = _stored_specs(kernel, LOWER_GEOM) if kernel == "band_scores" else _kernel_specs(kernel, LOWER_GEOM, m=1)
    fn = functools.partial(getattr(pallas_ops.WRAPPERS[wrapper], kernel), geom=LOWER_GEOM, interpret=False)
    takers = _dot_takers(jax.make_jaxpr(fn)(*specs))
    assert takers and not any("add" in t for t in takers), takers


def _stored_specs(kernel: str, geom: BandGeometry, *, n=2, d=32, m=8, mx=12):
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    lp = geom.length
    band = f32(n, lp, geom.n_diag * geom.block)
    product = [band, f32(n, lp), f32(n, lp), f32(n, lp), f32(n, lp, m)]  # band, scale, offsets, y
    return {"band_scores": [f32(n, lp, d), f32(n, lp, d), f32(n, lp), f32(n, lp)],
            "stored_lse": [band, f32(n, lp), f32(n, lp)],
            "stored_product": product,
            "stored_product_modulated": product + [f32(n, lp, mx), f32(n, lp, mx)],
            "stored_row_half": [band, f32(n, lp), f32(n, lp), f32(n, lp)],  # band, scale, v, weight
            "stored_col_half": [band, f32(n, lp), f32(n, lp), f32(n, geom.n_blocks), f32(n, lp)]}[kernel]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("kernel", ["band_scores", "stored_lse", "stored_product", "stored_product_modulated"])
def test_stored_band_kernels_lower_for_cuda(kernel, transposed):
    """The Triton lowering of the resident-score kernels at the stored tiling of a 128 band
    (32-wide tiles), the column walk (transposed) included."""
    if kernel == "band_scores" and transposed:
        pytest.skip("the scores kernel has no transposed form")
    geom = pallas_gpu.stored_geometry(LOWER_GEOM)
    static = {} if kernel == "band_scores" else {"transposed": transposed}
    fn = functools.partial(getattr(pallas_gpu, kernel.removesuffix("_modulated")), geom=geom, interpret=False,
                           **static)
    text = pallas_ops.lower(jax.jit(fn), "cuda", *_stored_specs(kernel, geom)).as_text()
    assert text.count(_CUSTOM_CALL["gpu"]) == 1


@pytest.mark.parametrize("centered", [True, False])
@pytest.mark.parametrize("kernel", ["stored_row_half", "stored_col_half"])
def test_fused_half_step_kernels_lower_for_cuda(kernel, centered):
    """The Triton lowering of ``fused_steps``' two kernels at the stored tiling of a 128 band:
    one kernel call each, with the row block shares as a second output of the row half."""
    geom = pallas_gpu.stored_geometry(LOWER_GEOM)
    fn = functools.partial(getattr(pallas_gpu, kernel), geom=geom, kappa=1.0 if centered else 0.5,
                           centered=centered, interpret=False)
    text = pallas_ops.lower(jax.jit(fn), "cuda", *_stored_specs(kernel, geom)).as_text()
    assert text.count(_CUSTOM_CALL["gpu"]) == 1
    shares = f"tensor<2x{geom.n_blocks}xf32>"
    assert (shares in text) == centered


@pytest.mark.parametrize("geom", [
    BandGeometry(half_band=10, block=64, n_blocks=4, wb=1),  # illegal: 64 lanes, several tiles
    BandGeometry(half_band=10, block=8, n_blocks=4, wb=2),  # illegal
    BandGeometry(half_band=10, block=24, n_blocks=1, wb=0),  # legal: one tile = the full dims
    BandGeometry(half_band=10, block=256, n_blocks=2, wb=1),  # legal
], ids=str)
def test_tpu_check_agrees_with_mosaic(geom, monkeypatch):
    """``pallas_tpu.check_geometry`` rejects exactly the tilings Mosaic's lowering rejects."""
    try:
        pallas_tpu.check_geometry(geom)
        legal = True
    except ValueError:
        legal = False
    monkeypatch.setattr(pallas_tpu, "check_geometry", lambda geom: None)
    if legal:
        _lower("tpu", "band_lse", geom)
    else:
        with pytest.raises(ValueError, match="divisible by 8 and 128"):
            _lower("tpu", "band_lse", geom)


@pytest.mark.parametrize("wrapper", ["tpu", "gpu"])
def test_public_op_gradient_lowers_for_platform(wrapper, monkeypatch):
    """Forward + custom VJP of the whole op (scan, cond, spokes, kernels) lowers end to end."""
    monkeypatch.setattr(pallas_ops, "CPU_WRAPPER", wrapper)
    cfg = TransportConfig(half_band=70, base_steps=3, tail_steps=2, dustbin="spoke", impl="pallas",
                          interpret=False)
    q, k, v, tokens, g = _op_inputs(300, 260, b=1, h=2, d=32, dv=16)
    ql, kl = jnp.array([290]), jnp.array([260])
    loss = lambda q, k, v, t: jnp.sum(g * transport(q, k, v, ql, kl, t, config=cfg))
    specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (q, k, v, tokens))
    text = pallas_ops.lower(jax.jit(jax.grad(loss, (0, 1, 2, 3))), _PLATFORM[wrapper], *specs).as_text()
    assert _CUSTOM_CALL[wrapper] in text


# ---- TPU interpreter with poisoned scratch and bounds checks -----------------------------------


def test_tpu_interpreter_with_nan_scratch_and_bounds_checks():
    """Under ``pltpu.InterpretParams`` scratch starts as NaN and out-of-bounds reads raise: a
    missing initialisation or a bad key-block index map would show here."""
    params = pltpu.InterpretParams(uninitialized_memory="nan", out_of_bounds_reads="raise")
    length, block = 20, 8
    geom = make_geometry(length, 5, block)  # 3 row blocks, clipped duplicates at both edges
    p = _random_problem(geom, length, seed=1)

    def both_kernels(ops):  # each kernel once, one of them on the transposed problem
        s = ops.scores(p["q"], p["k"], p["row_active"], p["col_active"], 0.7)
        return ops.row_lse(s, p["bias"]), ops.plan_cols(ops.plan(s, p["row_pot"], p["col_pot"]),
                                                        p["y"], p["x"], p["z"])

    want = both_kernels(XlaBandOps(geom))
    try:
        got = both_kernels(PallasBandOps(geom, params, wrapper="tpu"))
    finally:
        pltpu.reset_tpu_interpret_mode_state()
    for name, g, w in zip(("row_lse", "plan_cols_modulated"), got, want):
        np.testing.assert_allclose(g, w, err_msg=name, **PRIM_TOL)


@pytest.mark.parametrize("groups, programs", [(2, 2), (3, 3), (5, 4), (7, 7)])
def test_band_scores_split_over_diagonal_groups_store_the_same_band(groups, programs, monkeypatch):
    """``band_scores`` with a row block's tiles split over ``groups`` programs (a third grid
    axis; the last group's surplus trips rewrite the band's last tile) stores the band bit for
    bit as one program a row block does, and that band is the dense masked scores
    ``<q_i, k_j> + a_i + c_j`` on ``|i - j| <= W`` (``-inf`` off the band, off the problem and on
    inactive lines). Lowered for cuda, the grid holds as many programs as the tiles need (7
    tiles in 5 groups: 4 programs of 2); a default ``SCORE_GROUPS`` above a narrow band's tiles
    gives a tile a program."""
    geom = make_geometry(160, 40, 16, pallas=True)  # 10 row blocks, n_diag 7
    assert geom.n_diag == 7
    n, d, lq = 2, 8, 150
    kq, kk, ka, kc = jax.random.split(jax.random.PRNGKey(3), 4)
    q = jax.random.normal(kq, (n, geom.length, d))
    k = jax.random.normal(kk, (n, geom.length, d))
    active = jnp.arange(geom.length) < lq
    a = jnp.where(active, jax.random.normal(ka, (n, geom.length)), -jnp.inf)
    c = jnp.where(active, jax.random.normal(kc, (n, geom.length)), -jnp.inf)
    one = pallas_gpu.band_scores(q, k, a, c, geom=geom, interpret=True, groups=1)
    split = pallas_gpu.band_scores(q, k, a, c, geom=geom, interpret=True, groups=groups)
    np.testing.assert_array_equal(np.asarray(split), np.asarray(one))
    # the dense reference, in float64
    q64, k64, a64, c64 = (np.asarray(x, np.float64) for x in (q, k, a, c))
    b, wb = geom.block, geom.wb
    rows = np.arange(geom.length)[:, None]
    cols = ((rows // b + np.arange(geom.n_diag * b)[None, :] // b - wb) * b + np.arange(geom.n_diag * b)[None, :] % b)
    on = (np.abs(rows - cols) <= geom.half_band) & (cols >= 0) & (cols < geom.length)
    safe = np.clip(cols, 0, geom.length - 1)
    for m in range(n):
        dense = q64[m] @ k64[m].T + a64[m][:, None] + c64[m][None, :]
        want = np.where(on, np.take_along_axis(dense, safe, axis=1), -np.inf)
        np.testing.assert_allclose(np.asarray(one[m], np.float64), want, rtol=1e-5, atol=1e-5)
    fn = functools.partial(pallas_gpu.band_scores, geom=geom, interpret=False, groups=groups)
    text = pallas_ops.lower(jax.jit(fn), "cuda", q, k, a, c).as_text()
    assert text.count(_CUSTOM_CALL["gpu"]) == 1 and f"grid_z = {programs}" in text.replace('"', "")
    with pytest.raises(ValueError, match="groups must be"):
        pallas_gpu.band_scores(q, k, a, c, geom=geom, interpret=True, groups=geom.n_diag + 1)
    monkeypatch.setattr(pallas_gpu, "SCORE_GROUPS", 50)
    text = pallas_ops.lower(jax.jit(functools.partial(pallas_gpu.band_scores.__wrapped__, geom=geom)),
                            "cuda", q, k, a, c).as_text()
    assert "grid_z = 7" in text.replace('"', "")
