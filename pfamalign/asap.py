"""Compiled transport (ASAP): the Sinkhorn teacher's plan without iterating, for the alignment
plan and for the encoder's CETA layers.

A trained aligner's plan is the banded, dustbin-augmented Sinkhorn plan ``P = exp(S + u ⊕ v)``
(``kernels.reference``). The compiled operator predicts the query-side dual ``u`` from
per-residue features with a linear map fitted (closed-form ridge) on calibration pairs, predicts
the dustbin row's dual on its own, and rebuilds the plan by entropic c-transforms masked to the
support: one key-side transform (``passes=1``, ASAP-0: column sums exact) or key, query, key
(``passes=3``, ASAP). Every model weight stays frozen. docs/design.md §12 ("Compiled transport") says
how this generalises ASAP's original form and what did not hold.

Features of query row i (per head, scores ``S = <q, k> / (sqrt(d) eps)`` with the substitution
channel inside q and k):

* ``rowlse``: ``-LSE_j S_ij`` over the row's support (the row transform of v = 0);
* ``norm``: ``||q_i||^2 / (sqrt(d) eps)``; ``spoke``: ``S_i,dustbin``; ``max``: ``max_j S_ij``;
* ``slices``: the exact 1-D Kantorovich potential of q_i on L fixed random slices
  (``kantorovich_1d``), ASAP's original feature family.

Features and targets are centred over each pair's real rows: a constant shift of u moves into
v and leaves the plan unchanged, so only the within-pair variation is fitted.

Engines (``ENGINES``) give the head-mean plan ``[B, Lq + 1, Lk + 1]`` (real rows, then the
dustbin row) that ``Aligner.plan`` gives, and both directions of a pair as
``Aligner.plans_both_ways`` does (``Engine.plans_both_ways``: each sequence encoded once, the
engine's transport run in each direction): ``sinkhorn`` (the trained T + R steps), ``steps``
(N plain steps: the honest baseline at equal time) and ``asap`` (a compiled operator). The
operator compiles balanced plans (``TransportConfig.marginals == "balanced"``, the default);
a model with semi-relaxed marginals is refused (``Operator.check``).

The encoder's CETA layers (square, balanced, no dustbin: ASAP's original setting) get one
operator each (``fit_ceta``, ``Operator.layers``), fitted by the same pieces (``fit_problems``
over problem batches) on each layer's actual inputs, captured by running the encoder
(``ceta_inputs``); with ``--engine asap`` the encoder runs them instead of the layers' Sinkhorn
(``ceta_solvers``: per layer ``P V`` from the compiled plan).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pfamalign import jsonio
from pfamalign.inference import pad_batch  # the one zero-padding of feature pairs (bucketed lengths)
from pfamalign.kernels import DustbinTokens, scaling_transport_plan, transport
from pfamalign.kernels.reference import dense_problem, masked_neg_lse, reference_solve
from pfamalign.outputs import check_output_directory, inside, staged_directory

ENGINES = ("sinkhorn", "steps", "asap")
FEATURES = ("rowlse", "norm", "spoke", "max")
OPERATOR_FILE = "asap.json"
OPERATOR_FORMAT = "pfamalign-asap"
# Transport settings that choose how a plan is computed, not what it is: a compiled operator
# serves the model whatever they are (fingerprint 3 leaves them out)
RUNTIME_TRANSPORT_FIELDS = ("impl", "adjoint", "blocks", "interpret", "kernel", "branch_free", "resident_scores",
                            "unroll", "fused_steps", "one_pass_steps", "triton_dots")
# params_hash's versions: 1 the parameters alone (before 2026-11-29); 2 with the whole
# configuration (which a new runtime setting changed); 3 without RUNTIME_TRANSPORT_FIELDS
FINGERPRINT = 3


class CompileError(ValueError):
    """A compiled operator that cannot serve the model it is used with."""


# ---- the 1-D potentials ---------------------------------------------------------------------

def kantorovich_1d(x, y, n, m):
    """Exact Kantorovich potentials ``(f [Px], g [Py])`` of the 1-D problem between the first
    ``n`` entries of ``x`` (mass 1/n each) and the first ``m`` of ``y`` (1/m each) for the cost
    ``c(x, y) = -x y`` (the negated score; submodular, so the sorted north-west-corner coupling
    is optimal). Quantile form for n != m: both sides are sorted, their cumulative masses
    merged into a staircase of n + m - 1 cells (a row ends at (r+1)/n, a column at (c+1)/m,
    a row first on ties), and ``f_i + g_j = c(x_i, y_j)`` on every cell fixes the potentials
    (``f`` of the smallest x is 0). Entries beyond n, m are 0. No gradient is needed."""
    px, py = x.shape[0], y.shape[0]
    big = jnp.iinfo(jnp.int32).max // 4
    xs_idx = jnp.argsort(jnp.where(jnp.arange(px) < n, x, jnp.inf))
    ys_idx = jnp.argsort(jnp.where(jnp.arange(py) < m, y, jnp.inf))
    xs, ys = x[xs_idx], y[ys_idx]
    # events on the merged quantile grid, in units of 1 / (n m); ties: the row ends first
    r, c = jnp.arange(px - 1), jnp.arange(py - 1)
    row_key = jnp.where(r < n - 1, (r + 1) * m, big) * 2
    col_key = jnp.where(c < m - 1, (c + 1) * n, big) * 2 + 1
    order = jnp.argsort(jnp.concatenate([row_key, col_key]))
    is_row = order < px - 1
    cells = px + py - 1  # cell 0 = (0, 0); cell k follows event k - 1
    i = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(is_row, dtype=jnp.int32)])
    j = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(~is_row, dtype=jnp.int32)])
    valid = jnp.arange(cells) <= n + m - 2
    i, j = jnp.minimum(i, px - 1), jnp.minimum(j, py - 1)
    cost = -xs[i] * ys[j]
    # f changes only where a row starts: f_new = c_k - g_old = f_old + c_k - c_{k-1}
    step = jnp.where(jnp.concatenate([jnp.zeros(1, bool), is_row]) & valid,
                     jnp.diff(cost, prepend=cost[:1]), 0.0)
    f_cell = jnp.cumsum(step)
    g_cell = cost - f_cell
    drop = lambda idx, size: jnp.where(valid, idx, size)  # scatter out of range: dropped
    f_sorted = jnp.zeros(px, x.dtype).at[drop(i, px)].set(f_cell, mode="drop")
    g_sorted = jnp.zeros(py, y.dtype).at[drop(j, py)].set(g_cell, mode="drop")
    f = jnp.zeros(px, x.dtype).at[xs_idx].set(f_sorted)
    g = jnp.zeros(py, y.dtype).at[ys_idx].set(g_sorted)
    return (jnp.where(jnp.arange(px) < n, f, 0.0), jnp.where(jnp.arange(py) < m, g, 0.0))


# ---- settings, operator ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AsapSettings:
    """How an operator is fitted and applied.

    Attributes:
      slices: L random slices whose 1-D potentials are features (0, the default: none; on
        the shipped model they explain 3 % of the dual on unseen families and add nothing to
        the per-residue features, while their sorts cost time; README).
      features: the per-residue features besides the slices (``FEATURES``).
      passes: c-transforms of the reconstruction: 1 (ASAP-0: key) or 3 (ASAP: key, query, key).
      ridge: ridge penalty, relative to the mean diagonal of the normal matrix.
      seed: seed of the slices.
    """

    slices: int = 0
    features: tuple[str, ...] = FEATURES
    passes: int = 3
    ridge: float = 1e-4
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "features", tuple(self.features))
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown ASAP features {unknown}; choose from {FEATURES}")
        if self.passes not in (1, 3):
            raise ValueError(f"passes must be 1 (ASAP-0) or 3 (ASAP), got {self.passes}")
        if self.slices < 0 or self.ridge < 0:
            raise ValueError(f"need slices >= 0 and ridge >= 0, got {self.slices}, {self.ridge}")
        if not self.features and not self.slices:
            raise ValueError("no features: give some features or slices > 0")

    @property
    def n_features(self) -> int:
        return len(self.features) + self.slices


@dataclasses.dataclass
class Operator:
    """A fitted operator: per head, ``omega [H, F]`` (row features -> centred u),
    ``omega_dustbin [H, 4]`` (pair features -> the dustbin row's u minus the real rows' mean),
    the slices ``[H, d', L]``, the settings, fit statistics and the hash of the parameters it
    was fitted to; ``layers``: one such operator per CETA layer of the encoder (none for
    other encoders), each with its own settings, statistics and hash."""

    settings: AsapSettings
    omega: np.ndarray
    omega_dustbin: np.ndarray
    slices: np.ndarray
    params_hash: str
    stats: dict = dataclasses.field(default_factory=dict)
    layers: tuple = ()
    fingerprint: int | None = FINGERPRINT  # params_hash's version; None: a file that names none (1 or 2)

    def to_dict(self) -> dict:
        out = {"format": OPERATOR_FORMAT, "settings": dataclasses.asdict(self.settings),
               "params_hash": self.params_hash, "fingerprint": self.fingerprint, "stats": self.stats,
               "omega": self.omega.tolist(), "omega_dustbin": self.omega_dustbin.tolist(),
               "slices": self.slices.tolist()}
        return {**out, "layers": [layer.to_dict() for layer in self.layers]} if self.layers else out

    @classmethod
    def from_dict(cls, data: dict) -> "Operator":
        if data.get("format") != OPERATOR_FORMAT:
            raise CompileError(f"not a compiled ASAP operator (format {data.get('format')!r})")
        if data.get("fingerprint") not in (None, FINGERPRINT):
            raise CompileError(f"the compiled operator names a fingerprint of the model ({data['fingerprint']!r}) "
                               f"that this pfamalign does not know ({FINGERPRINT}): recompile with `pfamalign compile`")
        settings = AsapSettings(**data["settings"])
        omega, omega_db, slices = (np.asarray(data[k], np.float32) for k in ("omega", "omega_dustbin", "slices"))
        heads = omega.shape[0] if omega.ndim == 2 else -1
        # a hand-edited file fails here, by name, not as a shape error inside the plan
        for name, shape, want in (("omega", omega.shape, (heads, len(settings.features) + settings.slices)),
                                  ("omega_dustbin", omega_db.shape, (heads, 4)),
                                  ("slices", slices.shape[::2], (heads, settings.slices))):
            if heads < 1 or shape != want:
                raise ValueError(f"{name} has shape {shape}, where its settings ({len(settings.features)} "
                                 f"features, {settings.slices} slices) give {want}")
        for name, values in (("omega", omega), ("omega_dustbin", omega_db), ("slices", slices)):
            if not np.isfinite(values).all():  # else the plan fails later, blamed on eps
                raise ValueError(f"{name} holds non-finite numbers: the operator file is damaged; "
                                 "recompile with `pfamalign compile`")
        return cls(settings, omega, omega_db, slices, data["params_hash"], data.get("stats", {}),
                   tuple(cls.from_dict(layer) for layer in data.get("layers", [])), data.get("fingerprint"))

    def arrays(self):
        """The operator's arrays, as ``asap_of`` takes them."""
        return tuple(jnp.asarray(a) for a in (self.omega, self.omega_dustbin, self.slices))

    def ceta(self) -> dict:
        """The CETA layers' operators as ``plan_of`` takes them (``ceta_arrays``,
        ``ceta_settings``; None without layers)."""
        if not self.layers:
            return {"ceta_arrays": None, "ceta_settings": None}
        return {"ceta_arrays": tuple(layer.arrays() for layer in self.layers),
                "ceta_settings": tuple(layer.settings for layer in self.layers)}

    def check(self, model) -> None:
        """Raises CompileError unless ``model`` holds the parameters this (and every layer
        operator) was fitted to, has balanced marginals (``check_model``) and has an operator
        for each CETA layer of its encoder."""
        check_model(model)
        have_by_version = functools.cache(lambda version: params_hash(model, version))  # once, not per layer
        for op in (self,) + tuple(self.layers):
            if op.fingerprint is None and op.params_hash == have_by_version(1):
                raise CompileError("the compiled operator was made by a pfamalign before 2026-11-29, whose "
                                   "fingerprint of the model left out its transport settings and whose 'max' "
                                   "feature differed: recompile with `pfamalign compile`")
            have = have_by_version(op.fingerprint or 2)
            if have != op.params_hash:
                raise CompileError(f"the compiled operator was fitted to the model {op.params_hash[:12]} "
                                   f"(parameters and configuration), but this model is {have[:12]}: "
                                   "recompile with `pfamalign compile`")
        n = len(ceta_layers(model))
        if len(self.layers) != n:
            raise CompileError(f"the model's encoder has {n} CETA layers, but the compiled operator has "
                               f"{len(self.layers)} layer operators (none for layer {min(len(self.layers), n)}): "
                               "recompile with `pfamalign compile`")


def compile_refusal(config) -> str | None:
    """Why a model of ``config`` (an ``AlignerConfig``) cannot be compiled, or None: its plans
    must be balanced; the reconstruction's c-transforms are undamped, so semi-relaxed
    marginals (``rows`` / ``cols``, ``relax``) would need another operator (the ``rows`` plan
    is a row softmax: nothing to amortise). ``train --compile`` asks before training."""
    marginals = config.transport.marginals
    if marginals != "balanced":
        return f"ASAP compiles balanced plans only; this model's marginals are {marginals!r}"
    return None


def check_model(model) -> None:
    """Raises CompileError unless the model can be compiled (``compile_refusal``)."""
    if (why := compile_refusal(model.cfg)) is not None:
        raise CompileError(why)


def params_hash(model, version: int = FINGERPRINT) -> str:
    """sha256 over the model's configuration (the transport's eps, band, dustbin and steps make
    the teacher as much as the weights do; not ``RUNTIME_TRANSPORT_FIELDS``) and its parameters
    (paths, shapes, dtypes and bytes, in path order); ``version`` (``FINGERPRINT``) an earlier
    definition, to check an operator compiled under it."""
    h = hashlib.sha256()
    config = model.cfg.to_dict()
    if version >= 3:
        config["transport"] = {k: v for k, v in config["transport"].items() if k not in RUNTIME_TRANSPORT_FIELDS}
        h.update(b"fingerprint 3|")
    if version >= 2:
        h.update(b"config|" + jsonio.dumps(config, sort_keys=True).encode())
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]
    for path, leaf in sorted(flat, key=lambda pl: jax.tree_util.keystr(pl[0])):
        arr = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{arr.shape}|{arr.dtype}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def make_slices(settings: AsapSettings, heads: int, dim: int) -> np.ndarray:
    """``[H, d', L]`` unit random directions (seeded)."""
    rng = np.random.default_rng(settings.seed)
    s = rng.standard_normal((heads, dim, settings.slices))
    return (s / np.maximum(np.linalg.norm(s, axis=1, keepdims=True), 1e-12)).astype(np.float32)


