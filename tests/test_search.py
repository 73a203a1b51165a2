"""``pfamalign search``: the Gumbel fit and E-values, the BLAST tabular columns, and the command
end to end on real Pfam sequences with the shipped model."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import pfamalign
from pfamalign.alignment.formats import AlignmentRecord
from pfamalign.alignment.pairhmm import default_pairhmm, log_likelihood_ratio
from pfamalign.cli import main
from pfamalign import search as lib
from pfamalign.search import COLUMNS, Gumbel, hit_columns, shuffled

SEED = pathlib.Path(__file__).resolve().parent / "data" / "pfam_seed"


# ---- statistics ------------------------------------------------------------------------------


def test_gumbel_fit_recovers_known_parameters_and_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    mu, beta, n = 12.0, 2.5, 20000
    x = rng.gumbel(mu, beta, n)
    fit = Gumbel.fit(x)
    # ML standard errors of the Gumbel law: sd(mu) ~ 1.05 beta / sqrt(n), sd(beta) ~ 0.78 beta / sqrt(n)
    assert abs(fit.mu - mu) < 5 * 1.05 * beta / math.sqrt(n)
    assert abs(1 / fit.lam - beta) < 5 * 0.78 * beta / math.sqrt(n)
    ref_mu, ref_beta = stats.gumbel_r.fit(x)  # an independent optimizer on the same likelihood
    assert fit.mu == pytest.approx(ref_mu, rel=1e-6) and 1 / fit.lam == pytest.approx(ref_beta, rel=1e-6)
    s = np.linspace(5, 60, 12)
    np.testing.assert_allclose(fit.sf(s), stats.gumbel_r.sf(s, fit.mu, 1 / fit.lam), rtol=1e-9)


def test_bits_and_evalue_agree_in_the_tail():
    null = Gumbel(mu=3.0, lam=1.7)
    s = np.array([10.0, 15.0, 20.0])
    n = 1000
    np.testing.assert_allclose(n * null.sf(s), n * 2.0 ** -null.bits(s), rtol=1e-4)


def test_the_tail_never_falls_faster_than_exp_minus_s():
    """``tail_from``: past the score s0 where the law leaves ``tail_from`` above it, P(S >= s)
    is the larger of the law's and tail_from e^-(s - s0) (slope TAIL_LAMBDA = 1 per nat);
    continuous at s0, the plain law before it, unchanged for lam <= 1; bits and E-values
    agree in the tail, and a far score has a finite bit score and no warning."""
    steep, p0 = Gumbel(mu=2.0, lam=2.5, slope=-0.01, lengths=(50.0, 300.0)), lib.TAIL_FROM
    tailed = dataclasses.replace(steep, tail_from=p0)
    n = 120
    s0 = float(steep.location(n)) - math.log(-math.log1p(-p0)) / steep.lam
    assert float(tailed.sf(s0, n)) == pytest.approx(p0, rel=1e-9)
    before = np.array([s0 - 3.0, s0 - 0.5, s0])
    np.testing.assert_allclose(tailed.sf(before, n), steep.sf(before, n), rtol=1e-12)
    after = s0 + np.array([0.5, 3.0, 20.0, 200.0])
    np.testing.assert_allclose(tailed.sf(after, n), p0 * np.exp(-lib.TAIL_LAMBDA * (after - s0)), rtol=1e-6)
    assert np.all(steep.sf(after, n) < tailed.sf(after, n))  # the plain law's tail is the lighter
    np.testing.assert_allclose(1000 * tailed.sf(after, n), 1000 * 2.0 ** -tailed.bits(after, n), rtol=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        far = tailed.bits(np.array([s0 + 800.0]), n)  # sf underflows: the bits do not
    assert far[0] == pytest.approx((800.0 - math.log(p0)) / math.log(2), rel=1e-9)
    flat = Gumbel(mu=2.0, lam=0.6)  # a tail heavier than e^-s already: unchanged
    x = np.linspace(0, 60, 13)
    np.testing.assert_array_equal(dataclasses.replace(flat, tail_from=p0).sf(x), flat.sf(x))


def test_local_evalues_of_real_forward_scores_hold_in_the_tail():
    """Local-mode log-odds of real query residues against shuffled Pfam sequences (every hit
    false; 4 queries, 2,500 subjects; the default composition shift): a Gumbel fitted to 50
    decoys describes their body, not their exponential tail, and its E-values run far below
    the truth; with the tail the null hits at E <= 1 and 0.1 stay near what the E-values
    allow (the seeds are fixed)."""
    from pfamalign.batch import BatchErrors
    from pfamalign.inference import Predictor
    from pfamalign.inputs import FastaRecord
    from pfamalign.pipelines.stockholm import read_families

    seqs = [s.replace("-", "").replace(".", "").upper() for f in read_families(sorted(SEED.glob("*.sto")))
            for s in f.rows]
    seqs = [s for s in seqs if 30 <= len(s) <= 200]
    rng = np.random.default_rng(4)
    queries = [FastaRecord(f"q{i}", seqs[i], "") for i in rng.choice(len(seqs), 4, replace=False)]
    db = [FastaRecord(f"s{j}", lib.shuffled(seqs[i], rng), "")
          for j, i in enumerate(rng.integers(len(seqs), size=2500))]
    predictor = Predictor()
    settings = dataclasses.replace(predictor.decoding, mode="local")
    counts = {}
    for tail in (lib.TAIL_FROM, None):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lib, "TAIL_FROM", tail)
            e = [h.columns["evalue"] for r in lib.search(predictor, queries, db, settings, BatchErrors(),
                                                         evalue=1, max_candidates=0, max_hits=None)
                 for h in r.hits]
        counts[tail] = [sum(x <= t for x in e) for t in (1.0, 0.1)]
    # allowed 4 and 0.4: Poisson(4) exceeds 10 with p = 0.003, Poisson(0.4) exceeds 2 with p = 0.008
    # (measured 7 and 0; the plain law's 28 and 9)
    assert counts[lib.TAIL_FROM][0] <= 10 and counts[lib.TAIL_FROM][1] <= 2, counts
    assert counts[None][1] >= 3 * max(counts[lib.TAIL_FROM][1], 2), counts  # the plain law: optimistic


# [7, 7 + 1e-14, 7]: equal scores as a sum's rounding leaves them (a 1-residue query against
# shuffles of itself), not a spread to fit
@pytest.mark.parametrize("scores", [[1.0], [2.0, 2.0, 2.0], [7.0, 7.0 + 1e-14, 7.0], [1.0, float("nan"), 3.0]])
def test_gumbel_fit_refuses_unusable_scores(scores):
    with pytest.raises(ValueError):
        Gumbel.fit(scores)


def test_evalues_of_null_scores_are_calibrated():
    """Fit on 200 decoys, score 1000 fresh null draws as the database: the number of null hits
    with E <= x averages about x (the fit's own noise makes the far tail slightly liberal)."""
    rng = np.random.default_rng(1)
    counts = {1: [], 10: [], 100: []}
    for _ in range(300):
        null = Gumbel.fit(rng.gumbel(3.0, 0.7, 200))
        evalue = 1000 * null.sf(rng.gumbel(3.0, 0.7, 1000))
        for x in counts:
            counts[x].append((evalue <= x).sum())
    assert 0.8 < np.mean(counts[1]) < 1.4
    assert 9.0 < np.mean(counts[10]) < 11.5
    assert 95 < np.mean(counts[100]) < 106


def _length_null(rng, size, mu=40.0, slope=-0.05, beta=3.0):
    """Null scores whose location falls with the subject's length, as global log-odds do."""
    n = rng.integers(50, 400, size).astype(float)
    return rng.gumbel(mu + slope * n, beta), n


def test_gumbel_fit_with_lengths_recovers_the_slope_and_matches_a_direct_optimizer():
    optimize = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(2)
    x, n = _length_null(rng, 20000)
    fit = Gumbel.fit(x, n)
    assert fit.slope == pytest.approx(-0.05, abs=0.002)
    assert fit.mu == pytest.approx(40.0, abs=0.3) and 1 / fit.lam == pytest.approx(3.0, rel=0.03)
    assert fit.lengths == (n.min(), n.max())

    def nll(p):  # the same likelihood over all three parameters at once
        z = (x - p[0] - p[1] * n) / p[2]
        return np.sum(np.log(p[2]) + z + np.exp(-z))

    ref = optimize.minimize(nll, [35.0, 0.0, 2.0], method="Nelder-Mead",
                            options={"xatol": 1e-9, "fatol": 1e-9, "maxiter": 20000}).x
    np.testing.assert_allclose([fit.mu, fit.slope, 1 / fit.lam], ref, rtol=1e-4)
    assert Gumbel.fit(x, np.full_like(n, 100.0)).slope == 0  # one length: no slope to fit


def test_evalues_of_null_scores_with_lengths_are_calibrated_and_sharper_than_a_pooled_fit():
    """Database null scores at each subject length: with the fitted slope, null hits at E <= x
    average about x (over all subjects, and per subject among the short ones; the fit's noise
    makes the far tail slightly liberal, as for the plain fit above, more so with a third
    parameter). A fit without lengths absorbs the length effect into a wider law: safe, but
    blunt -- a score 30 nats above its length's null location (10 scales) gets an E-value
    orders of magnitude larger."""
    rng = np.random.default_rng(3)
    counts = {"all_1": [], "all_10": [], "short_1": []}
    blunt = []
    for _ in range(300):
        decoys, lengths = _length_null(rng, 200)
        x, n = _length_null(rng, 1000)
        short = n < 150
        fit = Gumbel.fit(decoys, lengths)
        e = 1000 * fit.sf(x, n)
        counts["all_1"].append((e <= 1).sum())
        counts["all_10"].append((e <= 10).sum())
        counts["short_1"].append(((e <= 1) & short).sum() / short.mean())  # as if all were short
        homolog = 40.0 - 0.05 * 300 + 30.0
        blunt.append(Gumbel.fit(decoys).sf(homolog) / fit.sf(homolog, 300))
    mean = {k: np.mean(v) for k, v in counts.items()}
    assert 0.8 < mean["all_1"] < 1.6 and 9.0 < mean["all_10"] < 12.5, mean
    assert 0.7 < mean["short_1"] < 2.0, mean
    assert np.median(blunt) > 100


def test_location_outside_the_fitted_lengths_never_lowers_the_evalue():
    falling = Gumbel(mu=40.0, lam=0.5, slope=-0.05, lengths=(50.0, 400.0))
    assert falling.location(200) == pytest.approx(30.0)  # the line inside the range
    assert falling.location(2000) == pytest.approx(falling.location(400))  # not extrapolated down
    assert falling.location(10) == pytest.approx(39.5)  # extrapolated up: the line
    rising = Gumbel(mu=0.0, lam=0.5, slope=0.05, lengths=(50.0, 400.0))
    assert rising.location(10) == pytest.approx(rising.location(50))
    assert rising.location(1000) == pytest.approx(50.0)
    s = np.array([35.0, 45.0])
    assert np.all(falling.sf(s, 2000) >= falling.sf(s, 400))


def test_shuffled_keeps_length_and_composition():
    seq = "MKVLAAGIVGLLLAWWC"
    out = shuffled(seq, np.random.default_rng(0))
    assert sorted(out) == sorted(seq) and out != seq


# ---- hit table -------------------------------------------------------------------------------


def _independent_columns(rec: AlignmentRecord) -> dict:
    """The BLAST columns read off the gapped rows: trim to the first..last aligned column,
    then count columns, identities, mismatches and gap runs."""
    row_a, row_b = rec.gapped()
    both = [n for n, (x, y) in enumerate(zip(row_a, row_b)) if x != "-" and y != "-"]
    a, b = row_a[both[0]: both[-1] + 1], row_b[both[0]: both[-1] + 1]
    runs = sum(1 for row in (a, b) for n, c in enumerate(row) if c == "-" and (n == 0 or row[n - 1] != "-"))
    same = sum(x == y and x != "-" for x, y in zip(a, b))
    aligned = sum(x != "-" and y != "-" for x, y in zip(a, b))
    return {"length": len(a), "pident": 100 * same / len(a), "mismatch": aligned - same, "gapopen": runs,
            "qstart": len(row_a[: both[0]].replace("-", "")) + 1,
            "qend": len(row_a[: both[-1] + 1].replace("-", "")),
            "sstart": len(row_b[: both[0]].replace("-", "")) + 1,
            "send": len(row_b[: both[-1] + 1].replace("-", ""))}


def test_composition_shift_by_hand():
    null = lib.Gumbel(mu=2.0, lam=0.5)  # mean 2 + 0.5772 / 0.5
    x = np.array([9.0, 11.0] * 5)  # mean 10, sd (ddof 1) 1.0541, 10 shuffles
    assert lib.composition_shift(null, x, 100) == pytest.approx(10 - (2 + 2 * 0.5772157) - 3 * 1.0540926 / np.sqrt(10))
    assert lib.composition_shift(null, x - 7.0, 100) == 0.0  # below the null's mean: nothing charged
    sloped = lib.Gumbel(mu=2.0, lam=0.5, slope=-0.01, lengths=(50.0, 150.0))  # location at 100: 1
    assert lib.composition_shift(sloped, x, 100) == pytest.approx(lib.composition_shift(null, x, 100) + 1.0)
    # outside the fitted lengths the shift is measured against the lower location (the line,
    # not its clamp): a higher one would understate the shift and lower the E-value
    low = sloped.location(1000, lower=True)
    assert low == pytest.approx(-8.0) and low < sloped.location(1000)
    assert lib.composition_shift(sloped, x, 1000) == pytest.approx(lib.composition_shift(null, x, 100) + 10.0)
    assert lib.composition_shift(sloped, x, 10) == pytest.approx(lib.composition_shift(sloped, x, 50))


def test_a_subject_of_the_querys_biased_composition_is_not_reported_as_related():
    """Two unrelated sequences of the same biased composition (membrane-like: I, L, V, F, A,
    M, G, W rich) score high against each other where the decoys, shuffles of a database of
    ordinary composition, do not: without the composition shift the unrelated one looks
    related (E <= 0.001); with it, it does not (E > 0.1), and a real homolog stays far below.
    Each E-value is the corrected null's at the score less the subject's shift."""
    from pfamalign.batch import BatchErrors
    from pfamalign.inference import Predictor
    from pfamalign.inputs import FastaRecord

    rng = np.random.default_rng(1)
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    biased = np.array([4.0 if a in "ILVFAMGW" else 0.3 for a in letters])
    biased /= biased.sum()

    def draw(n, p=None):
        return "".join(rng.choice(letters, n, p=p))

    query = draw(200, biased)
    homolog = "".join(c if rng.random() > 0.5 else rng.choice(letters, p=biased) for c in query)
    db = [FastaRecord(f"bg{i}", draw(int(rng.integers(150, 250))), "") for i in range(60)]
    db += [FastaRecord("unrelated", draw(200, biased), ""), FastaRecord("homolog", homolog, "")]
    predictor = Predictor()
    evalues, hits = {}, {}
    for correct in (False, True):
        (result,) = lib.search(predictor, [FastaRecord("q", query, "")], db, predictor.decoding, BatchErrors(),
                               decoys=30, evalue=None, correct_composition=correct)
        evalues[correct] = {h.columns["sseqid"]: h.columns["evalue"] for h in result.hits}
        hits[correct] = {h.columns["sseqid"]: h for h in result.hits}
        for h in result.hits:
            n = len(h.record.seq_b)
            assert h.columns["evalue"] == pytest.approx(len(db) * result.null.sf(h.score - h.shift, n), rel=1e-9)
    assert evalues[False]["unrelated"] <= 1e-3 and evalues[True]["unrelated"] > 0.1, evalues
    assert evalues[True]["homolog"] < 1e-10
    assert hits[True]["unrelated"].shift > 0 and not any(h.shift for h in hits[False].values())



def test_max_hits_reports_the_best_hits_after_the_composition_shift(tmp_path):
    """``max_hits=N`` reports the N best by the shifted E-value: the first N rows of the
    unlimited search. A query with a charged (E/K-rich) tail against two subjects of that
    composition and RRM relatives: the charged subjects rank high before their shift and fall
    behind a relative after it, so choosing the N before the shift would report a worse hit."""
    from pfamalign.batch import BatchErrors
    from pfamalign.inference import Predictor
    from pfamalign.inputs import FastaRecord

    family = _family_fasta(tmp_path / "rrm.fasta", {"PF00076.sto": 4})
    rng = np.random.default_rng(5)

    def draw(n, letters="ACDEFGHIKLMNPQRSTVWY"):
        return "".join(rng.choice(list(letters), size=n))

    charged = lambda n: draw(n, "EKEKEKRDQ")
    query = FastaRecord("query", family[1][1] + charged(40), "")
    db = [FastaRecord("LC1", draw(30) + charged(90), ""), FastaRecord("LC2", charged(100) + draw(20), "")]
    db += [FastaRecord(name.split("|")[0], seq, "") for name, seq in family[:1] + family[2:4]]
    db += [FastaRecord(f"r{i}", draw(int(n)), "") for i, n in enumerate(rng.integers(60, 200, size=20))]
    predictor = Predictor()
    settings = dataclasses.replace(predictor.decoding, mode="local")

    def hits(max_hits):
        (result,) = lib.search(predictor, [query], db, settings, BatchErrors(), evalue=None, max_hits=max_hits)
        return [(h.columns["sseqid"], h.columns["evalue"], h.score, h.shift) for h in result.hits]

    every = hits(None)
    assert [h[1] for h in every] == sorted(h[1] for h in every)
    # the test bites: a charged subject that led a relative before its shift falls behind it
    assert any(a[2] > b[2] and a[0].startswith("LC") and a[3] > 0 for i, a in enumerate(every)
               for b in every[:i])
    for n in (1, 2, 3):
        assert hits(n) == every[:n], n

def test_hit_columns_by_hand():
    # A: MKVLAAGIV, B: WKVLGIVW; pairs K-K V-V L-L | (A,A unaligned) G-G I-I V-V
    rec = AlignmentRecord("MKVLAAGIV", "WKVLGIVW", np.array([[1, 1], [2, 2], [3, 3], [6, 4], [7, 5], [8, 6]]),
                          id_a="a", id_b="b", confidence=np.full(6, 0.5))
    cols = hit_columns(rec)
    assert {k: cols[k] for k in ("qstart", "qend", "sstart", "send", "length", "mismatch", "gapopen")} == {
        "qstart": 2, "qend": 9, "sstart": 2, "send": 7, "length": 8, "mismatch": 0, "gapopen": 1}
    assert cols["pident"] == pytest.approx(75.0) and cols["mean_confidence"] == pytest.approx(0.5)


def test_hit_columns_match_the_gapped_rows_on_random_alignments():
    rng = np.random.default_rng(3)
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    for _ in range(200):
        la, lb = rng.integers(3, 40, size=2)
        seq_a, seq_b = "".join(rng.choice(letters[:4], la)), "".join(rng.choice(letters[:4], lb))
        n = rng.integers(1, min(la, lb) + 1)
        pairs = np.stack([np.sort(rng.choice(la, n, replace=False)), np.sort(rng.choice(lb, n, replace=False))], 1)
        rec = AlignmentRecord(seq_a, seq_b, pairs, confidence=rng.random(n))
        cols, ref = hit_columns(rec), _independent_columns(rec)
        assert {k: cols[k] for k in ref} == pytest.approx(ref)
    empty = AlignmentRecord("MKV", "MKV", np.zeros((0, 2), int))
    assert hit_columns(empty) is None


# ---- the command -----------------------------------------------------------------------------


def _family_fasta(path: pathlib.Path, files: dict[str, int]) -> list[tuple[str, str]]:
    """The first n rows (de-gapped) of each Stockholm fixture, named ID|FAMILY."""
    from pfamalign.pipelines.pairs import family_arrays
    from pfamalign.pipelines.stockholm import read_families

    records = []
    for name, n in files.items():
        for family in read_families([str(SEED / name)]):
            fa = family_arrays(family)
            records += [(f"{family.seq_ids[i]}|{name[:7]}", fa.residues[i]) for i in range(n)]
    path.write_text("".join(f">{i}\n{s}\n" for i, s in records))
    return records


@pytest.fixture(scope="module")
def fastas(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search")
    queries = _family_fasta(tmp / "q.fasta", {"PF00041.sto": 1, "PF00076.sto": 1})
    db = _family_fasta(tmp / "db.fasta", {"PF00041.sto": 4, "PF00076.sto": 4})
    return tmp, queries, db


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = text.splitlines()
    comments = [x for x in lines if x.startswith("#")]
    return comments, [x.split("\t") for x in lines if x and not x.startswith("#")]


def test_search_writes_the_blast_hit_table(fastas):
    tmp, queries, db = fastas
    out = tmp / "hits.tsv"
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "10",
                                    "-o", str(out), "--evalue", "1000"])
    assert res.exit_code == 0, res.output
    comments, rows = _table(out.read_text())
    assert comments[-1] == "# Fields: " + ", ".join(COLUMNS)
    provenance = {line.split(":")[0] for line in comments[:-1]}
    assert provenance == {"# Version", "# Model", "# Decoder"}  # what produced the table
    lengths = dict(queries + db)
    assert {r[0] for r in rows} == {q for q, _ in queries}
    for qid in {r[0] for r in rows}:
        mine = [r for r in rows if r[0] == qid]
        assert len(mine) == len(db)  # each query against each database sequence (the query is in db too)
        bits = [float(r[11]) for r in mine]
        evalues = [float(r[10]) for r in mine]
        assert bits == sorted(bits, reverse=True) and evalues == sorted(evalues)
        for r in mine:
            assert len(r) == len(COLUMNS)
            qstart, qend, sstart, send = map(int, r[6:10])
            assert 1 <= qstart <= qend <= len(lengths[r[0]]) and 1 <= sstart <= send <= len(lengths[r[1]])
            assert 0 <= float(r[2]) <= 100 and 0 <= float(r[12]) <= 1
        # the best hit of a query shares its family (the query itself is in the database)
        assert mine[0][1] == qid and float(mine[0][2]) == 100.0


