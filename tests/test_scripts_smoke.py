"""Every validation / benchmark script runs at tiny sizes and prints parseable JSON lines
(two by default, all with --full).

The scripts run in this process (``main(argv)``) except bench_transport's per-configuration
children, which it spawns itself."""

from __future__ import annotations

import importlib
import collections
import json
import re
import shutil
import pathlib
import sys

import numpy as np
import pytest
from test_commands import dataset  # noqa: F401  (the tiny prepared dataset, a fixture)

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
    "validate_ceta": ["--n", "6", "--trials", "5", "--causal-steps", "10,100,1000"],
    "validate_softmax_ot": ["--trials", "200", "--skip-op"],
    "validate_shifted_walks": ["--length", "48", "--half-band", "8", "--dim", "8", "--steps", "4"],
}


@pytest.fixture(scope="module", autouse=True)
def scripts_on_path():
    sys.path.insert(0, str(SCRIPTS))
    yield
    sys.path.remove(str(SCRIPTS))


# Each script compiles a few XLA programs (5-25 s apiece on a loaded 2-core box): by default
# run the two that cover the shared machinery (subprocess RSS, compiled memory, tables and
# JSON lines); the rest with --full.
FAST = {"bench_transport", "estimate_r2_backward_memory", "validate_ceta", "validate_softmax_ot",
        "validate_shifted_walks"}  # the last two without a JAX compile


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CASES)])
def test_script_runs_and_prints_json_lines(name, capsys):
    module = importlib.import_module(name)
    module.main(CASES[name] + ["--json"])
    out = capsys.readouterr()
    rows = [json.loads(line) for line in out.out.splitlines() if line.strip()]
    assert rows, out.err
    assert all(r["script"] == name for r in rows)
    assert "---" in out.err  # the table went to stderr, stdout holds only JSON lines
    if name.startswith("validate_ceta") or name.startswith("validate_softmax"):  # the methods' stated claims
        assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    if name == "bench_transport":
        assert {r["impl"] for r in rows} == {"reference", "ott", "xla"}
        assert all(r["status"] == "ok" and r["peak_rss_MiB"] > 0 for r in rows), rows
        # the banded op's gradients checked against the dense reference's, which is not checked
        checks = {r["impl"]: (r["grad_err"], r["grad_err_vs"]) for r in rows}
        assert checks["reference"] == checks["ott"] == (None, None)
        assert checks["xla"][1] == "reference" and 0 <= checks["xla"][0] <= 1e-5, checks



def test_bench_transport_times_a_dustbin_mode_without_ott(capsys):
    """``--dustbin spoke`` (the shipped models' mode, where impl="auto" on GPU has its own
    rule): every implementation with spokes, its gradients checked, ott-jax skipped by name, and
    no target stated (issue 11's are for the problem without a dustbin)."""
    bench = importlib.import_module("bench_transport")
    bench.main(["--lengths", "32", "--half-band", "8", "--repeats", "1", "--tail-steps", "1", "--impls",
                "reference,xla,ott", "--dustbin", "spoke", "--json"])
    out = capsys.readouterr()
    rows = {r["impl"]: r for r in map(json.loads, out.out.splitlines())}
    assert rows["ott"]["status"] == "skipped" and "no dustbin" in rows["ott"]["reason"]
    assert rows["xla"]["status"] == "ok" and rows["xla"]["grad_err_vs"] == "reference" and rows["xla"]["grad_err"] <= 1e-5
    assert rows["xla"]["config"]["dustbin"] == "spoke" and "dustbin spoke" in out.err and "target" not in out.err


@pytest.mark.parametrize("argv, said", [
    (["--lengths", "0"], "--lengths: need one or more integers of at least 1"),
    (["--lengths", "-64"], "--lengths: need one or more integers of at least 1"),
    (["--dim", "0"], "--dim: must be at least 1"),
    (["--repeats", "0"], "--repeats: must be at least 1"),
    (["--impls", ","], "--impls names no implementation"),
    (["--base-steps", "0", "--tail-steps", "0"], "not both 0"),
])
def test_bench_transport_refuses_sizes_that_cannot_run(argv, said, capsys):
    """Nonsense sizes are an argument error (exit 2) before any child runs, not a row of
    failures and exit 0."""
    bench = importlib.import_module("bench_transport")
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2 and said in capsys.readouterr().err


