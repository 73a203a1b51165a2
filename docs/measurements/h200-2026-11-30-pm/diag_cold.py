"""Why `pallas` (recomputed scores) misses the cold-score gradient test on an H200.

Cold problem of tests/test_transport.py (eps 1e-3, T 0, L 24, d 8), blocks 16. For each
(impl, variant): dq / dk distance from float64 over dense f32 autodiff's (the test asks <= 8),
seeds 0-3; and whether the forward's row walk and the backward's column walk see one plan
(P read off O = P V with V = I, and off dV = P^T dO with dO = I).
Variants: base (the checkout); fold (mask_band as before 2026-11-30: the offsets added to a
dot's result, which Triton folds into the dot's accumulator); interp (kernels in interpret
mode: XLA's arithmetic, no Triton); nosums (COMPUTED_LINE_SUMS False)."""
import dataclasses, json, sys, time

sys.path.insert(0, "tests")
import jax, jax.numpy as jnp, numpy as np
from test_transport import _cold_problem
from pfamalign.kernels import BlockSizes, transport
from pfamalign.kernels import tile_math, sinkhorn
from pfamalign.kernels.config import impl_variant

ORIG_MASK = tile_math.mask_band


def folded(s, row_off, col_off, *, row0, col0, half_band, computed=False):
    """mask_band before 2026-11-30: the offsets added to the scores before the select, also
    to a dot's result (which Triton then folds into the dot's accumulator)."""
    return ORIG_MASK(s, row_off, col_off, row0=row0, col0=col0, half_band=half_band)


def setvariant(name):
    jax.clear_caches()
    tile_math.mask_band = folded if name == "fold" else ORIG_MASK
    sinkhorn.COMPUTED_LINE_SUMS = name != "nosums"


def grad_fn(cfg, lens):
    def loss(q, k, v, w):
        return jnp.sum(w * transport(q, k, v, lens, lens, config=cfg))
    return jax.jit(jax.grad(loss, (0, 1)))


def plan_fn(cfg, lens, lk):
    def f(q, k):
        b, h = k.shape[:2]
        eye = jnp.broadcast_to(jnp.eye(lk), (b, h, lk, lk))
        out, vjp = jax.vjp(lambda v: transport(q, k, v, lens, lens, config=cfg), eye)
        (dv,) = vjp(jnp.broadcast_to(jnp.eye(out.shape[2], out.shape[3]), out.shape))
        return out, dv
    return jax.jit(f)


probs = [_cold_problem(1e-3, 1.0, 0, seed) for seed in range(4)]
base = dataclasses.replace(probs[0][0], blocks=BlockSizes(16))
lens = probs[0][2]
setvariant("base")
dense = grad_fn(dataclasses.replace(base, impl="reference"), lens)
floors = [[np.abs(np.asarray(x) - w).max() for x, w in zip(dense(*p[1]), p[4][:2])] for p in probs]
print(json.dumps({"floors": [[float(f) for f in fl] for fl in floors]}), flush=True)
# ---- kernel level: the plan each product flavour rounds (row / column walk; matrix, vector,
# modulated y), read against the row walk's matrix product with y = I ----------------------
from pfamalign.kernels.band import make_geometry
from pfamalign.kernels.pallas_ops import PallasBandOps, StoredBandOps

q, k = probs[0][1][:2]
lp = 32
pad = lambda x: jnp.pad(x[0], ((0, 0), (0, lp - x.shape[2]), (0, 0)))  # [1, Lp, d]
qn, kn = pad(q), pad(k)
act = (jnp.arange(lp) < 24)[None]
scale = 1.0 / np.sqrt(8) / 1e-3
s64 = np.einsum("id,jd->ij", np.asarray(qn[0], np.float64), np.asarray(kn[0], np.float64)) * scale
band = np.abs(np.arange(lp)[:, None] - np.arange(lp)[None]) <= 6
band &= np.asarray(act[0])[:, None] & np.asarray(act[0])[None]
sm = np.where(band, s64, -np.inf)
rp = -np.log(np.exp(sm - sm.max(1, keepdims=True)).sum(1)) - sm.max(1)
rp = np.where(np.isfinite(rp), rp, 0.0)
row_pot, col_pot = jnp.asarray(rp, jnp.float32)[None], jnp.zeros((1, lp), jnp.float32)
rng = np.random.default_rng(0)
yv = jnp.asarray(rng.uniform(0.5, 1.5, (1, lp)), jnp.float32)
eye = jnp.eye(lp)[None]
for name, cls, variant in [("pallas", PallasBandOps, "base"), ("pallas-resident", StoredBandOps, "base")]:
    if True:
        try:
            setvariant(variant)
            ops = cls(make_geometry(lp, 6, 16, pallas=True))
            p = ops.plan(ops.scores(qn, kn, act, act, scale), row_pot, col_pot)
            P = np.asarray(ops.plan_rows(p, eye)[0], np.float64)  # the row walk's, matrix y
            res = {"cols_matrix": np.asarray(ops.plan_cols(p, eye)[0], np.float64).T}
            ref_rows, ref_cols = P @ np.asarray(yv[0]), P.T @ np.asarray(yv[0])
            res["rows_vector"] = np.asarray(ops.plan_rows(p, yv[..., None])[0, :, 0]), ref_rows
            res["cols_vector"] = np.asarray(ops.plan_cols(p, yv[..., None])[0, :, 0]), ref_cols
            ones = jnp.ones((1, lp, 1))
            res["rows_modulated"] = np.asarray(ops.plan_rows(p, eye, ones, ones)[0], np.float64), P
            res["cols_modulated"] = np.asarray(ops.plan_cols(p, eye, ones, ones)[0], np.float64).T, P
            out = {"ops": name, "variant": variant}
            for key, val in res.items():
                got, want = val if isinstance(val, tuple) else (val, P)
                m = np.abs(want) > 1e-30
                out[key] = float((np.abs(got - want)[m] / np.abs(want[m])).max())
        except Exception as e:
            out = {"ops": name, "variant": variant, "error": repr(e)[:400]}
        print(json.dumps(out), flush=True)

for impl, variant in [("pallas", "base"), ("pallas", "fold"), ("pallas-fused", "base"), ("xla", "base")]:
    t0 = time.time()
    try:
        setvariant(variant)
        cfg = dataclasses.replace(base, **impl_variant(impl))
        if variant == "interp":
            cfg = dataclasses.replace(cfg, interpret=True)
        g = grad_fn(cfg, lens)
        ratios = []
        for p, fl in zip(probs, floors):
            got = g(*p[1])
            ratios.append([round(float(np.abs(np.asarray(x) - w).max() / f), 2) for x, w, f in zip(got, p[4][:2], fl)])
        q, k = probs[0][1][:2]
        out, dv = plan_fn(cfg, lens, k.shape[2])(q, k)
        pr, pc = np.asarray(out[0, 0]), np.asarray(dv[0, 0]).T
        big = pr > 1e-30
        rel = np.abs(pr - pc)[big] / pr[big]
        row = {"impl": impl, "variant": variant, "ratio_dq_dk_seeds0to3": ratios,
               "walks_differ_entries": int(np.sum(pr != pc)), "entries": int(big.sum()),
               "walks_max_rel": float(rel.max()), "s": round(time.time() - t0, 1)}
    except Exception as e:  # keep going: every variant's line comes back
        row = {"impl": impl, "variant": variant, "error": repr(e)[:400]}
    print(json.dumps(row), flush=True)
setvariant("base")

setvariant("base")
