"""The transport op on TPU and CUDA, checked from this CPU host by lowering (and on a GPU by
``pytest -m gpu``):

- every f32 contraction is pinned to full precision: the StableHLO ``dot_general``s carry
  ``precision = [HIGHEST, HIGHEST]``, the Triton ``tt.dot``s ``inputPrecision = ieee`` and the
  Mosaic ``tpu.matmul``s ``contract_precision<fp32>`` (a control with an unpinned dot shows
  each check can fail);
- the kernel wrapper follows the lowering platform: the whole op (forward and gradient, dustbin
  none / spoke / capacity, a ragged batch) lowered for "tpu" holds the Mosaic kernels and for
  "cuda" the Triton ones, with ``kernel="auto"`` and nothing forced.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib.mlir import ir

from pfamalign.kernels import BlockSizes, DustbinTokens, TransportConfig, config, pallas_gpu, pallas_tpu, tile_math, transport, triton_offline
from pfamalign.kernels.band import make_geometry
from pfamalign.kernels.config import IMPL_VARIANTS, impl_variant
from pfamalign.kernels.pallas_ops import lower

PLATFORMS = ("tpu", "cuda")
KERNEL_CALL = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
OUT_ATOL = 1e-5  # the op's promise against the dense reference, outputs and gradients

# A ragged batch, rectangular: (Lq, Lk, q_len, k_len); B = 2, H = 2.
LQ, LK, Q_LEN, K_LEN = 300, 260, (290, 170), (260, 231)


def _inputs(lq, lk, *, b=2, h=2, d=32, dv=16, seed=0):
    rng = np.random.default_rng(seed)
    arr = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    tokens = DustbinTokens(arr(h, d), arr(h, d), arr(h, dv))
    return arr(b, h, lq, d), arr(b, h, lk, d), arr(b, h, lk, dv), tokens, arr(b, h, lq, dv)


def _value_and_grad(cfg: TransportConfig, q_len, k_len, g):
    """((loss, output O), gradient in (q, k, v, tokens)): the op's forward and custom VJP."""
    def loss(q, k, v, tokens):
        out = transport(q, k, v, jnp.asarray(q_len), jnp.asarray(k_len), tokens, config=cfg)
        return jnp.sum(g * out), out
    return jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)


@functools.lru_cache(maxsize=None)
def _lowered(impl: str, dustbin: str, platform: str):
    """The op (forward + gradient) lowered for ``platform`` from this host."""
    cfg = TransportConfig(half_band=70, base_steps=3, tail_steps=2, dustbin=dustbin, **impl_variant(impl))
    q, k, v, tokens, g = _inputs(LQ, LK)
    specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (q, k, v, tokens))
    return lower(jax.jit(_value_and_grad(cfg, Q_LEN, K_LEN, g)), platform, *specs)


# ---- reading precisions out of lowered modules --------------------------------------------------


def unpinned_f32_dots(text: str) -> list[str]:
    """The f32 ``stablehlo.dot_general`` lines without full precision (HIGHEST or an algorithm)."""
    dots = [ln.strip() for ln in text.splitlines() if "stablehlo.dot_general" in ln and "f32>" in ln]
    return [ln for ln in dots if "precision = [HIGHEST, HIGHEST]" not in ln and "algorithm =" not in ln]


def kernel_dots(lowered, platform: str) -> list[str]:
    """Every matmul inside the lowered kernels, in generic MLIR form: ``tt.dot`` (Triton) or
    ``tpu.matmul`` (Mosaic)."""
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    bodies = []
    for call in triton_offline.custom_calls(lowered):
        target = ir.StringAttr(call.attributes["call_target_name"]).value
        if platform == "cuda" and target == KERNEL_CALL["cuda"]:
            bodies.append(ir.StringAttr(call.attributes["mhlo.backend_config"]["ir"]).value_bytes)
        elif platform == "tpu" and target == KERNEL_CALL["tpu"]:
            config = json.loads(ir.StringAttr(call.attributes["backend_config"]).value)
            bodies.append(base64.b64decode(config["custom_call_config"]["body"]))
    if platform == "cuda":
        from jaxlib.triton import dialect

        dialect.register_dialect(ctx)
        op_name = '"tt.dot"'
    else:
        from jaxlib.mosaic.python import tpu

        tpu.register_dialect(ctx)
        op_name = "tpu.matmul"
    lines = []
    for body in bodies:
        text = ir.Module.parse(body, context=ctx).operation.get_asm(print_generic_op_form=True)
        lines += [ln.strip() for ln in text.splitlines() if op_name in ln]
    return lines


