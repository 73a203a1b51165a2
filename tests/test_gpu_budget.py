"""The Triton kernels' shared-memory budget model (``kernels.gpu_budget``), on this CPU host:

- the model bounds the one real figure we have (H100, 128-wide tiles, 2 stages: 295,424 bytes
  requested) and predicts that failure;
- every kernel shape the benchmark (``scripts/bench_transport.py``) and the training
  configurations reach — collected by tracing the op's forward and gradient — gets a tiling
  that fits the H100, A100 and consumer budgets;
- the lowered Triton call carries the chosen tile edge, ``num_warps`` and ``num_stages``;
- where PyPI ``triton`` is installed (the test extra installs it on Linux x86_64; the tests
  skip without it), Triton compiles the lowered IR for sm_90 / sm_80 / sm_86 on this CPU host:
  main's old tiling asks for exactly the 295,424 bytes the H100 refused, every chosen tiling
  fits, below the model, and no chosen tiling spills registers (read from the cubin).
"""

from __future__ import annotations

import functools
import pathlib
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pfamalign import configs
from pfamalign.kernels import TransportConfig, gpu_budget, pallas_gpu, pallas_ops, transport, triton_offline
from pfamalign.kernels.band import make_geometry
from pfamalign.kernels.gpu_budget import SMEM_BUDGET, GpuTiling, KernelShape

H100_REQUESTED = 295_424  # bytes, "Shared memory size limit exceeded" on main's tiling
H100_AVAILABLE = 232_448
# The largest kernel of that benchmark: the backward's modulated product, d = dv = 64, R = 2.
BENCH_MODULATED = KernelShape(d=64, m=64, mx=64 + 2 * 2)


def test_budgets_are_the_devices_opt_in_maxima():
    assert SMEM_BUDGET["h100"] == H100_AVAILABLE
    assert SMEM_BUDGET == {"h100": 227 * 1024, "a100": 163 * 1024, "consumer": 99 * 1024}


def test_model_bounds_and_predicts_the_h100_failure():
    modelled = gpu_budget.smem_bytes(BENCH_MODULATED, block=128, num_stages=2)
    assert modelled >= H100_REQUESTED
    assert modelled > SMEM_BUDGET["h100"]  # main's fixed tiling is refused, as on the H100


def test_model_grows_with_every_argument():
    base = gpu_budget.smem_bytes(KernelShape(32, 32, 32), 64, 2)
    assert gpu_budget.smem_bytes(KernelShape(32, 32, 32), 128, 2) > base
    assert gpu_budget.smem_bytes(KernelShape(32, 32, 32), 64, 3) > base
    assert gpu_budget.smem_bytes(KernelShape(64, 32, 32), 64, 2) > base
    assert gpu_budget.smem_bytes(KernelShape(32, 64, 32), 64, 2) > base
    assert gpu_budget.smem_bytes(KernelShape(32, 32, 64), 64, 2) > base
    assert gpu_budget.smem_bytes(KernelShape(32, 32, 32), 64, 2, itemsize=2) < base


def test_choice_keeps_large_tiles_where_they_fit_and_shrinks_where_not():
    lse = gpu_budget.choose(KernelShape(64), 128, SMEM_BUDGET["h100"], max_edge=128)
    assert (lse.block, lse.num_stages, lse.num_warps) == (128, 2, 8)
    big = gpu_budget.choose(BENCH_MODULATED, 128, SMEM_BUDGET["h100"], max_edge=128)
    assert big.block < 128
    assert gpu_budget.smem_bytes(BENCH_MODULATED, big.block, big.num_stages) <= SMEM_BUDGET["h100"]
    # The next larger tile, or the next deeper pipeline, would not fit.
    assert gpu_budget.smem_bytes(BENCH_MODULATED, 2 * big.block, 1) > SMEM_BUDGET["h100"]
    if big.num_stages < gpu_budget.STAGES[0]:
        assert gpu_budget.smem_bytes(BENCH_MODULATED, big.block, big.num_stages + 1) > SMEM_BUDGET["h100"]


@pytest.mark.parametrize("shape", [KernelShape(64), KernelShape(64, 64), KernelShape(64, 1), BENCH_MODULATED])
def test_choice_caps_the_edge_where_registers_spill(shape):
    """Shared memory would allow wider tiles on an H100; the register cap (the fastest tiling
    measured there) keeps 32-wide tiles with 4 warps, and narrower band tilings as they are."""
    assert gpu_budget.choose(shape, 128, SMEM_BUDGET["h100"]) == GpuTiling(32, 4, 2)
    assert gpu_budget.choose(shape, 16, SMEM_BUDGET["h100"]).block == 16


def test_choice_refuses_when_nothing_fits():
    with pytest.raises(ValueError, match="fits 1000 bytes"):
        gpu_budget.choose(KernelShape(64, 64, 64), 128, 1000)


@pytest.mark.parametrize("cc, device_class", [("9.0", "h100"), ("8.0", "a100"), ("8.6", "consumer"),
                                              ("8.9", "consumer")])
