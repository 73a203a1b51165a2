"""The Python API (``pfamalign.align``, ``pfamalign.PairAligner``): the same bytes as
``pfamalign align`` for the same pairs, the ids each kind of input gets, and errors that name
the pair or the setting."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import pfamalign
from pfamalign.alignment import formats
from pfamalign.cli import main
from pfamalign.commands import align as align_command

PDZ_A = "PEVRLVELERGPKGLGFNIVGGKDGGEEGGGIFVSRVVEGGPADKAGLRTGDEILSVNGVSLEGL"
PDZ_B = "PRLVTLQRRPGEGLGFSIVGGEDGQGHGIFVSRIVPGGAAEKDGRLRVGDRILAVNGVDVRGA"
SH3_A = "ALYDYEARTEDDLSFHKGEKFQILNSSEGDWWEARSLTTGETGYIPSNYVAPV"
SH3_B = "KVVALYDYMPMNANDLQLRKGDEYFILEESNLPWWRARDKNGQEGYIPSNYVTEA"


@pytest.fixture(scope="module")
def aligner():
    return pfamalign.PairAligner()


def cli(*args) -> str:
    res = CliRunner().invoke(main, ["align", *args, "--quiet"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("fmt", list(formats.ONE_PAIR))
def test_one_pair_prints_what_the_command_prints(aligner, fmt):
    aln = aligner.align(PDZ_A, PDZ_B)
    assert (aln.id_a, aln.id_b) == ("seq_a", "seq_b")  # as `pfamalign align A B` names them
    assert aligner.format(aln, fmt) == cli(PDZ_A, PDZ_B, "-f", fmt)


def test_many_pairs_print_what_a_pairs_file_prints(aligner, tmp_path):
    pairs = [(PDZ_A, PDZ_B), (SH3_A, SH3_B), (PDZ_A, SH3_B)]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{a}\t{b}\n" for a, b in pairs))
    alns = list(aligner.align_many(iter(pairs)))  # any iterable: streamed
    assert [(r.id_a, r.id_b) for r in alns] == [(f"pair{n}_a", f"pair{n}_b") for n in (1, 2, 3)]
    assert "".join(aligner.format(r, "json") for r in alns) == cli("--pairs", tsv, "-f", "json")


def test_sides_may_be_named_tuples_seqrecords_or_seqs(aligner):
    from Bio.Seq import Seq
    from Bio.SeqRecord import SeqRecord

    plain = aligner.align(SH3_A, SH3_B)
    named = aligner.align(("sh3_1", SH3_A), SeqRecord(Seq(SH3_B), id="sh3_2"))
    assert (named.id_a, named.id_b) == ("sh3_1", "sh3_2")
    np.testing.assert_array_equal(named.pairs, plain.pairs)
    assert named.gapped() == plain.gapped()
    bare = aligner.align(Seq(SH3_A), Seq(SH3_B))  # a Bio.Seq is a sequence string
    assert (bare.id_a, bare.id_b, bare.gapped()) == ("seq_a", "seq_b", plain.gapped())
    (listed,) = aligner.align_many([(Seq(SH3_A), SH3_B)])
    assert (listed.id_a, listed.gapped()) == ("pair1_a", plain.gapped())
    with pytest.raises(TypeError, match="pair 1: each side is a sequence string"):
        aligner.align(SH3_A, 42)


def test_a_bad_pair_is_named_after_the_pairs_before_it(aligner):
    out = []
    with pytest.raises(ValueError, match=r"pair 2 \(pair2_a vs pair2_b\): .*pair2_b"):
        for aln in aligner.align_many([(PDZ_A, PDZ_B), (PDZ_A, "PEVRL1VELER"), (SH3_A, SH3_B)]):
            out.append(aln)
    assert [r.id_a for r in out] == ["pair1_a"]
    with pytest.raises(ValueError, match=r"pair 1 \(seq_a vs seq_b\): seq_b is empty"):
        aligner.align(PDZ_A, "")


def test_decoder_settings_override_the_models_and_bad_names_are_refused():
    local = pfamalign.PairAligner(mode="local", gap_cost=0.1)
    assert (local.decoding.mode, local.decoding.gap_cost) == ("local", 0.1)
    assert local.provenance["decoder"]["mode"] == "local"
    assert local.format(local.align(PDZ_A, PDZ_B), "text") == cli(PDZ_A, PDZ_B, "--mode", "local",
                                                                  "--gap-cost", "0.1")
    with pytest.raises(TypeError, match="unknown decoder setting.*gap_opn.*choose from.*gap_open"):
        pfamalign.PairAligner(gap_opn=3.0)
    with pytest.raises(ValueError, match="expected a size"):
        pfamalign.PairAligner(max_memory="lots")
    with pytest.raises(ValueError, match="below the 640 MiB that aligning any pair needs"):
        pfamalign.PairAligner(max_memory="1M")
    tight = pfamalign.PairAligner(max_memory="641M")  # 640 MiB and 128 B a padded cell: not these
    with pytest.raises(ValueError, match="pair 1 .*memory"):
        tight.align(PDZ_A, PDZ_B)


def test_another_decoder_keeps_the_models_mode_and_objective():
    """--decoder X starts from X's own settings (gap costs are in other units; min_mass
    applies to another matrix under posterior) but keeps what means the same to every
    decoder reading it: the model's mode and objective ("Default: the model's
    decoding.json"); the options still override them."""
    from pfamalign.decoding import DecoderSettings

    model = DecoderSettings(decoder="posterior", mode="local", objective="f1", min_mass=0.02,
                            gap_cost=0.3, alpha=0.25)
    mea = model.override(decoder="mea")
    assert (mea.mode, mea.objective) == ("local", "f1")
    fresh = DecoderSettings.for_decoder("mea")
    assert (mea.gap_cost, mea.min_mass) == (fresh.gap_cost, fresh.min_mass)  # not carried: reset
    affine = model.override(decoder="affine")  # reads no objective: its default stays
    assert (affine.mode, affine.objective) == ("local", "accuracy")
    assert model.override(decoder="mea", mode="global", objective="accuracy").mode == "global"
    shipped = pfamalign.PairAligner()
    assert pfamalign.PairAligner(decoder="mea").decoding.objective == shipped.decoding.objective