def unpinned_kernel_dots(lowered, platform: str) -> list[str]:
    """The f32 kernel matmuls not at full precision (Triton ieee = 2; Mosaic fp32)."""
    pinned = "inputPrecision = 2 " if platform == "cuda" else "contract_precision<fp32>"
    return [ln for ln in kernel_dots(lowered, platform) if "f32" in ln and pinned not in ln]


def _lower_kernel(platform: str, monkeypatch=None, precision=None):
    """One modulated product kernel lowered for ``platform`` (``precision`` overrides the pin)."""
    if precision is not None:
        monkeypatch.setattr(tile_math, "_PRECISION", precision)
    geom = make_geometry(320, 70, 128)
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    lp = geom.length
    specs = [f32(2, lp, 32), f32(2, lp, 32), f32(2, lp), f32(2, lp), f32(2, lp, 8), f32(2, lp, 12),
             f32(2, lp, 12)]
    mod = pallas_tpu if platform == "tpu" else pallas_gpu
    # The undecorated function: the jitted one would reuse its trace from before the override.
    f = functools.partial(mod.band_product.__wrapped__, geom=geom, interpret=False)
    return lower(jax.jit(f), platform, *specs)


# ---- exact f32 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("impl", ["reference", "xla", "pallas"])
def test_every_f32_dot_of_the_op_is_pinned(impl, platform):
    text = _lowered(impl, "spoke", platform).as_text()
    assert "stablehlo.dot_general" in text
    assert unpinned_f32_dots(text) == []


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_kernel_matmul_is_pinned(platform):
    dots = kernel_dots(_lowered("pallas", "spoke", platform), platform)
    assert len(dots) >= 3  # the score, modulation and product matmuls at least
    assert unpinned_kernel_dots(_lowered("pallas", "spoke", platform), platform) == []


def test_resident_scores_pin_every_dot_and_lower_to_triton_only():
    """``resident_scores``: the op lowered for cuda computes its band and reads it in Triton
    kernels whose every matmul (scores, modulation, products) is pinned; a TPU has no such
    kernels, and lowering for it fails saying so."""
    lowered = _lowered("pallas-resident", "spoke", "cuda")
    text = lowered.as_text()
    assert unpinned_f32_dots(text) == []
    assert text.count(KERNEL_CALL["cuda"]) >= 4 and KERNEL_CALL["tpu"] not in text
    assert len(kernel_dots(lowered, "cuda")) >= 3 and unpinned_kernel_dots(lowered, "cuda") == []
    assert "band_scores" in text
    with pytest.raises(ValueError, match="no kernels for a 'tpu' target.*resident_scores=False"):
        _lowered("pallas-resident", "spoke", "tpu")


def test_tf32x3_dots_lower_to_three_tf32_products():
    """``triton_dots="tf32x3"``: every Triton dot of the op (forward and gradient) lowered for
    cuda asks Triton for tf32x3 and none for plain TF32; the default's are all ieee."""
    from jaxlib.triton import dialect

    precision = lambda line: int(line.split("inputPrecision = ")[1].split()[0])
    for impl, want in (("pallas-one-pass-tf32x3", dialect.InputPrecision.TF32x3),
                       ("pallas-one-pass", dialect.InputPrecision.IEEE)):
        dots = kernel_dots(_lowered(impl, "none", "cuda"), "cuda")
        assert len(dots) >= 3, impl  # the scores, the modulation and the plan products
        assert {precision(d) for d in dots} == {int(want)}, impl


def test_an_unpinned_einsum_is_caught():
    f32 = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    text = lower(jax.jit(lambda a, b: jnp.einsum("id,jd->ij", a, b)), "cuda", f32, f32).as_text()
    assert len(unpinned_f32_dots(text)) == 1