def test_search_progress_counts_its_shuffles_and_hits_too(fastas, monkeypatch):
    """Off a terminal, progress lines for each stage (every LINE_SECONDS: 0 here): a long
    search printed nothing while it shuffled the subjects it charged and aligned its hits
    (about 100 s at 3,000 sequences), its bar at 100 %."""
    from pfamalign.pipelines import progress

    monkeypatch.setattr(progress, "LINE_SECONDS", 0)
    tmp, _, _ = fastas
    args = ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "10", "--max-hits", "2"]
    stages = lambda res: {line.split(":")[0] for line in res.stderr.splitlines() if ":" in line}
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert {"scoring pairs", "composition shuffles", "aligning hits"} <= stages(res), res.stderr
    last_hits = [line for line in res.stderr.splitlines() if line.startswith("aligning hits")][-1]
    assert last_hits.startswith("aligning hits: 4,")  # 2 queries x --max-hits 2
    res = CliRunner().invoke(main, [*args, "--no-composition-shift"])
    assert res.exit_code == 0 and "composition shuffles" not in stages(res), res.stderr


def test_no_composition_shift_is_the_uncorrected_search(fastas):
    """--no-composition-shift reports the same pairs with the uncorrected E-values (as
    ``search(correct_composition=False)``); by default some hit is charged a shift."""
    tmp, _, _ = fastas
    args = ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "10", "--evalue", "1000", "-f", "json"]
    hits = {}
    for flag in ("--composition-shift", "--no-composition-shift"):
        res = CliRunner().invoke(main, args + [flag])
        assert res.exit_code == 0, res.output
        hits[flag] = {(h["qseqid"], h["sseqid"]): h["evalue"] for h in map(json.loads, res.stdout.splitlines())}
    assert hits["--composition-shift"].keys() == hits["--no-composition-shift"].keys()
    assert hits["--composition-shift"] != hits["--no-composition-shift"]


