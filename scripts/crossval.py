"""Cross-validated accuracy over Pfam families: every family is a test family of exactly one fold.

    python scripts/crossval.py --workdir runs/cv5 --folds 5 --max-pairs-per-fold 200
    python scripts/crossval.py --workdir runs/cv5_shipped --no-train \\
        --checkpoint pfamalign/assets/default_model --seen-data data_b62_1k
    python scripts/crossval.py --workdir runs/cv5_baselines --baselines-only
    python scripts/crossval.py --workdir runs/cv_attn --config align_attn --steps 300 \
        --fixed-decoders --no-baselines --data-from runs/cv5
    python scripts/crossval.py --workdir runs/cv5_ens --ensemble-of runs/cv5 runs/cv5_ceta

Per fold K of N: ``pfamalign prepare shards --fold K/N`` (test = the fold's families, val = about
10 % of the others), ``pfamalign train`` with the given recipe (default: the shipped model's,
pfamalign/assets/default_model/TRAINING.md), the decoder chosen on the fold's val families
(``scripts/tune_decoder.py --write``; on the training families when the fold has no val
family, and said so), then ``pfamalign.evaluation`` on up to ``--max-pairs-per-fold`` test pairs
taken round-robin across the fold's families: the model with its tuned decoder and with the
plan-only decoders (MEA on the plan; the best plan-only row of the tuning, ``plan_only_settings``:
no substitution table), NW, SW, diagonal, ProbCons and MUSCLE (the last two when installed) on the same
pairs. The folds are then pooled: micro F1 per identity bin with bootstrap CIs, and
the model minus each method with the family-resampling (cluster) bootstrap CI.

``--fixed-decoders`` skips the decoder choice (for comparing encoders cheaply): the model is scored
with the plan-only MEA decoder and with the posterior decoder at its defaults (alpha 0.5), the
latter written as the fold model's decoding.json. ``--no-baselines`` scores the model alone.
``--data-from DIR`` links DIR/foldK/data as the fold's dataset instead of preparing it again.
``--ensemble-of W1 W2 ...`` trains nothing: each fold's model is the ensemble (``pfamalign.ensemble``)
of the fold models of earlier workdirs (their folds and datasets: ``--data-from`` defaults to
W1), each member's power and then the ensemble's decoder chosen on the fold's val families.
``--compare-to WORKDIR`` adds a JSON line: this run's model minus that run's model (tuned or fixed
decoder, and plan-only MEA) on the same test pairs, with the family bootstrap CI.

Output: one JSON line per fold and one for the pooled folds on stdout, and a markdown table
(on stdout after the JSON lines, or in ``--markdown FILE``). Resumable: each fold's result is
kept in WORKDIR/foldK/result.json and reused when the settings match; the dataset and the
training resume on their own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import subprocess
import sys

import numpy as np
import tune_decoder  # scripts/ is on sys.path (the scripts run as python scripts/NAME.py)

from pfamalign import ensemble, evaluation, jsonio
from pfamalign.alignment import pairhmm
from pfamalign.alignment.metrics import IDENTITY_BINS, paired_f1_difference
from pfamalign.decoding import DecoderSettings
from pfamalign.inference import Predictor
from pfamalign.pipelines import reader
from pfamalign.pipelines.records import write_text
from pfamalign.pipelines.config import PrepareConfig
from pfamalign.pipelines.pairs import SamplingConfig
from pfamalign.pipelines.prepare import PrepareError, run_prepare
from pfamalign.pipelines.stockholm import StockholmError, accession_base

ROOT = pathlib.Path(__file__).resolve().parents[1]
PFAM = ROOT.parent / "shared" / "data" / "pfam"
DEFAULT_PFAM = [PFAM / "seed_stockholm", PFAM / "hmmalign_stockholm"]
# The shipped model's recipe (pfamalign/assets/default_model/TRAINING.md).
EMBEDDER = "builtin/onehot+blosum62"
RECIPE_SETS = ["train.warmup_steps=50", "position_features=0", "substitution_window=8"]
BASELINES = ("nw", "sw", "diagonal", "probcons", "muscle")
MEA = DecoderSettings.for_decoder("mea")
FIXED = DecoderSettings.for_decoder("posterior")  # --fixed-decoders: alpha 0.5, no tuning
# plan only through the plan pair-HMM: the power chosen with the decoder (``plan_only_settings``);
# this one where nothing was tuned
PLAN_HMM = DecoderSettings(decoder="posterior", alpha=1.0, objective="f1", plan_power=0.05)
LABELS = {"model": "pfamalign (tuned decoder)", "model_mea": "pfamalign, plan only (MEA)",
          "model_plan": "pfamalign, plan only (plan pair-HMM)"}
# An ensemble's plan-only row is its best MEA row (plan_only_settings), not the plan pair-HMM
ENSEMBLE_LABELS = {**LABELS, "model_plan": "pfamalign, plan only (MEA, objective chosen on val)"}
BINS = ["all"] + [name for name, _, _ in IDENTITY_BINS]


class CrossvalError(RuntimeError):
    """A step of a fold failed (the message names the step and its log)."""


def run_cli(args: list[str], log: pathlib.Path, step: str) -> None:
    """One ``pfamalign`` command in a child process (training: its memory and its compiled
    programs go with it), its output appended to ``log``."""
    with log.open("a") as out:
        proc = subprocess.run([sys.executable, "-m", "pfamalign.cli", *args], stdout=out,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text()[-2000:]
        raise CrossvalError(f"{step} failed (exit {proc.returncode}); log {log}:\n{tail}")


# ---- the steps of one fold ------------------------------------------------------------------


def prepare_fold(args, fold: int, fold_dir: pathlib.Path, reuse: list[pathlib.Path]) -> pathlib.Path:
    """The fold's dataset, as ``pfamalign prepare shards --fold K/N`` makes it (a no-op when it
    is complete; it resumes otherwise). With ``--data-from``, a link to that fold's dataset."""
    data = fold_dir / "data"
    if args.data_from is not None:
        source = (args.data_from / f"fold{fold}" / "data").resolve()
        if not (source / "manifest.json").is_file():
            raise CrossvalError(f"fold {fold}: no prepared dataset at {source}")
        if not data.exists():
            data.symlink_to(source, target_is_directory=True)
        return data
    sampling = SamplingConfig(pairs_per_family=args.pairs_per_family, stratify_pid=True)
    cfg = PrepareConfig(inputs=tuple(str(p) for p in args.pfam), out=str(data), embedder=EMBEDDER,
                        sampling=sampling, fold=(fold, args.folds), seed=args.seed,
                        reuse_embeddings=tuple(str(r) for r in reuse))
    try:
        run_prepare(cfg, quiet=True)
    except (PrepareError, StockholmError, ValueError) as err:
        raise CrossvalError(f"fold {fold}: prepare failed: {err}") from err
    return data


