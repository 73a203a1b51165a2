"""Pick a model's decoder settings on a validation split: one JSON line per setting.

    python scripts/tune_decoder.py --data data/ --checkpoint runs/ac/model --split val
    python scripts/tune_decoder.py ... --write      # save the best as RUN/model/decoding.json

The plans are computed once; every setting of the grid (MEA, the affine-gap decoder over
threshold x gap costs, the hybrid decoder over plan weights) is scored by aligned-pair F1 against the references (micro, as
``pfamalign eval``), overall and below 30 % identity. The best overall F1 wins. Tune on the
validation families only: the test families must stay unseen.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib
import sys

import numpy as np

from pfamalign import jsonio
from pfamalign.alignment.metrics import alignment_counts
from pfamalign.inference import DecoderSettings, Predictor
from pfamalign.pipelines import reader

THRESHOLDS = (0.0, 0.02, 0.05, 0.1)
GAPS = ((0.5, 0.05), (1.0, 0.1), (2.0, 0.2), (3.0, 0.3), (3.0, 0.1), (5.0, 0.5))
PLAN_WEIGHTS = (0.0, 2.0, 5.0, 10.0, 20.0)  # hybrid, BLOSUM62 units (0 = Smith-Waterman)


def grid() -> list[DecoderSettings]:
    hybrid = DecoderSettings.for_decoder("hybrid")
    return ([DecoderSettings(decoder="mea")]
            + [DecoderSettings(threshold=t, gap_open=o, gap_extend=e)
               for t, (o, e) in itertools.product(THRESHOLDS, GAPS)]
            + [dataclasses.replace(hybrid, plan_weight=w) for w in PLAN_WEIGHTS])


def f1(counts: np.ndarray) -> float:
    tp, n_pred, n_ref = counts.sum(axis=0)
    return float(2 * tp / max(n_pred + n_ref, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="dataset directory from `prepare shards`")
    parser.add_argument("--checkpoint", required=True, help="model directory (RUN/model)")
    parser.add_argument("--split", default="val", choices=("train", "val"))
    parser.add_argument("--max-pairs", type=int, default=1000)
    parser.add_argument("--write", action="store_true",
                        help="write the best setting to CHECKPOINT/decoding.json")
    args = parser.parse_args(argv)

    predictor = Predictor(args.checkpoint)
    records = list(itertools.islice(reader.iter_pairs(args.data, args.split, features=True),
                                    args.max_pairs))
    plans = list(predictor.plans([(r["q_feat"], r["k_feat"]) for r in records]))
    low = np.array([r["pid"] < 30 for r in records])
    settings = grid()
    scores = []
    for s in settings:
        counts = np.array([alignment_counts(s.decode(pp, (r["q_seq"], r["k_seq"])).pairs, r["target"])
                           for r, pp in zip(records, plans)])
        scores.append(f1(counts))
        print(jsonio.dumps_line({"bench": "tune_decoder", **s.__dict__, "f1": scores[-1],
                                 "f1_below30": f1(counts[low]) if low.any() else None,
                                 "n_pairs": len(records)}), flush=True)
    best = settings[int(np.argmax(scores))]
    print(jsonio.dumps_line({"best": best.__dict__, "f1": max(scores)}), flush=True)
    if args.write:
        best.save(pathlib.Path(args.checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
