"""The user-facing commands align / eval / barycenter / certify, end to end through click, on a
small aligner saved in the real model-directory format and on the repository's Pfam fixtures."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import shutil
import os
import pathlib
import re

import numpy as np
import pytest
from click.testing import CliRunner

from pfamalign.cli import main

ROOT = pathlib.Path(__file__).resolve().parent
SEED = ROOT / "data" / "pfam_seed"
PDZ_A = "PEVRLVELERGPKGLGFNIVGGKDGGEEGGGIFVSRVVEGGPADKAGLRTGDEILSVNGVSLEGL"
PDZ_B = "PRLVTLQRRPGEGLGFSIVGGEDGQGHGIFVSRIVPGGAAEKDGRLRVGDRILAVNGVDVRGA"


def run(args, **kw):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)
    return result


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An (untrained) align_ce aligner on builtin features, saved as `pfamalign train` does."""
    from pfamalign import checkpoint
    from pfamalign.configs import get_config
    from pfamalign.model import build_model
    from pfamalign.pipelines.embed import get_embedder

    emb = get_embedder("builtin/onehot+blosum62")
    cfg = get_config("align_ce", embedder_id=emb.embedder_id, feature_dim=emb.dim).model
    out = tmp_path_factory.mktemp("model") / "model"
    checkpoint.save_model(out, build_model(cfg, seed=1), cfg)
    return out


@pytest.fixture(scope="module")
def dataset(seed_dataset):
    return seed_dataset


# ---- align ---------------------------------------------------------------------------------


def _pairs_of_rows(row_a: str, row_b: str) -> list[tuple[int, int]]:
    """Aligned residue pairs described by two gapped rows."""
    i = j = 0
    out = []
    for a, b in zip(row_a, row_b):
        if a != "-" and b != "-":
            out.append((i, j))
        i += a != "-"
        j += b != "-"
    return out


def test_align_formats_parse_back_to_the_same_pairs(model_dir, tmp_path):
    from Bio import AlignIO, SeqIO

    from pfamalign.alignment.formats import cigar_to_pairs

    js = json.loads(run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "json"]).output)
    pairs = [tuple(p) for p in js["pairs"]]
    assert pairs and js["lengths"] == [len(PDZ_A), len(PDZ_B)] if "lengths" in js else pairs
    assert len(js["confidence"]) == len(pairs) and all(0 < c <= 1 for c in js["confidence"])
    assert all(a < b for a, b in zip(pairs, pairs[1:]))  # monotone

    fasta = run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "fasta"]).output
    recs = list(SeqIO.parse(io.StringIO(fasta), "fasta"))
    assert _pairs_of_rows(str(recs[0].seq), str(recs[1].seq)) == pairs
    assert str(recs[0].seq).replace("-", "") == PDZ_A

    sto = run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "stockholm"]).output
    aln = AlignIO.read(io.StringIO(sto), "stockholm")
    assert _pairs_of_rows(str(aln[0].seq), str(aln[1].seq)) == pairs

    cigar = run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "cigar"]).output.strip()
    got, la, lb = cigar_to_pairs(cigar)
    assert (la, lb) == (len(PDZ_A), len(PDZ_B)) and [tuple(p) for p in got] == pairs

    text = run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir]).output
    assert "seq_a" in text and "|" in text  # pairwise text with a match line


def test_align_fasta_files_pairs_file_and_plot(model_dir, tmp_path):
    fa, fb = tmp_path / "a.fasta", tmp_path / "b.fasta"
    fa.write_text(f">pdzA first\n{PDZ_A[:30]}\n{PDZ_A[30:]}\n")
    fb.write_text(f">pdzB\n{PDZ_B}\n")
    png = tmp_path / "plan.png"
    res = run(["align", fa, fb, "--checkpoint", model_dir, "-f", "json", "--plot", png])
    assert res.exit_code == 0, res.output
    js = json.loads(res.output)
    assert js["id_a"] == "pdzA" and js["id_b"] == "pdzB"
    assert png.stat().st_size > 5000

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"# a comment\n{PDZ_A}\t{PDZ_B}\nx1\t{PDZ_B}\tx2\t{PDZ_A}\n")
    out = tmp_path / "out.jsonl"
    res = run(["align", "--pairs", pairs, "--checkpoint", model_dir, "-f", "json", "-o", out])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id_a"] for x in lines] == ["pair2_a", "x1"]
    assert lines[0]["pairs"] == js["pairs"]  # the same pair gives the same alignment


@pytest.mark.parametrize("args, message", [
    (["", PDZ_B], "empty"),
    (["MKV1LL", PDZ_B], "non-protein character '1' at position 4"),
    ([PDZ_A, PDZ_B, "--max-length", "20"], "longer than the limit of 20 residues; split it"),
    (["nothere.fasta", PDZ_B], "no such FASTA file"),
])
def test_align_bad_input_gives_clear_errors(model_dir, args, message):
    res = CliRunner().invoke(main, ["align", *args, "--checkpoint", str(model_dir)])
    assert res.exit_code != 0
    assert message in res.output


def test_align_without_model_directory_says_what_to_do(tmp_path):
    res = CliRunner().invoke(main, ["align", PDZ_A, PDZ_B, "--checkpoint", str(tmp_path)])
    assert res.exit_code != 0 and "config.json missing" in res.output


def test_bad_pairs_are_reported_with_their_line_and_the_batch_goes_on(model_dir, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text(f"{PDZ_A}\t{PDZ_B}\n{PDZ_A}\nx\tMK1\ty\t{PDZ_B}\n{PDZ_B}\t{PDZ_A}\n")
    res = CliRunner().invoke(main, ["align", "--pairs", str(bad), "--checkpoint", str(model_dir), "-f", "json"])
    assert res.exit_code == 1
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x.get("where") or x["id_a"] for x in lines] == ["pair1_a", f"{bad}:2", f"{bad}:3", "pair4_a"]
    assert "expected 2" in lines[1]["error"] and "non-protein character '1'" in lines[2]["error"]
    assert f"Error: skipped {bad}:2" in res.stderr and f"Error: skipped {bad}:3" in res.stderr
    assert "2 record(s) failed" in res.stderr
    text = CliRunner().invoke(main, ["align", "--pairs", str(bad), "--checkpoint", str(model_dir), "-f", "cigar"])
    assert text.exit_code == 1 and text.stdout.splitlines()[1].startswith(f"# error: {bad}:2: expected 2")


