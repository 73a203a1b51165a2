"""Named configurations: the seed paper's four Pfam screens and the one built to align.

Every configuration uses the paper's solver settings: T = 15 stopped base steps, half band
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
=======================  =========  ==  =====================  ================  ==========

"by features": a conv encoder for the built-in features (one-hot / BLOSUM rows have no
context of their own), none for ESM-2 features (already contextual); ``--set encoder=...``
overrides. ``align_ce`` is the configuration built to align: it optimises the sparse CE of the
true entry (unaligned residues target the dustbin through the O(L) spoke support), which — unlike
reconstruction — no choice of the values can lower, plus a small barycenter monotonicity
penalty, and — with ``builtin/onehot+blosum62`` features — a 17-residue windowed BLOSUM62
channel with learned offset weights (``substitution_window=8``). The paper never trained it.
The monotonicity penalty is in residues (see ``pfamalign.model``). Relative-position Fourier
features (``position_features=32``, a learnable diagonal prior) are available but off: on the
validation families they cost 0.03 F1 (they learn the training families' offsets).

Overrides: ``apply_overrides(cfg, {"key": "value"})`` with keys naming a field of
``AlignerConfig`` (``heads=2``), of ``TransportConfig`` (``transport.eps=0.5`` or ``eps=0.5``)
or of ``TrainConfig`` (``train.lr=3e-4`` or ``lr=3e-4``). Values are parsed as JSON
(``null``, numbers, booleans, lists), else taken as strings.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from pfamalign.kernels import TransportConfig
from pfamalign.model import AlignerConfig, _transport_from_dict, _transport_to_dict
from pfamalign.pipelines.embed import feature_layout

PAPER_BASE_STEPS = 15  # T
PAPER_HALF_BAND = 1024  # W
PAPER_BATCH = 64  # global batch


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation, data and bookkeeping settings of a training run.

    Attributes:
      steps: optimiser steps of the run (the LR schedule spans them).
      batch_size: global batch (pairs per step, over all devices and hosts).
      lr: peak learning rate of AdamW; warmup_steps of linear warmup, then cosine decay to
        ``lr * final_lr_ratio`` at ``steps``.
      weight_decay: AdamW decoupled weight decay. clip_norm: global gradient-norm clip.
      seed: parameter initialisation and data order.
      pad_multiple: batches pad lengths to a multiple of it (q and k to one length), so the
        step compiles at most ``max_len / pad_multiple`` shapes.
      bucket_window: length-bucketing window in batches (reader.BatchPlan).
      max_len: leave out training pairs with a sequence longer than this (0 = keep all).
      eval_every: validation every N steps (0 = never; also at step 0 and at the end).
      eval_pairs: validation pairs used (N evenly spaced over the split's stored order; 0 = all).
      eval_batch_size: pairs per validation batch (dense plans: memory B x H x L^2).
      ckpt_every: checkpoint every N steps (0 = only at the end and on SIGTERM).
      keep_checkpoints: checkpoints kept (the newest).
      log_every: a metrics line (means over the interval) every N steps.
    """

    steps: int = 2000
    batch_size: int = PAPER_BATCH
    lr: float = 1e-3
    warmup_steps: int = 100
    final_lr_ratio: float = 0.1
    weight_decay: float = 1e-4
    clip_norm: float = 1.0
    seed: int = 0
    pad_multiple: int = 64
    bucket_window: int = 32
    max_len: int = 0
    eval_every: int = 200
    eval_pairs: int = 256
    eval_batch_size: int = 16
    ckpt_every: int = 200
    keep_checkpoints: int = 3
    log_every: int = 10

    def __post_init__(self):
        positive = ("steps", "batch_size", "pad_multiple", "bucket_window", "eval_batch_size",
                    "keep_checkpoints", "log_every")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("warmup_steps", "max_len", "eval_every", "eval_pairs", "ckpt_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.final_lr_ratio <= 1:
            raise ValueError(f"final_lr_ratio must be in [0, 1], got {self.final_lr_ratio!r}")
        if self.weight_decay < 0 or not self.clip_norm > 0:
            raise ValueError(f"need weight_decay >= 0 and clip_norm > 0, got "
                             f"{self.weight_decay!r}, {self.clip_norm!r}")


# Fields that may change between a run and its resumption (bookkeeping, not the trajectory;
# ``steps`` is not among them: the learning-rate schedule spans it).
RESUMABLE_FIELDS = frozenset({"eval_every", "eval_pairs", "eval_batch_size", "ckpt_every",
                              "keep_checkpoints", "log_every"})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A named configuration resolved against a dataset: the model and its training."""

    model: AlignerConfig
    train: TrainConfig

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        return cls(AlignerConfig.from_dict(data["model"]), TrainConfig(**data["train"]))


def _paper_transport(**kw) -> TransportConfig:
    kw.setdefault("half_band", PAPER_HALF_BAND)
    kw.setdefault("eps", 1.0)
    kw.setdefault("base_steps", PAPER_BASE_STEPS)
    kw.setdefault("tail_steps", 2)
    return TransportConfig(**kw)


# name -> (model fields, transport fields, train fields). "encoder": None = by features.
_CONFIGS: dict[str, tuple[dict, dict, dict]] = {
    "k2_eps1": ({"recon_weight": 1.0}, {"tail_steps": 2}, {}),
    "k4_eps1": ({"recon_weight": 1.0}, {"tail_steps": 4}, {}),
    "muot_dustbin_mono": ({"recon_weight": 1.0, "mono_weight": 0.1},
                          {"dustbin": "widened"}, {}),
    "muot_dustbin_hybrid": ({"recon_weight": 1.0, "ce_weight": 1.0},
                            {"dustbin": "widened"}, {}),
    "align_ce": ({"recon_weight": 0.0, "ce_weight": 1.0, "mono_weight": 0.01,
                  "encoder": "conv", "heads": 1, "head_dim": 64, "value_dim": 16,
                  "position_features": 0, "substitution_window": None},
                 {"dustbin": "spoke"}, {}),
}
CONFIG_NAMES = tuple(_CONFIGS)
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
                            transport=_paper_transport(**transport_kw), **model_kw),
        train=TrainConfig(**train_kw))
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
        return None
    if isinstance(current, bool) or annotation in (bool, "bool"):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise ValueError(f"--set {key}: expected true/false, got {text!r}")
    if isinstance(current, int) or annotation in ("int", "int | None"):
        if isinstance(value, (int, float)) and float(value).is_integer():
            return int(value)
        raise ValueError(f"--set {key}: expected an integer, got {text!r}")
    if isinstance(current, float) or annotation in ("float", "float | None"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"--set {key}: expected a number, got {text!r}")
    if isinstance(value, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def override_keys() -> list[str]:
    """Every key ``--set`` accepts (qualified form)."""
    keys = [k for k in _fields(AlignerConfig) if k not in _NOT_OVERRIDABLE]
    keys += [f"transport.{k}" for k in _fields(TransportConfig)]
    keys += [f"train.{k}" for k in _fields(TrainConfig)]
    return keys


def apply_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """``cfg`` with ``{key: value}`` overrides (see the module docstring). Raises ValueError
    naming an unknown key or a bad value."""
    model_f, transport_f, train_f = (_fields(c) for c in (AlignerConfig, TransportConfig,
                                                           TrainConfig))
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
        if field == "blocks":
            value = _parse_value(text, None, "int | None", key)
            from pfamalign.kernels.config import BlockSizes
            kw[field] = BlockSizes(value)
            continue
        kw[field] = _parse_value(text, getattr(current, field), table[field].type, key)
    transport = cfg.model.transport
    if transport_kw:
        transport = _transport_from_dict({**_transport_to_dict(transport), **transport_kw})
    model = dataclasses.replace(cfg.model, transport=transport, **model_kw)
    train = dataclasses.replace(cfg.train, **train_kw)
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