@pytest.mark.parametrize("platform", PLATFORMS)
def test_an_unpinned_kernel_matmul_is_caught(platform, monkeypatch):
    assert unpinned_kernel_dots(_lower_kernel(platform), platform) == []
    default = _lower_kernel(platform, monkeypatch, jax.lax.Precision.DEFAULT)
    assert len(unpinned_kernel_dots(default, platform)) == 3  # scores, modulation, product


# ---- the wrapper follows the lowering platform -------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dustbin", ["none", "spoke", "capacity"])
def test_whole_op_lowers_to_the_platforms_kernels(dustbin, platform):
    """Forward and gradient, ragged batch, ``kernel="auto"``, ``interpret=None``: the module
    holds the target's kernels and no other."""
    text = _lowered("pallas", dustbin, platform).as_text()
    other = KERNEL_CALL["cuda" if platform == "tpu" else "tpu"]
    assert text.count(KERNEL_CALL[platform]) >= 4  # row and column LSE, plan products
    assert other not in text


# ---- on a GPU: the compiled Triton kernels ----------------------------------------------------


def _skip_without_gpu():
    if jax.default_backend() != "gpu":
        pytest.skip(f"compiled Triton kernels need a GPU backend, have {jax.default_backend()!r}")


def _float64_reference(cfg: TransportConfig, q_len, k_len, g, *operands):
    """((loss, output O), gradient) of dense autodiff (``impl="reference"``) in float64, on this device."""
    with jax.enable_x64(True):
        f64 = lambda tree: jax.tree.map(lambda x: jnp.asarray(np.asarray(x, np.float64)), tree)
        ref = cfg.dense_reference()
        out = jax.jit(_value_and_grad(ref, q_len, k_len, f64(g)))(*f64(operands))
        return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("impl", list(IMPL_VARIANTS))
def test_every_variant_has_a_dense_reference_of_the_same_problem(impl):
    """What the GPU tests compare each variant against: ``dense_reference()`` keeps the problem
    (band, eps, steps, dustbin) and drops every variant setting (a ``replace(impl="reference")``
    that kept ``resident_scores`` was refused, and failed 18 compiled tests on an H200)."""
    problem = dict(half_band=70, eps=0.5, base_steps=3, tail_steps=2, dustbin="spoke")
    cfg = TransportConfig(**problem, **impl_variant(impl), blocks=BlockSizes(16))
    assert cfg.dense_reference() == TransportConfig(**problem, impl="reference")


@pytest.mark.parametrize("dustbin", ["none", "spoke", "capacity"])
def test_a_branch_free_solve_lowers_without_a_conditional(dustbin):
    """``branch_free=True``: the XLA path's forward and gradient, lowered for ``cuda``, hold no
    ``lax.cond`` (each would copy its predicate to the host and wait on a GPU); the default
    config holds some (the scaling domain's reference rebuild, the shifted log-sum-exps'
    fallback), so the count can fail."""
    q, k, v, tokens, g = _inputs(LQ, LK)
    specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (q, k, v, tokens))
    branches = {}
    for branch_free in (False, True):
        cfg = TransportConfig(half_band=70, base_steps=3, tail_steps=2, dustbin=dustbin, impl="xla",
                              branch_free=branch_free)
        text = lower(jax.jit(_value_and_grad(cfg, Q_LEN, K_LEN, g)), "cuda", *specs).as_text()
        branches[branch_free] = text.count("stablehlo.case") + text.count("stablehlo.if")
    assert branches[True] == 0 and branches[False] >= 2


@pytest.mark.parametrize("dustbin", ["none", "spoke"])
def test_an_unrolled_solve_lowers_without_a_loop(dustbin):
    """``unroll=True`` with resident scores: the forward and gradient lowered for ``cuda`` hold
    no while loop (base, tail and backward sweep are straight-line steps around the Triton
    calls); the looped config holds one per loop, so the count can fail."""
    loops = {name: _lowered(name, dustbin, "cuda").as_text().count("stablehlo.while")
             for name in ("pallas-resident", "pallas-resident-unrolled")}
    assert loops == {"pallas-resident": 3, "pallas-resident-unrolled": 0}


@pytest.mark.parametrize("impl, kernels", [("pallas-fused", ("stored_row_half", "stored_col_half")),
                                           ("pallas-one-pass", ("stored_one_pass_rows", "stored_one_pass_combine"))])