def test_the_module_level_align_keeps_one_default_aligner(monkeypatch):
    """One default aligner per process, also when threads make the first calls at once (each
    loaded the model under an lru_cache)."""
    import concurrent.futures
    import threading

    from pfamalign import pairwise

    made, real = [], pairwise.PairAligner.__init__
    gate = threading.Barrier(4)

    def counted(self, *args, **kwargs):
        made.append(1)
        real(self, *args, **kwargs)

    def first_call(_):
        gate.wait()  # the four calls start together
        return pfamalign.align(PDZ_A, PDZ_B)

    monkeypatch.setattr(pairwise, "_DEFAULT", [])
    monkeypatch.setattr(pairwise.PairAligner, "__init__", counted)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(first_call, range(4)))
    assert len(made) == 1
    for again in results[1:]:
        np.testing.assert_array_equal(results[0].pairs, again.pairs)
    assert pfamalign.align(PDZ_A, PDZ_B, mode="local").format("text").count("seq_a") >= 1


def test_record_format_names_are_the_commands():
    assert align_command.FORMATS == tuple(formats.ONE_PAIR)  # the help's literal list
    aln = formats.AlignmentRecord("ACDE", "ACE", np.array([[0, 0], [1, 1], [3, 2]]))
    assert aln.format("fasta") == ">seq_a\nACDE\n>seq_b\nAC-E\n"
    assert aln.format("cigar") == "2M1D1M\n"
    with pytest.raises(ValueError, match="unknown format 'pair_block'; choose from text, emboss"):
        aln.format("pair_block")


def test_importing_the_package_loads_no_jax():
    probe = "import sys, pfamalign; pfamalign.__version__; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        pfamalign.nothing


def test_the_readmes_python_example_runs(tmp_path):
    import io
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    exec(code, {"pairs": [(PDZ_A, PDZ_B), (SH3_A, SH3_B)], "out": out, "queries": [("pdz", PDZ_A)],
                "database": [("pdz_b", PDZ_B), ("sh3_b", SH3_B)]})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all('"id_a": "pair' in line for line in lines)


def _seed_records(n_per_family: int = 4) -> list[tuple[str, str]]:
    import pathlib

    from Bio import SeqIO

    out = []
    for path in sorted((pathlib.Path(__file__).parent / "data" / "pfam_seed").glob("*.sto"))[:3]:
        for rec in list(SeqIO.parse(path, "stockholm"))[:n_per_family]:
            out.append((rec.id.replace("/", "_"), str(rec.seq).replace("-", "").replace(".", "").upper()))
    return out


