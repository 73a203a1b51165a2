"""Residue encoders: the Siamese per-sequence networks in front of the aligner's projections.

Two kinds (``AlignerConfig.encoder``), both ``[B, L, D], [B] -> [B, L, width]`` with padding zero:

* ``conv``: Dense(D -> width), residual LayerNorm -> Conv1D -> GELU -> Dense blocks, LayerNorm
  (the shipped model's encoder; a window of about ``layers * (kernel - 1) + 1`` residues).
* ``transformer``: Dense(D -> width), ``encoder_layers`` pre-norm blocks of attention + MLP,
  LayerNorm. Bidirectional (no causal mask) and per sequence, so an encoding can be cached.
  ``attention`` picks the token mixer:

  - ``softmax``: each row the semi-relaxed entropic transport of its query (rows sum to 1);
  - ``ceta``: the balanced entropic plan over the residues of the sequence (square, so it is
    feasible), solved by the project's transport op with ``dustbin="none"``, ``q_len = k_len``
    and half band ``attn_band`` (0 = the whole sequence); its gradient is the op's exact adjoint;
  - ``gsa``: gated sparse attention: a value gate and an output gate, a lightning indexer that
    scores keys, top-k keys per row shared by the heads (``k = clip(ceil(topk_fraction * len),
    topk_min, topk)`` per sequence, a rank mask) plus a local window ``|i - j| <= topk_local``
    that is always kept; ``topk = 0`` attends densely.

  ``residual`` picks the residual path: ``plain`` (x + f(LN x)) or ``cayley``: ``streams``
  hyper-connection streams X ``[B, L, n, width]``; each sublayer reads ``h = sum_s a_s X_s``
  and writes ``X <- M X + b y``, with ``M = (I - A)(I + A)^-1`` orthogonal (A skew) per
  residue. ``a``, ``b`` and ``A`` are a learned static part plus a per-residue part
  (zero-initialised linear maps of the mean stream). docs/design.md "Transport-attention
  encoders" states the decisions (identity at init, symmetry breaking, the k rule, the indexer
  KL, the mixing parameters' decay).

Every residual branch's last linear map is zero-initialised, so at initialisation the encoder
is exactly ``LayerNorm(input projection)``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pfamalign.kernels import TransportConfig, transport, transport_plan

ENCODERS = ("none", "conv", "transformer")
ATTENTIONS = ("softmax", "ceta", "gsa")
RESIDUALS = ("plain", "cayley")
# Padded length from which gsa gathers its selected keys instead of masking dense scores.
# Measured on CPU by scripts/bench_encoder.py (README "Encoders"): below it the gather loses.
SPARSE_FROM_LENGTH = 2048
ROPE_BASE = 10000.0


def check_config(cfg) -> None:
    """ValueError unless the encoder fields of an AlignerConfig are consistent."""
    if cfg.encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {ENCODERS}, got {cfg.encoder!r}")
    if cfg.attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {cfg.attention!r}")
    if cfg.residual not in RESIDUALS:
        raise ValueError(f"residual must be one of {RESIDUALS}, got {cfg.residual!r}")
    for name, low in (("streams", 1), ("attn_heads", 1), ("attn_head_dim", 2), ("mlp_ratio", 1),
                      ("topk", 0), ("topk_min", 1), ("topk_local", 0), ("indexer_dim", 1),
                      ("attn_band", 0), ("ceta_steps", 0)):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if cfg.rope and cfg.attn_head_dim % 2:
        raise ValueError(f"rope needs an even attn_head_dim, got {cfg.attn_head_dim}")
    if not 0 < cfg.topk_fraction <= 1:
        raise ValueError(f"topk_fraction must be in (0, 1], got {cfg.topk_fraction!r}")
    if cfg.indexer_weight < 0:
        raise ValueError(f"indexer_weight must be >= 0, got {cfg.indexer_weight!r}")


def length_mask(length: int, lens) -> jax.Array:
    """[B, L, 1] float: 1 on real positions."""
    return (jnp.arange(length)[None, :] < lens[:, None])[..., None].astype(jnp.float32)


def build_encoder(cfg, *, rngs: nnx.Rngs):
    """``(module or None, output width)`` for ``cfg.encoder``."""
    if cfg.encoder == "conv":
        return ConvEncoder(cfg, rngs=rngs), cfg.encoder_width
    if cfg.encoder == "transformer":
        return TransformerEncoder(cfg, rngs=rngs), cfg.encoder_width
    return None, cfg.feature_dim


# ---------------------------------------------------------------------------------------------
# conv
# ---------------------------------------------------------------------------------------------

class ConvBlock(nnx.Module):
    """Pre-norm residual block: LayerNorm -> Conv1D (SAME) -> GELU -> Dense."""

    def __init__(self, width: int, kernel_size: int, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.conv = nnx.Conv(width, width, kernel_size=(kernel_size,), padding="SAME",
                             rngs=rngs)
        self.out = nnx.Linear(width, width, rngs=rngs)

    def __call__(self, x, mask):  # [B, L, W], [B, L, 1]
        h = self.norm(x) * mask  # zero the padding before the convolution
        h = self.out(jax.nn.gelu(self.conv(h)))
        return (x + h) * mask


class ConvEncoder(nnx.Module):
    """Dense(D -> width), residual conv blocks, final LayerNorm; padding stays zero."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(cfg.feature_dim, cfg.encoder_width, rngs=rngs)
        self.blocks = nnx.List([ConvBlock(cfg.encoder_width, cfg.kernel_size, rngs=rngs)
                                for _ in range(cfg.encoder_layers)])
        self.norm = nnx.LayerNorm(cfg.encoder_width, rngs=rngs)

    def __call__(self, feat, lens):  # [B, L, D], [B] -> ([B, L, W], aux loss 0)
        mask = length_mask(feat.shape[1], lens)
        x = self.inp(feat * mask) * mask
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x) * mask, jnp.zeros((), jnp.float32)


