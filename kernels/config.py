"""Settings of the transport op: frozen (hashable, jit-static) and self-validating."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp

DUSTBIN_MODES = ("none", "widened", "spoke", "capacity")
IMPLEMENTATIONS = ("auto", "reference", "xla", "pallas")
ADJOINTS = ("one_reference", "four_plan")
KERNELS = ("auto", "tpu", "gpu")
# How the Triton kernels run their f32 dots: "ieee" (fp32 FMAs, no tensor cores) or "tf32x3"
# (three TF32 tensor-core products of the operands' high and low parts, fp32 accumulation).
TRITON_DOTS = ("ieee", "tf32x3")
MARGINALS = ("balanced", "rows", "cols")

# Every f32 contraction of the op (XLA path, reference, kernels) runs at this precision: the
# default lets GPUs use TF32 and TPUs bf16 inputs, far outside the op's 1e-5 promise.
F32_PRECISION = jax.lax.Precision.HIGHEST


def einsum(subscripts: str, *operands):
    """``jnp.einsum`` at ``F32_PRECISION``: the op's contractions outside the kernels."""
    return jnp.einsum(subscripts, *operands, precision=F32_PRECISION)


def damp(x, kappa: float):
    """``kappa * x`` for a static kappa (``TransportConfig.damping``): exactly ``x`` at 1 and
    exactly 0 at 0, so the balanced op's arithmetic is untouched."""
    return x if kappa == 1.0 else (jnp.zeros_like(x) if kappa == 0.0 else kappa * x)


def log_or_neg_inf(ssum):
    """``log(ssum)`` with -inf for empty sums, and a zero (not NaN) cotangent there: the
    banded steps stay differentiable by autodiff (the bias certificate differentiates the base
    solve through them)."""
    pos = ssum > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, ssum, 1.0)), -jnp.inf)


# Largest |log(sum)| accepted from a shifted one-pass log-sum-exp (the XLA path's per call, the
# fused Triton half steps' per program): the sum then lies in [e^-60, e^60] (times at most 2^13
# terms), far from float32 overflow and from underflow of its leading terms.
SAFE_LOG = 60.0


def potential(log_target, lse, kappa: float = 1.0):
    """A half step's potential: ``kappa (log target - LSE)`` on lines with entries; 0 on lines
    without (they carry no mass). kappa < 1: a KL-relaxed side; 0: a free side (its potential
    stays 0). The solve's and the fused kernels' one definition."""
    return jnp.where(jnp.isfinite(lse), damp(log_target - lse, kappa), 0.0)


def marginal_error(sums, pot, log_target, has, kappa: float):
    """Max over supported lines (``has``, last axis) of ``|sum - target|``: a constrained side's
    target is prescribed, a damped side's is its fixed point ``exp(log_target - pot (1 - kappa)
    / kappa)`` (where ``pot = kappa (log_target - LSE)``), and a free side (kappa = 0) has none:
    error 0."""
    if kappa == 0.0:
        return jnp.zeros(sums.shape[:-1], sums.dtype)
    log_t = log_target if kappa == 1.0 else log_target - pot * (1 - kappa) / kappa
    return jnp.max(jnp.where(has, jnp.abs(sums - jnp.exp(log_t)), 0.0), -1)


# The implementations as benchmarks, profiles and tests name them: an ``impl`` and the settings
# that make a variant of it (``TransportConfig(**IMPL_VARIANTS[name], ...)``).
IMPL_VARIANTS = {
    "reference": {"impl": "reference"},
    "xla": {"impl": "xla"},
    "xla-branch-free": {"impl": "xla", "branch_free": True},
    "pallas": {"impl": "pallas"},
    "pallas-resident": {"impl": "pallas", "resident_scores": True},
    "xla-unrolled": {"impl": "xla", "unroll": True},
    "pallas-resident-unrolled": {"impl": "pallas", "resident_scores": True, "unroll": True},
    "pallas-fused": {"impl": "pallas", "resident_scores": True, "unroll": True, "fused_steps": True},
    "pallas-one-pass": {"impl": "pallas", "resident_scores": True, "unroll": True, "fused_steps": True,
                        "one_pass_steps": True},
    "pallas-fused-tf32x3": {"impl": "pallas", "resident_scores": True, "unroll": True, "fused_steps": True,
                            "triton_dots": "tf32x3"},
    "pallas-one-pass-tf32x3": {"impl": "pallas", "resident_scores": True, "unroll": True, "fused_steps": True,
                               "one_pass_steps": True, "triton_dots": "tf32x3"},
}