def train_fold(args, data: pathlib.Path, fold_dir: pathlib.Path) -> pathlib.Path:
    model = fold_dir / "run" / "model"
    if not (model / "config.json").is_file():
        cmd = ["train", "--data", str(data), "--config", args.config, "--out",
               str(fold_dir / "run"), "--steps", str(args.steps), "--batch-size",
               str(args.batch_size), "--lr", str(args.lr), "-q"]
        cmd += [x for s in RECIPE_SETS + args.set for x in ("--set", s)]
        cmd += ["--no-tune"] if args.fixed_decoders else []
        run_cli(cmd, fold_dir / "train.log", f"{fold_dir.name}: train")
    if not (model / pairhmm.MODEL_FILE).is_file():  # models trained before training counted it
        pairhmm.fit_for_model(model, data, split="train")
    return model


def build_ensemble(args, fold: int, data: pathlib.Path, model: pathlib.Path) -> None:
    """The fold's model: the ensemble of the ``--ensemble-of`` workdirs' fold models, each
    member's power chosen on the fold's val pairs (the decoder is chosen after, by ``tune_fold``)."""
    members = [w / f"fold{fold}" / "run" / "model" for w in args.ensemble_of]
    missing = [str(m) for m in members if not (m / "config.json").is_file()]
    if missing:
        raise CrossvalError(f"fold {fold}: no trained model at {', '.join(missing)} (run those workdirs first)")
    try:
        ensemble.build(model, members, data, split=tuning_split(data), max_pairs=args.tune_pairs,
                       seed=args.seed, tune_decoder=False)
    except ValueError as err:
        raise CrossvalError(f"fold {fold}: ensemble failed: {err}") from err