def test_search_json_alignment_matches_its_columns_and_limits_apply(fastas):
    tmp, queries, db = fastas
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "10",
                                    "-f", "json", "--max-hits", "2", "--evalue", "1000"])
    assert res.exit_code == 0, res.output
    hits = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(hits) == 2 * len(queries)
    for hit in hits:
        rec = AlignmentRecord(hit["alignment"]["seq_a"], hit["alignment"]["seq_b"],
                              np.array(hit["alignment"]["pairs"]).reshape(-1, 2))
        assert {k: hit[k] for k in ("qstart", "qend", "length", "gapopen")} == {
            k: hit_columns(rec)[k] for k in ("qstart", "qend", "length", "gapopen")}
        # the hit's score is the pair's homology log-odds under the shipped pair-HMM, not
        # the decoder's objective (the alignment's own score)
        assert hit["score"] == pytest.approx(log_likelihood_ratio(default_pairhmm(), hit["alignment"]["seq_a"],
                                                                  hit["alignment"]["seq_b"]), rel=1e-9)
        assert hit["score"] != pytest.approx(hit["alignment"]["score"])
        assert hit["shift"] >= 0  # the composition shift the E-value charged
    none = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "10",
                                     "--evalue", "0"])
    assert none.exit_code == 0 and _table(none.stdout)[1] == []


