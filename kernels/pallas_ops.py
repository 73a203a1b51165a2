"""Pallas backend of the banded primitives: the O(L)-memory schedule.

``PallasBandOps`` implements ``band_ops.BandOps`` (as ``XlaBandOps`` does) but keeps no
score band: ``scores`` and ``plan`` return lazy handles of O(L) vectors, and every LSE or plan
product recomputes its score tiles from q and k inside a kernel. Two kernels cover its
compute primitives:

- ``band_lse(q, k, c)``: ``LSE_j (<q_i, k_j> + c_j)`` over the band;
- ``band_product(q, k, a, c, y, x, z)``: ``Σ_j exp(<q_i, k_j> + a_i + c_j) <x_i, z_j> y_j``.

``StoredBandOps`` (``TransportConfig.resident_scores``; Triton and interpret mode only) is
the same backend with ``scores`` storing the masked band once (``pallas_gpu.band_scores``:
O(L W) memory, as the XLA path) and its kernels reading the tiles (``stored_lse``,
``stored_product``, ``stored_linear_product``, and the fused steps' ``stored_row_half`` /
``stored_col_half`` / ``stored_one_pass_rows`` / ``stored_one_pass_combine``) instead of
recomputing ``<q_i, k_j>`` in every pass; its handles stay lazy in the scale and the
potentials.

Activity masks become ``-inf`` offsets, the score scale is folded into q (one multiply per
row instead of one per tile entry), and the column primitives are the row kernels on the
transposed problem: the band ``|i - j| <= W`` is symmetric and the padded problem square, so
swapping (q, k), the masks, the potentials and (x, z) turns rows into columns.

Wrapper dispatch follows the platform the op is *lowered* for, not the host
(``jax.lax.platform_dependent``: only the target's branch is lowered): "tpu" -> ``pallas_tpu``
(Mosaic), "cuda" / "rocm" -> ``pallas_gpu`` (Triton), "cpu" -> interpret mode of
``CPU_WRAPPER``. So ``lower(jax.jit(f), "tpu", *args)`` on a CPU host gets the Mosaic
kernels (``lower``: jax's ``lower(lowering_platforms=...)``, with the GPU named that jax >= 0.11
asks for when the host has none).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
from jax.interpreters import mlir

from pfamalign.kernels import pallas_gpu, pallas_tpu
from pfamalign.kernels.band import BandGeometry
from pfamalign.kernels.band_ops import BandOps
from pfamalign.kernels.config import TRITON_DOTS, accelerator, pallas_triton

WRAPPERS = {"tpu": pallas_tpu, "gpu": pallas_gpu}
PLATFORMS = ("cpu", "tpu", "cuda", "rocm")  # the lowering platforms a kernel call has a branch for
# On CPU both wrappers run through the same HLO interpreter (tests cover both). The Triton one
# takes n_diag times fewer grid steps (its band loop is inside the kernel) and no pl.when
# branches, so its interpret mode compiles and runs faster.
CPU_WRAPPER = "gpu"
# The Triton kernels that compute dots (the others read a stored band and sum): they take the
# dot arithmetic (``TransportConfig.triton_dots``).
DOT_KERNELS = ("band_scores", "band_lse", "band_product", "stored_product", "stored_linear_product")
# The GPU a "cuda" lowering targets from a host without one: jax 0.10 assumed sm_90 there, and
# jax >= 0.11 refuses to lower a Triton kernel until a GPU is named (by its device kind).
OFFLINE_CUDA_DEVICE = "NVIDIA H100 80GB HBM3"


@contextlib.contextmanager
def offline_target(platform: str, mesh=None):
    """Context for lowering (or compiling, deviceless) the op for ``platform`` from this host.
    For "cuda" on a host without a GPU, an abstract mesh on a GPU: ``mesh``'s (the mesh of a
    described GPU's topology, whose shardings the inputs carry) or one device of kind
    ``OFFLINE_CUDA_DEVICE``. jax >= 0.11 reads the Triton target from it; jax 0.10 ignores it
    and takes sm_90 anyway. Otherwise nothing changes (a GPU host lowers for its own GPU)."""
    if platform != "cuda" or accelerator() == "gpu":
        yield
        return
    if mesh is None:
        device = jax.sharding.AbstractDevice(device_kind=OFFLINE_CUDA_DEVICE, num_cores=None, platform="cuda")
        abstract = jax.sharding.AbstractMesh((1,), ("_",), (jax.sharding.AxisType.Auto,), abstract_device=device)
    else:
        abstract = mesh.abstract_mesh
    with jax.sharding.use_abstract_mesh(abstract):
        yield


def lower(jitted, platform: str, *args):
    """``jitted.trace(*args).lower(lowering_platforms=(platform,))`` from any host, traced and
    lowered inside ``offline_target`` (jax 0.11 lowers a trace for the mesh it was traced
    under)."""
    with offline_target(platform):
        return jitted.trace(*args).lower(lowering_platforms=(platform,))


class Scores(NamedTuple):
    """Lazy score handle: ``S_ij = scale <q_i, k_j>`` on the masked band, never materialised."""

    q: jax.Array  # [N, Lp, d]
    k: jax.Array  # [N, Lp, d]
    row_active: jax.Array  # [N, Lp] bool
    col_active: jax.Array  # [N, Lp] bool
    scale: jax.Array  # []


class StoredScores(NamedTuple):
    """Resident score handle: ``S_ij = scale * band_ij``, the band stored once at unit scale
    (-inf off the support: the kernels need no activity offsets). The scale is kept per line,
    on active lines (1 elsewhere, where the band is -inf): a vector computed from the masks,
    so that XLA cannot sink it into a loop body as a broadcast constant."""

    band: jax.Array  # [N, Lp, n_diag b]: pallas_gpu.band_scores at the stored tiling
    scale_rows: jax.Array  # [N, Lp]
    scale_cols: jax.Array  # [N, Lp]


class Plan(NamedTuple):
    """Lazy plan handle: ``P_ij = exp(S_ij + row_pot_i + col_pot_j)`` on the support."""

    scores: Scores | StoredScores
    row_pot: jax.Array  # [N, Lp]
    col_pot: jax.Array  # [N, Lp]


# ---- a branch that refuses when lowered ------------------------------------------------------

_refuse_p = jax.extend.core.Primitive("pallas_kernel_refused")
_refuse_p.multiple_results = True
_refuse_p.def_abstract_eval(lambda *args, avals, message: list(avals))


def _refuse(*args, avals, message):
    raise ValueError(f"Cannot run the transport op's {message}")


def _refuse_lowering(ctx, *args, avals, message):
    raise ValueError(f"Cannot lower the transport op's {message}")


def _refuse_batched(args, dims, *, avals, message):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)  # None: unmapped
    avals = tuple(jax.core.ShapedArray((size, *a.shape), a.dtype) for a in avals)
    return _refuse_p.bind(*args, avals=avals, message=message), [0] * len(avals)


_refuse_p.def_impl(_refuse)  # eager (outside jit) on this host's CPU
mlir.register_lowering(_refuse_p, _refuse_lowering)
jax.interpreters.batching.primitive_batchers[_refuse_p] = _refuse_batched


def _refusal(kernel: Callable, message: str, *args):
    """Outputs shaped as ``kernel(*args)``'s from a primitive whose lowering raises ``message``."""
    out = jax.eval_shape(kernel, *args)
    leaves, tree = jax.tree.flatten(out)
    avals = tuple(jax.core.ShapedArray(x.shape, x.dtype) for x in leaves)
    flat_args = [jnp.asarray(a) for a in jax.tree.leaves(args)]
    return jax.tree.unflatten(tree, _refuse_p.bind(*flat_args, avals=avals, message=message))