def test_device_budget_by_compute_capability(cc, device_class):
    device = types.SimpleNamespace(compute_capability=cc)
    assert gpu_budget.device_budget(device) == SMEM_BUDGET[device_class]


def test_without_a_gpu_the_budget_fits_every_device():
    if jax.default_backend() == "gpu":
        pytest.skip("this host has a GPU")
    assert gpu_budget.device_budget() == min(SMEM_BUDGET.values())


# ---- every shape the benchmark and the training configurations use ------------------------------


def _trace_shapes(cfg: TransportConfig, *, lq, lk, h, d, dv, monkeypatch) -> set:
    """(band tile edge, KernelShape) of every Triton kernel call in the op's forward + gradient."""
    seen = set()
    real = pallas_gpu.tiling

    def record(geom, shape):
        seen.add((geom.block, shape))
        return real(geom, shape)

    monkeypatch.setattr(pallas_gpu, "tiling", record)
    jax.clear_caches()  # a problem traced before (another config, same op) must be traced again
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    tokens = (f32(h, d), f32(h, d), f32(h, dv))
    lens = jnp.array([min(lq, lk)])

    def loss(q, k, v, t):
        return jnp.sum(transport(q, k, v, lens, lens, t if cfg.dustbin != "none" else None, config=cfg))

    jax.eval_shape(jax.grad(loss, (0, 1, 2, 3)), f32(1, h, lq, d), f32(1, h, lk, d), f32(1, h, lk, dv), tokens)
    return seen


def _bench_cases():
    """scripts/bench_transport.py: d = dv = 64, T = 15, R = 2, W = 256 (1024 from L = 16384);
    the kernels that recompute scores and those that read a stored band."""
    for length, w in ((1024, 256), (16384, 1024)):
        for resident in (False, True):
            cfg = TransportConfig(half_band=w, tail_steps=2, impl="pallas", resident_scores=resident)
            yield f"bench-L{length}" + ("-resident" if resident else ""), cfg, length, 1, 64, 64


def _train_cases():
    """Every named training configuration at its own heads, d, dv, R, dustbin and W."""
    for name in configs.CONFIG_NAMES:
        run = configs.get_config(name, embedder_id="builtin/onehot+blosum62", feature_dim=50)
        m = run.model
        for resident in (False, True):
            cfg = TransportConfig.from_dict({**m.transport.to_dict(), "impl": "pallas",
                                             "resident_scores": resident})
            yield name + ("-resident" if resident else ""), cfg, 1024, m.heads, m.head_dim, m.value_dim


CASES = {name: rest for name, *rest in (*_bench_cases(), *_train_cases())}


@pytest.fixture(scope="module")
def used_shapes():
    mp = pytest.MonkeyPatch()
    try:
        # Configurations that differ only outside the op (align_attn and align_ce) pose the same
        # problem: traced once, since jax's trace cache would not call the recorder again.
        traced = {}
        for cfg, length, h, d, dv in CASES.values():
            if (cfg, length, h, d, dv) not in traced:
                traced[cfg, length, h, d, dv] = _trace_shapes(cfg, lq=length, lk=length, h=h, d=d,
                                                              dv=dv, monkeypatch=mp)
        return {name: traced[tuple(case)] for name, case in CASES.items()}
    finally:
        mp.undo()


@pytest.mark.parametrize("device_class", sorted(SMEM_BUDGET))
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_used_kernel_shape_fits(case, device_class, used_shapes):
    shapes = used_shapes[case]
    assert any(s.mx for _, s in shapes) and any(not s.m for _, s in shapes)  # products and LSEs seen
    budget = SMEM_BUDGET[device_class]
    for block, shape in shapes:
        t = gpu_budget.choose(shape, block, budget)
        assert t.block >= gpu_budget.MIN_DOT and block % t.block == 0
        assert gpu_budget.smem_bytes(shape, t.block, t.num_stages) <= budget, (shape, t)


def test_bench_reaches_the_h100_failing_shape(used_shapes):
    assert (128, BENCH_MODULATED) in used_shapes["bench-L1024"]


# ---- the lowered Triton call carries the choice, and Triton agrees ------------------------------