def test_search_all_vs_all_skips_self_and_reads_stdin(fastas):
    tmp, queries, db = fastas
    text = "".join(f">{i}\n{s}\n" for i, s in queries + db[1:2])  # three distinct sequences
    res = CliRunner().invoke(main, ["search", "-", "--all-vs-all", "--decoys", "10", "--evalue", "1000"], input=text)
    assert res.exit_code == 0, res.output
    rows = _table(res.stdout)[1]
    assert len(rows) == 3 * 2 and all(r[0] != r[1] for r in rows)


def test_all_vs_all_evalues_count_the_other_sequences(fastas):
    """All against all, a query's database is the N - 1 other sequences (docs/design.md): its
    ``n_database``, and every hit's E-value N - 1 times the null's tail at the hit's shifted
    score (a database of N would make each 4/3 times larger here); against a database of N, N
    times."""
    _, queries, db = fastas
    seqs = [s for _, s in queries + db[:2]]  # four distinct sequences
    aligner = pfamalign.PairAligner()
    results = list(aligner.search(seqs, evalue=1000, decoys=10, max_candidates=None))
    against_all = list(aligner.search(seqs[:1], seqs, evalue=1000, decoys=10, max_candidates=None))
    assert len(results) == len(seqs) and sum(len(r.hits) for r in results) >= len(seqs)
    for r, n in [(r, len(seqs) - 1) for r in results] + [(against_all[0], len(seqs))]:
        assert r.n_database == n and r.hits
        for hit in r.hits:
            want = n * r.null.sf(hit.score - hit.shift, len(hit.record.seq_b))
            assert hit.columns["evalue"] == pytest.approx(float(want), rel=1e-12)


