"""Peak memory of ``pfamalign align`` against the estimate that ``--max-memory`` enforces
(``pfamalign.resources``): one JSON line per length.

    python scripts/measure_align_memory.py                     # 1000, 3000, 5000 residues
    python scripts/measure_align_memory.py --lengths 2000 4000

Each length runs in a fresh child process (peak resident memory is per process): the child loads
the aligner (``--checkpoint``, default the shipped model), aligns two random sequences of that
length once as ``pfamalign align`` does (``PairAligner``: the batch path), and reports its peak
RSS (Linux: ``VmHWM``, which unlike ``ru_maxrss`` does not carry a parent's peak across exec)
before and after the alignment. ``ratio`` is the estimate over the measured peak (above 1: the
estimate is conservative).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import _common

CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[3])  # scripts/: its helpers
from _common import own_peak_rss_bytes as peak_bytes  # VmHWM: not the parent's peak
from pfamalign import PairAligner

length, checkpoint = int(sys.argv[1]), sys.argv[2] or None
aligner = PairAligner(checkpoint, max_length=10 ** 6, max_memory=0)
rng = np.random.default_rng(0)
a, b = ("".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), length)) for _ in range(2))
before = peak_bytes()
aligner.align(a, b)  # the command's path: both directions' plans, the pair-HMM, the decoder
after = peak_bytes()
print(json.dumps({"model_loaded_bytes": before, "peak_bytes": after,
                  "plan_models": aligner.predictor.plan_models}))
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=_common.positive_int, nargs="+", default=[1000, 3000, 5000])
    parser.add_argument("--checkpoint", default="", help="model directory (default: shipped)")
    args = parser.parse_args(argv)
    from pfamalign import resources

    for length in args.lengths:
        out = subprocess.run([sys.executable, "-c", CHILD, str(length), args.checkpoint,
                              os.path.dirname(os.path.abspath(__file__))],
                             capture_output=True, text=True, check=True, timeout=3600)
        child = json.loads(out.stdout.strip().splitlines()[-1])
        estimate = resources.estimate_align_bytes(length, length, child["plan_models"])
        print(json.dumps({"script": "measure_align_memory", "length": length,
                          "peak_GB": round(child["peak_bytes"] / 1e9, 3),
                          "model_loaded_GB": round(child["model_loaded_bytes"] / 1e9, 3),
                          "estimate_GB": round(estimate / 1e9, 3),
                          "ratio": round(estimate / child["peak_bytes"], 3)}), flush=True)


if __name__ == "__main__":
    main()