def _lower_triton(shape: KernelShape, geom, n: int = 1, transposed: bool = False, dots: str = "ieee",
                  form: str = "product"):
    """The Triton kernel for ``shape`` lowered for "cuda" on the band tiling ``geom``: an LSE
    when ``shape.m == 0``, else a product; with ``shape.stored`` the stored-band kernels (the
    scores kernel when ``shape.d``; ``transposed``: the column walk) at the stored tiling, a
    stored product in ``form`` "product", "keep_band" (modulated, rows: the gradient's) or
    "linear" (unmodulated: ``stored_linear_product``, the same shape); ``dots``: the dots'
    arithmetic (``TransportConfig.triton_dots``). Returns (StableHLO text, the custom call's config)."""
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    static = {}
    geom = pallas_gpu.stored_geometry(geom) if shape.stored else geom
    lp = geom.length
    if shape.stored:
        band = f32(n, lp, geom.n_diag * geom.block)
        if shape.d:
            fn, specs = pallas_gpu.band_scores, [f32(n, lp, shape.d)] * 2 + [f32(n, lp)] * 2
        elif not shape.m:
            fn, specs, static = pallas_gpu.stored_lse, [band, f32(n, lp), f32(n, lp)], {"transposed": transposed}
        elif form == "linear":
            fn, specs, static = pallas_gpu.stored_linear_product, [band, f32(n, lp, shape.m)], {"transposed": transposed}
        else:
            fn, static = pallas_gpu.stored_product, {"transposed": transposed, "keep_band": form == "keep_band"}
            specs = [band, f32(n, lp), f32(n, lp), f32(n, lp), f32(n, lp, shape.m)]
            specs += [f32(n, lp, shape.mx)] * 2 if shape.mx else []
    elif not shape.m:
        fn, specs = pallas_gpu.band_lse, [f32(n, lp, shape.d)] * 2 + [f32(n, lp)]
    else:
        fn = pallas_gpu.band_product
        specs = [f32(n, lp, shape.d)] * 2 + [f32(n, lp)] * 2 + [f32(n, lp, shape.m)]
        specs += [f32(n, lp, shape.mx)] * 2 if shape.mx else []
    # The undecorated function: a monkeypatched budget must reach a fresh trace.
    if fn.__name__ in pallas_ops.DOT_KERNELS:
        static["dots"] = dots
    f = functools.partial(fn.__wrapped__, geom=geom, interpret=False, **static)
    lowered = pallas_ops.lower(jax.jit(f), "cuda", *specs)
    (call,) = triton_offline.custom_calls(lowered)
    return lowered.as_text(), call.attributes["mhlo.backend_config"]


@pytest.mark.parametrize("device_class", sorted(SMEM_BUDGET))
def test_lowered_triton_call_uses_the_chosen_tiling(device_class, monkeypatch):
    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: SMEM_BUDGET[device_class])
    geom = make_geometry(1024, 256, pallas=True)
    text, _ = _lower_triton(BENCH_MODULATED, geom, n=2)
    want = gpu_budget.choose(BENCH_MODULATED, geom.block, SMEM_BUDGET[device_class])
    assert f"num_warps = {want.num_warps} : i32" in text
    assert f"num_stages = {want.num_stages} : i32" in text
    assert f"grid_y = {geom.length // want.block} : i32" in text  # one program per re-tiled row block


def _triton_compile(config, cc: int, tmp_path) -> triton_offline.Compiled:
    """The lowered kernel compiled for ``sm_<cc>`` with the call's own num_warps and
    num_stages (``triton_offline.compile_call``): shared memory, registers, spills."""
    pytest.importorskip("triton", reason="PyPI triton compiles the lowered IR on CPU")
    return triton_offline.compile_call(config, cc, tmp_path)


@pytest.mark.slow  # ptxas takes ~90 s on this kernel (128-wide tiles spill heavily)
def test_triton_reproduces_the_h100_failure(monkeypatch, tmp_path):
    """main's fixed tiling (128-wide, 4 warps, 2 stages) of the benchmark's modulated product,
    compiled for sm_90 here as the kernels were then (the modulation padded to a power of two:
    ``pallas_gpu.PADDED_DOTS``), asks for exactly the bytes the H100 refused."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setattr(pallas_gpu, "PADDED_DOTS", True)  # read at trace time (a fresh trace here)
    monkeypatch.setattr(pallas_gpu, "tiling", lambda geom, shape: (geom, gpu_budget.GpuTiling(128, 4, 2)))
    _, config = _lower_triton(BENCH_MODULATED, make_geometry(1024, 256, pallas=True))
    assert _triton_compile(config, 90, tmp_path).shared == H100_REQUESTED


@pytest.mark.parametrize("device_class, cc", [
    ("h100", 90), pytest.param("a100", 80, marks=pytest.mark.slow), pytest.param("consumer", 86, marks=pytest.mark.slow)])
@pytest.mark.parametrize("shape", [KernelShape(64), KernelShape(64, 64), KernelShape(64, 2), BENCH_MODULATED,
                                   KernelShape(32, 32, 36), KernelShape(64, 16, 20)], ids=str)
def test_triton_allocation_fits_and_is_bounded_by_the_model(shape, device_class, cc, monkeypatch, tmp_path):
    """The chosen tiling, compiled by Triton for the device's architecture: its real shared
    memory is within the device's budget and below the model's figure."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    budget = SMEM_BUDGET[device_class]
    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: budget)
    geom = make_geometry(1024, 256, pallas=True)
    chosen = gpu_budget.choose(shape, geom.block, budget)
    _, config = _lower_triton(shape, geom)
    shared = _triton_compile(config, cc, tmp_path).shared
    assert 0 < shared <= gpu_budget.smem_bytes(shape, chosen.block, chosen.num_stages) <= budget