def _scaled(s: Scores):
    """``scale q``: the scale is folded into q on both walks (one multiply per row, not per tile
    entry), so that a row and a column walk compute the same rounded score ``<scale q_i, k_j>``
    (``<scale k_j, q_i>`` rounds otherwise, by u |S| relative: at cold scores enough to keep the
    adjoint's cancellations from cancelling)."""
    return s.q * s.scale


def _offsets(active, values=None):
    """``[N, Lp]`` additive offsets: ``values`` (or 0) where active, ``-inf`` elsewhere."""
    return jnp.where(active, 0.0 if values is None else values, -jnp.inf).astype(jnp.float32)


class PallasBandOps(BandOps):
    """The ``BandOps`` primitives as Pallas kernels that recompute score tiles from q and k.

    Args:
      geom: the band tiling (``make_geometry(..., pallas=True)`` gives kernel-legal tiles).
      interpret: run the kernels in interpret mode; ``None`` means "iff the lowering platform
        is CPU". A ``pltpu.InterpretParams`` selects the TPU interpreter (TPU wrapper only).
      wrapper: "tpu" or "gpu" to force a kernel wrapper; "auto" (or None): the lowering
        platform's (``CPU_WRAPPER`` on CPU).
      dots: the Triton kernels' dot arithmetic, "ieee" or "tf32x3" (``TransportConfig.triton_dots``;
        Mosaic's are fp32 either way).
    """

    # No plan is kept across steps (every product rebuilds its plan tiles from the scores, here
    # and in StoredBandOps), so the scaling-domain solve does not apply.
    keeps_plans = False
    takes_shift = False  # the kernels' log-sum-exp keeps a running max: exact in one pass

    def __init__(self, geom: BandGeometry, interpret: Any = None, *, wrapper: str = "auto",
                 dots: str = "ieee"):
        if wrapper != "auto" and wrapper not in WRAPPERS:
            raise ValueError(f"wrapper must be one of {['auto', *sorted(WRAPPERS)]}, got {wrapper!r}")
        self.g = geom
        self.wrapper = wrapper
        self.interpret = interpret
        if dots not in TRITON_DOTS:
            raise ValueError(f"dots must be one of {TRITON_DOTS}, got {dots!r}")
        self.dots = dots

    @property
    def kernel_geom(self) -> BandGeometry:
        """The tiling the kernels are called with."""
        return self.g

    def branch(self, platform: str) -> tuple[str, Any] | None:
        """``(wrapper, interpret)`` run when lowering for ``platform``; None when there is none
        (compiled kernels on CPU, or an "auto" wrapper whose tile rules reject the tiling):
        lowering for that platform then fails with ``why_no_branch``'s reason."""
        kind, interpret, wrapper = self._asked(platform)
        if wrapper is None:
            return None
        if interpret:
            return wrapper, interpret
        if kind == "cpu" or (wrapper == "gpu" and not pallas_triton()):
            return None
        if self.wrapper == "auto":
            try:
                WRAPPERS[wrapper].check_geometry(self.kernel_geom)
            except ValueError:
                return None
        return wrapper, interpret

    def why_no_branch(self, platform: str) -> str:
        """What a user reads when the op is lowered for a ``platform`` without a branch."""
        kind, interpret, wrapper = self._asked(platform)
        if wrapper is None:
            return (f"{type(self).__name__} has no kernels for a {platform!r} target (resident_scores: "
                    "Triton kernels only): use resident_scores=False there")
        if wrapper == "gpu" and not interpret and kind != "cpu" and not pallas_triton():
            return (f"jax {jax.__version__} has no Pallas Triton backend (deprecated in jax 0.11): "
                    "use impl='xla' (impl='auto' does), or a jax that has it")
        if kind == "cpu":
            return ("the Pallas kernels were configured compiled (interpret=False), and a CPU runs them in "
                    "interpret mode only: leave interpret at None (compiled on a GPU or TPU, interpreted "
                    "on a CPU), or run the op where jax's backend is a GPU or TPU")
        try:
            WRAPPERS[wrapper].check_geometry(self.kernel_geom)
        except ValueError as e:
            return f"no {platform!r} kernels for this tiling ({e}): give blocks the {platform} kernels take"
        return f"no kernels for a {platform!r} target"

    def _asked(self, platform: str) -> tuple[str, Any, str | None]:
        """``(accelerator kind, interpret, wrapper)`` this config asks for on ``platform``."""
        kind = accelerator(platform)
        interpret = (kind == "cpu") if self.interpret is None else self.interpret
        return kind, interpret, self._wrapper(kind, interpret)

    def _wrapper(self, kind: str, interpret) -> str | None:
        """The kernel wrapper for an accelerator kind (None: no kernels for it)."""
        del interpret
        return self.wrapper if self.wrapper != "auto" else (CPU_WRAPPER if kind == "cpu" else kind)

    def _kernel(self, name: str, **static) -> Callable:
        """Kernel function ``name`` of the lowering platform's wrapper module ("band_lse",
        "band_product"; StoredBandOps: "band_scores" and the ``stored_*`` kernels), with
        ``static`` keywords."""
        fns, made = {}, {}
        for platform in PLATFORMS:
            if (choice := self.branch(platform)) is not None:
                if choice not in made:  # one callable per kernel: platform_dependent traces it once
                    wrapper, interpret = choice
                    dots = {"dots": self.dots} if wrapper == "gpu" and name in DOT_KERNELS else {}
                    made[choice] = functools.partial(getattr(WRAPPERS[wrapper], name), geom=self.kernel_geom,
                                                     interpret=interpret, **dots, **static)
                fns[platform] = made[choice]
        if not fns:  # nowhere: say why not here
            raise ValueError(f"the {name} kernel: {self.why_no_branch(jax.default_backend())}")
        if len(fns) == len(PLATFORMS) and len(made) == 1:
            return next(iter(made.values()))  # the same kernel everywhere: no dispatch needed
        # A platform without kernels gets a branch that refuses, by name, when lowered for it
        # (without one, jax fails there on its dispatch primitive, whose error names neither).
        shaped_like = next(iter(made.values()))
        for platform in PLATFORMS:
            if platform not in fns:
                fns[platform] = functools.partial(_refusal, shaped_like,
                                                  f"{name} kernel: {self.why_no_branch(platform)}")
        return lambda *args: jax.lax.platform_dependent(*args, **fns)

    # ---- kernels on the (possibly transposed) problem ------------------------------------------
    def _lse(self, q, k, q_active, k_active, k_bias):
        """``LSE_j (<q_i, k_j> + k_bias_j)`` per q-row (one of q, k scaled); -inf for rows with no
        active entry."""
        lse = self._kernel("band_lse")(q, k, _offsets(k_active, k_bias[:, : k_active.shape[1]]))
        # A row offset is constant along the reduction: inactive rows get their -inf here, which
        # spares the kernel a [N, Lp, 128] row-vector operand on TPU.
        return lse + _offsets(q_active)

    def _product(self, q, k, q_active, k_active, q_pot, k_pot, y, x, z):
        """``Σ_j exp(<q_i, k_j> + q_pot_i + k_pot_j) <x_i, z_j> y_j`` per q-row (one of q, k
        scaled)."""
        if (x is None) != (z is None):
            raise ValueError("x and z must be given together")
        return self._kernel("band_product")(q, k, _offsets(q_active, q_pot),
                                            _offsets(k_active, k_pot), y, x, z)

    # ---- scores ---------------------------------------------------------------------------
    def scores(self, q, k, row_active, col_active, scale) -> Scores:
        """Handle for ``scale * <q_i, k_j>`` on the band; q, k ``[N, Lp, d]``, masks ``[N, Lp]``."""
        return Scores(q, k, row_active, col_active, jnp.asarray(scale, jnp.float32))

    def rescale(self, s: Scores, factor) -> Scores:
        return s._replace(scale=s.scale * factor)

    # ---- log-sum-exp half steps -----------------------------------------------------------
    # No ``shift`` is ever passed (takes_shift is False): the online max/sum is one exact pass.
    def row_lse(self, s: Scores, col_bias, shift=None):
        """``LSE_j (S_ij + col_bias_j)`` over each row's band ``[N, Lp]``; -inf for rows with none."""
        del shift
        return self._lse(_scaled(s), s.k, s.row_active, s.col_active, col_bias)

    def col_lse(self, s: Scores, row_bias, shift=None):
        """``LSE_i (S_ij + row_bias_i)`` over each column's band ``[N, Lp]``: the transposed row LSE."""
        del shift
        return self._lse(s.k, _scaled(s), s.col_active, s.row_active, row_bias)

    # ---- plans and their products ---------------------------------------------------------
    def plan(self, s, row_pot, col_pot) -> Plan:
        """Handle for ``exp(S_ij + row_pot_i + col_pot_j)`` on the support (0 outside)."""
        return Plan(s, row_pot, col_pot)

    def plan_rows(self, p: Plan, y, x=None, z=None):
        """``out_i = Σ_j P_ij <x_i, z_j> y_j``; y ``[N, Lp, m]`` and z on columns, x on rows."""
        s = p.scores
        return self._product(_scaled(s), s.k, s.row_active, s.col_active, p.row_pot, p.col_pot, y, x, z)

    def plan_cols(self, p: Plan, y, x=None, z=None):
        """``out_j = Σ_i P_ij <x_i, z_j> y_i``; y ``[N, Lp, m]`` and x on rows, z on columns."""
        s = p.scores
        return self._product(s.k, _scaled(s), s.col_active, s.row_active, p.col_pot, p.row_pot, y, z, x)


