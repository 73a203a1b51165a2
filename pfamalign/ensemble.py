"""Ensembles of aligners: several trained models whose plans are averaged as posteriors.

An ensemble directory (``pfamalign ensemble`` writes one) holds::

    ENS/ensemble.json   {"members": [{"path": "conv", "plan_power": 0.07}, ...]}
    ENS/conv/ ...       one model directory per member, as ``pfamalign train`` leaves it
    ENS/decoding.json   the ensemble's decoder, chosen on validation families
    ENS/pairhmm.json    the pair-HMM of the posterior decoder's mix (the first member's)
    ENS/training.json   the members' training families and the decoder's choice

and loads wherever a model directory does (``Predictor`` opens an ``EnsemblePredictor``).

The ensemble's plan of a pair is the mean of its members' plan pair-HMM match posteriors:
each member's symmetrized plan through the plan pair-HMM at that member's own power
(``pairhmm.plan_log_odds``; global model), the powers chosen per member on validation
pairs. Posteriors rather than raw plans, because a plan through the plan pair-HMM decodes
far better than the plan itself (cross-validated 0.755 against 0.656 for the shipped
recipe), and because members differ in sharpness: a CETA model's plans wanted powers of
0.2 to 0.3 where the convolution's wanted 0.05 to 0.1. A posterior is a plan (non-negative,
no row or column above one; the dustbins take the rest), so every decoder reads the
ensemble's as it reads a model's: MEA on it is the members' plans alone, ``posterior``
mixes in the substitution-table pair-HMM, ``hybrid`` adds BLOSUM62.

What an ensemble cannot do: the quantities of one transport model (certificates, ``compile``
and the ``asap`` / ``steps`` engines) need a member (``--checkpoint ENS/conv``). Barycenters
project through the ensemble's plan as through a model's.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import pathlib
import shutil
import sys

import numpy as np

from pfamalign import jsonio
from pfamalign.decoding import DecoderSettings
from pfamalign.inference import ENSEMBLE_FILE, Predictor, finished_run_model, model_content_hash, predictor_path
from pfamalign.plans import PairPlan
from pfamalign.outputs import check_output_directory, inside, staged_directory
from pfamalign.pipelines.records import stays_inside
from pfamalign.tuning import PLAN_POWERS

# each member's power is chosen on validation pairs from these (the decoder grid's, and the
# larger ones sharper plans want)
MEMBER_POWERS = PLAN_POWERS + (0.15, 0.2, 0.3)


@dataclasses.dataclass(frozen=True)
class Member:
    """One model of an ensemble: its directory (relative to the ensemble's) and the power its
    plan enters the plan pair-HMM with."""

    path: str
    plan_power: float


def is_ensemble(directory) -> bool:
    return (pathlib.Path(directory) / ENSEMBLE_FILE).is_file()


def read_members(directory: pathlib.Path) -> list[Member]:
    """The members of ``directory/ensemble.json``; ValueError naming what is wrong."""
    path = pathlib.Path(directory) / ENSEMBLE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # ValueError: also 4,300+ digits
        raise ValueError(f"{path}: not a readable ensemble file ({err})") from None
    if not isinstance(data, dict) or set(data) != {"members"} or not isinstance(data["members"], list) \
            or not data["members"]:
        raise ValueError(f'{path}: expected {{"members": [{{"path": ..., "plan_power": ...}}, ...]}} '
                         "with at least one member")
    members = []
    for n, entry in enumerate(data["members"]):
        fields = jsonio.check_fields(Member, entry, f"{path} member {n}")
        if set(fields) != {"path", "plan_power"}:
            raise ValueError(f"{path} member {n}: needs both path and plan_power")
        member = Member(**fields)
        if not stays_inside(member.path) or not inside(path.parent / member.path, path.parent):  # or links out
            raise ValueError(f"{path} member {n}: path {member.path!r} must name a directory "
                             "inside the ensemble directory")
        if not (math.isfinite(member.plan_power) and member.plan_power > 0):
            raise ValueError(f"{path} member {n}: plan_power must be > 0, got {member.plan_power}")
        members.append(member)
    return members


def posterior_plan(real: np.ndarray) -> PairPlan:
    """A ``PairPlan`` of match posteriors ``[Lq, Lk]``: each row's and column's unaligned
    probability in its dustbin."""
    lq, lk = real.shape
    plan = np.zeros((lq + 1, lk + 1))
    plan[:-1, :-1] = real
    plan[:-1, -1] = np.clip(1.0 - real.sum(axis=1), 0.0, None)
    plan[-1, :-1] = np.clip(1.0 - real.sum(axis=0), 0.0, None)
    return PairPlan(plan)


def plan_only_decoding(power: float) -> DecoderSettings:
    """The plan-only decoder (plan pair-HMM at ``power``, alpha 1) whose match posteriors a
    member contributes, and whose F1 chooses the member's power."""
    return DecoderSettings(decoder="posterior", alpha=1.0, objective="f1", plan_power=power)


class EnsemblePredictor(Predictor):
    """A ``Predictor`` over an ensemble directory (module docstring): the members' plans
    computed batch by batch, averaged as plan pair-HMM posteriors; everything after the plan
    (decoders, batching, evaluation) is the ``Predictor``'s."""

    def __init__(self, checkpoint, *, weights=None, max_length: int = 4096,
                 max_memory: int | None = None, engine: str = "sinkhorn", steps: int | None = None):
        path = predictor_path(checkpoint)  # as Predictor.__new__ found it
        if engine != "sinkhorn" or steps is not None:
            raise ValueError(f"{path} is an ensemble: its members' own solves compute its plans "
                             "(--engine and --steps need a single model, e.g. one member's directory)")
        self.spec = read_members(path)
        self.members = []
        for member in self.spec:
            if is_ensemble(path / member.path):
                raise ValueError(f"{path / member.path}: an ensemble member must be a single model")
            self.members.append(Predictor(path / member.path, weights=weights, max_length=max_length,
                                          max_memory=max_memory))
        features = {m.config.embedder_id for m in self.members}
        if len(features) > 1:
            raise ValueError(f"{path}: the members use different features ({', '.join(sorted(features))}); "
                             "an ensemble's members must share one embedder")
        first = self.members[0]
        self.config = first.config  # the shared features (and the dustbin flag of plan metrics)
        self._read_directory(path)
        # max_length: the members' least (each already capped at the shared embedder's limit);
        # plan_models: each member's plans (the memory estimate); shapes: every member
        # computes at the same shapes
        self._set_featurizer("ensemble of " + " + ".join(m.name for m in self.members), first.embedder,
                             max_length=min(m.max_length for m in self.members), max_memory=max_memory,
                             plan_models=len(self.members), shapes=first.shapes)

    @property
    def model(self):
        raise ValueError(f"{self.path} is an ensemble and has no transport model of its own; "
                         "use one member's directory (--checkpoint "
                         f"{self.path / self.spec[0].path}) for certificates and compile")

    @functools.cached_property
    def model_hash(self) -> str:
        """``sha256:`` + 16 hex digits over ``ensemble.json``, each member's content hash and
        the ensemble's pair-HMM."""
        digest = hashlib.sha256((self.path / ENSEMBLE_FILE).read_bytes())
        for member in self.members:
            digest.update(model_content_hash(member.path, member.pairhmm).encode())
        digest.update(self.pairhmm.to_json().encode())
        return "sha256:" + digest.hexdigest()[:16]

    def checks_marginals(self) -> bool:
        return True  # posteriors: every row and column at most one, the dustbins the rest

    def _plan_batch(self, batch, *, pad: int | None = None, symmetric: bool = False) -> list[PairPlan]:
        # with the emissions given (the plans' log-odds) the pair-HMM reads only the lengths
        lengths = [("X" * len(a), "X" * len(b)) for a, b in batch]
        total = [0.0] * len(batch)
        for member, spec in zip(self.members, self.spec):
            plans = member._plan_batch(batch, pad=pad, symmetric=symmetric)
            posts = member.plan_posteriors(lengths, plans, plan_only_decoding(spec.plan_power))
            total = [t + p for t, p in zip(total, posts)]
        return [posterior_plan(t / len(self.members)) for t in total]


# ---- building one -----------------------------------------------------------------------------


def choose_power(predictor: Predictor, records, features: str) -> tuple[float, list[dict]]:
    """The ``MEMBER_POWERS`` entry whose plan-only decoding (plan pair-HMM, alpha 1, expected F1)
    scores best on ``records``, and every power's row."""
    from pfamalign import tuning

    result = tuning.tune(predictor, records, features=features,
                         candidates=[plan_only_decoding(b) for b in MEMBER_POWERS])
    return result.best.plan_power, [{"plan_power": r["plan_power"], "f1": r["f1"],
                                     "f1_below30": r["f1_below30"]} for r in result.rows]


def member_names(models: list[pathlib.Path]) -> list[str]:
    """Directory names for the members: each model's config name, numbered when repeated."""
    from pfamalign.checkpoint import resolve_model_path

    names = []
    for path in models:
        base = json.loads(resolve_model_path(path)[0].read_text())["model"].get("name") or "member"
        base = "".join(c if c.isalnum() or c in "-_" else "_" for c in base)
        name, n = base, 2
        while name in names:
            name, n = f"{base}{n}", n + 1
        names.append(name)
    return names


def params_digest(model: pathlib.Path) -> str:
    """SHA-256 over a model's parameter files (names and contents): equal for copies."""
    from pfamalign.pipelines.records import file_sha256

    params = model / "params"
    files = sorted(f for f in params.rglob("*") if f.is_file())
    return hashlib.sha256("".join(f"{f.relative_to(params)}\0{file_sha256(f)}\n" for f in files).encode()).hexdigest()


def build(out: pathlib.Path, models: list[pathlib.Path], data: pathlib.Path, *, split: str = "val",
          max_pairs: int = 500, seed: int = 0, tune_decoder: bool = True, say=lambda msg: None) -> dict:
    """Writes the ensemble of ``models`` (model directories) to ``out``: copies of the models,
    each member's power chosen on ``max_pairs`` pairs of the dataset's ``split`` (drawn across
    its families), the first member's pair-HMM and the ensemble's decoder: chosen on the same
    pairs (``tuning.choose_decoder``), or without ``tune_decoder`` the shipped model's.
    ``out`` appears whole or not at all (built beside it, then renamed). Returns the record
    written to training.json."""
    from pfamalign import evaluation, tuning
    from pfamalign.alignment.pairhmm import MODEL_FILE
    from pfamalign.checkpoint import check_copyable, copy_model, read_training_record, write_training_record
    from pfamalign.pipelines.records import write_json

    out = pathlib.Path(out)
    # a finished run stands for its model here too (as for align, eval, ...)
    models = [finished_run_model(pathlib.Path(m)) or pathlib.Path(m) for m in models]
    if out.exists():
        raise ValueError(f"{out} already exists; choose a new --out directory")
    check_output_directory(out)  # a read-only place is found now, not after the tuning
    if len(models) < 2:
        raise ValueError("an ensemble needs at least two models")
    resolved = [m.resolve() for m in models]
    if len(set(resolved)) < len(resolved):
        raise ValueError("a model is given twice")
    for model in models:
        check_copyable(model)  # copied at the end: a file it cannot copy is found now, not after the tuning
    for model in models:
        if is_ensemble(model):
            raise ValueError(f"{model} is an ensemble; give its members' directories")
        if not ((model / "config.json").is_file() and (model / "params").is_dir()):  # a run has config.json too
            raise ValueError(f"{model} is not a model directory (config.json + params/); give RUN/model")
        if inside(out, model):
            raise ValueError(f"--out {out} would be inside the model {model}")
    seen: dict[str, pathlib.Path] = {}
    for model in models:  # a copy (or a compiled copy) of a model is that model again
        first = seen.setdefault(params_digest(model), model)
        if first is not model:
            raise ValueError(f"{first} and {model} hold the same parameters (one is a copy of the other); "
                             "an ensemble's members must be different models")
    predictors = [Predictor(m) for m in models]
    if len({p.config.embedder_id for p in predictors}) > 1:
        raise ValueError("the models use different features; an ensemble's members must share one embedder")
    records, _, features = evaluation.pair_records(data=data, split=split, max_pairs=max_pairs, seed=seed,
                                                   embedder_id=predictors[0].config.embedder_id)
    records = list(records)
    if not records:
        raise ValueError(f"{data} has no {split} pairs to choose the members' powers on")
    families = {r["family"] for r in records}
    for model in models:  # the powers and the decoder are chosen on these pairs: say so, as eval does
        seen = (evaluation.training_overlap(model, families) or {}).get("trained_on")
        if seen:
            print(f"Warning: {model} trained on {len(seen)} of the {len(families)} families whose {split} pairs "
                  f"choose the ensemble's settings ({', '.join(seen[:5])}{', ...' if len(seen) > 5 else ''}): "
                  "the choice favours it; use a dataset whose --split families no member trained on",
                  file=sys.stderr, flush=True)
    members, record, trained = [], {"members": []}, set()
    for name, model, predictor in zip(member_names(models), models, predictors):
        power, rows = choose_power(predictor, records, features)
        say(f"{name}: plan power {power:g} (" + ", ".join(f"{r['plan_power']:g}: {r['f1']:.3f}" for r in rows) + ")")
        members.append(Member(name, power))
        seen = (read_training_record(model) or {}).get("trained_on", {}).get("families")
        trained = None if seen is None or trained is None else trained | set(seen)
        record["members"].append({"path": name, "source": str(model.resolve()), "plan_power": power,
                                  "power_rows": rows})
    if trained is not None:  # every member's training families known
        record["trained_on"] = {"families": sorted(trained)}
    with staged_directory(out) as work:
        for member, model in zip(members, models):
            copy_model(model, work / member.path)
        if (models[0] / MODEL_FILE).is_file():
            shutil.copy2(models[0] / MODEL_FILE, work / MODEL_FILE)
        write_json(work / ENSEMBLE_FILE, {"members": [dataclasses.asdict(m) for m in members]}, indent=2)
        # without tuning, the shipped model's decoder (never the affine defaults of no decoding.json)
        record["decoder"] = tuning.choose_decoder(work, data, split=split, seed=seed,
                                                  max_pairs=max_pairs if tune_decoder else None)
        write_training_record(work, {"ensemble": True, "split": split, "n_pairs": len(records), **record})
    return record