# ---- the dense problem, features, reconstruction --------------------------------------------

def projections(model, q_feat, k_feat, q_len, k_len, ceta=None):
    """``(q, k, tokens, q_len, k_len)``: what the transport of ``model`` reads (the encoder and
    the projections run here; every engine shares them; ``ceta``: the encoder's CETA solvers,
    ``ceta_solvers``)."""
    q, k, _, tokens = model.project(q_feat, k_feat, q_len, k_len, ceta=ceta)
    if tokens is not None:  # the plan needs no values
        tokens = DustbinTokens(tokens.q, tokens.k, jnp.zeros((k.shape[1], 1), k.dtype))
    return q, k, tokens, q_len, k_len


def problem_of(cfg, q, k, tokens, q_len, k_len):
    """The dense extended problem: ``(S [B, H, Lq+1, Lk+1] at eps, mask, log_a, log_b)``."""
    tokens = tokens if cfg.dustbin != "none" else DustbinTokens(None, None, None)
    scores, mask, log_a, log_b = dense_problem(q, k, q_len, k_len, tokens, cfg)
    return scores / cfg.eps, mask, log_a, log_b


def problem(model, q_feat, k_feat, q_len, k_len):
    """The model's dense extended problem and projections: ``(S, mask, log_a, log_b, q, k)``."""
    q, k, tokens, q_len, k_len = projections(model, q_feat, k_feat, q_len, k_len)
    return problem_of(model.cfg.transport, q, k, tokens, q_len, k_len) + (q, k)


