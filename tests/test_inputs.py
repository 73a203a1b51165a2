"""Library inputs of the commands (pfamalign.inputs) and the one JSON policy (pfamalign.jsonio),
without a model."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from pfamalign import inputs, jsonio

SEED = pathlib.Path(__file__).resolve().parent / "data" / "pfam_seed"


def test_pairs_tsv_records_ids_and_lines(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("# comment\n\nMKV\tMKL\nx1\tAAA\tx2\tCCC\n")
    got = list(inputs.read_pairs_tsv(path))
    assert [(p["q_id"], p["q_seq"], p["k_id"], p["k_seq"]) for p in got] == [
        ("pair3_a", "MKV", "pair3_b", "MKL"), ("x1", "AAA", "x2", "CCC")]
    assert got[1]["where"] == f"{path}:4" and got[1]["target"] is None


def test_bad_pairs_tsv_line_streams_then_names_the_line(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("MKV\tMKL\nMKV\n")
    pairs = inputs.read_pairs_tsv(path)
    assert next(pairs)["q_seq"] == "MKV"
    with pytest.raises(ValueError, match="bad.tsv:2: expected 2"):
        next(pairs)


def test_sequence_arguments(tmp_path):
    assert inputs.pair_from_sequences("mkv", "MKL")["q_seq"] == "MKV"
    two = tmp_path / "two.fasta"
    two.write_text(">a\nMKV\n>b\nMKL\n")
    with pytest.raises(ValueError, match="expected exactly one FASTA record, found 2"):
        inputs.read_sequence(str(two), "seq_a")


def test_stockholm_pair_and_missing_ids():
    sto = SEED / "PF00041.sto"
    names = [line.split()[0] for line in sto.read_text().splitlines() if line and not line.startswith(("#", "/"))]
    pair = inputs.pair_from_stockholm(sto, names[0], names[1])
    assert len(pair["target"]) == len(pair["q_seq"]) and 0 <= pair["pid"] <= 100
    with pytest.raises(ValueError, match="no family holds both"):
        inputs.pair_from_stockholm(sto, names[0], "nothere")


def test_json_policy_is_strict_and_plain():
    obj = {"nan": float("nan"), "inf": np.float32("inf"), "arr": np.array([1.5, np.nan]),
           "flag": np.bool_(True), "path": pathlib.Path("a/b"), 3: (1, 2)}
    line = jsonio.dumps_line(obj)
    assert "\n" not in line
    assert json.loads(line) == {"nan": None, "inf": None, "arr": [1.5, None], "flag": True,
                                "path": "a/b", "3": [1, 2]}