def test_search_gives_the_commands_hits(aligner, tmp_path):
    from pfamalign import search as lib

    records = _seed_records()
    db = tmp_path / "db.fasta"
    db.write_text("".join(f">{name}\n{seq}\n" for name, seq in records))
    queries = tmp_path / "q.fasta"
    queries.write_text("".join(f">{name}\n{seq}\n" for name, seq in records[::5]))

    def rows(text: str) -> list[str]:
        return [line for line in text.splitlines(keepends=True) if not line.startswith("#")]

    for cli_args, api_args in ((["search", queries, db], (records[::5], records)),
                               (["search", db, "--all-vs-all", "--evalue", "1"], (records,))):
        res = CliRunner().invoke(main, [*map(str, cli_args), "--quiet"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        evalue = {"evalue": 1.0} if "--all-vs-all" in cli_args else {}
        results = list(aligner.search(*api_args, **evalue))
        assert [r.query.id for r in results] == [name for name, _ in api_args[0]]
        api_rows = [lib.format_tsv_row(hit.columns) for r in results for hit in r.hits]
        assert api_rows and api_rows == rows(res.stdout)
    top = next(aligner.search([records[1]], records)).hits[0]
    assert top.record.id_b == records[1][0] and top.columns["evalue"] < 1  # itself, first


def test_search_names_a_bad_sequence_before_any_work(aligner):
    with pytest.raises(ValueError, match=r"subject 2 \(subject2\): subject2 has a non-protein character '1'"):
        list(aligner.search([PDZ_A], [PDZ_B, "PEVRL1"]))
    with pytest.raises(ValueError, match=r"query 1 \(q\): q is empty"):
        list(aligner.search([("q", "")], [PDZ_B]))
    with pytest.raises(TypeError, match="query 1: each item is a sequence string"):
        list(aligner.search([3], [PDZ_B]))
    with pytest.raises(ValueError, match=r"all against all \(--all-vs-all; no database in Python\) needs"):
        list(aligner.search([PDZ_A]))  # as `search --all-vs-all` with one sequence
    # an id no tabular output can carry, on a subject that would never be a hit: refused up front
    with pytest.raises(ValueError, match=r"subject 1 \(bad id\): the sequence id must be a non-empty string"):
        list(aligner.search([PDZ_A], [("bad id", "ACDEFGHIKLMNPQRSTVWY" * 3), PDZ_B]))
    for queries, database, name in (({"q": PDZ_A}, [PDZ_B], "queries"), ([PDZ_A], {PDZ_B}, "database")):
        with pytest.raises(TypeError, match=f"{name} is a list of sequences or \\(id, sequence\\) pairs"):
            list(aligner.search(queries, database))  # a dict's keys are not sequences; a set has no order


def test_a_shipped_model_is_named_as_on_the_command_line():
    ens = pfamalign.PairAligner("ensemble")
    assert ens.provenance["model"].startswith("ensemble of ") and "(shipped)" in ens.provenance["model"]
    assert ens.format(ens.align(SH3_A, SH3_B), "json") == cli(SH3_A, SH3_B, "--checkpoint", "ensemble",
                                                             "-f", "json")


# ---- arguments checked as the command line checks them (fuzzing of 2026-11-25) ------------------

@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"max_length": 0}, ValueError, "max_length must be an integer >= 1"),
    ({"max_length": float("nan")}, ValueError, "max_length"),
    ({"max_length": "abc"}, TypeError, "max_length"),
    ({"max_memory": float("nan")}, ValueError, "max_memory"),
    ({"max_memory": -1}, ValueError, "max_memory"),
    ({"engine": "steps", "steps": 2.5}, ValueError, "steps must be an integer from 1"),
    ({"threshold": 0.9}, ValueError, "threshold does not apply to the posterior decoder"),
    ({"decoder": "affine", "alpha": 0.3}, ValueError, "alpha does not apply to the affine decoder"),
    ({"weights": "/nonexistent"}, ValueError, "takes no ESM-2 weights"),
    ({"model": 5}, TypeError, "model is a directory path"),
])
def test_aligner_arguments_out_of_range_are_refused_by_name(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        pfamalign.PairAligner(**kwargs)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"evalue": -1}, "evalue"), ({"evalue": float("nan")}, "evalue"), ({"max_hits": 0}, "max_hits"),
    ({"max_hits": 2.5}, "max_hits"), ({"decoys": None}, "decoys"), ({"seed": -1}, "seed"),
    ({"max_candidates": -1}, "max_candidates"),
])
def test_search_options_out_of_range_are_refused_by_name(aligner, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        list(aligner.search([PDZ_A], [PDZ_B, SH3_A], **kwargs))


def test_search_with_max_candidates_0_scores_every_subject(aligner):
    (result,) = aligner.search([PDZ_A], [PDZ_B, SH3_A], max_candidates=0, evalue=None)
    assert len(result.hits) == 2  # 0 is the command line's "every subject", not "none"


def test_misshapen_inputs_are_type_errors_that_say_what_was_expected(aligner):
    import types

    with pytest.raises(TypeError, match="queries is a list of sequences"):
        list(aligner.search(PDZ_A, [PDZ_B]))
    with pytest.raises(TypeError, match="an AlignmentRecord"):
        aligner.format("MKV")
    with pytest.raises(TypeError, match="pair 1: the record's seq"):
        aligner.align(types.SimpleNamespace(id="x", seq=None), PDZ_B)
    # a tuple is an accepted side: what is wrong is inside it (it said tuples are not accepted)
    with pytest.raises(TypeError, match="pair 1: an \\(id, sequence\\) tuple's id is a string, got int 5"):
        aligner.align((5, PDZ_A), PDZ_B)
    with pytest.raises(TypeError, match="pair 1: an \\(id, sequence\\) tuple's sequence is a string or a Bio.Seq, "
                                        "got bytes"):
        aligner.align(("a", PDZ_A.encode()), PDZ_B)
    with pytest.raises(TypeError, match="pair 1: each item is an \\(a, b\\) tuple or list"):
        list(aligner.align_many((PDZ_A, PDZ_B)))
    with pytest.raises(TypeError, match="pair 1: each item is an \\(a, b\\) tuple or list.*length 1"):
        list(aligner.align_many([(PDZ_A,)]))
    rows = np.array([[PDZ_A, PDZ_B]], dtype=object)  # a table's rows (numpy, pandas .to_numpy()) are pairs
    assert [r.seq_b for r in aligner.align_many(rows)] == [PDZ_B]
    for unordered in ({"a": PDZ_A, "b": PDZ_B}, {PDZ_A, PDZ_B}):  # no order of sides: not a pair
        with pytest.raises(TypeError, match="pair 1: each item is an \\(a, b\\) tuple or list"):
            list(aligner.align_many([unordered]))


@pytest.mark.parametrize("malformed", [(PDZ_A, PDZ_B, SH3_A), (PDZ_A, None)])
def test_a_malformed_item_is_raised_after_the_pairs_before_it(aligner, malformed):
    out = []
    with pytest.raises(TypeError, match="pair 3"):
        for aln in aligner.align_many([(PDZ_A, PDZ_B), (SH3_A, SH3_B), malformed, (PDZ_A, PDZ_B)]):
            out.append(aln)
    assert [r.id_a for r in out] == ["pair1_a", "pair2_a"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"decoder": "viterbi"}, "decoder must be one of affine, mea, hybrid, posterior, got 'viterbi'"),
    ({"decoder": 1}, "decoder must be one of"),
    ({"alpha": True}, "alpha must be a finite number, got True"),
    ({"min_mass": 2}, "min_mass must be from 0 to 1"),
])
def test_decoder_settings_of_the_wrong_kind_are_refused_by_name(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        pfamalign.PairAligner(**kwargs)


def test_a_model_that_is_not_one_is_named_with_what_to_pass(tmp_path):
    from pfamalign.inference import default_model_dir

    config = default_model_dir() / "config.json"
    with pytest.raises(FileNotFoundError, match=f"is a file, not a model directory; pass its directory "
                                                f"{default_model_dir()}"):
        pfamalign.PairAligner(config)
    with pytest.raises(FileNotFoundError, match="no such directory.*shipped model's name \\(default, ensemble\\)"):
        pfamalign.PairAligner(str(tmp_path / "no_such_model"))
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="a dataset of `pfamalign prepare`"):
        pfamalign.PairAligner(tmp_path)
    with pytest.raises(FileNotFoundError, match="empty name"):
        pfamalign.PairAligner("")