def tuning_split(data: pathlib.Path) -> str:
    """The fold's val split, or its train split when it has no val pairs (said in the table)."""
    ds = reader.PairDataset(data)
    return "val" if "val" in ds.splits and ds.num_pairs("val") else "train"


def tune_fold(args, model: pathlib.Path, data: pathlib.Path, fold_dir: pathlib.Path) -> str:
    """Writes the decoder chosen on the val families (the training families when the fold has
    none) into ``model``; returns the split it was chosen on."""
    split = tuning_split(data)
    with (fold_dir / "tune_decoder.jsonl").open("w") as log, contextlib.redirect_stdout(log):
        tune_decoder.main(["--data", str(data), "--checkpoint", str(model), "--split", split,
                           "--max-pairs", str(args.tune_pairs), "--write"])
    return split


def sample_test_pairs(data: pathlib.Path, max_pairs: int, seed: int) -> list[dict]:
    """Up to ``max_pairs`` test pairs, round-robin over the families (each family's pairs in a
    seeded random order, the families in sorted order: ``evaluation.sample_across_families``
    with ``shuffle_families=False``, the draw the published figures were made with), with
    their stored features."""
    ds = reader.PairDataset(data)
    if "test" in ds.splits and not ds.num_pairs("test"):
        return []  # a fold whose families gave no pairs scores none (pair_records refuses it)
    records, _, _ = evaluation.pair_records(data=data, split="test", max_pairs=max_pairs, seed=seed,
                                            embedder_id=ds.embedder_id, shuffle_families=False)
    return list(records)


def plan_only_settings(fold_dir: pathlib.Path, *, ensemble: bool = False) -> DecoderSettings:
    """The plan-only decoder (no substitution table) that scored best where the fold's decoder
    was chosen (its ``tune_decoder.jsonl`` rows); ``PLAN_HMM`` without them. A single model's
    plan decodes far better through the plan pair-HMM than by MEA (0.755 against 0.656
    cross-validated), so its candidates are the plan pair-HMM rows (alpha 1): offered the MEA
    rows too, three high-identity validation families picked MEA for one fold (0.638 against
    about 0.74 on its test pairs). An ensemble's plan already is its members' plan pair-HMM
    posteriors: its candidates are the MEA rows."""
    log = fold_dir / "tune_decoder.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    rows = [r for r in rows if r.get("bench") == "tune_decoder" and (
        r.get("decoder") == "mea" if ensemble else
        r.get("decoder") == "posterior" and r.get("alpha") == 1.0 and r.get("plan_power", 0) > 0)]
    if not rows:
        return PLAN_HMM
    best = max(rows, key=lambda r: r["f1"])
    return DecoderSettings(**{f.name: best[f.name] for f in dataclasses.fields(DecoderSettings)})


def evaluate_fold(records: list[dict], predictor, baselines,
                  plan_only: DecoderSettings = PLAN_HMM) -> evaluation.Evaluation:
    """The model with its own (tuned) decoder and with the two plan-only decoders (MEA on the
    plan, and ``plan_only``), and the baselines, on the same pairs (families grouped by
    version-free accession, as ``evaluation.evaluate`` groups them)."""
    ev = evaluation.evaluate(records, predictor=predictor, baselines=baselines)
    if predictor is not None:
        for n, (name, settings) in enumerate((("model_mea", MEA), ("model_plan", plan_only))):
            alone = evaluation.evaluate(records, predictor=predictor, baselines=(), decoding=settings)
            ev.methods.insert(1 + n, name)
            ev.counts[name], ev.seconds[name] = alone.counts["model"], alone.seconds["model"]
    return ev


def raw(ev: evaluation.Evaluation) -> dict:
    """What pooling needs of a fold's evaluation (counts, identity, families, seconds, the
    reliability bin sums)."""
    return {"methods": ev.methods, "counts": {m: np.asarray(ev.counts[m]).tolist() for m in ev.methods},
            "pid": list(ev.pid), "families": list(ev.families), "seconds": ev.seconds,
            "skipped": ev.skipped, "reliability": {m: s.tolist() for m, s in ev.reliability.items()}}