def test_a_failed_childs_reason_is_its_exception_not_jaxs_note():
    """jax prints a note after the traceback; the row's reason is the exception's line."""
    common = importlib.import_module("_common")
    stderr = ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: empty sequence axis: "
              "Lq=0, Lk=0\n--------------------\nFor simplicity, JAX has removed its internal frames from the "
              "traceback of the following exception. Set JAX_TRACEBACK_FILTERING=off to include these.\n")
    assert common.failure_line(stderr) == "ValueError: empty sequence axis: Lq=0, Lk=0"
    assert common.failure_line("Killed\n") == "Killed" and common.failure_line("") == "?"


def test_a_childs_own_peak_rss_leaves_out_its_parents():
    """``ru_maxrss`` of a child counts the parent's peak (Linux carries it across fork and
    exec); ``own_peak_rss_bytes``, which bench_transport's children report, does not."""
    import subprocess

    common = importlib.import_module("_common")
    ballast = np.ones(400 * 2**20 // 8)  # 400 MiB resident in this (parent) process
    argv = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import _common; "
            "print(_common.own_peak_rss_bytes())", str(SCRIPTS)]
    run = common.run_child(argv, timeout=60)
    assert run["returncode"] == 0, run["stderr"]
    own = int(run["stdout"])
    assert own < 200 * 2**20 < 400 * 2**20 <= run["peak_rss_bytes"], (own, run["peak_rss_bytes"])
    del ballast


def test_bench_transport_states_the_targets_of_the_device_it_ran_on():
    """Issue 11's GPU targets are judged on a GPU only, the CPU's on a CPU: a CPU run must not
    print 'PASS' against a GPU target. A GPU target passes only with the gradients checked
    and within 1e-5 of the reference's."""
    bench = importlib.import_module("bench_transport")

    class Notes:
        rows = [{"L": 4096, "W": 256}]

        def __init__(self):
            self.notes = []

        def note(self, text):
            self.notes.append(text)

    results = {(4096, impl): {"status": "ok", "fwd_bwd_ms": ms, "grad_err": err, "grad_err_vs": "reference"}
               for impl, ms, err in (("reference", 40.0, None), ("xla", 5.0, 3e-7), ("xla-branch-free", 8.0, 2e-5),
                                     ("xla-unrolled", 4.0, None))}
    said = {}
    for platform in ("cpu", "gpu"):
        rep = Notes()
        bench._targets(rep, results, platform)
        said[platform] = rep.notes
    assert [n for n in said["cpu"] if "target" in n] == [
        "target L=4096 W=256: xla 8.0x faster than reference (>= 10x on CPU): MISS"]
    assert [n for n in said["gpu"] if "target" in n] == [
        "target L=4096 W=256: xla 8.0x faster than reference (>= 4x on GPU), gradients 3.0e-07 from reference: PASS",
        "target L=4096 W=256: xla-branch-free 5.0x faster than reference (>= 4x on GPU), "
        "gradients 2.0e-05 from reference: MISS",
        "target L=4096 W=256: xla-unrolled 10.0x faster than reference (>= 4x on GPU), gradients not checked: MISS"]
    assert all(any(n.startswith(f"dense crossover ({impl} ") for n in said[p]) for p in said
               for impl in ("xla", "xla-branch-free"))


def test_bench_train_prints_one_json_line_per_config(tmp_path, capsys):
    """The training benchmark (issue 11's GPU throughput figure, ``gpu_session.sh train``) runs
    to its JSON line: the test fixtures' pair lengths, the implementation the op resolves per
    padded length (the XLA path on this CPU), a rate from the timed steps."""
    bench = importlib.import_module("bench_train")
    bench.main(["--configs", "align_ce", "--batch", "8", "--reps", "1", "--no-pad1024",
                "--pairs-per-family", "1", "--pfam", str(tmp_path / "absent")])
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert row["config"] == "align_ce" and row["lengths"].endswith("tests/data/pfam_seed, 1 per family")
    assert row["impl_by_padded_len"] and set(row["impl_by_padded_len"].values()) == {"xla"}
    assert set(row["step_s_by_padded_len"]) == set(row["impl_by_padded_len"])
    assert row["examples_per_s"] > 0 and row["host"]["backend"] == "cpu"


def test_r2_memory_figures_of_the_reference_problem():
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


# ---- scripts/bench_search.py --------------------------------------------------------------------