# ---------------------------------------------------------------------------------------------
# attention pieces (pure functions: the tests and the benchmark call them directly)
# ---------------------------------------------------------------------------------------------

def masked_softmax(s, mask):
    """Softmax over the last axis restricted to ``mask``; exact zeros (never NaN) where a row
    has no entry."""
    has = jnp.any(mask, -1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.max(jnp.where(mask, s, -jnp.inf), -1, keepdims=True))
    m = jnp.where(has, m, 0.0)
    e = jnp.where(mask, jnp.exp(jnp.where(mask, s, 0.0) - m), 0.0)
    return e / jnp.where(has, jnp.sum(e, -1, keepdims=True), 1.0)


def rope(x, positions):
    """Rotary position embedding of ``x [..., L, d]`` (d even) at ``positions [L]``."""
    half = x.shape[-1] // 2
    freqs = ROPE_BASE ** (-jnp.arange(half, dtype=jnp.float32) / half)
    ang = positions[:, None].astype(jnp.float32) * freqs  # [L, d/2]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def topk_per_length(lens, cfg) -> jax.Array:
    """``[B]`` int: ``k = clip(ceil(topk_fraction * len), topk_min, topk)`` (0 for an empty row)."""
    k = jnp.ceil(cfg.topk_fraction * lens.astype(jnp.float32)).astype(jnp.int32)
    return jnp.where(lens > 0, jnp.clip(k, min(cfg.topk_min, cfg.topk), cfg.topk), 0)


def select_keys(index_scores, lens, k, local: int, kmax: int):
    """Top-k selection shared by the heads.

    ``index_scores [B, L, L]``; keys beyond ``lens`` are never selected; the local window
    ``|i - j| <= local`` is kept apart (always attended), so top-k picks among the other keys.
    Returns ``(idx [B, L, kk], keep [B, L, kk])`` with kk = min(kmax, L): the candidates in rank
    order and the rank mask ``rank < k[b]`` (and a real, non-local key)."""
    b, l, _ = index_scores.shape
    pos = jnp.arange(l)
    valid = pos[None, None, :] < lens[:, None, None]
    near = jnp.abs(pos[:, None] - pos[None, :]) <= local
    score = jnp.where(valid & ~near[None], index_scores, -jnp.inf)
    kk = min(kmax, l)
    vals, idx = jax.lax.top_k(jax.lax.stop_gradient(score), kk)
    keep = (jnp.arange(kk)[None, None, :] < k[:, None, None]) & jnp.isfinite(vals)
    return idx, keep