# ``impl="auto"`` on GPU, measured (``bash scripts/gpu_session.sh issue11`` and ``... resident
# --impls reference,pallas-fused-tf32x3,xla --lengths 1024,8192`` on an NVIDIA H200, 2026-11-29;
# the table is in the README, the JSON lines in docs/measurements/h200-2026-11-29/): dense
# autodiff ("reference") below ``GPU_DENSE_CROSSOVER``, the stored-band kernels with fused
# two-kernel steps (``GPU_BANDED_IMPL``, a name of ``IMPL_VARIANTS``) from it on: fwd + bwd 5.0x
# dense at L 4096 and 11.0x at 16384 (W 1024). Their "ieee" dots, as the op's exactness contract
# names them: the "tf32x3" dots were 1.14x / 1.08x faster still, and lost to dense at L 1024
# (0.97x; 10.8x at 8192), a choice made by name (``impl_variant("pallas-fused-tf32x3")``).
# Those figures hold where the fused steps run: one eps, no tolerance, no dustbin (the
# benchmark's problem); with the spoke dustbin of the shipped models (its lines solved in the
# same two kernels) 3.1x / 5.3x / 6.1x dense at L 4096 / 8192 / 16384 against the XLA path's
# 0.92x / 0.94x / 4.1x (H200, 2026-11-30, ``gpu_session.sh spokes``; docs/measurements/
# h200-2026-11-30/). Other problems take the variant's unfused stored-band steps, so there
# auto keeps the measured rule before it: the looped XLA path
# (``GPU_LOOPED_IMPL``) from ``GPU_LOOPED_CROSSOVER`` on (H100, 2026-11-24: 0.69x dense at
# L 4096, 4.5x at 8192; H200: 7.1x at 8192). So too past ``GPU_UNROLLED_MAX_STEPS`` fixed steps:
# the fused steps are straight-line (``unroll``), which compiles in time proportional to them.
GPU_DENSE_CROSSOVER: int | None = 4096
GPU_BANDED_IMPL = "pallas-fused"
GPU_LOOPED_IMPL = "xla"
GPU_LOOPED_CROSSOVER: int | None = 8192
GPU_UNROLLED_MAX_STEPS = 64


def impl_variant(name: str) -> dict:
    """The ``TransportConfig`` settings of a named implementation variant (``IMPL_VARIANTS``)."""
    if name not in IMPL_VARIANTS:
        raise ValueError(f"unknown implementation {name!r}: one of {', '.join(IMPL_VARIANTS)}")
    return dict(IMPL_VARIANTS[name])


def dense_crossover(timings: dict[int, tuple[float | None, float | None]]) -> int | None:
    """``GPU_DENSE_CROSSOVER`` from measured times ``{L: (dense_ms, kernels_ms)}`` (None where
    a side did not run): the shortest measured L at which, and at every longer measured L, the
    kernels ran and were faster than dense autodiff (or dense could not run: over its memory).
    None when they do not win at the longest L measured."""
    won = None
    for length in sorted(timings, reverse=True):
        dense, kernels = timings[length]
        if kernels is None or (dense is not None and dense <= kernels):
            break
        won = length
    return won


class DustbinTokens(NamedTuple):
    """Learned dustbin tokens, one per head: the dustbin row's query, the dustbin column's key
    and the dustbin column's value."""

    q: jax.Array  # [H, d]
    k: jax.Array  # [H, d]
    v: jax.Array  # [H, dv]


def accelerator(platform: str | None = None) -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"`` for a JAX platform name (default: the default backend)."""
    platform = platform or jax.default_backend()
    if platform == "tpu":
        return "tpu"
    return "gpu" if platform in ("gpu", "cuda", "rocm") else "cpu"


@functools.cache
def pallas_triton() -> bool:
    """Whether this jax has the Pallas Triton backend (the GPU kernels'): deprecated in jax 0.11
    ("to be removed in a future JAX version"), present in 0.12.0.1. Without it the GPU
    kernels are not lowered (``pallas_ops.PallasBandOps.why_no_branch`` says so), ``impl="auto"``
    on a GPU takes the XLA path, and everything else, interpret mode included, runs."""
    try:
        return importlib.util.find_spec("jax.experimental.pallas.triton") is not None
    except ImportError:
        return False


