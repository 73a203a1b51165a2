"""The plan alone from an ensemble of models, cross-validated: each member's plan through the
plan pair-HMM (alpha 1, its power the one its fold's tuning found best; ``crossval.py``'s
"plan only" row), the members' match posteriors averaged, and the alignment of the largest
expected F1 under the average (MEA, ``f1`` objective). No substitution matrix enters.

    python scripts/crossval.py --workdir runs/cv5 ...                      # conv, the shipped recipe
    python scripts/crossval.py --workdir runs/cv5_ceta --config align_ceta ...
    python scripts/plan_ensemble.py --workdirs runs/cv5 runs/cv5_ceta

Every workdir must come from the same folds and test pairs (``--data-from`` one of them, the
same ``--seed`` and ``--max-pairs-per-fold``): the script scores the test pairs ``crossval.py``
scored and takes the baselines' counts from the first workdir's ``foldK/result.json``, after
checking that the pairs are the same (the folds are the first workdir's finished ones). Prints
one JSON line per fold and one pooled, with the ensemble minus each member and each baseline
(paired bootstrap, whole families resampled).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import crossval  # scripts/ is on sys.path (the scripts run as python scripts/NAME.py)
import numpy as np

from pfamalign import evaluation
from pfamalign.alignment.decode import mea_decode
from pfamalign.alignment.metrics import alignment_counts, paired_f1_difference, prf
from pfamalign.inference import Predictor

BASELINES = ("probcons", "muscle", "nw")


def member_posteriors(fold_dir: pathlib.Path, records: list[dict]) -> list[np.ndarray]:
    """One fold model's plan pair-HMM match posteriors of each record (its plan-only decoder)."""
    predictor = Predictor(fold_dir / "run" / "model")
    settings = crossval.plan_only_settings(fold_dir)
    plans = list(evaluation.model_plans(predictor, records))
    return predictor.plan_posteriors([(r["q_seq"], r["k_seq"]) for r in records], plans, settings)


def ensemble_counts(posteriors: list[list[np.ndarray]], records: list[dict]) -> np.ndarray:
    """``[N, 3]`` alignment counts of the averaged posteriors' expected-F1 alignment per record."""
    counts = []
    for i, r in enumerate(records):
        mean = sum(p[i] for p in posteriors) / len(posteriors)
        counts.append(alignment_counts(mea_decode(mean, objective="f1").pairs, r["target"]))
    return np.asarray(counts, np.int64)


def f1(counts) -> float:
    return float(prf(*np.asarray(counts).sum(axis=0))[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdirs", type=pathlib.Path, nargs="+", required=True,
                        help="crossval.py workdirs, one per ensemble member (same folds and pairs)")
    parser.add_argument("--max-pairs-per-fold", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args(argv)

    names = [w.name for w in args.workdirs]
    pooled = {m: [] for m in ["ensemble", *names, *BASELINES]}
    pid, families = [], []
    folds = sorted(int(d.name[4:]) for d in args.workdirs[0].glob("fold*") if (d / "result.json").is_file())
    if not folds:
        raise SystemExit(f"{args.workdirs[0]}: no foldK/result.json (run crossval.py first)")
    for k in folds:
        first = args.workdirs[0] / f"fold{k}"
        done = json.loads((first / "result.json").read_text())
        records = crossval.sample_test_pairs(pathlib.Path(done["data"]), args.max_pairs_per_fold, args.seed)
        ev = done["evaluation"]
        if [r["pid"] for r in records] != ev["pid"]:
            raise SystemExit(f"{first}: its test pairs are not the ones sampled here "
                             f"(--max-pairs-per-fold / --seed as crossval.py's?)")
        posteriors = [member_posteriors(w / f"fold{k}", records) for w in args.workdirs]
        fold = {"ensemble": ensemble_counts(posteriors, records)}
        for name, post in zip(names, posteriors):
            fold[name] = ensemble_counts([post], records)  # one member alone: its plan-only row
        for b in BASELINES:
            if b in ev["counts"]:
                fold[b] = np.asarray(ev["counts"][b], np.int64)
        for m, c in fold.items():
            pooled[m].extend(c.tolist())
        pid += ev["pid"]
        families += ev["families"]
        print(json.dumps({"fold": k, "pairs": len(records),
                          "f1": {m: round(f1(c), 4) for m, c in fold.items()}}), flush=True)
    pooled = {m: np.asarray(c, np.int64) for m, c in pooled.items() if len(c) == len(pid)}
    minus = {}
    for other in [m for m in pooled if m != "ensemble"]:
        diff = paired_f1_difference(pooled["ensemble"], pooled[other], pid, groups=families,
                                    n_boot=args.bootstrap, seed=args.seed)
        minus[other] = {b: {k: round(v, 4) for k, v in diff[b].items() if k in ("value", "low", "high")}
                        for b in ("all", "<30")}
    low = np.asarray(pid) < 30
    print(json.dumps({"pooled": True, "pairs": len(pid), "members": names,
                      "f1": {m: round(f1(c), 4) for m, c in pooled.items()},
                      "f1_below30": {m: round(f1(c[low]), 4) for m, c in pooled.items()},
                      "ensemble_minus": minus}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
