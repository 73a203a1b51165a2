"""Alignment speed: milliseconds per sequence pair, one JSON line per (case, length).

    python scripts/bench_align.py                       # every case vs NW / SW at 500 x 500
    python scripts/bench_align.py --lengths 500 2000 --repeats 5 --cases mea_decode needleman_wunsch
    python scripts/bench_align.py --targets             # issue 10's targets, as ratios to NW

``--targets`` prints one line per target of the engine, each with Biopython Needleman-Wunsch
measured in the same run and the target beside it: batched throughput at 300 x 300 (pairs/s
through ``Predictor.align_records``; distinct pairs, and one query against as many subjects, a
search's shape, whose query is encoded once; every pass starts with an empty encoding cache),
the latency of one 500 x 500 pair with the model loaded (in this process, after the throughput
passes: numba's kernels, ``alignment.numba_jit``), the per-stage cost of one pair (featurize,
plan, pair-HMM on either engine, decode), and the wall time of
``pfamalign --help`` and of a cold (empty compile cache) and a warm ``pfamalign align A B``
of two 300-residue sequences (fresh processes).

Every case times the same related sequence pair (``seq_b`` is a mutated copy of ``seq_a`` with
indels) in the same process. A case is a *setup* function ``setup(inputs) -> run`` registered in
``CASES``: the setup does the untimed work, ``run()`` aligns the pair once and returns the
number of aligned pairs. The model cases load the aligner (``--checkpoint``, default: the
model shipped with the package) in the setup: ``model`` times transport + decoding on
precomputed features, ``model_with_features`` adds featurization (the simple reference path,
``Predictor.align``), ``batched`` is one pair through the batched engine
(``Predictor.align_records``, what ``pfamalign align`` runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator

import numpy as np

import _common
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


def setup_batched(inputs: Inputs, checkpoint=None) -> Callable[[], int]:
    predictor = _predictor(checkpoint)
    pair = {"q_id": "a", "k_id": "b", "q_seq": inputs.seq_a, "k_seq": inputs.seq_b}
    return lambda: len(next(predictor.align_records([pair]))[0].pairs)


MODEL_CASES = {"model": setup_model, "model_with_features": setup_model_with_features,
               "batched": setup_batched}
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
            "biopython": Bio.__version__, "cpus": os.cpu_count(),
            "load_avg_1min": os.getloadavg()[0]}  # a shared host: other jobs slow every figure


# ---- issue 10's targets -----------------------------------------------------------------

TARGETS = {"throughput_300": 100.0, "latency_500_ms": 50.0, "help_s": 0.3, "warm_align_s": 1.0}


def _median_s(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cpu_s() -> float:
    """This process's CPU seconds so far, every thread (user + system)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _nw_ms(inputs: Inputs, repeats: int) -> float:
    return 1e3 * _median_s(lambda: needleman_wunsch(inputs.seq_a, inputs.seq_b), repeats)


