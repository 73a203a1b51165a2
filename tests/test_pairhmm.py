"""The pair-HMM: forward-backward against brute-force path enumeration, posterior sanity,
symmetry, fitting by counting, the shipped parameters and the posterior decoder."""

from __future__ import annotations

import importlib
import itertools
import json
import dataclasses
import math
import pathlib
import sys
import time

import numpy as np
import pytest

from pfamalign.alignment import pairhmm
from pfamalign.alignment.pairhmm import RESIDUES, PairHMM, default_pairhmm, fit, match_posteriors
from pfamalign.decoding import DecoderSettings
from pfamalign.plans import PairPlan
from test_commands import dataset  # noqa: F401  (the tiny prepared dataset, a fixture)

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def random_hmm(seed: int, n_gap_types: int, gap_switch: float = 0.1) -> PairHMM:
    rng = np.random.default_rng(seed)
    n = len(RESIDUES)
    pairs = rng.random((n, n)) + 0.1
    return PairHMM(pair_probs=(pairs + pairs.T) / (pairs + pairs.T).sum(), background=rng.dirichlet(np.ones(n)) + 0.01,
                   gap_open=rng.uniform(0.02, 0.15, n_gap_types), gap_extend=rng.uniform(0.2, 0.9, n_gap_types),
                   gap_switch=gap_switch)


def transition(hmm: PairHMM, src: tuple, dst: tuple) -> float:
    """P(src -> dst) for states ("M",), ("X", g), ("Y", g), written from the model's definition."""
    w = hmm.gap_open / hmm.gap_open.sum()
    if src[0] == "M":
        return 1 - 2 * hmm.gap_open.sum() if dst[0] == "M" else hmm.gap_open[dst[1]]
    leave = 1 - hmm.gap_extend[src[1]]
    if dst[0] == "M":
        return leave * (1 - hmm.gap_switch)
    if dst[0] == src[0]:
        return hmm.gap_extend[src[1]] if dst[1] == src[1] else 0.0
    return leave * hmm.gap_switch * w[dst[1]]