def test_search_reports_bad_records_and_goes_on_unless_strict(fastas):
    tmp, queries, db = fastas
    bad_db = tmp / "bad_db.fasta"
    bad_db.write_text((tmp / "db.fasta").read_text() + ">broken\nMKV*LL\n>fine\nMKVLAAGIVGLLLA\n")
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(bad_db), "--decoys", "10",
                                    "--evalue", "1000"])
    line = 2 * len(db) + 1
    assert res.exit_code == 1
    assert f"Error: skipped {bad_db}:{line}: record 'broken'" in res.stderr
    assert f"# error: {bad_db}:{line}: record 'broken'" in res.stdout
    rows = _table(res.stdout)[1]
    assert len(rows) == len(queries) * (len(db) + 1) and "fine" in {r[1] for r in rows}
    out = tmp / "strict.tsv"
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(bad_db), "--strict", "-o", str(out)])
    assert res.exit_code == 2 and f"{bad_db}:{line}" in res.stderr and not out.exists()


def test_search_reports_an_overlong_record_once_with_the_predictors_message(fastas):
    tmp, queries, db = fastas
    longest = max(len(s) for _, s in queries + db)
    long_db = tmp / "long_db.fasta"
    long_db.write_text((tmp / "db.fasta").read_text() + f">long\n{'A' * (longest + 1)}\n")
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(long_db), "--decoys", "10",
                                    "--evalue", "1000", "--max-length", str(longest)])
    assert res.exit_code == 1
    # the check and its words are the predictor's (the one made before every plan), reported
    # once for the record, not once per query
    message = f"long: sequence of {longest + 1} residues is longer than the limit of {longest} residues"
    assert res.stderr.count(message) == 1 and res.stdout.count(message) == 1
    rows = _table(res.stdout)[1]
    assert len(rows) == len(queries) * len(db) and "long" not in {r[1] for r in rows}
    # one file as QUERY and DATABASE: read and checked once, so its bad record is told once
    res = CliRunner().invoke(main, ["search", str(long_db), str(long_db), "--decoys", "10",
                                    "--evalue", "1000", "--max-length", str(longest)])
    assert res.exit_code == 1 and res.stderr.count(message) == 1, res.stderr
    rows = _table(res.stdout)[1]
    assert len(rows) == len(db) ** 2 and "long" not in {r[0] for r in rows} | {r[1] for r in rows}