def test_strict_stops_at_the_first_bad_record_and_writes_no_file(model_dir, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text(f"{PDZ_A}\t{PDZ_B}\n{PDZ_A}\n{PDZ_B}\t{PDZ_A}\n")
    out = tmp_path / "out.txt"
    res = CliRunner().invoke(main, ["align", "--pairs", str(bad), "--checkpoint", str(model_dir), "--strict",
                                    "-o", str(out)])
    assert res.exit_code == 2 and f"{bad}:2: expected 2" in res.stderr and not out.exists()
    # on standard output the pairs before it are written, in order, and nothing after it
    res = CliRunner().invoke(main, ["align", "--pairs", str(bad), "--checkpoint", str(model_dir), "--strict",
                                    "-f", "cigar"])
    assert res.exit_code == 2 and f"{bad}:2: expected 2" in res.stderr
    assert len([line for line in res.stdout.splitlines() if line and not line.startswith("#")]) == 1, res.stdout


def test_align_multi_fasta_first_against_others_all_pairs_and_stdin(model_dir, tmp_path):
    fam = tmp_path / "fam.fasta"
    fam.write_text(f">a\n{PDZ_A}\n>b\n{PDZ_B}\n>c\n{PDZ_B[5:]}\n")
    res = run(["align", fam, "--checkpoint", model_dir, "-f", "json"])
    assert res.exit_code == 0, res.output
    assert [(x["id_a"], x["id_b"]) for x in map(json.loads, res.stdout.splitlines())] == [("a", "b"), ("a", "c")]
    res = run(["align", "-", "--all-pairs", "--checkpoint", model_dir, "-f", "json"], input=fam.read_text())
    assert res.exit_code == 0, res.output
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert [(x["id_a"], x["id_b"]) for x in got] == [("a", "b"), ("a", "c"), ("b", "c")]
    single = run(["align", "-", str(fam).replace("fam", "one"), "--checkpoint", model_dir], input=">q\nMKV\n")
    assert single.exit_code != 0 and "no such FASTA file" in single.output
    one = tmp_path / "one.fasta"
    one.write_text(f">b\n{PDZ_B}\n")
    res = run(["align", "-", one, "--checkpoint", model_dir, "-f", "json"], input=f">a\n{PDZ_A}\n")
    assert res.exit_code == 0 and json.loads(res.stdout)["pairs"] == got[0]["pairs"]
    assert CliRunner().invoke(main, ["align", PDZ_A, PDZ_B, "--all-pairs"]).exit_code == 2
    for command in ("align", "certify", "barycenter"):  # certify and barycenter blamed the input
        twice = CliRunner().invoke(main, [command, "-", "-"], input=fam.read_text())
        assert twice.exit_code == 2 and "standard input (-) can be SEQ_A or SEQ_B, not both" in twice.output, command


def test_align_of_a_fasta_file_plots_its_one_pair_and_names_a_record_too_long_once(model_dir, tmp_path):
    """A file of two records is one pair: --plot draws it (it was refused); a file of more pairs
    is refused by name. A record over --max-length is reported once, at its own line and by
    its id (it was reported once per pair it is in, at the other record's line)."""
    two = tmp_path / "two.fasta"
    two.write_text(f">a\n{PDZ_A}\n>b\n{PDZ_B}\n")
    png = tmp_path / "plan.png"
    res = run(["align", two, "--checkpoint", model_dir, "-f", "cigar", "--plot", png])
    assert res.exit_code == 0, res.output
    assert res.stdout.split("\t")[:2] == ["a", "b"] and png.stat().st_size > 5000
    fam = tmp_path / "fam.fasta"
    fam.write_text(f">a\n{PDZ_A}\n>long\n{PDZ_A}{PDZ_B}\n>b\n{PDZ_B}\n>c\n{PDZ_B[5:]}\n")
    res = run(["align", fam, "--checkpoint", model_dir, "-f", "cigar", "--plot", png])
    assert res.exit_code == 2 and "--plot draws a single pair" in res.output and "holds 3 pairs" in res.output
    res = run(["align", fam, "--checkpoint", model_dir, "-f", "cigar", "--max-length", len(PDZ_A) + 5])
    assert res.exit_code == 1
    assert [line for line in res.stderr.splitlines() if line.startswith("Error: skipped")] == [
        f"Error: skipped {fam}:3: record 'long': sequence of {len(PDZ_A) + len(PDZ_B)} residues is longer "
        f"than the limit of {len(PDZ_A) + 5} residues; split it into domains or raise --max-length "
        "(max_length= in Python)"]
    assert [line.split("\t")[:2] for line in res.stdout.splitlines() if not line.startswith("#")] == [
        ["a", "b"], ["a", "c"]]
    assert "1 record(s) failed" in res.stderr
    # barycenter and certify take one pair: their error for a multi-record file says so
    res = run(["barycenter", fam, two, "--checkpoint", model_dir])
    assert res.exit_code != 0 and "expected exactly one FASTA record, found 4 (this command takes one pair" \
        in res.output and "--pairs" not in res.output


def test_align_progress_has_a_total_and_off_a_terminal_prints_lines_unless_quiet(model_dir, tmp_path,
                                                                                  monkeypatch):
    """A pairs file or a multi-FASTA gives the bar its total (items: pairs and bad records; a
    pipe has none); where standard error is no terminal (here, and in logs) the progress comes
    as plain lines, every LINE_SECONDS (0 here: one per item); -q / --quiet: none. Standard
    output is the same either way."""
    from pfamalign.pipelines import progress

    monkeypatch.setattr(progress, "LINE_SECONDS", 0)
    totals = []
    task = progress.Bars.task
    monkeypatch.setattr(progress.Bars, "task", lambda self, what, total: totals.append(total) or
                        task(self, what, total))

    def shown(res):
        return [line.split(",")[0] for line in res.stderr.splitlines() if line.startswith("aligning pairs")]

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"# pairs\n{PDZ_A}\t{PDZ_B}\n{PDZ_A}\n{PDZ_B}\t{PDZ_A}\n")
    args = ["align", "--pairs", pairs, "--checkpoint", model_dir, "-f", "json"]
    res = run(args)
    assert res.exit_code == 1 and totals == [3], (totals, res.output)  # line 3 is bad
    assert shown(res) == ["aligning pairs: 1/3 (33%)", "aligning pairs: 2/3 (67%)",
                          "aligning pairs: 3/3 (100%)"], res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("aligning pairs")]
    assert re.fullmatch(r"aligning pairs: 1/3 \(33%\), \d:\d\d:\d\d elapsed, about \d:\d\d:\d\d left", lines[0])
    assert re.fullmatch(r"aligning pairs: 3/3 \(100%\), \d:\d\d:\d\d elapsed", lines[-1])
    quiet = run([*args, "-q"])
    assert shown(quiet) == [] and quiet.stdout == res.stdout and len(res.stdout.splitlines()) == 3
    piped = run(["align", "--pairs", "-", "--checkpoint", model_dir, "-f", "json"], input=pairs.read_text())
    assert totals[-1] is None and shown(piped) == ["aligning pairs: 1", "aligning pairs: 2", "aligning pairs: 3"]
    assert piped.stdout == res.stdout.replace(str(pairs), "<stdin>")

    fam = tmp_path / "fam.fasta"
    fam.write_text(f">a\n{PDZ_A}\n>b\n{PDZ_B}\n>c\n{PDZ_B[5:]}\n")
    res = run(["align", fam, "--all-pairs", "--checkpoint", model_dir, "-f", "cigar"])
    assert res.exit_code == 0 and totals[-1] == 3 and shown(res)[-1] == "aligning pairs: 3/3 (100%)"
    assert len(res.stdout.splitlines()) == 3
    res = run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "cigar"])
    assert res.exit_code == 0 and shown(res) == []  # one pair: no progress


# ---- eval ----------------------------------------------------------------------------------


def test_eval_scores_model_and_baselines_by_the_same_protocol(model_dir, dataset, tmp_path):
    from pfamalign.alignment.baselines import needleman_wunsch
    from pfamalign.alignment.metrics import alignment_counts
    from pfamalign.evaluation import sample_across_families
    from pfamalign.pipelines import reader

    out = tmp_path / "eval.json"
    png = tmp_path / "f1.png"
    res = run(["eval", "--data", dataset, "--split", "train", "--checkpoint", model_dir, "--max-pairs", 8,
               "--bootstrap", 50, "--json", out, "--plot", png, "--quiet"])
    assert res.exit_code == 0, res.output
    assert "NW-BLOSUM62" in res.output and "pfamalign" in res.output
    summary = json.loads(out.read_text())
    assert summary["n_pairs"] == 8 and set(summary["methods"]) == {"model", "diagonal", "nw", "sw"}
    # NW's F1 recomputed independently on the same pairs: 8 drawn across the families
    split = list(reader.iter_pairs(dataset, "train"))
    recs = [split[i] for i in sample_across_families([r["family"] for r in split], 8, seed=0)]
    assert len({r["family"] for r in recs}) == min(8, len({r["family"] for r in split}))
    counts = np.array([alignment_counts(needleman_wunsch(r["q_seq"], r["k_seq"]).pairs, r["target"])
                       for r in recs]).sum(0)
    f1 = 2 * counts[0] / (counts[1] + counts[2])
    assert summary["methods"]["nw"]["prf"]["all"]["micro"]["f1"]["value"] == pytest.approx(f1)
    model = summary["methods"]["model"]
    assert 0 <= model["prf"]["all"]["micro"]["f1"]["value"] <= 1
    assert summary["model_minus"]["nw"]["all"]["value"] == pytest.approx(
        model["prf"]["all"]["micro"]["f1"]["value"] - f1)
    assert "pfamalign minus baseline" in res.output and "by family" in res.output
    by_family = summary["model_minus_by_family"]["nw"]["all"]
    assert by_family["value"] == summary["model_minus"]["nw"]["all"]["value"]
    assert by_family["n_groups"] == len({r["family"] for r in recs})
    assert model["plan_metrics"]["n_barycenter"] > 0
    # calibration: the model's aligned pairs by confidence bin; their pooled precision is the
    # model's micro precision; the baselines have no confidences
    rel = model["reliability"]
    assert rel["n_pairs"] == sum(b["count"] for b in rel["bins"]) > 0
    correct = sum(b["count"] * b["precision"] for b in rel["bins"] if b["count"])
    assert correct / rel["n_pairs"] == pytest.approx(model["prf"]["all"]["micro"]["precision"]["value"])
    assert "reliability" not in summary["methods"]["nw"] and "ECE" in res.output
    assert png.stat().st_size > 5000


def test_eval_on_stockholm_files_baselines_only(tmp_path):
    res = run(["eval", "--stockholm", SEED / "PF00041.sto", "--no-model", "--pairs-per-family", 5,
               "--baselines", "nw,diagonal", "--bootstrap", 20, "--json", tmp_path / "e.json", "--quiet"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "e.json").read_text())
    assert summary["n_pairs"] == 5 and set(summary["methods"]) == {"nw", "diagonal"}


