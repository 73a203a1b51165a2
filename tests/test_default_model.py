"""The model shipped inside the package: it loads with no arguments and it aligns.

`RRM_1` (PF00076) is a test family of the split the default model was trained on
(see `pfamalign/assets/default_model/TRAINING.md`): the model never saw it.
"""

import json
import pathlib

import numpy as np
from click.testing import CliRunner

from pfamalign.cli import main
from pfamalign.decoding import DecoderSettings
from pfamalign.inference import Predictor, default_model_dir

SEED = pathlib.Path(__file__).resolve().parent / "data" / "pfam_seed"


def test_default_model_ships_with_its_decoder_settings():
    path = default_model_dir()
    assert (path / "config.json").is_file(), "pfamalign/assets/default_model is missing"
    assert (path / "decoding.json").is_file()
    predictor = Predictor()
    assert predictor.path == path
    assert predictor.config.embedder_id.startswith("builtin/")  # runs with no downloads
    assert predictor.decoding == DecoderSettings.load(path)


def test_default_model_aligns_identical_sequences_on_the_diagonal():
    seq = "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE"
    aln, plan = Predictor().align(seq, seq)
    assert plan.plan.shape == (len(seq) + 1, len(seq) + 1)
    np.testing.assert_array_equal(aln.pairs, np.stack([np.arange(len(seq))] * 2, 1))


def test_align_command_runs_on_the_default_model():
    res = CliRunner().invoke(main, ["align", "MKVLAAGIVGLLLAQSPEDRW", "MKVLSAGIVGLAQSPDRW", "-f", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["pairs"]) > 10


def test_default_model_beats_the_diagonal_on_an_unseen_family(tmp_path):
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(main, ["eval", "--stockholm", str(SEED / "PF00076.sto"),
                                    "--pairs-per-family", "24", "--baselines", "diagonal",
                                    "--bootstrap", "20", "--json", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    methods = json.loads(out.read_text())["methods"]
    f1 = {m: methods[m]["prf"]["all"]["micro"]["f1"]["value"] for m in ("model", "diagonal")}
    assert f1["model"] > f1["diagonal"] + 0.2, f1


def test_shipped_ensemble_loads_by_name_and_holds_the_default_model():
    """`--checkpoint ensemble` is the shipped ensemble; its convolution member is the default
    model byte for byte (retraining one without the other is caught here)."""
    from pfamalign.ensemble import EnsemblePredictor, read_members
    from pfamalign.inference import shipped_model_dir

    path = shipped_model_dir("ensemble")
    members = read_members(path)
    assert [m.path for m in members] == ["align_ce", "align_ceta"]
    for name in ("checksums.json", "config.json", "decoding.json"):
        assert (path / "align_ce" / name).read_bytes() == (default_model_dir() / name).read_bytes()
    predictor = Predictor(path)
    assert isinstance(predictor, EnsemblePredictor)
    assert predictor.config.embedder_id.startswith("builtin/")  # runs with no downloads
    res = CliRunner().invoke(main, ["align", "MKVLAAGIVGLLLAQSPEDRW", "MKVLSAGIVGLAQSPDRW", "-f", "json",
                                    "--checkpoint", "ensemble"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["pairs"]) > 10 and "ensemble of align_ce + align_ceta (shipped)" in json.dumps(out)