def local_keys(lens, length: int, local: int):
    """``(idx [L, 2w+1], valid [B, L, 2w+1])``: the window i - w .. i + w (clamped indices)."""
    pos = jnp.arange(length)
    off = jnp.arange(-local, local + 1)
    j = pos[:, None] + off[None, :]
    valid = (j >= 0)[None] & (j < lens[:, None, None])
    return jnp.clip(j, 0, length - 1), valid


def selection_mask(idx, keep, lens, length: int, local: int):
    """Dense boolean ``[B, L, L]`` of the selected keys plus the real keys of the local window."""
    b = idx.shape[0]
    rows = jnp.arange(length)
    sel = jnp.zeros((b, length, length), bool)
    sel = sel.at[jnp.arange(b)[:, None, None], rows[None, :, None], idx].set(keep)
    pos = jnp.arange(length)
    near = jnp.abs(pos[:, None] - pos[None, :]) <= local
    valid = pos[None, None, :] < lens[:, None, None]
    return sel | (near[None] & valid)


def dense_attention(q, k, v, mask):
    """``q, k, v [B, H, L, d]``, mask ``[B, 1|H, L, L]`` -> (out, weights)."""
    s = jnp.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    p = masked_softmax(s, mask)
    return jnp.einsum("bhij,bhjd->bhid", p, v), p


def gathered_attention(q, k, v, idx, valid):
    """Attention of each row over its own keys ``idx [B, L, S]`` (``valid [B, L, S]``), by
    gathering them: memory and time L * S instead of L^2."""
    b, h, l, d = k.shape
    flat = idx.reshape(b, 1, l * idx.shape[-1], 1)
    kg = jnp.take_along_axis(k, flat, axis=2).reshape(b, h, l, -1, d)
    vg = jnp.take_along_axis(v, flat, axis=2).reshape(b, h, l, -1, v.shape[-1])
    s = jnp.einsum("bhid,bhisd->bhis", q, kg) / math.sqrt(d)
    p = masked_softmax(s, valid[:, None])
    return jnp.einsum("bhis,bhisd->bhid", p, vg)


def indexer_kl(dense_p, index_scores, key_mask, row_mask):
    """Mean over real rows of ``KL(sg(mean_h P) || softmax(index scores))`` over the real keys:
    the indexer's training signal (top-k passes it none)."""
    target = jax.lax.stop_gradient(jnp.mean(dense_p, axis=1))  # [B, L, L]
    logq = jax.nn.log_softmax(jnp.where(key_mask, index_scores, -1e30), -1)
    terms = jnp.where(key_mask & (target > 0),
                      target * (jnp.log(jnp.where(target > 0, target, 1.0)) - logq), 0.0)
    per_row = jnp.sum(terms, -1)
    return jnp.sum(per_row * row_mask) / jnp.maximum(jnp.sum(row_mask), 1.0)


def cayley(a):
    """``(I - A)(I + A)^-1`` of skew ``A [..., n, n]`` (orthogonal, det +1), by a linear solve:
    ``(I + A)`` has singular values ``sqrt(1 + sigma^2) >= 1``, so it is always invertible
    (the two factors commute, so ``solve(I + A, I - A)`` is the same matrix). The solve's
    float32 error grows with ``sigma`` (1.4e-6 off orthogonal at skew entries ~10), so one
    Newton-Schulz step ``M (3I - M^T M) / 2`` squares the orthogonality error away."""
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    m = _solve_unpivoted(eye + a, jnp.broadcast_to(eye - a, a.shape))
    return 0.5 * m @ (3 * eye - jnp.swapaxes(m, -1, -2) @ m)