def _row_mean(x, rows, axis=-1):
    """Mean over the real rows (``rows`` [B, 1, Lq] bool) and its centred ``x``."""
    n = jnp.maximum(jnp.sum(rows, -1, keepdims=True), 1)
    mean = jnp.sum(jnp.where(rows, x, 0.0), -1, keepdims=True) / n
    return mean, jnp.where(rows, x - mean, 0.0)


def features(s, mask, q, k, q_len, k_len, slices, settings: AsapSettings, eps: float):
    """Row features centred over each pair's real rows ``[B, H, Lq, F]``, the dustbin's pair
    features ``[B, H, 4]`` and the real-row mask ``[B, 1, Lq]``."""
    lq = q.shape[2]
    rows = (jnp.arange(lq)[None, :] < q_len[:, None])[:, None]  # [B, 1, Lq]
    real, real_mask = s[..., :lq, :], mask[..., :lq, :]
    rowlse, _ = masked_neg_lse(real, real_mask, -1)  # [B, H, Lq]
    scale = 1.0 / (np.sqrt(q.shape[-1]) * eps)  # the scores' scale
    columns = {
        "rowlse": rowlse,
        "norm": jnp.sum(q * q, -1) * scale,
        "spoke": jnp.where(real_mask[..., -1], real[..., -1], 0.0),
        # 0 on a row with no support (no dustbin, beyond the band): a -1e30 there, centred
        # over the pair, would swamp every row's feature and the fit's ridge scale
        "max": jnp.where(jnp.any(real_mask, -1), jnp.max(jnp.where(real_mask, real, -1e30), -1), 0.0),
    }
    feats = [columns[f] for f in settings.features]
    if settings.slices:
        xs = jnp.einsum("bhid,hdl->bhli", q, slices)  # [B, H, L, Lq]
        ys = jnp.einsum("bhjd,hdl->bhlj", k, slices)
        per_slice = jax.vmap(jax.vmap(lambda x, y, n, m: kantorovich_1d(x, y, n, m)[0],
                                      (0, 0, None, None)), (0, 0, None, None))
        pot = jax.vmap(per_slice)(xs, ys, q_len, k_len)  # [B, H, L, Lq]
        feats += list(jnp.moveaxis(pot * scale, 2, 0))
    x = jnp.stack(feats, -1)  # [B, H, Lq, F]
    n = jnp.maximum(jnp.sum(rows, -1), 1)[..., None, None]
    x = jnp.where(rows[..., None], x, 0.0)
    x = jnp.where(rows[..., None], x - jnp.sum(x, 2, keepdims=True) / n, 0.0)
    # the dustbin row: its own row transform against the real rows' mean transform, the lengths
    db_row, _ = masked_neg_lse(s[..., lq, :], mask[..., lq, :], -1)  # [B, H]
    mean_rowlse = jnp.sum(jnp.where(rows, rowlse, 0.0), -1) / n[..., 0, 0]
    log_len = lambda l: jnp.broadcast_to(jnp.log(jnp.maximum(l, 1).astype(s.dtype))[:, None], db_row.shape)
    z = jnp.stack([jnp.ones_like(db_row), db_row - mean_rowlse, log_len(q_len), log_len(k_len)], -1)
    return x, z, rows