def target_records(*, n_pairs: int, repeats: int, seed: int, checkpoint=None) -> Iterator[dict]:
    """One record per target (see the module docstring), ratios against NW in this run."""
    from pfamalign.alignment import numba_jit
    from pfamalign.alignment.pairhmm_batched import batched_match_posteriors
    from pfamalign.inference import EncodingCache
    from pfamalign.resources import padded_length

    predictor = _predictor(checkpoint)
    # throughput: n_pairs distinct 300 x 300 pairs, after one untimed pass (compilation)
    many = [make_inputs(300, seed=seed + n) for n in range(n_pairs)]
    records = [{"q_id": f"a{n}", "k_id": f"b{n}", "q_seq": x.seq_a, "k_seq": x.seq_b}
               for n, x in enumerate(many)]
    one_query = [dict(rec, q_id="q", q_seq=many[0].seq_a) for rec in records]  # a search's shape

    def align_all(recs):  # sequences met in an earlier pass are not encoded again: forget them
        predictor.encodings = EncodingCache()
        list(predictor.align_records(recs))

    align_all(records)
    align_all(one_query)
    cpu_before = _cpu_s()
    per_s = n_pairs / _median_s(lambda: align_all(records), repeats)
    cpu_ms = 1e3 * (_cpu_s() - cpu_before) / (repeats * n_pairs)  # all threads: what two cores share
    query_per_s = n_pairs / _median_s(lambda: align_all(one_query), repeats)
    nw_per_s = n_pairs / _median_s(lambda: [needleman_wunsch(x.seq_a, x.seq_b) for x in many], repeats)
    yield ({"target": "throughput_300", "pairs_per_s": per_s, "nw_pairs_per_s": nw_per_s,
                "ratio_to_nw": per_s / nw_per_s, "goal_pairs_per_s": TARGETS["throughput_300"],
                "goal_ratio_to_nw": 0.5, "met": per_s >= TARGETS["throughput_300"],
                "n_pairs": n_pairs, "cpu_ms_per_pair": cpu_ms})
    yield ({"target": "throughput_300_one_query", "pairs_per_s": query_per_s, "nw_pairs_per_s": nw_per_s,
            "ratio_to_nw": query_per_s / nw_per_s, "n_pairs": n_pairs})
    # latency and stages of one pair
    for length in (300, 500):
        x = make_inputs(length, seed=seed)
        pair = {"q_id": "a", "k_id": "b", "q_seq": x.seq_a, "k_seq": x.seq_b}
        run = lambda: align_all([pair])  # noqa: E731
        run()
        ms = 1e3 * _median_s(run, repeats)
        nw = _nw_ms(x, repeats)
        feats = predictor.featurize([x.seq_a, x.seq_b])
        pad = padded_length(max(len(x.seq_a), len(x.seq_b)))
        pp = predictor._plan_batch([tuple(feats)], pad=pad, symmetric=True)[0]
        seqs = [(x.seq_a, x.seq_b)]
        post = predictor.hmm_posteriors(seqs)[0]
        plan_post = predictor.plan_posteriors(seqs, [pp], predictor.decoding)[0]  # None without plan_power
        stages = {
            "featurize_ms": 1e3 * _median_s(lambda: predictor.featurize([x.seq_a, x.seq_b]), repeats),
            "plan_both_directions_ms": 1e3 * _median_s(lambda: (
                setattr(predictor, "encodings", EncodingCache()),
                predictor._plan_batch([tuple(feats)], pad=pad, symmetric=True)), repeats),
            # the engine this process uses (numba: started by the throughput passes), and the
            # XLA engine of a process that aligns one pair (``numba_jit``)
            "pairhmm_ms": 1e3 * _median_s(lambda: predictor.hmm_posteriors(seqs), repeats),
            "pairhmm_xla_ms": 1e3 * _median_s(lambda: batched_match_posteriors(
                predictor.pairhmm, seqs, pad, pad), repeats),
            "plan_pairhmm_ms": (1e3 * _median_s(lambda: predictor.plan_posteriors(seqs, [pp], predictor.decoding),
                                                repeats) if plan_post is not None else 0.0),
            "decode_ms": 1e3 * _median_s(lambda: predictor.decoding.decode(
                pp, (x.seq_a, x.seq_b), hmm_posteriors=post, plan_posteriors=plan_post), repeats),
            "reference_ms": 1e3 * _median_s(lambda: predictor.align(x.seq_a, x.seq_b), repeats)}
        rec = {"target": f"latency_{length}", "lq": len(x.seq_a), "lk": len(x.seq_b), "ms": ms,
               "nw_ms": nw, "ratio_to_nw": ms / nw, "pairhmm_engine": "numba" if numba_jit.started() else "xla",
               **stages}
        if length == 500:
            rec.update(goal_ms=TARGETS["latency_500_ms"], met=ms <= TARGETS["latency_500_ms"])
        yield rec
    yield from cli_records(seed=seed, repeats=repeats)


def _wall_s(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def cli_records(*, seed: int, repeats: int) -> list[dict]:
    """``pfamalign --help`` and a cold / warm ``pfamalign align A B`` (300 x 300), fresh
    processes sharing one temporary compile cache."""
    x = make_inputs(300, seed=seed)
    cli = [sys.executable, "-m", "pfamalign.cli"]
    nw_ms = _nw_ms(x, repeats)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PFAMALIGN_CACHE_DIR": str(pathlib.Path(tmp) / "cache")}
        help_s = statistics.median(_wall_s(cli + ["--help"], env) for _ in range(repeats))
        align = cli + ["align", x.seq_a, x.seq_b]
        cold = _wall_s(align, env)
        warm = statistics.median(_wall_s(align, env) for _ in range(repeats))
    return [{"target": "help", "s": help_s, "goal_s": TARGETS["help_s"], "met": help_s <= TARGETS["help_s"]},
            {"target": "cold_align_300", "s": cold, "nw_ms": nw_ms, "ratio_to_nw": cold * 1e3 / nw_ms},
            {"target": "warm_align_300", "s": warm, "nw_ms": nw_ms, "ratio_to_nw": warm * 1e3 / nw_ms,
             "goal_s": TARGETS["warm_align_s"], "met": warm <= TARGETS["warm_align_s"]}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=_common.positive_int, nargs="+", default=[500])
    parser.add_argument("--repeats", type=_common.positive_int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--checkpoint", default=None,
                        help="model directory for the model cases (default: the shipped model)")
    parser.add_argument("--targets", action="store_true",
                        help="measure issue 10's targets instead of the cases")
    parser.add_argument("--pairs", type=_common.positive_int, default=64, help="pairs of the --targets throughput run")
    args = parser.parse_args(argv)
    env = _environment()
    if args.targets:
        for record in target_records(n_pairs=args.pairs, repeats=args.repeats, seed=args.seed,
                                     checkpoint=args.checkpoint):
            print(jsonio.dumps_line({"bench": "align_targets", **record, **env}), flush=True)
        return 0
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
