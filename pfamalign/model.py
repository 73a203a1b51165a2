"""The aligner: a Siamese residue encoder, per-head projections and the transport op.

``Aligner`` maps the per-residue features of a (query, key) pair to queries, keys and values
per head, and transports the key values onto the query rows with the banded, dustbin-augmented
Sinkhorn plan of :func:`pfamalign.kernels.transport`. ``aligner_loss`` gives the training
objective of docs/design.md §5; ``Aligner.plan`` gives the dense plan used for decoding and evaluation.

Shapes: B pairs, Lq / Lk padded lengths, D feature dim, H heads, d head dim, dv value dim.

Losses (all means pooled over the whole batch, so a data-parallel step sees the global mean):

* **reconstruction** ``||O_i - V_{c_i}||^2`` (summed over value dims) over annotated query rows
  (``target[i] = c_i >= 0``), mean over rows and heads. Values are **L2-normalised per
  position** (``V_j = v_j / ||v_j||``; the dustbin value token too) before they enter the op, so
  shrinking the value projection cannot lower it: the loss is invariant to any rescaling of
  V (tested). What remains exploitable is *collapse*: constant values make every plan
  reconstruct perfectly. ``value_spread = 1 - ||mean_j V_j||^2`` (1 for spread, 0 for collapsed
  values) is logged to watch for it, and the configuration built to align (``align_ce``)
  optimises the sparse CE, which no choice of V can lower.
* **sparse CE** ``-log P_{i, t_i}`` from the op's ``target_logp``: aligned rows target their
  key ``c_i``; unaligned rows target the dustbin column in dustbin configurations and are left
  out otherwise; padding is left out. Entries that are off the support (``-inf``, e.g. a target
  outside the band) are masked out of the mean and counted (``ce_offsupport``).
* **monotonicity** mean over consecutive annotated rows ``(i, i + 1)`` of
  ``relu(b_i - b_{i+1})``, with the barycenter ``b_i = sum_j P_ij j / sum_j P_ij`` over the real
  keys computed differentiably *through the op*: two extra value columns ``[j / k_len, 1]``
  (dustbin value 0) give ``O_i0 / O_i1 = b_i / k_len``. Positions enter normalised by the key
  length (well-scaled values); the penalty is reported in residues (``b`` times ``k_len``).

The total is ``recon_weight * recon + ce_weight * ce + mono_weight * mono`` plus the encoder's
auxiliary loss (``encoder_aux``: the gsa indexer's weighted KL, ``pfamalign.encoder``; else 0).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from pfamalign.kernels import (DustbinTokens, TransportConfig, scaling_plan_of_scores, transport,
                               transport_plan)
from pfamalign.kernels.config import einsum
from pfamalign.kernels.reference import extend_with_token
from pfamalign.kernels.scaling import scaling_applies
from pfamalign import encoder as encoders, jsonio
from pfamalign.encoder import length_mask as _length_mask
from pfamalign.pipelines.embed import feature_layout

_NORM_EPS = 1e-20  # inside the rsqrt of the value normalisation (float32: negligible)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AlignerConfig:
    """Everything needed to rebuild an aligner (saved as ``config.json`` in a model directory).

    Attributes:
      name: the named configuration it came from (``pfamalign.configs``).
      feature_dim: D, the per-residue feature dimension of the dataset.
      embedder_id: the embedder that produced the features (``builtin/onehot+blosum62``,
        ``esm2_t6_8M_UR50D/layer6``); ``align`` embeds new sequences with it.
      encoder: ``"none"`` (projections read the features), ``"conv"`` (a Siamese residual
        Conv1D stack: Dense(D -> width), then ``encoder_layers`` blocks of
        LayerNorm -> Conv1D(width, kernel_size, SAME) -> GELU -> Dense(width), residual, then a
        final LayerNorm; padding positions are zeroed before every convolution) or
        ``"transformer"`` (``encoder_layers`` attention + MLP blocks; ``pfamalign.encoder``).
      encoder_width, encoder_layers, kernel_size: the conv encoder's shape (width and layers
        also the transformer's).
      attention, residual, streams, attn_heads, attn_head_dim, mlp_ratio, rope, gates, topk,
        topk_fraction, topk_min, topk_local, indexer_dim, indexer_weight, attn_band, ceta_steps:
        the transformer encoder (``pfamalign.encoder`` documents each); ignored otherwise.
      heads, head_dim, value_dim: H, d, dv of the per-head projections.
      position_features: P (even) Fourier features of the relative position
        ``p_i = i / (len - 1)``, ``[sin(pi m p), cos(pi m p)]`` for m = 1..P/2, appended to the
        projections' input: ``<q_i, k_j>`` can then express a smooth kernel in ``p_i - p_j``
        (a learned diagonal prior, resolution ~ len / (P/2)). 0 = none.
      substitution_window: r >= 0 adds a windowed-substitution channel to every head's scores:
        ``sum_{|o| <= r} w_o BLOSUM62(a_{i+o}, b_{j+o})`` with 2r + 1 learned weights (a
        diagonal window of the substitution matrix: the ungapped local similarity that makes
        alignments robust at low identity; the learned part of q, k adds context). It reads the
        one-hot and BLOSUM62-row columns that the embedder's ``feature_layout`` names (the
        ``builtin/onehot+blosum62`` features have both); -1 = off.
      transport: the transport op's settings (band, eps, T, R, dustbin mode, implementation).
      recon_weight, ce_weight, mono_weight: loss weights (docs/design.md §5; see the module docstring).
      token_init_scale: std of the dustbin tokens' initialisation.
    """

    name: str
    feature_dim: int
    embedder_id: str
    transport: TransportConfig
    encoder: str = "none"
    encoder_width: int = 128
    encoder_layers: int = 3
    kernel_size: int = 9
    heads: int = 4
    head_dim: int = 32
    value_dim: int = 32
    position_features: int = 0
    substitution_window: int = -1
    recon_weight: float = 1.0
    ce_weight: float = 0.0
    mono_weight: float = 0.0
    token_init_scale: float = 0.02
    attention: str = "softmax"
    residual: str = "plain"
    streams: int = 4
    attn_heads: int = 4
    attn_head_dim: int = 32
    mlp_ratio: int = 3
    rope: bool = True
    gates: bool = True
    topk: int = 64
    topk_fraction: float = 0.25
    topk_min: int = 16
    topk_local: int = 8
    indexer_dim: int = 16
    indexer_weight: float = 0.1
    attn_band: int = 0
    ceta_steps: int = 15

    def __post_init__(self):
        if not isinstance(self.transport, TransportConfig):
            raise ValueError(f"transport must be a TransportConfig, got {type(self.transport)}")
        encoders.check_config(self)
        for field in ("feature_dim", "heads", "head_dim", "value_dim", "encoder_width",
                      "kernel_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        if (not isinstance(self.position_features, int) or self.position_features < 0
                or self.position_features % 2):
            raise ValueError(f"position_features must be an even integer >= 0, got "
                             f"{self.position_features!r}")
        if not isinstance(self.substitution_window, int) or self.substitution_window < -1:
            raise ValueError(f"substitution_window must be an integer >= -1, got {self.substitution_window!r}")
        if self.substitution_window >= 0 and not feature_layout(self.embedder_id).has_substitution:
            raise ValueError(f"substitution_window needs features with one-hot and BLOSUM62 rows (such as "
                             f"builtin/onehot+blosum62), got embedder {self.embedder_id!r}; set substitution_window=-1")
        if not isinstance(self.encoder_layers, int) or self.encoder_layers < 0:
            raise ValueError(f"encoder_layers must be an integer >= 0, got {self.encoder_layers!r}")
        weights = (self.recon_weight, self.ce_weight, self.mono_weight)
        if any(w < 0 for w in weights):
            raise ValueError(f"loss weights must be >= 0, got recon={self.recon_weight}, "
                             f"ce={self.ce_weight}, mono={self.mono_weight}")
        if not any(w > 0 for w in weights):
            raise ValueError("at least one loss weight (recon_weight, ce_weight, mono_weight) "
                             "must be > 0")

    @property
    def dustbin(self) -> bool:
        return self.transport.dustbin != "none"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``from_dict`` inverts it)."""
        out = dataclasses.asdict(self)
        out["transport"] = self.transport.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AlignerConfig":
        data = jsonio.check_fields(cls, data, "AlignerConfig")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in data]
        if missing:
            raise ValueError(f"AlignerConfig: missing field(s) {', '.join(missing)}")
        data["transport"] = TransportConfig.from_dict(data["transport"])
        return cls(**data)

    def to_json(self) -> str:
        return jsonio.dumps(self.to_dict(), sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------

class Transported(NamedTuple):
    """What the aligner's forward pass returns."""

    out: jax.Array  # [B, H, Lq, dv]  O = P V (unit-norm V; includes the dustbin value)
    bary: jax.Array  # [B, H, Lq]     barycenter over the real keys, in residues
    mass: jax.Array  # [B, H, Lq]     row mass on the real keys
    dustbin_mass: jax.Array  # [B, H, Lq]  row mass on the dustbin column (0 without one)
    target_logp: jax.Array | None  # [B, H, Lq]  log P_{i, t_i}
    values: jax.Array  # [B, H, Lk, dv]  unit-norm values
    aux: jax.Array | float = 0.0  # the encoder's auxiliary loss (gsa's indexer KL, weighted)


class Aligner(nnx.Module):
    """Siamese encoder + per-head q / k / v projections + learned dustbin tokens + transport.

    The query sequence gives the queries, the key sequence the keys and values (both through
    the same encoder). Scores are ``exp(log_temp) <q_i, k_j> / (sqrt(d) eps)``.
    """

    def __init__(self, cfg: AlignerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        h, d, dv = cfg.heads, cfg.head_dim, cfg.value_dim
        self.encoder, width = encoders.build_encoder(cfg, rngs=rngs)
        width += cfg.position_features
        self.q_proj = nnx.Linear(width, h * d, rngs=rngs)
        self.k_proj = nnx.Linear(width, h * d, rngs=rngs)
        self.v_proj = nnx.Linear(width, h * dv, rngs=rngs)
        self.log_temp = nnx.Param(jnp.zeros((), jnp.float32))
        if cfg.substitution_window >= 0:  # log-weights of the window offsets, start uniform
            self.substitution_logw = nnx.Param(jnp.zeros((2 * cfg.substitution_window + 1,), jnp.float32))
        d_total = d + self.substitution_dim
        if cfg.dustbin:
            init = nnx.initializers.normal(cfg.token_init_scale)
            self.dustbin_q = nnx.Param(init(rngs.params(), (h, d_total), jnp.float32))
            self.dustbin_k = nnx.Param(init(rngs.params(), (h, d_total), jnp.float32))
            self.dustbin_v = nnx.Param(init(rngs.params(), (h, dv), jnp.float32))

    # -- pieces ----------------------------------------------------------------------------

    def encode(self, feat, lens, *, ceta=None):
        """[B, L, D], [B] -> ([B, L, width + P] (zero on padding): the encoder's output and
        the relative-position features; the encoder's auxiliary loss). ``ceta``: one solver
        per transformer layer replacing its CETA Sinkhorn (compiled operators, ``asap``)."""
        feat = jnp.asarray(feat, jnp.float32)
        mask = _length_mask(feat.shape[1], lens)
        h, aux = (feat * mask, jnp.zeros((), jnp.float32)) if self.encoder is None \
            else self.encoder(feat, lens) if ceta is None else self.encoder(feat, lens, ceta=ceta)
        if self.cfg.position_features:
            h = jnp.concatenate([h, position_features(feat.shape[1], lens,
                                                      self.cfg.position_features) * mask], -1)
        return h, aux

    @property
    def substitution_dim(self) -> int:
        """Width of the windowed-substitution channel appended to every head's q and k."""
        r = self.cfg.substitution_window
        return (2 * r + 1) * len(feature_layout(self.cfg.embedder_id).alphabet) if r >= 0 else 0

    def substitution(self, feat, lens, side: str):
        """``[B, H, L, (2r+1) * A]`` (A letters): the window's shifted one-hots (``side="q"``) or
        BLOSUM62 rows (``side="k"``), as the embedder's feature layout places and scales them,
        so that ``<q_i, k_j> = sum_o w_o BLOSUM62(a_{i+o}, b_{j+o})``."""
        r = self.cfg.substitution_window
        part = self._substitution_part(feat, lens, side)
        scale = jnp.exp(0.5 * self.substitution_logw[...])  # sqrt(w_o) on each side
        length = feat.shape[1]
        padded = jnp.pad(part, ((0, 0), (r, r), (0, 0)))  # zero outside the sequence
        shifted = [padded[:, r + o : r + o + length] * scale[o + r] for o in range(-r, r + 1)]
        out = jnp.concatenate(shifted, -1)  # position i holds residues i - r .. i + r
        return jnp.broadcast_to(out[:, None], (out.shape[0], self.cfg.heads) + out.shape[1:])

    def _substitution_part(self, feat, lens, side: str):
        """``[B, L, A]``: each residue's one-hot (``side="q"``) or scaled BLOSUM62 row
        (``side="k"``), zero beyond each length."""
        layout = feature_layout(self.cfg.embedder_id)
        feat = jnp.asarray(feat, jnp.float32) * _length_mask(feat.shape[1], lens)
        return (feat[..., layout.onehot] if side == "q"
                else layout.substitution_scale * feat[..., layout.substitution_rows])

    def _heads(self, x, m):  # [B, L, H * m] -> [B, H, L, m]
        b, l, _ = x.shape
        return x.reshape(b, l, self.cfg.heads, m).transpose(0, 2, 1, 3)

    def project(self, q_feat, k_feat, q_len, k_len, *, encoded=None, ceta=None):
        """Queries ``[B, H, Lq, d']``, keys ``[B, H, Lk, d']`` (d' = d + the substitution
        channel) and unit-norm values ``[B, H, Lk, dv]``, plus the dustbin tokens (None
        without a dustbin). ``encoded``: the two sequences' ``encode`` outputs, if known;
        ``ceta``: as ``encode``."""
        return self._project(q_feat, k_feat, q_len, k_len, encoded=encoded, ceta=ceta)[:4]

    def _project(self, q_feat, k_feat, q_len, k_len, *, encoded=None, ceta=None):
        """``project``'s outputs and the encoder's auxiliary loss (both sequences)."""
        cfg = self.cfg
        (hq, aux_q), (hk, aux_k) = encoded if encoded is not None else (
            self.encode(q_feat, q_len, ceta=ceta), self.encode(k_feat, k_len, ceta=ceta))
        q = self._heads(self.q_proj(hq), cfg.head_dim)
        k = self._heads(self.k_proj(hk), cfg.head_dim)
        if cfg.substitution_window >= 0:  # [learned | windowed substitution] per head
            q = jnp.concatenate([q, self.substitution(q_feat, q_len, "q")], -1)
            k = jnp.concatenate([k, self.substitution(k_feat, k_len, "k")], -1)
        q = q * jnp.exp(self.log_temp[...])
        v = normalize(self._heads(self.v_proj(hk), cfg.value_dim))
        tokens = None
        if cfg.dustbin:
            tokens = DustbinTokens(self.dustbin_q[...] * jnp.exp(self.log_temp[...]),
                                   self.dustbin_k[...], normalize(self.dustbin_v[...]))
        return q, k, v, tokens, 0.5 * (aux_q + aux_k)

    def dense_scores(self, q_feat, k_feat, q_len, k_len, *, encoded=None):
        """The extended scores ``[B, H, Lq + 1, Lk + 1]`` at eps = 1 of ``project``'s queries,
        keys and dustbin tokens (``dense_problem``'s: ``<q, k> / sqrt(d')``, the tokens in
        the last row and column), equal to forming them but cheaper: the windowed
        substitution channel -- ``(2r + 1) A`` of the ``d'`` dimensions, 425 of 489 in the
        shipped model -- enters as ``2r + 1`` shifted adds along the diagonals of the
        ``[Lq, Lk]`` substitution matrix, not as a dot product of that width."""
        cfg, d = self.cfg, self.cfg.head_dim
        (hq, _), (hk, _) = encoded if encoded is not None else (
            self.encode(q_feat, q_len), self.encode(k_feat, k_len))
        temp = jnp.exp(self.log_temp[...])
        q = self._heads(self.q_proj(hq), d) * temp
        k = self._heads(self.k_proj(hk), d)
        width = d + self.substitution_dim
        if cfg.dustbin:
            tq, tk = self.dustbin_q[...] * temp, self.dustbin_k[...]
        else:  # the reference's empty dustbin slot: zero tokens (the support excludes it)
            tq = tk = jnp.zeros((cfg.heads, width), jnp.float32)
        dots = einsum("bhid,bhjd->bhij", extend_with_token(q, tq[:, :d]), extend_with_token(k, tk[:, :d]))
        r = cfg.substitution_window
        if r >= 0:  # what the channel adds (``substitution``): temp on the query side
            f, g = self._substitution_part(q_feat, q_len, "q"), self._substitution_part(k_feat, k_len, "k")
            b, h, offsets = f.shape[0], cfg.heads, 2 * r + 1
            root = jnp.exp(0.5 * self.substitution_logw[...])  # sqrt(w_o), [2r + 1]
            tq_sub, tk_sub = (t[:, d:].reshape(h, offsets, f.shape[-1]) for t in (tq, tk))
            pairs = temp * _diagonal_sum(einsum("bia,bja->bij", f, g), root * root, r)  # [B, Lq, Lk]
            to_bin = temp * _offset_sum(einsum("bia,hoa->bhio", f, tk_sub) * root, r)  # [B, H, Lq]
            from_bin = _offset_sum(einsum("bja,hoa->bhjo", g, tq_sub) * root, r)  # [B, H, Lk]
            corner = jnp.broadcast_to((tq_sub * tk_sub).sum((-2, -1))[None, :, None], (b, h, 1))
            rows = jnp.concatenate([jnp.broadcast_to(pairs[:, None], (b, h) + pairs.shape[1:]),
                                    to_bin[..., None]], -1)
            dots = dots + jnp.concatenate([rows, jnp.concatenate([from_bin, corner], -1)[:, :, None]], -2)
        return dots / jnp.sqrt(jnp.asarray(width, dots.dtype))

    # -- forward -----------------------------------------------------------------------------

    def __call__(self, q_feat, k_feat, q_len, k_len, *, targets=None):
        """Transport with the barycenter columns.

        Returns a ``Transported`` (``target_logp`` is None without targets).
        """
        cfg = self.cfg
        q_len, k_len = jnp.asarray(q_len, jnp.int32), jnp.asarray(k_len, jnp.int32)
        q, k, v, tokens, aux = self._project(q_feat, k_feat, q_len, k_len)
        b, h, lk, dv = v.shape
        klen = jnp.maximum(k_len, 1).astype(jnp.float32)  # [B]
        pos = jnp.arange(lk, dtype=jnp.float32)[None, :] / klen[:, None]  # [B, Lk]
        # extra value columns: [j / k_len, 1, 0] on real keys, [0, 0, 1] on the dustbin
        extra = jnp.stack([pos, jnp.ones_like(pos), jnp.zeros_like(pos)], -1)  # [B, Lk, 3]
        v_ext = jnp.concatenate([v, jnp.broadcast_to(extra[:, None], (b, h, lk, 3))], -1)
        if tokens is not None:
            tv_extra = jnp.broadcast_to(jnp.array([0.0, 0.0, 1.0], v.dtype), (h, 3))
            tokens = DustbinTokens(tokens.q, tokens.k, jnp.concatenate([tokens.v, tv_extra], -1))
        res = transport(q, k, v_ext, q_len, k_len, tokens, config=cfg.transport,
                        targets=targets)
        out_ext, logp = (res.out, res.target_logp) if targets is not None else (res, None)
        out = out_ext[..., :dv]  # [B, H, Lq, dv]
        mass = out_ext[..., dv + 1]  # [B, H, Lq] row mass on the real keys
        bary = out_ext[..., dv] / jnp.maximum(mass, 1e-9) * klen[:, None, None]
        return Transported(out, bary, mass, out_ext[..., dv + 2], logp, v, aux)

    def plan(self, q_feat, k_feat, q_len, k_len):
        """Head-mean dense plan ``[B, Lq + 1, Lk + 1]``: real queries then the dustbin row,
        real keys then the dustbin column (zero without a dustbin). Rows beyond ``q_len`` and
        keys beyond ``k_len`` are zero. For decoding, evaluation and certificates (no
        gradient; memory Lq x Lk per pair and head). Solved in the scaling domain, by the
        reference where that leaves float32's range (``dense_scores``, ``scaling_plan_of_scores``)."""
        return fast_or_reference(_plan_jit, (self,), q_feat, k_feat, q_len, k_len)

    def head_plans(self, q_feat, k_feat, q_len, k_len, *, encoded=None):
        """Per-head dense plans ``[B, H, Lq + 1, Lk + 1]`` (last row / column: the dustbin)
        and the unit-norm values ``[B, H, Lk, dv]`` and dustbin value ``[H, dv]`` (zeros
        without a dustbin)."""
        q, k, v, tokens = self.project(q_feat, k_feat, q_len, k_len, encoded=encoded)
        plan = transport_plan(q, k, q_len, k_len, tokens, config=self.cfg.transport)
        tv = tokens.v if tokens is not None else jnp.zeros(v.shape[1:2] + v.shape[-1:], v.dtype)
        return plan, v, tv


    def plans_both_ways(self, a_feat, b_feat, a_len, b_len, *, encoded=None):
        """``plan`` of A against B and of B against A (``[B, La + 1, Lb + 1]``, ``[B, Lb + 1, La + 1]``),
        each sequence encoded once: what a symmetrized alignment needs. ``encoded``: the two
        sides' ``encodings``, if known (``inference.Predictor`` keeps them across batches)."""
        return _both_ways((_plans_both_ways_jit, _plans_both_ways_encoded_jit), (self,),
                          a_feat, b_feat, a_len, b_len, encoded)

    def encodings(self, feat, lens):
        """``encode``'s output alone (``[B, L, width + P]``), jitted: what ``plans_both_ways``
        takes as ``encoded``."""
        return _encodings_jit(self, jnp.asarray(feat, jnp.float32), jnp.asarray(lens, jnp.int32))


def fast_or_reference(program, lead: tuple, q_feat, k_feat, q_len, k_len, *more):
    """``program``'s plans by the scaling solve, or by the reference where it was not safe
    (two separate programs: one holding both would trace and load twice the code per call).
    ``lead``: the program's arguments before the features (the model, or its split halves);
    ``more``: its arguments after them."""
    args = (*lead, jnp.asarray(q_feat, jnp.float32), jnp.asarray(k_feat, jnp.float32),
            jnp.asarray(q_len, jnp.int32), jnp.asarray(k_len, jnp.int32), *more)
    plans, safe = program(*args, solver="scaling")
    return plans if bool(safe) else program(*args, solver="reference")[0]


def _both_ways(programs, lead: tuple, a_feat, b_feat, a_len, b_len, encoded):
    """``plans_both_ways`` by one of ``programs`` (from the features, from the ``encoded``
    sides), the model reached through ``lead`` (``fast_or_reference``)."""
    from_features, from_encodings = programs
    if encoded is None:
        return fast_or_reference(from_features, lead, a_feat, b_feat, a_len, b_len)
    return fast_or_reference(from_encodings, lead, a_feat, b_feat, a_len, b_len,
                              *(jnp.asarray(h, jnp.float32) for h in encoded))


def _mean_plan(model: Aligner, q_feat, k_feat, q_len, k_len, encoded=None, *, solver: str):
    """(head-mean plan ``[B, Lq + 1, Lk + 1]``, safe): ``solver`` ``"reference"``
    (``transport_plan``, always safe) or ``"scaling"`` (``dense_scores``, then
    ``scaling_plan_of_scores``; the reference where the scaling solve does not apply)."""
    if solver == "reference":
        plan, _, _ = model.head_plans(q_feat, k_feat, q_len, k_len, encoded=encoded)
        return plan.mean(axis=1), jnp.array(True)
    if not scaling_applies(model.cfg.transport):  # the reference plan, safe
        return _mean_plan(model, q_feat, k_feat, q_len, k_len, encoded, solver="reference")
    scores = model.dense_scores(q_feat, k_feat, q_len, k_len, encoded=encoded)
    plan, safe = scaling_plan_of_scores(scores, q_len, k_len, config=model.cfg.transport)
    return plan.mean(axis=1), safe


@functools.partial(nnx.jit, static_argnames="solver")
def _plan_jit(model: Aligner, q_feat, k_feat, q_len, k_len, *, solver: str):
    return _mean_plan(model, q_feat, k_feat, q_len, k_len, solver=solver)


def _plans_both_ways(model: Aligner, a_feat, b_feat, a_len, b_len, *, solver: str):
    if a_feat.shape != b_feat.shape:  # two sides of their own shapes
        ha, hb = model.encode(a_feat, a_len)[0], model.encode(b_feat, b_len)[0]
    else:  # one encoder call for both sides: traced once
        n = a_feat.shape[0]
        h = model.encode(jnp.concatenate([a_feat, b_feat]), jnp.concatenate([a_len, b_len]))[0]
        ha, hb = h[:n], h[n:]
    return _plans_both_ways_encoded(model, a_feat, b_feat, a_len, b_len, ha, hb, solver=solver)


def _plans_both_ways_encoded(model: Aligner, a_feat, b_feat, a_len, b_len, ha, hb, *, solver: str):
    none = jnp.zeros((), jnp.float32)  # the encoder's auxiliary loss: no part of a plan
    if a_feat.shape != b_feat.shape:  # two directions of their own shapes
        ab, safe_ab = _mean_plan(model, a_feat, b_feat, a_len, b_len, ((ha, none), (hb, none)), solver=solver)
        ba, safe_ba = _mean_plan(model, b_feat, a_feat, b_len, a_len, ((hb, none), (ha, none)), solver=solver)
        return (ab, ba), safe_ab & safe_ba
    # one batch of both directions (A against B, then B against A): the scores and the
    # solve are traced once, a smaller program to trace and load on every call
    n = a_feat.shape[0]
    swap = lambda x: jnp.concatenate([x[n:], x[:n]])  # noqa: E731
    feat, lens, h = jnp.concatenate([a_feat, b_feat]), jnp.concatenate([a_len, b_len]), jnp.concatenate([ha, hb])
    plans, safe = _mean_plan(model, feat, swap(feat), lens, swap(lens), ((h, none), (swap(h), none)), solver=solver)
    return (plans[:n], plans[n:]), safe


def _encodings(model: Aligner, feat, lens):
    return model.encode(feat, lens)[0]


_plans_both_ways_jit = nnx.jit(_plans_both_ways, static_argnames="solver")
_plans_both_ways_encoded_jit = nnx.jit(_plans_both_ways_encoded, static_argnames="solver")
_encodings_jit = nnx.jit(_encodings)


def _on_split(fn):
    """``fn(model, *args, solver=...)`` as a ``jax.jit`` program of ``(graph, state, *args)``
    (``nnx.split``'s two halves; the graph static)."""
    def run(graph, state, *args, **static):
        return fn(nnx.merge(graph, state), *args, **static)

    return jax.jit(run, static_argnums=0, static_argnames="solver")


_plans_both_ways_split = _on_split(_plans_both_ways)
_plans_both_ways_encoded_split = _on_split(_plans_both_ways_encoded)
_encodings_split = _on_split(_encodings)


class FrozenAligner:
    """``Aligner.encodings`` and ``Aligner.plans_both_ways`` of a model that no longer trains
    (``inference.Predictor``), as plain ``jax.jit`` programs of the model split once:
    ``nnx.jit`` walks the module graph on every call, 1.4 ms of Python each (three calls per
    batch of eight pairs; 0.15 ms here). The parameters and ``cfg`` are a snapshot: a caller
    that replaces ``model.cfg`` needs a new one (``matches``)."""

    def __init__(self, model: Aligner):
        self.cfg = model.cfg
        self._graph, self._state = nnx.split(model)

    def matches(self, model: Aligner) -> bool:
        return model.cfg is self.cfg

    def plans_both_ways(self, a_feat, b_feat, a_len, b_len, *, encoded=None):
        return _both_ways((_plans_both_ways_split, _plans_both_ways_encoded_split), (self._graph, self._state),
                          a_feat, b_feat, a_len, b_len, encoded)

    def encodings(self, feat, lens):
        return _encodings_split(self._graph, self._state, jnp.asarray(feat, jnp.float32),
                                jnp.asarray(lens, jnp.int32))


def export_plans_both_ways(model: Aligner, size: int, pad: int) -> bytes:
    """The serialized program (``jax.export``) of ``plans_both_ways`` by the scaling solve for
    ``size`` pairs padded to ``pad`` residues, the model's parameters baked in:
    ``(a_feat, b_feat, a_len, b_len) -> ((ab, ba), safe)``. A process that loads it needs
    neither flax nor the checkpoint (``inference.PlanPrograms``)."""
    feat = jax.ShapeDtypeStruct((size, pad, model.cfg.feature_dim), jnp.float32)
    lens = jax.ShapeDtypeStruct((size,), jnp.int32)
    program = jax.jit(lambda a, b, la, lb: _plans_both_ways(model, a, b, la, lb, solver="scaling"))
    return bytes(jax.export.export(program)(feat, feat, lens, lens).serialize())


def _diagonal_sum(x, weights, r: int):
    """``sum_o weights[o + r] x[..., i + o, j + o]`` over o = -r..r, zero beyond the ends:
    the windowed sum along the diagonals of ``x [.., Lq, Lk]``."""
    lq, lk = x.shape[-2:]
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(r, r), (r, r)])
    return sum(weights[o + r] * padded[..., r + o: r + o + lq, r + o: r + o + lk] for o in range(-r, r + 1))