def test_eval_skips_a_malformed_stockholm_family_unless_strict(tmp_path):
    bad = tmp_path / "bad.sto"
    bad.write_text("# STOCKHOLM 1.0\nseq1/1-5 MKV-L\nseq2/1-3 MK\n//\n")  # rows of unequal width
    args = ["eval", "--stockholm", SEED / "PF00041.sto", "--stockholm", bad, "--no-model", "--pairs-per-family",
            5, "--baselines", "nw", "--bootstrap", 20, "--json", tmp_path / "e.json", "--quiet"]
    res = run(args)
    assert res.exit_code == 1
    assert f"Error: skipped {bad}:" in res.stderr and "1 record(s) failed" in res.stderr
    summary = json.loads((tmp_path / "e.json").read_text())
    assert summary["n_pairs"] == 5 and [e["where"].split(":")[0] for e in summary["errors"]] == [str(bad)]
    res = run([*args, "--strict"])
    assert res.exit_code == 2 and f"{bad}:" in res.stderr


def test_eval_input_errors(model_dir, dataset):
    res = CliRunner().invoke(main, ["eval", "--checkpoint", str(model_dir)])
    assert res.exit_code != 0 and "exactly one of --data" in res.output
    res = CliRunner().invoke(main, ["eval", "--data", str(dataset), "--baselines", "nw,blast", "--no-model"])
    assert res.exit_code != 0 and "unknown baseline" in res.output
    res = CliRunner().invoke(main, ["eval", "--data", str(dataset), "--baselines", "", "--no-model"])
    assert res.exit_code == 2 and "nothing to score" in res.output and res.exception is not None
    assert isinstance(res.exception, SystemExit)  # a usage message, not a traceback
    # a model option beside --no-model would change nothing: refused, naming it
    res = CliRunner().invoke(main, ["eval", "--data", str(dataset), "--no-model", "--checkpoint", str(model_dir),
                                    "--gap-cost", "0.1"])
    assert res.exit_code == 2 and "--checkpoint, --gap-cost set up the model, which --no-model leaves out" \
        in " ".join(res.output.split()), res.output


def test_eval_without_baselines_scores_the_model_alone(model_dir, dataset, tmp_path):
    res = run(["eval", "--data", dataset, "--split", "val", "--checkpoint", model_dir, "--max-pairs", 2,
               "--baselines", "", "--bootstrap", 10, "--json", tmp_path / "e.json", "--quiet"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "e.json").read_text())
    assert set(summary["methods"]) == {"model"} and summary["model_minus"] == {}