def test_bench_search_ranking_metrics():
    bench = importlib.import_module("bench_search")
    # relevant at ranks 1 and 3, the first unrelated at rank 2
    roc1, ap = bench.roc1_ap(np.array([4.0, 3.0, 2.0, 1.0]), np.array([True, False, True, False]))
    assert roc1 == 0.5 and ap == pytest.approx((1 / 1 + 2 / 3) / 2)
    roc1, ap = bench.roc1_ap(np.zeros(3), np.array([False, True, False]))  # ties count against
    assert roc1 == 0 and ap == pytest.approx(1 / 3)
    boot = bench.family_bootstrap({"x": np.array([1.0, 1.0, 0.0])}, np.array(["a", "a", "b"]), 200, 0)
    assert boot["x"]["mean"] == pytest.approx(2 / 3) and boot["x"]["ci"] == [0.0, 1.0]


@pytest.mark.slow
def test_bench_search_runs_on_a_families_table(tmp_path, capsys):
    table = tmp_path / "families.tsv"
    table.write_text("accession_base\tsplit\tsource\n" + "".join(
        f"{name}\ttest\t{PFAM_SEED / (name + '.sto')}\n" for name in ("PF00041", "PF00076", "PF02790")))
    bench = importlib.import_module("bench_search")
    bench.main(["--data", str(tmp_path), "--per-family", "3", "--decoys", "10", "--bootstrap", "50", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # the external tools found on PATH (blastp, phmmer) join SW; the others are skipped
    tools = [label for label, binary, _ in bench.TOOLS.values() if shutil.which(binary)]
    methods = ["pfamalign", "SW-BLOSUM62", *tools]
    assert [r["method"] for r in rows] == [*methods, *(f"pfamalign - {m}" for m in methods[1:]),
                                           *(f"calibration: {m}" for m in ["pfamalign", *tools])]
    assert all(0 <= r["roc1"] <= 1 and 0 < r["map"] <= 1 for r in rows[:len(methods)])
    calibration = rows[2 * len(methods) - 1]
    assert rows[0]["n_queries"] == 9 and calibration["expected_at_most"]["E<=1"] == 9
    assert 0 <= calibration["related_found_E<=1"] <= 1


def test_bench_null_search_counts_false_hits_with_and_without_the_tail(tmp_path, capsys):
    from pfamalign import search

    table = tmp_path / "families.tsv"
    table.write_text("accession_base\tsplit\tsource\n" + "".join(
        f"{name}\ttest\t{PFAM_SEED / (name + '.sto')}\n" for name in ("PF00076", "PF02790")))
    importlib.import_module("bench_null_search").main(
        ["--data", str(tmp_path), "--queries", "2", "--database", "30", "--decoys", "10", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["tail"] for r in rows] == [f"from P = {search.TAIL_FROM:g}", "none (plain Gumbel)"]
    for r in rows:  # counts fall with the E-value; each threshold allows E x the queries
        counts = [r[f"E<={t:g}"] for t in (10, 1, 0.1, 0.01, 0.001)]
        assert counts == sorted(counts, reverse=True) and r["allowed"]["E<=1"] == 2
    assert search.TAIL_FROM is not None  # restored


# ---- scripts/bench_local.py ---------------------------------------------------------------------


def test_bench_local_relax_grid_tags_every_variant_and_restores_the_model(dataset, capsys, monkeypatch):
    from pfamalign import inference

    bench = importlib.import_module("bench_local")
    seen = []
    real = inference.Predictor

    class Watched(real):  # the predictor the script builds, kept to look at its model afterwards
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen.append(self)

    monkeypatch.setattr(bench, "Predictor", Watched)
    assert bench.main(["--data", str(dataset), "--pairs", "3", "--flank", "5", "10", "--relax", "0", "2",
                       "--n-boot", "20"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    methods = [(r["method"], r.get("transport")) for r in rows if "method" in r]
    variants = ["trained (spoke, balanced)", "rows (softmax)", "rows, relax 2"]
    assert methods[:2] == [("sw", None), ("nw", None)]
    assert methods[2:] == [(m, v) for v in variants for m in ("model_global", "plan_global", "model_local",
                                                                "plan_local")]
    assert [r["transport"] for r in rows if "plan" in r] == variants
    for r in rows:
        if "method" in r:
            assert 0 <= r["micro"]["f1"]["value"] <= 1 and r["flank_residues"] > 0
    differences = [r["difference"] for r in rows if "difference" in r]
    assert "plan_local[rows, relax 2] - plan_local" in differences
    assert seen[0].model.cfg == real().model.cfg  # the script leaves the model as it found it
    with pytest.raises(SystemExit):
        bench.main(["--data", str(dataset), "--relax", "-1"])


# ---- scripts/crossval.py ------------------------------------------------------------------------

PFAM_SEED = pathlib.Path(__file__).resolve().parent / "data" / "pfam_seed"
CROSSVAL = ["--pfam", str(PFAM_SEED), "--folds", "2", "--pairs-per-family", "4",
            "--max-pairs-per-fold", "10", "--bootstrap", "20"]


def _crossval(argv, capsys):
    module = importlib.import_module("crossval")
    assert module.main(argv) == 0
    out = capsys.readouterr()
    return [json.loads(line) for line in out.out.splitlines() if line.startswith("{")], out


def test_crossval_baselines_every_family_tested_once_and_resumes(tmp_path, capsys):
    from pfamalign.pipelines.splits import fold_of
    from pfamalign.pipelines.stockholm import accession_base

    argv = CROSSVAL + ["--workdir", str(tmp_path / "cv"), "--baselines-only",
                       "--markdown", str(tmp_path / "table.md")]
    rows, _ = _crossval(argv, capsys)
    folds, pooled = rows[:-1], rows[-1]
    assert [r["fold"] for r in folds] == [0, 1] and pooled["fold"] == "pooled"
    families = [r["test_families"] for r in folds]
    assert not set(families[0]) & set(families[1])  # each family is tested in one fold only
    for k, fams in enumerate(families):
        assert fams and all(fold_of(f, seed=0, n_folds=2) == k for f in fams)
        evaluated = folds[k]["summary"]
        assert evaluated["n_pairs"] <= 10 and evaluated["n_families"] == len(fams)
    assert pooled["summary"]["n_pairs"] == sum(r["summary"]["n_pairs"] for r in folds)
    # pooled = the folds' pairs together: NW's pooled F1 from the per-fold pooled counts
    results = [json.loads((tmp_path / "cv" / f"fold{k}" / "result.json").read_text()) for k in (0, 1)]
    counts = np.concatenate([np.asarray(r["evaluation"]["counts"]["nw"]) for r in results])
    tp, n_pred, n_ref = counts.sum(0)
    assert pooled["f1"]["nw"]["all"] == pytest.approx(2 * tp / (n_pred + n_ref))
    assert {accession_base(f) for r in results for f in r["evaluation"]["families"]} == \
        set(families[0]) | set(families[1])
    methods = set(pooled["f1"])
    assert {"nw", "sw", "diagonal"} <= methods and "model" not in methods
    table = (tmp_path / "table.md").read_text()
    assert "| NW-BLOSUM62 |" in table and "| 1 |" in table
    before = [(tmp_path / "cv" / f"fold{k}" / "result.json").stat().st_mtime_ns for k in (0, 1)]
    rows_again, out = _crossval(argv, capsys)
    assert out.err.count("done earlier") == 2 and rows_again[-1]["f1"] == pooled["f1"]
    assert before == [(tmp_path / "cv" / f"fold{k}" / "result.json").stat().st_mtime_ns for k in (0, 1)]
    # another --folds partitions the families otherwise: its folds are not these (it reused them)
    module = importlib.import_module("crossval")
    other = argv.copy()
    other[other.index("--folds") + 1] = "3"
    assert module.main(other) == 1
    assert "is fold 0 of 2 folds, not of --folds 3: give another --workdir" in capsys.readouterr().err
    assert before == [(tmp_path / "cv" / f"fold{k}" / "result.json").stat().st_mtime_ns for k in (0, 1)]


def test_crossval_pools_the_reliability_of_folds_that_recorded_it():
    """Pooled reliability = the folds' bin sums added; a result.json from before it was
    recorded (no "reliability") leaves it out of the pooled summary rather than mislabel a
    part as the whole."""
    from pfamalign.alignment.metrics import reliability, reliability_sums

    crossval = importlib.import_module("crossval")
    rng = np.random.default_rng(0)
    conf = [rng.uniform(size=30), rng.uniform(size=20)]
    correct = [rng.uniform(size=30) < 0.5, rng.uniform(size=20) < 0.8]
    folds = []
    for k in range(2):
        n = 2 + k
        folds.append({"methods": ["model", "nw"], "counts": {m: [[3, 4, 5]] * n for m in ("model", "nw")},
                      "pid": [40.0] * n, "families": [f"PF0000{k}"] * n,
                      "seconds": {"model": 1.0, "nw": 0.5}, "skipped": {},
                      "reliability": {"model": reliability_sums(conf[k], correct[k]).tolist()}})
    got = crossval.pool(folds).summary(n_boot=0)["methods"]
    want = reliability(reliability_sums(np.concatenate(conf), np.concatenate(correct)))
    rel = got["model"]["reliability"]
    assert rel["n_pairs"] == 50 and rel["ece"] == pytest.approx(want["ece"])
    assert rel["brier"] == pytest.approx(want["brier"])
    for key in ("count", "mean_confidence", "precision"):
        np.testing.assert_allclose([b[key] for b in rel["bins"]], [b[key] for b in want["bins"]])
    assert "reliability" not in got["nw"]
    old = {key: value for key, value in folds[0].items() if key != "reliability"}
    assert "reliability" not in crossval.pool([old, folds[1]]).summary(n_boot=0)["methods"]["model"]


@pytest.mark.slow
def test_crossval_trains_tunes_and_compares_the_model(tmp_path, capsys):
    tiny = ["encoder_layers=1", "encoder_width=16", "head_dim=8", "value_dim=8",
            "transport.base_steps=3"]
    argv = CROSSVAL + ["--workdir", str(tmp_path / "cv"), "--only", "1", "--steps", "2",
                       "--batch-size", "8", "--tune-pairs", "8"]
    rows, _ = _crossval(argv + [x for s in tiny for x in ("--set", s)], capsys)
    fold, pooled = rows
    assert fold["decoder_chosen_on"] in ("val families of the fold", "train families of the fold")
    assert (tmp_path / "cv" / "fold1" / "run" / "model" / "decoding.json").is_file()
    assert {"model", "model_mea", "model_plan", "nw"} <= set(pooled["f1"])
    # the row is named by what it is, as the README's tables name it
    assert pooled["summary"]["methods"]["model_plan"]["label"] == "pfamalign, plan only (plan pair-HMM)"
    diff = pooled["summary"]["model_minus_by_family"]["nw"]["all"]
    assert diff["n_groups"] == len(fold["test_families"]) and diff["low"] <= diff["value"] <= diff["high"]


@pytest.mark.slow
def test_crossval_ensemble_of_two_runs_is_tuned_and_scored_on_their_pairs(tmp_path, capsys):
    tiny = ["encoder_layers=1", "encoder_width=16", "head_dim=8", "value_dim=8",
            "transport.base_steps=3"]
    base = CROSSVAL + ["--only", "1", "--tune-pairs", "8"]
    train = base + ["--steps", "2", "--batch-size", "8"] + [x for s in tiny for x in ("--set", s)]
    _crossval(train + ["--workdir", str(tmp_path / "a")], capsys)
    _crossval(train + ["--workdir", str(tmp_path / "b"), "--data-from", str(tmp_path / "a"),
                       "--lr", "1e-3"], capsys)
    rows, _ = _crossval(base + ["--workdir", str(tmp_path / "ens"), "--ensemble-of",
                                str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    fold, pooled = rows
    model = tmp_path / "ens" / "fold1" / "run" / "model"
    members = json.loads((model / "ensemble.json").read_text())["members"]
    assert len(members) == 2 and (model / "decoding.json").is_file()
    assert fold["decoder_chosen_on"] in ("val families of the fold", "train families of the fold")
    assert {"model", "model_mea", "model_plan", "nw"} <= set(pooled["f1"])
    assert pooled["summary"]["methods"]["model_plan"]["label"] == \
        "pfamalign, plan only (MEA, objective chosen on val)"  # an ensemble's plan-only row is MEA
    # the members' test pairs, so that the rows compare
    done = [json.loads((tmp_path / w / "fold1" / "result.json").read_text()) for w in ("a", "ens")]
    assert done[0]["evaluation"]["pid"] == done[1]["evaluation"]["pid"]
    assert done[0]["evaluation"]["counts"]["nw"] == done[1]["evaluation"]["counts"]["nw"]


def _tune_triton_calls_lower_for_cuda(module, shapes, swept):
    """Every shape's timed call lowers for cuda with the swept kernels (``swept[shape]``, by
    their Pallas names) in its module, once each; a stored band's readers after the kernel that
    stores the band, and nothing else."""
    from pfamalign.kernels.pallas_ops import lower

    for shape, geom in shapes.items():
        fn, args = module._kernel_call(shape, geom)
        text = lower(fn, "cuda", *args).as_text()
        found = collections.Counter(re.findall(r'name = "((?:band|stored)_[a-z_]+)"', text))
        expected = collections.Counter(swept[shape]) + collections.Counter(
            ["band_scores"] if shape.stored and not shape.d else [])
        assert found == expected, shape


def test_tune_triton_finds_the_ops_kernel_shapes_and_refuses_a_cpu():
    """The tiling sweep collects every Triton call site of the op (lowered for cuda from this
    host: the LSE, the plain, ones-vector and R-column products (the tail plans' line sums)
    and the modulated product), its timed
    calls lower for cuda, and with no GPU to time them on it stops with a message instead of
    timing interpret mode."""
    module = importlib.import_module("tune_triton")
    from pfamalign.kernels.gpu_budget import KernelShape

    shapes = module._collect_shapes(256, 32, 16, 2, 2)
    assert set(shapes) == {KernelShape(16), KernelShape(16, 16), KernelShape(16, 1), KernelShape(16, 2),
                           KernelShape(16, 16, 20)}
    assert all(g.length == 256 and g.half_band == 32 for g in shapes.values())
    _tune_triton_calls_lower_for_cuda(module, shapes, {
        KernelShape(16): ["band_lse"], KernelShape(16, 16): ["band_product"], KernelShape(16, 2): ["band_product"],
        KernelShape(16, 1): ["band_vector_product"], KernelShape(16, 16, 20): ["band_modulated_product"]})
    for impl in ("pallas", "pallas-resident"):
        with pytest.raises(SystemExit, match="needs a GPU backend"):
            module.main(["--impl", impl])


def test_tune_triton_sweeps_the_stored_band_kernels():
    """With resident scores the sweep finds the band's scores kernel and the kernels that read
    the band (stored shapes, d 0); each one's timed call lowers for cuda."""
    module = importlib.import_module("tune_triton")
    from pfamalign.kernels.gpu_budget import KernelShape

    shapes = module._collect_shapes(256, 32, 16, 2, 2, "pallas-resident")
    assert set(shapes) == {KernelShape(16, stored=True), KernelShape(0, stored=True),
                           KernelShape(0, 16, stored=True), KernelShape(0, 1, stored=True),
                           KernelShape(0, 2, stored=True), KernelShape(0, 16, 20, stored=True)}
    walks = lambda what: [f"stored_rows_{what}", f"stored_cols_{what}"]
    _tune_triton_calls_lower_for_cuda(module, shapes, {
        KernelShape(16, stored=True): ["band_scores"], KernelShape(0, stored=True): walks("lse"),
        KernelShape(0, 16, stored=True): walks("product"), KernelShape(0, 2, stored=True): walks("product"),
        KernelShape(0, 1, stored=True): walks("vector_product"),
        KernelShape(0, 16, 20, stored=True): walks("modulated_product")})


def test_profile_transport_lists_innermost_ops_and_writes_the_hlo(tmp_path, capsys, monkeypatch):
    """Innermost events only, the slowest first, the HLO written; GPU command buffers turned off
    for the trace (their kernels are not attributed) unless asked for."""
    import os
    import types

    import profile_transport

    ev = lambda name, start, end: types.SimpleNamespace(name=name, start_ns=start, end_ns=end)
    nested = [ev("while", 0, 100), ev("body_a", 10, 40), ev("body_b", 50, 90), ev("after", 120, 130)]
    assert [e.name for e in profile_transport._leaves(nested)] == ["body_a", "body_b", "after"]
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored after the test
    profile_transport.main(["--lengths", "64", "--half-band", "16", "--impls", "xla", "--repeats", "1",
                            "--top", "5", "--out", str(tmp_path)])
    assert os.environ["XLA_FLAGS"].endswith("--xla_gpu_enable_command_buffer=")
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    head, ops = rows[0], rows[1:]
    assert head["op"] == "(whole call)" and head["ms_per_call"] > 0 and head["ops"] >= len(ops) > 0
    assert head["command_buffers"] is False and 0 < head["traced_share"]
    assert all(r["script"] == "profile_transport" and r["ms"] >= 0 for r in ops)
    assert sum(r["share"] for r in ops) <= 1 + 1e-9  # innermost events only: shares add up
    assert [r["ms"] for r in ops] == sorted((r["ms"] for r in ops), reverse=True)
    assert "HloModule" in pathlib.Path(head["hlo"]).read_text()


# A GPU module as XLA prints it, reduced: a loop of known trip count, one without, a
# conditional and a called computation.
_GPU_HLO = """HloModule m

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %a = f32[4]{0} fusion(%x), kind=kLoop, calls=%f
  %c = f32[4]{0} custom-call(%a), custom_call_target="__gpu$xla.gpu.triton", backend_config={"x":1}
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %c)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]{0}) parameter(0)
  ROOT %lt = pred[] fusion(%p), kind=kLoop, calls=%g
}

%branch (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %y = f32[4]{0} copy(%x)
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %t0 = (s32[], f32[4]{0}) tuple(%z, %x)
  %w = (s32[], f32[4]{0}, /*index=2*/f32[4]{0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"15"}}
  %w2 = (s32[], f32[4]{0}) while(%t0), condition=%cond, body=%body
  %k = f32[4]{0} conditional(%pr, %x, %x), branch_computations={%branch, %branch}
  %s = f32[4]{0} call(%x), to_apply=%branch
  ROOT %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%h
}
"""


def test_count_gpu_launches_counts_loop_bodies_per_trip():
    """scripts/count_gpu_launches.py (the kernel launches of an optimized GPU module): a body
    counts once per known trip; a loop without a known trip count runs its condition on the
    device and syncs with the host each trip (counted once: its trips are unknown); a
    conditional syncs and counts both branches; free instructions count nothing."""
    module = importlib.import_module("count_gpu_launches")
    kinds, syncs = module.count_launches(_GPU_HLO)
    # fusions: 15 + 1 (the bodies), 1 (the unknown loop's condition), 1 (the ROOT)
    assert kinds["fusion"] == 18
    assert kinds["custom-call __gpu$xla.gpu.triton"] == 16
    assert kinds["copy"] == 3  # two branches and the called computation
    assert dict(syncs) == {"while without a known trip count": 1, "conditional": 1}
    assert sum(kinds.values()) == 37


# Three fusions as XLA prints them: a concatenation that holds a 4096-long sum (flagged), a
# reduction kernel (its reduce is its hero), and a concatenation holding a 16-long one.
_RECOMPUTE_HLO = """HloModule m

%fused_concatenate (p0: f32[4096], p1: f32[4096]) -> f32[4097] {
  %p0 = f32[4096]{0} parameter(0)
  %p1 = f32[4096]{0} parameter(1)
  %z = f32[] constant(0)
  %s = f32[] reduce(%p1, %z), dimensions={0}, to_apply=%add
  %b = f32[1]{0} bitcast(%s)
  ROOT %c = f32[4097]{0} concatenate(%p0, %b), dimensions={0}
}

%fused_reduce (p0: f32[4096]) -> f32[] {
  %p0 = f32[4096]{0} parameter(0)
  %z = f32[] constant(0)
  ROOT %s = f32[] reduce(%p0, %z), dimensions={0}, to_apply=%add
}

%fused_small (p0: f32[4096], p1: f32[16]) -> f32[4097] {
  %p0 = f32[4096]{0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %z = f32[] constant(0)
  %s = f32[] reduce(%p1, %z), dimensions={0}, to_apply=%add
  %b = f32[1]{0} bitcast(%s)
  ROOT %c = f32[4097]{0} concatenate(%p0, %b), dimensions={0}
}

ENTRY %main (x: f32[4096], y: f32[16]) -> f32[4097] {
  %x = f32[4096]{0} parameter(0)
  %y = f32[16]{0} parameter(1)
  %a = f32[4097]{0} fusion(%x, %x), kind=kInput, calls=%fused_concatenate
  %r = f32[] fusion(%x), kind=kInput, calls=%fused_reduce
  ROOT %c = f32[4097]{0} fusion(%x, %y), kind=kLoop, calls=%fused_small
}
"""


def test_count_gpu_launches_flags_a_long_reduction_fused_into_an_elementwise_kernel():
    """``recomputed_reductions``: the concatenation that holds a sum over 4096 entries (each of
    its 4097 outputs may compute it again: what cost 1.6 ms a kernel on an H200) is named; the
    reduction kernel and the concatenation with a 16-long sum are not."""
    module = importlib.import_module("count_gpu_launches")
    assert module.recomputed_reductions(_RECOMPUTE_HLO) == [{"fusion": "a", "reduces": 4096, "outputs": 4097}]
    assert module.recomputed_reductions(_RECOMPUTE_HLO, length=8192) == []


def test_gpu_session_script_parses_and_names_its_steps():
    """scripts/gpu_session.sh (run on a lent GPU machine; its ``fetch`` and ``replica`` here) is
    valid bash, and without a step it exits 2 naming each one, the one-call ``issue11`` first
    after ``fetch``, then ``rest`` (what it leaves to run)."""
    import subprocess

    script = SCRIPTS / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert run.returncode == 2
    steps = run.stderr.split("gpu_session.sh", 1)[1].split("|")
    assert [s.strip() for s in steps[:4]] == ["fetch", "issue11", "rest", "tests"]
    assert {"targets", "resident", "profile", "train", "replica"} <= {s.strip() for s in steps}
    # issue11's parts, each stopped at its limit (+10 s to kill), and ~30 s of install fit one
    # 600 s call of a 15-minute lease
    import re

    text = script.read_text()
    limits = lambda step: [int(n) for n in re.findall(r"^\s*part (\d+) ", text.split(f"\n{step}() {{")[1].split("\n}\n")[0],
                                                      re.M)]
    assert len(limits("issue11")) == 5 and sum(limits("issue11")) + 10 * 5 + 30 <= 600
    assert len(limits("spokes")) == 3 and sum(limits("spokes")) + 10 * 3 + 30 <= 600
    # rest: "under 7 minutes", as its comment and the README say (it said 6 with parts of 390 s)
    assert len(limits("rest")) == 3 and sum(limits("rest")) + 10 * 3 + 30 <= 7 * 60


def test_gpu_session_keeps_the_prepared_files_when_a_fetch_fails(tmp_path):
    """``fetch`` builds the new ``.gpu`` beside the old one: a download that fails (here: no
    package index) leaves the wheels and data prepared before; a GPU step without them says
    to fetch first; ``--help`` prints the steps and exits 0."""
    import os
    import subprocess

    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPTS / "gpu_session.sh", tmp_path / "scripts")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    bash = lambda *args, **env: subprocess.run(["bash", "scripts/gpu_session.sh", *args], cwd=tmp_path,
                                               capture_output=True, text=True, env={**os.environ, **env})
    missing = bash("issue11")
    assert missing.returncode == 2 and "run 'bash scripts/gpu_session.sh fetch'" in missing.stderr
    (tmp_path / ".gpu" / "whl").mkdir(parents=True)
    (tmp_path / ".gpu" / "whl" / "kept-1.0-py3-none-any.whl").write_text("")
    failed = bash("fetch", PIP_NO_INDEX="1", PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull)
    assert failed.returncode != 0
    assert (tmp_path / ".gpu" / "whl" / "kept-1.0-py3-none-any.whl").is_file()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert ".gpu" not in status  # both the prepared folder and the staging one are ignored
    helped = bash("--help")
    assert helped.returncode == 0 and "bash scripts/gpu_session.sh issue11" in helped.stdout


@pytest.mark.parametrize("name, argv, said", [
    ("crossval", ["--workdir", "w", "--folds", "1"], "--folds must be at least 2"),
    ("crossval", ["--workdir", "w", "--only", "abc"], "--only takes fold numbers"),
    ("crossval", ["--workdir", "w", "--max-pairs-per-fold", "0"], "--max-pairs-per-fold must be at least 1"),
    ("fit_pairhmm", ["--data", "/nonexistent"], "no dataset there"),
    ("fit_pairhmm", ["--data", ".", "--gap-types", "0"], "invalid choice: 0"),
    ("fit_pairhmm", ["--data", ".", "--pseudocount", "-1"], "--pseudocount must be above 0"),
    ("tune_decoder", ["--data", "/nonexistent", "--checkpoint", "."], "no such file or folder: /nonexistent"),
    ("tune_decoder", ["--data", ".", "--checkpoint", ".", "--max-pairs", "0"], "must be at least 1"),
    ("bench_posterior", ["--data", ".", "--hmm", "/nonexistent.json"], "no such file or folder"),
    ("bench_posterior", ["--data", ".", "--pairs", "0"], "must be at least 1"),
    ("bench_local", ["--data", "/nonexistent"], "no such file or folder"),
    ("bench_engines", ["--checkpoint", "/nonexistent"], "no such file or folder"),
    ("asap_features", ["--checkpoint", "/nonexistent"], "no such file or folder"),
    ("bench_encoder", ["--kinds", "foo"], "--kinds must name some of"),
    ("validate_ceta", ["--causal-steps", "4"], "--causal-steps needs two or more"),
    ("profile_transport", ["--impls", "foo"], "--impls must name some of"),
    ("profile_transport", ["--repeats", "0"], "must be at least 1"),
    ("benchmark_production_backward_modes", ["--modes", "foo"], "--modes must name some of"),
    ("benchmark_production_backward_modes", ["--cases", "32x8"], "need BATCHxLxW items"),
    ("estimate_r2_backward_memory", ["--cases", "64"], "need LxW items"),
    ("benchmark_four_plan_adjoint", ["--lengths", "0"], "need one or more integers of at least 1"),
])
def test_scripts_refuse_bad_arguments_in_one_line(name, argv, said, capsys):
    """A wrong argument is an argparse error (exit 2, the option named), not a traceback after
    the imports or a run that measures nothing."""
    module = importlib.import_module(name)
    with pytest.raises(SystemExit) as stop:
        module.main(argv)
    assert stop.value.code == 2 and said in capsys.readouterr().err
