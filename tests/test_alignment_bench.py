"""Smoke test of scripts/bench_align.py: every case runs and prints one JSON line."""

import importlib.util
import json
import pathlib
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_align.py"


def test_bench_align_prints_json_lines(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_align", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_align", bench)  # dataclasses look it up there
    spec.loader.exec_module(bench)
    assert bench.main(["--lengths", "40", "--repeats", "1"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["case"] for r in records] == list(bench.CASES)
    for r in records:
        assert r["ms_per_pair_median"] > 0 and r["n_aligned"] > 0 and r["lq"] == 40
    inputs = bench.make_inputs(30, seed=1)
    assert inputs.plan.shape == (30, len(inputs.seq_b))
    assert abs(float(inputs.plan.sum(1).mean()) - 1) < 1e-5