def test_eval_warns_when_the_model_saw_the_evaluated_families(model_dir, dataset, tmp_path):
    import shutil

    from pfamalign import checkpoint
    from pfamalign.inference import Predictor
    from pfamalign.training.rundir import split_families

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    train, val = split_families(dataset, "train"), split_families(dataset, "val")
    checkpoint.write_training_record(model, {"dataset": {}, "trained_on": {"families": train},
                                             "decoder": {"families": val}})
    warned = set()
    for split in ("train", "val", "test"):
        res = CliRunner().invoke(main, ["eval", "--data", str(dataset), "--split", split,
                                        "--checkpoint", str(model), "--baselines", "nw",
                                        "--bootstrap", "10", "--json", str(tmp_path / "e.json"),
                                        "--quiet"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        summary = json.loads((tmp_path / "e.json").read_text())
        overlap = summary["training_overlap"]
        # what was scored on what: the model (name, content hash), its decoder, the data
        assert summary["provenance"] == Predictor(model).provenance()
        assert {k: summary["source"][k] for k in ("data", "split")} == {"data": str(dataset), "split": split}
        assert {"max_pairs", "seed"} <= set(summary["source"])  # what decides the pairs scored
        evaluated = {r["family"].split(".")[0] for r in reader_pairs(dataset, split)}
        assert overlap == {"trained_on": sorted(evaluated & set(train)),
                           "tuned_on": sorted(evaluated & set(val))}
        assert ("Warning: the model trained on" in res.stderr) == bool(overlap["trained_on"])
        assert ("had its decoder tuned on" in res.stderr) == bool(overlap["tuned_on"])
        warned |= {key for key, families in overlap.items() if families}
    assert warned == {"trained_on", "tuned_on"}  # each warning was seen, on its own split
    # no training record (a model from before it existed): no claim either way
    res = run(["eval", "--data", dataset, "--split", "train", "--checkpoint", model_dir, "--max-pairs", 2,
               "--baselines", "nw", "--bootstrap", 10, "--json", tmp_path / "e.json", "--quiet"])
    assert json.loads((tmp_path / "e.json").read_text())["training_overlap"] is None
    assert "Warning" not in res.stderr


def test_the_shipped_model_records_its_training_families():
    from pfamalign.evaluation import training_overlap
    from pfamalign.inference import default_model_dir

    # fn3 (PF00041) is a training family of the shipped model, RRM_1 (PF00076) a test family,
    # HATPase_c (PF02518) a validation family (assets/default_model/TRAINING.md)
    assert training_overlap(default_model_dir(), ["PF00041.20", "PF00076.13", "PF02518.29"]) == {
        "trained_on": ["PF00041"], "tuned_on": ["PF02518"]}


def reader_pairs(dataset, split):
    from pfamalign.pipelines import reader

    return list(reader.iter_pairs(dataset, split))


# ---- barycenter ----------------------------------------------------------------------------


def test_barycenter_table_matches_the_plan(model_dir, tmp_path):
    from pfamalign.alignment.metrics import barycenters
    from pfamalign.inputs import pair_from_stockholm
    from pfamalign.inference import Predictor

    sto = SEED / "PF00041.sto"
    names = [line.split()[0] for line in sto.read_text().splitlines() if line and not line.startswith(("#", "/"))]
    id_a, id_b = names[0], names[1]
    tsv, png = tmp_path / "b.tsv", tmp_path / "b.png"
    res = run(["barycenter", "--stockholm", sto, "--ids", id_a, id_b, "--checkpoint", model_dir,
               "--tsv", tsv, "--plot", png])
    assert res.exit_code == 0, res.output
    import pandas as pd

    table = pd.read_csv(tsv, sep="\t")
    rec = pair_from_stockholm(sto, id_a, id_b)
    _, pp = Predictor(model_dir).align(rec["q_seq"], rec["k_seq"], symmetric=False)  # the transport plan
    np.testing.assert_allclose(table["barycenter"], barycenters(pp.real), rtol=1e-9)
    np.testing.assert_array_equal(table["target"], rec["target"])
    assert "barycenter MAE" in res.output and png.stat().st_size > 5000
    # the printed table: each row's target as the TSV has it ("—" for -1 alone; key 0 is a key)
    shown = [line.split("│")[3].strip() for line in res.output.splitlines() if line.count("│") == 8]
    assert 0 in rec["target"] and -1 in rec["target"]
    assert shown == ["—" if t < 0 else str(t) for t in rec["target"]]


def test_barycenter_without_a_reference_shows_no_target(model_dir, tmp_path):
    """Two bare sequences have no reference columns: the table shows '—' for target and error
    (the library's -1 stays in the TSV), and no MAE line."""
    import pandas as pd

    tsv = tmp_path / "b.tsv"
    res = run(["barycenter", "MKVLAAGIVG", "MKVLSAGIVA", "--checkpoint", model_dir, "--tsv", tsv])
    assert res.exit_code == 0, res.output
    rows = [line.split("│")[1:-1] for line in res.output.splitlines() if line.count("│") == 8]
    assert len(rows) == 10 and all(r[2].strip() == "—" and r[4].strip() == "—" for r in rows)
    assert (pd.read_csv(tsv, sep="\t")["target"] == -1).all() and "barycenter MAE" not in res.output


def test_barycenter_table_columns_and_metrics_follow_the_plan(model_dir):
    """Every column of the table, not only the barycenters: the error of a row aligned to key 0
    (a NaN where only -1 means "no reference"), the rows' real and dustbin mass, and the
    metrics under the model's own dustbin."""
    from pfamalign.barycenter import pair_barycenters
    from pfamalign.evaluation import model_plan_metrics
    from pfamalign.inference import Predictor
    from pfamalign.inputs import bare_pair

    target = np.array([0, 1, 2, -1, 4, 5, 6])
    predictor = Predictor(model_dir)
    res = pair_barycenters(predictor, {**bare_pair("a", "MKVLAAG", "b", "MKVLSAG"), "target": target})
    t, real = res.table, res.plan.real
    np.testing.assert_allclose(t["real_mass"], real.sum(1), rtol=1e-6)
    np.testing.assert_allclose(t["dustbin_mass"], res.plan.row_dustbin, rtol=1e-6)
    want = np.where(target >= 0, np.abs(t["barycenter"] - target), np.nan)
    np.testing.assert_allclose(t["abs_error"], want, rtol=1e-9)
    assert not np.isnan(t["abs_error"][0]) and np.isnan(t["abs_error"][3])
    assert predictor.config.dustbin  # so that a metric computed without it would differ
    expected = model_plan_metrics(real, res.plan.row_dustbin, target, dustbin=predictor.config.dustbin)
    np.testing.assert_equal(dataclasses.asdict(res.metrics), dataclasses.asdict(expected))


def test_barycenter_refuses_an_output_onto_its_stockholm_or_two_outputs_on_one_file(tmp_path):
    sto = tmp_path / "f.sto"
    shutil.copy(SEED / "PF00041.sto", sto)
    names = [line.split()[0] for line in sto.read_text().splitlines() if line.strip() and not line.startswith(("#", "/"))]
    before = sto.read_bytes()
    res = run(["barycenter", "--stockholm", sto, "--ids", names[0], names[1], "--tsv", sto])
    assert res.exit_code == 2 and "is also an input" in res.output, res.output
    assert sto.read_bytes() == before
    both = tmp_path / "b.png"
    res = run(["barycenter", "MKVLAAG", "MKVLSAG", "--tsv", both, "--plot", both])
    assert res.exit_code == 2 and "two outputs name one file" in res.output, res.output


# ---- certify -------------------------------------------------------------------------------


@pytest.mark.slow  # 48 s: three tail depths' compiles and 20000-step float64 solves (infeasible)
def test_certify_reports_consistent_certificates(model_dir, tmp_path):
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    from pfamalign.inference import Predictor

    a, b = PDZ_A[:40], PDZ_B[:36]
    res = run(["certify", a, b, "--checkpoint", model_dir, "--tail-depths", "0,1,2",
               "--score-noise", "1e-3", "--json", out, "--plot", png])
    assert res.exit_code == 0, res.output
    cert = json.loads(out.read_text())
    # one dense block (W >= L): strictly positive, rates in [0, 1], rho_H below the range bound
    (block,) = cert["contraction"]["blocks"]
    assert block["strictly_positive"] and 0 <= block["rho_h"] <= block["range_bound"] <= 1
    # the bias identity grad_full = grad_stopped + c_R holds to rounding at every depth
    for row in cert["bias"]["rows"]:
        assert row["residual"] <= 1e-4 * max(row["grad_norm"], 1e-12)
    # spoke with 40 != 36: unit targets are infeasible, and the sender error says by how much
    (marg,) = cert["marginals"]
    assert not marg["feasible"] and marg["expected_row_sum"] == pytest.approx(37 / 41)
    _, pp = Predictor(model_dir).align(a, b, symmetric=False)  # the op's plan, one direction
    assert marg["sender_error"] == pytest.approx(np.abs(pp.plan[:-1].sum(1) - 1).max(), abs=1e-5)
    assert marg["total_mass"] == pytest.approx(pp.plan.sum(), rel=1e-5)
    assert marg["sender_error"] > 0.01
    (ceta,) = cert["ceta"]
    assert ceta["lhs"] <= ceta["rhs_gauge"] <= ceta["rhs_sup"] and not ceta["applies"]
    assert ceta["lipschitz"] == pytest.approx(pp.plan[:-1].sum(1).max(), abs=1e-5)
    (soft,) = cert["softmax_ot"]
    assert soft["violations"] == 0 and 0 < soft["row_bound_ratio_median"] <= 1
    assert len(soft["drift"]) == 16  # T + R = 17 steps of the op
    assert not cert["stable_matches"]["applies"]  # the plan is infeasible: nothing certified
    assert png.stat().st_size > 5000
    assert "sender error" in res.output and "not certified" in res.output
    for bad, why in (("-1", "not in the range x>=0"), ("nan", "not a finite number")):
        res = run(["certify", a, b, "--checkpoint", model_dir, "--score-noise", bad])
        assert res.exit_code == 2 and why in res.output
    for bad, why in (("0", "not in the range x>0"), ("inf", "not a finite number")):
        res = run(["certify", a, b, "--checkpoint", model_dir, "--perturbation", bad])
        assert res.exit_code == 2 and why in res.output


def test_certify_of_a_feasible_pair_applies_and_agrees_with_align(model_dir, tmp_path):
    """The fast certify run: equal lengths (spoke is feasible, the float64 solves converge) and
    one tail depth; its stable matches are align --score-noise's."""
    out = tmp_path / "c.json"
    a = PDZ_A[:40]
    res = run(["certify", a, a, "--checkpoint", model_dir, "--tail-depths", "0", "--score-noise", "1e-3",
               "--json", out])
    assert res.exit_code == 0, res.output
    cert = json.loads(out.read_text())
    (row,) = cert["bias"]["rows"]
    assert row["residual"] <= 1e-4 * max(row["grad_norm"], 1e-12)
    for marg, ceta, soft in zip(cert["marginals"], cert["ceta"], cert["softmax_ot"]):
        assert marg["feasible"] and marg["expected_row_sum"] == 1.0
        assert ceta["converged"] and ceta["applies"] and ceta["lhs"] <= ceta["rhs_gauge"] <= ceta["rhs_sup"]
        assert soft["violations"] == 0
    st = cert["stable_matches"]
    assert st["applies"] and st["certified"] > 0
    assert f"{st['certified']} of {st['aligned']} aligned pairs" in res.output
    res = run(["align", a, a, "--checkpoint", model_dir, "-f", "json", "--score-noise", "1e-3"])
    doc = json.loads(res.output)
    assert [p for p, s in zip(doc["pairs"], doc["stable"]) if s] == st["pairs"]
    assert doc["stable_matches"]["threshold"] == pytest.approx(st["threshold"])


def _converged_mean_plan(predictor, seq_a, seq_b):
    """The heads' mean plan of the op's float64 problem (A -> B) by a plain log-domain Sinkhorn
    run to marginal errors 1e-11, independent of ``certificates.solve_dense``."""
    import jax.numpy as jnp
    from scipy.special import logsumexp

    from pfamalign.certify import _extended_scores

    model, tcfg = predictor.model, predictor.model.cfg.transport
    qf, kf = predictor.featurize([seq_a, seq_b])
    q, k, _, tokens = model.project(jnp.asarray(qf)[None], jnp.asarray(kf)[None], jnp.array([len(qf)]),
                                    jnp.array([len(kf)]))
    s, mask, log_a, log_b = _extended_scores(q, k, tokens, len(qf), len(kf), tcfg)
    plans = []
    for h in range(s.shape[0]):
        z = np.where(mask, s[h] / tcfg.eps, -np.inf)
        u, v = np.zeros(z.shape[0]), np.zeros(z.shape[1])
        for _ in range(20000):
            u = log_a - logsumexp(z + v[None], axis=1)
            v = log_b - logsumexp(z + u[:, None], axis=0)
            p = np.exp(z + u[:, None] + v[None])
            if np.abs(np.log(p.sum(1)) - log_a).max() < 1e-11:
                break
        plans.append(p)
    return np.mean(plans, 0), float(np.sum(plans[0])), float(tcfg.eps)


def test_stable_matches_exceed_the_threshold_and_shrink_with_noise(model_dir):
    from pfamalign.certify import stable_matches
    from pfamalign.inference import Predictor

    # a vs a: spoke with equal lengths is balanced and feasible; its converged plan certifies pairs
    a, predictor = PDZ_A[:40], Predictor(model_dir)
    diagonal = np.stack([np.arange(40)] * 2, 1)
    plan, mass, eps = _converged_mean_plan(predictor, a, a)
    sets = [stable_matches(predictor, a, a, diagonal, r) for r in (0.0, 1e-3, 1e-2, 1.0)]
    for st, r in zip(sets, (0.0, 1e-3, 1e-2, 1.0)):
        assert st["applies"] and st["aligned"] == 40 and st["certified"] == sum(st["stable"])
        assert st["threshold"] == pytest.approx(0.5 + mass / (2 * eps) * r, rel=1e-6)
        flagged = np.array(st["stable"])
        entries = plan[diagonal[:, 0], diagonal[:, 1]]
        assert np.all(entries[flagged] > st["threshold"])
        assert np.all(entries[~flagged] <= st["threshold"] + 1e-6)
    # more noise, fewer certified: the flagged sets shrink as r grows, to none once 1/2 + (M/2 eps) r > 1
    flags = [np.array(st["stable"]) for st in sets]
    assert all(np.all(flags[n + 1] <= flags[n]) for n in range(3))
    assert flags[0].sum() > flags[2].sum() > 0 and flags[3].sum() == 0
    # 40 vs 36: the unit targets are infeasible, nothing is certified (and nothing is solved)
    st = stable_matches(predictor, a, PDZ_B[:36], diagonal[:36], 0.0)
    assert not st["applies"] and st["certified"] == 0 and st["stable"] == [None] * 36  # not tested


@pytest.mark.slow
def test_align_score_noise_marks_certified_stable_pairs(model_dir, tmp_path):
    from pfamalign.certify import stable_matches
    from pfamalign.inference import Predictor

    a, c = PDZ_A[:40], PDZ_B[:36]
    fasta = tmp_path / "three.fasta"
    fasta.write_text(f">a\n{a}\n>b\n{a}\n>c\n{c}\n")
    res = run(["align", fasta, "--checkpoint", model_dir, "-f", "json", "--score-noise", "1e-3"])
    assert res.exit_code == 0, res.output
    same, other = (json.loads(line) for line in res.stdout.splitlines())  # stderr: progress
    st = same["stable_matches"]
    assert st["applies"] and st["score_noise"] == 1e-3 and st["aligned"] == same["n_aligned"]
    assert len(same["stable"]) == same["n_aligned"] and st["certified"] == sum(same["stable"]) > 0
    want = stable_matches(Predictor(model_dir), a, a, np.array(same["pairs"]), 1e-3)
    assert same["stable"] == want["stable"] and st["threshold"] == want["threshold"]
    st = other["stable_matches"]
    assert not st["applies"] and st["certified"] == 0 and "feasible" in st["reason"]
    assert other["stable"] == [None] * other["n_aligned"]  # null: not tested, not "unstable"


def test_align_score_noise_needs_json():
    res = run(["align", PDZ_A, PDZ_B, "--score-noise", "1e-3"])
    assert res.exit_code == 2 and "--score-noise marks pairs in JSON output only" in res.output
    for bad, why in (("-1", "not in the range x>=0"), ("inf", "not a finite number"),
                     ("nan", "not a finite number")):
        res = run(["align", PDZ_A, PDZ_B, "-f", "json", "--score-noise", bad])
        assert res.exit_code == 2 and why in res.output, bad


def test_number_options_refuse_what_is_not_a_real_number(tmp_path):
    """click's FloatRange lets nan (and inf past an open top) through; these options do not."""
    q = tmp_path / "q.fa"
    q.write_text(">q\nMKVLAAGIVGLLLA\n")
    res = run(["search", str(q), str(q), "--evalue", "nan"])
    assert res.exit_code == 2 and "'nan' is not a number" in res.output
    res = run(["compile", "--ridge", "nan", "-o", str(tmp_path / "c")])
    assert res.exit_code == 2 and "'nan' is not a finite number" in res.output
    assert not (tmp_path / "c").exists()


def test_top_level_help_lists_every_command():
    res = run(["--help"])
    for name in ("prepare", "train", "align", "eval", "barycenter", "certify"):
        assert name in res.output


def _help_examples(text: str) -> list[list[str]]:
    """The `pfamalign ...` command lines of a help text (continued lines joined, comments cut)."""
    import re
    import shlex

    text = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(line.strip().split("#")[0])[1:] for line in text.splitlines()
            if line.strip().startswith("pfamalign ")]


def _parse(args: list[str]):
    """click's parse of a `pfamalign` command line (options, types, paths), without running it."""
    import click

    def rest(ctx):  # a group's unparsed arguments (click >= 8.2 names them _protected_args)
        return [*(getattr(ctx, "_protected_args", None) or vars(ctx).get("protected_args", [])), *ctx.args]

    ctx = main.make_context("pfamalign", list(args))
    cmd, left = main, rest(ctx)
    while isinstance(cmd, click.Group) and left:
        cmd = cmd.get_command(ctx, left[0])
        ctx = cmd.make_context(left[0], left[1:], parent=ctx)
        left = rest(ctx)
    return cmd


def _readme_commands() -> str:
    """The README's bash blocks."""
    import re

    return "\n".join(re.findall(r"```bash\n(.*?)```", (ROOT.parent / "README.md").read_text(), re.S))


@pytest.mark.parametrize("command", [[], ["prepare"], ["prepare", "shards"], ["train"], ["compile"],
                                     "README"])
def test_help_examples_are_valid_invocations(command, model_dir, dataset, tmp_path, monkeypatch):
    """Every example of these helps, and every command line of the README, parses in a
    directory holding the files it names; a train example names --config (a new run needs it)."""
    monkeypatch.chdir(tmp_path)
    for name in ("data", "data_b62_1k"):
        (tmp_path / name).symlink_to(dataset, target_is_directory=True)
    for name in ("compiled", "runs/x/model", "runs/ac/model", "runs/ceta/model", "runs/align_ce/model"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).symlink_to(model_dir, target_is_directory=True)
    (tmp_path / "stockholm").mkdir()
    for name in ("Pfam-A.seed.gz", "query.fasta", "db.fasta", "pairs.tsv"):
        (tmp_path / name).write_text("")
    text = _readme_commands() if command == "README" else run([*command, "--help"]).output
    examples = _help_examples(text)
    assert examples, command
    for args in examples:
        assert _parse(args) is not None, args
        if args[0] == "train":
            assert "--config" in args, args


def test_prepare_help_has_examples():
    res = run(["prepare", "--help"])
    assert "Examples:" in res.output and "builtin/onehot+blosum62" in res.output \
        and "esm2_" in res.output


def test_align_decoder_options(model_dir):
    from pfamalign.alignment.decode import affine_decode, hybrid_decode, mea_decode
    from pfamalign.alignment.pairhmm import match_posteriors, plan_log_odds
    from pfamalign.inference import Predictor

    _, pp = Predictor(model_dir).align(PDZ_A, PDZ_B)
    mea = json.loads(run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "json", "--decoder", "mea"]).output)
    dustbins = dict(row_dustbin=pp.row_dustbin, col_dustbin=pp.col_dustbin)  # symmetrized plan: both
    model = Predictor(model_dir).decoding  # mea keeps its mode and objective
    assert mea["pairs"] == mea_decode(pp.real, mode=model.mode, objective=model.objective,
                                      **dustbins).pairs.tolist()
    aff = json.loads(run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "json", "--decoder", "affine",
                          "--gap-open", "0.3", "--gap-extend", "0.1", "--threshold", "0.0"]).output)
    expected = affine_decode(pp.real, gap_open=0.3, gap_extend=0.1, threshold=0.0, **dustbins)
    assert aff["pairs"] == expected.pairs.tolist()
    res = CliRunner().invoke(main, ["align", PDZ_A, PDZ_B, "--checkpoint", str(model_dir), "--decoder", "affine",
                                    "--gap-open", "0.1", "--gap-extend", "0.2"])
    assert res.exit_code != 0 and "--gap-open >= --gap-extend" in res.output and "affine decoder" in res.output
    # an option the decoder does not read would change nothing: refused, naming what it reads
    res = CliRunner().invoke(main, ["align", PDZ_A, PDZ_B, "--checkpoint", str(model_dir), "--decoder", "affine",
                                    "--alpha", "0.5", "--gap-cost", "0.1"])
    assert res.exit_code == 2 and "--gap-cost, --alpha do not apply to the affine decoder" in res.output
    assert "reads --gap-open, --gap-extend, --threshold, --min-mass" in res.output
    # another decoder starts from its own defaults: hybrid gaps are in BLOSUM62 units
    hyb = json.loads(run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "json",
                          "--decoder", "hybrid", "--plan-weight", "7"]).output)
    expected = hybrid_decode(pp.real, PDZ_A, PDZ_B, plan_weight=7.0, gap_open=11.0, gap_extend=1.0,
                             mode="global")
    assert hyb["pairs"] == expected.pairs.tolist()
    # the plan alone through the plan pair-HMM: MEA (f1) on its posteriors, no substitution table
    predictor = Predictor(model_dir)
    plan_only = json.loads(run(["align", PDZ_A, PDZ_B, "--checkpoint", model_dir, "-f", "json", "--decoder",
                                "posterior", "--alpha", "1", "--plan-power", "0.1", "--objective", "f1"]).output)
    post = match_posteriors(predictor.pairhmm, PDZ_A, PDZ_B, log_emissions=plan_log_odds(pp.real, 0.1))
    assert plan_only["pairs"] == mea_decode(post, objective="f1").pairs.tolist()
    res = CliRunner().invoke(main, ["align", PDZ_A, PDZ_B, "--checkpoint", str(model_dir), "--decoder",
                                    "posterior", "--plan-power", "-1"])
    assert res.exit_code != 0 and "--plan-power must be from 0 to 10" in res.output