@pytest.mark.parametrize("dustbin", ["none", "spoke"])
def test_fused_steps_lower_to_the_fused_kernels(dustbin, impl, kernels):
    """``fused_steps`` (and ``one_pass_steps``) lowered for ``cuda``: the steps call their two
    kernels and no stored-band LSE is left, with dustbin spokes too (each line's dustbin entry
    goes into the kernels); one-pass steps take no spokes: with them, the reverse."""
    text = _lowered(impl, dustbin, "cuda").as_text()
    fused = all(f"func.func private @{name}(" in text for name in kernels)
    want_fused = dustbin == "none" or impl == "pallas-fused"
    assert fused == want_fused
    assert ("func.func private @stored_lse(" in text) == (not want_fused)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["xla", "xla-branch-free", "xla-unrolled", "pallas", "pallas-resident",
                                  "pallas-resident-unrolled", "pallas-fused", "pallas-one-pass",
                                  "pallas-fused-tf32x3", "pallas-one-pass-tf32x3"])
@pytest.mark.parametrize("dustbin", ["none", "spoke", "capacity"])
def test_compiled_op_matches_float64_on_gpu(dustbin, impl):
    """The public op on the GPU, default settings, vs dense autodiff in float64: gradients within
    1e-5 absolute + 1e-5 relative. (An absolute 1e-5 alone is below f32's own floor where the
    gradients are large: in capacity mode, where they reach ~30, dense autodiff in f32 on the
    CPU is itself 1.1e-5 from float64.) TF32 contractions miss this by two orders; the
    ``-tf32x3`` variants (three TF32 products a dot) are held to it too."""
    _skip_without_gpu()
    q, k, v, tokens, g = _inputs(LQ, LK)
    cfg = TransportConfig(half_band=70, base_steps=3, tail_steps=2, dustbin=dustbin, **impl_variant(impl))
    got = jax.jit(_value_and_grad(cfg, Q_LEN, K_LEN, g))(q, k, v, tokens)
    want = _float64_reference(cfg, Q_LEN, K_LEN, g, q, k, v, tokens)
    np.testing.assert_allclose(got[0][1], want[0][1], atol=OUT_ATOL, rtol=OUT_ATOL)  # the output O
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(a, b, atol=OUT_ATOL, rtol=OUT_ATOL)


@pytest.mark.gpu
@pytest.mark.parametrize("dustbin", ["none", "spoke"])
@pytest.mark.parametrize("marginals, relax", [("rows", None), ("cols", None), ("cols", 0.7)])
def test_auto_banded_impl_runs_every_marginal_on_gpu(marginals, relax, dustbin):
    """What ``impl="auto"`` takes on a GPU from its crossover on (``GPU_BANDED_IMPL``), with a free
    or damped side (the semi-relaxed softmax), without and with the spoke dustbin (whose lines
    its kernels solve too), against float64 dense autodiff as above."""
    _skip_without_gpu()
    q, k, v, tokens, g = _inputs(LQ, LK)
    cfg = TransportConfig(half_band=70, base_steps=3, tail_steps=2, marginals=marginals, relax=relax,
                          dustbin=dustbin, **impl_variant(config.GPU_BANDED_IMPL))
    got = jax.jit(_value_and_grad(cfg, Q_LEN, K_LEN, g))(q, k, v, tokens)
    want = _float64_reference(cfg, Q_LEN, K_LEN, g, q, k, v, tokens)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, atol=OUT_ATOL, rtol=OUT_ATOL)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["xla", "pallas", "pallas-resident", "pallas-fused"])