def centred_target(u, rows):
    """The teacher's dual as the operator predicts it: the real rows centred over the pair's
    real rows ``[B, H, Lq]`` and the dustbin row minus that mean ``[B, H]``."""
    lq = rows.shape[-1]
    mean, real = _row_mean(u[..., :lq], rows)
    return real, u[..., lq] - mean[..., 0]


def reconstruct(s, mask, log_a, log_b, u, passes: int):
    """Plan ``exp(S + u ⊕ v)`` on the support from the query-side dual ``u [B, H, Lq + 1]`` by
    entropic c-transforms: key (passes=1) or key, query, key (passes=3). Returns (plan, u, v)."""
    def col(u):
        v, has = masked_neg_lse(s + u[..., :, None], mask, -2)
        return jnp.where(has, v + log_b, 0.0)

    def row(v):
        u, has = masked_neg_lse(s + v[..., None, :], mask, -1)
        return jnp.where(has, u + log_a, 0.0)

    v = col(u)
    if passes == 3:
        u = row(v)
        v = col(u)
    log_plan = jnp.where(mask, s + u[..., :, None] + v[..., None, :], 0.0)
    return jnp.where(mask, jnp.exp(log_plan), 0.0), u, v


def predict_dual(x, z, rows, omega, omega_dustbin):
    """``u [B, H, Lq + 1]``: the real rows from their features, the dustbin row on its own."""
    u_real = jnp.einsum("bhif,hf->bhi", x, omega)
    u_db = jnp.einsum("bhf,hf->bh", z, omega_dustbin)
    return jnp.concatenate([jnp.where(rows, u_real, 0.0), u_db[..., None]], -1)


# The `steps` engine's most steps. It solves in the scaling domain (``scaling_transport_plan``:
# a loop, so its program does not grow with the steps: `pfamalign align` of a 64 x 58 pair took
# 3.7 s at 200 and at 1,000 steps, 3.8 s at 10,000, and 3.7 s with the default engine, 2026-12-01)
# and falls back on the reference where float32's range was left. The balanced reference's
# program holds every step (200 steps of a 64 x 63 pair took 24 s and 1.3 GB, 1000 took 9.5
# min and 7.4 GB, 2026-11-30): past MAX_REFERENCE_STEPS that fallback is refused, not run.
# (Relaxed marginals, which the scaling domain does not cover, take the reference's loop: 1000
# steps of a 64-residue pair in 4 s.)
MAX_ENGINE_STEPS = 10_000
MAX_REFERENCE_STEPS = 200


def teacher_of(cfg, q, k, tokens, q_len, k_len, *, steps: int | None = None):
    """The Sinkhorn plan ``[B, H, Lq+1, Lk+1]`` and its final potentials ``(u, v)``: the
    config's own T + R steps, or ``steps`` plain steps at its eps."""
    if steps is not None:
        cfg = dataclasses.replace(cfg, base_steps=steps, tail_steps=0, eps_schedule=None, tol=None)
    v = jnp.zeros(k.shape[:-1] + (1,), k.dtype)
    plan, _, _, (hu, hv), _ = reference_solve(q, k, v, q_len, k_len, tokens, cfg)
    return plan, hu[..., -1, :], hv[..., -1, :]


def teacher(model, q_feat, k_feat, q_len, k_len, *, steps: int | None = None):
    """``teacher_of`` for a model and features."""
    return teacher_of(model.cfg.transport, *projections(model, q_feat, k_feat, q_len, k_len), steps=steps)


def asap_of(cfg, op_arrays, settings: AsapSettings, q, k, tokens, q_len, k_len):
    """The compiled plan ``[B, H, Lq+1, Lk+1]`` and the predicted dual."""
    omega, omega_db, slices = op_arrays
    s, mask, log_a, log_b = problem_of(cfg, q, k, tokens, q_len, k_len)
    x, z, rows = features(s, mask, q, k, q_len, k_len, slices, settings, cfg.eps)
    u = predict_dual(x, z, rows, omega, omega_db)
    plan, _, _ = reconstruct(s, mask, log_a, log_b, u, settings.passes)
    return plan, u