def test_search_of_a_database_whose_shuffles_all_score_alike_says_why(fastas, tmp_path):
    tmp, _, _ = fastas
    (tmp_path / "poly.fasta").write_text(">polyA\n" + "A" * 30 + "\n")
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp_path / "poly.fasta"), "-q"])
    assert res.exit_code == 2
    assert "no E-values: all decoy scores are equal" in res.stderr and "more varied database" in res.stderr


def test_search_usage_errors_need_no_model(fastas):
    tmp, _, _ = fastas
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta")])
    assert res.exit_code == 2 and "--all-vs-all" in res.output
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "3"])
    assert res.exit_code == 2 and "--decoys" in res.output
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "-o", str(tmp / "db.fasta")])
    assert res.exit_code == 2 and "also an input" in res.output


def test_search_aligns_only_the_hits_it_reports(fastas):
    """Every subject is scored, but only the hits within --max-hits (and --evalue) go
    through the model; the rest cost a forward pass each."""
    from pfamalign.batch import BatchErrors
    from pfamalign.inference import Predictor
    from pfamalign.inputs import FastaRecord

    _, queries, db = fastas
    predictor = Predictor()
    aligned_pairs = []
    real = predictor.align_records

    def counting(pairs, *args, **kwargs):
        return real((aligned_pairs.append(p) or p for p in pairs), *args, **kwargs)

    predictor.align_records = counting
    scored, shuffled, hits = [], [], []
    results = list(lib.search(predictor, [FastaRecord(*q, "q") for q in queries], [FastaRecord(*d, "d") for d in db],
                              predictor.decoding, BatchErrors(), decoys=12, max_hits=3, evalue=None,
                              advance=scored.append, advance_shuffles=shuffled.append, advance_hits=hits.append))
    assert [len(r.hits) for r in results] == [3, 3] and len(aligned_pairs) == 6
    assert sum(scored) == len(queries) * (12 + len(db))  # every decoy and subject scored
    # the stages after the scores are counted too (a long search's progress sat still there):
    # each decoy's shuffles and those of each subject charged (at least the 3 reported)
    charged = sum(shuffled) // lib.SUBJECT_SHUFFLES - len(queries) * 12
    assert sum(shuffled) % lib.SUBJECT_SHUFFLES == 0 and len(queries) * 3 <= charged <= len(queries) * len(db)
    assert sum(hits) == 6
    for r in results:  # the three best of all subjects, by E-value
        evalues = [h.columns["evalue"] for h in r.hits]
        assert evalues == sorted(evalues) and r.hits[0].columns["sseqid"] == r.query.id


def test_prefilter_scores_its_candidates_only_and_keeps_the_exhaustive_evalues(fastas):
    """With --max-candidates below the database's size, a query's forward passes score the
    prefilter's candidates only: its hits are among them, with the E-values (counted over the
    whole database) and bit scores an exhaustive search gives the same subjects."""
    from pfamalign.alignment import prefilter
    from pfamalign.batch import BatchErrors
    from pfamalign.inference import Predictor
    from pfamalign.inputs import FastaRecord

    _, queries, db = fastas
    predictor = Predictor()
    queries = [FastaRecord(*q, "q") for q in queries]
    database = [FastaRecord(*d, "d") for d in db]
    runs = {}
    for keep in (None, 3):
        scored = []
        runs[keep] = list(lib.search(predictor, queries, database, predictor.decoding, BatchErrors(), decoys=12,
                                     evalue=None, max_candidates=keep, advance=scored.append))
        assert sum(scored) == len(queries) * (12 + lib.scored_per_query(len(db), keep))
    index = prefilter.Database.of([d.seq for d in database])
    for full, filtered in zip(runs[None], runs[3]):
        assert full.n_database == filtered.n_database == len(db)
        kept = {database[i].id for i in prefilter.candidates(filtered.query.seq, index, 3)}
        got = {h.columns["sseqid"]: h.columns for h in filtered.hits}
        assert set(got) == kept and len(full.hits) == len(db)
        for hit in full.hits:
            if hit.columns["sseqid"] in got:
                mine = got[hit.columns["sseqid"]]
                assert mine["evalue"] == pytest.approx(hit.columns["evalue"], rel=1e-9)
                assert mine["bitscore"] == pytest.approx(hit.columns["bitscore"], rel=1e-9)
    assert lib.scored_per_query(5, None) == 5 and lib.scored_per_query(5, 3) == 3 and lib.scored_per_query(2, 3) == 2
    tmp = fastas[0]
    for option, rows_per_query in (("2", 2), ("0", len(db))):  # 0: every sequence
        res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "10",
                                        "--evalue", "1000", "-f", "blast6", "--max-candidates", option])
        assert res.exit_code == 0, res.output
        rows = [line.split("\t") for line in res.stdout.splitlines()]
        for q in queries:
            assert [r[1] for r in rows if r[0] == q.id][:1] == [q.id]  # itself first
            assert sum(r[0] == q.id for r in rows) == rows_per_query