def test_align_local_mode_finds_the_domain_inside_flanks(model_dir):
    from pfamalign.alignment.decode import hybrid_decode, mea_decode
    from pfamalign.inference import Predictor

    flank = "GSGSGSGSGSGSGSGSGSGS"  # scores below zero against the domain under BLOSUM62
    long_b = flank + PDZ_B + flank
    _, pp = Predictor(model_dir).align(PDZ_A, long_b)
    out = {}
    for mode in ("global", "local"):
        res = run(["align", PDZ_A, long_b, "--checkpoint", model_dir, "-f", "json", "--decoder", "hybrid",
                   "--plan-weight", "0", "--mode", mode])
        out[mode] = json.loads(res.output)["pairs"]
        assert json.loads(res.output)["mode"] == mode
        expected = hybrid_decode(pp.real, PDZ_A, long_b, plan_weight=0.0, mode=mode)
        assert out[mode] == expected.pairs.tolist()
    # the pair text of a local alignment is its aligned region, numbered as EMBOSS water numbers it
    text = run(["align", PDZ_A, long_b, "--checkpoint", model_dir, "--decoder", "hybrid", "--plan-weight", "0",
                "--mode", "local"]).output
    (i0, j0), (i1, j1) = out["local"][0], out["local"][-1]
    blocks = [line.split() for line in text.splitlines() if line.startswith(("seq_a ", "seq_b "))]
    assert (int(blocks[0][1]), int(blocks[1][1]), int(blocks[-2][-1]), int(blocks[-1][-1])) == \
        (i0 + 1, j0 + 1, i1 + 1, j1 + 1)
    # global pays for the flanks; local (Smith-Waterman at plan weight 0) keeps to the domain
    assert all(len(flank) <= j < len(flank) + len(PDZ_B) for _, j in out["local"])
    assert out["local"] != out["global"]
    res = run(["align", PDZ_A, long_b, "--checkpoint", model_dir, "-f", "json", "--decoder", "mea",
               "--gap-cost", "0.01", "--mode", "local", "--objective", "accuracy"])
    expected = mea_decode(pp.real, row_dustbin=pp.row_dustbin, gap_cost=0.01, mode="local")
    assert json.loads(res.stdout)["pairs"] == expected.pairs.tolist()
    # with --objective accuracy and no --min-mass every pair of plan mass counts: said on stderr
    assert "leaves no flank unaligned" in res.stderr
    res = CliRunner().invoke(main, ["align", PDZ_A, PDZ_B, "--checkpoint", str(model_dir), "--mode", "semi"])
    assert res.exit_code != 0 and "global" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("fields,mode", [({"end_gaps": True}, "global"), ({"end_gaps": False}, "local"),
                                         ({"end_gaps": True, "mode": "local"}, "local"), ({}, "global")])