def resolve_impl(impl: str, platform: str | None = None, *, length: int | None = None,
                 steps: int | None = None, fused: bool = True, stored_fits: bool = True) -> str:
    """The one place ``impl="auto"`` is decided: the Pallas kernels on TPU, the banded XLA path
    on CPU (where Pallas would run in interpret mode). On GPU, ``GPU_BANDED_IMPL``, and dense
    autodiff for problems shorter than ``GPU_DENSE_CROSSOVER`` (``length`` = the longer
    sequence; a None crossover or length keeps the banded path); ``GPU_LOOPED_IMPL`` (dense
    below ``GPU_LOOPED_CROSSOVER``) where the banded variant's fused steps do not apply
    (``fused`` false: an eps schedule, a tolerance, one-pass steps with spokes, the TPU kernels
    forced), its steps are straight-line and ``steps`` (the fixed steps it would unroll) exceeds
    ``GPU_UNROLLED_MAX_STEPS``, its stored band's kernels do not fit this GPU's shared memory
    at the problem's feature widths (``stored_fits`` false: ``pallas_gpu.stored_band_fits``),
    or this jax has no Pallas Triton backend (``pallas_triton``). Other values pass through.
    ``platform`` defaults to this host's backend: a config lowered for another platform from
    here names its impl explicitly. Returns a name of ``IMPL_VARIANTS`` (its settings:
    ``impl_variant``; ``TransportConfig.resolved`` applies them)."""
    if impl != "auto":
        return impl
    kind = accelerator(platform)
    if kind == "cpu":
        return "xla"
    if kind == "gpu":
        banded, crossover = GPU_BANDED_IMPL, GPU_DENSE_CROSSOVER
        variant = IMPL_VARIANTS[banded]
        if (variant.get("fused_steps") and not fused) or \
                (variant.get("unroll") and steps is not None and steps > GPU_UNROLLED_MAX_STEPS) or \
                (variant.get("resident_scores") and not stored_fits) or \
                (variant["impl"] == "pallas" and not pallas_triton()):
            banded, crossover = GPU_LOOPED_IMPL, GPU_LOOPED_CROSSOVER
        if crossover is not None and length is not None and length < crossover:
            return "reference"
        return banded
    return "pallas"


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile edge of the banded layout (rows and columns alike).

    ``block=None`` picks a size from the problem (``band.make_geometry``): one dense tile when
    the band covers the whole padded length or it is at most 128, else 128 (TPU lane width;
    also a good CPU tile); the Pallas paths take a power of two >= 16 up to 128.
    """

    block: int | None = None

    def __post_init__(self):
        if self.block is not None and (self.block < 8 or self.block & (self.block - 1)):
            raise ValueError(f"block must be a power of two >= 8, got {self.block}")


# The transport boundary: below EPS_MIN the float32 log-domain solve no longer separates
# costs of order one (eps = 1e-6 gives rows of mass 2 and confidences above 1); the step
# counts are bounded so that a typo cannot ask for an endless solve.
EPS_MIN, EPS_MAX = 1e-3, 1e6
MAX_STEPS = 100_000


def _interpret_params(value) -> bool:
    """Whether ``value`` is a ``pltpu.InterpretParams`` (the TPU interpreter's settings);
    Pallas's TPU module is imported only to check one (a string "false" must not pass)."""
    from jax.experimental.pallas import tpu as pltpu

    return isinstance(value, pltpu.InterpretParams)


def _schedule(stages) -> tuple[tuple[float, int], ...]:
    """``eps_schedule`` as ``((eps, steps), ...)`` of floats and ints, each stage checked for
    its form: a pair of a real eps and a whole step count (2.5 steps is refused, as it is for
    ``base_steps``, not truncated)."""
    try:
        stages = tuple(stages)
    except TypeError:
        raise ValueError(f"eps_schedule must be ((eps, steps), ...), got {stages!r}") from None
    out = []
    for stage in stages:
        try:
            eps, steps = stage
        except (TypeError, ValueError):
            raise ValueError(f"every stage of eps_schedule must be a pair (eps, steps), got {stage!r}") from None
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
            raise ValueError(f"every eps of eps_schedule must be a number, got {eps!r}")
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral):
            raise ValueError(f"every step count of eps_schedule must be an integer, got {steps!r}")
        from pfamalign.jsonio import MAX_INT  # the bound of every JSON settings integer

        if any(isinstance(x, numbers.Integral) and abs(x) > MAX_INT for x in (eps, steps)):
            # 10**400 overflowed float() in a traceback (and its digits cannot even be printed)
            raise ValueError("eps_schedule holds an integer past 2**53 in size")
        out.append((float(eps), int(steps)))
    return tuple(out)


