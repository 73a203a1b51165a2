"""Align speed of two or more commits, timed alternately on this host: the first check of a
suspected speed regression (figures of different days come from different hosts).

    python scripts/bench_commits.py af070c4 HEAD             # three rounds, 32 pairs
    python scripts/bench_commits.py v1 v2 v3 --rounds 5 --pairs 64

Each commit gets a git worktree in a temporary folder, its package importable from there
(``kernels/`` and ``pipelines/`` linked in where pyproject's package-dir puts them) and a
compile cache of its own, so no commit evicts another's exported programs. A round runs every
commit once, in turn, each in a fresh process, so the host's drift falls on all of them alike.
Every run prints one JSON line: the batched throughput (``Predictor.align_records``, an empty
encoding cache each pass, median of 3 after an untimed pass) on ``--pairs`` distinct
300 x 300 pairs and the latency of one (median of 15), each beside Biopython's NW timed in
the same process. The inputs are ``bench_align.make_inputs``'s, made here and handed to every
commit alike; the procedure is this script's, not the commit's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
LINKED = ("kernels", "pipelines")  # pyproject's package-dir: pfamalign.<name> lives in <name>/


def _child(worktree: str, inputs: str) -> None:
    """One commit's measurement (its package first on sys.path), printed as one JSON line."""
    import statistics
    import timeit

    import pfamalign
    from pfamalign.alignment.baselines import needleman_wunsch
    from pfamalign.inference import EncodingCache, Predictor

    if not pfamalign.__file__.startswith(worktree):
        raise SystemExit(f"imported {pfamalign.__file__}, not the worktree's package")
    pairs = json.loads(pathlib.Path(inputs).read_text())
    records = [{"q_id": f"a{n}", "k_id": f"b{n}", "q_seq": a, "k_seq": b} for n, (a, b) in enumerate(pairs)]
    predictor = Predictor(None)

    median_s = lambda run, repeats: statistics.median(timeit.repeat(run, number=1, repeat=repeats))  # noqa: E731

    def align_all(recs):
        predictor.encodings = EncodingCache()
        list(predictor.align_records(recs))

    align_all(records)  # compiles
    per_s = len(records) / median_s(lambda: align_all(records), 3)
    nw_per_s = len(pairs) / median_s(lambda: [needleman_wunsch(a, b) for a, b in pairs], 3)
    one = records[:1]
    align_all(one)
    ms = 1e3 * median_s(lambda: align_all(one), 15)
    nw_ms = 1e3 * median_s(lambda: needleman_wunsch(*pairs[0]), 15)
    print(json.dumps({"bench": "bench_commits", "pairs_per_s": round(per_s, 1),
                      "throughput_ratio_to_nw": round(per_s / nw_per_s, 3), "ms_300": round(ms, 2),
                      "ms_300_ratio_to_nw": round(ms / nw_ms, 2), "n_pairs": len(pairs),
                      "load_avg_1min": os.getloadavg()[0]}), flush=True)


def _worktree(commit: str, folder: pathlib.Path) -> tuple[str, pathlib.Path]:
    """(full hash, worktree path) of ``commit``, its package made importable by path."""
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"error: {commit!r} names no commit of {REPO}")
    sha = found.stdout.strip()
    path = folder / sha[:12]
    if not path.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(path), sha], check=True)
        for name in LINKED:
            if (path / name).is_dir() and not (path / "pfamalign" / name).exists():
                (path / "pfamalign" / name).symlink_to(path / name)
    return sha, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commits", nargs="*", help="two or more commits (anything git rev-parse takes)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each commit, alternating (default 3)")
    parser.add_argument("--pairs", type=int, default=32, help="distinct 300 x 300 pairs of the throughput (default 32)")
    parser.add_argument("--child", nargs=2, metavar=("WORKTREE", "INPUTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    if len(args.commits) < 2 or args.rounds < 1 or args.pairs < 1:
        parser.error("give two or more commits, and --rounds and --pairs of at least 1")
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_align import make_inputs

    with tempfile.TemporaryDirectory(prefix="bench_commits_") as tmp:
        folder = pathlib.Path(tmp)
        inputs = folder / "pairs.json"
        made = [make_inputs(300, seed=n) for n in range(args.pairs)]
        inputs.write_text(json.dumps([(x.seq_a, x.seq_b) for x in made]))
        trees = []
        try:
            for commit in args.commits:  # inside the try: a bad commit leaves no worktree behind
                trees.append((commit, *_worktree(commit, folder)))
            for round_ in range(args.rounds):
                for commit, sha, path in trees:
                    env = {**os.environ, "PYTHONPATH": str(path), "PFAMALIGN_CACHE_DIR": str(folder / f"cache-{sha[:12]}")}
                    run = subprocess.run([sys.executable, __file__, "--child", str(path), str(inputs)], env=env,
                                         capture_output=True, text=True, cwd=tmp)
                    if run.returncode:
                        raise SystemExit(f"{commit} failed:\n{run.stderr[-2000:]}")
                    line = json.loads(run.stdout.strip().splitlines()[-1])
                    print(json.dumps({**line, "commit": commit, "sha": sha[:12], "round": round_}), flush=True)
        finally:
            for path in {path for _, _, path in trees}:  # a commit named twice has one worktree
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