# ---- the fit ---------------------------------------------------------------------------------

def ridge(x, y, penalty: float):
    """Closed-form ridge ``argmin ||x w - y||^2 + lam ||w||^2`` (float64), ``lam = penalty``
    times the mean diagonal of ``x^T x`` (scale-free). ``penalty`` 0: least squares, the
    minimum-norm solution where features are collinear (a CETA layer's equal lengths, a spoke
    column of zeros without a dustbin)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if penalty == 0:
        return np.linalg.lstsq(x, y, rcond=None)[0]
    gram = x.T @ x
    lam = penalty * np.trace(gram) / max(gram.shape[0], 1)
    return np.linalg.solve(gram + lam * np.eye(gram.shape[0]), x.T @ y)


def r_squared(pred, y) -> float:
    """1 - SSE / SST about zero (the targets are centred per pair)."""
    pred, y = np.asarray(pred, np.float64), np.asarray(y, np.float64)
    return float(1.0 - np.sum((pred - y) ** 2) / max(np.sum(y ** 2), 1e-300))


@functools.partial(jax.jit, static_argnums=(0, 2))
def calibration_of(cfg, slices, settings, q, k, tokens, q_len, k_len):
    """Features and the teacher's centred targets of one problem batch (``features``,
    ``centred_target``): ``(x, z, rows, y, y_db)``."""
    s, mask, _, _ = problem_of(cfg, q, k, tokens, q_len, k_len)
    x, z, rows = features(s, mask, q, k, q_len, k_len, slices, settings, cfg.eps)
    _, u, _ = teacher_of(cfg, q, k, tokens, q_len, k_len)
    y, y_db = centred_target(u, rows)
    return x, z, rows, y, y_db


@functools.partial(jax.jit, static_argnums=(0, 2))
def _plan_gap(cfg, op_arrays, settings, q, k, tokens, q_len, k_len):
    """Squared distance, squared norm and worst row / column error of the compiled plan
    against the teacher's on one problem batch."""
    ref = teacher_of(cfg, q, k, tokens, q_len, k_len)[0]
    got = asap_of(cfg, op_arrays, settings, q, k, tokens, q_len, k_len)[0]
    return (jnp.sum((got - ref) ** 2), jnp.sum(ref ** 2), jnp.max(jnp.abs(got.sum(-1) - ref.sum(-1))),
            jnp.max(jnp.abs(got.sum(-2) - ref.sum(-2))))


def _batches(pairs, batch_size):
    """Pairs grouped by padded length (fewer shapes), in batches."""
    order = sorted(range(len(pairs)), key=lambda i: max(len(pairs[i][0]), len(pairs[i][1])))
    for start in range(0, len(order), batch_size):
        yield [pairs[i] for i in order[start : start + batch_size]]


def _stack_rows(problems, slices, settings, heads):
    """Per head, over the problem batches ``(cfg, q, k, tokens, q_len, k_len)``: real-row
    features ``[N, F]`` and targets ``[N]``; the dustbin's ``[P, 4]``, ``[P]``."""
    xs, ys, zs, ydbs = [[] for _ in range(heads)], [[] for _ in range(heads)], [], []
    for cfg, *args in problems:
        x, z, rows, y, y_db = (np.asarray(a) for a in calibration_of(cfg, jnp.asarray(slices), settings, *args))
        sel = rows[:, 0]  # [B, Lq]
        for h in range(heads):
            xs[h].append(x[:, h][sel])
            ys[h].append(y[:, h][sel])
        zs.append(z)
        ydbs.append(y_db)
    z, y_db = np.concatenate(zs), np.concatenate(ydbs)  # [P, H, 4], [P, H]
    return ([np.concatenate(a) for a in xs], [np.concatenate(a) for a in ys], z, y_db)


def fit_problems(problems, settings: AsapSettings, *, heads: int, dim: int, params_hash: str) -> Operator:
    """Fits an operator (per head) on calibration problems ``(cfg, q, k, tokens, q_len, k_len)``
    of one transport: the alignment plan's (``fit``) or one CETA layer's (``fit_ceta``)."""
    slices = make_slices(settings, heads, dim)
    x, y, z, y_db = _stack_rows(problems, slices, settings, heads)
    omega = np.stack([ridge(x[h], y[h], settings.ridge) for h in range(heads)]).astype(np.float32)
    omega_db = np.stack([ridge(z[:, h], y_db[:, h], settings.ridge) for h in range(heads)]).astype(np.float32)
    stats = {"calibration_rows": int(sum(len(a) for a in y)),
             "r2_train": float(np.mean([r_squared(x[h] @ omega[h], y[h]) for h in range(heads)]))}
    return Operator(settings, omega, omega_db, slices, params_hash, stats)


def problem_stats(op: "Operator", problems, *, dustbin: bool = True) -> dict:
    """R^2 of the dual (and the dustbin's) and, for both reconstructions, the pooled relative
    l2 of the plan and the worst row / column marginal error against the teacher, over the
    problem batches (a list: read twice)."""
    heads = op.omega.shape[0]
    x, y, z, y_db = _stack_rows(problems, op.slices, op.settings, heads)
    out = {"r2_dual": float(np.mean([r_squared(x[h] @ op.omega[h], y[h]) for h in range(heads)]))}
    if dustbin:
        out["r2_dustbin"] = float(np.mean([r_squared(z[:, h] @ op.omega_dustbin[h], y_db[:, h])
                                           for h in range(heads)]))
    for passes in (1, 3):
        settings = dataclasses.replace(op.settings, passes=passes)
        gaps = [np.asarray(g) for cfg, *args in problems
                for g in [np.stack(_plan_gap(cfg, op.arrays(), settings, *args))]]
        num, den = sum(g[0] for g in gaps), sum(g[1] for g in gaps)
        out.update({f"plan_rel_l2_passes{passes}": float(np.sqrt(num / max(den, 1e-300))),
                    f"row_marginal_err_passes{passes}": float(max(g[2] for g in gaps)),
                    f"col_marginal_err_passes{passes}": float(max(g[3] for g in gaps))})
    return out


