"""Fit the pair-HMM's parameters by counting on a dataset's training families and write them.

    python scripts/fit_pairhmm.py --data data_b62_1k           # the shipped asset
    python scripts/fit_pairhmm.py --data DATA --gap-types 1 --identity-edges "" --out hmm.json

Supervised maximum likelihood on the reference alignments of one split (``train`` by default:
the validation and test families stay unseen): residue-pair and background counts, gap opens
and switches, a geometric mixture of gap lengths per gap type, plus pseudocounts
(``pfamalign.alignment.pairhmm.fit``), one model per percent-identity bin of the reference
pairs (``--identity-edges``; ``fit_mixture``), or a single one with ``--identity-edges ""``.
Prints one JSON line with the fitted gap parameters.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import _common
from pfamalign import jsonio
from pfamalign.alignment.pairhmm import IDENTITY_EDGES, asset_path, fit, fit_mixture
from pfamalign.pipelines import reader, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="dataset directory from `prepare shards`")
    parser.add_argument("--split", default="train", choices=("train", "val"))
    parser.add_argument("--gap-types", type=int, choices=(1, 2), default=2, help="1: short gaps only; 2: short and long")
    parser.add_argument("--pseudocount", type=float, default=1.0)
    parser.add_argument("--identity-edges", default=",".join(f"{e:g}" for e in IDENTITY_EDGES),
                        help="percent-identity bin edges, one pair-HMM per bin (default %(default)s; "
                             "\"\" fits a single pair-HMM)")
    parser.add_argument("--out", default=None, help=f"output file (default: the package asset {asset_path()})")
    args = parser.parse_args(argv)

    try:
        edges = [float(e) for e in args.identity_edges.split(",") if e.strip()]
    except ValueError:
        parser.error(f"--identity-edges must be comma-separated numbers, got {args.identity_edges!r}")
    if args.pseudocount <= 0:
        parser.error(f"--pseudocount must be above 0, got {args.pseudocount}")
    if not pathlib.Path(args.data, "manifest.json").is_file():
        parser.error(f"--data {args.data}: no dataset there (manifest.json missing); build one with "
                     f"`pfamalign prepare shards`")
    if args.out and not pathlib.Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist")
    pairs = reader.iter_pairs(args.data, args.split)
    options = {"n_gap_types": args.gap_types, "pseudocount": args.pseudocount}
    hmm = fit_mixture(pairs, edges=edges, **options) if edges else fit(pairs, **options)
    recipe = (f"python scripts/fit_pairhmm.py --data {pathlib.Path(args.data).name} --split {args.split} "
              f"--gap-types {args.gap_types} --pseudocount {args.pseudocount} "
              f"--identity-edges '{args.identity_edges}'")
    out = pathlib.Path(args.out) if args.out else asset_path()
    records.write_text(out, hmm.to_json(recipe))  # atomic: a reader never sees half a file
    parts = hmm.components
    # the edges fitted (sorted; a bin no training pair falls in is dropped), not those asked for
    print(jsonio.dumps_line({"out": str(out), "edges": [float(e) for e in getattr(hmm, "edges", [])],
                             "prior": hmm.prior.tolist(),
                             "gap_open": [c.gap_open.tolist() for c in parts],
                             "gap_extend": [c.gap_extend.tolist() for c in parts],
                             "gap_switch": [c.gap_switch for c in parts]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
