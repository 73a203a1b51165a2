"""Every validation / benchmark script runs at tiny sizes and prints parseable JSON lines
(two by default, all with --full).

The scripts run in this process (``main(argv)``) except bench_transport's per-configuration
children, which it spawns itself."""

from __future__ import annotations

import importlib
import json
import pathlib
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"
TINY = ["--dim", "8", "--base-steps", "2"]

CASES = {
    "validate_tail_refinement": ["--lengths", "32", "--half-band", "8", "--tail-depths", "0,1",
                                 "--converged-steps", "20", "--repeats", "1"] + TINY,
    "validate_orbit_factorization": ["--length", "24", "--half-band", "6", "--tail-steps", "1"] + TINY,
    "validate_tail_bias_certificate": ["--length", "24", "--half-band", "6", "--tail-depths", "1"] + TINY,
    "benchmark_four_plan_adjoint": ["--lengths", "32", "--half-bands", "8", "--tail-steps", "1",
                                    "--repeats", "1"] + TINY,
    "estimate_r2_backward_memory": ["--cases", "64x8", "--block", "8", "--tail-steps", "1"] + TINY,
    "benchmark_production_backward_modes": ["--cases", "1x32x8", "--repeats", "1"] + TINY,
    "bench_transport": ["--lengths", "32", "--half-band", "8", "--repeats", "1", "--tail-steps", "1"] + TINY,
}


@pytest.fixture(scope="module", autouse=True)
def scripts_on_path():
    sys.path.insert(0, str(SCRIPTS))
    yield
    sys.path.remove(str(SCRIPTS))


# Each script compiles a few XLA programs (5-25 s apiece on a loaded 2-core box): by default
# run the two that cover the shared machinery (subprocess RSS, compiled memory, tables and
# JSON lines); the rest with --full.
FAST = {"bench_transport", "estimate_r2_backward_memory"}


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CASES)])
def test_script_runs_and_prints_json_lines(name, capsys):
    module = importlib.import_module(name)
    module.main(CASES[name] + ["--json"])
    out = capsys.readouterr()
    rows = [json.loads(line) for line in out.out.splitlines() if line.strip()]
    assert rows, out.err
    assert all(r["script"] == name for r in rows)
    assert "---" in out.err  # the table went to stderr, stdout holds only JSON lines
    if name == "bench_transport":
        assert {r["impl"] for r in rows} == {"reference", "ott", "xla"}
        assert all(r["status"] == "ok" and r["peak_rss_MiB"] > 0 for r in rows), rows



def test_r2_memory_figures_of_the_paper():
    """L=16384, W=1024, b=128, d=64: 32.52M active entries, 496.23 vs 124.06 MiB."""
    est = importlib.import_module("estimate_r2_backward_memory")
    row = est.analytic(16384, 1024, 128, 64, 64, 2)
    assert f"{row['active_M']:.2f}" == "32.52"
    assert f"{row['four_plans_MiB']:.2f}" == "496.23" and f"{row['one_ref_MiB']:.2f}" == "124.06"


def test_help_mentions_defaults():
    for name in CASES:
        module = importlib.import_module(name)
        with pytest.raises(SystemExit) as exc:
            module.main(["--help"])
        assert exc.value.code == 0