_projections = nnx.jit(projections)


def _plan_problems(model, pairs, batch_size):
    """The alignment plan's problem batches of ``pairs``."""
    for batch in _batches(pairs, batch_size):
        yield (model.cfg.transport,) + tuple(_projections(model, *pad_batch(batch)))


def fit(model, pairs, settings: AsapSettings = AsapSettings(), *, held_out=(), batch_size: int = 8,
        ceta_settings: AsapSettings | None = None) -> Operator:
    """Fits an operator on calibration ``pairs`` ``[(q_feat [Lq, D], k_feat [Lk, D])]``;
    ``held_out`` pairs give the fit statistics (R^2 of the duals, plan errors vs the teacher).
    A model whose encoder has CETA layers also gets one operator per layer (``fit_ceta``,
    ``ceta_settings``), in ``Operator.layers``."""
    if not pairs:
        raise ValueError("no calibration pairs")
    check_model(model)
    heads, dim, digest = model.cfg.heads, model.cfg.head_dim + model.substitution_dim, params_hash(model)
    op = fit_problems(_plan_problems(model, list(pairs), batch_size), settings, heads=heads, dim=dim,
                      params_hash=digest)
    op.stats["calibration_pairs"] = len(pairs)
    if held_out:
        op.stats.update(held_out_pairs=len(held_out), **problem_stats(
            op, list(_plan_problems(model, list(held_out), batch_size)), dustbin=model.cfg.transport.dustbin != "none"))
    if ceta_layers(model):
        op.layers = fit_ceta(model, pairs, ceta_settings or CETA_SETTINGS, held_out=held_out,
                             batch_size=batch_size, params_hash=digest)
    return op


# ---- the encoder's CETA layers ---------------------------------------------------------------

# ASAP's original setting: square, balanced, no dustbin. Features of a layer's operator:
# per-residue ones (no dustbin spoke) plus slices; README / design §12 give the measurements.
CETA_SETTINGS = AsapSettings(slices=64, features=("rowlse", "norm", "max"))


def ceta_layers(model) -> list:
    """The encoder's CETA attention modules in layer order (empty for any other encoder)."""
    cfg = model.cfg
    if cfg.encoder != "transformer" or cfg.attention != "ceta":
        return []
    return [block.attn for block in model.encoder.blocks]


@nnx.jit
def _capture(model, feat, lens):
    """Each CETA layer's queries, keys and values ``[B, H, L, d]`` as the encoder (Sinkhorn
    layers) computes them on ``feat``: recorded by solvers that run the layer's own transport."""
    seen = []

    def record(q, k, v, lens, cfg):
        seen.append((q, k, v))
        return transport(q, k, v, lens, lens, config=cfg)

    model.encode(feat, lens, ceta=[record] * len(ceta_layers(model)))
    return seen


def ceta_inputs(model, feat, lens):
    """Per CETA layer, its transport's problem batch ``(cfg, q, k, None, lens, lens)`` and its
    values ``v``, on the sequences ``feat [B, L, D]``, ``lens [B]``."""
    feat, lens = jnp.asarray(feat, jnp.float32), jnp.asarray(lens, jnp.int32)
    return [((layer.ceta_config(feat.shape[1]), q, k, None, lens, lens), v)
            for layer, (q, k, v) in zip(ceta_layers(model), _capture(model, feat, lens))]


def _ceta_problems(model, pairs, batch_size):
    """Per batch of pairs, one problem batch per CETA layer on the batch's sequences (both
    sides): a list (every layer is fitted from one capture)."""
    out = []
    for batch in _batches(pairs, batch_size):
        q_feat, k_feat, q_len, k_len = pad_batch(batch)
        inputs = ceta_inputs(model, np.concatenate([q_feat, k_feat]), np.concatenate([q_len, k_len]))
        out.append([problem for problem, _ in inputs])
    return out


def fit_ceta(model, pairs, settings: AsapSettings = CETA_SETTINGS, *, held_out=(), batch_size: int = 8,
             params_hash: str) -> tuple:
    """One operator per CETA layer of the encoder (per head, as the heads solve separately),
    fitted on the layer's actual inputs: the sequences of ``pairs`` run through the encoder.
    ``held_out`` pairs' sequences give each layer's statistics."""
    cfg = model.cfg
    fitted = _ceta_problems(model, list(pairs), batch_size)
    held = _ceta_problems(model, list(held_out), batch_size) if held_out else []
    ops = []
    for i in range(len(ceta_layers(model))):
        op = fit_problems([b[i] for b in fitted], settings, heads=cfg.attn_heads, dim=cfg.attn_head_dim,
                          params_hash=params_hash)
        op.stats.update(layer=i, calibration_sequences=2 * len(pairs))
        if held:
            op.stats.update(held_out_sequences=2 * len(held_out),
                            **problem_stats(op, [b[i] for b in held], dustbin=False))
        ops.append(op)
    return tuple(ops)


def ceta_attend(cfg, op_arrays, settings: AsapSettings, q, k, v, lens):
    """A CETA layer's output ``P V [B, H, L, dv]`` with the compiled plan P."""
    plan, _ = asap_of(cfg, op_arrays, settings, q, k, None, lens, lens)
    return jnp.einsum("bhij,bhjv->bhiv", plan[..., :-1, :-1], v)


def ceta_solvers(ceta_arrays, ceta_settings):
    """Per CETA layer, the solver ``Attention.mix`` takes: its compiled operator (None: none)."""
    if ceta_arrays is None:
        return None
    return [lambda q, k, v, lens, cfg, a=a, s=s: ceta_attend(cfg, a, s, q, k, v, lens)
            for a, s in zip(ceta_arrays, ceta_settings)]


# ---- engines ---------------------------------------------------------------------------------

def steps_config(cfg, steps: int):
    """The `steps` engine's transport: ``steps`` plain Sinkhorn steps at the model's eps."""
    return dataclasses.replace(cfg, base_steps=steps, tail_steps=0, eps_schedule=None, tol=None)