def pool(raws: list[dict]) -> evaluation.Evaluation:
    """One Evaluation over the pairs of several folds (the methods every fold has). A
    method's reliability is pooled (bin sums added) only when every fold has it: a
    result.json written before it was recorded leaves the pooled reliability out."""
    methods = [m for m in raws[0]["methods"] if all(m in r["methods"] for r in raws)]
    ev = evaluation.Evaluation(methods, {m: [] for m in methods}, {},
                               seconds={m: 0.0 for m in methods})
    for r in raws:
        for m in methods:
            ev.counts[m] += r["counts"][m]
            ev.seconds[m] += r["seconds"][m]
        ev.pid += r["pid"]
        ev.families += r["families"]
        ev.skipped.update(r["skipped"])
    for m in methods:
        if all(m in r.get("reliability", {}) for r in raws):
            ev.reliability[m] = np.sum([r["reliability"][m] for r in raws], axis=0)
    return ev


def labelled(summary: dict, *, ensemble: bool = False) -> dict:
    labels = ENSEMBLE_LABELS if ensemble else LABELS
    for m, entry in summary["methods"].items():
        entry["label"] = labels.get(m, entry["label"])
    return summary


def seen_families(seen_data: pathlib.Path | None) -> set[str] | None:
    """Accessions in the train / val splits of the fixed model's training dataset."""
    if seen_data is None:
        return None
    import pandas as pd

    fams = pd.read_csv(pathlib.Path(seen_data) / "families.tsv", sep="\t", keep_default_na=False)
    return set(fams.loc[fams["split"].isin(["train", "val"]), "accession_base"])


def run_fold(args, fold: int, settings: dict, reuse: list[pathlib.Path]) -> dict:
    fold_dir = args.workdir / f"fold{fold}"
    result_path = fold_dir / "result.json"
    if result_path.is_file():
        done = json.loads(result_path.read_text())
        if done.get("n_folds", args.folds) != args.folds:  # another partition of the families
            raise CrossvalError(f"{result_path} is fold {fold} of {done['n_folds']} folds, not of --folds "
                                f"{args.folds}: give another --workdir")
        if done.get("settings") == settings:
            print(f"fold {fold}: done earlier ({result_path})", file=sys.stderr)
            return done
        print(f"fold {fold}: {result_path} has other settings; redoing it", file=sys.stderr)
    fold_dir.mkdir(parents=True, exist_ok=True)
    print(f"fold {fold}: prepare", file=sys.stderr, flush=True)
    data = prepare_fold(args, fold, fold_dir, reuse)
    ds = reader.PairDataset(data)
    info = {"fold": fold, "n_folds": args.folds, "settings": settings, "data": str(data),
            "split_families": {s: ds.manifest["splits"][s]["families"] for s in ds.splits}}
    predictor, model = None, None
    if args.ensemble_of:
        model = fold_dir / "run" / "model"
        if not model.is_dir():
            print(f"fold {fold}: ensemble of {len(args.ensemble_of)} models", file=sys.stderr, flush=True)
            build_ensemble(args, fold, data, model)
        print(f"fold {fold}: choose the decoder", file=sys.stderr, flush=True)
        info["decoder_chosen_on"] = tune_fold(args, model, data, fold_dir) + " families of the fold"
    elif args.no_train:
        model = args.checkpoint
        info["decoder_chosen_on"] = "the checkpoint's own decoding.json"
    elif not args.baselines_only:
        print(f"fold {fold}: train ({args.steps} steps)", file=sys.stderr, flush=True)
        model = train_fold(args, data, fold_dir)
        if args.fixed_decoders:
            FIXED.save(model)
            info["decoder_chosen_on"] = "fixed (posterior, alpha 0.5; no tuning)"
        else:
            print(f"fold {fold}: choose the decoder", file=sys.stderr, flush=True)
            info["decoder_chosen_on"] = tune_fold(args, model, data, fold_dir) + " families of the fold"
    if model is not None:
        predictor = Predictor(model)
        if predictor.config.embedder_id != ds.embedder_id:
            raise CrossvalError(f"the model's features ({predictor.config.embedder_id}) are not "
                                f"the dataset's ({ds.embedder_id})")
        info["model"], info["decoding"] = str(model), dataclasses.asdict(predictor.decoding)
    print(f"fold {fold}: evaluate", file=sys.stderr, flush=True)
    records = sample_test_pairs(data, args.max_pairs_per_fold, args.seed)
    info["test_families"] = sorted({accession_base(r["family"]) for r in records})
    if args.no_train:
        seen = seen_families(args.seen_data)
        info["fixed_model_saw"] = (sorted(seen & set(info["test_families"])) if seen is not None
                                   else "unknown (one fixed model for every fold; pass --seen-data)")
    plan_only = plan_only_settings(fold_dir, ensemble=bool(args.ensemble_of))
    info["plan_only_decoding"] = dataclasses.asdict(plan_only)
    ev = evaluate_fold(records, predictor, () if args.no_baselines else BASELINES, plan_only)
    result = {**info, "evaluation": raw(ev), "summary": labelled(ev.summary(n_boot=args.bootstrap, seed=args.seed),
                                                                    ensemble=bool(args.ensemble_of))}
    write_text(result_path, jsonio.dumps(result))
    return json.loads(jsonio.dumps(result))  # the same values a resumed run reads back


