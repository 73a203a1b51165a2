"""One definition of the model's plan metrics: the validation inside training and
`pfamalign eval` score the same pairs alike, with and without a dustbin."""

import dataclasses
import io
import json
import pathlib

import numpy as np

import pytest
from rich.console import Console

from pfamalign import checkpoint, evaluation
from pfamalign.alignment.metrics import PlanMetrics, prf_by_identity
from pfamalign.inference import Predictor
from pfamalign.model import build_model
from pfamalign.pipelines import reader
from pfamalign.pipelines.config import PrepareConfig
from pfamalign.pipelines.pairs import SamplingConfig
from pfamalign.pipelines.prepare import run_prepare
from pfamalign.training import loop, rundir

SEED = pathlib.Path(__file__).parent / "data" / "pfam_seed"
# tiny models (3 base steps: the metrics do not depend on convergence); pairs of <= 52
# residues: one padded shape (64) in both paths
TINY = {"encoder_layers": 1, "encoder_width": 16, "heads": 2, "head_dim": 8, "value_dim": 8,
        "transport.base_steps": 3,
        "train.eval_pairs": 8, "train.eval_batch_size": 4}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two short families, every pair in the val split."""
    out = tmp_path_factory.mktemp("evaluation") / "ds"
    run_prepare(PrepareConfig(inputs=(str(SEED / "PF05371.sto"), str(SEED / "PF02184.sto")),
                              out=str(out), embedder="builtin/onehot+blosum62",
                              sampling=SamplingConfig(pairs_per_family=12),
                              split_fractions=(0.0, 1.0, 0.0)), quiet=True)
    return out


@pytest.mark.parametrize("name", ["k2_eps1", "muot_dustbin_hybrid"])
def test_validation_and_eval_give_the_same_plan_metrics(name, dataset, tmp_path):
    cfg = rundir.resolve_config(dataset, name, overrides=TINY)
    checkpoint.save_model(tmp_path / "model", build_model(cfg.model, seed=2), cfg.model)
    predictor = Predictor(tmp_path / "model")
    val = evaluation.validate(predictor.model, loop.val_batches(dataset, cfg.train))

    # the same pairs, through `pfamalign eval`'s path
    lengths = reader.PairDataset(dataset).lengths("val")
    chosen = set(reader.select_pairs(lengths, max_pairs=cfg.train.eval_pairs).tolist())
    records = [r for i, r in enumerate(reader.iter_pairs(dataset, "val", features=True))
               if i in chosen]
    assert any((r["target"] < 0).any() for r in records)  # unaligned rows: the case in question
    # the one-direction plan: the one the training loop validates
    ev = evaluation.evaluate(records, predictor=predictor, baselines=(), symmetric=False)
    pooled = PlanMetrics.pool(ev.plan["model"])

    assert val["val/n_pairs"] == len(records) == 8
    # the objective's terms pool over their own counts: the eval batch size moves nothing
    for size in (1, 3, 8):
        resized = cfg.train.replace(eval_batch_size=size)
        other = evaluation.validate(predictor.model, loop.val_batches(dataset, resized))
        for key in ("val/loss", "val/recon", "val/ce", "val/mono", "val/sparse_ce"):
            assert other[key] == pytest.approx(val[key], rel=2e-6), (key, size)
    for metric in ("sparse_ce", "barycenter_mae", "within5", "monotonicity_violation"):
        assert val[f"val/{metric}"] == pytest.approx(getattr(pooled, metric), rel=1e-4), metric
    diag = PlanMetrics.pool(ev.plan["diagonal"])
    assert val["diag/sparse_ce"] == pytest.approx(diag.sparse_ce, rel=1e-6)
    # without a dustbin, unaligned rows are left out of the CE (as in the training loss)
    n_aligned = sum(int((r["target"] >= 0).sum()) for r in records)
    n_rows = sum(len(r["target"]) for r in records)
    assert pooled.n_ce == (n_rows if cfg.model.dustbin else n_aligned)
    # reliability: every aligned pair of the model once, correct exactly when a true positive
    sums = ev.reliability["model"].sum(axis=0)
    tp, n_pred, _ = np.asarray(ev.counts["model"]).sum(axis=0)
    assert (sums[0], sums[2]) == (n_pred, tp) and n_pred > 0


def test_eval_scores_the_symmetrized_plan_that_align_prints(dataset):
    """`pfamalign eval` scores what `pfamalign align` prints: per pair, the same aligned
    pairs and the plan metrics of the same (symmetrized) plan, not the A -> B one."""
    from pfamalign.alignment.metrics import alignment_counts

    predictor = Predictor()  # the shipped model: its features are the dataset's
    records = list(reader.iter_pairs(dataset, "val", features=True))[:6]
    ev = evaluation.evaluate(records, predictor=predictor, baselines=())
    one_way = evaluation.evaluate(records, predictor=predictor, baselines=(), symmetric=False)
    moved = 0
    for r, counts, metrics, one in zip(records, ev.counts["model"], ev.plan["model"],
                                       one_way.plan["model"]):
        aln, pp = predictor.align(r["q_seq"], r["k_seq"])
        assert tuple(counts) == tuple(alignment_counts(aln.pairs, r["target"]))
        printed = evaluation.model_plan_metrics(pp.real, pp.row_dustbin, r["target"], dustbin=True)
        assert metrics.sparse_ce == pytest.approx(printed.sparse_ce, rel=1e-4)
        assert metrics.barycenter_mae == pytest.approx(printed.barycenter_mae, rel=1e-4)
        moved += abs(one.sparse_ce - printed.sparse_ce) > 1e-3 * abs(printed.sparse_ce)
    assert moved > 0  # the two plans differ: the check above can tell them apart


# ---- drawing pairs across families (`eval --max-pairs`, the decoder tuning) -------------------

SIZES = {"a": 10, "b": 2, "c": 5, "d": 1}
STORED = [f for f, n in SIZES.items() for _ in range(n)]  # records are stored family by family


@pytest.mark.parametrize("max_pairs", [0, 1, 3, 4, 7, 12, 18, 30])
def test_sample_across_families_draws_round_robin(max_pairs):
    idx = evaluation.sample_across_families(STORED, max_pairs, seed=3)
    assert len(idx) == min(max_pairs, len(STORED)) == len(set(idx.tolist()))
    assert list(idx) == sorted(idx)
    counts = {f: sum(STORED[i] == f for i in idx) for f in SIZES}
    # round robin: a family short of its size has at most one pair fewer than any other
    top = max(counts.values())
    assert all(counts[f] <= SIZES[f] for f in SIZES)
    assert all(counts[f] >= top - 1 for f in SIZES if counts[f] < SIZES[f])
    if max_pairs >= len(SIZES):
        assert all(counts.values())  # every family represented
    else:
        assert top <= 1  # one pair from each of max_pairs families


def test_sample_across_families_is_a_function_of_the_seed():
    draw = lambda seed: evaluation.sample_across_families(STORED, 5, seed=seed).tolist()
    assert draw(0) == draw(0)
    assert len({tuple(draw(seed)) for seed in range(10)}) > 1
    # the first pairs in stored order would all come from one family
    assert len({STORED[i] for i in draw(0)}) == len(SIZES)


@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("max_pairs", [0, 3, 4, 11, 30])
def test_sample_across_families_unshuffled_is_the_crossval_draw(max_pairs, seed):
    """``shuffle_families=False`` keeps scripts/crossval.py's test pairs (its published figures):
    each family's items in one seeded permutation (families sorted), then rounds over the
    families in sorted order."""
    by_family: dict[str, list[int]] = {}
    for i, family in enumerate(STORED):
        by_family.setdefault(family, []).append(i)
    rng = np.random.default_rng(seed)
    queues = [list(rng.permutation(idx)) for _, idx in sorted(by_family.items())]
    want: list[int] = []
    while len(want) < max_pairs and any(queues):
        for q in queues:
            if q and len(want) < max_pairs:
                want.append(int(q.pop(0)))
    got = evaluation.sample_across_families(STORED, max_pairs, seed=seed, shuffle_families=False)
    assert got.tolist() == sorted(want)


def test_pair_records_max_pairs_covers_every_family(dataset):
    all_val = list(reader.iter_pairs(dataset, "val"))
    records, total, _ = evaluation.pair_records(data=dataset, split="val", max_pairs=4, seed=1)
    records = list(records)
    assert total == len(records) == 4
    assert {r["family"] for r in records} == {r["family"] for r in all_val}  # 2 families
    keys = lambda rs: [(r["family"], r["pair_index"]) for r in rs]
    want = evaluation.sample_across_families([r["family"] for r in all_val], 4, seed=1)
    assert keys(records) == keys([all_val[i] for i in want])


def test_tuning_keeps_the_incumbent_unless_a_challenger_wins_with_evidence():
    """A challenger with the higher F1 replaces the incumbent only when the paired bootstrap
    interval of the difference is above zero."""
    from pfamalign import tuning
    from pfamalign.decoding import DecoderSettings
    from pfamalign.plans import PairPlan

    n = 8
    def pair(family, shift):  # plan mass 0.3 on the diagonal shifted by `shift`; target: diagonal
        plan = np.zeros((n + 1, n + 1))
        plan[np.arange(n - shift), np.arange(shift, n)] = 0.3
        rec = {"q_seq": "ACDEFGHI", "k_seq": "ACDEFGHI", "target": np.arange(n), "pid": 100.0,
               "family": family, "q_feat": np.zeros((n, 1)), "k_feat": np.zeros((n, 1))}
        return rec, PairPlan(plan)

    class FixedPlans:  # the predictor interface tuning uses, plans given
        def __init__(self, plans):
            self._plans = plans

        def plans(self, feats, batch_size=8, symmetric=False):
            return iter(self._plans)

    incumbent = DecoderSettings(decoder="mea", min_mass=0.5)  # aligns nothing here
    challenger = DecoderSettings(decoder="mea")  # follows the plan, right or wrong

    def tune(pairs):
        records, plans = zip(*pairs)
        return tuning.tune(FixedPlans(list(plans)), list(records), candidates=[incumbent, challenger],
                           incumbent=incumbent)

    # right on every pair of 12 families: evidence, the challenger wins
    won = tune([pair(f"PF{i:05d}", 0) for i in range(12)])
    assert won.best == challenger and won.margin["low"] > 0 and won.margin["resampled"] == "families"
    # right on one pair, wrong on the other: a higher F1 but no evidence, the incumbent stays
    kept = tune([pair("PF00001", 0), pair("PF00002", 1)])
    assert [r["f1"] for r in kept.rows][1] > [r["f1"] for r in kept.rows][0]
    assert kept.best == incumbent and kept.margin["value"] > 0 and not kept.margin["low"] > 0
    # the margin names the candidate it is the margin of (the incumbent kept its place)
    assert kept.margin["challenger"] == {**dataclasses.asdict(challenger), "f1": kept.rows[1]["f1"]}
    # right on every pair of 4 families: the pairs' interval is above zero, but 4 families are
    # too few to resample: no evidence about the next family, the incumbent stays
    few = tune([pair(f"PF{i:05d}", 0) for i in range(4) for _ in range(3)])
    assert few.best == incumbent and few.margin["low"] > 0 and few.margin["resampled"].startswith("pairs")


# ---- reliability of the model's pair confidences (issue 18, calibration) ----------------------

N = 8


class FixedPlanPredictor:
    """The predictor interface `evaluate` uses, with given plans (one per record, in order)."""

    config = type("Config", (), {"dustbin": False, "embedder_id": "fixed"})

    def __init__(self, plans):
        self._plans = iter(plans)

    def plans(self, feats, batch_size=8, symmetric=False):
        return [next(self._plans) for _ in feats]

    def decode_batch(self, plans, seq_pairs, decoding):
        return [decoding.decode(pp, pair) for pp, pair in zip(plans, seq_pairs)]


def _calibration_evaluation(baselines=("nw",)):
    """Two pairs of one 8-residue sequence, reference = the diagonal: a plan of mass 0.95 on
    the diagonal (8 right pairs at 0.95) and one of mass 0.35 on the diagonal shifted by one
    (7 wrong pairs at 0.35)."""
    from pfamalign.decoding import DecoderSettings
    from pfamalign.plans import PairPlan

    records, plans = [], []
    for family, mass, shift in (("PF00001", 0.95, 0), ("PF00002", 0.35, 1)):
        plan = np.zeros((N + 1, N + 1))
        plan[np.arange(N - shift), np.arange(shift, N)] = mass
        plans.append(PairPlan(plan))
        records.append({"q_seq": "ACDEFGHI", "k_seq": "ACDEFGHI", "target": np.arange(N),
                        "pid": 100.0, "family": family, "q_feat": np.zeros((N, 1)),
                        "k_feat": np.zeros((N, 1))})
    return evaluation.evaluate(records, predictor=FixedPlanPredictor(plans), baselines=baselines,
                               decoding=DecoderSettings(decoder="mea"))


def test_eval_summary_has_the_model_reliability():
    summary = _calibration_evaluation().summary(n_boot=0)
    assert "reliability" not in summary["methods"]["nw"]  # no confidences
    rel = summary["methods"]["model"]["reliability"]
    assert rel["n_pairs"] == 15
    counts = [b["count"] for b in rel["bins"]]
    assert counts == [0, 0, 0, 7, 0, 0, 0, 0, 0, 8]
    assert rel["bins"][9]["precision"] == 1.0 and rel["bins"][9]["mean_confidence"] == pytest.approx(0.95)
    assert rel["bins"][3]["precision"] == 0.0 and rel["bins"][3]["mean_confidence"] == pytest.approx(0.35)
    assert rel["ece"] == pytest.approx((8 * 0.05 + 7 * 0.35) / 15)
    assert rel["brier"] == pytest.approx((8 * 0.05 ** 2 + 7 * 0.35 ** 2) / 15)
    # the console line
    import io

    from rich.console import Console

    out = io.StringIO()
    evaluation.render(summary, console=Console(file=out, width=200))
    assert f"ECE {rel['ece']:.4f}, Brier {rel['brier']:.4f} over 15 aligned pairs" in out.getvalue()


def test_eval_plot_has_the_reliability_panel(tmp_path):
    import json

    import matplotlib.colors

    summary = _calibration_evaluation().summary(n_boot=0)
    read_back = json.loads(evaluation.to_json(summary))  # empty bins: null, as crossval reads them
    for s in (summary, read_back):
        bars, panel, share_axis = evaluation.figure(s).axes  # the shares on their own axis
        curve = [line for line in panel.get_lines() if line.get_label().startswith("pfamalign")]
        assert len(curve) == 1
        np.testing.assert_allclose(curve[0].get_xdata(), [0.35, 0.95])  # the non-empty bins
        np.testing.assert_allclose(curve[0].get_ydata(), [0.0, 1.0])
        shares = sorted(round(p.get_height(), 6) for p in share_axis.patches if p.get_height() > 0)
        assert shares == [round(7 / 15, 6), round(8 / 15, 6)]
        assert not bars.containers or all(type(c).__name__ == "BarContainer" for c in bars.containers)  # n_boot 0:
        # no error bars (zero-width ones would read as certainty); a bin without pairs is said, not drawn as 0
        empty = [b for b in ("<30", "30-50", ">=50") if s["methods"]["model"]["prf"][b]["n_pairs"] == 0]
        assert len([t for t in bars.texts if t.get_text() == "no pairs"]) == len(empty)
        assert sum(len(c) for c in bars.containers) == len(s["methods"]) * (4 - len(empty))
        assert {tuple(p.get_facecolor()) for p in bars.patches} == {  # one colour per method, always
            matplotlib.colors.to_rgba(evaluation.METHOD_COLOURS[m]) for m in ("model", "nw")}
    path = evaluation.plot(summary, tmp_path / "eval.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # baselines only: no confidences, no panel
    baselines = evaluation.evaluate(
        [{"q_seq": "ACDEF", "k_seq": "ACDEF", "target": np.arange(5), "pid": 100.0}],
        baselines=("nw",)).summary(n_boot=0)
    assert len(evaluation.figure(baselines).axes) == 1


def test_the_eval_figure_and_table_say_what_their_intervals_are():
    """One pair of one family: "1 pairs of 1 families; 95 % bootstrap intervals" over bars
    without any interval. The counts agree with their nouns, and a summary whose every
    bound is null says there are none and why."""
    import io
    import json

    from rich.console import Console

    one = evaluation.evaluate([{"q_seq": "ACDEFGH", "k_seq": "ACDEFGH", "target": np.arange(7), "pid": 100.0,
                                "family": "PF1"}], baselines=("nw",))
    for summary in (one.summary(n_boot=100), json.loads(evaluation.to_json(one.summary(n_boot=100)))):
        title = evaluation.figure(summary).axes[0].get_title()
        assert title.startswith("1 pair of 1 family; no intervals (too few pairs to resample)"), title
        out = io.StringIO()
        evaluation.render(summary, console=Console(file=out, width=300))
        assert "no CI (too few pairs to resample)) — 1 pair, 1 family;" in out.getvalue()
    assert evaluation.figure(one.summary(n_boot=0)).axes[0].get_title().endswith("no intervals (--bootstrap 0)")
    many = _calibration_evaluation().summary(n_boot=50)
    assert "95 % bootstrap intervals over pairs" in evaluation.figure(many).axes[0].get_title()


def test_the_plan_metrics_table_leaves_out_a_metric_no_method_has():
    import io

    from rich.console import Console

    summary = _calibration_evaluation().summary(n_boot=0)
    pm = summary["methods"]["model"]["plan_metrics"]
    assert not np.isfinite(pm["reconstruction"])  # no reconstruction head: nothing to report
    out = io.StringIO()
    evaluation.render(summary, console=Console(file=out, width=250))
    table = out.getvalue()[out.getvalue().index("plan metrics"):]
    assert "reconstruction" not in table and "barycenter_mae" in table
    pm["reconstruction"] = 0.25  # one method has it: its column is back
    out = io.StringIO()
    evaluation.render(summary, console=Console(file=out, width=250))
    assert "reconstruction" in out.getvalue() and "0.2500" in out.getvalue()


def test_the_f1_table_names_the_substitution_settings_only_beside_their_rows():
    """Its title gave "NW/SW: BLOSUM62, gap open 11, extend 1" with neither among the methods."""
    import io

    from rich.console import Console

    pair = [{"q_seq": "ACDEFGH", "k_seq": "ACDEFGH", "target": np.arange(7), "pid": 100.0, "family": "PF1"}]
    for baselines, named in ((("nw",), True), (("sw", "diagonal"), True), (("diagonal",), False)):
        out = io.StringIO()
        evaluation.render(evaluation.evaluate(pair, baselines=baselines).summary(n_boot=0),
                          console=Console(file=out, width=300))
        assert ("NW/SW: BLOSUM62" in out.getvalue()) == named, (baselines, out.getvalue())  # (the title wraps)


def test_validation_compiles_its_batch_program_once(dataset, monkeypatch):
    """A model whose parameters are host arrays (as the training loop hands it over,
    ``local_params``) compiles ``eval_batch`` once for batches of one shape: the first call
    must not leave device arrays behind that make the second miss jit's cache (2.5 s a
    validation on 2 cores)."""
    import jax
    from flax import nnx

    from pfamalign import compile_cache

    cfg = rundir.resolve_config(dataset, "k2_eps1", overrides={**TINY, "encoder_width": 24})  # shapes of its own
    graphdef, state = nnx.split(build_model(cfg.model, seed=3))
    host = nnx.merge(graphdef, jax.tree.map(np.asarray, state))
    counter, real, after = compile_cache.CompileCounter(), evaluation.eval_batch, []

    def counted(*args):
        out = real(*args)
        after.append(counter.executables)
        return out

    monkeypatch.setattr(evaluation, "eval_batch", counted)
    try:
        evaluation.validate(host, loop.val_batches(dataset, cfg.train))
    finally:
        counter.close()
    assert len(after) == 2 and after[0] >= 1 and after[1] == after[0]


# --- summary and rendering from counts (a mutation sweep's survivors) -------------------------

RENDER_PID = [20.0, 40.0, 60.0, 20.0, 40.0, 60.0]


def _evaluation(methods=("model", "nw"), families=3):
    rng = np.random.default_rng(0)
    counts = {m: [[int(t), 10, 10] for t in rng.integers(2, 10, len(RENDER_PID))] for m in methods}
    return evaluation.Evaluation(list(methods), counts, {}, pid=list(RENDER_PID),
                                 families=[f"PF{i % families}" for i in range(len(RENDER_PID))])


def _rendered(summary) -> str:
    out = io.StringIO()
    evaluation.render(summary, console=Console(file=out, width=300))
    return out.getvalue()


def _rows(text, label, after=None):
    text = text[text.index(after):] if after else text
    return [line for line in text.splitlines() if label in line]


def test_summary_intervals_follow_the_seed():
    ev = _evaluation(("nw",))
    cells = {seed: ev.summary(n_boot=30, seed=seed)["methods"]["nw"]["prf"] for seed in (0, 7)}
    want = prf_by_identity(np.asarray(ev.counts["nw"]), RENDER_PID, n_boot=30, seed=7)
    assert cells[7] == want
    assert cells[0]["all"]["micro"]["f1"]["low"] != cells[7]["all"]["micro"]["f1"]["low"]


def test_a_method_without_plan_metrics_is_summarised_without_them():
    ev = evaluation.Evaluation(["diagonal"], {"diagonal": []}, {"diagonal": []})
    assert "plan_metrics" not in ev.summary(n_boot=0)["methods"]["diagonal"]


def test_the_f1_table_marks_a_bin_without_pairs_and_signs_the_differences():
    text = _rendered(_evaluation(families=3).summary(n_boot=20))
    diff = _rows(text, "NW-BLOSUM62", after="minus baseline")[0]
    bounds = diff.split("[")[1].split("]")[0].split(", ")
    assert all(b[0] in "+-" for b in bounds), diff  # "+0.322", not "0.322"
    two = evaluation.Evaluation(["nw"], {"nw": [[2, 3, 3], [1, 3, 3]]}, {}, pid=[20.0, 40.0],
                                families=["PF1", "PF2"])
    row = _rows(_rendered(two.summary(n_boot=0)), "NW-BLOSUM62")[0]
    assert "—" in row and "nan" not in row  # the >=50 bin holds no pair


def test_a_by_family_row_of_one_family_says_it_has_no_interval():
    row = _rows(_rendered(_evaluation(families=1).summary(n_boot=20)), "by family")[0]
    assert row.count("—") == 4, row


def test_the_paired_table_without_bootstrap_says_so():
    text = _rendered(_evaluation().summary(n_boot=0))
    title = text[text.index("minus baseline"):]
    title = title[:title.index("┏")]  # (the title wraps)
    assert "--bootstrap 0" in title and "95%" not in title


def test_a_summary_from_before_n_boot_was_recorded_has_intervals():
    summary = json.loads(evaluation.to_json(_evaluation(("nw",)).summary(n_boot=20)))
    del summary["n_boot"]
    assert "95% bootstrap CI" in _rows(_rendered(summary), "aligned-pair F1")[0]


def test_a_plan_metric_one_of_two_methods_has_keeps_its_column():
    ev = _evaluation(("model", "diagonal"))
    ev.plan = {"model": [PlanMetrics(0.25, 1.0, 1.0, 1.0, 0.0, 1, 1, 1, 1)],
               "diagonal": [PlanMetrics(float("nan"), 1.0, 1.0, 1.0, 0.0, 1, 1, 1, 1)]}
    text = _rendered(ev.summary(n_boot=0))
    assert "reconstruction" in text[text.index("plan metrics"):] and "0.2500" in text


def test_the_table_names_the_baselines_it_could_not_score():
    summary = _evaluation(("nw",)).summary(n_boot=0)
    summary["skipped_baselines"] = {"probcons": "probcons not found on PATH"}
    assert "ProbCons not scored: probcons not found on PATH" in _rendered(summary)


def test_a_summary_read_back_from_json_renders_an_undefined_precision_as_a_dash():
    """A method that predicted no pair has NaN micro precision; its JSON holds null, which
    the table formatted with :.3f (a TypeError) while in memory it printed "nan"."""
    ev = evaluation.Evaluation(["nw"], {"nw": [[0, 0, 5], [0, 0, 4]]}, {}, pid=[20.0, 60.0],
                               families=["PF1", "PF2"])
    summary = ev.summary(n_boot=0)
    for s in (summary, json.loads(evaluation.to_json(summary))):
        cells = [c.strip() for c in _rows(_rendered(s), "NW-BLOSUM62")[0].split("│")[1:-1]]
        assert cells[-2:] == ["—", "0.000"], cells  # precision undefined, recall 0


def test_two_pfam_versions_of_one_family_are_one_bootstrap_cluster():
    """The bundled data holds RRM_1 twice (seed PF00076.13, hmmalign PF00076.25; the splits
    keep them together by version-free accession): the family bootstrap resampled them as two
    independent families, and the table counted 12 test families for 11."""
    records = [{"q_seq": "ACDEFGH", "k_seq": "ACDEFGH", "target": np.arange(7), "pid": 100.0, "family": f}
               for f in ("PF00076.13", "PF00076.25", "PF00001.3", "PF00076")]
    ev = evaluation.evaluate(records, baselines=("diagonal",))
    assert ev.families == ["PF00076", "PF00076", "PF00001", "PF00076"]
    assert ev.summary(n_boot=0)["n_families"] == 2