def _solve_unpivoted(mat, rhs):
    """``mat^-1 rhs`` by Gaussian elimination without pivoting, unrolled over the (small) n.

    Safe here: ``I + A`` has a positive definite symmetric part, and so has every Schur
    complement, so no pivot vanishes. Elementwise ops only: the batched LAPACK solve
    (``jnp.linalg.solve``) over every residue hung the CPU training step."""
    n = mat.shape[-1]
    for k in range(n - 1):
        factor = mat[..., k + 1:, k:k + 1] / mat[..., k:k + 1, k:k + 1]  # [..., n-k-1, 1]
        mat = mat.at[..., k + 1:, :].add(-factor * mat[..., k:k + 1, :])
        rhs = rhs.at[..., k + 1:, :].add(-factor * rhs[..., k:k + 1, :])
    rows = [None] * n
    for k in reversed(range(n)):
        acc = rhs[..., k, :]
        for j in range(k + 1, n):
            acc = acc - mat[..., k, j:j + 1] * rows[j]
        rows[k] = acc / mat[..., k, k:k + 1]
    return jnp.stack(rows, -2)


def skew(params, n: int):
    """``[..., n(n-1)/2] -> [..., n, n]`` skew-symmetric."""
    iu = np.triu_indices(n, 1)
    a = jnp.zeros(params.shape[:-1] + (n, n), params.dtype).at[..., iu[0], iu[1]].set(params)
    return a - jnp.swapaxes(a, -1, -2)


# ---------------------------------------------------------------------------------------------
# transformer
# ---------------------------------------------------------------------------------------------

def _zero_linear(n_in, n_out, rngs):
    return nnx.Linear(n_in, n_out, kernel_init=nnx.initializers.zeros, rngs=rngs)