@pytest.fixture(scope="module")
def compiled_sm90(tmp_path_factory):
    """{(band edge, shape, transposed): Compiled} for sm_90 at the H100 budget, compiled once."""
    pytest.importorskip("triton", reason="PyPI triton compiles the lowered IR on CPU")
    cache = {}
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    mp.setattr(gpu_budget, "device_budget", lambda device=None: SMEM_BUDGET["h100"])

    def get(block, shape, transposed=False, form="product"):
        key = (block, shape, transposed, form)
        if key not in cache:
            geom = make_geometry(1024, 256, block, pallas=True)
            _, config = _lower_triton(shape, geom, transposed=transposed, form=form)
            cache[key] = _triton_compile(config, 90, tmp_path_factory.mktemp("triton"))
        return cache[key]

    yield get
    mp.undo()


@pytest.mark.parametrize("case", [c if c.startswith("bench") else pytest.param(c, marks=pytest.mark.slow)
                                  for c in sorted(CASES)])
def test_no_chosen_tiling_spills_registers(case, used_shapes, compiled_sm90):
    """Every kernel shape the benchmark and the training configurations use, at the tiling
    ``gpu_budget`` chooses on an H100, compiled for sm_90: no register spills (a spill cost
    the recomputing kernels 10-30x on the H100; see the module docstring of gpu_budget). The
    stored-band kernels are compiled in both walks, and a stored product's shape also in the
    form the gradient takes it (``StoredBandOps.modulated_products``): modulated, keeping its
    band (rows); unmodulated, the linear product of that band (columns)."""
    for block, shape in sorted(used_shapes[case], key=str):
        forms = [(t, "product") for t in ((False, True) if shape.stored and not shape.d else (False,))]
        if shape.stored and shape.m and not shape.d:
            forms.append((False, "keep_band") if shape.mx else (True, "linear"))
        for transposed, form in forms:
            got = compiled_sm90(block, shape, transposed, form)
            assert got.stack == 0, (block, shape, transposed, form, got)


@pytest.mark.slow
def test_stored_modulated_product_warps_follow_the_sass(monkeypatch, tmp_path):
    """Why ``num_warps`` gives the stored-band products 4 warps up to ``LIVE_PER_THREAD`` and 8
    past it (the module docstring's table): the benchmark's gradient product (64 / 68, keeping
    its band) at 8 warps issues more shared-memory cycles a tile than at 4 (its 32-row tile's
    operands replicated across warps: 1.9x with "tf32x3" dots, 1.4x with "ieee"), without a
    spill at 4; the wider 128 / 132 spills at 4 warps on the one-stage tiling of a smaller
    budget, and not at 8."""
    pytest.importorskip("triton", reason="PyPI triton compiles the lowered IR on CPU")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    geom = make_geometry(1024, 256, pallas=True)
    bench, wide = KernelShape(0, 64, 68, stored=True), KernelShape(0, 128, 132, stored=True)
    assert gpu_budget.choose(bench, 32, SMEM_BUDGET["h100"]).num_warps == 4
    assert gpu_budget.choose(wide, 32, SMEM_BUDGET["h100"]).num_warps == 8

    def compiled(shape, warps, stages, form, dots="ieee"):
        monkeypatch.setitem(pallas_gpu.FORCED_TILING, shape, GpuTiling(32, warps, stages))
        _, config = _lower_triton(shape, geom, form=form, dots=dots)
        return _triton_compile(config, 90, tmp_path / f"{shape.m}-{warps}-{stages}-{form}-{dots}")

    smem = lambda got: triton_offline.pipe_cycles(triton_offline.sass_work(got.sass).body, got.num_warps, 8.0)["smem"]
    for dots, ratio in (("tf32x3", 1.7), ("ieee", 1.3)):
        four, eight = (compiled(bench, warps, 2, "keep_band", dots) for warps in (4, 8))
        assert four.stack == 0 and smem(eight) > ratio * smem(four), dots
    assert compiled(wide, 4, 1, "keep_band").stack > 0 and compiled(wide, 8, 1, "keep_band").stack == 0


