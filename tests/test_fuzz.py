"""Property-based fuzzing of every parser a user's file or argument reaches (issue 12): FASTA,
Stockholm (plain and gzip), pairs TSV, decoding.json, the model config and the CLI's sequence
arguments. The property: any input either parses or raises the parser's ValueError (whose
message the commands print); never another exception, which would reach the user as a
traceback. A few dozen examples each by default; ``--full`` runs the thorough profile."""

from __future__ import annotations

import gzip
import json
import pathlib
import tempfile

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent
PROFILES = [pytest.param(30, id="quick"), pytest.param(600, id="thorough", marks=pytest.mark.slow)]


def check(n_examples: int, *strategies):
    """Runs the decorated property with ``n_examples`` examples (no deadline: the machine
    is shared)."""
    def wrap(prop):
        settings(max_examples=n_examples, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
                 )(given(*strategies)(prop))()
    return wrap


@pytest.fixture(autouse=True, scope="module")
def _fuzz_root(tmp_path_factory):
    """The module's examples write under one pytest temporary directory (pruned with pytest's
    others) rather than leaving a directory per example in the system's."""
    global _FUZZ_ROOT
    _FUZZ_ROOT = tmp_path_factory.mktemp("fuzz")
    yield
    _FUZZ_ROOT = None


_FUZZ_ROOT: pathlib.Path | None = None


def _file(data: bytes, suffix: str) -> pathlib.Path:
    directory = pathlib.Path(tempfile.mkdtemp(dir=_FUZZ_ROOT))
    path = directory / f"input{suffix}"
    path.write_bytes(data)
    return path


def _mutated(seed: str):
    """Text near a valid file: the seed with random lines inserted, cut, or replaced."""
    lines = seed.splitlines(keepends=True)
    line = st.one_of(st.text(max_size=40), st.sampled_from(
        ["//\n", "# STOCKHOLM 1.0\n", "#=GF AC PF00001.1\n", "#=GC RF xxx\n", ">\n", ">a b\n",
         "\t\t\n", "x/1-3 A-C\n", "x/1-3 ACDEFG\n", "#=GS x AC Q1\n", "\x00\n", "\r\n"]))
    return st.builds(
        lambda cut, extra, at: "".join(lines[:cut] + extra + lines[at:]),
        st.integers(0, len(lines)), st.lists(line, max_size=5), st.integers(0, len(lines)))


SEED_STO = (ROOT / "data" / "pfam_seed" / "PF02184.sto").read_text()
FASTA = ">q1 query\nACDEFGHIKLMNPQ\nRSTVWY\n"
RAW = st.binary(max_size=400)


@pytest.mark.parametrize("n", PROFILES)
def test_fasta_files_parse_or_raise_valueerror(n):
    from pfamalign import inputs

    @check(n, st.one_of(RAW, _mutated(FASTA).map(lambda t: t.encode("utf-8", "surrogatepass"))))
    def prop(data):
        path = _file(data, ".fasta")
        try:
            seq_id, residues = inputs.read_sequence(str(path), "a")
        except ValueError:
            return
        assert residues.isalpha() and residues.isupper()