def test_a_records_arrays_are_read_only(aligner):
    record = aligner.align(PDZ_A, PDZ_B)
    with pytest.raises(ValueError, match="read-only"):
        record.pairs[0] = [5, 5]
    with pytest.raises(ValueError, match="read-only"):
        record.confidence[0] = 0.0


_STRICT = f"""
import jax, os
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
import pfamalign
a, b = {PDZ_A!r}, {PDZ_B!r}
single = pfamalign.align(a, b)
aligner = pfamalign.PairAligner()
many = list(aligner.align_many([(a, b), (b, a), (a[5:], b)]))
hits = list(aligner.search([("q", a)], [("d%d" % i, b[i:]) for i in range(6)], decoys=10))
print(repr(single.score), [repr(r.score) for r in many], len(hits[0].hits))
"""


def test_a_process_with_strict_jax_promotion_rules_aligns_as_any_other(tmp_path):
    """A caller's jax_numpy_dtype_promotion="strict" / jax_numpy_rank_promotion="raise" failed
    the model's and the pair-HMM's programs as they were traced (a cold cache: a warm one ran the
    exported program); now they are traced under the standard rules, on every thread."""
    import os

    outs = []
    for strict in (True, False):
        code = _STRICT if strict else _STRICT.replace("jax.config.update", "(lambda *_: None)")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PFAMALIGN_CACHE_DIR": ""})  # nothing cached: every program traced
        assert run.returncode == 0, run.stderr[-2000:]
        outs.append(run.stdout)
    assert outs[0] == outs[1]