def test_retiled_kernels_match_the_band_tiling_in_interpret_mode(monkeypatch):
    """A product and an LSE at a budget that forces 32-wide tiles under a 128-wide band tiling
    agree with the unconstrained tiling (interpret mode, same code path as compiled)."""
    geom = make_geometry(256, 40, pallas=True)
    rng = np.random.default_rng(0)
    arr = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    # Positive y, x, z: no cancellation, so a re-ordered sum agrees to f32 rounding.
    q, k = arr(1, 256, 16) * 0.25, arr(1, 256, 16)
    y, x, z = (jnp.abs(arr(1, 256, m)) for m in (8, 4, 4))
    a, c = arr(1, 256) * 0.1, arr(1, 256) * 0.1

    def run():
        f = functools.partial(pallas_gpu.band_product.__wrapped__, geom=geom, interpret=True)
        g = functools.partial(pallas_gpu.band_lse.__wrapped__, geom=geom, interpret=True)
        return np.asarray(f(q, k, a, c, y, x, z)), np.asarray(g(q, k, c))

    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: 10**9)
    monkeypatch.setattr(gpu_budget, "MAX_EDGE", 128)
    assert pallas_gpu.tiling(geom, KernelShape(16, 8, 4))[0].block > 32
    wide = run()
    small = gpu_budget.smem_bytes(KernelShape(16, 8, 4), 32, 2)
    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: small)
    assert pallas_gpu.tiling(geom, KernelShape(16, 8, 4))[0].block == 32
    narrow = run()
    np.testing.assert_allclose(narrow[0], wide[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(narrow[1], wide[1], rtol=1e-6, atol=1e-6)


def _lower_half_step(kernel: str, shifted: bool, geom):
    """The custom call's config of ``fused_steps``' half step ``kernel`` (centered) on the
    stored tiling ``geom``, lowered for "cuda"; ``shifted``: given the previous potentials."""
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    lp, band = geom.length, f32(1, geom.length, geom.n_diag * geom.block)
    specs = {"stored_row_half": [band, f32(1, lp), f32(1, lp), f32(1, lp)],
             "stored_col_half": [band, f32(1, lp), f32(1, lp), f32(1, geom.n_blocks), f32(1, lp)]}[kernel]
    specs = specs + [f32(1, lp)] if shifted else specs  # the lines' previous potential
    f = functools.partial(getattr(pallas_gpu, kernel).__wrapped__, geom=geom, kappa=1.0, centered=True,
                          interpret=False)
    lowered = pallas_ops.lower(jax.jit(f), "cuda", *specs)
    (call,) = triton_offline.custom_calls(lowered)
    return call.attributes["mhlo.backend_config"]


def _bytes_loaded_before_first_exp(sass: str) -> int:
    """Global-memory bytes a thread loads in the SASS's first loop before its first
    exponential (``MUFU.EX2``): the loads a trip has in flight while it waits on the first."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in
           (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?(.*?)\s*;", line) for line in sass.splitlines()) if m]
    loops = [(int(t.group(1), 16), addr) for addr, text in ins
             if (t := re.match(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)) and int(t.group(1), 16) < addr]
    lo, hi = min(loops)
    total = 0
    for addr, text in ins:
        if lo <= addr <= hi:
            if text.startswith("MUFU.EX2"):
                return total
            load = re.match(r"LDG\.E(?:\.(\d+))?\b", text)
            total += int(load.group(1) or 32) // 8 if load else 0
    raise AssertionError("no exponential in the first loop")


@pytest.mark.parametrize("kernel", sorted(pallas_gpu.STREAMING_KERNELS))
def test_streaming_walks_keep_their_trips_tiles_in_flight(kernel, monkeypatch, tmp_path):
    """The streaming walks (``pallas_gpu.STREAMING_KERNELS``) at the benchmark's largest band
    (L 16384, W 1024), compiled for sm_90 here: a main-loop trip issues the loads of all its
    ``STREAMING_TILES_A_TRIP`` band tiles before its first exponential, so that a program has
    that many tiles in flight (one tile a trip, as before 2026-11-29, or a row walk's second
    tile loaded apart: ptxas issued it after the first tile's exponentials). No spills."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: SMEM_BUDGET["h100"])
    geom = make_geometry(16384, 1024, pallas=True)
    if kernel.endswith("_half"):
        config = _lower_half_step(kernel, True, pallas_gpu.stored_geometry(geom))
    else:  # stored_{rows,cols}_{lse,vector_product}
        shape = KernelShape(0, 0 if kernel.endswith("lse") else 1, stored=True)
        config = _lower_triton(shape, geom, transposed=kernel.startswith("stored_cols"))[1]
    got = _triton_compile(config, 90, tmp_path)
    assert f"Function : {kernel}\n" in got.sass  # the kernel named
    assert got.stack == 0, got
    block = pallas_gpu.stored_geometry(geom).block
    tiles = pallas_gpu.tiles_a_trip(kernel)
    assert tiles == pallas_gpu.STREAMING_TILES_A_TRIP > 1
    tile_bytes = block * block * 4 // (32 * got.num_warps)  # a thread's share of one band tile
    assert _bytes_loaded_before_first_exp(got.sass) >= tiles * tile_bytes, kernel


@pytest.mark.parametrize("shifted", [False, True], ids=["exact", "shifted"])
@pytest.mark.parametrize("kernel", ["stored_row_half", "stored_col_half"])
def test_fused_half_step_kernels_compile_within_budget_without_spills(kernel, shifted, monkeypatch, tmp_path):
    """``fused_steps``' two kernels (centered: the row block shares, the centering loop) at the
    benchmark's largest band (L 16384, W 1024, the stored 32-wide tiles), compiled by Triton
    for sm_90 here: within the H100's shared memory and the stored LSE's model, no spills.
    ``shifted``: given the previous potentials, the one-pass walk with the exact one as its
    fallback (two loops, the first the shorter: ``_shifted_walk_lse``)."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: SMEM_BUDGET["h100"])
    geom = pallas_gpu.stored_geometry(make_geometry(16384, 1024, pallas=True))
    got = _triton_compile(_lower_half_step(kernel, shifted, geom), 90, tmp_path)
    chosen = gpu_budget.choose(KernelShape(0, stored=True), geom.block, SMEM_BUDGET["h100"])
    assert 0 < got.shared <= gpu_budget.smem_bytes(KernelShape(0, stored=True), chosen.block, chosen.num_stages)
    assert got.stack == 0, got
    loops = triton_offline.sass_work(got.sass, "first"), triton_offline.sass_work(got.sass)
    if shifted:  # the one-pass walk's loop is the first and the shorter (the exact walk's follows)
        assert sum(loops[0].body.values()) < sum(loops[1].body.values())
    else:
        assert loops[0].body == loops[1].body


@pytest.mark.parametrize("kernel", ["stored_one_pass_rows", "stored_one_pass_combine"])
@pytest.mark.parametrize("length, half_band", [(4096, 256), (16384, 1024)])
def test_one_pass_step_kernels_compile_without_spills(kernel, length, half_band, monkeypatch, tmp_path):
    """``one_pass_steps``' two kernels (centered) at the benchmark's bands, compiled by Triton
    for sm_90 here at ``gpu_budget.one_pass_launch``'s rows and warps: the rows kernel holds
    its band rows in registers (read once, used by both of its reductions) without spilling."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    geom = pallas_gpu.stored_geometry(make_geometry(length, half_band, pallas=True))
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    lp, width, pad = geom.length, geom.n_diag * geom.block, pallas_gpu.one_pass_pad(geom)
    group, warps = gpu_budget.one_pass_launch(width, geom.block)
    if kernel == "stored_one_pass_rows":
        specs = [f32(1, lp, width), f32(1, lp), f32(1, lp + 2 * pad), f32(1, lp + 2 * pad), f32(1, lp)]
    else:
        specs = [f32(1, lp // group, width), f32(1, lp), f32(1, lp // group), f32(1, lp)]
    f = functools.partial(getattr(pallas_gpu, kernel).__wrapped__, geom=geom, kappa=1.0, centered=True,
                          interpret=False)
    lowered = pallas_ops.lower(jax.jit(f), "cuda", *specs)
    (call,) = triton_offline.custom_calls(lowered)
    got = _triton_compile(call.attributes["mhlo.backend_config"], 90, tmp_path)
    assert got.stack == 0, got
    assert got.shared <= SMEM_BUDGET["consumer"], got
    if kernel == "stored_one_pass_rows":
        from jax._src.lib.mlir import ir

        assert ir.IntegerAttr(call.attributes["mhlo.backend_config"]["num_warps"]).value == warps


def test_one_pass_launch_keeps_the_band_rows_within_the_registers_measured():
    """G 8 rows at the fewest warps that hold at most ONE_PASS_PER_THREAD band values a thread;
    fewer rows once 16 warps would not (a W 2048 band)."""
    assert gpu_budget.one_pass_launch(2080, 32) == (8, 16)  # L 16384, W 1024: 33 values a thread
    assert gpu_budget.one_pass_launch(544, 32) == (8, 4)  # L 4096, W 256
    assert gpu_budget.one_pass_launch(4128, 32) == (4, 16)
    assert gpu_budget.one_pass_launch(40, 4)[0] == 4  # interpret mode's small tiles: G divides the edge
    for width in (16, 544, 2080, 4128, 8224):
        group, warps = gpu_budget.one_pass_launch(width, 32)
        assert group * width <= 32 * warps * gpu_budget.ONE_PASS_PER_THREAD and warps in (4, 8, 16)


@pytest.mark.parametrize("shape", [KernelShape(64, stored=True), KernelShape(0, 64, stored=True),
                                   KernelShape(0, 64, 68, stored=True)], ids=str)
def test_tf32x3_kernels_run_on_tensor_cores_without_spills(shape, monkeypatch, tmp_path):
    """``triton_dots="tf32x3"``: the stored band's scores kernel and plan products at the
    benchmark's largest band (L 16384, W 1024), compiled for sm_90 here: tensor-core (HMMA)
    instructions where the "ieee" kernels have none, shared memory within the model, no
    spills."""
    pytest.importorskip("triton", reason="PyPI triton compiles the lowered IR on CPU")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: SMEM_BUDGET["h100"])
    geom = make_geometry(16384, 1024, pallas=True)
    chosen = gpu_budget.choose(shape, pallas_gpu.stored_geometry(geom).block, SMEM_BUDGET["h100"])
    hmma = {}
    for dots in ("ieee", "tf32x3"):
        _, config = _lower_triton(shape, geom, dots=dots)
        (tmp_path / dots).mkdir()
        got = _triton_compile(config, 90, tmp_path / dots)
        assert got.stack == 0, (dots, got.registers)
        assert 0 < got.shared <= gpu_budget.smem_bytes(shape, chosen.block, chosen.num_stages), dots
        work = triton_offline.sass_work(got.sass)
        hmma[dots] = sum(n for op, n in (work.body + work.rest).items() if op.startswith("HMMA"))
    assert hmma["ieee"] == 0 < hmma["tf32x3"]


# ---- the SASS's static work (scripts/triton_static_cost.py) ------------------------------------

_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDS.128 R4, [R2] ;
        /*0020*/                   FFMA R8, R4, R5, R8 ;
        /*0030*/                   LDSM.16.M88.4 R12, [R3] ;
        /*0040*/                   HMMA.1688.F32.TF32 R16, R12, R14, R16 ;
        /*0050*/                   MUFU.EX2 R9, R9 ;
        /*0060*/               @!P2 BRA 0x10 ;
        /*0070*/                   EXIT ;
        /*0080*/                   BRA 0x80;
        /*0090*/                   NOP;
"""


def test_sass_work_splits_the_main_loop_from_the_rest():
    work = triton_offline.sass_work(_SASS)
    assert work.has_loop
    assert work.body == {"LDS.128": 1, "FFMA": 1, "LDSM.16.M88.4": 1, "HMMA.1688.F32.TF32": 1, "MUFU.EX2": 1, "BRA": 1}
    assert work.rest == {"MOV": 1, "EXIT": 1}  # the final self-branch and NOPs are not work
    assert not triton_offline.sass_work(_SASS.replace("@!P2 BRA 0x10", "@!P2 BRA 0x70")).has_loop


def test_pipe_cycles_of_a_warp_program():
    work = triton_offline.sass_work(_SASS)
    cycles = triton_offline.pipe_cycles(work.body, num_warps=4, hmma_cycles=8.0)
    # 6 instructions x 4 warps over 4 schedulers; LDS.128 = 512 bytes (4 cycles) + ldmatrix x4
    # (4 cycles) a warp; one MUFU (2 cycles) and one HMMA (8 cycles on a quarter) a warp.
    assert cycles == {"issue": 6.0, "smem": 32.0, "mufu": 8.0, "hmma": 8.0}


def test_static_cost_bounds_the_measured_h100_kernels(monkeypatch):
    """scripts/triton_static_cost.py on the recomputing kernels (``pallas``) at the benchmark's
    largest band, compiled as they ran on the H100 on 2026-11-24 (``as_measured``): the 42
    Triton calls it ran, and a bound below the 47.6 ms they took there, within the calibration
    the script applies. Today's kernels (no padded dots, exp2; two products more: the
    adjoint's line sums) bound lower."""
    pytest.importorskip("triton", reason="PyPI triton compiles the lowered IR on CPU")
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))
    import triton_static_cost as cost

    cfg = TransportConfig(half_band=1024, base_steps=15, tail_steps=2, impl="pallas", kernel="gpu", interpret=False)
    bound = {}
    from pfamalign.kernels import tile_math

    from pfamalign.kernels import sinkhorn

    monkeypatch.setattr(pallas_gpu, "PADDED_DOTS", False)  # restored after the test, as EXP2
    monkeypatch.setattr(tile_math, "EXP2", True)
    monkeypatch.setattr(sinkhorn, "COMPUTED_LINE_SUMS", True)
    for measured_then in (True, False):
        cost.as_measured(measured_then)
        rows = cost.kernel_costs(cfg, 16384, None)
        assert sum(r["calls"] for r in rows) == (42 if measured_then else 44)
        bound[measured_then] = sum(r["calls"] * r["bound_us"] for r in rows) / 1e3
    measured = cost.MEASURED_PALLAS_KERNEL_MS[16384]
    assert bound[True] < measured <= cost.CALIBRATION * bound[True] * 1.01
    assert bound[False] < bound[True]


def test_static_cost_sets_a_gpu_profile_beside_its_rows(tmp_path, capsys):
    """``--profile``: the kernels a GPU profile timed (matched by the name the GPU gives them,
    ``gpu_kernel``) beside their static bound and estimate, summed over a kernel's settings;
    other ops (XLA fusions) left out; a total whose measured / bound is the calibration the
    measured kernels call for. The whole command runs on real static rows at a small L."""
    pytest.importorskip("triton", reason="PyPI triton compiles the lowered IR on CPU")
    import json
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    import triton_static_cost as cost

    rows = [{"gpu_kernel": "stored_row_half", "calls": 17, "bound_us": 40.0, "estimate_us": 50.0},
            {"gpu_kernel": "stored_rows_product", "calls": 1, "bound_us": 50.0, "estimate_us": 250.0},
            {"gpu_kernel": "stored_rows_product", "calls": 2, "bound_us": 25.0, "estimate_us": 25.0}]
    measured = [{"op": "stored_row_half", "calls": 17, "ms": 1.36}, {"op": "fusion.12", "calls": 4, "ms": 0.2},
                {"op": "stored_rows_product", "calls": 3, "ms": 0.6}]
    by = {r["gpu_kernel"]: r for r in cost.against_profile(rows, measured)}
    assert set(by) == {"stored_row_half", "stored_rows_product", "(all measured)"}
    assert by["stored_row_half"]["measured_over_bound"] == pytest.approx(1.36 / 0.68)
    assert by["stored_rows_product"]["bound_ms"] == pytest.approx(0.1)  # 50 + 2 x 25 us
    assert by["stored_rows_product"]["measured_over_estimate"] == pytest.approx(0.6 / 0.3)
    total = by["(all measured)"]
    assert (total["calls"], total["measured_ms"]) == (20, pytest.approx(1.96))
    assert total["measured_over_bound"] == pytest.approx(1.96 / 0.78)
    assert cost.against_profile(rows, [{"op": "fusion.12", "calls": 4, "ms": 0.2}]) == []
    # a kernel launched from two places: two ops of the profile, the second as XLA names a
    # duplicate; one kernel here (matched alone, the 2026-11-30 H200 profile read 0.69x bound)
    split = [{"op": "stored_rows_product", "calls": 1, "ms": 0.4}, {"op": "stored_rows_product__1", "calls": 2, "ms": 0.2}]
    (one, _total) = cost.against_profile(rows, split)
    assert (one["measured_calls"], one["measured_ms"], one["calls"]) == (3, pytest.approx(0.6), 3)

    profile = tmp_path / "profile.jsonl"  # a GPU profile's lines for the variant, at L 256
    profile.write_text("\n".join(json.dumps({"L": 256, "W": 256, "impl": "pallas-fused", "op": op, "calls": n,
                                              "ms": ms}) for op, n, ms in
                                  [("stored_row_half", 17, 0.05), ("band_scores", 1, 0.01), ("copy.3", 2, 0.01)]))
    cost.main(["--impls", "pallas-fused", "--lengths", "256", "--profile", str(profile)])
    lines = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    matched = {r["gpu_kernel"]: r for r in lines if "measured_ms" in r}
    assert set(matched) == {"stored_row_half", "band_scores", "(all measured)"}
    assert matched["stored_row_half"]["calls"] == 17 and matched["(all measured)"]["measured_ms"] == 0.06


@pytest.mark.parametrize("dots", ["ieee", "tf32x3"])
@pytest.mark.parametrize("kernel", ["keep_band", "linear"])
def test_gradient_band_kernels_compile_without_spills(kernel, dots, monkeypatch, tmp_path):
    """The backward's row product that stores ``D = P ∘ <x, z>`` as it walks (``keep_band``)
    and the column walk of D (``stored_linear_product``), at the benchmark's largest band and
    widths (L 16384, W 1024, d = dv = 64, R 2), compiled for sm_90 here: shared memory within
    the model's figure for their shapes, no spills."""
    pytest.importorskip("triton", reason="PyPI triton compiles the lowered IR on CPU")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: SMEM_BUDGET["h100"])
    geom = pallas_gpu.stored_geometry(make_geometry(16384, 1024, pallas=True))
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    lp, width = geom.length, geom.n_diag * geom.block
    if kernel == "keep_band":
        shape = KernelShape(0, BENCH_MODULATED.m, BENCH_MODULATED.mx, stored=True)
        fn = functools.partial(pallas_gpu.stored_product.__wrapped__, keep_band=True)
        specs = [f32(1, lp, width)] + [f32(1, lp)] * 3 + [f32(1, lp, 64), f32(1, lp, 68), f32(1, lp, 68)]
    else:
        shape = KernelShape(0, 64, stored=True)
        fn = functools.partial(pallas_gpu.stored_linear_product.__wrapped__, transposed=True)
        specs = [f32(1, lp, width), f32(1, lp, 64)]
    lowered = pallas_ops.lower(jax.jit(functools.partial(fn, geom=geom, interpret=False, dots=dots)), "cuda", *specs)
    (call,) = triton_offline.custom_calls(lowered)
    got = _triton_compile(call.attributes["mhlo.backend_config"], 90, tmp_path)
    chosen = gpu_budget.choose(shape, geom.block, SMEM_BUDGET["h100"])
    assert got.stack == 0, got.registers
    assert 0 < got.shared <= gpu_budget.smem_bytes(shape, chosen.block, chosen.num_stages)


def test_a_shape_no_tiling_fits_names_the_path_that_runs_it(monkeypatch):
    """Feature widths no Triton tiling holds (d = 256 on a consumer GPU): the error points to
    the XLA path (it suggested resident_scores off, which fails the same way)."""
    from pfamalign.kernels import pallas_gpu

    monkeypatch.setattr(gpu_budget, "device_budget", lambda device=None: SMEM_BUDGET["consumer"])

    geom = make_geometry(1024, 256, pallas=True)
    for shape in (KernelShape(256, 256, 260), KernelShape(0, 256, 260, stored=True)):
        with pytest.raises(ValueError, match="use impl='xla'"):
            pallas_gpu.tiling(geom, shape)