def transport_of(cfg, op_arrays, q, k, tokens, q_len, k_len, *, engine: str, steps: int | None = None,
                 settings: AsapSettings | None = None, solver: str = "scaling"):
    """``(plan, safe)``: the per-head extended plan ``[B, H, Lq + 1, Lk + 1]`` of one engine
    from projections, and whether it holds. ``solver``, for the Sinkhorn engines (``sinkhorn``:
    the config's own steps; ``steps``: ``steps_config``): ``"scaling"`` (``safe`` False where
    float32's range was left: solve again with ``"reference"``) or ``"reference"`` (the dense
    log-domain reference, always safe). A compiled plan (``asap``) is always safe."""
    if engine == "asap":
        return asap_of(cfg, op_arrays, settings, q, k, tokens, q_len, k_len)[0], jnp.array(True)
    if engine == "steps":
        cfg = steps_config(cfg, steps)
    if solver == "scaling":
        return scaling_transport_plan(q, k, q_len, k_len, tokens, config=cfg)
    return teacher_of(cfg, q, k, tokens, q_len, k_len)[0], jnp.array(True)


def plan_of(model, op_arrays, q_feat, k_feat, q_len, k_len, *, engine: str, steps: int | None = None,
            settings: AsapSettings | None = None, heads_mean: bool = True, ceta_arrays=None,
            ceta_settings=None, solver: str = "scaling"):
    """``(plan, safe)``: the plan of one engine (``transport_of``), the head-mean ``[B, Lq + 1,
    Lk + 1]`` (real rows, then the dustbin row) that ``Aligner.plan`` gives (``heads_mean``),
    else the per-head plan ``[B, H, Lq + 1, Lk + 1]``; with ``ceta_arrays`` / ``ceta_settings``
    (``Operator.ceta``) the encoder's CETA layers run their compiled operators. Not compiled
    (``engine_plan`` is)."""
    proj = projections(model, q_feat, k_feat, q_len, k_len, ceta_solvers(ceta_arrays, ceta_settings))
    plan, safe = transport_of(model.cfg.transport, op_arrays, *proj, engine=engine, steps=steps,
                              settings=settings, solver=solver)
    return (plan.mean(axis=1) if heads_mean else plan), safe


def plans_both_ways_of(model, op_arrays, a_feat, b_feat, a_len, b_len, *, engine: str,
                       steps: int | None = None, settings: AsapSettings | None = None, ceta_arrays=None,
                       ceta_settings=None, solver: str = "scaling"):
    """``((ab, ba), safe)``: ``plan_of`` of A against B and of B against A (head means ``[B,
    La + 1, Lb + 1]``, ``[B, Lb + 1, La + 1]``), each sequence encoded once (as
    ``Aligner.plans_both_ways``); the engine's transport runs once per direction."""
    ceta = ceta_solvers(ceta_arrays, ceta_settings)
    ha, hb = model.encode(a_feat, a_len, ceta=ceta), model.encode(b_feat, b_len, ceta=ceta)

    def one_way(q_feat, k_feat, q_len, k_len, encoded):
        q, k, _, tokens = model.project(q_feat, k_feat, q_len, k_len, encoded=encoded)
        if tokens is not None:  # the plan needs no values
            tokens = DustbinTokens(tokens.q, tokens.k, jnp.zeros((k.shape[1], 1), k.dtype))
        plan, safe = transport_of(model.cfg.transport, op_arrays, q, k, tokens, q_len, k_len, engine=engine,
                                  steps=steps, settings=settings, solver=solver)
        return plan.mean(axis=1), safe

    (ab, safe_ab), (ba, safe_ba) = (one_way(a_feat, b_feat, a_len, b_len, (ha, hb)),
                                    one_way(b_feat, a_feat, b_len, a_len, (hb, ha)))
    return (ab, ba), safe_ab & safe_ba


engine_plan = nnx.jit(plan_of, static_argnames=("engine", "steps", "settings", "heads_mean", "ceta_settings",
                                                "solver"))
engine_plans_both_ways = nnx.jit(plans_both_ways_of, static_argnames=("engine", "steps", "settings",
                                                                      "ceta_settings", "solver"))