@pytest.mark.slow
def test_shipped_model_evalues_of_shuffled_sequences_are_calibrated(tmp_path):
    """Real model, real sequences: a query searched against 150 shuffled Pfam sequences (a
    database with no homolog) gets null E-values: about x hits with E <= x."""
    from pfamalign.batch import BatchErrors
    from pfamalign.inference import Predictor
    from pfamalign.inputs import FastaRecord

    records = _family_fasta(tmp_path / "all.fasta", {"PF00041.sto": 20, "PF00076.sto": 20})
    rng = np.random.default_rng(5)
    db = [FastaRecord(f"s{n}", shuffled(records[n % len(records)][1], rng), "x") for n in range(150)]
    queries = [FastaRecord(*records[n], "q") for n in (0, 25)]
    predictor = Predictor()
    results = list(lib.search(predictor, queries, db, predictor.decoding, BatchErrors(),
                              decoys=100, evalue=None))
    evalues = np.array([h.columns["evalue"] for r in results for h in r.hits])
    assert len(evalues) == 300
    assert (evalues <= 1).sum() <= 6  # expected 2 for two queries; Poisson(2) exceeds 6 with p < 0.005
    assert 8 <= (evalues <= 10).sum() <= 36  # expected 20


def test_hit_table_numbers_are_written_as_blast_writes_them():
    """BLAST+ tabular output's number formats (its E-value bands and truncated bit scores)."""
    from pfamalign.search import blast_bits, blast_evalue

    assert [blast_evalue(e) for e in (1e-200, 2.5e-105, 1.234e-30, 8.9e-4, 0.0009, 0.05, 0.55,
                                      3.7, 15.0, 2000.0)] == [
        "0.0", "2.50e-105", "1.23e-30", "8.90e-04", "0.001", "0.050", "0.55", "3.7", "15", "2000"]
    assert [blast_bits(b) for b in (-0.01, 7.25, 45.67, 99.9, 99.95, 123.9, 2e5)] == [
        " 0.0", " 7.2", "45.7", "99.9", "99", "123", "2.000e+05"]  # blastp 2.12 writes " 9.2"


def test_blast6_and_blast7_are_read_back_by_a_blast_tabular_parser(fastas):
    """-f blast6 / blast7 are BLAST+ -outfmt 6 / 7: Bio.SearchIO's "blast-tab" parser (plain,
    and with comments: it maps the '# Fields:' names back to the columns) reads the hits of the
    tsv table back, per query and in order; a skipped record goes to standard error only (a '#'
    line would break the tables), and a query without hits is a '# 0 hits found' block."""
    from Bio import SearchIO

    tmp, queries, db = fastas
    bad_db = tmp / "bad_db7.fasta"
    bad_db.write_text((tmp / "db.fasta").read_text() + ">broken\nMKV*LL\n")
    described = tmp / "q_described.fasta"  # definition lines: an id, then a description
    described.write_text("".join(f">{q} fibronectin-like query {n} [Homo sapiens]\n{seq}\n"
                                 for n, (q, seq) in enumerate(queries)))
    args = ["search", str(described), str(bad_db), "--decoys", "10", "--evalue", "1000"]
    tables = {}
    for fmt in ("tsv", "blast6", "blast7"):
        out = tmp / f"hits.{fmt}"
        res = CliRunner().invoke(main, args + ["-f", fmt, "-o", str(out)])
        assert res.exit_code == 1 and "record 'broken'" in res.stderr, res.output
        tables[fmt] = out.read_text()
    assert "# error:" in tables["tsv"] and "error" not in tables["blast6"] + tables["blast7"]
    rows = _table(tables["tsv"])[1]
    assert not any(line.startswith("#") for line in tables["blast6"].splitlines())
    assert [r.split("\t") for r in tables["blast6"].splitlines()] == [r[:12] for r in rows]

    def hsps(path, **kw):
        return [(q.id, h.id, hsp.ident_pct, hsp.aln_span, hsp.mismatch_num, hsp.gapopen_num,
                 hsp.query_start + 1, hsp.query_end, hsp.hit_start + 1, hsp.hit_end, hsp.evalue, hsp.bitscore)
                for q in SearchIO.parse(str(path), "blast-tab", **kw) for h in q for hsp in h]

    expected = [(r[0], r[1], float(r[2]), *map(int, r[3:10]), float(r[10]), float(r[11])) for r in rows]
    assert hsps(tmp / "hits.blast6") == expected
    assert hsps(tmp / "hits.blast7", comments=True) == expected
    parsed = list(SearchIO.parse(str(tmp / "hits.blast7"), "blast-tab", comments=True))
    assert [q.id for q in parsed] == [q for q, _ in queries] and {q.target for q in parsed} == {str(bad_db)}
    assert [q.description for q in parsed] == [f"fibronectin-like query {n} [Homo sapiens]"
                                               for n in range(len(queries))]  # as BLAST+ writes it
    assert tables["blast7"].splitlines()[-1] == f"# pfamalign search processed {len(queries)} queries"
    lines = tables["blast7"].splitlines()  # each block opens with the program line, as BLAST+'s
    assert [lines[i - 1] for i, line in enumerate(lines) if line.startswith("# Query:")] == \
        [f"# pfamalign search {pfamalign.__version__}"] * len(queries)

    none = CliRunner().invoke(main, args[:-1] + ["0", "-f", "blast7"])
    assert none.exit_code == 1
    assert none.stdout.count("# 0 hits found") == len(queries) and "# Fields:" not in none.stdout
    empty = tmp / "none.blast7"
    empty.write_text(none.stdout)
    assert [(q.id, len(q)) for q in SearchIO.parse(str(empty), "blast-tab", comments=True)] == [
        (q, 0) for q, _ in queries]