def _offset_sum(terms, r: int):
    """``sum_o terms[..., i + o, o + r]`` over o = -r..r, zero beyond the ends: ``[.., L, 2r + 1]``
    (a value per position and window offset) to ``[.., L]``."""
    length = terms.shape[-2]
    padded = jnp.pad(terms, [(0, 0)] * (terms.ndim - 2) + [(r, r), (0, 0)])
    return sum(padded[..., r + o: r + o + length, o + r] for o in range(-r, r + 1))


def position_features(length: int, lens, n: int) -> jax.Array:
    """``[B, L, n]`` Fourier features of ``p_i = i / (len - 1)``: ``sin(pi m p)``,
    ``cos(pi m p)`` for m = 1..n/2."""
    p = jnp.arange(length, dtype=jnp.float32)[None, :] / jnp.maximum(lens - 1, 1)[:, None]
    freqs = jnp.pi * jnp.arange(1, n // 2 + 1, dtype=jnp.float32)  # [n/2]
    angles = p[..., None] * freqs  # [B, L, n/2]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1)


def normalize(x):
    """Unit L2 norm over the last axis."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _NORM_EPS)


def build_model(cfg: AlignerConfig, *, seed: int = 0) -> Aligner:
    """A freshly initialised aligner."""
    return Aligner(cfg, rngs=nnx.Rngs(params=seed))


# ---------------------------------------------------------------------------------------------
# Losses (docs/design.md §5)
# ---------------------------------------------------------------------------------------------

def loss_targets(target, q_len, *, dustbin: bool, key_length: int):
    """Transport targets ``[B, Lq]`` for the sparse CE: the key index on aligned rows, the
    dustbin column (``key_length`` = Lk) on unaligned real rows of dustbin configurations,
    -1 elsewhere (unaligned rows without a dustbin, padding)."""
    target = jnp.asarray(target, jnp.int32)
    rows = jnp.arange(target.shape[1])[None, :] < jnp.asarray(q_len)[:, None]
    unaligned = jnp.full_like(target, key_length if dustbin else -1)
    return jnp.where(rows & (target >= 0), target, jnp.where(rows, unaligned, -1))


def objective(cfg, recon, ce, mono, aux):
    """The training loss from its terms (each a mean over its own count) and the encoder's
    auxiliary loss: ``recon_weight·recon + ce_weight·ce + mono_weight·mono + aux``."""
    return cfg.recon_weight * recon + cfg.ce_weight * ce + cfg.mono_weight * mono + aux


def _safe_div(num, den):
    return num / jnp.maximum(den, 1.0)


def aligner_loss(model: Aligner, batch: dict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Training objective and diagnostics of one batch.

    ``batch``: ``q_feat [B, Lq, D]``, ``k_feat [B, Lk, D]``, ``q_len``, ``k_len [B]``,
    ``target [B, Lq]`` (key index, -1 unaligned / padding), optional ``valid [B]``.

    Returns ``(loss, metrics)``; metrics are scalars: ``loss``, ``recon``, ``ce``, ``mono``,
    ``ce_offsupport`` (count of masked CE entries, rows x heads), ``bary_mae``, ``within5``,
    ``mono_violation`` (per-head barycenter diagnostics), ``dustbin_mass`` (mean dustbin mass
    of annotated rows), ``value_spread``, ``temperature``, ``encoder_aux``, and each mean's
    count (rows x heads), so that batches pool exactly: ``n_annotated`` (recon), ``n_ce``
    (ce: finite target entries), ``n_mono`` (mono: adjacent annotated row pairs).
    """
    cfg = model.cfg
    q_len = jnp.asarray(batch["q_len"], jnp.int32)
    k_len = jnp.asarray(batch["k_len"], jnp.int32)
    if "valid" in batch:
        valid = jnp.asarray(batch["valid"], bool)
        q_len, k_len = jnp.where(valid, q_len, 0), jnp.where(valid, k_len, 0)
    target = jnp.asarray(batch["target"], jnp.int32)
    b, lq = target.shape
    lk = batch["k_feat"].shape[1]
    rows = jnp.arange(lq)[None, :] < q_len[:, None]  # [B, Lq]
    ann = rows & (target >= 0)  # annotated rows
    ce_t = loss_targets(target, q_len, dustbin=cfg.dustbin, key_length=lk)

    res = model(batch["q_feat"], batch["k_feat"], q_len, k_len, targets=ce_t)
    out, bary, logp, v = res.out, res.bary, res.target_logp, res.values
    h = out.shape[1]
    annf = ann[:, None, :].astype(jnp.float32)  # [B, 1, Lq]
    n_ann = jnp.sum(ann) * h

    # reconstruction ||O_i - V_{c_i}||^2 over annotated rows and heads
    idx = jnp.clip(target, 0, lk - 1)[:, None, :, None]  # [B, 1, Lq, 1]
    v_c = jnp.take_along_axis(v, idx, axis=2)  # [B, H, Lq, dv]
    err = jnp.sum((out - v_c) ** 2, axis=-1)  # [B, H, Lq]
    recon = _safe_div(jnp.sum(err * annf), n_ann)

    # sparse CE on the target entries (off-support entries masked and counted)
    ce_rows = (ce_t >= 0)[:, None, :]  # [B, 1, Lq]
    finite = ce_rows & jnp.isfinite(logp)  # [B, H, Lq]
    ce = -_safe_div(jnp.sum(jnp.where(finite, logp, 0.0)), jnp.sum(finite))
    offsupport = jnp.sum(ce_rows & ~jnp.isfinite(logp))

    # monotonicity of the barycenters over consecutive annotated rows
    cons = (ann[:, :-1] & ann[:, 1:])[:, None, :].astype(jnp.float32)  # [B, 1, Lq - 1]
    n_cons = jnp.sum(cons) * h
    step = bary[..., :-1] - bary[..., 1:]  # b_i - b_{i+1}
    mono = _safe_div(jnp.sum(jax.nn.relu(step) * cons), n_cons)

    loss = objective(cfg, recon, ce, mono, res.aux)

    # diagnostics (no gradient needed)
    sg = jax.lax.stop_gradient
    abs_err = jnp.abs(sg(bary) - target[:, None, :].astype(jnp.float32))
    kmask = (jnp.arange(lk)[None, :] < k_len[:, None])[:, None, :, None]  # [B, 1, Lk, 1]
    n_keys = jnp.maximum(jnp.sum(kmask, axis=2), 1)  # [B, 1, 1]
    mean_v = jnp.sum(sg(v) * kmask, axis=2) / n_keys  # [B, H, dv]
    has_keys = (k_len > 0)[:, None]
    spread = 1.0 - jnp.sum(mean_v**2, -1)  # [B, H]
    metrics = {
        "loss": loss,
        "recon": recon,
        "ce": ce,
        "mono": mono,
        "ce_offsupport": offsupport,
        "bary_mae": _safe_div(jnp.sum(abs_err * annf), n_ann),
        "within5": _safe_div(jnp.sum((abs_err <= 5.0) * annf), n_ann),
        "mono_violation": _safe_div(jnp.sum((step > 0) * cons), n_cons),
        "dustbin_mass": _safe_div(jnp.sum(sg(res.dustbin_mass) * annf), n_ann),
        "value_spread": _safe_div(jnp.sum(spread * has_keys), jnp.sum(has_keys) * h),
        "temperature": jnp.exp(sg(model.log_temp[...])),
        "n_annotated": n_ann,
        "n_ce": jnp.sum(finite),
        "n_mono": n_cons,
        "encoder_aux": jnp.asarray(res.aux, jnp.float32),
    }
    return loss, metrics