def _check_eps(eps, name: str) -> None:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not EPS_MIN <= eps <= EPS_MAX:
        raise ValueError(f"{name} must be a number in [{EPS_MIN:g}, {EPS_MAX:g}], got {eps!r}")


@dataclasses.dataclass(frozen=True)
class TransportConfig:
    """Everything that defines the transport plan, apart from the inputs.

    Attributes:
      half_band: W; key j is in query i's support iff |i - j| <= W.
      eps: entropic temperature of the tail (and of the last base stage).
      base_steps: T, full Sinkhorn steps of the stopped (no-gradient) base solve.
      tail_steps: R, differentiable full steps after the base.
      eps_schedule: optional ((eps_1, T_1), ..., (eps_S, T_S)) for the base solve, eps_1 >= ...
        >= eps_S == eps and sum T_s == T. Potentials are carried across stages at fixed
        eps * potential (the usual eps-scaling warm start).
      dustbin: "none", "widened" (append the dustbin tokens and widen the band to the whole
        sequence: dense cost), "spoke" (band + dustbin row + dustbin column + corner, unit
        targets everywhere) or "capacity" (the spoke support with the dustbin row's target
        equal to the active key count and the dustbin column's to the active query count:
        balanced, and any number of residues can go unaligned).
      impl: "auto" (the default: resolved by ``resolve_impl`` when the op runs), "reference"
        (dense autodiff), "xla" (banded, custom VJP) or "pallas".
      adjoint: "one_reference" (every tail plan is a diagonal rescaling of one plan: one exp per
        entry) or "four_plan" (each tail plan exponentiated on its own; the direct baseline).
      blocks: tile sizes of the banded layout.
      interpret: run Pallas kernels in interpret mode (default: when the lowering platform is
        CPU).
      kernel: the Pallas kernel wrapper: "auto" (the default: Mosaic when lowered for TPU,
        Triton for CUDA / ROCm, interpret mode on CPU, chosen per lowering platform), "tpu" or
        "gpu" to force one.
      marginals: which sides are constrained. "balanced" (the default): unit targets on rows
        and columns (Sinkhorn). "rows": each active row sends its target mass over its
        support, columns free: the masked row softmax of ``S / eps`` (softmax as semi-relaxed
        OT). "cols": its transpose.
      relax: with "rows" / "cols", None (free side) or lam > 0: the free side's marginal
        enters as a KL penalty of weight lam (unbalanced Sinkhorn, half steps damped by
        lam / (lam + eps)); lam -> 0 gives the softmax, lam -> inf the balanced plan.
      tol: None (the fixed T-step base: today's plans) or a tolerance: the base iterates until
        both marginal errors (``marginal_errors``) are <= tol, or ``max_steps`` steps; then
        the R tail steps. Each problem stops on its own (batching does not change a plan).
      max_steps: the base's step limit when ``tol`` is set.
      branch_free: False (the default, fastest on CPU): the XLA path's steps run in the
        scaling domain (one multiply-add per band entry and half step, the reference plan
        rebuilt in a loop of zero or one trip when the potentials drift) or, where it cannot, in the
        log domain with one-pass log-sum-exps stabilized by the previous step (the exact form
        behind a ``lax.cond`` when a line drifted). True: log-domain steps whose log-sum-exps
        take a max pass and a sum pass, so the fixed-step loop holds no branch: on a GPU every
        ``lax.cond`` copies its predicate to the host and waits for it, about once per step
        (``scripts/bench_transport.py --impls xla,xla-branch-free`` measures both). The same plans either
        way (to rounding); ``tol`` keeps its data-dependent loop.
      resident_scores: False (the default): the Pallas kernels recompute every score tile from
        q and k in each pass (O(L) memory). True (``impl="pallas"``, GPU and interpret mode;
        not TPU): the masked score band is stored once per call (O(L W) memory, as the XLA
        path; the forward's band is kept for the backward) and the kernels read its tiles: no
        fp32 matmul per entry and pass. The same plans (to rounding).
      unroll: False (the default): the fixed step loops (base, tail, the backward's sweep)
        are loops. True: straight-line steps. On a GPU every loop trip costs a counter
        kernel, a loop that stacks its steps' outputs a write kernel per output and trip, and
        the loop carries copies (``scripts/count_gpu_launches.py`` for an H100 at L 4096:
        156 -> 109 launches with resident scores). Compile time grows with T + R (about 1.5x at T 15, R 2 on CPU), and
        a CPU gains nothing consistent (two runs at L 1024 and 4096 differed in sign). The
        same plans; ``tol``'s data-dependent loop stays a loop.
      fused_steps: False (the default). True (with ``resident_scores``): at one eps (no
        ``eps_schedule``, no ``tol``), each Sinkhorn step is two kernels that compute the
        potentials and the centering themselves, instead of two LSE kernels and two XLA kernels
        between them (``scripts/count_gpu_launches.py``, H100, L 4096: 109 -> 74 launches with
        ``unroll``); with dustbin spokes the kernels also fold each line's dustbin entry into
        its LSE and solve the dustbin lines (from per-block partial LSEs of the other side's),
        so a step stays two kernels (238 -> 92 launches at L 4096). The same plans up to
        rounding (sums and LSEs taken per line block); other problems take the unfused steps.
      one_pass_steps: False (the default). True (with ``fused_steps``; no dustbin spokes: with
        them the unfused steps run): each of those steps
        reads the band once instead of twice, a program holding a few rows of it in registers
        (``pallas_gpu.stored_one_pass_rows``; the column LSE from per-row-group partials).
        Same plans up to rounding. Slower than two passes on an H200 (fwd + bwd at L 16384:
        5.94 ms against 3.75, tf32x3 dots both; README "On a GPU").
      triton_dots: how the Triton kernels compute their f32 dots (the scores, the plan
        products and their modulations; the XLA path and Mosaic are untouched). "ieee" (the
        default): fp32 FMAs. "tf32x3": on tensor cores, as three TF32 products of each
        operand's rounded high part and its remainder (Triton's ``input_precision="tf32x3"``),
        accumulated in fp32: the dots' error stays at fp32's (interpret mode emulates the
        arithmetic: the primitives stay within f32's bounds of float64, the op within 1e-5 of
        dense autodiff; on an H200 every compiled-kernel test passes against float64, and
        the op's gradients are 2.9e-6 from dense autodiff's at L 16384). 1.08x faster than
        "ieee" with fused steps at L 16384, 1.14x at 4096 (H200, 2026-11-29).
    """

    half_band: int
    eps: float = 1.0
    base_steps: int = 15
    tail_steps: int = 2
    eps_schedule: tuple[tuple[float, int], ...] | None = None
    dustbin: str = "none"
    impl: str = "auto"
    adjoint: str = "one_reference"
    blocks: BlockSizes = BlockSizes()
    interpret: bool | None = None
    kernel: str = "auto"
    marginals: str = "balanced"
    relax: float | None = None
    tol: float | None = None
    max_steps: int = 1000
    branch_free: bool = False
    resident_scores: bool = False
    unroll: bool = False
    fused_steps: bool = False
    one_pass_steps: bool = False
    triton_dots: str = "ieee"

    def __post_init__(self):
        if isinstance(self.half_band, bool) or not isinstance(self.half_band, numbers.Integral) or \
                self.half_band < 0:
            raise ValueError(f"half_band (W) must be an integer >= 0, got {self.half_band!r}")
        object.__setattr__(self, "half_band", int(self.half_band))  # a numpy integer as a Python int
        if isinstance(self.blocks, numbers.Integral) and not isinstance(self.blocks, bool):
            object.__setattr__(self, "blocks", BlockSizes(int(self.blocks)))  # blocks=8: the tile edge
        if not isinstance(self.blocks, BlockSizes):
            raise ValueError(f"blocks must be a BlockSizes (or a tile edge, an integer), got {self.blocks!r}")
        _check_eps(self.eps, "eps")
        for name in ("base_steps", "tail_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= MAX_STEPS:
                raise ValueError(f"{name} must be an integer in [0, {MAX_STEPS}], got {value!r}")
        if self.base_steps + self.tail_steps == 0:
            raise ValueError("base_steps + tail_steps must be >= 1: no Sinkhorn step, no plan")
        if self.dustbin not in DUSTBIN_MODES:
            raise ValueError(f"dustbin must be one of {DUSTBIN_MODES}, got {self.dustbin!r}")
        if self.impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {self.impl!r}")
        if self.adjoint not in ADJOINTS:
            raise ValueError(f"adjoint must be one of {ADJOINTS}, got {self.adjoint!r}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.marginals not in MARGINALS:
            raise ValueError(f"marginals must be one of {MARGINALS}, got {self.marginals!r}")
        if not (self.interpret is None or isinstance(self.interpret, bool) or _interpret_params(self.interpret)):
            raise ValueError(f"interpret must be None (when the lowering platform is CPU), True, False "
                             f"or a pltpu.InterpretParams, got {self.interpret!r}")
        if not isinstance(self.branch_free, bool):
            raise ValueError(f"branch_free must be True or False, got {self.branch_free!r}")
        if not isinstance(self.unroll, bool):
            raise ValueError(f"unroll must be True or False, got {self.unroll!r}")
        if not isinstance(self.resident_scores, bool):
            raise ValueError(f"resident_scores must be True or False, got {self.resident_scores!r}")
        if self.resident_scores and self.impl != "pallas":
            raise ValueError(f"resident_scores applies to impl='pallas' (the XLA path always keeps its "
                             f"band), got impl={self.impl!r}")
        if not isinstance(self.fused_steps, bool):
            raise ValueError(f"fused_steps must be True or False, got {self.fused_steps!r}")
        if self.fused_steps and not self.resident_scores:
            raise ValueError("fused_steps needs resident_scores=True (the fused kernels read the stored band)")
        if not isinstance(self.one_pass_steps, bool):
            raise ValueError(f"one_pass_steps must be True or False, got {self.one_pass_steps!r}")
        if self.one_pass_steps and not self.fused_steps:
            raise ValueError("one_pass_steps needs fused_steps=True (it is a way to run those steps)")
        if self.triton_dots not in TRITON_DOTS:
            raise ValueError(f"triton_dots must be one of {TRITON_DOTS}, got {self.triton_dots!r}")
        if self.resident_scores and self.kernel == "tpu":
            raise ValueError("resident_scores has GPU (Triton) kernels only: use kernel='auto' or 'gpu'")
        if self.relax is not None:
            if self.marginals == "balanced":
                raise ValueError("relax needs a free side: marginals='rows' or 'cols'")
            if not 0 < self.relax < float("inf"):  # inf: the balanced side, marginals="balanced"
                raise ValueError(f"relax (the KL weight lam) must be finite and > 0, or None, got {self.relax!r} "
                                 "(lam -> inf is the prescribed side: use marginals='balanced')")
        if self.tol is not None:
            if not self.tol > 0:
                raise ValueError(f"tol must be > 0 or None, got {self.tol!r}")
            if self.eps_schedule is not None:
                raise ValueError("tol solves at one eps: use eps_schedule=None with tol")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, numbers.Integral) or \
                not 1 <= self.max_steps <= MAX_STEPS:
            raise ValueError(f"max_steps must be an integer from 1 to {MAX_STEPS}, got {self.max_steps!r}")
        if self.eps_schedule is not None:
            sched = _schedule(self.eps_schedule)
            object.__setattr__(self, "eps_schedule", sched)
            if not sched:
                raise ValueError("eps_schedule must not be empty (use None for a constant eps)")
            for e, _ in sched:
                _check_eps(e, "every eps of eps_schedule")
            if any(t < 0 for _, t in sched):
                raise ValueError(f"eps_schedule needs steps >= 0, got {sched}")
            if any(a < b for (a, _), (b, _) in zip(sched, sched[1:])):
                raise ValueError(f"eps_schedule must be non-increasing, got {sched}")
            if abs(sched[-1][0] - self.eps) > 1e-12 * max(1.0, self.eps):
                raise ValueError(f"eps_schedule must end at eps={self.eps}, got {sched}")
            if sum(t for _, t in sched) != self.base_steps:
                raise ValueError(
                    f"eps_schedule steps sum to {sum(t for _, t in sched)}, "
                    f"but base_steps (T) is {self.base_steps}"
                )

    def to_dict(self) -> dict:
        """Plain JSON-able fields (a model directory's config.json stores them)."""
        out = dataclasses.asdict(self)  # blocks too: {"block": ...}
        if self.eps_schedule is not None:
            out["eps_schedule"] = [list(s) for s in self.eps_schedule]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "TransportConfig":
        """The inverse of ``to_dict`` (a bad field is a ValueError: configs come from files)."""
        from pfamalign import jsonio

        data = jsonio.check_fields(cls, data, "TransportConfig")
        if "half_band" not in data:
            raise ValueError("TransportConfig: missing field half_band")
        blocks = data.get("blocks")
        if blocks is not None:
            blocks = jsonio.check_fields(BlockSizes, blocks, "TransportConfig.blocks")
            data["blocks"] = BlockSizes(**blocks)
        schedule = data.get("eps_schedule")
        if schedule is not None:
            if not (isinstance(schedule, (list, tuple)) and all(
                    isinstance(s, (list, tuple)) and len(s) == 2 for s in schedule)):
                raise ValueError(f"TransportConfig: eps_schedule must be [[eps, steps], ...], "
                                 f"got {schedule!r}")
            data["eps_schedule"] = tuple(tuple(s) for s in schedule)
        return cls(**data)

    def resolved_impl(self, platform: str | None = None, *, length: int | None = None,
                      features: tuple[int, int] | None = None) -> str:
        """The name (``IMPL_VARIANTS``) of the implementation that runs this config
        (``resolve_impl``; ``length``: the longer sequence, for its size rule; ``features``:
        the widths (d, dv) of q / k and v, for the GPU kernels' shared memory)."""
        # a base run to a tolerance is a loop whatever the variant: only the tail is unrolled
        steps = self.tail_steps if self.tol is not None else self.base_steps + self.tail_steps
        fused = self.fusable() and self.kernel != "tpu"  # the stored band has Triton kernels only
        stored_fits = True
        if self.impl == "auto" and features is not None and length is not None and accelerator(platform) == "gpu":
            from pfamalign.kernels import pallas_gpu
            from pfamalign.kernels.band import make_geometry

            geom = make_geometry(length, self.half_band, self.blocks.block, pallas=True)
            stored_fits = pallas_gpu.stored_band_fits(geom, *features, self.tail_steps)
        return resolve_impl(self.impl, platform, length=length, steps=steps, fused=fused, stored_fits=stored_fits)

    def fusable(self) -> bool:
        """Whether ``fused_steps`` apply to this problem (``sinkhorn.solve``): one eps, no
        tolerance, and for ``one_pass_steps`` no dustbin spokes; other problems take the
        unfused steps."""
        spokes = self.dustbin not in ("none", "widened")
        return self.eps_schedule is None and self.tol is None and not (self.one_pass_steps and spokes)

    def resolved(self, platform: str | None = None, *, length: int | None = None,
                 features: tuple[int, int] | None = None) -> "TransportConfig":
        """This config with ``impl="auto"`` replaced by the implementation that runs it
        (``resolved_impl``) and that variant's settings."""
        impl = self.resolved_impl(platform, length=length, features=features)
        return self if impl == self.impl else dataclasses.replace(self, **impl_variant(impl))

    def dense_reference(self) -> "TransportConfig":
        """The same problem solved by dense autodiff (``impl="reference"``): every setting an
        implementation variant names (``IMPL_VARIANTS``), and the tile sizes, back at their
        defaults, so checking a variant against it needs no list of the variant's settings."""
        names = {name for variant in IMPL_VARIANTS.values() for name in variant} | {"blocks"}
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in names}
        return dataclasses.replace(self, **{**defaults, "impl": "reference"})

    def damping(self) -> tuple[float, float]:
        """(kappa_rows, kappa_cols): each half step is ``kappa (log target - LSE)``. 1 on a
        constrained side, 0 on a free one, lam / (lam + eps) on a KL-relaxed one."""
        free = 0.0 if self.relax is None else self.relax / (self.relax + self.eps)
        return {"balanced": (1.0, 1.0), "rows": (1.0, free), "cols": (free, 1.0)}[self.marginals]

    def centered(self) -> bool:
        """Whether steps move the rows' mean potential into the columns. Only a balanced
        problem has that gauge freedom; with a damped side a constant shift changes the plan."""
        return self.marginals == "balanced"

    def base_stages(self) -> tuple[tuple[float, int], ...]:
        """The base solve as (eps, steps) stages."""
        if self.eps_schedule is None:
            return ((float(self.eps), self.base_steps),)
        return self.eps_schedule