def brute_force(hmm: PairHMM, a: str, b: str, *, local: bool = False,
                log_emissions: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Sums every state path: the match posteriors and the total likelihood ratio. Globally
    the paths run from the origin (as if from M) to (Lq, Lk); locally they are segments, a
    first pair at any cell (start weight 1 / (Lq Lk)), then any path of the model, ending
    after any pair (end weight 1 / (Lq Lk)), the flanks around them costing nothing.
    ``log_emissions``: the match log-odds of each residue pair (default: the table's)."""
    ia, ib = pairhmm.residue_indices(a), pairhmm.residue_indices(b)
    if log_emissions is None:
        log_emissions = hmm.log_odds()[ia[:, None], ib[None, :]]
    odds = np.exp(log_emissions)
    ia, ib = np.arange(len(a)), np.arange(len(b))  # odds[ia[i], ib[j]]: the pair (i, j)'s
    gaps = range(hmm.n_gap_types)
    states = [("M",)] + [("X", g) for g in gaps] + [("Y", g) for g in gaps]
    weight = 1.0 / (len(a) * len(b)) if local else 1.0
    post = np.zeros((len(a), len(b)))
    total = 0.0

    def walk(i, j, state, prob, pairs):
        nonlocal total
        if (state[0] == "M") if local else (i, j) == (len(a), len(b)):  # the path may end here
            total += prob * weight
            for p in pairs:
                post[p] += prob * weight
        for nxt in states:
            if nxt[0] == "M" and i < len(a) and j < len(b):
                walk(i + 1, j + 1, nxt, prob * transition(hmm, state, nxt) * odds[ia[i], ib[j]], pairs + [(i, j)])
            elif nxt[0] == "X" and i < len(a):
                walk(i + 1, j, nxt, prob * transition(hmm, state, nxt), pairs)
            elif nxt[0] == "Y" and j < len(b):
                walk(i, j + 1, nxt, prob * transition(hmm, state, nxt), pairs)

    if local:
        for i0, j0 in itertools.product(range(len(a)), range(len(b))):
            walk(i0 + 1, j0 + 1, ("M",), weight * odds[ia[i0], ib[j0]], [(i0, j0)])
    else:
        walk(0, 0, ("M",), 1.0, [])
    return post / total, total


@pytest.mark.parametrize("n_gap_types", [1, 2])
def test_transitions_out_of_every_state_sum_to_one(n_gap_types):
    hmm = random_hmm(0, n_gap_types)
    t = {k: np.exp(v) for k, v in hmm.log_transitions().items()}
    gaps = range(n_gap_types)
    states = [("M",)] + [("X", g) for g in gaps] + [("Y", g) for g in gaps]
    for src in states:
        assert sum(transition(hmm, src, dst) for dst in states) == pytest.approx(1.0)
    # the log table says the same as the definition
    assert t["mm"] == pytest.approx(transition(hmm, ("M",), ("M",)))
    for g, h in itertools.product(gaps, gaps):
        assert t["switch"][g, h] == pytest.approx(transition(hmm, ("X", g), ("Y", h)))


@pytest.mark.parametrize("a, b, n_gap_types, seed", [
    ("AC", "W", 2, 0), ("ACD", "ACD", 1, 1), ("MKV", "MKLV", 2, 2), ("WYCH", "HCY", 2, 3), ("GAXB", "GAPW", 1, 4),
])
def test_posteriors_match_brute_force(a, b, n_gap_types, seed):
    hmm = random_hmm(seed, n_gap_types)
    expected, total = brute_force(hmm, a, b)
    _, bwd_m, log_z = pairhmm.log_forward_backward(hmm, a, b)
    assert log_z == pytest.approx(math.log(total), rel=1e-10)
    assert bwd_m[0, 0] == pytest.approx(log_z, rel=1e-10)  # backward from the start agrees
    np.testing.assert_allclose(match_posteriors(hmm, a, b), expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("a, b, n_gap_types, seed", [
    ("AC", "W", 2, 0), ("ACD", "ACD", 1, 1), ("MKV", "MKLV", 2, 2), ("WYCH", "HCY", 2, 3), ("GAXB", "GAPW", 1, 4),
])
def test_local_posteriors_match_brute_force(a, b, n_gap_types, seed):
    hmm = random_hmm(seed, n_gap_types)
    expected, total = brute_force(hmm, a, b, local=True)
    fwd_m, bwd_m, log_z = pairhmm.log_forward_backward(hmm, a, b, local=True)
    assert log_z == pytest.approx(math.log(total), rel=1e-10)
    # backward from every start agrees: Z = sum_ij start * emission * backward
    emit = hmm.log_odds()[pairhmm.residue_indices(a)[:, None], pairhmm.residue_indices(b)[None, :]]
    from_starts = np.logaddexp.reduce((pairhmm.local_log_start(len(a), len(b)) + emit + bwd_m[1:, 1:]).ravel())
    assert from_starts == pytest.approx(log_z, rel=1e-10)
    np.testing.assert_allclose(match_posteriors(hmm, a, b, local=True), expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("a, b, n_gap_types, seed", [("AC", "W", 2, 0), ("MKV", "MKLV", 2, 2), ("WYCH", "HCY", 1, 3)])
def test_posteriors_of_a_given_emission_table_match_brute_force(a, b, n_gap_types, seed, local):
    """The plan pair-HMM's engine: any table of match log-odds in place of the residues'."""
    hmm = random_hmm(seed, n_gap_types)
    table = np.random.default_rng(seed).normal(0, 1.5, (len(a), len(b)))
    expected, total = brute_force(hmm, a, b, local=local, log_emissions=table)
    assert pairhmm.log_forward_backward(hmm, a, b, local=local, log_emissions=table)[2] == \
        pytest.approx(math.log(total), rel=1e-10)
    np.testing.assert_allclose(match_posteriors(hmm, a, b, local=local, log_emissions=table), expected,
                               rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        match_posteriors(hmm, a, b, log_emissions=table.T if len(a) != len(b) else table[:, :-1])


def test_plan_log_odds_are_zero_where_the_plan_is_uniform_and_scale_with_the_power():
    np.testing.assert_allclose(pairhmm.plan_log_odds(np.full((7, 7), 1 / 7), 0.05), 0.0, atol=1e-12)
    plan = np.full((4, 9), 1 / 9)  # rows of mass one, uniform: sqrt(Lq Lk) = 6 against the 9 keys
    np.testing.assert_allclose(pairhmm.plan_log_odds(plan, 0.05), 0.05 * math.log(6 / 9), atol=1e-12)
    plan[1, 2], plan[0, 0] = 0.9, 0.0
    odds = pairhmm.plan_log_odds(plan, 0.1)
    assert odds[1, 2] == pytest.approx(0.1 * math.log(0.9 * 6))
    assert np.isfinite(odds[0, 0]) and odds[0, 0] == pytest.approx(0.1 * math.log(1e-30 * 6))
    np.testing.assert_allclose(pairhmm.plan_log_odds(plan, 0.2), 2 * odds)


def test_local_posteriors_leave_the_flanks_and_global_ones_do_not():
    """A domain between random flanks: the local model puts next to no mass on the flanks,
    the global one must spread the flanks over something (end gaps cost)."""
    rng = np.random.default_rng(1)
    hmm = default_pairhmm().components[1] if hasattr(default_pairhmm(), "components") else default_pairhmm()
    domain = "".join(rng.choice(list(RESIDUES), 60))
    rand = lambda n: "".join(rng.choice(list(RESIDUES), n))
    a, b = rand(40) + domain + rand(40), domain  # b is a's middle: the truth is the diagonal 40 + i ~ i
    local, glob = (match_posteriors(hmm, a, b, local=flag) for flag in (True, False))
    truth = np.zeros_like(local)
    truth[40 + np.arange(60), np.arange(60)] = 1
    assert (local * truth).sum() / 60 > 0.9
    flanks = np.r_[0:40, 100:140]
    assert local[flanks].sum() < 0.05 * local.sum()
    assert local.sum() <= 60 + 1e-9 and local.min() >= 0
    # identical, unflanked sequences: both put the diagonal first (the local segment may leave
    # out an end residue whose pair scores below the background)
    same_l, same_g = (match_posteriors(hmm, domain, domain, local=flag) for flag in (True, False))
    assert np.diag(same_l).mean() > 0.95 and np.diag(same_g).min() > 0.9
    assert not np.allclose(local, glob)


def test_local_mode_of_the_posterior_decoder_uses_the_segment_model():
    """``--mode local`` with the posterior decoder mixes in the local posteriors: a domain
    inside unrelated flanks is aligned to the domain, not stretched across the flanks (before,
    local and global gave the same alignment: zero gap cost makes the MEA ends free anyway)."""
    rng = np.random.default_rng(3)
    a_dom = "".join(rng.choice(list(RESIDUES), 70))
    b_dom = "".join(c if rng.random() < 0.7 else rng.choice(list(RESIDUES)) for c in a_dom)  # 70 % identity
    rand = lambda n: "".join(rng.choice(list(RESIDUES), n))
    a, b = rand(90) + a_dom + rand(60), rand(50) + b_dom + rand(100)
    pp = PairPlan(np.zeros((len(a) + 1, len(b) + 1)))
    hmm_only = DecoderSettings.for_decoder("posterior").override(alpha=0.0, objective="f1")  # the shipped objective
    in_flanks = {}
    for mode in ("global", "local"):
        pairs = hmm_only.override(mode=mode).decode(pp, (a, b)).pairs
        in_flanks[mode] = int(np.sum((pairs[:, 0] < 90) | (pairs[:, 0] >= 160)))
        on_truth = np.sum(pairs[:, 1] - pairs[:, 0] == -40)
        assert on_truth >= 60, mode  # both find the domain ...
    assert in_flanks["local"] <= 5 < 30 <= in_flanks["global"]  # ... only local leaves the flanks


def test_no_switch_bars_adjacent_opposite_gaps():
    hmm = random_hmm(5, 1, gap_switch=0.0)
    expected, _ = brute_force(hmm, "ACW", "AW")
    np.testing.assert_allclose(match_posteriors(hmm, "ACW", "AW"), expected, rtol=1e-9, atol=1e-12)


def test_posteriors_are_probabilities_and_transpose_under_swap():
    rng = np.random.default_rng(0)
    a = "".join(rng.choice(list(RESIDUES), 60))
    b = a[5:40] + "".join(rng.choice(list(RESIDUES), 30))
    hmm = random_hmm(6, 2)
    post = match_posteriors(hmm, a, b)
    assert post.shape == (60, 65)
    assert post.min() >= 0 and post.max() <= 1
    assert post.sum(axis=1).max() <= 1 + 1e-9 and post.sum(axis=0).max() <= 1 + 1e-9
    np.testing.assert_allclose(match_posteriors(hmm, b, a), post.T, rtol=1e-8, atol=1e-12)


def test_fit_counts_the_reference_alignments():
    # one pair: AC-DE / A-WDE -> pairs (0,0) (2,2) (3,3); one segment with a gap in both
    records = [{"q_seq": "ACDE", "k_seq": "AWDE", "target": np.array([0, -1, 2, 3])}]
    hmm = fit(records, n_gap_types=1, pseudocount=1.0)
    n = len(RESIDUES)
    pairs = np.ones((n, n))
    for x, y in [("A", "A"), ("D", "D"), ("E", "E")]:
        pairs[RESIDUES.index(x), RESIDUES.index(y)] += 2  # both orders
    np.testing.assert_allclose(hmm.pair_probs, pairs / pairs.sum())
    counts = np.ones(n)
    for c in "ACDEAWDE":
        counts[RESIDUES.index(c)] += 1
    np.testing.assert_allclose(hmm.background, counts / counts.sum())
    # transitions out of M: start->(0,0), (2,2)->(3,3) are M->M; one opening (the C / W segment)
    assert hmm.gap_open[0] == pytest.approx((1 + 1) / (2 * 3 + 2))
    assert hmm.gap_switch == pytest.approx((1 + 1) / (2 + 2))  # one switch over two runs
    assert hmm.gap_extend[0] == pytest.approx(1e-3)  # runs of length 1: the EM floor


def test_gap_mixture_separates_short_and_long_runs():
    rng = np.random.default_rng(0)
    lengths = np.r_[rng.geometric(0.7, 4000), rng.geometric(0.05, 1000)]  # extend 0.3 and 0.95
    weights, extend = pairhmm._geometric_mixture(lengths, 2)
    np.testing.assert_allclose(extend, [0.3, 0.95], atol=0.03)
    np.testing.assert_allclose(weights, [0.8, 0.2], atol=0.03)


def test_shipped_parameters_load_and_round_trip():
    shipped = default_pairhmm()
    assert isinstance(shipped, pairhmm.PairHMMMixture) and shipped.edges == pairhmm.IDENTITY_EDGES
    again = pairhmm.load(shipped.to_json())
    np.testing.assert_array_equal(again.prior, shipped.prior)
    for hmm, back in zip(shipped.components, again.components):
        for name in ("pair_probs", "background", "gap_open", "gap_extend", "gap_switch"):
            np.testing.assert_array_equal(getattr(back, name), getattr(hmm, name))
        lo = hmm.log_odds()
        assert all(lo[k, k] > 0 for k in range(len(RESIDUES)))  # identities score above background
    # remote homologs substitute more: the identity score falls from the close to the remote bin
    diag = [np.mean(np.diag(c.log_odds())[:20]) for c in shipped.components]
    assert diag[0] < diag[1] < diag[2]
    with pytest.raises(ValueError, match="pair-HMM parameter file"):
        PairHMM.from_json('{"format": "other"}')


def test_500_by_500_under_a_second():
    rng = np.random.default_rng(1)
    a, b = ("".join(rng.choice(list(RESIDUES), 500)) for _ in range(2))
    hmm = default_pairhmm().components[0]  # one forward-backward (a mixture runs one per component)
    times = []
    for _ in range(3):  # the best of three: the machine is shared
        t0 = time.perf_counter()
        match_posteriors(hmm, a, b)
        times.append(time.perf_counter() - t0)
    assert min(times) < 1.0


# ---- the posterior decoder ------------------------------------------------------------------

def proper_alignments(lq: int, lk: int):
    """Every proper alignment (pairs strictly increasing in both indices) of lq x lk residues."""
    cells = [(i, j) for i in range(lq) for j in range(lk)]
    for n in range(min(lq, lk) + 1):
        for pairs in itertools.combinations(cells, n):
            if all(a[0] < b[0] and a[1] < b[1] for a, b in zip(pairs, pairs[1:])):
                yield pairs


def plan_for(a: str, b: str, seed: int):
    rng = np.random.default_rng(seed)
    full = np.zeros((len(a) + 1, len(b) + 1))
    full[:-1] = rng.dirichlet(np.ones(len(b) + 1), size=len(a))  # rows: real keys, then the dustbin
    return PairPlan(full)


@pytest.mark.parametrize("alpha, gap_cost, seed", [(0.0, 0.0, 0), (0.5, 0.0, 1), (0.3, 0.1, 2), (1.0, 0.05, 3)])
def test_posterior_decoder_maximizes_the_mixed_expected_accuracy(alpha, gap_cost, seed):
    a, b = "MKWVC", "MKVC"
    pp = plan_for(a, b, seed)
    mixed = alpha * pp.real + (1 - alpha) * match_posteriors(default_pairhmm(), a, b)
    objective = lambda pairs: sum(mixed[p] for p in pairs) - gap_cost * (len(a) + len(b) - 2 * len(pairs))
    best = max(objective(p) for p in proper_alignments(len(a), len(b)))
    aln = DecoderSettings(decoder="posterior", alpha=alpha, gap_cost=gap_cost).decode(pp, (a, b))
    assert objective([tuple(p) for p in aln.pairs]) == pytest.approx(best)
    assert aln.score == pytest.approx(best)


@pytest.mark.parametrize("alpha, power, seed", [(1.0, 0.5, 5), (0.5, 1.0, 6), (0.25, 2.0, 7)])
def test_plan_hmm_posterior_decoder_maximizes_the_expected_accuracy_of_the_brute_force_posteriors(
        alpha, power, seed):
    """With ``plan_power`` the plan enters as the posteriors of every path of the pair-HMM with
    the plan's odds as match emissions (summed by brute force here), not as it is."""
    a, b = "MKWVC", "MKVC"
    pp = plan_for(a, b, seed)
    hmm = random_hmm(seed, 2)
    plan_post, _ = brute_force(hmm, a, b, log_emissions=power * np.log(pp.real * math.sqrt(len(a) * len(b))))
    mixed = alpha * plan_post + (1 - alpha) * match_posteriors(hmm, a, b)
    best = max(sum(mixed[p] for p in pairs) for pairs in proper_alignments(len(a), len(b)))
    settings = DecoderSettings(decoder="posterior", alpha=alpha, plan_power=power)
    assert settings.uses_plan_hmm() and settings.uses_pairhmm() == (alpha < 1)
    aln = settings.decode(pp, (a, b), hmm=hmm)
    assert aln.score == pytest.approx(best)
    # the same with the posteriors given (as the batched path does)
    given = settings.decode(pp, (a, b), hmm=hmm, plan_posteriors=plan_post,
                            hmm_posteriors=match_posteriors(hmm, a, b))
    np.testing.assert_array_equal(given.pairs, aln.pairs)
    with pytest.raises(ValueError, match="plan_power"):
        DecoderSettings(decoder="posterior", plan_power=-0.1)


def test_posterior_decoder_uses_given_posteriors_and_needs_sequences():
    a, b = "MKWVCH", "MKVCH"
    pp = plan_for(a, b, 4)
    settings = DecoderSettings(decoder="posterior", alpha=0.0)
    planted = np.eye(6, 5)[::-1, ::-1] * 0.9  # a path the sequences' own posteriors would not give
    np.testing.assert_array_equal(settings.decode(pp, (a, b), hmm_posteriors=planted).pairs,
                                  [[i + 1, i] for i in range(5)])
    with pytest.raises(ValueError, match="needs the two sequences"):
        settings.decode(pp)
    with pytest.raises(ValueError, match="alpha"):
        DecoderSettings(decoder="posterior", alpha=1.5)


def test_old_decoding_files_still_load(tmp_path):
    (tmp_path / "decoding.json").write_text('{"decoder": "hybrid", "gap_open": 11.0, "gap_extend": 1.0, '
                                            '"plan_weight": 2.0, "end_gaps": true}')
    loaded = DecoderSettings.load(tmp_path)
    assert loaded.decoder == "hybrid" and loaded.alpha == DecoderSettings().alpha
    posterior = loaded.override(decoder="posterior", alpha=0.4)
    posterior.save(tmp_path)
    assert DecoderSettings.load(tmp_path) == posterior


# ---- the scripts ----------------------------------------------------------------------------

def run_script(name: str, argv: list[str]):
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name).main(argv)
    finally:
        sys.path.remove(str(SCRIPTS))


def test_fit_script_writes_a_parameter_file_with_its_recipe(dataset, tmp_path, capsys):
    out = tmp_path / "hmm.json"
    assert run_script("fit_pairhmm", ["--data", str(dataset), "--gap-types", "1", "--out", str(out)]) == 0
    hmm = pairhmm.load(out.read_text())
    assert isinstance(hmm, pairhmm.PairHMMMixture)  # one per identity bin the pairs fill
    assert all(c.n_gap_types == 1 for c in hmm.components)
    assert "--gap-types 1" in json.loads(out.read_text())["recipe"]
    assert str(out) in capsys.readouterr().out
    # the line printed names the edges fitted (sorted; an empty bin's edge dropped), as the file does
    assert run_script("fit_pairhmm", ["--data", str(dataset), "--identity-edges", "50,30,99.9", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)["edges"]
    assert printed == list(pairhmm.load(out.read_text()).edges) and printed == sorted(printed) and 99.9 not in printed
    assert run_script("fit_pairhmm", ["--data", str(dataset), "--identity-edges", "", "--out", str(out)]) == 0
    assert isinstance(pairhmm.load(out.read_text()), PairHMM)


@pytest.mark.slow
def test_bench_script_scores_every_method_on_the_same_pairs(dataset, capsys):
    assert run_script("bench_posterior", ["--data", str(dataset), "--split", "test", "--pairs", "3",
                                          "--alpha", "0.5", "--n-boot", "10"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    scored = {r["method"]: r for r in rows if "f1" in r}
    assert {"mea (plan)", "shipped", "nw", "posterior alpha=0.0 gap_cost=0.0"} <= set(scored)
    assert all(0 <= r["f1"] <= 1 and r["n_pairs"] == 3 for r in scored.values())
    assert {r["minus"] for r in rows if "minus" in r} >= {"nw", "shipped", "mea (plan)"}


def test_a_model_directory_uses_its_own_pairhmm(tmp_path):
    """A model with ``pairhmm.json`` decodes with those parameters, not the shipped ones."""
    import shutil

    from pfamalign.alignment import pairhmm
    from pfamalign.decoding import DecoderSettings
    from pfamalign.inference import Predictor, default_model_dir

    model = tmp_path / "model"
    shutil.copytree(default_model_dir(), model)
    shipped = pairhmm.default_pairhmm()
    first = shipped.components[0]
    own = pairhmm.PairHMM(first.pair_probs, first.background, first.gap_open * 0.2,
                          first.gap_extend, first.gap_switch)  # one model, far fewer gaps
    (model / pairhmm.MODEL_FILE).write_text(own.to_json())
    predictor = Predictor(model)
    assert np.array_equal(predictor.pairhmm.gap_open, own.gap_open)
    a, b = "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE", "MKVLSAGIVGLAQSPDRWKNLSTGYFAE"
    hmm_only = DecoderSettings(decoder="posterior", alpha=0.0)
    pp = next(predictor.plans([tuple(predictor.featurize([a, b]))]))
    mine = predictor.decode(pp, hmm_only, (a, b))
    expected = hmm_only.decode(pp, (a, b), hmm_posteriors=pairhmm.match_posteriors(own, a, b))
    assert np.array_equal(mine.pairs, expected.pairs)
    assert not np.allclose(pairhmm.match_posteriors(own, a, b), pairhmm.match_posteriors(shipped, a, b))


@pytest.mark.parametrize("bulk", [True, False])  # the numba engine, the XLA one
def test_pairs_past_the_fast_engines_range_get_the_reference_posteriors(bulk):
    """The fast engines scale each lattice row by its largest entry; a repeat's plan raised to
    an accepted power (or emissions near the accepted bound) span more than float64 holds in a
    row: they returned NaN (`align` failed: "plan must be finite") or wrong cells. Such a
    pair is now recomputed by the log-space reference; an ordinary pair keeps the fast answer."""
    from pfamalign.inference import Predictor

    predictor = Predictor()
    hmm = predictor.pairhmm
    rng = np.random.default_rng(0)
    seq = lambda n: "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), n))
    domain = seq(100)
    plan = np.full((200, 100), 1e-9)
    plan[np.arange(100), np.arange(100)] = plan[np.arange(100, 200), np.arange(100)] = 0.5  # a repeat
    repeat = (domain + domain, domain)
    ordinary = (seq(30), seq(25))
    emissions = [pairhmm.plan_log_odds(plan, 3.0), rng.normal(size=(30, 25))]
    got = predictor.hmm_posteriors([repeat, ordinary], log_emissions=emissions, bulk=bulk)
    for (a, b), emit, post in zip([repeat, ordinary], emissions, got):
        assert pairhmm.plausible_posteriors(post)
        np.testing.assert_allclose(post, match_posteriors(hmm, a, b, log_emissions=emit), atol=1e-9)
    # the case of the ±700 bound itself: emissions of 400 everywhere
    flat = predictor.hmm_posteriors([("ACDEFG", "ACDEF")], log_emissions=[np.full((6, 5), 400.0)], bulk=bulk)[0]
    np.testing.assert_allclose(flat, match_posteriors(hmm, "ACDEFG", "ACDEF", log_emissions=np.full((6, 5), 400.0)),
                               atol=1e-9)


def test_plausible_posteriors_holds_a_residue_to_one_match():
    assert pairhmm.plausible_posteriors(np.array([[0.5, 0.5], [0.0, 0.5]]))
    assert not pairhmm.plausible_posteriors(np.array([[0.7, 0.5], [0.0, 0.0]]))  # a row past 1
    assert not pairhmm.plausible_posteriors(np.array([[0.7, 0.0], [0.6, 0.0]]))  # a column past 1
    assert not pairhmm.plausible_posteriors(np.array([[np.nan, 0.0]]))
    assert not pairhmm.plausible_posteriors(np.array([[-0.1, 0.0]]))


# ---- the identity mixture -------------------------------------------------------------------

def _mixture(seed: int) -> pairhmm.PairHMMMixture:
    shared = random_hmm(seed, 2).background
    parts = [dataclasses.replace(random_hmm(seed + 10 * k, 2), background=shared) for k in range(3)]
    return pairhmm.PairHMMMixture(components=parts, prior=[0.5, 0.3, 0.2], edges=(30, 50))


@pytest.mark.parametrize("a, b, seed", [("AC", "W", 0), ("MKV", "MKLV", 1), ("WYCH", "HCY", 2)])
def test_mixture_posteriors_are_the_brute_force_bayes_mixture(a, b, seed):
    # P(i ~ j) = sum_k prior_k Z_k P_k(i ~ j) / sum_k prior_k Z_k, every Z_k and P_k by enumeration
    mix = _mixture(seed)
    solved = [brute_force(c, a, b) for c in mix.components]
    z = np.array([total for _, total in solved]) * mix.prior
    expected = sum(zk / z.sum() * post for zk, (post, _) in zip(z, solved))
    np.testing.assert_allclose(match_posteriors(mix, a, b), expected, rtol=1e-9, atol=1e-12)
    assert not np.allclose(expected, solved[0][0])  # the mixture is not one of its parts


def test_a_single_pair_hmm_is_the_one_component_mixture_and_weights_batch_over_pairs():
    # the engines never branch on the kind: one model mixes as a mixture of itself, exactly
    single, mix = random_hmm(3, 2), _mixture(3)
    post = np.random.default_rng(0).random((3, 4))
    assert single.components == (single,) and single.weights([-7.5]).tolist() == [1.0]
    assert single.log_z([-7.5]) == -7.5 and single.mix([post], [-7.5]) is post
    log_z = np.array([[-3.0, -1.0, -2.0], [0.5, -4.0, 2.0]])  # [pairs, components]
    batched = mix.weights(log_z)
    np.testing.assert_allclose(batched, [mix.weights(row) for row in log_z], rtol=0, atol=0)
    np.testing.assert_allclose(batched.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(batched[0], mix.prior * np.exp(log_z[0]) / (mix.prior * np.exp(log_z[0])).sum(),
                               rtol=1e-12)


@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("a, b, seed", [("AC", "W", 0), ("MKV", "MKLV", 1), ("WYCH", "HCY", 2)])
def test_log_likelihood_ratio_is_the_brute_force_sum_over_paths(a, b, seed, local):
    # one model: log of the enumerated total; a mixture: log sum_k prior_k Z_k
    single = random_hmm(seed, 2)
    assert pairhmm.log_likelihood_ratio(single, a, b, local=local) == pytest.approx(
        math.log(brute_force(single, a, b, local=local)[1]), rel=1e-10)
    mix = _mixture(seed)
    z = np.array([brute_force(c, a, b, local=local)[1] for c in mix.components])
    assert pairhmm.log_likelihood_ratio(mix, a, b, local=local) == pytest.approx(
        math.log((mix.prior * z).sum()), rel=1e-10)
    with pytest.raises(ValueError, match="non-empty"):
        pairhmm.log_likelihood_ratio(mix, a, "", local=local)


def test_mixture_json_round_trips_and_load_tells_the_kinds_apart(tmp_path):
    mix = _mixture(3)
    again = pairhmm.load(mix.to_json("recipe"))
    assert isinstance(again, pairhmm.PairHMMMixture) and again.edges == (30.0, 50.0)
    np.testing.assert_array_equal(again.prior, mix.prior)
    np.testing.assert_array_equal(again.components[2].pair_probs, mix.components[2].pair_probs)
    single = random_hmm(0, 1)
    assert isinstance(pairhmm.load(single.to_json()), PairHMM)
    (tmp_path / pairhmm.MODEL_FILE).write_text(mix.to_json())
    assert isinstance(pairhmm.model_pairhmm(tmp_path), pairhmm.PairHMMMixture)
    with pytest.raises(ValueError, match="share one background"):
        pairhmm.PairHMMMixture(components=[random_hmm(0, 1), random_hmm(1, 1)], prior=[0.5, 0.5])
    with pytest.raises(ValueError, match="prior"):
        pairhmm.PairHMMMixture(components=[single], prior=[0.5])


def _record(seq_a, seq_b, target, pid):
    return {"q_seq": seq_a, "k_seq": seq_b, "target": np.asarray(target), "pid": pid}


def test_fit_mixture_counts_each_identity_bin_apart_over_one_background():
    rng = np.random.default_rng(0)
    recs = []
    for n in range(30):
        a = "".join(rng.choice(list(RESIDUES), 12))
        b = a[:4] + "".join(rng.choice(list(RESIDUES), 8)) if n % 3 == 0 else a
        recs.append(_record(a, b, np.r_[np.arange(10), [-1, -1]], [20.0, 40.0, 80.0][n % 3]))
    mix = pairhmm.fit_mixture(recs, edges=(30, 50))
    assert len(mix.components) == 3
    np.testing.assert_allclose(mix.prior, [1 / 3] * 3)
    overall = fit(recs)
    for k, pid in enumerate([20.0, 40.0, 80.0]):
        alone = fit([r for r in recs if r["pid"] == pid])
        np.testing.assert_allclose(mix.components[k].pair_probs, alone.pair_probs)
        np.testing.assert_allclose(mix.components[k].background, overall.background)
    # no pair between 30 and 50 % identity: that bin merges with a neighbour
    merged = pairhmm.fit_mixture([r for r in recs if r["pid"] != 40.0], edges=(30, 50))
    assert len(merged.components) == 2 and len(merged.edges) == 1
    # nothing to count in a bin (its pairs have no gaps): it merges too
    a = "".join(rng.choice(list(RESIDUES), 12))
    gapless = [_record(a, a, np.arange(12), 90.0) for _ in range(3)]
    merged = pairhmm.fit_mixture([r for r in recs if r["pid"] != 80.0] + gapless, edges=(30, 50))
    assert len(merged.components) == 2 and merged.edges == (30.0,)
    assert merged.prior[1] == pytest.approx(13 / 23)  # the 30-50 % pairs and the gapless ones
