"""Named configurations: the four reference Pfam screens and the one built to align.

Every configuration uses the reference solver settings (docs/design.md §1): T = 15 stopped base steps, half band
W = 1024, eps = 1, global batch 64. They differ in the tail depth R, the dustbin mode, the
losses and the encoder:

=======================  =========  ==  =====================  ================  ==========
name                     dustbin    R   losses (weights)        heads x d (dv)    encoder
=======================  =========  ==  =====================  ================  ==========
``k2_eps1``              none       2   recon                   4 x 32 (32)       by features
``k4_eps1``              none       4   recon                   4 x 32 (32)       by features
``muot_dustbin_mono``    widened    2   recon + 0.1 mono        4 x 32 (32)       by features
``muot_dustbin_hybrid``  widened    2   recon + CE              4 x 32 (32)       by features
``align_ce``             spoke      2   CE + 0.01 mono          1 x 64 (16)       conv + sub
``align_softmax``        spoke      2   as align_ce             1 x 64 (16)       conv + sub
``align_ce_capacity``    capacity   2   as align_ce             1 x 64 (16)       conv + sub
``align_attn``           spoke      2   CE + 0.01 mono          1 x 64 (16)       softmax + sub
``align_ceta``           spoke      2   CE + 0.01 mono          1 x 64 (16)       CETA + sub
``align_orthgsa``        spoke      2   CE + 0.01 mono (+ KL)   1 x 64 (16)       OrthGSA + sub
=======================  =========  ==  =====================  ================  ==========

``align_softmax`` is the row softmax over the band and the dustbin column (``marginals="rows"``:
softmax as semi-relaxed OT, columns free); ``align_ce_capacity`` is balanced on both sides for
every pair (the capacity dustbin). Both compare with ``align_ce`` (spoke, infeasible when the
lengths differ: see ``pfamalign certify``).

"by features": a conv encoder for the built-in features (one-hot / BLOSUM rows have no
context of their own), none for ESM-2 features (already contextual); ``--set encoder=...``
overrides. ``align_ce`` is the configuration built to align: it optimises the sparse CE of the
true entry (unaligned residues target the dustbin through the O(L) spoke support), which — unlike
reconstruction — no choice of the values can lower, plus a small barycenter monotonicity
penalty, and — with ``builtin/onehot+blosum62`` features — a 17-residue windowed BLOSUM62
channel with learned offset weights (``substitution_window=8``). No reference screen trains it.
The monotonicity penalty is in residues (see ``pfamalign.model``). Relative-position Fourier
features (``position_features=32``, a learnable diagonal prior) are available but off: on the
validation families they cost 0.03 F1 (they learn the training families' offsets).

``align_attn``, ``align_ceta`` and ``align_orthgsa`` are ``align_ce`` with the transformer
encoder (``pfamalign.encoder``): softmax attention with plain residuals, CETA (doubly
stochastic transport attention) with plain residuals, and gated sparse attention inside Cayley
hyper-connections (its MLP ratio 2 instead of 3 keeps the parameter count within 10 % of the
others: its gates and indexer cost about one MLP width).

Overrides: ``apply_overrides(cfg, {"key": "value"})`` with keys naming a field of
``AlignerConfig`` (``heads=2``), of ``TransportConfig`` (``transport.eps=0.5`` or ``eps=0.5``)
or of ``TrainConfig`` (``train.lr=3e-4`` or ``lr=3e-4``). Values are parsed as JSON
(``null``, numbers, booleans, lists), else taken as strings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any

from pfamalign.config_table import CONFIG_NAMES, CONFIGS as _CONFIGS
from pfamalign.kernels import TransportConfig
from pfamalign.model import AlignerConfig
from pfamalign.pipelines.embed import feature_layout

REFERENCE_BASE_STEPS = 15  # T
REFERENCE_HALF_BAND = 1024  # W
REFERENCE_BATCH = 64  # global batch


def _check_ints(cfg, *, positive=(), non_negative=()) -> None:
    for name, low in [(n, 1) for n in positive] + [(n, 0) for n in non_negative]:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """The optimiser: AdamW with linear warmup and cosine decay (the trajectory).

    Attributes:
      steps: optimiser steps of the run (the LR schedule spans them).
      lr: peak learning rate of AdamW; warmup_steps of linear warmup, then cosine decay to
        ``lr * final_lr_ratio`` at ``steps``.
      weight_decay: AdamW decoupled weight decay. clip_norm: global gradient-norm clip.
    """

    steps: int = 2000
    lr: float = 1e-3
    warmup_steps: int = 100
    final_lr_ratio: float = 0.1
    weight_decay: float = 1e-4
    clip_norm: float = 1.0

    def __post_init__(self):
        _check_ints(self, positive=("steps",), non_negative=("warmup_steps",))
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.final_lr_ratio <= 1:
            raise ValueError(f"final_lr_ratio must be in [0, 1], got {self.final_lr_ratio!r}")
        if self.weight_decay < 0 or not self.clip_norm > 0:
            raise ValueError(f"need weight_decay >= 0 and clip_norm > 0, got "
                             f"{self.weight_decay!r}, {self.clip_norm!r}")


MAX_SEED = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The training batches (the trajectory too).

    Attributes:
      batch_size: global batch (pairs per step, over all devices and hosts).
      seed: parameter initialisation and data order.
      pad_multiple: batches pad lengths to a multiple of it (q and k to one length), so the
        step compiles at most ``max_len / pad_multiple`` shapes.
      bucket_window: length-bucketing window in batches (reader.BatchPlan).
      max_len: leave out pairs with a sequence longer than this (0 = keep all).
    """

    batch_size: int = REFERENCE_BATCH
    seed: int = 0
    pad_multiple: int = 64
    bucket_window: int = 32
    max_len: int = 0

    def __post_init__(self):
        _check_ints(self, positive=("batch_size", "pad_multiple", "bucket_window"),
                    non_negative=("max_len", "seed"))
        if self.seed > MAX_SEED:  # the initialisation's generator takes a C long
            raise ValueError(f"seed must be at most {MAX_SEED} (2**63 - 1), got {self.seed}")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Bookkeeping of the loop: it does not change the trajectory, so a resumed run may
    change it (``RESUMABLE_FIELDS``).

    Attributes:
      eval_every: validation every N steps (0 = never; also at step 0 and at the end).
      eval_pairs: validation pairs used (N evenly spaced over the split's stored order; 0 = all).
      eval_batch_size: pairs per validation batch (dense plans: memory B x H x L^2).
      ckpt_every: checkpoint every N steps (0 = only at the end and on SIGTERM).
      keep_checkpoints: checkpoints kept (the newest).
      log_every: a metrics line (means over the interval) every N steps.
    """

    eval_every: int = 200
    eval_pairs: int = 256
    eval_batch_size: int = 16
    ckpt_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 10

    def __post_init__(self):
        _check_ints(self, positive=("eval_batch_size", "keep_checkpoints", "log_every"),
                    non_negative=("eval_every", "eval_pairs", "ckpt_every"))


_TRAIN_GROUPS = {"optim": OptimConfig, "data": DataConfig, "loop": LoopConfig}
# field -> its group; field names are unique across groups, so ``train.<field>`` (``--set``,
# config.json) names one field
TRAIN_FIELDS = {f.name: group for group, cls in _TRAIN_GROUPS.items()
                for f in dataclasses.fields(cls)}
# Fields that may change between a run and its resumption (bookkeeping, not the trajectory;
# ``steps`` is not among them: the learning-rate schedule spans it).
RESUMABLE_FIELDS = frozenset(f.name for f in dataclasses.fields(LoopConfig))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Training settings in three groups: ``optim``, ``data``, ``loop``. Every field also
    reads flat (``cfg.train.lr``), the namespace of ``--set train.<field>`` and of the run's
    ``config.json``."""

    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    loop: LoopConfig = LoopConfig()

    def __getattr__(self, name: str):
        group = TRAIN_FIELDS.get(name)
        if group is None:
            raise AttributeError(f"TrainConfig has no field {name!r}")
        return getattr(getattr(self, group), name)

    def to_dict(self) -> dict[str, Any]:
        """Flat ``{field: value}`` (the config.json form)."""
        return {k: v for group in _TRAIN_GROUPS for k, v in
                dataclasses.asdict(getattr(self, group)).items()}

    @classmethod
    def from_dict(cls, flat: dict[str, Any]) -> "TrainConfig":
        unknown = sorted(set(flat) - set(TRAIN_FIELDS))
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}")
        return cls(**{group: klass(**{k: v for k, v in flat.items() if TRAIN_FIELDS[k] == group})
                      for group, klass in _TRAIN_GROUPS.items()})

    def replace(self, **fields) -> "TrainConfig":
        """A copy with flat fields replaced."""
        return TrainConfig.from_dict({**self.to_dict(), **fields})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A named configuration resolved against a dataset: the model and its training."""

    model: AlignerConfig
    train: TrainConfig

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "train": self.train.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        return cls(AlignerConfig.from_dict(data["model"]), TrainConfig.from_dict(data["train"]))


def _reference_transport(**kw) -> TransportConfig:
    kw.setdefault("half_band", REFERENCE_HALF_BAND)
    kw.setdefault("eps", 1.0)
    kw.setdefault("base_steps", REFERENCE_BASE_STEPS)
    kw.setdefault("tail_steps", 2)
    return TransportConfig(**kw)


_NOT_OVERRIDABLE = ("transport", "name", "feature_dim", "embedder_id")  # from the dataset


def default_encoder(embedder_id: str) -> str:
    """``conv`` for built-in (context-free) features, ``none`` for ESM-2."""
    return "conv" if embedder_id.startswith("builtin") else "none"


def get_config(name: str, *, embedder_id: str, feature_dim: int,
               overrides: dict[str, str] | None = None) -> RunConfig:
    """The named configuration for a dataset's features, with ``--set`` overrides applied."""
    if name not in _CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; choose one of {', '.join(CONFIG_NAMES)}")
    model_kw, transport_kw, train_kw = (dict(x) for x in _CONFIGS[name])
    model_kw.setdefault("encoder", default_encoder(embedder_id))
    if model_kw.get("substitution_window", -1) is None:  # by features: needs BLOSUM62 rows
        model_kw["substitution_window"] = 8 if feature_layout(embedder_id).has_substitution else -1
    cfg = RunConfig(
        model=AlignerConfig(name=name, feature_dim=int(feature_dim), embedder_id=embedder_id,
                            transport=_reference_transport(**transport_kw), **model_kw),
        train=TrainConfig.from_dict(train_kw))
    return apply_overrides(cfg, overrides or {})


