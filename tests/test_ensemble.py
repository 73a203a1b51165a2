"""Ensembles (``pfamalign.ensemble``, ``pfamalign ensemble``): the plan is the mean of the
members' plan pair-HMM posteriors, checked against the numpy reference pair-HMM; building one
chooses the powers and the decoder and is atomic; bad ensemble files and the commands that
need one transport model fail with a message."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from pfamalign import ensemble
from pfamalign.alignment.decode import mea_decode
from pfamalign.alignment.metrics import alignment_counts
from pfamalign.alignment.pairhmm import match_posteriors, plan_log_odds
from pfamalign.cli import main
from pfamalign.inference import Predictor

PDZ_A = "PEVRLVELERGPKGLGFNIVGGKDGGEEGGGIFVSRVVEGGPADKAGLRTGDEILSVNGVSLEGL"
PDZ_B = "PRLVTLQRRPGEGLGFSIVGGEDGQGHGIFVSRIVPGGAAEKDGRLRVGDRILAVNGVDVRGA"


def run(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _model(out: pathlib.Path, seed: int, config: str = "align_ce") -> pathlib.Path:
    from pfamalign import checkpoint
    from pfamalign.configs import get_config
    from pfamalign.model import build_model
    from pfamalign.pipelines.embed import get_embedder

    emb = get_embedder("builtin/onehot+blosum62")
    cfg = get_config(config, embedder_id=emb.embedder_id, feature_dim=emb.dim).model
    checkpoint.save_model(out, build_model(cfg, seed=seed), cfg)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("members")
    return _model(root / "a", seed=1), _model(root / "b", seed=2)


@pytest.fixture(scope="module")
def dataset(seed_dataset):
    return seed_dataset


def _write(directory: pathlib.Path, members: list[tuple[pathlib.Path, float]]) -> pathlib.Path:
    """An ensemble directory written by hand (the file format, not the builder)."""
    directory.mkdir()
    entries = []
    for n, (model, power) in enumerate(members):
        shutil.copytree(model, directory / f"m{n}")
        entries.append({"path": f"m{n}", "plan_power": power})
    (directory / ensemble.ENSEMBLE_FILE).write_text(json.dumps({"members": entries}))
    return directory


def test_the_ensemble_plan_is_the_mean_of_the_members_plan_pairhmm_posteriors(models, tmp_path):
    ens = Predictor(_write(tmp_path / "ens", [(models[0], 0.1), (models[1], 0.3)]))
    assert isinstance(ens, ensemble.EnsemblePredictor)
    _, got = ens.align(PDZ_A, PDZ_B)
    # the reference: each member's own symmetrized plan, the numpy pair-HMM at its power
    want = np.zeros((len(PDZ_A), len(PDZ_B)))
    for model, power in zip(models, (0.1, 0.3)):
        member = Predictor(model)
        assert not isinstance(member, ensemble.EnsemblePredictor)
        _, pp = member.align(PDZ_A, PDZ_B)
        want += match_posteriors(member.pairhmm, PDZ_A, PDZ_B,
                                 log_emissions=plan_log_odds(pp.real, power)) / 2
    np.testing.assert_allclose(got.real, want, atol=1e-6)
    np.testing.assert_allclose(got.row_dustbin, 1 - want.sum(axis=1), atol=1e-6)
    np.testing.assert_allclose(got.col_dustbin, 1 - want.sum(axis=0), atol=1e-6)
    got.check()  # a plan: rows and columns at most one
    # the batched path (align_records, several lengths) gives the same plans as one pair at a time
    pairs = [{"q_seq": PDZ_A, "k_seq": PDZ_B, "q_id": "a", "k_id": "b"},
             {"q_seq": PDZ_A[:30], "k_seq": PDZ_B[5:50], "q_id": "c", "k_id": "d"}]
    for pair, (rec, pp) in zip(pairs, ens.align_records(pairs)):
        aln, alone = ens.align(pair["q_seq"], pair["k_seq"])
        np.testing.assert_allclose(pp.plan, alone.plan, atol=1e-6)
        assert rec.pairs.tolist() == aln.pairs.tolist()


def test_averaged_posteriors_align_what_no_member_is_sure_of():
    """Each member is unsure of a different pair of the diagonal and leaves it out (the F1
    objective drops pairs below half the F1 reached); the mean is sure enough of both."""
    n, target = 6, np.arange(6)

    def member(unsure):
        post = np.eye(n) * 0.9
        post[unsure, unsure] = 0.2
        return post

    decode = lambda post: list(alignment_counts(
        mea_decode(ensemble.posterior_plan(post).real, objective="f1").pairs, target))
    assert decode(member(1)) == [n - 1, n - 1, n]
    assert decode((member(1) + member(4)) / 2) == [n, n, n]


def test_ensemble_command_chooses_powers_and_decoder_and_loads_everywhere(models, dataset, tmp_path):
    out = tmp_path / "ens"
    res = run(["ensemble", *models, "--data", dataset, "--split", "val", "--max-pairs", "6", "-o", out])
    assert res.exit_code == 0, res.output
    written = json.loads((out / ensemble.ENSEMBLE_FILE).read_text())
    record = json.loads((out / "training.json").read_text())
    assert [m["path"] for m in written["members"]] == ["align_ce", "align_ce2"]
    for member, rows in zip(written["members"], record["members"]):
        assert member["plan_power"] in ensemble.MEMBER_POWERS
        # the chosen power is the best of its rows (ties: the first)
        best = max(rows["power_rows"], key=lambda r: r["f1"])
        assert member["plan_power"] == best["plan_power"]
        assert (out / member["path"] / "config.json").is_file()
    assert record["decoder"]["source"] == "tuned" and (out / "decoding.json").is_file()
    from pfamalign.outputs import is_temporary

    assert not [p.name for p in out.parent.iterdir() if is_temporary(p.name)]  # staged, renamed

    res = run(["align", PDZ_A, PDZ_B, "--checkpoint", out, "--format", "json"])
    assert res.exit_code == 0, res.output
    assert "ensemble of align_ce + align_ce" in res.output

    # the commands that need one transport model say so and name a member
    for args in (["certify", PDZ_A, PDZ_B], ["align", PDZ_A, PDZ_B, "--engine", "steps", "--steps", "3"],
                 ["compile", "--data", dataset, "-o", tmp_path / "compiled"]):
        res = run([*args, "--checkpoint", out])
        assert res.exit_code != 0 and "ensemble" in res.output and "Traceback" not in res.output, (args, res.output)

    # an existing --out is refused and left as it was
    before = (out / ensemble.ENSEMBLE_FILE).read_bytes()
    res = run(["ensemble", *models, "--data", dataset, "-o", out])
    assert res.exit_code == 2 and "already exists" in res.output
    assert (out / ensemble.ENSEMBLE_FILE).read_bytes() == before


def test_ensemble_warns_when_a_member_trained_on_the_families_that_tune_it(models, dataset, tmp_path):
    """The powers and the decoder are chosen on --split's pairs: a member whose training
    record lists those families is named in a warning (eval warns alike), the others not."""
    from pfamalign.training.rundir import split_families

    seen = tmp_path / "seen"
    shutil.copytree(models[0], seen)
    families = split_families(dataset, "val")
    (seen / "training.json").write_text(json.dumps({"trained_on": {"families": families}, "decoder": {}}))
    res = CliRunner().invoke(main, ["ensemble", str(seen), str(models[1]), "--data", str(dataset), "--split",
                                    "val", "--max-pairs", "6", "--no-tune", "-o", str(tmp_path / "ens")])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"Warning: {seen} trained on "), warnings
    assert "the choice favours it" in warnings[0]


def _run_of(model: pathlib.Path, run: pathlib.Path, finished: bool = True) -> pathlib.Path:
    """A run directory as `pfamalign train` leaves it: its own config.json, and ``model``
    as RUN/model, finished (its training record written last) or not (no model yet)."""
    from pfamalign.checkpoint import TRAINING_RECORD

    run.mkdir()
    shutil.copy(model / "config.json", run / "config.json")
    if finished:
        shutil.copytree(model, run / "model")
        (run / "model" / TRAINING_RECORD).write_text("{}")
    return run


@pytest.mark.parametrize("case, message", [
    ("twice", "given twice"),
    ("one", "at least two"),
    ("nested", "is an ensemble"),
    ("inside", "inside the model"),
    ("run and its model", "given twice"),  # a finished run stands for RUN/model, as elsewhere
    ("unfinished run", "is not a model directory"),  # it has a config.json, and no params/
    ("a copy", "hold the same parameters"),  # the same model under another path
])
def test_ensemble_command_refuses_bad_members(models, dataset, tmp_path, case, message):
    nested = _write(tmp_path / "nested", [(models[0], 0.1), (models[1], 0.1)])
    run_dir = _run_of(models[0], tmp_path / "run", finished=case != "unfinished run")
    copy = tmp_path / "copy"
    shutil.copytree(models[1], copy)
    args = {"twice": [models[0], models[0]], "one": [models[0]], "nested": [nested, models[0]],
            "inside": [models[0], models[1]], "run and its model": [run_dir, run_dir / "model"],
            "unfinished run": [run_dir, models[1]], "a copy": [models[0], models[1], copy]}[case]
    out = models[0] / "sub" if case == "inside" else tmp_path / "out"
    res = run(["ensemble", *args, "--data", dataset, "-o", out])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not out.exists()


@pytest.mark.parametrize("content, message", [
    ("{", "not a readable ensemble file"),
    ('{"members": []}', "at least one member"),
    ('{"members": [{"path": "../a", "plan_power": 0.1}]}', "inside the ensemble directory"),
    ('{"members": [{"path": "m0", "plan_power": 0}]}', "plan_power must be > 0"),
    ('{"members": [{"path": "m0"}]}', "needs both path and plan_power"),
    ('{"members": [{"path": "m0", "plan_power": 0.1, "weight": 2}]}', "unknown field"),
    ('{"members": [{"path": "m0", "plan_power": "0.1"}]}', "plan_power"),
])
def test_bad_ensemble_files_are_errors_that_say_what_is_wrong(models, tmp_path, content, message):
    ens = _write(tmp_path / "ens", [(models[0], 0.1)])
    (ens / ensemble.ENSEMBLE_FILE).write_text(content)
    with pytest.raises(ValueError, match=message):
        Predictor(ens)
    res = run(["align", PDZ_A, PDZ_B, "--checkpoint", ens])
    assert res.exit_code == 2 and message.split()[0] in res.output and "Traceback" not in res.output


def test_ensemble_without_tuning_decodes_with_the_shipped_decoder(models, dataset, tmp_path):
    """--no-tune writes the shipped model's decoder: an ensemble is never left on the affine
    defaults that a directory without decoding.json would fall back to."""
    from pfamalign.decoding import DecoderSettings
    from pfamalign.inference import default_model_dir

    out = tmp_path / "ens"
    res = run(["ensemble", *models, "--data", dataset, "--max-pairs", "4", "--no-tune", "-o", out])
    assert res.exit_code == 0, res.output
    assert DecoderSettings.load(out) == DecoderSettings.load(default_model_dir())
    assert json.loads((out / "training.json").read_text())["decoder"]["source"] == "default_model"


def test_an_ensemble_without_decoding_json_falls_back_as_a_model_does(tmp_path):
    """A hand-made ensemble directory without decoding.json decodes with the shipped model's
    decoder, as a model directory without one does, not with the affine defaults."""
    from pfamalign.decoding import DecoderSettings
    from pfamalign.inference import Predictor, default_model_dir, shipped_model_dir

    ens = tmp_path / "ens"
    shutil.copytree(shipped_model_dir("ensemble"), ens)
    (ens / "decoding.json").unlink()
    predictor = Predictor(ens)
    assert predictor.decoding == DecoderSettings.load(default_model_dir()) != DecoderSettings()


def test_verify_checks_every_member_of_an_ensemble(tmp_path):
    """`pfamalign verify ENS` checks each member model against its checksums (the shipped
    ensemble, copied): all match; one flipped byte in a member's parameters is a problem naming
    that member, exit 1; a member missing from the directory is reported too."""
    ens = tmp_path / "ens"
    from pfamalign.inference import shipped_model_dir

    shutil.copytree(shipped_model_dir("ensemble"), ens)
    res = run(["verify", ens])
    assert res.exit_code == 0, res.output
    members = [m.path for m in ensemble.read_members(ens)]
    assert [line.split(":")[0] for line in res.output.splitlines() if line.startswith("checked")] == [
        f"checked ensemble {ens}"] + [f"checked {ens / m}" for m in members]  # its own files, then each member
    decoding = json.loads((ens / "decoding.json").read_text())
    (ens / "decoding.json").write_text(json.dumps({**decoding, "alpha": 0.9}))  # a valid, edited decoder
    res = run(["verify", ens])
    assert res.exit_code == 1 and f"{ens / 'decoding.json'}: checksum mismatch" in res.stderr
    shutil.copy(shipped_model_dir("ensemble") / "decoding.json", ens / "decoding.json")
    (ens / "checksums.json").write_text("{")  # damaged: one problem line, not a traceback
    res = run(["verify", ens])
    assert res.exit_code == 1 and f"{ens / 'checksums.json'}: unreadable" in res.stderr
    assert "Traceback" not in res.output
    shutil.copy(shipped_model_dir("ensemble") / "checksums.json", ens / "checksums.json")
    (ens / "checksums.json").unlink()  # nothing vouches for its members and powers: a problem, as for a model
    res = run(["verify", ens])
    assert res.exit_code == 1 and f"{ens}: no checksums.json" in res.stderr
    assert "rebuild it with `pfamalign ensemble`" in res.stderr  # what to do about it
    shutil.copy(shipped_model_dir("ensemble") / "checksums.json", ens / "checksums.json")
    victim = next(p for p in sorted((ens / members[1] / "params").rglob("*")) if p.is_file() and p.stat().st_size > 100)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    res = run(["verify", ens])
    assert res.exit_code == 1 and str(ens / members[1]) in res.stderr and str(victim.name) in res.stderr
    shutil.rmtree(ens / members[0])
    res = run(["verify", ens])
    assert res.exit_code == 1 and f"{ens / members[0]}: ensemble member missing" in res.stderr


# ---- found missing by a mutation sweep ----------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    ({"members": [{"path": "m0", "plan_power": 0.1}], "weights": [2]}, 'expected {"members"'),  # an unknown key
    ({"members": [{"path": "sub/../m0", "plan_power": 0.1}]}, "inside the ensemble directory"),
])
def test_ensemble_files_with_unknown_keys_or_dotdot_paths_are_refused(tmp_path, content, message):
    from pfamalign import ensemble

    (tmp_path / "m0").mkdir()
    (tmp_path / ensemble.ENSEMBLE_FILE).write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        ensemble.read_members(tmp_path)


def test_posterior_plan_dustbins_are_never_negative():
    from pfamalign import ensemble

    plan = ensemble.posterior_plan(np.array([[0.7, 0.6], [0.5, 0.0]]))  # a row and a column above one
    assert plan.row_dustbin.tolist() == [0.0, 0.5] and plan.col_dustbin.tolist() == [0.0, 0.4]


def test_the_member_power_is_chosen_by_the_f1_objective():
    from pfamalign import ensemble
    from pfamalign.decoding import DecoderSettings

    assert ensemble.plan_only_decoding(0.2) == DecoderSettings(decoder="posterior", alpha=1.0, objective="f1",
                                                               plan_power=0.2)


def test_an_ensemble_of_three_members_is_their_mean(models, tmp_path):
    from pfamalign.inference import Predictor

    _, one = Predictor(_write(tmp_path / "one", [(models[0], 0.1)])).align(PDZ_A, PDZ_B)
    _, three = Predictor(_write(tmp_path / "three", [(models[0], 0.1)] * 3)).align(PDZ_A, PDZ_B)
    np.testing.assert_allclose(three.real, one.real, atol=1e-6)


def test_an_ensemble_as_a_member_is_refused(models, tmp_path):
    from pfamalign import ensemble
    from pfamalign.inference import Predictor

    inner = _write(tmp_path / "inner", [(models[0], 0.1), (models[1], 0.2)])
    outer = tmp_path / "outer"
    outer.mkdir()
    shutil.copytree(inner, outer / "m0")
    (outer / ensemble.ENSEMBLE_FILE).write_text(json.dumps({"members": [{"path": "m0", "plan_power": 0.1}]}))
    with pytest.raises(ValueError, match="an ensemble member must be a single model"):
        Predictor(outer)


def test_the_ensemble_model_hash_follows_its_pairhmm(models, tmp_path):
    from pfamalign.inference import Predictor
    from pfamalign.outputs import shipped_assets

    ens = _write(tmp_path / "ens", [(models[0], 0.1), (models[1], 0.2)])
    hmm = json.loads((shipped_assets() / "pairhmm.json").read_text())
    (ens / "pairhmm.json").write_text(json.dumps(hmm))
    before = Predictor(ens).model_hash
    hmm["prior"][0], hmm["prior"][1] = hmm["prior"][1], hmm["prior"][0]  # another, valid pair-HMM
    (ens / "pairhmm.json").write_text(json.dumps(hmm))
    assert Predictor(ens).model_hash != before


def test_ensemble_build_records_trained_families_only_when_all_known_and_takes_the_first_pairhmm(
        models, dataset, tmp_path):
    from pfamalign.outputs import shipped_assets
    from pfamalign.training.rundir import split_families

    families = split_families(dataset, "train")
    first, second = tmp_path / "first", tmp_path / "second"
    for model, copy, known in ((models[0], first, families[:2]), (models[1], second, families[1:3])):
        shutil.copytree(model, copy)
        (copy / "training.json").write_text(json.dumps({"trained_on": {"families": known}, "decoder": {}}))
    shutil.copy(shipped_assets() / "pairhmm.json", first / "pairhmm.json")
    build = lambda out: run(["ensemble", first, second, "--data", dataset, "--max-pairs", "4", "--no-tune",  # noqa: E731
                             "-o", out])
    res = build(tmp_path / "both")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "both" / "training.json").read_text())["trained_on"] == {
        "families": sorted(set(families[:3]))}  # the union of what the members learnt from
    assert (tmp_path / "both" / "pairhmm.json").read_bytes() == (first / "pairhmm.json").read_bytes()
    (second / "training.json").unlink()  # one member's families unknown: none claimed
    res = build(tmp_path / "one")
    assert res.exit_code == 0, res.output
    assert "trained_on" not in json.loads((tmp_path / "one" / "training.json").read_text())
