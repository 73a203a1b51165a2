"""Smoke test of scripts/bench_align.py: every case runs and prints one JSON line."""

import importlib.util
import json
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_align.py"


def test_bench_align_prints_json_lines(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_align", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_align", bench)  # dataclasses look it up there
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # its helpers (_common), as `python scripts/...` has them
    spec.loader.exec_module(bench)
    assert bench.main(["--lengths", "40", "--repeats", "1"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["case"] for r in records] == list(bench.CASES)
    for r in records:
        assert r["ms_per_pair_median"] > 0 and r["n_aligned"] > 0 and r["lq"] == 40
    inputs = bench.make_inputs(30, seed=1)
    assert inputs.plan.shape == (30, len(inputs.seq_b))
    assert abs(float(inputs.plan.sum(1).mean()) - 1) < 1e-5


@pytest.mark.slow
def test_bench_align_targets_print_every_target_with_its_goal(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_align", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_align", bench)
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec.loader.exec_module(bench)
    assert bench.main(["--targets", "--pairs", "2", "--repeats", "1"]) == 0
    records = {r["target"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(records) == {"throughput_300", "throughput_300_one_query", "latency_300", "latency_500",
                            "help", "cold_align_300", "warm_align_300"}
    assert records["throughput_300"]["pairs_per_s"] > 0 and records["throughput_300"]["nw_pairs_per_s"] > 0
    assert records["throughput_300"]["cpu_ms_per_pair"] > 0 and records["throughput_300_one_query"]["pairs_per_s"] > 0
    assert records["latency_500"]["goal_ms"] == 50.0 and records["latency_500"]["ratio_to_nw"] > 0
    assert records["warm_align_300"]["goal_s"] == 1.0 and records["help"]["goal_s"] == 0.3


def test_bench_commits_times_each_commit_from_its_own_worktree():
    """scripts/bench_commits.py: a line per commit and round, each measured on the commit's own
    package (the child refuses any other), and no worktree left behind."""
    import subprocess

    script = SCRIPT.parent / "bench_commits.py"
    repo = SCRIPT.parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    before = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    run = subprocess.run([sys.executable, str(script), "HEAD", head.stdout.strip(), "--rounds", "1", "--pairs", "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert [(r["commit"], r["round"]) for r in lines] == [("HEAD", 0), (head.stdout.strip(), 0)]
    for r in lines:
        assert r["sha"] == head.stdout.strip()[:12] and r["n_pairs"] == 2
        assert r["pairs_per_s"] > 0 and r["ms_300"] > 0 and r["ms_300_ratio_to_nw"] > 0
    after = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before
    bad = subprocess.run([sys.executable, str(script), "HEAD", "no-such-commit"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "'no-such-commit' names no commit" in bad.stderr
    after = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before  # HEAD's worktree, made before the bad name was met, is removed too
