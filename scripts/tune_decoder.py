"""Pick a model's decoder settings on a validation split: one JSON line per setting.

    python scripts/tune_decoder.py --data data/ --checkpoint runs/ac/model --split val
    python scripts/tune_decoder.py ... --write      # save the best as RUN/model/decoding.json

A thin wrapper over ``pfamalign.tuning`` (which ``pfamalign train`` runs at its end): the
plans are computed once; every setting of ``tuning.candidate_settings()`` is scored by
aligned-pair micro F1 against the references, overall and below 30 % identity. The best
overall F1 wins only with evidence: it must beat the incumbent (the shipped decoder) with a
paired interval above zero over five or more families, else the incumbent is kept
(``pfamalign.tuning``). The last line names the choice and, in ``margin_over_incumbent``, the
best-scoring candidate (``challenger``) and its margin. ``--max-pairs`` are drawn across the
split's families. Tune on the
validation families only: the test families must stay unseen.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import _common
from pfamalign import evaluation, jsonio, tuning
from pfamalign.inference import Predictor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=_common.existing_path, required=True, help="dataset directory from `prepare shards`")
    parser.add_argument("--checkpoint", type=_common.existing_path, required=True, help="model directory (RUN/model)")
    parser.add_argument("--split", default="val", choices=("train", "val"))
    parser.add_argument("--max-pairs", type=_common.positive_int, default=1000)
    parser.add_argument("--write", action="store_true",
                        help="write the best setting to CHECKPOINT/decoding.json")
    args = parser.parse_args(argv)

    predictor = Predictor(args.checkpoint)
    records, _, features = evaluation.pair_records(
        data=args.data, split=args.split, max_pairs=args.max_pairs,
        embedder_id=predictor.config.embedder_id)
    result = tuning.tune(predictor, records, features=features,
                         incumbent=tuning.incumbent_settings(), on_row=lambda row: print(
                             jsonio.dumps_line({"bench": "tune_decoder", **row}), flush=True))
    print(jsonio.dumps_line({"best": dataclasses.asdict(result.best), "f1": result.f1,
                             "margin_over_incumbent": result.margin}), flush=True)
    if args.write:
        result.best.save(pathlib.Path(args.checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