class StoredBandOps(PallasBandOps):
    """``PallasBandOps`` whose kernels read a score band stored once by ``scores`` (at
    ``pallas_gpu.stored_geometry``) instead of recomputing it. GPU wrapper only: on a TPU the
    recomputation runs on the matrix unit; there is no TPU branch, and lowering for "tpu"
    fails. Arguments as ``PallasBandOps``."""

    def __init__(self, geom: BandGeometry, interpret: Any = None, *, wrapper: str = "auto",
                 dots: str = "ieee"):
        if wrapper == "tpu":
            raise ValueError("resident scores have GPU (Triton) kernels only: use wrapper 'gpu' or 'auto'")
        super().__init__(geom, interpret, wrapper=wrapper, dots=dots)
        self.stored_g = pallas_gpu.stored_geometry(geom)

    @property
    def kernel_geom(self) -> BandGeometry:
        return self.stored_g

    def _wrapper(self, kind: str, interpret) -> str | None:
        """The Triton wrapper (the stored-band kernels exist there only); none for a compiled TPU."""
        return None if kind == "tpu" and not interpret else "gpu"

    def scores(self, q, k, row_active, col_active, scale) -> StoredScores:
        scale = jnp.asarray(scale, jnp.float32)
        band = self._kernel("band_scores")(q, k, _offsets(row_active), _offsets(col_active))
        return StoredScores(band, jnp.where(row_active, scale, 1.0), jnp.where(col_active, scale, 1.0))

    def rescale(self, s: StoredScores, factor) -> StoredScores:
        return s._replace(scale_rows=s.scale_rows * factor, scale_cols=s.scale_cols * factor)

    # Extended biases go in whole: the kernels read their first Lp entries.
    def row_lse(self, s: StoredScores, col_bias, shift=None):
        del shift
        return self._kernel("stored_lse", transposed=False)(s.band, s.scale_rows, col_bias)

    def col_lse(self, s: StoredScores, row_bias, shift=None):
        del shift
        return self._kernel("stored_lse", transposed=True)(s.band, s.scale_cols, row_bias)

    # ---- fused half steps (TransportConfig.fused_steps): a Sinkhorn step in two kernels ----------
    def row_half_step(self, s: StoredScores, v, weight, kappa: float, centered: bool, previous=None,
                      spoke: "pallas_gpu.SpokeLines | None" = None):
        """``û = kappa (0 - LSE_row(S + v))`` with unit row targets (0 on rows without
        entries) ``[N, Lp]``, and with ``centered`` each row block's share of the centering
        constant (``pallas_gpu.stored_row_half``; ``weight``: 1 / (rows with entries) on them).
        ``previous`` ``[N, Lp]``: the rows' potential before the step, whose LSE guess lets the
        walk take one pass (the result is exact either way). ``spoke``: the spoke dustbin's
        lines (``pallas_gpu.SpokeLines``), in the LSE and solved too."""
        return self._kernel("stored_row_half", kappa=kappa, centered=centered)(
            s.band, s.scale_rows, v, weight, previous, spoke)

    def col_half_step(self, s: StoredScores, u_hat, shares, weight, kappa: float, centered: bool,
                      previous=None, spoke: "pallas_gpu.SpokeLines | None" = None):
        """The column half step after ``row_half_step``: centered, ``(u, v)`` ``[N, Lp]``;
        else ``v̂`` (``pallas_gpu.stored_col_half``, which also says what ``spoke`` adds);
        ``previous``: as ``row_half_step``'s."""
        return self._kernel("stored_col_half", kappa=kappa, centered=centered)(
            s.band, s.scale_cols, u_hat, shares, weight, previous, spoke)

    def dustbin_partials(self, x):
        """``[N, nB]`` partial LSEs of ``x [N, Lp]`` over the half steps' line blocks: a
        dustbin line's ``SpokeLines.partials`` before the first half step."""
        return pallas_gpu.dustbin_partials(x, geom=self.kernel_geom)

    # ---- one-pass steps (TransportConfig.one_pass_steps): the band read once a step -------------
    def one_pass_pad(self) -> int:
        """Zeros on each side of the potentials ``one_pass_step`` carries."""
        return pallas_gpu.one_pass_pad(self.stored_g)

    def one_pass_step(self, s: StoredScores, v_pad, weight, kappa_rows: float, kappa_cols: float,
                      centered: bool):
        """A Sinkhorn step with unit targets in two kernels that read the band once
        (``pallas_gpu.stored_one_pass_rows`` / ``_combine``): ``(û, u, v)``, û ``[N, Lp]``, u
        and v padded by ``one_pass_pad`` zeros on each side (v_pad: the previous v so)."""
        pad = ((0, 0), (self.one_pass_pad(),) * 2)
        rows = self._kernel("stored_one_pass_rows", kappa=kappa_rows, centered=centered)(
            s.band, s.scale_rows, jnp.pad(s.scale_cols, pad), v_pad, weight)
        combine = self._kernel("stored_one_pass_combine", kappa=kappa_cols, centered=centered)
        if centered:
            u_hat, partials, shares = rows
            return (u_hat, *combine(partials, u_hat, shares, weight))
        u_hat, partials = rows
        return u_hat, jnp.pad(u_hat, pad), combine(partials, u_hat, None, weight)

    def _stored_product(self, p: Plan, transposed: bool, y, x, z):
        if (x is None) != (z is None):
            raise ValueError("x and z must be given together")
        s = p.scores
        scale, line, walk = ((s.scale_cols, p.col_pot, p.row_pot) if transposed
                             else (s.scale_rows, p.row_pot, p.col_pot))
        return self._kernel("stored_product", transposed=transposed)(s.band, scale, line, walk, y, x, z)

    def plan_rows(self, p: Plan, y, x=None, z=None):
        return self._stored_product(p, False, y, x, z)

    def plan_cols(self, p: Plan, y, x=None, z=None):
        return self._stored_product(p, True, y, z, x)

    def modulated_products(self, p: Plan, x, z, y_cols, y_rows):
        """The row walk stores ``D = P ∘ <x_i, z_j>`` as it goes (one band write); the column
        product walks D as it is: one exponential and one ``<x, z>`` an entry, not two."""
        s = p.scores
        rows, d_band = self._kernel("stored_product", transposed=False, keep_band=True)(
            s.band, s.scale_rows, p.row_pot, p.col_pot, y_cols, x, z)
        return rows, self._kernel("stored_linear_product", transposed=True)(d_band, y_rows)
