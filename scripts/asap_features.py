"""Which features carry the Sinkhorn dual: ASAP fits per feature family, one JSON line each.

    python scripts/asap_features.py --checkpoint MODEL --data DATA --pairs 32 --held-out 16

Every family is fitted on the same calibration pairs (``--split``, the model's training
families) and scored on the same held-out pairs of ``--eval-split`` (unseen families): R^2 of
the query-side dual (centred per pair) and of the dustbin's dual, and the relative l2 distance
of the ASAP-0 / ASAP plans to the teacher's. Families: the slices alone (ASAP's original
features), the per-residue features alone, both.
"""

from __future__ import annotations

import argparse

import numpy as np

import _common
from pfamalign import asap, jsonio


def pairs_of(predictor, data, split, n, seed):
    from pfamalign.evaluation import pair_records

    records, _, features = pair_records(data=data, split=split, max_pairs=n, seed=seed,
                                        embedder_id=predictor.config.embedder_id)
    if features != "records":
        raise SystemExit(f"{data} was embedded with another embedder than the model's")
    return [(np.asarray(r["q_feat"], np.float32), np.asarray(r["k_feat"], np.float32)) for r in records]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=_common.existing_path, default=None, help="model directory (default: the shipped model)")
    parser.add_argument("--data", default="data_b62_1k")
    parser.add_argument("--split", default="train")
    parser.add_argument("--eval-split", default="test")
    parser.add_argument("--pairs", type=_common.positive_int, default=32)
    parser.add_argument("--held-out", type=int, default=16)
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from pfamalign.inference import Predictor

    predictor = Predictor(args.checkpoint)
    fit = pairs_of(predictor, args.data, args.split, args.pairs, args.seed)
    held = pairs_of(predictor, args.data, args.eval_split, args.held_out, args.seed)
    families = {"slices": asap.AsapSettings(slices=args.slices, features=(), seed=args.seed),
                "per_residue": asap.AsapSettings(slices=0, seed=args.seed),
                "both": asap.AsapSettings(slices=args.slices, seed=args.seed)}
    for name, settings in families.items():
        op = asap.fit(predictor.model, fit, settings, held_out=held)
        print(jsonio.dumps_line({"script": "asap_features", "features": name, "calibration": args.split, "held_out": args.eval_split,
                                 **op.stats}), flush=True)


if __name__ == "__main__":
    main()