def test_cold_score_gradients_stay_exact_on_gpu(impl):
    """At eps 1e-3, T 0 (|S| / eps ~3000; the true dq and dk ~1e-11, what the adjoint computes is
    all cancellation) the compiled paths' dq and dk within 8x the distance of dense f32 autodiff
    on the same GPU from float64, as in interpret mode (test_transport's
    ``test_kernel_walks_round_one_plan_at_cold_scores``): the row and column walks must round a
    plan entry alike as Triton compiles them too (its multiply-adds contracted), and the
    recomputing kernels' potentials must not go into the score dot's accumulator (15x on an
    H200 when they did, 2026-11-30: docs/design.md §3.5)."""
    _skip_without_gpu()
    from test_transport import _cold_problem, _cold_value_and_grad

    cfg, (q, k, v, w), lens, _, grads64, _ = _cold_problem(1e-3, 1.0, 0)
    cfg = dataclasses.replace(cfg, blocks=BlockSizes(16))  # a Triton tile (the CPU test's 8 is not one)
    _, dense = _cold_value_and_grad(dataclasses.replace(cfg, impl="reference"), lens, q, k, v, w)
    _, grads = _cold_value_and_grad(dataclasses.replace(cfg, **impl_variant(impl)), lens, q, k, v, w)
    for got, ref, want, name in zip(grads, dense, grads64, "qk"):
        err, floor = (np.abs(np.asarray(x) - want).max() for x in (got, ref))
        assert err <= 8 * floor, (name, err, floor)


@pytest.mark.gpu
def test_compiled_band_scores_split_over_diagonal_groups_store_the_same_band():
    """The scores kernel split over diagonal groups (``pallas_gpu.SCORE_GROUPS``, which
    ``gpu_session.sh issue11`` profiles) stores, as Triton compiles it, the band of one program
    a row block bit for bit: the groups' programs write their own tiles of a shared band row,
    and the last group's surplus trips rewrite the last tile with the same bits."""
    _skip_without_gpu()
    geom = pallas_gpu.stored_geometry(make_geometry(512, 128, pallas=True))  # 32-wide tiles, n_diag 9
    keys = jax.random.split(jax.random.PRNGKey(5), 4)
    q, k = (jax.random.normal(key, (2, geom.length, 64)) for key in keys[:2])
    active = jnp.arange(geom.length) < 500
    a, c = (jnp.where(active, jax.random.normal(key, (2, geom.length)), -jnp.inf) for key in keys[2:])
    scores = lambda groups: np.asarray(pallas_gpu.band_scores(q, k, a, c, geom=geom, groups=groups,
                                                              interpret=jax.default_backend() != "gpu"))
    one = scores(1)
    assert np.isfinite(one).any() and np.isneginf(one).any()
    assert geom.n_diag == 9
    for groups in (2, 4, geom.n_diag):
        np.testing.assert_array_equal(scores(groups), one)


def test_the_gpu_tests_own_code_runs_here(monkeypatch):
    """The compiled-kernel tests' harness (inputs, the float64 reference, the comparison) run on
    this CPU, the kernels in interpret mode: a GPU lease is not spent finding a harness bug (18
    of them failed on an H200 on one, 2026-11-29)."""
    monkeypatch.setattr(sys.modules[__name__], "_skip_without_gpu", lambda: None)
    test_compiled_op_matches_float64_on_gpu("none", "pallas-fused")
    test_auto_banded_impl_runs_every_marginal_on_gpu("cols", None, "spoke")
    test_cold_score_gradients_stay_exact_on_gpu("pallas-fused")
    test_compiled_band_scores_split_over_diagonal_groups_store_the_same_band()


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["xla", "pallas", "pallas-resident", "pallas-resident-unrolled", "pallas-fused",
                                  "pallas-one-pass", "pallas-fused-tf32x3", "pallas-one-pass-tf32x3"])
def test_benchmark_shape_runs_exactly_on_gpu(impl):
    """The benchmark's first size (L = 1024, W = 256, d = dv = 64, T = 15, R = 2) compiles within
    the device's shared memory and matches dense autodiff to 1e-5."""
    _skip_without_gpu()
    q, k, v, tokens, g = _inputs(1024, 1024, b=1, h=1, d=64, dv=64)
    lens = (1024,)
    run = lambda impl: jax.jit(_value_and_grad(
        TransportConfig(half_band=256, base_steps=15, tail_steps=2, **impl_variant(impl)), lens, lens, g))(q, k, v, tokens)
    got, want = run(impl), run("reference")
    np.testing.assert_allclose(got[0][1], want[0][1], atol=OUT_ATOL, rtol=0)  # the output O
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):  # q, k, v and the (zero) tokens'
        np.testing.assert_allclose(a, b, atol=OUT_ATOL, rtol=0)