# ---------------------------------------------------------------------------------------------
# Overrides
# ---------------------------------------------------------------------------------------------

def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _parse_value(text: Any, current: Any, annotation: Any, key: str) -> Any:
    if not isinstance(text, str):
        value = text
    else:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
    if value is None:
        if "None" not in str(annotation):  # the field has no "unset" state
            raise ValueError(f"--set {key}: needs a value; null (None) is not allowed here")
        return None
    if isinstance(current, bool) or annotation in (bool, "bool"):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise ValueError(f"--set {key}: expected true/false, got {text!r}")
    if isinstance(current, int) or annotation in ("int", "int | None"):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
            return int(value)
        raise ValueError(f"--set {key}: expected an integer, got {text!r}")
    if isinstance(current, float) or annotation in ("float", "float | None"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):  # json.loads reads NaN and Infinity
                return float(value)
            raise ValueError(f"--set {key}: expected a finite number, got {text!r}")
        raise ValueError(f"--set {key}: expected a number, got {text!r}")
    if isinstance(value, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def override_keys() -> list[str]:
    """Every key ``--set`` accepts (qualified form)."""
    keys = [k for k in _fields(AlignerConfig) if k not in _NOT_OVERRIDABLE]
    keys += [f"transport.{k}" for k in _fields(TransportConfig)]
    keys += [f"train.{k}" for k in TRAIN_FIELDS]
    return keys


def apply_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """``cfg`` with ``{key: value}`` overrides (see the module docstring). Raises ValueError
    naming an unknown key or a bad value."""
    model_f, transport_f = _fields(AlignerConfig), _fields(TransportConfig)
    train_f = {name: _fields(_TRAIN_GROUPS[group])[name] for name, group in TRAIN_FIELDS.items()}
    model_kw, transport_kw, train_kw = {}, {}, {}
    for key, text in overrides.items():
        scope, _, field = key.rpartition(".")
        if scope == "transport" or (not scope and field in transport_f
                                    and field not in model_f and field not in train_f):
            table, kw, current = transport_f, transport_kw, cfg.model.transport
        elif scope == "train" or (not scope and field in train_f and field not in model_f):
            table, kw, current = train_f, train_kw, cfg.train
        elif not scope and field in model_f and field not in _NOT_OVERRIDABLE:
            table, kw, current = model_f, model_kw, cfg.model
        else:
            table, kw, current = {}, None, None
        if kw is None or field not in table:
            raise ValueError(f"unknown --set key {key!r}; valid keys: {', '.join(override_keys())}")
        if field == "blocks":  # --set blocks=N: the tile edge, as the JSON form {"block": N}
            kw[field] = {"block": _parse_value(text, None, "int | None", key)}
            continue
        kw[field] = _parse_value(text, getattr(current, field), table[field].type, key)
    transport = cfg.model.transport
    if transport_kw:
        transport = TransportConfig.from_dict({**transport.to_dict(), **transport_kw})
    model = dataclasses.replace(cfg.model, transport=transport, **model_kw)
    train = cfg.train.replace(**train_kw)
    return RunConfig(model, train)


def parse_set_options(items: typing.Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{k: v}``; ValueError for an item without ``=``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out