class Attention(nnx.Module):
    """One token mixer (softmax, ceta or gsa) with its output projection (zero-initialised)."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        w, h, d = cfg.encoder_width, cfg.attn_heads, cfg.attn_head_dim
        self.qkv = nnx.Linear(w, 3 * h * d, rngs=rngs)
        self.out = _zero_linear(h * d, w, rngs)
        self.gsa = cfg.attention == "gsa"
        if self.gsa and cfg.gates:
            self.value_gate = nnx.Linear(w, h * d, rngs=rngs)
            self.output_gate = nnx.Linear(w, h * d, rngs=rngs)
        if self.gsa and cfg.topk:
            self.index_q = nnx.Linear(w, h * cfg.indexer_dim, rngs=rngs)
            self.index_k = nnx.Linear(w, cfg.indexer_dim, rngs=rngs)
            self.index_w = nnx.Linear(w, h, rngs=rngs)

    def _split(self, x, m):  # [B, L, H * m] -> [B, H, L, m]
        b, l, _ = x.shape
        return x.reshape(b, l, -1, m).transpose(0, 2, 1, 3)

    def heads(self, x):
        """Queries, keys, values ``[B, H, L, d]`` (rotated by RoPE when on; values gated)."""
        cfg = self.cfg
        q, k, v = jnp.split(self.qkv(x), 3, -1)
        if self.gsa and cfg.gates:
            v = v * jax.nn.sigmoid(self.value_gate(x))
        q, k, v = (self._split(t, cfg.attn_head_dim) for t in (q, k, v))
        if cfg.rope:
            pos = jnp.arange(x.shape[1])
            q, k = rope(q, pos), rope(k, pos)
        return q, k, v

    def index_scores(self, x):
        """Lightning indexer ``I_ij = sum_h w_ih relu(<qI_ih, kI_j>)`` ``[B, L, L]``."""
        b, l, _ = x.shape
        qi = self.index_q(x).reshape(b, l, self.cfg.attn_heads, self.cfg.indexer_dim)
        ki = self.index_k(x)
        s = jax.nn.relu(jnp.einsum("bihe,bje->bhij", qi, ki))
        return jnp.einsum("bhij,bih->bij", s, self.index_w(x)) / math.sqrt(self.cfg.indexer_dim)

    def mix(self, x, lens, *, sparse: bool | None = None, trace: bool = False, solve=None):
        """``(out [B, L, H * d] before the output projection, aux loss, trace dict)``.
        ``solve(q, k, v, lens, config) -> [B, H, L, d]`` replaces a CETA layer's Sinkhorn
        (a compiled operator: ``asap.ceta_solvers``; None: the transport op)."""
        cfg = self.cfg
        b, l, _ = x.shape
        q, k, v = self.heads(x)
        pos = jnp.arange(l)
        key_mask = (pos[None, None, :] < lens[:, None, None])  # [B, 1, L]
        row_mask = (pos[None, :] < lens[:, None]).astype(jnp.float32)
        aux, info = jnp.zeros((), jnp.float32), {}
        if cfg.attention == "ceta":
            tcfg = self.ceta_config(l)
            o = (transport(q, k, v, lens, lens, config=tcfg) if solve is None
                 else solve(q, k, v, lens, tcfg))
            if trace:
                info["plan"] = transport_plan(q, k, lens, lens, config=tcfg)[:, :, :-1, :-1]
        elif cfg.attention == "softmax" or not cfg.topk:
            mask = jnp.broadcast_to(key_mask[:, None], (b, 1, l, l))
            o, p = dense_attention(q, k, v, mask)
            info["plan"] = p
        else:
            iscore = self.index_scores(x)
            kb = topk_per_length(lens, cfg)
            idx, keep = select_keys(iscore, lens, kb, cfg.topk_local, cfg.topk)
            if sparse is None:  # tracing keeps the dense weights for the certificates
                sparse = l >= SPARSE_FROM_LENGTH and not trace
            if sparse:
                lidx, lvalid = local_keys(lens, l, cfg.topk_local)
                all_idx = jnp.concatenate([idx, jnp.broadcast_to(lidx, (b,) + lidx.shape)], -1)
                o = gathered_attention(q, k, v, all_idx, jnp.concatenate([keep, lvalid], -1))
            else:
                sel = selection_mask(idx, keep, lens, l, cfg.topk_local)
                o, p = dense_attention(q, k, v, sel[:, None])
                info["plan"] = p
            if cfg.indexer_weight > 0 or trace:
                _, dense_p = dense_attention(q, k, v, jnp.broadcast_to(key_mask[:, None], (b, 1, l, l)))
                kl = indexer_kl(dense_p, iscore, key_mask, row_mask)
                aux = cfg.indexer_weight * kl if cfg.indexer_weight > 0 else aux
            if trace:
                info.update(k=kb, selected=selection_mask(idx, keep, lens, l, cfg.topk_local),
                            indexer_kl=kl)
        o = o.transpose(0, 2, 1, 3).reshape(b, l, -1) * row_mask[..., None]  # padding rows: 0
        if self.gsa and cfg.gates:
            o = o * jax.nn.sigmoid(self.output_gate(x))
        return o, aux, info

    def ceta_config(self, length: int) -> TransportConfig:
        band = self.cfg.attn_band or length
        return TransportConfig(half_band=band, eps=1.0, base_steps=self.cfg.ceta_steps,
                               tail_steps=2, dustbin="none")

    def __call__(self, x, lens, trace: bool = False, solve=None):
        o, aux, info = self.mix(x, lens, trace=trace, solve=solve)
        return self.out(o), aux, info


class MLP(nnx.Module):
    def __init__(self, width: int, ratio: int, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(width, ratio * width, rngs=rngs)
        self.down = _zero_linear(ratio * width, width, rngs)

    def __call__(self, x, lens, trace: bool = False):
        return self.down(jax.nn.gelu(self.up(x))), jnp.zeros((), jnp.float32), {}


class HyperConnection(nnx.Module):
    """Cayley-mixed streams around one sublayer: ``h = sum_s a_s X_s``, ``X <- M X + b y``.

    Static parts are 1-D parameters (``a``: 1/n, ``b``: distinct values of mean 1, a different
    rotation per sublayer, ``A``: 0), per-residue parts come from zero-initialised linear maps
    of the LayerNorm of the mean stream: at init ``h`` is the (common) stream and ``M = I``."""

    def __init__(self, width: int, n: int, index: int, *, rngs: nnx.Rngs):
        self.n = n
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.dynamic = _zero_linear(width, 2 * n + n * (n - 1) // 2, rngs)
        self.a = nnx.Param(jnp.full((n,), 1.0 / n, jnp.float32))
        spread = np.linspace(-0.5, 0.5, n) if n > 1 else np.zeros(1)
        self.b = nnx.Param(jnp.asarray(1.0 + np.roll(spread, index), jnp.float32))
        self.skew = nnx.Param(jnp.zeros((n * (n - 1) // 2,), jnp.float32))

    def coefficients(self, xs):
        """``a [B, L, n]``, ``b [B, L, n]``, ``M [B, L, n, n]`` for streams ``xs [B, L, n, W]``."""
        n = self.n
        dyn = self.dynamic(self.norm(jnp.mean(xs, 2)))
        a = self.a[...] + dyn[..., :n]
        b = self.b[...] + dyn[..., n:2 * n]
        mix = cayley(skew(self.skew[...] + dyn[..., 2 * n:], n))
        return a, b, mix

    def __call__(self, xs, lens, sublayer, mask, trace: bool = False):
        a, b, mix = self.coefficients(xs)
        h = jnp.einsum("bls,blsw->blw", a, xs)
        y, aux, info = sublayer(h, lens, trace)
        xs = jnp.einsum("blst,bltw->blsw", mix, xs) + b[..., None] * y[:, :, None, :]
        return xs * mask[..., None], aux, {**info, "mix": mix} if trace else info


class Block(nnx.Module):
    """Pre-norm attention then MLP, each with its residual (plain or hyper-connections)."""

    def __init__(self, cfg, layer: int, *, rngs: nnx.Rngs):
        w = cfg.encoder_width
        self.norm1 = nnx.LayerNorm(w, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.norm2 = nnx.LayerNorm(w, rngs=rngs)
        self.mlp = MLP(w, cfg.mlp_ratio, rngs=rngs)
        self.cayley = cfg.residual == "cayley"
        if self.cayley:
            self.hc1 = HyperConnection(w, cfg.streams, 2 * layer, rngs=rngs)
            self.hc2 = HyperConnection(w, cfg.streams, 2 * layer + 1, rngs=rngs)

    def _attn(self, x, lens, trace=False, solve=None):
        return self.attn(self.norm1(x), lens, trace, solve)

    def _mlp(self, x, lens, trace=False):
        return self.mlp(self.norm2(x), lens, trace)

    def __call__(self, x, lens, mask, trace: bool = False, solve=None):
        """x ``[B, L, W]`` (plain) or ``[B, L, n, W]`` (cayley) -> (x, aux loss, trace info:
        the attention's and the first mixing matrix ``mix``). ``solve``: see ``Attention.mix``."""
        if self.cayley:
            attn = lambda h, lens, trace: self._attn(h, lens, trace, solve)
            x, aux, info = self.hc1(x, lens, attn, mask, trace)
            x, _, _ = self.hc2(x, lens, self._mlp, mask)
            return x, aux, info
        y, aux, info = self._attn(x, lens, trace, solve)
        x = (x + y) * mask
        y, _, _ = self._mlp(x, lens)
        return (x + y) * mask, aux, info


class TransformerEncoder(nnx.Module):
    """Dense(D -> width), attention blocks, LayerNorm (of the stream mean with hyper-connections)."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.inp = nnx.Linear(cfg.feature_dim, cfg.encoder_width, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.encoder_layers)])
        self.norm = nnx.LayerNorm(cfg.encoder_width, rngs=rngs)

    def streams(self, feat, lens, trace: bool = False, ceta=None):
        """Per-layer states: a list of ``[B, L, W]`` (plain) or ``[B, L, n, W]`` (cayley), the
        input projection first; the summed auxiliary loss; with ``trace`` also each layer's
        trace info (attention weights ``plan [B, H, L, L]``, gsa's ``k`` and ``selected``, the
        mixing matrices). ``ceta``: one solver per layer replacing its CETA Sinkhorn
        (``Attention.mix``), or None."""
        mask = length_mask(feat.shape[1], lens)
        x = self.inp(feat * mask) * mask
        if self.cfg.residual == "cayley":
            x = jnp.broadcast_to(x[:, :, None, :], x.shape[:2] + (self.cfg.streams,) + x.shape[2:])
        states, aux, infos = [x], jnp.zeros((), jnp.float32), []
        for i, block in enumerate(self.blocks):
            x, a, info = block(x, lens, mask, trace, ceta[i] if ceta is not None else None)
            states.append(x)
            infos.append(info)
            aux = aux + a
        return (states, aux, infos) if trace else (states, aux)

    def __call__(self, feat, lens, ceta=None):  # [B, L, D], [B] -> ([B, L, W], aux loss)
        mask = length_mask(feat.shape[1], lens)
        states, aux = self.streams(feat, lens, ceta=ceta)
        x = states[-1]
        if x.ndim == 4:  # the streams' mean: at init every stream is the input projection
            x = jnp.mean(x, 2)
        return self.norm(x) * mask, aux


# ---------------------------------------------------------------------------------------------
# certificates of the encoder (``pfamalign certify``: ``encoder.layers[i]``)
# ---------------------------------------------------------------------------------------------

def layer_report(encoder: TransformerEncoder, feats: list) -> list[dict]:
    """Per layer, over the sequences ``feats`` (each ``[L, D]``): the attention kind and the
    diagnostics of its weights (JSON-ready). CETA: ``sender_error`` (max |row sum - 1|) and
    ``receiver_error`` (max |column sum - 1|) of the plan; softmax and gsa (row softmaxes):
    ``receiver_imbalance`` ``||A^T 1 - 1||_inf``, ``tail_mass_median`` (median over rows of
    ``1 - max_j A_ij``) and ``locked_fraction`` (rows with ``max_j A_ij >= 0.9999``), computed by
    ``pfamalign.alignment.certificates`` (``receiver_mass_imbalance``, ``tail_mass``,
    ``locked_fraction``); gsa also the ``k`` used per sequence and ``local_share`` (selected keys
    inside the local window, of all selected); Cayley mixing: ``cayley_orthogonality_error``
    (max ``|M^T M - I|``) and ``stream_spread`` (max over residues of the streams' distance to
    their mean, relative to the mean's norm)."""
    from pfamalign.alignment import certificates as cert

    cfg = encoder.cfg
    lens = np.array([len(f) for f in feats], np.int32)
    x = np.zeros((len(feats), int(lens.max()), feats[0].shape[1]), np.float32)
    for n, f in enumerate(feats):
        x[n, : len(f)] = f
    states, _, infos = encoder.streams(jnp.asarray(x), jnp.asarray(lens), trace=True)
    out = []
    for i, info in enumerate(infos):
        entry = {"layer": i, "attention": cfg.attention}
        plan = np.asarray(info["plan"], np.float64) if "plan" in info else None
        rows = [(n, plan[n, :, : lens[n], : lens[n]]) for n in range(len(feats))] if plan is not None else []
        if cfg.attention == "ceta":
            entry["sender_error"] = max(float(np.abs(p.sum(-1) - 1).max()) for _, p in rows)
            entry["receiver_error"] = max(cert.receiver_mass_imbalance(p) for _, p in rows)
        elif rows:
            pmax = np.concatenate([p.max(-1).ravel() for _, p in rows])
            entry["receiver_imbalance"] = max(cert.receiver_mass_imbalance(p) for _, p in rows)
            entry["tail_mass_median"] = float(np.median(
                np.concatenate([cert.tail_mass(p).ravel() for _, p in rows])))
            entry["locked_fraction"] = cert.locked_fraction(pmax)
        if "selected" in info:
            sel = np.asarray(info["selected"])
            pos = np.arange(sel.shape[-1])
            near = np.abs(pos[:, None] - pos[None, :]) <= cfg.topk_local
            picked = [sel[n, : lens[n], : lens[n]] for n in range(len(feats))]
            entry["k"] = [int(k) for k in np.asarray(info["k"])]
            entry["local_share"] = (sum(int((p & near[: len(p), : len(p)]).sum()) for p in picked)
                                    / max(sum(int(p.sum()) for p in picked), 1))
            entry["indexer_kl"] = float(info["indexer_kl"])
        if "mix" in info:
            mix = np.asarray(info["mix"], np.float64)
            real = np.concatenate([mix[n, : lens[n]] for n in range(len(feats))])
            eye = np.eye(mix.shape[-1])
            entry["cayley_orthogonality_error"] = float(
                np.abs(np.swapaxes(real, -1, -2) @ real - eye).max())
            xs = np.asarray(states[i + 1], np.float64)
            real_x = np.concatenate([xs[n, : lens[n]] for n in range(len(feats))])  # [R, n, W]
            mean = real_x.mean(1, keepdims=True)
            entry["stream_spread"] = float((np.linalg.norm(real_x - mean, axis=-1).max(-1)
                                            / np.maximum(np.linalg.norm(mean[:, 0], axis=-1), 1e-12)).max())
        out.append(entry)
    return out