@pytest.mark.parametrize("n", PROFILES)
def test_stockholm_files_parse_or_raise_stockholm_error(n):
    from pfamalign.pipelines.stockholm import (StockholmError, iter_raw_families, parse_family,
                                               read_families)

    @check(n, st.one_of(RAW, _mutated(SEED_STO).map(lambda t: t.encode("latin-1", "replace"))),
           st.booleans())
    def prop(data, compress):
        if compress:  # also cut the compressed stream: a truncated download
            data = gzip.compress(data)[: max(2, len(data) // 2)] if data else gzip.compress(data)
        path = _file(data, ".sto")
        try:
            list(read_families([path]))
        except StockholmError:
            pass
        for raw in iter_raw_families(path, skip_bad=True):  # --skip-bad never raises
            if raw.error is None:
                try:
                    parse_family(raw)
                except StockholmError:
                    pass


@pytest.mark.parametrize("n", PROFILES)
def test_pairs_files_parse_or_raise_valueerror(n):
    from pfamalign import inputs

    tsv = st.lists(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(["ACDE", "KLM", "#"])),
                            max_size=5).map("\t".join), max_size=6).map("\n".join)
    @check(n, st.one_of(RAW, tsv.map(lambda t: t.encode("utf-8", "surrogatepass"))))
    def prop(data):
        path = _file(data, ".tsv")
        try:
            for rec in inputs.read_pairs_tsv(path):  # a bad line comes as a BadRecord
                assert isinstance(rec, inputs.BadRecord) or set(rec) >= {
                    "q_id", "k_id", "q_seq", "k_seq", "where"}
        except ValueError:
            pass


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


@pytest.mark.parametrize("n", PROFILES)
def test_decoding_json_loads_or_raises_valueerror(n):
    from pfamalign.decoding import DecoderSettings

    keys = st.sampled_from(["decoder", "mode", "gap_open", "gap_extend", "threshold", "gap_cost",
                            "min_mass", "plan_weight", "alpha", "end_gaps", "extra"])
    values = st.one_of(JSON_VALUES, st.sampled_from(["affine", "mea", "hybrid", "posterior",
                                                     "global", "local"]),
                       st.floats(-5, 20))
    @check(n, st.one_of(st.dictionaries(keys, values, max_size=6), JSON_VALUES))
    def prop(obj):
        directory = _file(json.dumps(obj).encode(), ".json").parent
        (directory / "decoding.json").write_text(json.dumps(obj))
        try:
            DecoderSettings.load(directory)
        except ValueError:
            pass


@pytest.mark.parametrize("n", PROFILES)
def test_model_config_loads_or_raises_checkpoint_error(n):
    from pfamalign import checkpoint
    from pfamalign.inference import default_model_dir

    good = json.loads((default_model_dir() / "config.json").read_text())
    paths = [("model", k) for k in good["model"] if k != "transport"] + [
        ("model", "transport", k) for k in good["model"]["transport"]] + [("format_version",)]

    def mutate(path, value):
        obj = json.loads(json.dumps(good))
        target = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return obj

    @check(n, st.one_of(st.builds(mutate, st.sampled_from(paths), JSON_VALUES), JSON_VALUES))
    def prop(obj):
        path = _file(json.dumps(obj).encode(), ".json")
        try:
            checkpoint.read_model_config(path)
        except checkpoint.CheckpointError:
            pass


@pytest.mark.parametrize("n", PROFILES)
def test_sequence_arguments_parse_or_raise_valueerror(n):
    from pfamalign import inputs

    arg = st.one_of(st.text(max_size=30), st.text(alphabet="ACDEFGHIKLMNPQRSTVWYacdxz*-./@ ",
                                                   max_size=30))
    @check(n, arg, arg)
    def prop(a, b):
        try:
            pair = inputs.pair_from_sequences(a, b)
        except ValueError:
            return
        assert pair["q_seq"].isalpha() and pair["k_seq"].isalpha()


@pytest.mark.parametrize("n", [pytest.param(8, id="quick"),
                               pytest.param(100, id="thorough", marks=pytest.mark.slow)])
def test_cli_sequence_arguments_never_end_in_a_traceback(n):
    from click.testing import CliRunner

    from pfamalign.cli import main

    bad = st.text(alphabet="ACDEF0123 -*./@\t\n\x00é", min_size=0, max_size=12).filter(
        lambda s: not s.isalpha())
    @check(n, bad, st.sampled_from(["align", "certify", "barycenter"]))
    def prop(a, command):
        result = CliRunner().invoke(main, [command, a, "ACDEFG"], env={"CI": "1"})
        assert result.exit_code == 2, (a, result.output, result.exception)
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert "Error" in result.output