@dataclasses.dataclass(frozen=True)
class Engine:
    """How ``Predictor`` computes plans: ``sinkhorn`` (the model's trained steps), ``steps``
    (``steps`` plain Sinkhorn steps) or ``asap`` (the operator compiled into the model
    directory by ``pfamalign compile``)."""

    name: str = "sinkhorn"
    steps: int | None = None
    operator: Operator | None = None

    def __post_init__(self):
        if self.name not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.name!r}")
        if self.name == "steps" and self.steps is None:
            raise ValueError("engine 'steps' needs a number of plain Sinkhorn steps (--engine steps "
                             "--steps N; steps=N in Python)")
        if self.name != "steps" and self.steps is not None:
            raise ValueError(f"a number of steps (--steps N; steps=N in Python) goes with engine 'steps' "
                             f"(--engine steps), not engine {self.name!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.name == "asap" and self.operator is None:
            raise ValueError("engine asap needs a compiled operator")

    @classmethod
    def load(cls, name: str, model_dir, model, *, steps: int | None = None,
             passes: int | None = None) -> "Engine":
        """The engine ``name`` for ``model`` loaded from ``model_dir``; for ``asap``, its
        operator (checked against the model's parameters; ``passes`` overrides its own)."""
        if name != "asap":
            return cls(name, steps)
        check_model(model)  # before looking for an operator `compile` would refuse to write
        op = load_operator(model_dir)
        op.check(model)
        if passes is not None:
            op = dataclasses.replace(op, settings=dataclasses.replace(op.settings, passes=passes))
        return cls(name, steps, op)

    def describe(self) -> dict:
        """What provenance records: the engine, its steps, the operator's settings and hash."""
        out = {"name": self.name}
        if self.steps is not None:
            out["steps"] = self.steps
        if self.operator is not None:
            out.update(passes=self.operator.settings.passes, slices=self.operator.settings.slices,
                       params_hash=self.operator.params_hash[:16])
            if self.operator.layers:
                out["ceta_layers"] = len(self.operator.layers)
        return out

    def args(self) -> tuple:
        """``(op_arrays, keywords)``: what ``plan_of`` takes besides the model and inputs."""
        op = self.operator
        return (op.arrays() if op else None,
                dict(engine=self.name, steps=self.steps, settings=op.settings if op else None,
                     **(op.ceta() if op else {})))

    def _call(self, fn, model, x, y, x_len, y_len, **kw):
        """``fn``'s plans by the scaling solve, or by the reference where that left float32's
        range (``model.fast_or_reference``, as ``Aligner.plan``'s)."""
        from pfamalign.model import fast_or_reference

        arrays, static = self.args()

        def program(*args, solver: str):
            if solver == "reference":
                self.check_reference(why="its scaling solve left float32's range")
            return fn(*args, **static, **kw, solver=solver)

        return fast_or_reference(program, (model, arrays), x, y, x_len, y_len)

    def check_reference(self, *, why: str) -> None:
        """Refuses (ValueError) a `steps` engine whose balanced plan the reference would have to
        solve (``why``) past MAX_REFERENCE_STEPS: its program holds every step (minutes and
        gigabytes)."""
        if self.name == "steps" and self.steps > MAX_REFERENCE_STEPS:
            raise ValueError(f"--steps {self.steps} needs the reference solve here ({why}), which takes "
                             f"minutes and gigabytes past {MAX_REFERENCE_STEPS} steps: give --steps "
                             f"{MAX_REFERENCE_STEPS} or fewer")

    def plan(self, model, q_feat, k_feat, q_len, k_len):
        """Head-mean plans ``[B, Lq + 1, Lk + 1]``, last row the dustbin's (as ``Aligner.plan``)."""
        return self._call(engine_plan, model, q_feat, k_feat, q_len, k_len)

    def plans_both_ways(self, model, a_feat, b_feat, a_len, b_len):
        """Both directions' head-mean plans (as ``Aligner.plans_both_ways``): what a
        symmetrized alignment needs; each direction computed by this engine."""
        return self._call(engine_plans_both_ways, model, a_feat, b_feat, a_len, b_len)


# ---- compiled model directories --------------------------------------------------------------

def load_operator(model_dir) -> Operator:
    """The operator of a compiled model directory (CompileError when there is none)."""
    path = pathlib.Path(model_dir) / OPERATOR_FILE
    if not path.is_file():
        compiled = pathlib.Path(model_dir).parent / "compiled"  # where `train --compile` writes it
        if pathlib.Path(model_dir).name == "model" and (compiled / OPERATOR_FILE).is_file():
            raise CompileError(f"{model_dir} has no compiled operator ({OPERATOR_FILE}); the run's compiled "
                               f"model is {compiled}: give --checkpoint {compiled}")
        raise CompileError(f"{model_dir} has no compiled operator ({OPERATOR_FILE}); "
                           "make one with `pfamalign compile --checkpoint MODEL -o OUT`")
    from pfamalign.runs import verify_checksums

    damaged = verify_checksums(model_dir, OPERATOR_FILE)  # none recorded (older compiles): []
    if damaged:
        raise CompileError(f"{damaged[0]}; recompile with `pfamalign compile`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"a JSON object is expected, got {type(data).__name__}")
        return Operator.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:  # JSON, UTF-8, fields, arrays
        raise CompileError(f"cannot read {path}: {err}") from err


def check_output_dir(source, out, *, replace: bool = False) -> pathlib.Path:
    """``out`` (absolute) if a compiled model can be written there: not the checkpoint
    ``source`` nor inside it, not an existing path (``replace``: an existing compiled model
    directory), in an existing directory. Else a ValueError."""
    source, out = pathlib.Path(source).absolute(), pathlib.Path(out).absolute()
    if out == source or (out.exists() and os.path.samefile(out, source)):
        raise ValueError(f"output {out} is the checkpoint itself; write the compiled model elsewhere")
    if inside(out, source):  # the copy of the checkpoint would hold itself
        raise ValueError(f"output {out} is inside the checkpoint {source}; write the compiled model "
                         f"elsewhere")
    if out.exists() and not (replace and (out / OPERATOR_FILE).is_file()):
        raise ValueError(f"output {out} already exists; give a new directory")
    return check_output_directory(out)  # its parent exists and is writable


def write_compiled(source, out, op: Operator, *, replace: bool = False) -> pathlib.Path:
    """Writes OUT: a copy of the model directory ``source`` (config, parameters, decoder
    settings, training record) plus the operator, built beside OUT and renamed into place
    (never half written). Refuses OUT equal to ``source`` and an existing OUT (``replace``:
    an existing compiled model directory is swapped out, as ``train --compile`` does)."""
    from pfamalign.checkpoint import copy_model
    from pfamalign.runs import MODEL_RECORDS, add_checksums, read_checksums, write_checksums
    from pfamalign.pipelines.records import write_json

    source, out = pathlib.Path(source).absolute(), check_output_dir(source, out, replace=replace)
    with staged_directory(out, replace=replace) as staged:
        copy_model(source, staged, ignore=shutil.ignore_patterns(OPERATOR_FILE), dirs_exist_ok=True)
        write_json(staged / OPERATOR_FILE, op.to_dict(), indent=2)
        # the operator is fitted numbers, not settings to edit: `verify` checks it as the parameters;
        # the source's recorded digests are kept (its parameters are not re-read to vouch for them)
        if not read_checksums(staged):  # a source saved before checksums: its parameters as copied
            write_checksums(staged, ("params",))
        add_checksums(staged, (OPERATOR_FILE, *MODEL_RECORDS))
        # again, just before the swap: a directory another process made at OUT meanwhile is
        # refused, never replaced (only a compiled model is)
        check_output_dir(source, out, replace=replace)
    return out