def test_decoding_json_from_before_mode_still_loads(tmp_path, fields, mode):
    from pfamalign.decoding import DecoderSettings

    (tmp_path / "decoding.json").write_text(json.dumps({"decoder": "hybrid", "gap_open": 11.0, **fields}))
    loaded = DecoderSettings.load(tmp_path)
    assert loaded.mode == mode and loaded.decoder == "hybrid"
    loaded.save(tmp_path)  # written back with `mode` only
    saved = json.loads((tmp_path / "decoding.json").read_text())
    assert saved["mode"] == mode and "end_gaps" not in saved


def test_tune_decoder_script_scores_the_grid_and_writes_the_best(model_dir, dataset, tmp_path, capsys,
                                                                 monkeypatch):
    import importlib.util
    import shutil

    from pfamalign import tuning

    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "tune_decoder.py"
    monkeypatch.syspath_prepend(str(script.parent))  # its helpers (_common), as `python scripts/...` has them
    spec = importlib.util.spec_from_file_location("tune_decoder", script)
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    assert tune.main(["--data", str(dataset), "--checkpoint", str(model), "--split", "val",
                      "--max-pairs", "4", "--write"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    scored, best = lines[:-1], lines[-1]
    assert len(scored) == len(tuning.candidate_settings())  # the incumbent is in the grid
    assert {r["decoder"] for r in scored} == {"affine", "mea", "hybrid", "posterior"}
    margin = best["margin_over_incumbent"]
    if margin is None or (margin["low"] > 0 and margin["resampled"] == "families"):
        assert best["f1"] == max(r["f1"] for r in scored)
    else:  # the best-scoring challenger lacked evidence (or families): the shipped decoder stays
        assert best["best"] == dataclasses.asdict(tuning.incumbent_settings())
    from pfamalign.decoding import DecoderSettings

    assert dataclasses.asdict(DecoderSettings.load(model)) == best["best"]


# ---- hardening: refused or reported input (certify, barycenter, eval, prepare, train, compile) ----


def _fail_if_called(*args, **kwargs):
    raise AssertionError("the command worked before refusing its input")


@pytest.mark.parametrize("command", ["eval", "certify", "barycenter"])
def test_data_that_is_not_a_dataset_is_a_usage_error(command, tmp_path):
    res = run([command, "--data", tmp_path])  # run() lets a traceback fail the test
    assert res.exit_code == 2 and "manifest.json not found: not a prepared dataset" in res.stderr


@pytest.mark.parametrize("command, work", [("certify", "pfamalign.certify.certify_pair"),
                                           ("barycenter", "pfamalign.barycenter.pair_barycenters")])
def test_an_unknown_plot_extension_is_refused_before_any_work(command, work, model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(work, _fail_if_called)
    res = run([command, PDZ_A, PDZ_B, "--checkpoint", model_dir, "--plot", tmp_path / "x.xyz"])
    assert res.exit_code == 2 and "cannot write a figure as .xyz" in res.stderr
    assert not (tmp_path / "x.xyz").exists()


def test_eval_refuses_an_unknown_plot_extension_before_scoring(dataset, tmp_path, monkeypatch):
    monkeypatch.setattr("pfamalign.evaluation.run", _fail_if_called)
    res = run(["eval", "--data", dataset, "--no-model", "--plot", tmp_path / "f1.xyz"])
    assert res.exit_code == 2 and "cannot write a figure as .xyz" in res.stderr


@pytest.mark.parametrize("command", ["certify", "barycenter"])
def test_a_pair_named_two_ways_is_refused(command, dataset):
    res = run([command, PDZ_A, PDZ_B, "--data", dataset])
    assert res.exit_code == 2 and "the pair is named twice (SEQ_A SEQ_B and --data)" in res.stderr
    res = run([command, PDZ_A, PDZ_B, "--ids", "a", "b"])
    assert res.exit_code == 2 and "--ids names rows of --stockholm" in res.stderr


@pytest.mark.parametrize("option, value, message", [
    ("--splits", "nan,0.5,0.5", "expected finite numbers"),
    ("--splits", "0.5,inf,0.5", "expected finite numbers"),
    ("--pid-bins", "30,150", "expected finite numbers from 0 to 100"),
    ("--layer", "6", "--layer picks a layer of an ESM-2 embedder; builtin/onehot has none"),
    ("--pid-bins", "30,60", "--pid-bins are the bins of --stratify-pid"),  # else silently unused
    ("--device", "cuda", "--device sets how an ESM-2 embedder runs; builtin/onehot has no such setting"),
    ("--threads", "2", "--threads sets how an ESM-2 embedder runs"),
    # they entered the dataset's configuration and blocked a rerun, while changing nothing
    ("--toks-per-batch", "7", "--toks-per-batch sets how an ESM-2 embedder runs"),
    ("--long-seqs", "window", "--long-seqs sets how an ESM-2 embedder runs"),
    ("--threads", "0", "--threads"),
])
def test_prepare_refuses_numbers_it_cannot_use(option, value, message, tmp_path):
    out = tmp_path / "ds"
    res = run(["prepare", "shards", "--pfam", SEED / "PF00076.sto", "--out", out, "-q", option, value])
    assert res.exit_code == 2 and message in res.stderr
    assert not out.exists()


def test_split_fractions_refuse_nan():
    from pfamalign.pipelines.splits import check_fractions

    with pytest.raises(ValueError, match="non-negative"):
        check_fractions((float("nan"), 0.5, 0.5))  # nan < 0 is False: the sum check missed it too


def test_prepare_skip_bad_says_what_it_skipped_and_an_empty_dataset_fails(tmp_path):
    ragged = tmp_path / "ragged.sto"
    ragged.write_text("# STOCKHOLM 1.0\nA/1-3 MKV\nB/1-4 MKVL\n//\n")
    res = run(["prepare", "shards", "--pfam", ragged, "--out", tmp_path / "o", "--skip-bad", "-q"])
    assert res.exit_code == 1
    assert "--skip-bad left out 1 malformed family" in res.stderr
    assert "no pairs were produced from the 1 families read (1 malformed)" in res.stderr
    good = tmp_path / "in"  # a usable family beside the bad one: a dataset, a warning, exit 0
    good.mkdir()
    (good / "a.sto").write_text((SEED / "PF00076.sto").read_text())
    (good / "b.sto").write_text(ragged.read_text())
    res = run(["prepare", "shards", "--pfam", good, "--out", tmp_path / "o2", "--skip-bad", "-q"])
    assert res.exit_code == 0 and "--skip-bad left out 1 malformed family" in res.stderr


def test_seed_options_refuse_negative_seeds(model_dir, dataset, tmp_path):
    q = tmp_path / "q.fa"
    q.write_text(">q\nMKVLAAGIVGLLLA\n")
    for args in (["search", q, q], ["compile", "-o", tmp_path / "c"], ["eval", "--data", dataset, "--no-model"],
                 ["train", "--data", dataset, "--out", tmp_path / "r", "--config", "align_ce"],
                 ["ensemble", model_dir, model_dir, "--data", dataset, "-o", tmp_path / "e"]):
        res = run([*args, "--seed", "-1"])
        # (train's range also has a top: its seed is a C long)
        assert res.exit_code == 2 and "Invalid value for '--seed': -1 is not in the range" in res.stderr, args


def test_train_refuses_an_out_that_is_the_dataset_or_holds_other_files(dataset, tmp_path):
    before = sorted(p.name for p in dataset.iterdir())
    for out in (dataset, dataset / "run"):
        res = run(["train", "--data", dataset, "--config", "align_ce", "--out", out, "-q"])
        assert res.exit_code == 2 and "is the dataset --data" in res.stderr and "inside it" in res.stderr
    assert sorted(p.name for p in dataset.iterdir()) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    res = run(["train", "--data", dataset, "--config", "align_ce", "--out", other, "-q"])
    assert res.exit_code == 2 and "holds other files and no `pfamalign train` run" in res.stderr
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_train_out_check_keeps_new_killed_and_resumable_runs(dataset, tmp_path):
    from pfamalign.pipelines.locks import LOCK_NAME
    from pfamalign.training.errors import OptionsError
    from pfamalign.training.rundir import check_out_dir

    killed, resumable, model = tmp_path / "killed", tmp_path / "run", tmp_path / "model"
    for d in (killed, resumable, model):
        d.mkdir()
    (killed / LOCK_NAME).write_text("")  # killed before config.json
    (resumable / "config.json").write_text(json.dumps({"model": {}, "train": {}, "data": {}}))
    (model / "config.json").write_text(json.dumps({"format": "x", "model": {}}))  # a model directory
    for ok in (tmp_path / "new", killed, resumable):
        check_out_dir(dataset, ok)
    with pytest.raises(OptionsError, match="no `pfamalign train` run"):
        check_out_dir(dataset, model)


def test_eval_refuses_split_with_stockholm_only_when_given(tmp_path):
    args = ["eval", "--stockholm", SEED / "PF00041.sto", "--no-model", "--baselines", "nw",
            "--pairs-per-family", 2, "--bootstrap", 0, "--quiet"]
    res = run([*args, "--split", "val"])
    assert res.exit_code == 2 and "--split picks a split of --data" in res.stderr
    assert run(args).exit_code == 0


def test_eval_refuses_pairs_per_family_with_a_dataset(dataset):
    res = run(["eval", "--data", dataset, "--no-model", "--baselines", "nw", "--pairs-per-family", 2])
    assert res.exit_code == 2 and "--pairs-per-family samples --stockholm families" in res.stderr


def test_eval_bootstrap_zero_titles_its_tables_without_a_ci(dataset):
    args = ["eval", "--data", dataset, "--no-model", "--baselines", "nw", "--max-pairs", 3, "--quiet"]
    res = run([*args, "--bootstrap", 0])
    assert res.exit_code == 0, res.output
    assert "no CI (--bootstrap 0)" in res.stdout and "95%" not in res.stdout
    assert "95% bootstrap CI" in run([*args, "--bootstrap", 10]).stdout
    res = run([*args, "--bootstrap", -1])
    assert res.exit_code == 2 and "--bootstrap" in res.stderr


def test_compile_without_data_warns_when_the_recorded_dataset_was_prepared_again(model_dir, dataset, tmp_path,
                                                                                 capsys):
    """Without --data, compile calibrates on the dataset at the path the model's training
    record names; one prepared again there with other options (another config hash) is still
    used, but not without a warning (it was silent)."""
    import shutil

    from pfamalign.commands.compile import _training_data
    from pfamalign.pipelines.reader import PairDataset

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    for recorded, warned in ((PairDataset(dataset).config_hash, False), ("0123456789abcdef", True)):
        (model / "training.json").write_text(json.dumps({"dataset": {"path": str(dataset), "config_hash": recorded}}))
        assert _training_data(model) == dataset
        err = capsys.readouterr().err
        assert (f"Warning: {dataset} is not the dataset the model trained on (config hash "
                f"{PairDataset(dataset).config_hash}, the model's 0123456789abcdef" in err) == warned, err


def test_compile_says_when_the_split_has_fewer_pairs_than_asked(model_dir, dataset, tmp_path):
    res = run(["compile", "--checkpoint", model_dir, "--data", dataset, "--pairs", 100000,
               "--held-out", 5, "-o", tmp_path / "c"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    assert (f"fewer than the 100000 calibration + 5 held-out pairs asked for: fitting "
            f"{stats['calibration_pairs']}, holding out {stats['held_out_pairs']}") in res.stderr
    assert stats["calibration_pairs"] < 100000


def test_a_pairs_line_with_an_unusable_id_is_skipped_not_fatal(tmp_path):
    """An id with whitespace (or none) cannot name a sequence in the outputs: that line is a
    bad record (file:line), the other pairs are aligned and written, exit 1."""
    path = tmp_path / "pairs.tsv"
    path.write_text("a\tMKVLAAG\tb\tMKVLSAG\nmy id\tMKVLA\tc\tMKVLA\n\tMKV\td\tMKV\nd\tMKVLAAG\te\tMKVLSAG\n")
    out = tmp_path / "out.txt"
    res = CliRunner().invoke(main, ["align", "--pairs", str(path), "-f", "cigar", "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert [line.split("\t")[:2] for line in out.read_text().splitlines() if not line.startswith("#")] == [
        ["a", "b"], ["d", "e"]]
    assert f"{path}:2: sequence id must be a non-empty string without whitespace, got 'my id'" in res.stderr
    assert f"{path}:3: sequence id must be" in res.stderr and "Traceback" not in res.output


def test_a_plot_on_standard_output_is_refused():
    res = CliRunner().invoke(main, ["align", PDZ_A, PDZ_B, "--plot", "-"])
    assert res.exit_code == 2 and "--plot" in res.output and "not - (standard output)" in res.output


def test_a_run_is_finished_only_once_its_model_has_its_training_record(tmp_path):
    """``training.json`` is written last: a run killed while finishing (config and parameters
    written, no record) is not read as a finished model with an untuned decoder."""
    from pfamalign.inference import finished_run_model

    model = tmp_path / "run" / "model"
    (model / "params").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert finished_run_model(tmp_path / "run") is None
    (model / "training.json").write_text("{}")
    assert finished_run_model(tmp_path / "run") == model


def test_an_output_never_replaces_a_file_inside_an_input_directory(dataset, tmp_path):
    """eval --json onto a dataset's manifest (a model's config.json alike) was written and the
    dataset lost; a new file there is still fine."""
    manifest = pathlib.Path(dataset) / "manifest.json"
    before = manifest.read_bytes()
    res = run(["eval", "--data", dataset, "--no-model", "--baselines", "nw", "--max-pairs", 2, "--quiet",
               "--json", manifest])
    assert res.exit_code == 2 and "would replace a file of the input directory" in res.stderr
    assert manifest.read_bytes() == before


def test_eval_refuses_baselines_it_cannot_score_before_any_work(dataset, tmp_path, monkeypatch):
    args = ["eval", "--data", dataset, "--no-model", "--max-pairs", 2, "--quiet", "--bootstrap", 0]
    res = run([*args, "--baselines", "nw,sw,nw"])
    assert res.exit_code == 2 and "--baselines names nw twice" in res.stderr
    monkeypatch.setenv("PATH", str(tmp_path))  # no probcons: named, so an error, not a silent skip
    res = run([*args, "--baselines", "nw,probcons"])
    assert res.exit_code == 2 and "probcons not found on PATH" in res.stderr
    res = run([*args, "--baselines", "nw", "--plot", tmp_path / "p.pgf"])
    assert res.exit_code == 2 and "cannot write a figure as .pgf" in res.stderr


def test_eval_names_the_pair_an_external_aligner_failed_on(dataset, tmp_path, monkeypatch):
    fake = tmp_path / "probcons"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    res = run(["eval", "--data", dataset, "--no-model", "--baselines", "probcons", "--max-pairs", 2, "--quiet"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "probcons failed (exit 3): broken (on the pair " in res.stderr


def test_eval_refuses_one_stockholm_file_given_twice():
    path = SEED / "PF00041.sto"
    twin = SEED / ".." / SEED.name / "PF00041.sto"
    res = run(["eval", "--stockholm", path, "--stockholm", twin, "--no-model", "--baselines", "nw"])
    assert res.exit_code == 2 and "--stockholm names one file twice" in res.stderr


def test_eval_scores_a_family_reached_twice_once(tmp_path):
    """A directory and a file in it (or a copy of a file) reach one family twice: its pairs
    are scored once, and the second copy is named as left out."""
    folder = tmp_path / "d"
    folder.mkdir()
    shutil.copy(SEED / "PF00041.sto", folder / "PF00041.sto")
    shutil.copy(SEED / "PF00041.sto", tmp_path / "copy.sto")
    for extra in (folder / "PF00041.sto", tmp_path / "copy.sto"):
        res = run(["eval", "--stockholm", folder, "--stockholm", extra, "--no-model", "--baselines",
                   "diagonal", "--bootstrap", 0, "--pairs-per-family", 3, "--json", tmp_path / "e.json"])
        assert res.exit_code == 0, res.output
        summary = json.loads((tmp_path / "e.json").read_text())
        assert summary["n_pairs"] == 3, extra
        assert f"{extra}:1: family PF00041" in res.stderr and "a second copy" in res.stderr


def test_compile_refuses_an_output_inside_its_checkpoint(model_dir):
    from pfamalign import asap

    with pytest.raises(ValueError, match="inside the checkpoint"):
        asap.check_output_dir(model_dir, pathlib.Path(model_dir) / "compiled")



def test_messages_say_what_to_fix(tmp_path):
    afile = tmp_path / "one.fa"
    afile.write_text(">a\nMKV\n")
    res = run(["align", "MKVL", "MKLL", "-o", afile / "out.txt"])
    assert res.exit_code != 0 and f"{afile} is a file, not a directory" in res.stderr
    res = run(["align", "MKVL", "MKLL", "--engine", "steps"])
    assert res.exit_code != 0 and \
        "engine 'steps' needs a number of plain Sinkhorn steps (--engine steps --steps N" in res.stderr
    res = run(["align", "MKVL", "MKLL", "--steps", 3])
    assert res.exit_code != 0 and "(--steps N; steps=N in Python) goes with engine 'steps' " \
        "(--engine steps), not engine 'sinkhorn'" in res.stderr


def test_certify_pair_reports_each_stage_as_it_starts(model_dir):
    from pfamalign.certify import certify_pair
    from pfamalign.inference import Predictor
    from pfamalign.inputs import pair_from_sequences

    stages = []
    certify_pair(Predictor(model_dir), pair_from_sequences(PDZ_A[:30], PDZ_B[:28]), tail_depths=(0, 1),
                 score_noise=1e-3, progress=stages.append)
    assert [s.split()[0] for s in stages] == ["projective", "tail", "the", "aligned"]
    assert stages[1] == "tail bias at depths 0, 1"


def test_an_output_encoding_without_every_character_prints_escapes(tmp_path):
    """Standard output in an encoding that cannot hold a record id (PYTHONIOENCODING=latin-1):
    the id is printed escaped, and no output is lost (the command stopped at the first such
    id with "Error: 'latin-1' codec can't encode character", or in a traceback for eval's and
    barycenter's tables)."""
    fasta = tmp_path / "u.fasta"
    fasta.write_text(f">q1\n{PDZ_A[:30]}\n>s_\u03b1\n{PDZ_B[:28]}\n>s3\n{PDZ_B[:25]}\n", encoding="utf-8")
    res = CliRunner(charset="latin-1").invoke(main, ["align", str(fasta), "-f", "cigar"])
    assert res.exit_code == 0, res.output
    assert [line.split("\t")[1] for line in res.output.splitlines()] == ["s_\\u03b1", "s3"]


def test_models_load_align_and_certify_with_float64_switched_on():
    """A user's ``JAX_ENABLE_X64`` (or ``jax_enable_x64`` in a notebook): the dustbin tokens
    were created in the default float (float64 then), so loading the shipped model failed with
    "config.json does not match the parameters" (and ``verify`` called it damaged), and
    certify's random cotangent was float64 against a float32 output."""
    import jax
    from flax import nnx

    from pfamalign.certify import certify_pair
    from pfamalign.inference import Predictor, default_model_dir
    from pfamalign.inputs import pair_from_sequences

    with jax.enable_x64(True):
        predictor = Predictor(default_model_dir())
        certify_pair(predictor, pair_from_sequences(PDZ_A[:30], PDZ_B[:28]), tail_depths=(0,), score_noise=1e-3)
        assert {x.dtype for x in jax.tree.leaves(nnx.state(predictor.model, nnx.Param))} == {np.dtype("float32")}


def test_eval_json_is_written_as_every_other_output(dataset, tmp_path):
    """eval --json went through the dataset writer, not the outputs': a link to the file was
    replaced by a file (its target never written) and the file's permissions were lost."""
    import os
    import stat

    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    args = ["eval", "--data", dataset, "--no-model", "--baselines", "nw", "--max-pairs", 2, "--quiet", "--bootstrap", 0]
    res = run([*args, "--json", link])
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and json.loads(target.read_text())["n_pairs"] == 2
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert not [p.name for p in tmp_path.iterdir() if p.name not in ("real.json", "link.json")]


# ---- found missing by a mutation sweep ----------------------------------------------------------

def test_one_sequence_and_a_stockholm_pair_is_the_pair_named_twice(monkeypatch):
    monkeypatch.setattr("pfamalign.barycenter.pair_barycenters", _fail_if_called)
    res = run(["barycenter", PDZ_A, "--stockholm", SEED / "PF00041.sto", "--ids", "a", "b"])
    assert res.exit_code == 2 and "the pair is named twice (SEQ_A SEQ_B and --stockholm)" in res.output, res.output


def test_one_sequence_alone_is_a_usage_error():
    res = run(["certify", PDZ_A])
    assert res.exit_code == 2 and "give SEQ_A SEQ_B, or --stockholm FILE --ids ID_A ID_B, or --data DIR" \
        in res.output, res.output


def test_the_local_mea_note_is_not_printed_with_a_min_mass():
    res = run(["align", PDZ_A, PDZ_B, "--decoder", "mea", "--mode", "local", "--objective", "accuracy",
               "--min-mass", "0.05"])
    assert res.exit_code == 0, res.output
    assert "leaves no flank unaligned" not in res.stderr


def test_an_infinite_evalue_is_taken_as_no_limit():
    """`search --evalue inf` reports every hit; a number option held finite refuses inf."""
    import click

    from pfamalign.commands._common import Number

    search = main.get_command(click.Context(main), "search")
    assert next(p for p in search.params if p.name == "evalue").type.convert("inf", None, None) == math.inf
    with pytest.raises(click.BadParameter, match="not a finite number"):
        Number(min=0).convert("inf", None, None)


def test_the_max_length_default_is_4096():
    import click

    command = main.get_command(click.Context(main), "align")
    assert next(p for p in command.params if p.name == "max_length").default == 4096


def test_an_unread_option_names_the_models_decoder_only_when_it_chose_it():
    from pfamalign.decoding import DecoderSettings
    from pfamalign.inference import default_model_dir

    model_decoder = DecoderSettings.load(default_model_dir()).decoder
    assert model_decoder != "affine"
    res = run(["align", PDZ_A, PDZ_B, "--threshold", "0.1"])  # the model's decoder does not read it
    assert res.exit_code == 2 and f"to the {model_decoder} decoder (the model's; choose another with --decoder)" \
        in res.output, res.output
    res = run(["align", PDZ_A, PDZ_B, "--decoder", "mea", "--threshold", "0.1"])
    assert res.exit_code == 2 and "to the mea decoder, which reads" in res.output, res.output
