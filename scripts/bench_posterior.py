"""Pair-HMM posteriors, the transport plan and their mixture against ProbCons and NW: JSON lines.

    python scripts/bench_posterior.py --data data_b62_1k --split val --pairs 500
    python scripts/bench_posterior.py --data data_b62_1k --split test --pairs 800 \\
        --alpha 0.5 --gap-cost 0.0

On one seeded sample of pairs of a split (the same pairs for every method), scores by
aligned-pair micro F1 (overall and below 30 % identity): the ``posterior`` decoder over a grid
of ``alpha`` (0 = pair-HMM MEA alone, 1 = the plan alone) and ``gap_cost``, the plan's own
``mea`` decoder, the model's shipped decoding, Needleman-Wunsch (BLOSUM62 11/1) and, when the
``probcons`` binary is on PATH, ProbCons 1.12 on the two sequences. With ``--alpha`` (chosen on
the validation split), the paired bootstrap difference of that setting against each baseline
follows, resampling pairs and then whole families. Choose alpha on ``val``; report ``test``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np

import _common
from pfamalign import jsonio
from pfamalign.alignment.baselines import EXTERNAL_ALIGNERS, external_align, needleman_wunsch
from pfamalign.alignment.metrics import alignment_counts, paired_f1_difference
from pfamalign.alignment.pairhmm import default_pairhmm, load, match_posteriors
from pfamalign.decoding import DecoderSettings
from pfamalign.inference import Predictor
from pfamalign.pipelines import reader
from pfamalign.tuning import micro_f1

ALPHAS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)
GAP_COSTS = (0.0, 0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=_common.existing_path, required=True, help="dataset directory from `prepare shards`")
    parser.add_argument("--split", default="val", choices=("val", "test"))
    parser.add_argument("--pairs", type=_common.positive_int, default=500, help="pairs sampled from the split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=_common.existing_path, default=None, help="model directory (default: the shipped model)")
    parser.add_argument("--hmm", type=_common.existing_path, default=None, help="pair-HMM parameter file (default: the shipped one)")
    parser.add_argument("--alpha", type=float, default=None, help="the chosen setting, compared with the baselines")
    parser.add_argument("--gap-cost", type=float, default=0.0, help="gap_cost of the chosen setting")
    parser.add_argument("--n-boot", type=int, default=1000)
    args = parser.parse_args(argv)

    source = reader.PairSource(args.data, args.split, features=True)
    rng = np.random.default_rng(args.seed)
    picked = np.sort(rng.choice(len(source), size=min(args.pairs, len(source)), replace=False))
    records = [source[int(i)] for i in picked]
    families = [r["family"] for r in records]
    pid = np.array([r["pid"] for r in records])
    hmm = load(open(args.hmm).read()) if args.hmm else default_pairhmm()
    predictor = Predictor(args.checkpoint)
    meta = {"bench": "posterior", "split": args.split, "n_pairs": len(records),
            "n_families": len(set(families)), "seed": args.seed, "hmm": args.hmm or "shipped"}

    t0 = time.perf_counter()
    plans = list(predictor.plans([(r["q_feat"], r["k_feat"]) for r in records]))
    plan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    posteriors = [match_posteriors(hmm, r["q_seq"], r["k_seq"]) for r in records]
    hmm_s = time.perf_counter() - t0
    print(jsonio.dumps_line({**meta, "plan_s_per_pair": plan_s / len(records),
                             "hmm_s_per_pair": hmm_s / len(records)}), flush=True)

    def score(align) -> np.ndarray:
        return np.array([alignment_counts(align(r, pp, post), r["target"])
                         for r, pp, post in zip(records, plans, posteriors)])

    def decoded(settings: DecoderSettings):
        return lambda r, pp, post: settings.decode(pp, (r["q_seq"], r["k_seq"]), hmm_posteriors=post).pairs

    methods = {f"posterior alpha={a} gap_cost={c}": decoded(DecoderSettings(decoder="posterior", alpha=a, gap_cost=c))
               for a, c in itertools.product(ALPHAS, GAP_COSTS)}
    methods["mea (plan)"] = decoded(DecoderSettings(decoder="mea"))
    methods["shipped"] = decoded(predictor.decoding)
    methods["nw"] = lambda r, pp, post: needleman_wunsch(r["q_seq"], r["k_seq"]).pairs
    if not EXTERNAL_ALIGNERS["probcons"].missing():
        methods["probcons"] = lambda r, pp, post: external_align("probcons", r["q_seq"], r["k_seq"]).pairs
    chosen = None
    if args.alpha is not None:
        chosen = f"chosen posterior alpha={args.alpha} gap_cost={args.gap_cost}"
        methods[chosen] = decoded(DecoderSettings(decoder="posterior", alpha=args.alpha, gap_cost=args.gap_cost))
    counts = {}
    low = pid < 30
    for name, align in methods.items():
        counts[name] = score(align)
        print(jsonio.dumps_line({**meta, "method": name, "f1": micro_f1(counts[name]),
                                 "f1_below30": micro_f1(counts[name][low]), "n_below30": int(low.sum())}), flush=True)
    if chosen is not None:
        hmm_alone = "posterior alpha=0.0 gap_cost=0.0"  # what the plan adds to the pair-HMM
        for base in [b for b in ("probcons", "nw", "shipped", "mea (plan)", hmm_alone) if b in counts]:
            for resample, groups in (("pairs", None), ("families", families)):
                diff = paired_f1_difference(counts[chosen], counts[base], pid, groups=groups, n_boot=args.n_boot,
                                            seed=args.seed)
                print(jsonio.dumps_line({**meta, "method": chosen, "minus": base, "resample": resample,
                                         **{f"{k}_{b}": v for b in ("all", "<30") for k, v in diff[b].items()
                                            if k in ("value", "low", "high")}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