# ---- reporting ------------------------------------------------------------------------------


def _cell(c: dict, signed: bool = False) -> str:
    v, lo, hi = c["value"], c["low"], c["high"]
    if v is None or not np.isfinite(v):
        return "—"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    ci = f" [{fmt.format(lo)}, {fmt.format(hi)}]" if lo is not None and np.isfinite(lo) else ""
    return fmt.format(v) + ci


def decoder_note(fold: dict) -> str:
    """The model's decoder in a fold and where it was chosen, e.g. ``hybrid, plan weight 2 (val)``."""
    d = fold.get("decoding")
    if d is None:
        return "—"
    name = d["decoder"] + (f", plan weight {d['plan_weight']:g}" if d["decoder"] == "hybrid" else
                           f", alpha {d['alpha']:g}" + (f", plan power {d['plan_power']:g}" if d.get("plan_power") else "")
                           if d["decoder"] == "posterior" else "")
    where = fold["decoder_chosen_on"]
    return f"{name} ({where.split()[0] if where.endswith('of the fold') else 'fixed'})"


def markdown(folds: list[dict], pooled: dict, note: str) -> str:
    methods = pooled["methods"]
    n_pairs = {b: next(iter(methods.values()))["prf"][b]["n_pairs"] for b in BINS}
    lines = [f"Aligned-pair micro F1, {len(folds)} folds pooled: {pooled['n_pairs']} test pairs "
             f"of {pooled['n_families']} families, each family unseen in its fold "
             f"(bootstrap 95 % CI over pairs). {note}", "",
             "| method | " + " | ".join(f"{b} (n={n_pairs[b]})" for b in BINS) + " | s / pair |",
             "| --- |" + " --- |" * (len(BINS) + 1)]
    for entry in methods.values():
        per_pair = entry["seconds"] / max(pooled["n_pairs"], 1)
        lines.append(f"| {entry['label']} | " + " | ".join(_cell(entry["prf"][b]["micro"]["f1"])
                                                             for b in BINS) + f" | {per_pair:.4f} |")
    for m, diff in pooled.get("model_minus_by_family", {}).items():
        lines.append(f"| pfamalign − {methods[m]['label']} (CI resampling families) | "
                     + " | ".join(_cell(diff[b], signed=True) for b in BINS) + " | |")
    for m, diff in pooled.get("plan_only_minus_by_family", {}).items():
        plan = methods["model_plan"]["label"].removeprefix("pfamalign, ")
        lines.append(f"| {plan} − {methods[m]['label']} (CI resampling families) | "
                     + " | ".join(_cell(diff[b], signed=True) for b in BINS) + " | |")
    for m, why in pooled.get("skipped_baselines", {}).items():
        lines.append(f"\n{m} not scored: {why}")
    lines += ["", "Per fold (micro F1, all pairs):", "",
              "| fold | test families | pairs | decoder (chosen on) | "
              + " | ".join(e["label"] for e in methods.values()) + " |",
              "| --- | --- | --- | --- |" + " --- |" * len(methods)]
    for f in folds:
        s = f["summary"]
        cells = [_cell(s["methods"][m]["prf"]["all"]["micro"]["f1"] | {"low": None})
                 if m in s["methods"] else "—" for m in methods]  # value only; "—" for a fold without pairs
        lines.append(f"| {f['fold']} | {s['n_families']} | {s['n_pairs']} | {decoder_note(f)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare(results: list[dict], other: pathlib.Path, folds: list[int], args) -> dict:
    """This run's model minus another run's (its result.json per fold) on the same pairs."""
    theirs = []
    for k in folds:
        path = other / f"fold{k}" / "result.json"
        if not path.is_file():
            raise CrossvalError(f"--compare-to: {path} is missing")
        theirs.append(json.loads(path.read_text()))
    a, b = pool([r["evaluation"] for r in results]), pool([r["evaluation"] for r in theirs])
    if a.pid != b.pid or a.families != b.families:
        raise CrossvalError(f"--compare-to: {other} scored other test pairs")
    counts = lambda ev, m: np.asarray(ev.counts[m], np.int64).reshape(-1, 3)
    return {"compare_to": str(other), "folds": folds, **{
        f"{m}_minus_theirs": paired_f1_difference(counts(a, m), counts(b, m), np.asarray(a.pid), groups=a.families,
                                                  n_boot=args.bootstrap, seed=args.seed)
        for m in ("model", "model_mea", "model_plan") if m in a.methods and m in b.methods}}


def plan_only_versus(ev: evaluation.Evaluation, args) -> dict:
    """The plan alone (``plan_only_settings``) minus each baseline on the same pairs, with
    the family-resampling CI: whether the plan carries the alignment as well as they do."""
    if "model_plan" not in ev.methods:
        return {}
    counts = lambda m: np.asarray(ev.counts[m], np.int64).reshape(-1, 3)
    return {m: paired_f1_difference(counts("model_plan"), counts(m), np.asarray(ev.pid), groups=ev.families,
                                    n_boot=args.bootstrap, seed=args.seed)
            for m in ev.methods if not m.startswith("model")}


def headline(summary: dict) -> dict:
    """The micro F1 per method and bin (the JSON line's short form)."""
    return {m: {b: e["prf"][b]["micro"]["f1"]["value"] for b in BINS}
            for m, e in summary["methods"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=pathlib.Path, required=True,
                        help="fold datasets, runs and results (reused on a re-run)")
    parser.add_argument("--pfam", type=pathlib.Path, action="append", default=None,
                        help="Stockholm files or directories (repeat; default: the seed and "
                             "hmmalign files of ../shared/data/pfam)")
    parser.add_argument("--folds", type=int, default=5, help="N (default 5)")
    parser.add_argument("--only", default=None,
                        help="comma-separated folds to run and pool (default: all)")
    parser.add_argument("--seed", type=int, default=0,
                        help="fold assignment, pair sampling and bootstrap seed (default 0)")
    parser.add_argument("--pairs-per-family", type=int, default=1000,
                        help="pairs sampled per family by prepare (default 1000, the shipped recipe)")
    parser.add_argument("--max-pairs-per-fold", type=int, default=200,
                        help="test pairs scored per fold, round-robin over its families (default 200)")
    parser.add_argument("--config", default="align_ce", help="training config (default align_ce)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"training override, after the recipe's {' '.join(RECIPE_SETS)}")
    parser.add_argument("--tune-pairs", type=int, default=500,
                        help="val pairs for choosing the decoder (default 500)")
    parser.add_argument("--no-train", action="store_true",
                        help="evaluate one fixed model (--checkpoint) in every fold")
    parser.add_argument("--checkpoint", type=pathlib.Path, default=None,
                        help="with --no-train: the model directory")
    parser.add_argument("--seen-data", type=pathlib.Path, default=None,
                        help="with --no-train: the fixed model's training dataset, to name the "
                             "test families it saw")
    parser.add_argument("--baselines-only", action="store_true", help="no model: the baselines only")
    parser.add_argument("--fixed-decoders", action="store_true",
                        help="no decoder tuning: plan-only MEA and the posterior decoder at alpha 0.5")
    parser.add_argument("--no-baselines", action="store_true", help="score the model alone")
    parser.add_argument("--data-from", type=pathlib.Path, default=None,
                        help="an earlier workdir whose foldK/data datasets to link and reuse")
    parser.add_argument("--ensemble-of", type=pathlib.Path, nargs="+", default=None, metavar="WORKDIR",
                        help="no training: each fold's model is the ensemble of these workdirs' fold models")
    parser.add_argument("--compare-to", type=pathlib.Path, default=None,
                        help="another trained run's workdir: report this model minus that one")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--markdown", type=pathlib.Path, default=None,
                        help="write the markdown table here instead of stdout")
    args = parser.parse_args(argv)
    if args.no_train and args.checkpoint is None:
        parser.error("--no-train needs --checkpoint MODEL")
    if args.checkpoint is not None and not args.no_train:
        parser.error("--checkpoint goes with --no-train")
    if sum(map(bool, (args.no_train, args.baselines_only, args.ensemble_of))) > 1:
        parser.error("give at most one of --no-train, --baselines-only and --ensemble-of")
    if args.ensemble_of:
        if len(args.ensemble_of) < 2:
            parser.error("--ensemble-of needs at least two workdirs")
        args.data_from = args.data_from or args.ensemble_of[0]
    args.pfam = args.pfam or DEFAULT_PFAM
    for p in args.pfam:
        if not p.exists():
            parser.error(f"Pfam input not found: {p}")
    if args.folds < 2:
        parser.error(f"--folds must be at least 2, got {args.folds}")
    for name in ("pairs_per_family", "max_pairs_per_fold", "bootstrap"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    try:
        folds = (list(range(args.folds)) if args.only is None
                 else sorted({int(k) for k in args.only.split(",") if k.strip()}))
    except ValueError:
        parser.error(f"--only takes fold numbers separated by commas, e.g. 0,2; got {args.only!r}")
    if not folds or not all(0 <= k < args.folds for k in folds):
        parser.error(f"--only must name folds in 0..{args.folds - 1}")

    mode = ("baselines" if args.baselines_only else "fixed" if args.no_train
            else "ensemble" if args.ensemble_of else "trained")
    settings = {"mode": mode, "seed": args.seed, "pairs_per_family": args.pairs_per_family,
                "max_pairs_per_fold": args.max_pairs_per_fold, "bootstrap": args.bootstrap,
                "pfam": [str(p.resolve()) for p in args.pfam]}
    if mode == "trained":
        settings["recipe"] = {"config": args.config, "steps": args.steps, "batch_size": args.batch_size,
                              "lr": args.lr, "set": RECIPE_SETS + args.set, "tune_pairs": args.tune_pairs,
                              "fixed_decoders": args.fixed_decoders}
    settings["baselines"] = not args.no_baselines
    if mode == "fixed":
        settings["checkpoint"] = str(args.checkpoint.resolve())
    if mode == "ensemble":
        settings["ensemble_of"] = [str(w.resolve()) for w in args.ensemble_of]
        settings["tune_pairs"] = args.tune_pairs
    try:
        results, reuse = [], []
        for k in folds:
            results.append(run_fold(args, k, settings, reuse))
            reuse = reuse or [args.workdir / f"fold{k}" / "data"]  # same embeddings every fold
            print(jsonio.dumps_line({"fold": k, **{x: results[-1].get(x) for x in (
                "test_families", "split_families", "decoder_chosen_on", "decoding", "fixed_model_saw")},
                "f1": headline(results[-1]["summary"]), "summary": results[-1]["summary"]}), flush=True)
    except CrossvalError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    ev = pool([r["evaluation"] for r in results])
    pooled = labelled(ev.summary(n_boot=args.bootstrap, seed=args.seed), ensemble=bool(args.ensemble_of))
    pooled["plan_only_minus_by_family"] = plan_only_versus(ev, args)
    print(jsonio.dumps_line({"fold": "pooled", "folds": folds, "settings": settings,
                             "f1": headline(pooled), "summary": pooled}), flush=True)
    if args.compare_to is not None:
        print(jsonio.dumps_line(compare(results, args.compare_to, folds, args)), flush=True)
    note = {"trained": f"One model trained per fold ({args.config}, {args.steps} steps).",
            "fixed": f"One fixed model ({args.checkpoint}) in every fold: it may have trained on "
                     "some folds' test families (see fixed_model_saw).",
            "ensemble": "One ensemble per fold of the fold models of "
                        + ", ".join(str(w) for w in args.ensemble_of or ()) + ".",
            "baselines": "Baselines only."}[mode]
    table = markdown(results, pooled, note)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        write_text(args.markdown, table)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
