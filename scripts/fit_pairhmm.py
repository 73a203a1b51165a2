"""Fit the pair-HMM's parameters by counting on a dataset's training families and write them.

    python scripts/fit_pairhmm.py --data /work/data/data_b62_1k           # the shipped asset
    python scripts/fit_pairhmm.py --data DATA --gap-types 1 --out hmm.json

Supervised maximum likelihood on the reference alignments of one split (``train`` by default:
the validation and test families stay unseen): residue-pair and background counts, gap opens
and switches, a geometric mixture of gap lengths per gap type, plus pseudocounts
(``pfamalign.alignment.pairhmm.fit``). Prints one JSON line with the fitted gap parameters.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from pfamalign import jsonio
from pfamalign.alignment.pairhmm import asset_path, fit
from pfamalign.pipelines import reader, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="dataset directory from `prepare shards`")
    parser.add_argument("--split", default="train", choices=("train", "val"))
    parser.add_argument("--gap-types", type=int, default=2, help="1: short gaps only; 2: short and long")
    parser.add_argument("--pseudocount", type=float, default=1.0)
    parser.add_argument("--out", default=None, help=f"output file (default: the package asset {asset_path()})")
    args = parser.parse_args(argv)

    hmm = fit(reader.iter_pairs(args.data, args.split), n_gap_types=args.gap_types, pseudocount=args.pseudocount)
    recipe = (f"python scripts/fit_pairhmm.py --data {pathlib.Path(args.data).name} --split {args.split} "
              f"--gap-types {args.gap_types} --pseudocount {args.pseudocount}")
    out = pathlib.Path(args.out) if args.out else asset_path()
    records.write_text(out, hmm.to_json(recipe))  # atomic: a reader never sees half a file
    print(jsonio.dumps_line({"out": str(out), "gap_open": hmm.gap_open.tolist(), "gap_extend": hmm.gap_extend.tolist(),
                             "gap_switch": hmm.gap_switch}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