def test_a_querys_evalues_do_not_depend_on_its_place_in_the_batch(fastas):
    """The decoys are seeded by --seed and the query's residues: the same query against the same
    database gets the same hits and E-values alone, first or last among other queries."""
    tmp, queries, db = fastas
    (tmp / "q_alone.fasta").write_text(f">{queries[1][0]}\n{queries[1][1]}\n")
    (tmp / "q_last.fasta").write_text("".join(f">{i}\n{s}\n" for i, s in db[:2] + [queries[1]]))
    tables = {}
    for name in ("q_alone", "q_last"):
        res = CliRunner().invoke(main, ["search", str(tmp / f"{name}.fasta"), str(tmp / "db.fasta"),
                                        "--decoys", "10", "--evalue", "1000", "-f", "blast6"])
        assert res.exit_code == 0, res.output
        tables[name] = [r for r in res.stdout.splitlines() if r.startswith(queries[1][0] + "\t")]
    assert tables["q_alone"] and tables["q_alone"] == tables["q_last"]
    other_seed = CliRunner().invoke(main, ["search", str(tmp / "q_alone.fasta"), str(tmp / "db.fasta"),
                                           "--decoys", "10", "--evalue", "1000", "-f", "blast6", "--seed", "1"])
    assert other_seed.exit_code == 0, other_seed.output
    reseeded = [r for r in other_seed.stdout.splitlines() if r.startswith(queries[1][0] + "\t")]
    assert len(reseeded) == len(tables["q_alone"])  # the same hits (E <= 1000 keeps them all) ...
    assert reseeded != tables["q_alone"]  # ... with other E-values: the seed still draws the decoys


def test_evalues_do_not_depend_on_the_order_of_the_database(fastas):
    """The decoys are drawn from the database's sequences sorted, not in file order: the same
    database reversed gives the same hits with the same E-values."""
    tmp, queries, db = fastas
    (tmp / "db_reversed.fasta").write_text("".join(f">{i}\n{s}\n" for i, s in reversed(db)))
    tables = {}
    for name in ("db", "db_reversed"):
        res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / f"{name}.fasta"),
                                        "--decoys", "10", "--evalue", "1000", "-f", "blast6"])
        assert res.exit_code == 0, res.output
        tables[name] = sorted(res.stdout.splitlines())
    assert len(tables["db"]) == len(queries) * len(db)
    assert tables["db"] == tables["db_reversed"]


def test_hits_the_decoder_aligns_no_pair_of_are_named_in_a_warning(fastas):
    """--min-mass 1 leaves every hit without an aligned pair: none is written (BLAST has no
    empty alignment), and standard error says how many and why, instead of saying nothing."""
    tmp, queries, db = fastas
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(tmp / "db.fasta"), "--decoys", "10",
                                    "--evalue", "1000", "--min-mass", "1", "-f", "blast6"])
    assert res.exit_code == 0, res.output
    assert res.stdout == ""
    assert (f"Warning: {len(queries) * len(db)} hit(s) within the limits are not reported: the decoder "
            "aligned no residue pair of them") in res.stderr


def test_search_refuses_a_sequence_over_the_memory_budget_once(tmp_path):
    """--max-memory as in align: a sequence whose pairs would exceed the budget is reported
    once (not once per query and decoy) and the rest is searched."""
    import random

    rng = random.Random(0)
    long = "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(700))  # a 768 grid: 712 MiB
    query, db = tmp_path / "q.fasta", tmp_path / "db.fasta"
    query.write_text(">q\nMKVLAAGIVGLLLAQSPEDRW\n")
    db.write_text(f">short\nMKVLSAGIVGLAQSPDRW\n>long\n{long}\n")
    res = CliRunner().invoke(main, ["search", str(query), str(db), "--max-memory", "680M", "--decoys", "10",
                                    "--quiet"])
    assert res.exit_code == 1, res.output
    assert res.output.count("long: aligning 700 x 700 residues needs about") == 2  # stderr + output line
    hits = [line.split("\t")[1] for line in res.stdout.splitlines() if not line.startswith("#")]
    assert hits == ["short"]


def test_a_query_too_short_for_calibrated_evalues_is_warned_about(fastas):
    """Queries under MIN_CALIBRATED_QUERY residues (optimistic E-values in a null search) get a
    warning on standard error naming them; a query of that length does not."""
    from pfamalign.search import MIN_CALIBRATED_QUERY

    tmp, _, _ = fastas
    short, enough = "MKVLAAG"[:MIN_CALIBRATED_QUERY - 1], "MKVLAAGIVG"[:MIN_CALIBRATED_QUERY]
    q = tmp / "short_q.fasta"
    q.write_text(f">short\n{short}\n>enough\n{enough}\n")
    res = CliRunner().invoke(main, ["search", str(q), str(tmp / "db.fasta"), "--decoys", "10"])
    assert res.exit_code == 0, res.output
    warned = [x for x in res.stderr.splitlines() if x.startswith("Warning:")]
    assert warned == [f"Warning: {q}:1: query 'short' has {len(short)} residue(s): the E-values of queries "
                      f"shorter than {MIN_CALIBRATED_QUERY} residues are optimistic (more unrelated hits "
                      "than they promise); read its hits with caution"]


def test_a_database_named_in_bytes_that_are_not_utf8_is_written_as_named(fastas):
    """BLAST7's '# Database:' line names the file; a name that is not UTF-8 (Python holds its
    byte as a surrogate escape) is written as its own bytes. The run failed after its work
    ("surrogates not allowed"), with no output file."""
    import os

    tmp, _, _ = fastas
    name = os.fsdecode(b"db\xe9.fasta")
    db = tmp / name
    db.write_bytes((tmp / "db.fasta").read_bytes())
    out = tmp / "hits_named.blast7"
    res = CliRunner().invoke(main, ["search", str(tmp / "q.fasta"), str(db), "--decoys", "10", "-f", "blast7",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert b"# Database: " + os.fsencode(str(db)) + b"\n" in out.read_bytes()
