"""Issue 12: nothing lost, nothing unsafe. Each test pins one defect found by using the commands
as a careful (and a careless) user would; the closing list in docs/design.md maps items to tests."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from pfamalign.cli import main

ROOT = pathlib.Path(__file__).resolve().parent
SEED = ROOT / "data" / "pfam_seed"
PDZ_A = "PEVRLVELERGPKGLGFNIVGGKDGGEEGGGIFVSRVVEGGPADKAGLRTGDEILSVNGVSLEGL"
PDZ_B = "PRLVTLQRRPGEGLGFSIVGGEDGQGHGIFVSRIVPGGAAEKDGRLRVGDRILAVNGVDVRGA"


def run(args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], env={"CI": "1", "COLUMNS": "200"}, **kw)


def assert_clear_error(result, *fragments):
    """A user error: exit status 2 or 1, ``Error: ...`` naming the fragments, no traceback."""
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and "Error:" in result.output, result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


# ---- 1: outputs are atomic and never an input ------------------------------------------------

def test_align_output_onto_its_pairs_input_is_refused_and_the_input_survives(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"{PDZ_A}\t{PDZ_B}\n")
    result = run(["align", "--pairs", pairs, "-o", pairs])
    assert_clear_error(result, "also an input")
    assert pairs.read_text() == f"{PDZ_A}\t{PDZ_B}\n"


def test_certify_json_onto_its_stockholm_input_is_refused_before_any_work(tmp_path):
    sto = tmp_path / "f.sto"
    sto.write_bytes((SEED / "PF00076.sto").read_bytes())
    before = sto.read_bytes()
    result = run(["certify", "--stockholm", sto, "--ids", "a", "b", "--json", sto])
    assert_clear_error(result, "also an input")
    assert sto.read_bytes() == before


def test_output_into_a_missing_directory_is_a_clear_error(tmp_path):
    result = run(["align", PDZ_A, PDZ_B, "-o", tmp_path / "missing" / "out.txt"])
    assert_clear_error(result, "does not exist", "mkdir -p")


def test_align_writes_output_and_plot_atomically(tmp_path):
    out, plot = tmp_path / "aln.json", tmp_path / "plan.png"
    result = run(["align", PDZ_A, PDZ_B, "-f", "json", "-o", out, "--plot", plot])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["id_a"] == "seq_a"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aln.json", "plan.png"]  # no temporaries


# ---- 8, 9: bad pairs files -------------------------------------------------------------------

def test_non_utf8_pairs_file_is_a_clear_error(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_bytes(b"ACDE\tKLMN\n\xff\xfe\x00\x01\tACD\n")
    result = run(["align", "--pairs", pairs])
    assert_clear_error(result, "not UTF-8")


def test_pairs_line_without_end_is_bounded(tmp_path):
    """/dev/zero as a pairs file: a clear error within a 1 GiB address-space limit."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));\n"
            "from pfamalign import inputs\n"
            "try:\n    list(inputs.read_pairs_tsv('/dev/zero'))\n"
            "except ValueError as err:\n    print('VALUEERROR', err); sys.exit(3)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "longer than" in proc.stdout


# ---- 10: residues vs file names --------------------------------------------------------------

def test_residue_string_naming_a_file_is_read_as_residues_with_a_warning(tmp_path, monkeypatch,
                                                                           capsys):
    from pfamalign import inputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ACDEF").write_text(">other\nWWWWWWWW\n")
    (tmp_path / "q.txt").write_text(">q\nKLMNP\n")
    pair = inputs.pair_from_sequences("ACDEF", "@q.txt")
    assert (pair["q_seq"], pair["k_seq"], pair["k_id"]) == ("ACDEF", "KLMNP", "q")
    assert "read as residues" in capsys.readouterr().err
    assert inputs.pair_from_sequences("./ACDEF", "KLM")["q_seq"] == "WWWWWWWW"
    with pytest.raises(ValueError, match="no such FASTA file"):
        inputs.pair_from_sequences("@missing", "KLM")


# ---- 11: transport settings and the plan -----------------------------------------------------

@pytest.mark.parametrize("kw", [dict(eps=1e-6), dict(eps=float("nan")), dict(eps=float("inf")),
                                dict(base_steps=0, tail_steps=0), dict(tail_steps=2.5),
                                dict(base_steps=10 ** 9), dict(half_band=True)])
def test_meaningless_transport_settings_are_refused(kw):
    from pfamalign.kernels import TransportConfig

    with pytest.raises(ValueError):
        TransportConfig(**{"half_band": 8, **kw})


def test_a_plan_that_is_not_a_plan_is_an_error_before_decoding():
    from pfamalign.inference import PairPlan, Predictor

    predictor = Predictor()
    aln, pp = predictor.align(PDZ_A, PDZ_B)
    pp.check()  # the shipped model's plans pass
    broken = pp.plan.copy()
    broken[:-1] *= 2.0  # every row carries mass 2: what eps = 1e-6 produced
    with pytest.raises(ValueError, match="not a plan"):
        predictor.decode(PairPlan(broken))
    broken[0, 0] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        predictor.decode(PairPlan(broken))


# ---- 8: decoding.json ------------------------------------------------------------------------

@pytest.mark.parametrize("text,fragment", [('{"decoder": "mea", "gap_cots": 1.0}', "unknown"),
                                           ('{"gap_open": "3"}', "gap_open"),
                                           ('{"threshold": NaN}', "finite"),
                                           ('[1, 2]', "JSON object"),
                                           ('{"gap_open": ', "not a readable")])
def test_bad_decoding_json_is_a_clear_error(tmp_path, text, fragment):
    from pfamalign.inference import DecoderSettings

    (tmp_path / "decoding.json").write_text(text)
    with pytest.raises(ValueError, match=fragment):
        DecoderSettings.load(tmp_path)


# ---- 15: kill points only through the test seam ----------------------------------------------

def test_a_fault_variable_in_the_users_shell_kills_nothing(tmp_path):
    code = ("import pathlib; from pfamalign.pipelines import records\n"
            f"records.write_text(pathlib.Path({str(tmp_path / 'x.txt')!r}), 'kept')\n")
    env = dict(os.environ, PFAMALIGN_FAULT_KILL_AT="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x.txt").read_text() == "kept"
