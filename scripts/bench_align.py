"""Alignment speed: milliseconds per sequence pair, one JSON line per (case, length).

    python scripts/bench_align.py                       # MEA decoder vs NW / SW at 500 x 500
    python scripts/bench_align.py --lengths 500 2000 --repeats 5 --cases mea_decode needleman_wunsch

Every case times the same related sequence pair (``seq_b`` is a mutated copy of ``seq_a`` with
indels) in the same process. A case is a *setup* function ``setup(inputs) -> run`` registered in
``CASES``: the setup does the untimed work, ``run()`` aligns the pair once and returns the
number of aligned pairs. The model cases load the aligner (``--checkpoint``, default: the
model shipped with the package) in the setup: ``model`` times transport + decoding on
precomputed features, ``model_with_features`` adds featurization, as ``pfamalign align``
does per pair after its one model load.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np

from pfamalign import jsonio
from pfamalign.alignment.baselines import needleman_wunsch, smith_waterman
from pfamalign.alignment.decode import mea_decode
from pfamalign.residues import blosum62_table

AA = "ACDEFGHIKLMNPQRSTVWY"


@dataclasses.dataclass(frozen=True)
class Inputs:
    """One benchmark pair: the two sequences and a stand-in transport plan ``[Lq, Lk]``."""

    seq_a: str
    seq_b: str
    plan: np.ndarray  # [Lq, Lk] float32, rows summing to 1


def make_inputs(length: int, *, seed: int = 0, identity: float = 0.4,
                indel_rate: float = 0.05, sinkhorn_steps: int = 10) -> Inputs:
    """A related pair of about ``length`` residues and a plan for it.

    The plan is a balanced-ish entropic plan of the BLOSUM62 scores with a diagonal prior
    (``sinkhorn_steps`` numpy Sinkhorn steps): decoder timings hardly depend on its content,
    but this keeps the traceback realistic.
    """
    rng = np.random.default_rng(seed)
    seq_a = "".join(rng.choice(list(AA), length))
    out = []
    for ch in seq_a:
        r = rng.random()
        if r < indel_rate / 2:
            continue  # deletion
        if r < indel_rate:
            out.append(rng.choice(list(AA)))  # insertion before the residue
        out.append(ch if rng.random() < identity else rng.choice(list(AA)))
    seq_b = "".join(out)[:length] or "A"
    a = np.frombuffer(seq_a.encode(), np.uint8)
    b = np.frombuffer(seq_b.encode(), np.uint8)
    scores = blosum62_table()[a[:, None], b[None, :]] / 2.0  # [Lq, Lk]
    i, j = np.indices(scores.shape)
    scores = scores - 0.05 * np.abs(i * (len(b) - 1) / max(len(a) - 1, 1) - j)
    log_k = scores - scores.max()
    u, v = np.zeros(len(a)), np.zeros(len(b))
    for _ in range(sinkhorn_steps):  # unit row targets, column targets Lq / Lk
        u = -np.logaddexp.reduce(log_k + v[None, :], axis=1)
        v = np.log(len(a) / len(b)) - np.logaddexp.reduce(log_k + u[:, None], axis=0)
    plan = np.exp(log_k + u[:, None] + v[None, :])
    plan /= plan.sum(axis=1, keepdims=True)
    return Inputs(seq_a, seq_b, plan.astype(np.float32))


def setup_mea(inputs: Inputs) -> Callable[[], int]:
    return lambda: len(mea_decode(inputs.plan).pairs)


def setup_needleman_wunsch(inputs: Inputs) -> Callable[[], int]:
    return lambda: len(needleman_wunsch(inputs.seq_a, inputs.seq_b).pairs)


def setup_smith_waterman(inputs: Inputs) -> Callable[[], int]:
    return lambda: len(smith_waterman(inputs.seq_a, inputs.seq_b).pairs)


_PREDICTORS: dict = {}


def _predictor(checkpoint):
    """One model load per process, shared by the model cases."""
    if checkpoint not in _PREDICTORS:
        from pfamalign.inference import Predictor

        _PREDICTORS[checkpoint] = Predictor(checkpoint)
    return _PREDICTORS[checkpoint]


def setup_model(inputs: Inputs, checkpoint=None) -> Callable[[], int]:
    predictor = _predictor(checkpoint)
    fa, fb = predictor.featurize([inputs.seq_a, inputs.seq_b])
    pair = (inputs.seq_a, inputs.seq_b)
    return lambda: len(predictor.decode(next(predictor.plans([(fa, fb)])), sequences=pair).pairs)


def setup_model_with_features(inputs: Inputs, checkpoint=None) -> Callable[[], int]:
    predictor = _predictor(checkpoint)
    return lambda: len(predictor.align(inputs.seq_a, inputs.seq_b)[0].pairs)


MODEL_CASES = {"model": setup_model, "model_with_features": setup_model_with_features}
CASES: dict[str, Callable[..., Callable[[], int]]] = {
    **MODEL_CASES,
    "mea_decode": setup_mea,
    "needleman_wunsch": setup_needleman_wunsch,
    "smith_waterman": setup_smith_waterman,
}


def time_run(run: Callable[[], int], *, repeats: int, warmup: int = 1) -> dict:
    """Median / min / mean wall time of ``run()`` in milliseconds over ``repeats`` calls."""
    n_pairs = 0
    for _ in range(warmup):
        n_pairs = run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        n_pairs = run()
        times.append((time.perf_counter() - start) * 1e3)
    return {"ms_per_pair_median": statistics.median(times), "ms_per_pair_min": min(times),
            "ms_per_pair_mean": statistics.fmean(times), "n_aligned": n_pairs}


def _environment() -> dict:
    import Bio

    return {"python": platform.python_version(), "numpy": np.__version__,
            "biopython": Bio.__version__, "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[500])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--checkpoint", default=None,
                        help="model directory for the model cases (default: the shipped model)")
    args = parser.parse_args(argv)
    env = _environment()
    for length in args.lengths:
        inputs = make_inputs(length, seed=args.seed)
        for name in args.cases:
            kw = {"checkpoint": args.checkpoint} if name in MODEL_CASES else {}
            run = CASES[name](inputs, **kw)
            record = {"bench": "align", "case": name, "lq": len(inputs.seq_a),
                      "lk": len(inputs.seq_b), "repeats": args.repeats,
                      **time_run(run, repeats=args.repeats), **env}
            print(jsonio.dumps_line(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
