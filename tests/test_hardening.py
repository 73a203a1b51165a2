"""Issue 12: nothing lost, nothing unsafe. Each test pins one defect found by using the commands
as a careful (and a careless) user would; the closing list in docs/design.md maps items to tests."""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from pfamalign.cli import main
from pfamalign.outputs import TEMPORARY_GLOB
from test_train import TINY as TRAIN_TINY

ROOT = pathlib.Path(__file__).resolve().parent
SEED = ROOT / "data" / "pfam_seed"
PDZ_A = "PEVRLVELERGPKGLGFNIVGGKDGGEEGGGIFVSRVVEGGPADKAGLRTGDEILSVNGVSLEGL"
PDZ_B = "PRLVTLQRRPGEGLGFSIVGGEDGQGHGIFVSRIVPGGAAEKDGRLRVGDRILAVNGVDVRGA"


def run(args, env=None, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], env={"CI": "1", "COLUMNS": "200", **(env or {})}, **kw)


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


def test_an_output_ending_in_a_slash_is_refused_not_written_as_a_file(tmp_path):
    # pathlib drops the slash: without the check, `-o newdir/` wrote a file named newdir
    for args in (["align", PDZ_A, PDZ_B, "-f", "cigar", "-o"], ["eval", "--no-model", "--json"]):
        result = run([*args, f"{tmp_path / 'newdir'}/"])
        assert result.exit_code == 2 and "names a directory; give a file name" in result.output, result.output
    assert not (tmp_path / "newdir").exists()
    from pfamalign.outputs import OutputError, check_output_path

    with pytest.raises(OutputError, match="names a directory"):  # the library's check, for API callers
        check_output_path(f"{tmp_path / 'newdir'}/")


def test_an_output_onto_a_shipped_model_file_is_refused_without_a_checkpoint(tmp_path, monkeypatch):
    """Every default run reads the shipped models, so no output may replace one of their files,
    --checkpoint given or not (a stand-in assets directory: a failure must not break the package)."""
    from pfamalign import inference, outputs

    assets = tmp_path / "assets" / "default_model"
    assets.mkdir(parents=True)
    (assets / "decoding.json").write_text("{}")
    monkeypatch.setattr(outputs, "shipped_assets", lambda: tmp_path / "assets")
    result = run(["align", PDZ_A, PDZ_B, "-f", "cigar", "-o", assets / "decoding.json"])
    assert_clear_error(result, "would replace a file of the input directory")
    assert (assets / "decoding.json").read_text() == "{}"
    monkeypatch.undo()  # the real one is the package's
    assert outputs.shipped_assets() / "default_model" == inference.default_model_dir()


def test_data_written_to_standard_output_comes_alone_the_tables_go_to_standard_error(tmp_path):
    """`eval --json -`, `barycenter --tsv -`, `certify --json -`: standard output carries the
    data and nothing else (eval wrote a file named "-"; the others mixed their tables in)."""
    result = CliRunner().invoke(
        main, ["eval", "--stockholm", str(SEED / "PF00076.sto"), "--no-model", "--baselines", "nw",
               "--max-pairs", "3", "--bootstrap", "0", "-q", "--json", "-"], env={"CI": "1"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n_pairs"] == 3 and "F1" in result.stderr
    assert not pathlib.Path("-").exists()
    result = CliRunner().invoke(main, ["barycenter", PDZ_A, PDZ_B, "--tsv", "-"],
                                                env={"CI": "1"})
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split("\t")[:2] == ["row", "residue"] and len(rows) == len(PDZ_A), result.stdout
    assert "barycenters:" in result.stderr


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_output_where_no_file_can_be_made_names_the_path_given_not_the_temporary():
    """/proc takes no new file, for root too (tests may run as root): one Error line that names
    -o's path and what to do, not the temporary file beside it that the atomic write made."""
    result = run(["align", PDZ_A, PDZ_B, "-o", "/proc/pfamalign-out.txt"])
    assert_clear_error(result, "Error: cannot write /proc/pfamalign-out.txt: ",
                       "write the output to a directory where you can create files")
    assert ".tmp" not in result.output, result.output


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
    before = (tmp_path / "q.txt").read_text()  # an @file is an input no output may replace
    assert_clear_error(run(["align", "@q.txt", "KLMNP", "-o", "q.txt"]), "also an input")
    assert (tmp_path / "q.txt").read_text() == before


# ---- 11: transport settings and the plan -----------------------------------------------------

@pytest.mark.parametrize("kw", [dict(eps=1e-6), dict(eps=float("nan")), dict(eps=float("inf")),
                                dict(base_steps=0, tail_steps=0), dict(tail_steps=2.5),
                                dict(base_steps=10 ** 9), dict(half_band=True),
                                dict(marginals="rows", tol=1e-6, max_steps=10 ** 9),
                                dict(marginals="rows", tol=1e-6, max_steps=True),
                                dict(base_steps=4, eps_schedule=((1e7, 2), (1.0, 2)))])
def test_meaningless_transport_settings_are_refused(kw):
    from pfamalign.kernels import TransportConfig

    with pytest.raises(ValueError, match="eps|steps|half_band"):
        TransportConfig(**{"half_band": 8, **kw})


def test_transport_settings_of_other_integer_kinds_are_taken_and_a_wrong_kind_is_refused():
    """A numpy integer band (from an array's shape arithmetic) is an integer; ``blocks=8`` is
    the tile edge (it was accepted and failed later with an AttributeError); a band of another
    kind or blocks that are no tile edge are refused by name."""
    import numpy as np

    from pfamalign.kernels import BlockSizes, TransportConfig

    cfg = TransportConfig(half_band=np.int64(8), blocks=np.int32(16))
    assert (type(cfg.half_band), cfg.blocks) == (int, BlockSizes(16))
    assert TransportConfig(half_band=8, blocks=8) == TransportConfig(half_band=8, blocks=BlockSizes(8))
    with pytest.raises(ValueError, match="half_band"):
        TransportConfig(half_band=np.float32(8))
    for blocks in ("8", True, 8.0):
        with pytest.raises(ValueError, match="blocks must be a BlockSizes"):
            TransportConfig(half_band=8, blocks=blocks)


@pytest.mark.parametrize("impl", ["xla", "reference"])
def test_an_empty_batch_gives_an_empty_output_on_every_path(impl):
    """No pair at all (B = 0): an empty output and gradient of the right shapes (the banded
    path divided by the problem count: ZeroDivisionError)."""
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import TransportConfig, transport

    q, lens = jnp.zeros((0, 2, 8, 4)), jnp.zeros((0,), jnp.int32)
    cfg = TransportConfig(half_band=4, impl=impl)
    assert transport(q, q, q, lens, lens, config=cfg).shape == (0, 2, 8, 4)
    grad = jax.grad(lambda q: jnp.sum(transport(q, q, q, lens, lens, config=cfg)))(q)
    assert grad.shape == q.shape


@pytest.mark.parametrize("resident", [False, True])
def test_kernels_where_there_are_none_are_refused_by_name(resident):
    """Compiled kernels (``interpret=False``) on this CPU, jitted, eager and under vmap, and a
    tiling the TPU kernels cannot take lowered for a TPU: a ValueError that says why and what to
    change (jax's own error named its dispatch primitive, ``platform_index``, and neither)."""
    import jax
    import jax.numpy as jnp

    from pfamalign.kernels import BlockSizes, TransportConfig, pallas_ops, transport

    q, lens = jnp.ones((1, 1, 16, 8)), jnp.array([16])
    cfg = TransportConfig(half_band=4, impl="pallas", interpret=False, resident_scores=resident)
    op = lambda q: transport(q, q, q, lens, lens, config=cfg)
    for run, x in ((jax.jit(op), q), (op, q), (jax.jit(jax.vmap(op)), q[None])):
        with pytest.raises(ValueError, match="interpret=False.*leave interpret at None"):
            run(x)
    if resident:
        return
    tiny = TransportConfig(half_band=4, impl="pallas", blocks=BlockSizes(8))  # a legal Triton tile is >= 16
    f = jax.jit(lambda q: transport(q, q, q, lens, lens, config=tiny))
    assert f(q).shape == q.shape  # interpret mode here
    with pytest.raises(ValueError, match="no 'tpu' kernels for this tiling.*TPU tiles must be"):
        pallas_ops.lower(f, "tpu", q)


_WITHOUT_PALLAS_TRITON = """
import importlib.abc, json, sys

class Removed(importlib.abc.MetaPathFinder):  # as a jax without the deprecated backend
    def find_spec(self, name, path=None, target=None):
        if name == "jax.experimental.pallas.triton" or name.startswith("jax._src.pallas.triton"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, Removed())
import jax, jax.numpy as jnp
from pfamalign.kernels import TransportConfig, config, pallas_ops, transport
from pfamalign.kernels.config import impl_variant

q, lens = jax.random.normal(jax.random.PRNGKey(0), (1, 1, 64, 8)), jnp.array([64])
out = {"auto": [config.resolve_impl("auto", "cuda", length=n) for n in (1024, 16384)]}
for impl in ("xla", "pallas", "pallas-fused"):
    f = jax.jit(lambda q: transport(q, q, q, lens, lens, config=TransportConfig(
        half_band=8, base_steps=3, tail_steps=2, **impl_variant(impl))))
    out[impl] = [float(jnp.sum(f(q)))]
    try:
        pallas_ops.lower(f, "cuda", q)
        out[impl].append("lowered")
    except ValueError as e:
        out[impl].append(str(e))
print(json.dumps(out))
"""


def test_a_jax_without_the_pallas_triton_backend_still_runs_the_op():
    """jax 0.11 deprecates the Pallas Triton backend. Where it is gone, importing it failed and
    with it ``import pfamalign``. Now the op runs (XLA path; the kernels in interpret mode, the
    same results), ``impl="auto"`` on a GPU takes dense autodiff and the XLA path, and lowering
    the kernels for a GPU is refused by name."""
    run = subprocess.run([sys.executable, "-c", _WITHOUT_PALLAS_TRITON], capture_output=True, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["auto"] == ["reference", "xla"]
    assert out["xla"][1] == "lowered"
    for impl in ("pallas", "pallas-fused"):
        assert out[impl][0] == pytest.approx(out["xla"][0], rel=1e-5)
        assert "has no Pallas Triton backend" in out[impl][1] and "impl='xla'" in out[impl][1]


def test_lengths_given_as_python_lists_are_taken():
    """``q_len=[16, 9]`` is what a user types: it failed with "Cannot determine dtype"."""
    import jax.numpy as jnp

    from pfamalign.kernels import TransportConfig, transport, transport_plan

    q = jnp.arange(2 * 16 * 4, dtype=jnp.float32).reshape(2, 1, 16, 4) / 100
    cfg = TransportConfig(half_band=4, impl="xla")
    as_list = transport(q, q, q, [16, 9], (12, 16), config=cfg)
    np.testing.assert_array_equal(as_list, transport(q, q, q, jnp.array([16, 9]), jnp.array([12, 16]), config=cfg))
    assert transport_plan(q, q, [16, 9], [12, 16], config=cfg).shape == (2, 1, 17, 17)
    with pytest.raises(ValueError, match="q_len must be integers"):
        transport(q, q, q, [16.0, 9.5], [12, 16], config=cfg)


def test_a_plan_that_is_not_a_plan_is_an_error_before_decoding():
    from pfamalign.inference import Predictor
    from pfamalign.plans import PairPlan

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


def test_a_row_softmax_plan_with_a_crowded_key_column_is_decoded():
    """With free key columns (``marginals="rows"``: the row softmax) one key column may take
    several rows' mass: a plan, not a failed solve, so ``Predictor`` decodes it. A capacity
    plan's dustbin corner may exceed 1 for the same reason (it is no confidence)."""
    import dataclasses

    from pfamalign.inference import Predictor
    from pfamalign.plans import PairPlan

    predictor = Predictor()
    cfg = predictor.model.cfg
    predictor.model.cfg = dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, marginals="rows"))
    assert not predictor.checks_marginals()
    a, b = PDZ_A, "W" * (len(PDZ_A) - 6) + "GGGGGG"  # PDZ_A's glycines crowd onto the six G keys
    aln, pp = predictor.align(a, b)
    assert len(aln.pairs) > 0
    with pytest.raises(ValueError, match="key column of mass"):  # what a balanced solve may not do
        pp.check(marginals=True)
    corner = np.zeros((4, 4))
    corner[:3, :3] = np.eye(3) * 0.5
    corner[:3, 3] = corner[3, :3] = 0.5
    corner[3, 3] = 2.0  # a capacity plan's unaligned-unaligned mass
    PairPlan(corner).check()
    predictor.model.cfg = dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, dustbin="capacity"))
    assert not predictor.checks_marginals()
    predictor.model.cfg = cfg
    assert predictor.checks_marginals()  # the shipped model (spoke, balanced)


# ---- 8: decoding.json ------------------------------------------------------------------------

@pytest.mark.parametrize("text,fragment", [('{"decoder": "mea", "gap_cots": 1.0}', "unknown"),
                                           ('{"gap_open": "3"}', "gap_open"),
                                           ('{"threshold": NaN}', "finite"),
                                           ('[1, 2]', "JSON object"),
                                           ('{"gap_open": ', "not a readable")])
def test_bad_decoding_json_is_a_clear_error(tmp_path, text, fragment):
    from pfamalign.decoding import DecoderSettings

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


# ---- 2-5, 7, 8: prepare ----------------------------------------------------------------------

SMALL = SEED / "PF02184.sto"


def _prepare_cfg(out, inputs=(SMALL,), **kw):
    from pfamalign.pipelines.config import PrepareConfig
    from pfamalign.pipelines.pairs import SamplingConfig

    return PrepareConfig(inputs=tuple(str(i) for i in inputs), out=str(out),
                         sampling=SamplingConfig(pairs_per_family=4), **kw)


def test_a_second_prepare_on_a_locked_directory_names_the_holder(tmp_path):
    from pfamalign.pipelines.locks import directory_lock
    from pfamalign.pipelines.prepare import PrepareError, run_prepare

    out = tmp_path / "ds"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pfamalign.pipelines.locks import "
         f"directory_lock\nwith directory_lock({str(out)!r}, 'prepare'):\n"
         "    print('locked', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(PrepareError, match=f"in use by another prepare run \\(pid {holder.pid}"):
            run_prepare(_prepare_cfg(out), quiet=True)
        assert not (out / "work").exists() and not (out / "manifest.json").exists()
    finally:
        holder.kill()
        holder.wait()
    result = run_prepare(_prepare_cfg(out), quiet=True)  # the kernel dropped the killed holder's lock
    assert result.summary["pairs"]["total"] > 0
    with directory_lock(out, "prepare"):  # and this run released its own
        pass


def test_overwrite_removes_only_what_prepare_wrote(tmp_path):
    from pfamalign.pipelines.prepare import run_prepare

    out = tmp_path / "ds"
    first = run_prepare(_prepare_cfg(out), quiet=True)
    (out / "train" / "my_notes.txt").write_text("mine")
    (out / "embeddings" / "mine.npy").write_bytes(b"x")
    (out / "README").write_text("mine too")
    run_prepare(_prepare_cfg(out, seed=7, overwrite=True), quiet=True)
    assert (out / "train" / "my_notes.txt").read_text() == "mine"
    assert (out / "embeddings" / "mine.npy").read_bytes() == b"x"
    assert (out / "README").read_text() == "mine too"
    assert json.loads((out / "manifest.json").read_text())["config_hash"] != \
        first.manifest["config_hash"]


def _files(out, skip=("replacement",)):
    """Every file of a dataset directory and its bytes (not the lock, not ``skip``)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != ".pfamalign.lock" and p.relative_to(out).parts[0] not in skip}


def test_a_failed_overwrite_keeps_the_dataset_it_would_replace(tmp_path):
    from pfamalign.commands.verify import verify_directory
    from pfamalign.pipelines.prepare import PrepareError, run_prepare
    from pfamalign.pipelines.stockholm import StockholmError

    out = tmp_path / "ds"
    run_prepare(_prepare_cfg(out), quiet=True)
    before = _files(out)
    ragged = tmp_path / "ragged.sto"
    lines = SMALL.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    lines[row] = lines[row] + "AAA"  # one row longer than the others
    ragged.write_text("\n".join(lines) + "\n")
    with pytest.raises(StockholmError, match="alignment columns"):
        run_prepare(_prepare_cfg(out, inputs=(ragged,), overwrite=True), quiet=True)
    assert _files(out) == before
    assert verify_directory(out)[1] == []  # no problems: still the finished dataset
    run_prepare(_prepare_cfg(out), quiet=True)  # its options again: complete, as it was
    single = tmp_path / "single.sto"  # one sequence: no pairs at all
    single.write_text("# STOCKHOLM 1.0\n#=GF AC PF99999.1\nONLY/1-12 MKVLAAGIVGLL\n//\n")
    with pytest.raises(PrepareError, match="keeps its dataset"):
        run_prepare(_prepare_cfg(out, inputs=(single,), overwrite=True), quiet=True)
    assert _files(out) == before
    run_prepare(_prepare_cfg(out, seed=7, overwrite=True), quiet=True)  # a good one replaces it
    assert _files(out) != before and not (out / "replacement").exists()
    assert verify_directory(out)[1] == []


def test_verify_tells_an_interrupted_prepare_from_stray_temporaries(tmp_path):
    """The temporaries of an interrupted `prepare` (in work/ or replacement/, kept to resume)
    are a note, not a problem of the intact dataset beside them; one among the dataset's own
    files is a problem. Ctrl-C during `prepare` says how to resume."""
    from pfamalign.commands.verify import NOTE, verify_directory
    from pfamalign.pipelines import prepare
    from pfamalign.pipelines.prepare import run_prepare

    out = tmp_path / "ds"
    run_prepare(_prepare_cfg(out), quiet=True)
    (out / "replacement" / "train").mkdir(parents=True)
    (out / "replacement" / "train" / ".pairs-00000-of-00001.array_record.tmp").write_bytes(b"partial")
    checked, problems = verify_directory(out)
    assert problems == [] and any(line.startswith(f"{NOTE}{out / 'replacement'}") for line in checked)
    stray = out / "train" / ".pairs-00000-of-00001.array_record.tmp"
    stray.write_bytes(b"partial")
    assert [p.split(":")[0] for p in verify_directory(out)[1]] == [str(stray)]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prepare, "run_prepare", interrupted)
        res = CliRunner().invoke(main, ["prepare", "shards", "--pfam", str(SMALL), "--out", str(out)])
    assert res.exit_code == 130, res.output
    assert f"Interrupted (SIGINT). The work done so far is kept in {out}: re-run the same command " \
           "to resume." in " ".join(res.output.split())


def test_verify_names_the_work_of_a_killed_prepare_as_an_unfinished_dataset(tmp_path):
    from pfamalign.pipelines import stages
    from pfamalign.pipelines.prepare import run_prepare
    from pfamalign.pipelines.reader import PairDataset

    out = tmp_path / "ds"

    def killed(*args, **kwargs):  # a kill inside the stages: no error mark is written
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp, pytest.raises(KeyboardInterrupt):
        mp.setattr(stages, "plan_parts", killed)
        run_prepare(_prepare_cfg(out), quiet=True)
    assert (out / "work").is_dir() and not (out / "manifest.json").exists()
    assert_clear_error(run(["verify", out]), "unfinished dataset", "was stopped", "re-run the same command")
    with pytest.raises(FileNotFoundError, match="re-run the same command to finish it"):
        PairDataset(out)
    from pfamalign.pipelines.locks import directory_lock

    with directory_lock(out, "prepare"):  # a prepare at work on it: not "stopped"
        assert_clear_error(run(["verify", out]), "being prepared", "is writing it now", "wait for it")


def test_a_replacement_killed_while_swapping_in_is_finished_by_the_next_run(tmp_path):
    from pfamalign.commands.verify import verify_directory
    from pfamalign.pipelines.prepare import run_prepare

    out, other = tmp_path / "ds", tmp_path / "other"
    run_prepare(_prepare_cfg(out), quiet=True)
    run_prepare(_prepare_cfg(other, seed=7), quiet=True)
    want = _files(other)
    # the state of a kill part-way through the swap: old manifest gone, some new files moved
    shutil.copytree(other, out / "replacement")
    (out / "manifest.json").unlink()
    moved = sorted(n for n in want if n.endswith(".array_record"))[: len(want) // 2]
    for name in moved:
        (out / "replacement" / name).replace(out / name)
    result = run_prepare(_prepare_cfg(out, seed=7), quiet=True)
    assert result.already_complete
    assert _files(out) == want and not (out / "replacement").exists()
    assert verify_directory(out)[1] == []
    # a replacement built whole and abandoned before its swap holds no temporary: verify still
    # names it (it said nothing of up to a dataset's size of files)
    shutil.copytree(other, out / "replacement")
    checked, problems = verify_directory(out)
    assert problems == [] and any(line.startswith(f"note: {out / 'replacement'}: the replacement an interrupted "
                                                  "`pfamalign prepare --overwrite` built") for line in checked)


def _unnamed(text: str) -> str:
    """A Stockholm family with its #=GF AC and ID lines removed: nothing names it."""
    return "\n".join(line for line in text.splitlines()
                     if not line.startswith(("#=GF AC", "#=GF ID"))) + "\n"


def test_unnamed_families_in_files_of_one_name_are_not_taken_for_duplicates(tmp_path):
    from pfamalign.pipelines.prepare import run_prepare

    other = sorted(p for p in SEED.glob("*.sto") if p != SMALL)[0]
    for folder, source in (("a", SMALL), ("b", other), ("c", SMALL)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "fam.sto").write_text(_unnamed(source.read_text()))
    result = run_prepare(_prepare_cfg(tmp_path / "ds", inputs=(tmp_path / "a", tmp_path / "b", tmp_path / "c")),
                         quiet=True)
    families = (tmp_path / "ds" / "families.tsv").read_text().splitlines()[1:]
    skips = [row for row in families if "duplicate family key" in row]
    assert len(families) == 3 and len(skips) == 1  # a and b both kept; c is a's copy
    assert result.summary["pairs"]["total"] > 0


def test_overwrite_refuses_a_directory_without_a_manifest(tmp_path):
    from pfamalign.pipelines.prepare import PrepareError, run_prepare

    out = tmp_path / "ds"
    for name in ("train", "val", "test", "work", "embeddings"):
        (out / name).mkdir(parents=True)
        (out / name / "data.bin").write_bytes(b"precious")
    with pytest.raises(PrepareError, match="not a pfamalign dataset"):
        run_prepare(_prepare_cfg(out, overwrite=True), quiet=True)
    for name in ("train", "val", "test", "work", "embeddings"):
        assert (out / name / "data.bin").read_bytes() == b"precious"


def test_skip_bad_keeps_a_valid_copy_after_a_broken_one(tmp_path):
    from pfamalign.pipelines.prepare import run_prepare

    good = SMALL.read_text()
    broken = good.replace("//", "bad/1-3 AC#\n//", 1)  # parses as a stream, fails the parse
    (tmp_path / "a_broken.sto").write_text(broken)
    (tmp_path / "b_good.sto").write_text(good)
    out = tmp_path / "ds"
    result = run_prepare(_prepare_cfg(out, inputs=[tmp_path / "a_broken.sto",
                                                   tmp_path / "b_good.sto"], skip_bad=True),
                         quiet=True)
    s = result.summary
    assert s["skipped"]["families"] == {"malformed Stockholm": 1}
    assert s["families"]["used"] == 1 and s["pairs"]["total"] > 0


def test_a_refused_output_directory_is_left_as_the_user_had_it(tmp_path):
    """`prepare --out` into a directory of the user's that is not a dataset is refused; it
    used to gain a .pfamalign.lock all the same (the lock is taken first)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    result = run(["prepare", "shards", "--pfam", SMALL, "--out", mine, "-q"])
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_failed_prepare_does_not_block_the_rerun_its_message_suggests(tmp_path):
    bad = tmp_path / "in"
    bad.mkdir()
    (bad / "a.sto").write_text(SMALL.read_text())
    (bad / "b.sto").write_text("# STOCKHOLM 1.0\nx/1-3 AC#\n//\n")
    out = tmp_path / "ds"
    first = run(["prepare", "shards", "--pfam", bad, "--out", out, "-q",
                 "--families-per-chunk", "1"])
    assert first.exit_code == 1 and "--skip-bad" in first.output, first.output
    assert_clear_error(run(["verify", out]), "unfinished dataset", "stopped on an error", "run it again")
    second = run(["prepare", "shards", "--pfam", bad, "--out", out, "-q", "--skip-bad",
                  "--families-per-chunk", "1"])
    assert second.exit_code == 0, second.output
    assert json.loads((out / "manifest.json").read_text())["summary"]["families"]["used"] == 1


def test_a_stray_manifest_temporary_is_cleaned_on_rerun(tmp_path):
    from pfamalign.pipelines.prepare import run_prepare

    out = tmp_path / "ds"
    run_prepare(_prepare_cfg(out, keep_work=True), quiet=True)
    manifest = (out / "manifest.json").read_bytes()
    (out / "manifest.json").rename(out / ".manifest.999999.tmp.json")  # killed before the rename
    (out / ".manifest.json.999998.tmp").write_bytes(manifest)  # an older version's temporary name
    run_prepare(_prepare_cfg(out), quiet=True)
    assert (out / "manifest.json").read_bytes() == manifest
    assert not list(out.rglob(TEMPORARY_GLOB))


def test_verify_names_working_files_beside_a_finished_dataset(tmp_path):
    """A prepare stopped between writing its manifest and removing work/ (or --keep-work)
    left working files verify said nothing of; a note names them, not as a problem."""
    from pfamalign.commands.verify import verify_directory
    from pfamalign.pipelines.prepare import run_prepare

    out = tmp_path / "ds"
    run_prepare(_prepare_cfg(out, keep_work=True), quiet=True)
    checked, problems = verify_directory(out)
    assert problems == [] and [line for line in checked if line.startswith(f"note: {out / 'work'}:")] == [
        f"note: {out / 'work'}: working files beside a finished dataset (kept by --keep-work, or left by a run "
        "stopped just after it wrote the manifest); not part of the dataset: delete work/ if you do not need it"]
    shutil.rmtree(out / "work")
    assert not any(line.startswith(f"note: {out / 'work'}") for line in verify_directory(out)[0])


@pytest.mark.parametrize("skip_bad", [False, True])
def test_truncated_gz_input_is_a_clear_error(tmp_path, skip_bad):
    import gzip

    # every seed family, cut three quarters in: the families before the cut are complete
    data = gzip.compress(b"".join(f.read_bytes() for f in sorted(SEED.glob("*.sto"))))
    gz = tmp_path / "Pfam-A.seed.gz"
    gz.write_bytes(data[: len(data) * 3 // 4])
    result = run(["prepare", "shards", "--pfam", gz, "--out", tmp_path / "ds", "-q"]
                 + (["--skip-bad"] if skip_bad else []))
    if skip_bad:  # the families before the cut are kept, the cut is reported
        assert result.exit_code == 0, result.output
        summary = json.loads((tmp_path / "ds" / "manifest.json").read_text())["summary"]
        assert any("truncated or corrupt" in e for e in summary["errors"]), summary["errors"]
        assert "left out 1 malformed family" in result.output
    else:
        assert_clear_error(result, "truncated or corrupt")
    assert "Aborted" not in result.output


# ---- 2, 6, 7: training runs, checkpoints and models ------------------------------------------

# test_train's tiny align_ce, smaller still: 2 steps on a short band
TINY = {**TRAIN_TINY, "encoder_width": 16, "head_dim": 8, "train.steps": 2,
        "train.ckpt_every": 1, "train.pad_multiple": 96, "train.max_len": 96,
        "transport.half_band": 16, "transport.base_steps": 3, "transport.tail_steps": 1}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from pfamalign.pipelines.prepare import run_prepare

    out = tmp_path_factory.mktemp("hard_data") / "ds"
    cfg = _prepare_cfg(out, inputs=(SEED,), embedder="builtin/onehot",
                       split_fractions=(0.7, 0.2, 0.1), seed=3)
    run_prepare(cfg, quiet=True)
    return out


def _train_cfg(dataset, **extra):
    from pfamalign.training import rundir

    return rundir.resolve_config(dataset, "align_ce", overrides={**TINY, **extra})


@pytest.mark.slow  # compiles a train step (15 s); test_all_finite_* is the fast check
def test_an_infinite_learning_rate_stops_before_a_nan_checkpoint(dataset, tmp_path):
    from pfamalign.training import loop

    out = tmp_path / "run"
    with pytest.raises(loop.NonFiniteLoss, match=r"non-finite parameters .* at step 1.*no "
                                                 r"checkpoint was written"):
        # finite as a setting (a non-finite one is refused), infinite in float32
        loop.run(dataset, out, _train_cfg(dataset, **{"train.lr": 1e300}), quiet=True,
                 tune_pairs=None)
    assert not list((out / "checkpoints").glob("[0-9]*"))


def test_a_second_training_run_into_a_locked_directory_names_the_holder(dataset, tmp_path):
    from pfamalign.pipelines.locks import directory_lock
    from pfamalign.training import TrainingError, loop

    out = tmp_path / "run"
    with directory_lock(out, "training"):
        with pytest.raises(TrainingError, match=f"in use by another training run \\(pid {os.getpid()}"):
            loop.run(dataset, out, _train_cfg(dataset), quiet=True, tune_pairs=None)
    assert not (out / "checkpoints").exists() and not (out / "config.json").exists()


def test_all_finite_sees_any_non_finite_float_leaf():
    import jax.numpy as jnp

    from pfamalign.training.step import _all_finite

    tree = {"w": jnp.ones((3, 2)), "count": jnp.array(7, jnp.int32), "b": [jnp.zeros(4)]}
    assert bool(_all_finite(tree))
    for bad in (jnp.inf, -jnp.inf, jnp.nan):
        assert not bool(_all_finite(dict(tree, b=[jnp.zeros(4).at[2].set(bad)])))


def _flip_a_byte(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _largest_file(directory: pathlib.Path) -> pathlib.Path:
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A copy of the shipped model (its checksums.json written by ``write_checksums``, as
    ``save_model`` does: see test_save_model_records_checksums)."""
    import shutil

    from pfamalign.inference import default_model_dir

    out = tmp_path_factory.mktemp("hard_model") / "model"
    shutil.copytree(default_model_dir(), out)
    return out


@pytest.mark.parametrize("damage", ["{", "[1, 2]", '{"files": 5}', '{"sha256": 5}', '{"sha256": {"params": 5}}'])
def test_a_damaged_checksums_file_is_a_problem_not_a_traceback(damage, saved_model, tmp_path):
    """`verify` on a model whose checksums.json was damaged (not JSON, not a table of file
    names to digests) names the file as unreadable, as it does a dataset's manifest; loading
    the model refuses it the same way."""
    import shutil

    from pfamalign import checkpoint

    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    (model / checkpoint.CHECKSUMS).write_text(damage)
    assert_clear_error(run(["verify", model]), f"{model / checkpoint.CHECKSUMS}: unreadable")
    assert_clear_error(run(["align", "MKVLA", "MKVA", "--checkpoint", model]), "fails its checksums", "unreadable")


def test_a_corrupt_model_fails_its_checksum_on_load_and_in_verify(saved_model, tmp_path):
    import shutil

    from pfamalign import checkpoint

    assert run(["verify", saved_model]).exit_code == 0
    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    checkpoint.load_model(model)  # intact: loads
    _flip_a_byte(_largest_file(model / "params"))
    with pytest.raises(checkpoint.CheckpointError, match="checksum mismatch"):
        checkpoint.load_model(model)
    res = run(["verify", model])
    assert_clear_error(res, "checksum mismatch")
    # the damage alone: the parameters' metadata is not read (it would blame config.json)
    assert "config.json does not match" not in res.output, res.output
    assert_clear_error(run(["align", PDZ_A, PDZ_B, "--checkpoint", model]), "checksum mismatch")


def test_a_model_saved_before_checksums_loads_unverified_and_verify_says_so(saved_model, tmp_path, capfd):
    from pfamalign import checkpoint

    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    (model / "checksums.json").unlink()
    capfd.readouterr()
    checkpoint.load_model(model)  # nothing recorded: nothing to fail, as the design says ...
    checkpoint.load_model(model)
    warned = [line for line in capfd.readouterr().err.splitlines() if line.startswith("Warning:")]
    assert warned == [f"Warning: {model} has no checksums.json recording its parameters: they load unverified "
                      "(saved by an older pfamalign, or killed before it was written); a damaged file shows only "
                      "as an error or a wrong result"]  # ... but not silently, and once
    assert_clear_error(run(["verify", model]), "no checksums.json", "cannot be verified")


def test_a_checksums_table_recording_no_parameter_file_vouches_for_nothing(saved_model, tmp_path, monkeypatch,
                                                                            capfd):
    """``{"sha256": {}}``: it passed as "nothing recorded" without the warning a missing file
    gives, verify said ok, and the parameter cache, named by the file's bytes, was the same
    for every model holding it (a second model aligned with the first one's parameters)."""
    import shutil

    from pfamalign import checkpoint

    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    (model / "checksums.json").write_text('{"sha256": {}}')
    monkeypatch.setenv("PFAMALIGN_CACHE_DIR", str(tmp_path / "cache"))
    assert checkpoint._params_cache_file(model / "params") is None
    capfd.readouterr()
    checkpoint.load_model(model)
    assert "load unverified" in capfd.readouterr().err
    assert not (tmp_path / "cache" / "params").exists()
    assert_clear_error(run(["verify", model]), "records no parameter file", "cannot be verified")


def _unrecorded_copy(saved_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    (model / "checksums.json").unlink()
    return model


@pytest.mark.parametrize("damage", ["missing", "empty", "half", "other JSON"])
def test_a_damaged_parameter_listing_is_damage_not_a_config_mismatch(damage, saved_model, tmp_path):
    """``params/_METADATA`` (orbax's listing of the tree) missing or unreadable, with no
    checksums to catch it: orbax then reads an empty tree, and every name was "missing from
    the parameters", blamed on config.json."""
    from pfamalign import checkpoint

    model = _unrecorded_copy(saved_model, tmp_path)
    listing = model / "params" / "_METADATA"
    text = listing.read_text()
    {"missing": listing.unlink, "empty": lambda: listing.write_text(""),
     "half": lambda: listing.write_text(text[:len(text) // 2]),
     "other JSON": lambda: listing.write_text('{"tree_metadata": {}}')}[damage]()
    says = f"{model / 'params'} is damaged: its _METADATA (orbax's listing of the parameters) is missing"
    with pytest.raises(checkpoint.DamagedParameters, match=re.escape(says)):
        checkpoint.load_model(model)
    res = run(["verify", model])
    assert_clear_error(res, says)
    assert "config.json does not match" not in res.output, res.output


def test_parameters_holding_non_finite_values_are_damaged(saved_model, tmp_path):
    """Flipped bits orbax reads without complaint (no checksums): inf / NaN parameters loaded,
    and the solve's overflow error then blamed eps and the pair."""
    from pfamalign import checkpoint

    model = _unrecorded_copy(saved_model, tmp_path)
    aligner, _ = checkpoint.load_model(model)
    aligner.log_temp[...] = aligner.log_temp[...] * np.nan
    checkpoint.save_model(model, aligner)
    (model / "checksums.json").unlink()
    with pytest.raises(checkpoint.DamagedParameters, match=f"{re.escape(str(model / 'params'))} is damaged: "
                                                           "log_temp hold non-finite values"):
        checkpoint.load_model(model)
    assert_clear_error(run(["align", PDZ_A, PDZ_B, "--checkpoint", model]), "log_temp hold non-finite values")


def test_a_warm_align_checks_the_checksums_its_cached_programs_skip_restoring(saved_model, tmp_path, monkeypatch):
    """With the model's plan programs cached, align restores no parameters: it never read
    checksums.json, so a damaged one aligned with a warm cache and failed with a cold one."""
    import shutil

    monkeypatch.setenv("PFAMALIGN_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    assert run(["align", PDZ_A, PDZ_B, "--checkpoint", model]).exit_code == 0
    assert list((tmp_path / "cache").rglob("plans_both_ways-*"))  # the programs the next call uses
    sums = model / "checksums.json"
    sums.write_text(sums.read_text()[:100])
    assert_clear_error(run(["align", PDZ_A, PDZ_B, "--checkpoint", model]), "checksums.json: unreadable")


def test_the_innermost_failure_stops_at_a_suppressed_context():
    """json's decode error is raised ``from None`` over a StopIteration holding a bare offset:
    shown as the cause of a failed restore, it read "cannot restore ...: 0"."""
    from pfamalign import checkpoint

    try:
        json.loads("")
    except ValueError as err:
        assert isinstance(err.__context__, StopIteration) and err.__suppress_context__
        assert checkpoint._innermost(err) is err
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as err:
        assert isinstance(checkpoint._innermost(err), KeyError)


def test_a_config_that_does_not_fit_its_parameters_is_named_on_load_and_in_verify(saved_model, tmp_path):
    from pfamalign import checkpoint

    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    config = json.loads((model / "config.json").read_text())
    config["model"]["heads"] += 2  # a valid config, other shapes: its checksums still pass
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(checkpoint.CheckpointError, match="does not match the parameters.*config asks for"):
        checkpoint.load_model(model)
    assert_clear_error(run(["verify", model]), "config.json does not match the parameters")
    result = run(["align", PDZ_A, PDZ_B, "--checkpoint", model])
    assert_clear_error(result, "does not match the parameters")
    assert "Traceback" not in result.output


def test_verify_calls_a_runs_model_unfinished_without_its_training_record(saved_model, tmp_path):
    from pfamalign.commands.verify import verify_directory

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved_model, run_dir / "model")
    (run_dir / "model" / "training.json").unlink()
    assert_clear_error(run(["verify", run_dir]), "unfinished", "re-run the same `pfamalign train`")
    shutil.copy(saved_model / "training.json", run_dir / "model" / "training.json")  # finished
    assert not [p for p in verify_directory(run_dir)[1] if "unfinished" in p]


def test_verify_names_a_parameter_file_its_checksums_never_recorded(saved_model, tmp_path):
    """A file added under a model's ``params/`` is named ("not in checksums.json"): what loads
    as the model holds bytes nobody vouched for."""
    from pfamalign.commands.verify import verify_directory

    model = tmp_path / "model"
    shutil.copytree(saved_model, model)
    assert verify_directory(model)[1] == []
    (model / "params" / "extra_array").write_bytes(b"\0" * 16)
    assert [p for p in verify_directory(model)[1] if "extra_array: not in checksums.json" in p]


def test_verify_leaves_a_directory_that_is_not_ours_alone(tmp_path):
    other = tmp_path / "notes" / "deep"
    other.mkdir(parents=True)
    (other / ".draft.123.tmp.txt").write_text("someone else's")
    assert_clear_error(run(["verify", tmp_path / "notes"]), "is not a pfamalign")
    assert (other / ".draft.123.tmp.txt").read_text() == "someone else's"


def params_digest(model):
    import hashlib

    import jax
    import numpy as np

    from pfamalign import checkpoint

    leaves = jax.tree_util.tree_leaves(checkpoint.model_params(model))
    return hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in leaves)).hexdigest()


def test_the_parameter_cache_gives_the_same_model_without_orbax(saved_model, tmp_path, monkeypatch):
    from pfamalign import checkpoint

    monkeypatch.setenv("PFAMALIGN_CACHE_DIR", str(tmp_path / "cache"))
    restored, _ = checkpoint.load_model(saved_model)  # through orbax, then copied
    copies = list((tmp_path / "cache" / "params").glob("*.npz"))
    assert len(copies) == 1
    code = (inspect.getsource(params_digest) + "import sys\nfrom pfamalign import checkpoint\n"
            "model, _ = checkpoint.load_model(sys.argv[1])\n"
            "print(params_digest(model), 'orbax.checkpoint' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, str(saved_model)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [params_digest(restored), "False"]  # the same parameters, orbax never imported
    # a damaged copy, or a readable one of other names and shapes, is ignored (orbax answers)
    # and rewritten
    for damage in ("not a zip file", "other shapes"):
        if damage == "other shapes":
            np.savez(copies[0], dustbin_q=np.zeros(3))
        else:
            copies[0].write_text(damage)
        again, _ = checkpoint.load_model(saved_model)
        assert params_digest(again) == params_digest(restored)
        assert checkpoint._read_cached_params(copies[0], checkpoint.abstract_params(again.cfg)[1]) is not None


def test_the_parameter_cache_is_named_by_the_parameters_and_can_be_off(saved_model, tmp_path, monkeypatch):
    import shutil

    from pfamalign import checkpoint

    other = tmp_path / "other"
    shutil.copytree(saved_model, other)
    model, _ = checkpoint.load_model(saved_model)
    model.log_temp[...] = model.log_temp[...] + 1.0  # other parameters
    checkpoint.save_model(other, model)
    monkeypatch.setenv("PFAMALIGN_CACHE_DIR", str(tmp_path / "cache"))
    first, second = (checkpoint._params_cache_file(d / "params") for d in (saved_model, other))
    assert first != second
    monkeypatch.setenv("PFAMALIGN_CACHE_DIR", "")
    assert checkpoint._params_cache_file(saved_model / "params") is None
    checkpoint.load_model(saved_model)
    assert not (tmp_path / "cache").exists()


def test_save_model_records_checksums(tmp_path):
    from pfamalign import checkpoint
    from pfamalign.inference import Predictor

    model = Predictor().model  # the shipped model, saved again
    checkpoint.save_model(tmp_path / "m", model)
    sums = json.loads((tmp_path / "m" / checkpoint.CHECKSUMS).read_text())["sha256"]
    files = {str(p.relative_to(tmp_path / "m")) for p in (tmp_path / "m" / "params").rglob("*")
             if p.is_file()}
    assert set(sums) == files and checkpoint.verify_checksums(tmp_path / "m") == []


def test_a_full_disk_under_an_orbax_save_is_one_error_and_leaves_no_temporary(small_disk, capfd):
    """orbax raised a ValueError (RESOURCE_EXHAUSTED ... os_error_code='28') after absl logged it
    from every writer thread and asyncio printed each orphaned task: `train` on a full disk
    printed hundreds of lines and left STEP.orbax-checkpoint-tmp. Now: one error naming what
    could not be written, nothing printed, nothing left."""
    import gc

    import jax.numpy as jnp

    from pfamalign import checkpoint
    from pfamalign.kernels import TransportConfig
    from pfamalign.model import AlignerConfig, build_model
    from pfamalign.outputs import UnwritableOutput

    fd = os.open(small_disk / "ballast", os.O_WRONLY | os.O_CREAT)
    try:
        while True:  # fill the file system
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    params, opt = {"w": jnp.arange(4096.0)}, {"m": jnp.ones(4096)}
    ckpts = checkpoint.TrainCheckpoints(small_disk / "checkpoints")
    with pytest.raises(UnwritableOutput) as caught:
        ckpts.save(3, params=params, opt_state=opt, data_state={"next_index": 3}, meta={"step": 3})
    assert str(caught.value) == (f"cannot write {small_disk / 'checkpoints' / '3'}: No space left on device; "
                                 "free some space or write the output elsewhere")
    model = build_model(AlignerConfig(name="full", feature_dim=50, embedder_id="builtin/onehot+blosum62",
                                      encoder="none", heads=2, head_dim=8, value_dim=4,
                                      transport=TransportConfig(half_band=5, impl="reference")), seed=0)
    with pytest.raises(UnwritableOutput, match=r"cannot write .*model/params: No space left on device"):
        checkpoint.save_model(small_disk / "model", model)
    gc.collect()  # the orphaned tasks are reported as they are collected
    assert not [p for p in small_disk.rglob("*") if "orbax-checkpoint-tmp" in p.name]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ERROR:absl" not in err and "never retrieved" not in err, err[:2000]


def test_a_failed_saves_temporary_is_removed_even_when_late_writes_make_it_again(tmp_path):
    """A write still queued when a save fails can create the temporary's directories after it
    was removed: the removal goes on until the temporary stays gone."""
    import threading
    import time

    from pfamalign import checkpoint

    tmp = tmp_path / "params.orbax-checkpoint-tmp"
    tmp.mkdir()

    def late_write():
        time.sleep(0.05)
        (tmp / "ocdbt.process_0" / "d").mkdir(parents=True, exist_ok=True)

    writer = threading.Thread(target=late_write)
    writer.start()
    checkpoint._remove_until_gone(lambda: list(tmp_path.glob("params.orbax-checkpoint-tmp*")))
    writer.join()
    assert not tmp.exists()


def test_the_certify_estimate_grows_with_the_plans_cells():
    """``certify`` holds dense plans: past its fixed part, its estimate grows as the padded
    length squared (an estimate linear in the length let an 8000 x 8000 pair past a 4G budget)."""
    from pfamalign import resources

    cells = lambda n: resources.estimate_certify_bytes(n, n) - resources.CERTIFY_FIXED_BYTES  # noqa: E731
    for short, long_ in ((1000, 2000), (2000, 8000)):
        ratio = (resources.padded_length(long_) / resources.padded_length(short)) ** 2
        assert cells(long_) == pytest.approx(ratio * cells(short))
    assert resources.estimate_certify_bytes(8000, 8000) > 4 << 30


def test_training_checkpoints_keep_the_newest_as_many_as_asked(tmp_path):
    """``train.keep_checkpoints``: after six saves with keep 3, the three newest steps are on
    disk, and no other."""
    import jax.numpy as jnp

    from pfamalign import checkpoint

    ckpts = checkpoint.TrainCheckpoints(tmp_path / "checkpoints", keep=3)
    for step in range(1, 7):
        ckpts.save(step, params={"w": jnp.full((2, 2), float(step))}, opt_state={"m": jnp.ones(2)},
                   data_state={"next_index": step}, meta={"step": step})
    assert ckpts.all_steps() == [4, 5, 6]
    assert sorted(int(d.name) for d in (tmp_path / "checkpoints").iterdir() if d.name.isdigit()) == [4, 5, 6]


def test_a_corrupt_training_checkpoint_is_refused_on_restore(tmp_path):
    import jax
    import jax.numpy as jnp

    from pfamalign import checkpoint

    params, opt = {"w": jnp.arange(64.0).reshape(8, 8)}, {"m": jnp.ones(256)}
    ckpts = checkpoint.TrainCheckpoints(tmp_path / "checkpoints")
    ckpts.save(3, params=params, opt_state=opt, data_state={"next_index": 3}, meta={"step": 3})
    abstract = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), t)
    restored = ckpts.restore(3, params=abstract(params), opt_state=abstract(opt))
    np.testing.assert_array_equal(restored[0]["w"], params["w"])
    from pfamalign.commands.verify import verify_directory

    # a run directory: every checkpoint is verified (and the run's config.json, which a bare
    # TrainCheckpoints does not write, is missing)
    checked, problems = verify_directory(tmp_path)
    assert any(line.startswith(f"{tmp_path / 'checkpoints' / '3'}: ") for line in checked), checked
    assert problems == [f"{tmp_path / 'config.json'}: missing; the run cannot resume without it (restore it "
                        "from a copy)"]
    _flip_a_byte(_largest_file(tmp_path / "checkpoints" / "3" / "opt_state"))
    with pytest.raises(checkpoint.CheckpointError, match="3 fails its checksums"):
        ckpts.restore(3, params=abstract(params), opt_state=abstract(opt))
    ckpts.close()
    assert_clear_error(run(["verify", tmp_path]), "checksum mismatch")


def test_damaged_shards_are_a_clear_error_and_verify_finds_them(dataset, tmp_path):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    assert run(["verify", ds]).exit_code == 0
    shard = sorted((ds / "test").glob("pairs-*"))[0]
    _flip_a_byte(shard)  # same size: the full check sees it, and reading it
    assert_clear_error(run(["verify", ds]), "fails its SHA-256")
    assert_clear_error(run(["eval", "--data", ds, "--no-model", "--baselines", "nw"]),
                       "a shard of", "is damaged", "pfamalign verify")
    shard.write_bytes(shard.read_bytes()[:100])  # truncated: seen on every open
    assert_clear_error(run(["eval", "--data", ds, "--no-model", "--baselines", "nw"]),
                       "damaged", shard.name)


def test_changed_tables_are_found_by_verify_and_a_truncated_lengths_file_on_open(dataset, tmp_path):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    recorded = {row["path"] for row in json.loads((ds / "manifest.json").read_text())["tables"]}
    assert {"families.tsv", "shards.tsv", "embeddings/index.tsv", "test/lengths.npy"} <= recorded
    _flip_a_byte(ds / "families.tsv")  # same size: a changed split table only verify sees
    assert_clear_error(run(["verify", ds]), "families.tsv fails its SHA-256")
    lengths = ds / "test" / "lengths.npy"
    lengths.write_bytes(lengths.read_bytes()[:-8])
    assert_clear_error(run(["eval", "--data", ds, "--no-model", "--baselines", "nw"]),
                       "damaged", "test/lengths.npy has")


def test_a_lengths_table_reordered_in_place_is_named_when_a_batch_disagrees(dataset, tmp_path):
    """A same-size edit of lengths.npy (its rows reversed) opens fine; the batch planned from it
    disagrees with its records, and the error names the table and `pfamalign verify` (it was
    "a pair of lengths (84, 86) exceeds pad_to=64", which points nowhere)."""
    import numpy as np

    from pfamalign.pipelines import reader

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    lengths = ds / "train" / "lengths.npy"
    table = np.load(lengths)
    order = np.argsort(table.max(1), kind="stable")  # short pairs first: any misplacement shows
    np.save(lengths, table[order[::-1]])
    batches = reader.batch_dataset(ds, "train", batch_size=4, shuffle=False)
    with pytest.raises(ValueError, match=rf"{re.escape(str(lengths))} disagrees with the records: pair \d+ is "
                                         rf"\(\d+, \d+\) residues there.*pfamalign verify {re.escape(str(ds))}"):
        for n in range(len(batches)):
            batches[n]


def test_verify_says_which_tables_an_older_manifest_cannot_vouch_for(dataset, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    manifest = json.loads((ds / "manifest.json").read_text())
    del manifest["tables"]  # as written before the tables were recorded
    (ds / "manifest.json").write_text(json.dumps(manifest))
    result = run(["verify", ds])
    assert result.exit_code == 0, result.output
    assert "not verified" in result.output and "families.tsv" in result.output
    assert "could not be verified" in result.output


@pytest.mark.parametrize("depths", ["", "-1", "0,1,99999", "two"])
def test_bad_tail_depths_are_refused_naming_the_option(depths):
    assert_clear_error(run(["certify", PDZ_A, PDZ_B, "--tail-depths", depths]),
                       "--tail-depths", "from 0 to 1000")


@pytest.mark.parametrize("decoder, option", [("posterior", "--gap-cost"), ("mea", "--gap-cost"), ("affine", "--gap-open"),
                                              ("affine", "--threshold"), ("hybrid", "--plan-weight")])
def test_decoder_costs_past_any_use_are_refused_before_the_decoder_overflows(decoder, option):
    """From ~1e307 the decoders' sums overflowed: ``--gap-cost 1e308`` aligned one pair with a
    score of -inf (null in JSON). Now refused by name; at the bound the score is finite."""
    sign = "-" if option == "--threshold" else ""
    assert_clear_error(run(["align", PDZ_A, PDZ_B, "--decoder", decoder, option, f"{sign}1e307"]),
                       f"{option} must be at most 1e+06 in absolute value, got {sign}1e+307")
    edge = f"{sign}1e6"
    result = run(["align", PDZ_A, PDZ_B, "--decoder", decoder, option, edge, "-f", "json", "-q"])
    assert result.exit_code == 0, result.output
    aln = json.loads(result.output.strip().splitlines()[-1])
    assert aln["score"] is not None and np.isfinite(aln["score"]) and aln["n_aligned"] >= 1, aln


def test_a_models_checksums_naming_files_outside_it_are_a_damaged_table(tmp_path):
    """checksums.json entries such as "params/../../../etc/passwd" were opened and hashed
    outside the model (and verify listed the parent folder's files as unrecorded)."""
    from pfamalign.checkpoint import read_checksums
    from pfamalign.inference import default_model_dir

    model = tmp_path / "model"
    shutil.copytree(default_model_dir(), model)
    table = json.loads((model / "checksums.json").read_text())
    for name in ("params/../../outside.txt", "/etc/hostname"):
        (model / "checksums.json").write_text(json.dumps({**table, "sha256": {**table["sha256"], name: "00"}}))
        with pytest.raises(ValueError, match=f"names a file outside its directory: {re.escape(repr(name))}"):
            read_checksums(model)
        result = run(["verify", model])
        assert result.exit_code == 1 and "names a file outside its directory" in result.output, result.output
        assert "outside.txt" not in result.output.replace(repr(name), "")


def test_a_model_copied_by_ensemble_or_compile_takes_in_no_outside_file(tmp_path):
    """A member model with a link to an outside file was copied with the link followed: the
    file's bytes taken in (and verify then said ok); one to /dev/zero filled the disk. Links are
    followed only where they are the model's own parts (params/ on shared storage, which loads
    and verifies), left out elsewhere; a special file or a link loop is refused, by
    ``check_copyable`` before ensemble's tuning and compile's fit too."""
    from pfamalign.checkpoint import CheckpointError, check_copyable, copy_model
    from pfamalign.inference import default_model_dir

    model = tmp_path / "model"
    shutil.copytree(default_model_dir(), model)
    (tmp_path / "store").mkdir()
    shutil.move(model / "params", tmp_path / "store" / "params")
    (model / "params").symlink_to(tmp_path / "store" / "params")  # shared storage: followed
    (tmp_path / "secret.txt").write_text("SECRET")
    (model / "notes.txt").symlink_to(tmp_path / "secret.txt")  # not a part of the model: left out
    copy_model(model, tmp_path / "copy")
    assert not (tmp_path / "copy" / "notes.txt").exists() and not (tmp_path / "copy" / "params").is_symlink()
    assert run(["verify", tmp_path / "copy"]).exit_code == 0
    for name, target, why in (("params/zero", "/dev/zero", "is not a regular file"),
                              ("params/loop", model, "links back into the model")):
        (model / name).symlink_to(target)
        with pytest.raises(CheckpointError, match=why):
            check_copyable(model)
        with pytest.raises(CheckpointError, match=why):
            copy_model(model, tmp_path / "again")
        assert not (tmp_path / "again").exists()
        # compile refuses it before its fit: before it even looks for the model's dataset (not here)
        assert_clear_error(run(["compile", "--checkpoint", model, "-o", tmp_path / "c"]), why)
        (model / name).unlink()


def test_an_ensemble_member_that_links_outside_the_ensemble_is_refused(tmp_path):
    """ensemble.json's paths were checked by their text only: a member folder that is a
    symbolic link to a model elsewhere loaded silently (and verify said ok)."""
    from pfamalign import ensemble
    from pfamalign.inference import shipped_model_dir

    ens = tmp_path / "ens"
    shutil.copytree(shipped_model_dir("ensemble"), ens)
    member = ensemble.read_members(ens)[1].path
    shutil.move(ens / member, tmp_path / "elsewhere")
    (ens / member).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=f"path {re.escape(repr(member))} must name a directory inside the ensemble"):
        ensemble.read_members(ens)
    assert_clear_error(run(["align", "--checkpoint", ens, PDZ_A, PDZ_B]), "must name a directory inside the ensemble")


@pytest.mark.parametrize("dim, why", [
    (None, "embedder.dim must be a whole number from 1 to 65536, got None"),  # was int(None): a traceback
    ("25", "embedder.dim must be a whole number from 1 to 65536, got '25'"),  # was read as 25
    (10 ** 9, "embedder.dim must be a whole number from 1 to 65536"),  # was a 512 GB allocation
    (True, "embedder.dim must be a whole number"),
    ("width+1", "embedder.dim is {width}"),  # was numpy's broadcast error in the batch
])
def test_a_manifests_feature_width_is_checked_by_readers_and_verify(tmp_path, dim, why):
    from conftest import make_seed_dataset

    from pfamalign.pipelines.reader import PairDataset, PairSource

    ds = make_seed_dataset(tmp_path / "ds", pairs_per_family=2, max_len=120, split_fractions=(1.0, 0.0, 0.0), seed=1)
    manifest = json.loads((ds / "manifest.json").read_text())
    width = manifest["embedder"]["dim"]
    dim, why = (width + 1, why.format(width=width + 1)) if dim == "width+1" else (dim, why)
    (ds / "manifest.json").write_text(json.dumps({**manifest, "embedder": {**manifest["embedder"], "dim": dim}}))
    with pytest.raises(ValueError, match=re.escape(why)):
        PairSource(ds, "train")[0] if isinstance(dim, int) and dim == width + 1 else PairDataset(ds)
    result = run(["verify", ds])
    assert result.exit_code == 1 and why in result.output, result.output
    assert_clear_error(run(["train", "--data", ds, "--out", tmp_path / "run", "--config", "k2_eps1",
                            "--steps", "1", "--batch-size", "8"]), why)


def test_a_manifest_naming_files_outside_its_dataset_is_refused_and_verify_says_so(tmp_path):
    """A handed-over manifest whose split named "../other/train/pairs-...", or "/etc/passwd",
    had eval read the other file (and verify say ok); "splits": "x" was a traceback. And
    `prepare --overwrite` removed an empty folder a manifest named outside OUT."""
    from conftest import make_seed_dataset

    from pfamalign.pipelines.prepare import _remove_owned
    from pfamalign.pipelines.reader import PairDataset

    ds = make_seed_dataset(tmp_path / "ds", pairs_per_family=4, max_len=160, split_fractions=(0.5, 0.0, 0.5), seed=1)
    manifest = json.loads((ds / "manifest.json").read_text())
    train_shard = manifest["splits"]["train"]["shards"][0]
    other = tmp_path / "other"
    shutil.copytree(ds, other)
    for shards, why in (([f"../other/{train_shard}"], "not a file inside the dataset"),
                        (["/etc/passwd"], "not a file inside the dataset"),
                        ([f"{train_shard}.extra"], "which its shards table does not record")):
        splits = {**manifest["splits"], "test": {**manifest["splits"]["test"], "shards": shards}}
        (ds / "manifest.json").write_text(json.dumps({**manifest, "splits": splits}))
        with pytest.raises(ValueError, match=re.escape(f"manifest.json names {shards[0]!r}, {why}")
                           if "inside" in why else re.escape(why)):
            PairDataset(ds)
        result = run(["verify", ds])
        assert result.exit_code == 1 and why in result.output, result.output
    embeddings = {k: v for k, v in manifest["embeddings"].items() if k != "shards"}
    for bad in ({**manifest, "splits": "x"}, {**manifest, "embeddings": embeddings},
                {**manifest, "embeddings": {**embeddings, "shards": []}}):
        (ds / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="not shaped as a dataset manifest"):
            PairDataset(ds)
        result = run(["verify", ds])  # "x" was an AttributeError traceback; no shards a KeyError or grain's words
        assert result.exit_code == 1 and "not shaped as a dataset manifest" in result.output, result.output
    victim = tmp_path / "victim" / "empty_sub"
    victim.mkdir(parents=True)
    _remove_owned(ds, {**manifest, "families_table": "../victim/empty_sub/x"})
    assert victim.is_dir()


def test_crafted_json_in_a_model_is_one_error_line(tmp_path):
    """A model's JSON nested 100,000 deep was a RecursionError traceback; a float field of
    10**400 an OverflowError one (its digits cannot even be printed). Now the file is named
    where its reader catches it, and the CLI says what happened where none does."""
    from pfamalign.inference import default_model_dir

    model = tmp_path / "model"
    shutil.copytree(default_model_dir(), model)
    decoding = (model / "decoding.json").read_text()
    deep = "[" * 100_000 + "]" * 100_000
    (model / "decoding.json").write_text(deep)
    assert_clear_error(run(["align", "--checkpoint", model, PDZ_A, PDZ_B]),
                       f"{model / 'decoding.json'}: not a readable decoding.json (maximum recursion depth")
    (model / "decoding.json").write_text(decoding.replace('"gap_cost": 0.0', '"gap_cost": ' + "9" * 500))
    assert_clear_error(run(["align", "--checkpoint", model, PDZ_A, PDZ_B]),
                       f"{model / 'decoding.json'}: gap_cost must be a float of at most 2**53 in size, got a number of")
    (model / "decoding.json").write_text(decoding)
    config = (model / "config.json").read_text()
    (model / "config.json").write_text(config.replace('"heads": ', '"heads": ' + "9" * 5000 + ", \"x\": ", 1))
    assert_clear_error(run(["align", "--checkpoint", model, PDZ_A, PDZ_B]), f"cannot read {model / 'config.json'}")
    verified = run(["verify", model])  # was a traceback: Python reads no integer of over 4,300 digits
    assert verified.exit_code == 1 and f"cannot read {model / 'config.json'}" in verified.output, verified.output
    settings = json.loads(config)
    settings["model"]["transport"]["eps_schedule"] = [[10 ** 400, 3], [1.0, 5]]  # float() overflowed: a traceback
    (model / "config.json").write_text(json.dumps(settings))
    assert_clear_error(run(["align", "--checkpoint", model, PDZ_A, PDZ_B]),
                       f"{model / 'config.json'}: eps_schedule holds an integer past 2**53 in size")
    (model / "config.json").write_text(config)
    record = json.loads((model / "training.json").read_text())
    for key, value, command in (("trained_on", {"families": 5}, ["eval", "--checkpoint", model, "--stockholm",
                                                                  SEED / "PF00041.sto", "--bootstrap", 0]),
                                ("dataset", "x", ["compile", "--checkpoint", model, "-o", tmp_path / "c"])):
        (model / "training.json").write_text(json.dumps({**record, key: value}))  # were TypeError tracebacks
        assert_clear_error(run(command), f"{model / 'training.json'}: {key!r} is not what a training record holds")
    (model / "training.json").write_text(deep)
    assert_clear_error(run(["eval", "--checkpoint", model, "--stockholm", SEED / "PF00041.sto", "--pairs-per-family",
                            2, "--bootstrap", 0]), f"cannot read {model / 'training.json'}: maximum recursion depth")
    (model / "training.json").write_text(json.dumps(record))
    (model / "pairhmm.json").write_text(deep)  # read where no reader catches it
    assert_clear_error(run(["align", "--checkpoint", model, PDZ_A, PDZ_B]), "Error: a file was nested too deeply to read")
    # a device count XLA reads (quoted; the last of two) is not blamed for another error
    for flags in ('--xla_force_host_platform_device_count="8"', "--xla_force_host_platform_device_count=0 "
                  "--xla_force_host_platform_device_count=8"):
        assert_clear_error(run(["align", "--checkpoint", model, PDZ_A, PDZ_B], env={"XLA_FLAGS": flags}),
                           "Error: a file was nested too deeply to read")


# ---- 12: memory ------------------------------------------------------------------------------

def test_a_pair_over_the_memory_budget_is_refused_naming_the_option():
    long_a, long_b = "ACDEFGHIKL" * 300, "KLMNPQRSTV" * 300
    result = run(["align", long_a, long_b, "--max-memory", "1G"])
    assert_clear_error(result, "3000 x 3000", "--max-memory")
    assert "needs about" in result.output
    # the pair named once (it was "seq_a vs seq_b: seq_a vs seq_b: aligning ...")
    assert result.output.startswith("Error: seq_a vs seq_b: aligning 3000 x 3000 residues needs about"), result.output


@pytest.mark.parametrize("command", [["align", "--pairs"], ["search", "--all-vs-all"]])
def test_a_budget_no_pair_fits_is_one_error_not_one_a_record(command, tmp_path):
    """`--max-memory 1K` (or 0.5G, under the 640 MiB any pair needs) refused every record of a
    batch, one line each (29 for a 29-sequence search); it is one error, naming the option."""
    fasta = tmp_path / "q.fa"
    fasta.write_text("".join(f">s{i}\nMKVLA{'ACDEF'[:i]}\n" for i in range(5)))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"MKVLA{'A' * i}\tMKVA\n" for i in range(5)))
    source = pairs if command[0] == "align" else fasta
    for budget in ("1K", "0.5G"):
        result = run([*command, source, "--max-memory", budget])
        assert_clear_error(result, "that aligning any pair needs", "--max-memory")
        assert result.output.count("Error") == 1 and "skipped" not in result.output, result.output


@pytest.mark.slow  # a child process loads the model and compiles (15 s)
def test_the_memory_estimate_is_above_the_measured_peak(capsys):
    sys.path.insert(0, str(ROOT.parent / "scripts"))
    try:
        import measure_align_memory
    finally:
        sys.path.pop(0)
    ballast = bytearray(1_500_000_000)  # this process large, as after a long test run:
    ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))  # pages touched
    measure_align_memory.main(["--lengths", "700"])
    del ballast
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["peak_GB"] > row["model_loaded_GB"] > 0 and row["ratio"] > 1.0, row
    assert row["model_loaded_GB"] < 1.0, row  # the child's own peak, not its parent's (ru_maxrss survives exec)


def test_memory_estimate_and_sizes():
    from pfamalign import resources

    assert resources.parse_size("8G") == 8 << 30 and resources.parse_size("512m") == 512 << 20
    assert resources.parse_size("0") == 0 and resources.parse_size("1.5GiB") == 3 << 29
    assert resources.parse_size("0.0") == 0 and resources.parse_size("1") == 1
    for bad in ("", "lots", "-1G", "8X"):
        with pytest.raises(ValueError):
            resources.parse_size(bad)
    for tiny in ("0.5", "0.0001K"):  # under a byte: refused, never read as 0, "no limit"
        with pytest.raises(ValueError, match="less than one byte"):
            resources.parse_size(tiny)
    # the padded square grid: the longer sequence decides; 20000 x 20000 is about 53 GB
    assert resources.estimate_align_bytes(100, 20000) == resources.estimate_align_bytes(20000, 20000)
    assert 50e9 < resources.estimate_align_bytes(20000, 20000) < 54e9
    two = resources.estimate_align_bytes(4096, 4096, models=2) - resources.FIXED_BYTES
    assert two == 2 * (resources.estimate_align_bytes(4096, 4096) - resources.FIXED_BYTES)
    resources.check_align_memory(20000, 20000, 0)  # 0: no limit
    assert resources.default_budget() > 0
    # the estimate counts the grid the plan is computed on (520 residues: 768, not 576)
    pad = resources.padded_length(520)
    assert pad == 768
    assert resources.estimate_align_bytes(520, 10) == resources.FIXED_BYTES + resources.BYTES_PER_CELL * pad ** 2
    assert resources.budget(None) == resources.default_budget()
    # sizes as the errors print them: a budget of 1K is not "0 MiB"
    assert [resources.format_size(n) for n in (512, 1024, 640 << 20, 3 << 29)] == [
        "512 B", "1 KiB", "640 MiB", "1.5 GiB"]


def test_a_batch_of_pairs_fits_the_memory_budget_together(tmp_path, monkeypatch):
    """The budget (and a ulimit -v) was checked pair by pair while up to 8 pairs of a length
    were planned at once: 8 pairs of 3,000 residues peaked at 10 GB under --max-memory 2G."""
    from pfamalign import resources
    from pfamalign.inference import BATCH_SIZES

    per_pair = resources.BATCH_CELL_MARGIN * resources.BYTES_PER_CELL * 2048 ** 2  # 0.75 GiB
    for budget, want in ((0, 8), (None, 8), (6 << 30, 4), (3 << 30, 2), (2 << 30, 1), (1, 1)):
        got = resources.pairs_at_once(2048, budget, 1, BATCH_SIZES)
        assert got == want, (budget, got)
        assert got == 1 or not budget or resources.FIXED_BYTES + got * per_pair <= budget
    assert resources.pairs_at_once(2048, 6 << 30, 2, BATCH_SIZES) == 2  # an ensemble's two plan models
    monkeypatch.setattr(resources, "address_space_left", lambda: 1 << 30)  # a ulimit -v leaving 1 GiB
    assert resources.pairs_at_once(2048, 0, 1, BATCH_SIZES) == 1
    monkeypatch.undo()
    rng = np.random.default_rng(0)
    seq = lambda: "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), 300))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"a{n}\t{seq()}\tb{n}\t{seq()}\n" for n in range(8)))
    for budget, batches in (("0", "8x320"), ("700M", "2x320")):  # 640 MiB + 2 x 19 MiB: 2 at once
        result = run(["align", "--pairs", pairs, "-f", "cigar", "-v", "--max-memory", budget])
        assert result.exit_code == 0, result.output
        assert f"plan batches (pairs x padded length): {batches};" in result.output, result.output
    from pfamalign.inference import Predictor  # its plans in input order too (eval, tuning, ensemble)

    predictor = Predictor(max_memory=700 << 20)
    features = [tuple(predictor.featurize([seq(), seq()])) for _ in range(8)]
    assert len(list(predictor.plans(features, symmetric=True))) == 8 and predictor.shapes == {(2, 320)}


def test_a_containers_memory_limit_caps_the_default_budget(tmp_path, monkeypatch):
    from pfamalign import resources

    physical = resources.machine_memory()
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(resources, "CGROUP_LIMIT_FILES", (str(v2), str(v1)))
    assert resources.machine_memory() == physical  # neither file: the machine's memory
    v2.write_text("max\n")  # cgroup v2 without a limit
    v1.write_text("9223372036854771712\n")  # v1 without a limit: a huge number
    assert resources.machine_memory() == physical
    v2.write_text(f"{2 << 30}\n")
    assert resources.machine_memory() == min(physical, 2 << 30)
    assert resources.default_budget() == int(min(physical, 2 << 30) * resources.DEFAULT_FRACTION)
    assert (resources.budget("2G"), resources.budget(0), resources.budget(1024)) == (2 << 30, 0, 1024)



def _address_space_limit(nbytes: int):
    """A ``preexec_fn`` that sets the child's ``ulimit -v`` (its soft RLIMIT_AS) to ``nbytes``."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (nbytes, resource.getrlimit(resource.RLIMIT_AS)[1]))


def test_the_address_space_left_under_a_ulimit_is_read_from_the_process():
    from pfamalign import resources

    probe = "from pfamalign import resources; print(resources.address_space_left())"
    free = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    limited = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                             preexec_fn=_address_space_limit(3 << 30))
    assert free.stdout.strip() == "None", free.stderr
    assert 2 << 30 < int(limited.stdout) < 3 << 30, limited.stderr  # the limit less what Python maps
    assert resources.address_space_left() is None or resources.address_space_left() > 0


def test_the_address_space_check_charges_a_pairs_growth_with_its_margin(monkeypatch):
    from pfamalign import resources

    monkeypatch.setattr(resources, "address_space_left", lambda: 2 << 30)
    fits = int(((2 << 30) - resources.ADDRESS_SPACE_SLACK) / resources.ADDRESS_SPACE_PER_BYTE)
    resources.check_memory(resources.FIXED_BYTES + fits - 16, 0, "aligning", fixed=resources.FIXED_BYTES)
    with pytest.raises(ValueError, match=r"aligning needs about 2.0 GiB more address space, over the 2.0 GiB "
                                         r"this process's limit leaves \(ulimit -v\): raise the limit"):
        resources.check_memory(resources.FIXED_BYTES + fits + (1 << 20), 0, "aligning", fixed=resources.FIXED_BYTES)
    monkeypatch.setattr(resources, "address_space_left", lambda: None)  # no ulimit: the budget alone
    resources.check_memory(10 ** 15, 0, "aligning", fixed=resources.FIXED_BYTES)


def test_a_pair_over_the_address_space_limit_is_refused_before_xla_fails(tmp_path):
    """Under ``ulimit -v`` jax maps what the limit allows and a pair's arrays fail to map midway:
    before the check, ``align`` of two PDZ domains under a 1.5 GB limit ended in XLA's
    RESOURCE_EXHAUSTED traceback (1 GB: a segfault; 0.6 GB: an abort).
    The limit here: what a process that loaded the model maps without one, plus 200 MiB (jax
    maps less under a limit), so that the model loads and the pair is what does not fit."""
    probe = ("import re; from pfamalign.inference import Predictor; Predictor(None); "
             "print(re.search(r'VmSize:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    limit = (int(loaded.stdout) << 10) + (200 << 20)
    out = tmp_path / "out.txt"
    proc = subprocess.run([sys.executable, "-m", "pfamalign.cli", "align", PDZ_A, PDZ_B, "-o", str(out)],
                          capture_output=True, text=True, timeout=300, preexec_fn=_address_space_limit(limit))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: seq_a vs seq_b: aligning 65 x 63 residues needs about "), proc.stderr
    assert "this process's limit leaves (ulimit -v)" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no output, no temporary


def test_running_out_of_memory_is_one_error_line(monkeypatch):
    """numpy's MemoryError and XLA's RESOURCE_EXHAUSTED (what a command without a memory check
    meets when the machine, its container or its ulimit runs out) end in one line, exit 1."""
    import jax

    from pfamalign.inference import Predictor

    def exhausted_numpy(*args, **kwargs):
        np.ones(1 << 47)  # 1 PiB: numpy's MemoryError

    def exhausted_xla(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 684893304 bytes.")

    for fail, detail in ((exhausted_numpy, "Unable to allocate 1.00 PiB"),
                         (exhausted_xla, "RESOURCE_EXHAUSTED: Out of memory allocating 684893304 bytes.")):
        monkeypatch.setattr(Predictor, "align_records", fail)
        result = run(["align", PDZ_A, PDZ_B])
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output, result.output
        assert result.output.strip().splitlines()[-1].startswith(f"Error: out of memory ({detail}"), result.output
        assert "split long sequences into domains, or give the process more memory" in result.output


# ---- 14: loading untrusted weights runs no code ----------------------------------------------

class _Payload:
    """Unpickling this creates ``marker``: what a crafted checkpoint could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _tiny_esm(directory):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_esm", ROOT / "data" / "tiny_esm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_tiny_esm(directory)


@pytest.mark.parametrize("trust", [None, "0", "false", "no", "off", "FALSE "])
def test_a_crafted_pickle_in_esm_weights_is_refused_without_running(tmp_path, monkeypatch, trust):
    """Every spelling of "no" keeps weights-only loading (false, no and off turned full
    unpickling on: only "" and "0" were read as no)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("esm")
    from pfamalign.pipelines.embed import TRUST_ENV, EmbedderError, load_esm

    monkeypatch.delenv(TRUST_ENV, raising=False)
    if trust is not None:
        monkeypatch.setenv(TRUST_ENV, trust)
    weights = _tiny_esm(tmp_path / "w")
    marker = tmp_path / "pwned"
    torch.save({"model": _Payload(marker)}, weights)
    with pytest.raises(EmbedderError, match="weights-only"):
        load_esm(weights)
    assert not marker.exists()


def test_an_unclear_trust_setting_is_refused_before_any_file_is_read(tmp_path, monkeypatch):
    pytest.importorskip("esm")
    from pfamalign.pipelines.embed import TRUST_ENV, EmbedderError, load_esm

    monkeypatch.setenv(TRUST_ENV, "maybe")
    with pytest.raises(EmbedderError, match=r"\$PFAMALIGN_TRUST_WEIGHTS='maybe': give 1 to allow full unpickling"):
        load_esm(_tiny_esm(tmp_path / "w"))


@pytest.mark.parametrize("regression", ["crafted", "truncated"])
def test_the_contact_regression_file_is_never_read(tmp_path, monkeypatch, regression):
    """Residue representations do not use the contact head: a crafted or damaged regression
    file beside good weights failed the load, blaming the model file (and advising the user to
    trust it, which would have run the regression file's code)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("esm")
    from pfamalign.pipelines.embed import TRUST_ENV, get_embedder

    monkeypatch.delenv(TRUST_ENV, raising=False)
    weights = _tiny_esm(tmp_path / "w")
    target = weights.with_name(f"{weights.stem}-contact-regression.pt")
    marker = tmp_path / "pwned"
    if regression == "crafted":
        torch.save({"model": _Payload(marker)}, target)
    else:
        target.write_bytes(target.read_bytes()[:1000])
    features = get_embedder(weights.stem, weights).embed(["MKV"])[0]
    assert features.shape == (3, 32) and np.isfinite(features).all() and not marker.exists()


def test_every_torch_load_of_esm_weights_is_weights_only(tmp_path, monkeypatch):
    """Explicitly: fair-esm's own loader leaves it to the torch default (unsafe before 2.6)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("esm")
    from pfamalign.pipelines.embed import TRUST_ENV, load_esm

    monkeypatch.delenv(TRUST_ENV, raising=False)
    weights = _tiny_esm(tmp_path / "w")
    calls, real = [], torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    load_esm(weights)
    assert calls == [True]  # the model (its contact-regression file is never read)


def test_the_embed_extra_requires_a_weights_only_torch():
    import tomllib

    extras = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert "torch>=2.6" in extras["embed"]


def test_an_oversized_fasta_argument_is_refused_while_reading(tmp_path, monkeypatch):
    from pfamalign import inputs

    monkeypatch.setattr(inputs, "MAX_RECORD", 64)
    big = tmp_path / "big.fasta"
    big.write_text(">big\n" + "ACDEFGHIKL\n" * 10)
    with pytest.raises(ValueError, match="record longer than 64 residues"):
        inputs.pair_from_sequences(str(big), "ACD")


# ---- hardening probe: sequence and pairs inputs, batch outputs, option values ----------------

def test_a_fasta_file_with_any_extension_is_read_as_a_file(tmp_path, monkeypatch, capsys):
    """A residue string holds neither '.' nor '/': an existing name with either is a file."""
    from pfamalign import inputs

    monkeypatch.chdir(tmp_path)
    for name in ("q.txt", "q.seq", "q.pep", "q.aln"):
        (tmp_path / name).write_text(">q\nKLMNP\n")
        assert inputs.read_sequence(name, "seq_a") == ("q", "KLMNP"), name
    (tmp_path / "noext").write_text(">n\nWWW\n")
    assert inputs.read_sequence("./noext", "seq_a") == ("n", "WWW")
    assert "read as residues" not in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"position 2 .*nor is there a file named t\.xyz"):
        inputs.read_sequence("t.xyz", "seq_a")  # a mistyped name is not blamed on its residues
    assert inputs.read_sequence("@noext", "seq_a") == ("n", "WWW")
    with pytest.raises(ValueError, match="^'@' names no file: write @FILE"):
        inputs.read_sequence("@", "seq_a")  # was ": cannot read FASTA file", the working directory read


def test_at_file_reads_the_file_in_every_fasta_argument(tmp_path, monkeypatch):
    """``@FILE`` (the form align's warning suggests for a file named like residues) is read as
    the file FILE by align's single multi-FASTA argument and by search's QUERY and DATABASE
    too, and -o naming that file is refused as an input."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two").write_text(">a\nMKVLAAGIVGLLLAWWRRTTPLLK\n>b\nMKVLSAGIVALLAWWRRTTPLLK\n")
    (tmp_path / "q").write_text(">q\nMKVLAAGIVGLLLAWWRRTTPLLK\n")
    res = run(["align", "@two", "-f", "cigar"])
    assert res.exit_code == 0 and res.stdout.startswith("a\tb\t"), res.output
    res = run(["search", "@q", "@two", "-f", "blast6"])
    assert res.exit_code == 0 and [line.split("\t")[:2] for line in res.stdout.splitlines()] == [
        ["q", "a"], ["q", "b"]], res.output
    res = run(["search", "@q", "@two", "-o", "two"])
    assert res.exit_code == 2 and "output two is also an input" in res.stderr
    res = run(["search", "@", "two"])
    assert res.exit_code == 2 and "'@' names no file" in res.stderr


def test_directories_and_pipes_as_sequence_arguments(tmp_path, monkeypatch, capsys):
    from pfamalign import inputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ADIR").mkdir()
    assert inputs.read_sequence("ADIR", "seq_a") == ("seq_a", "ADIR")
    assert "a directory of that name exists" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^\./ADIR: is a directory; give a FASTA file"):
        inputs.read_sequence("./ADIR", "seq_a")
    read, write = os.pipe()  # what <(printf ...) hands over: /dev/fd/N, a pipe, no regular file
    os.write(write, b">x\nMKVLAAG\n")
    os.close(write)
    try:
        assert inputs.read_sequence(f"/dev/fd/{read}", "seq_a") == ("x", "MKVLAAG")
    finally:
        os.close(read)


def test_byte_order_mark_and_gzip_fasta_are_read(tmp_path):
    import gzip

    from pfamalign import inputs

    bom = tmp_path / "bom.fa"
    bom.write_bytes(b"\xef\xbb\xbf>a\nMKVL\n")
    packed = tmp_path / "two.fa.gz"
    packed.write_bytes(gzip.compress(b">a\nMKVL\n>b\nMKVA\n"))
    assert inputs.read_sequence(str(bom), "seq_a") == ("a", "MKVL")
    assert [(r.id, r.seq) for r in inputs.read_fasta(packed)] == [("a", "MKVL"), ("b", "MKVA")]
    broken = tmp_path / "broken.fa.gz"
    broken.write_bytes(gzip.compress(b">a\n" + b"MKVL\n" * 1000)[:-20])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        list(inputs.read_fasta(broken))


@pytest.mark.parametrize("args, text, want", [
    (["-", "MKVLSAGIVG"], ">x\nMKVLAAGIVG\n", "10M"),
    (["--pairs", "-"], "MKVLAAG\tMKVLSAG\n", "pair1_a\tpair1_b\t7M"),
])
def test_gzip_on_standard_input_is_read(args, text, want):
    """Standard input is told gzip by its magic bytes too (a real pipe: CliRunner's input
    cannot be peeked)."""
    import gzip

    for data in (text.encode(), gzip.compress(text.encode())):
        proc = subprocess.run([sys.executable, "-m", "pfamalign.cli", "align", *args, "-f", "cigar"],
                              input=data, capture_output=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.decode().strip() == want, proc.stderr.decode()


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_a_pairs_file_without_pairs_is_an_error(tmp_path, text):
    empty = tmp_path / "e.tsv"
    empty.write_text(text)
    assert_clear_error(run(["align", "--pairs", empty]), f"no pairs in {empty}")


@pytest.mark.parametrize("text, kind", [(">a\nMKVL\n>b\nMKVA\n", "FASTA"),
                                        ("# STOCKHOLM 1.0\na MKVL\nb MKVA\n//\n", "Stockholm")])
def test_a_fasta_or_stockholm_pairs_file_fails_once(tmp_path, text, kind):
    path = tmp_path / "wrong.tsv"
    path.write_text(text)
    result = run(["align", "--pairs", path])
    assert_clear_error(result, f"looks like {kind}, not a pairs file")
    assert result.exit_code == 2 and result.output.count("Error:") == 1, result.output


def test_pairs_from_standard_input():
    result = run(["align", "--pairs", "-", "-f", "cigar"], input="MKVLAAG\tMKVLSAG\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "pair1_a\tpair1_b\t7M\n"


MIXED_FASTA = ">a\nMKVLAAGIVGLLLA\n>bad\nMKV*LL\n>c\nMKVLSAGIVGLAQQ\n>d\nMKVLA\n"


def test_many_pair_cigar_lines_name_their_pair(tmp_path):
    import re

    fasta = tmp_path / "mixed.fa"
    fasta.write_text(MIXED_FASTA)
    result = run(["align", fasta, "--all-pairs", "-f", "cigar"])
    assert result.exit_code == 1, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines() if not line.startswith("#")]
    assert [row[:2] for row in rows] == [["a", "c"], ["a", "d"], ["c", "d"]]
    assert all(re.fullmatch(r"(\d+[MDI])+", row[2]) for row in rows), rows
    assert f"{fasta}:3" in result.stdout  # a '#' line is at home in a table


@pytest.mark.parametrize("fmt, first_line", [("fasta", ">a"), ("stockholm", "# STOCKHOLM 1.0")])
def test_formats_without_comments_stay_valid_when_records_are_skipped(tmp_path, fmt, first_line):
    fasta = tmp_path / "mixed.fa"
    fasta.write_text(MIXED_FASTA)
    out = tmp_path / f"out.{fmt}"
    result = run(["align", fasta, "--all-pairs", "-f", fmt, "-o", out])
    assert result.exit_code == 1 and f"skipped {fasta}:3" in result.stderr, result.output
    text = out.read_text()
    assert text.startswith(first_line) and "# error" not in text, text


@pytest.mark.parametrize("command", [["align", "MKVL", "MKVA"], ["search", "q.fa", "q.fa"]])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_max_length_below_one_is_refused_as_an_option_value(command, value):
    result = run([*command, "--max-length", value])
    assert result.exit_code == 2 and "Invalid value for '--max-length'" in result.output, result.output


@pytest.mark.parametrize("command", [["align", "MKVL", "MKVA", "-o"], ["certify", "MKVL", "MKVA", "--json"]])
def test_two_outputs_on_one_file_say_so(command, tmp_path):
    png = tmp_path / "p.png"
    result = run([*command, png, "--plot", png])
    assert_clear_error(result, "two outputs name one file", str(png))
    assert "is also an input" not in result.output
    assert not png.exists()


def test_residue_errors_number_positions_from_one():
    from pfamalign.residues import normalize_sequence

    with pytest.raises(ValueError, match=r"'\*' at position 4 \(1-based"):
        normalize_sequence("MKV*")


def test_align_help_gives_the_shipped_decoders_mix():
    decoding = ROOT.parent / "pfamalign" / "assets" / "default_model" / "decoding.json"
    alpha = json.loads(decoding.read_text())["alpha"]
    result = run(["align", "--help"])
    assert f"{alpha:.0%} plan, {1 - alpha:.0%} pair-HMM" in result.output, result.output
    assert "half and half" not in result.output


def test_duplicate_fasta_ids_warn_once_and_are_kept(tmp_path, capsys):
    from pfamalign import inputs

    dup = tmp_path / "dup.fa"
    dup.write_text(">a\nMKVLAAG\n>a\nMKVLSAG\n>b\nMKV\n>b\nMKL\n>c\nMKK\n")
    assert [r.id for r in inputs.read_fasta(dup)] == ["a", "a", "b", "b", "c"]
    err = capsys.readouterr().err
    assert err.count("Warning:") == 1 and "'a', 'b'" in err and "'c'" not in err, err


def test_an_output_symlink_is_written_through(tmp_path):
    from pfamalign.outputs import open_output

    target = tmp_path / "target.txt"
    target.write_text("old\n")
    link = tmp_path / "L"
    link.symlink_to(target.name)
    with open_output(link) as sink:
        sink.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


# ---- review of 2026-11-24: prepare, train, verify --------------------------------------------

def _tree_bytes(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_bad_reuse_source_leaves_the_overwritten_dataset_intact(tmp_path):
    from pfamalign.pipelines.prepare import run_prepare

    out, b62 = tmp_path / "ds", tmp_path / "b62"
    run_prepare(_prepare_cfg(out), quiet=True)
    run_prepare(_prepare_cfg(b62, embedder="builtin/onehot+blosum62"), quiet=True)
    before = _tree_bytes(out)
    again = ["prepare", "shards", "--pfam", SMALL, "--out", out, "--pairs-per-family", 5, "-q",
             "--overwrite", "--reuse-embeddings"]
    assert_clear_error(run(again + [b62]), f"--reuse-embeddings {b62}",
                       "its embeddings are builtin/onehot+blosum62 (weights fingerprint", "this --embedder")
    assert _tree_bytes(out) == before


def test_an_overwrite_may_reuse_the_embeddings_of_the_dataset_it_replaces(tmp_path):
    """The replacement is built beside the old dataset, so the old one can serve its own
    --overwrite: every sequence both runs sample is copied, and the bytes are those of a run
    that embedded everything."""
    from pfamalign.pipelines.prepare import run_prepare

    out, fresh = tmp_path / "ds", tmp_path / "fresh"
    run_prepare(_prepare_cfg(out), quiet=True)
    old_manifest = (out / "manifest.json").read_text()
    result = run_prepare(_prepare_cfg(out, seed=1, overwrite=True, reuse_embeddings=(f"{out}/.",)),
                         quiet=True)
    emb = result.summary["embeddings"]
    assert emb["from_cache"] > 0
    assert emb["from_cache"] + emb["computed_this_run"] == emb["count"]
    assert (out / "manifest.json").read_text() != old_manifest
    run_prepare(_prepare_cfg(fresh, seed=1), quiet=True)
    assert _tree_bytes(out) == _tree_bytes(fresh)


def _reuse_source(dataset, tmp_path) -> pathlib.Path:
    """A copy of ``dataset`` (seed 3) to reuse: a run of the same options hits every record."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(dataset, src)
    return src


def _reuse_from(dataset, src, tmp_path):
    return run(["prepare", "shards", "--pfam", SEED, "--out", tmp_path / "out", "-q",
                "--pairs-per-family", 4, "--splits", "0.7,0.2,0.1", "--seed", 3,
                "--reuse-embeddings", src])


def test_a_damaged_reuse_source_is_a_clear_error(dataset, tmp_path):
    src = _reuse_source(dataset, tmp_path)
    assert _reuse_from(dataset, src, tmp_path).exit_code == 0  # intact: reused
    (emb,) = (src / "embeddings").glob("emb-*")
    _flip_a_byte(emb)
    assert_clear_error(_reuse_from(dataset, src, tmp_path / "2"), f"--reuse-embeddings {src}",
                       "damaged", f"pfamalign verify {src}")


def test_an_index_pointing_at_other_records_is_refused_not_copied(dataset, tmp_path):
    src = _reuse_source(dataset, tmp_path)
    index = src / "embeddings" / "index.tsv"
    head, *rows = index.read_text().splitlines()
    hashes = [r.split("\t")[:2] for r in rows]
    ids = [r.split("\t")[2] for r in rows]
    rotated = ["\t".join([*h, i]) for h, i in zip(hashes, ids[1:] + ids[:1])]
    index.write_text("\n".join([head, *rotated]) + "\n")
    assert_clear_error(_reuse_from(dataset, src, tmp_path), f"--reuse-embeddings {src}",
                       "index does not match the shards")


@pytest.mark.parametrize("missing", ["families.tsv", "val/lengths.npy"])
def test_a_dataset_missing_a_file_is_refused_before_training(dataset, tmp_path, missing):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    (ds / missing).unlink()
    assert_clear_error(run(["train", "--data", ds, "--config", "align_ce", "--out",
                            tmp_path / "run"]), f"{missing} is missing")
    assert not (tmp_path / "run" / "model").exists()
    assert_clear_error(run(["verify", ds]), f"{missing} is missing")


def test_a_damaged_families_table_is_refused_before_training(dataset, tmp_path):
    """A byte of families.tsv flipped (its size kept, so opening the dataset passes): train
    read the table only when it wrote training.json, after every step, and failed with a bare
    "'utf-8' codec can't decode byte"; it is read at the start and named."""
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    table = bytearray((ds / "families.tsv").read_bytes())
    table[len(table) // 2] = 0x86
    (ds / "families.tsv").write_bytes(bytes(table))
    assert_clear_error(run(["train", "--data", ds, "--config", "align_ce", "--out", tmp_path / "run",
                            *(f"--set={k}={v}" for k, v in TINY.items())]),
                       f"{ds / 'families.tsv'}: unreadable families table", "pfamalign verify")
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "model").exists()


@pytest.mark.slow  # compiles a train step (15 s)
def test_validation_asked_of_a_dataset_without_val_pairs_is_a_warning(tmp_path):
    """`--eval-every N` on a dataset with no val split validated nothing, silently."""
    from conftest import make_seed_dataset

    ds = make_seed_dataset(tmp_path / "ds", pairs_per_family=6, max_len=160, split_fractions=(0.6, 0.0, 0.4),
                           seed=1)
    out = tmp_path / "my run"
    result = run(["train", "--data", ds, "--config", "align_ce", "--out", out, "--no-tune", "--eval-every", "1",
                  *(f"--set={k}={v}" for k, v in TINY.items())])
    assert result.exit_code == 0, result.output
    assert f"warning: {ds} has no val pairs (within max_len): no validation every 1 steps" in result.output
    # the next commands can be pasted into a shell: the run's path holds a space
    model = shlex.quote(os.path.relpath(out / "model"))
    assert f"pfamalign align --checkpoint {model} SEQ_A SEQ_B" in result.output and "'" in model
    assert not any(key.startswith("val/") for line in (out / "metrics.jsonl").read_text().splitlines()
                   for key in json.loads(line))
    assert "train/loss" in result.output and "(val/: the model's plan" not in result.output  # no legend of none


@pytest.mark.slow  # compiles a train step (15 s)
def test_a_signal_while_the_run_finishes_exits_128_plus_it_and_the_rerun_finishes(
        dataset, tmp_path, monkeypatch, foreground_sigint):
    import signal

    from pfamalign.checkpoint import TRAINING_RECORD
    from pfamalign.training import loop

    finish = loop.finish_model

    def interrupted_finish(*args, **kwargs):  # the signal arrives while the decoder is chosen
        os.kill(os.getpid(), signum)
        return finish(*args, **kwargs)

    monkeypatch.setattr(loop, "finish_model", interrupted_finish)
    out = tmp_path / "run"
    args = ["train", "--data", dataset, "--config", "align_ce", "--out", out, "--no-tune",
            *(f"--set={k}={v}" for k, v in TINY.items())]
    for signum in (signal.SIGTERM, signal.SIGINT):  # the second run resumes at the last step
        result = run(args)
        assert result.exit_code == 128 + signum, result.output
        assert not (out / "model" / TRAINING_RECORD).exists()
    monkeypatch.undo()
    assert run(args).exit_code == 0
    assert (out / "model" / TRAINING_RECORD).exists()


@pytest.mark.parametrize("option, key", [
    ("--set=train.lr=null", "train.lr"),
    ("--set=train.final_lr_ratio=null", "train.final_lr_ratio"),
    ("--set=train.weight_decay=null", "train.weight_decay"), ("--lr=inf", "--lr"),
    ("--set=train.weight_decay=NaN", "train.weight_decay"),
    ("--set=train.clip_norm=Infinity", "train.clip_norm")])
def test_a_missing_or_non_finite_optimiser_setting_is_refused(dataset, tmp_path, option, key):
    result = run(["train", "--data", dataset, "--config", "align_ce", "--out", tmp_path / "run",
                  option])
    assert_clear_error(result, key)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", ['{"model": {"name": "al', "[1]"])
def test_a_damaged_run_config_is_named(dataset, tmp_path, text):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(text)
    assert_clear_error(run(["train", "--data", dataset, "--out", tmp_path / "run"]),
                       f"{tmp_path / 'run' / 'config.json'} is damaged", "new --out")
    assert (tmp_path / "run" / "config.json").read_text() == text


def test_fold_warnings_speak_of_the_fold_and_a_fold_with_splits_is_refused(tmp_path):
    args = ["prepare", "shards", "--pfam", SMALL, "-q", "--pairs-per-family", 4, "--fold", "0/2"]
    result = run(args + ["--out", tmp_path / "ds"])  # one family: two splits are empty
    assert result.exit_code == 0, result.output
    assert "split is empty" in result.output and "--fold 0/2" in result.output
    assert "--splits" not in result.output
    result = run(args + ["--out", tmp_path / "both", "--splits", "0.5,0.25,0.25"])
    assert result.exit_code == 2 and "--fold K/N and --splits" in result.output, result.output
    assert not (tmp_path / "both").exists()


def test_a_duplicate_family_is_not_blamed_on_skip_bad(tmp_path):
    for name in ("a.sto", "b.sto"):
        (tmp_path / name).write_text(SMALL.read_text())
    result = run(["prepare", "shards", "--pfam", tmp_path / "a.sto", "--pfam", tmp_path / "b.sto",
                  "--out", tmp_path / "ds", "-q", "--pairs-per-family", 4])
    assert result.exit_code == 0, result.output
    assert "left out 1 duplicate family" in result.output and "--skip-bad" not in result.output


def test_a_stockholm_file_with_a_byte_order_mark_is_read(tmp_path):
    from pfamalign.pipelines.stockholm import expand_inputs, read_families

    bom = tmp_path / "family.txt"  # no Stockholm suffix: a directory input sniffs its header
    bom.write_bytes(b"\xef\xbb\xbf" + SMALL.read_bytes())
    assert expand_inputs([tmp_path])[0] == [bom]
    assert [f.rows for f in read_families(bom)] == [f.rows for f in read_families(SMALL)]


def test_a_row_length_error_blames_the_odd_row_even_when_it_comes_first(tmp_path):
    from pfamalign.pipelines.stockholm import StockholmError, read_families

    sto = tmp_path / "odd.sto"
    sto.write_text("# STOCKHOLM 1.0\n#=GF AC PF99999.1\nodd/1-4 ACDE\nb/1-5 ACDEF\n"
                   "c/1-5 ACDEG\n//\n")
    with pytest.raises(StockholmError, match=r"odd.sto:3: sequence 'odd/1-4' has 4 alignment "
                                             r"columns but 'b/1-5' has 5 \(2 of 3 rows\)"):
        list(read_families(sto))


# ---- options in range, named as typed (fuzzing of 2026-11-25) ----------------------------------

@pytest.mark.parametrize("option, value", [("--min-mass", "-1"), ("--gap-cost", "-1e308"),
                                           ("--plan-power", "1e308")])
def test_decoder_values_out_of_range_are_refused_naming_the_option(option, value):
    assert_clear_error(run(["align", PDZ_A, PDZ_B, "--decoder", "posterior", option, value]), option)


@pytest.mark.parametrize("args, fragment", [
    (["certify", PDZ_A, PDZ_B, "--tail-depths", "1,,2"], "--tail-depths"),
    (["certify", PDZ_A, PDZ_B, "--tol", "inf"], "--tol"),
    (["certify", PDZ_A, PDZ_B, "--perturbation", "1e308"], "--perturbation"),
    (["certify", PDZ_A, PDZ_B, "--block-rows", "0"], "--block-rows"),
    (["align", PDZ_A, PDZ_B, "--engine", "steps", "--steps", "100001"], "--steps"),
    (["search", "-", "--all-vs-all", "--decoys", "1000000"], "--decoys"),
    (["eval", "--stockholm", SEED, "--no-model", "--pairs-per-family", "0"], "--pairs-per-family"),
    (["eval", "--stockholm", SEED, "--no-model", "--max-pairs", "-1"], "--max-pairs"),
])
def test_options_out_of_range_are_refused_before_any_work(args, fragment):
    assert_clear_error(run(args, input=""), fragment)


def test_the_command_lines_step_limit_is_the_engines():
    """--engine steps accepted 100,000 steps, whose solve (then a step per traced operation)
    never finished: 1,000 took 9.5 min and 7.4 GB on a 64-residue pair. The limit is the
    engine's, on the command line and in Python."""
    import pfamalign
    from pfamalign.asap import MAX_ENGINE_STEPS
    from pfamalign.commands._common import MAX_ENGINE_STEPS as CLI_MAX

    assert CLI_MAX == MAX_ENGINE_STEPS == 10_000
    assert_clear_error(run(["align", "--engine", "steps", "--steps", "10001", "MKV", "MKV"]), "--steps")
    with pytest.raises(ValueError, match="steps"):
        pfamalign.PairAligner(engine="steps", steps=MAX_ENGINE_STEPS + 1)


def test_a_length_limit_names_whose_it_is():
    """Over the caller's --max-length the message says to raise it; over what the model's
    embedder accepts (ESM-2: 1,022 residues), raising --max-length cannot help, and the
    message does not say to."""
    import types

    from pfamalign.inference import Predictor

    predictor = Predictor()
    predictor._set_featurizer("m", types.SimpleNamespace(max_residues=None), max_length=100, max_memory=None)
    assert "longer than the limit of 100 residues; split it into domains or raise --max-length" in (
        predictor.sequence_problem("A" * 101))
    predictor._set_featurizer("m", types.SimpleNamespace(max_residues=50), max_length=100, max_memory=None)
    problem = predictor.sequence_problem("A" * 51)
    assert "longer than this model accepts (50, its embedder's limit)" in problem and "--max-length" not in problem
    assert predictor.sequence_problem("A" * 50) is None


def test_certify_refuses_a_pair_over_its_memory_budget_and_takes_max_length(tmp_path):
    result = run(["certify", "ACDEFGHIKL" * 200, "KLMNPQRSTV" * 200, "--max-memory", "1G"])
    assert_clear_error(result, "certifying 2000 x 2000 residues", "--max-memory")
    assert_clear_error(run(["certify", "ACDEFGHIKL" * 50, PDZ_B, "--max-length", "100"]),
                       "longer than the limit of 100 residues", "--max-length")
    assert_clear_error(run(["barycenter", "ACDEFGHIKL" * 50, PDZ_B, "--max-length", "100"]),
                       "longer than the limit of 100 residues")


def test_eval_names_the_families_it_leaves_out(tmp_path):
    stockholm = tmp_path / "sto"
    stockholm.mkdir()
    shutil.copy(SEED / "PF02184.sto", stockholm)
    (stockholm / "SHORT.sto").write_text("# STOCKHOLM 1.0\n#=GF AC PF99998.1\nA/1-5 MKVLA\nB/1-5 MKVIA\n//\n")
    result = run(["eval", "--stockholm", stockholm, "--no-model", "--bootstrap", "0", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "left out 1 family" in result.output and "PF99998.1" in result.output
    assert "shorter than min_len=10" in result.output
    alone = run(["eval", "--stockholm", stockholm / "SHORT.sto", "--no-model", "--quiet"])
    assert_clear_error(alone, "no pairs to score", "PF99998.1")
    (tmp_path / "empty").mkdir()
    assert_clear_error(run(["eval", "--stockholm", tmp_path / "empty", "--no-model"]), "no Stockholm files")


def test_a_truncated_compiled_module_is_one_error_line_not_aborted(monkeypatch):
    """A truncated .pyc under the installation raises EOFError ("marshal data too short") when
    a command's module is imported, which click printed as a bare "Aborted!"."""
    from pfamalign import cli

    def truncated(self, ctx, name):  # as importing the command's module from a truncated .pyc
        raise EOFError("marshal data too short")

    monkeypatch.setattr(cli._LazyGroup, "get_command", truncated)
    result = run(["verify", "."])
    assert_clear_error(result, "marshal data too short")
    assert "Aborted" not in result.output and "__pycache__" in result.output


def test_a_truncated_compiled_module_is_named_when_the_import_says_which(tmp_path, monkeypatch):
    """A library's truncated .pyc: the message named pfamalign's folder, where deleting helps nothing."""
    import importlib
    import py_compile

    from pfamalign import cli

    source = tmp_path / "truncated_module.py"
    source.write_text("X = 1\n")
    pyc = pathlib.Path(importlib.util.cache_from_source(str(source)))
    py_compile.compile(str(source), cfile=str(pyc))
    pyc.write_bytes(pyc.read_bytes()[:20])  # the header alone
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with pytest.raises(EOFError) as caught:
        importlib.import_module("truncated_module")
    assert f"({pyc})" in cli._ended_early(caught.value)


def test_a_closed_pipe_ends_a_command_quietly(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{PDZ_A}\t{PDZ_B[:40 + n % 20]}\n" for n in range(150)))
    proc = subprocess.Popen([sys.executable, "-m", "pfamalign.cli", "align", "--pairs", str(pairs), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()  # what `| head -1` reads, then it closes the pipe
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + 13, err.decode()  # as a shell reports SIGPIPE
    assert b"Error" not in err and b"Traceback" not in err, err.decode()


def test_a_full_device_is_named_as_the_output_that_failed():
    if not pathlib.Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    assert_clear_error(run(["align", PDZ_A, PDZ_B, "-o", "/dev/full"]), "cannot write /dev/full",
                       "No space left")


def test_a_full_standard_output_is_one_error_line_that_says_what_to_do():
    if not pathlib.Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "pfamalign.cli", "align", PDZ_A, PDZ_B], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "[Errno" not in proc.stderr, proc.stderr
    assert "Error: cannot write the output: No space left on device; free some space" in proc.stderr


def test_all_vs_all_of_one_sequence_says_there_is_nothing_to_compare(tmp_path):
    one = tmp_path / "one.fa"
    one.write_text(f">a\n{PDZ_A}\n")
    assert_clear_error(run(["search", one, "--all-vs-all"]), "needs at least two usable sequences")


def test_a_dataset_index_without_a_dataset_is_refused():
    assert_clear_error(run(["certify", PDZ_A, PDZ_B, "--index", "5"]), "--index", "add --data")
    assert_clear_error(run(["barycenter", PDZ_A, PDZ_B, "--split", "val"]), "--split", "add --data")


def test_loading_a_runs_unfinished_model_warns(saved_model, tmp_path, capsys):
    from pfamalign.inference import Predictor

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved_model, run_dir / "model")
    Predictor(run_dir / "model")
    assert "Warning:" not in capsys.readouterr().err  # finished: no word
    (run_dir / "model" / "training.json").unlink()
    Predictor(run_dir / "model")
    assert "is unfinished" in capsys.readouterr().err


def test_a_run_loading_its_own_model_to_tune_it_is_not_called_unfinished(saved_model, tmp_path, capsys):
    """While `train` holds the run's lock it loads model/ to tune the decoder, before it writes
    training.json: no warning from the run itself; another process loading the model then is
    told the run is in progress (and by whom), not that it was left unfinished."""
    import subprocess
    import sys

    from pfamalign.inference import Predictor
    from pfamalign.pipelines.locks import directory_lock, holder

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved_model, run_dir / "model")
    (run_dir / "model" / "training.json").unlink()
    with directory_lock(run_dir, "training"):
        Predictor(run_dir / "model")
        assert "Warning:" not in capsys.readouterr().err
    assert holder(run_dir) is None  # released
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pfamalign.pipelines.locks import directory_lock\n"
         f"with directory_lock({str(run_dir)!r}, 'training'):\n print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        Predictor(run_dir / "model")
        err = capsys.readouterr().err
        assert "is not finished yet: its run is in progress (pid " in err and f"pid {other.pid} " in err
    finally:
        other.communicate("")
    assert other.returncode == 0 and holder(run_dir) is None


def test_a_split_without_pairs_is_refused_with_the_splits_that_have_some(tmp_path):
    from pfamalign.pipelines.prepare import run_prepare
    from pfamalign.pipelines.reader import PairDataset

    out = tmp_path / "ds"
    run_prepare(_prepare_cfg(out), quiet=True)  # one family: one split holds every pair
    ds = PairDataset(out)
    empty = next(s for s in ("val", "test", "train") if ds.num_pairs(s) == 0)
    counts = ", ".join(f"{s} {ds.num_pairs(s)}" for s in ds.splits)
    assert_clear_error(run(["eval", "--data", out, "--split", empty, "--no-model"]),
                       f"has no pairs in split '{empty}' (pairs per split: {counts})", "--split", "--splits")
    for command in ("certify", "barycenter"):  # the same words (they blamed pair index 0)
        assert_clear_error(run([command, "--data", out, "--split", empty]),
                           f"has no pairs in split '{empty}' (pairs per split: {counts})", "--split")


def test_worker_pools_are_one_per_name_and_sized_by_the_usable_cpus(monkeypatch):
    """``resources.thread_pool``: one pool per (name, size) for the process, threads named after
    it, sized by the CPUs the process may use (its affinity mask), not the machine's count."""
    import threading

    from pfamalign import resources

    monkeypatch.setattr(resources.os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    assert resources.usable_cpus() == 2
    pool, single = resources.thread_pool("probe"), resources.thread_pool("probe", 1)
    try:
        assert pool is resources.thread_pool("probe") and pool._max_workers == 2
        assert single is not pool and single._max_workers == 1
        assert pool.submit(lambda: threading.current_thread().name).result().startswith("pfamalign-probe")
    finally:
        pool.shutdown(), single.shutdown()


def test_one_sequence_or_a_pairs_file_where_fasta_is_expected_says_what_to_give(tmp_path):
    result = run(["align", "MKVLAAG"])
    assert result.exit_code == 2 and "MKVLAAG is not a file: give two sequences" in result.output, result.output
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"{PDZ_A}\t{PDZ_B}\n")
    assert_clear_error(run(["align", pairs]), "not FASTA", "a tab-separated pairs file? give it to --pairs")


# ---- found missing by a mutation sweep ----------------------------------------------------------

def test_pairs_at_once_charges_the_address_space_of_every_pair(monkeypatch):
    from pfamalign import resources
    from pfamalign.inference import BATCH_SIZES

    # at 2048: 0.75 GiB of cells a pair, mapped x1.1, plus 384 MiB: 2 pairs (2.03 GiB) fit in a
    # ulimit -v leaving 3 GiB, 4 (3.68 GiB) do not
    monkeypatch.setattr(resources, "address_space_left", lambda: 3 << 30)
    assert resources.pairs_at_once(2048, 0, 1, BATCH_SIZES) == 2


def test_the_budget_an_error_suggests_holds_the_pair(monkeypatch):
    from pfamalign import resources

    monkeypatch.setattr(resources, "address_space_left", lambda: None)
    for length in (700, 3000, 5000):
        with pytest.raises(ValueError, match="--max-memory") as err:
            resources.check_align_memory(length, length, 1 << 20)
        suggested = re.search(r"e\.g\. --max-memory (\S+)\)?;", str(err.value)).group(1)
        assert resources.parse_size(suggested) >= resources.estimate_align_bytes(length, length), str(err.value)


def test_a_cgroup_limit_of_zero_is_no_limit(tmp_path, monkeypatch):
    from pfamalign import resources

    monkeypatch.setattr(resources, "CGROUP_LIMIT_FILES", ())
    physical = resources.machine_memory()  # no container limit read
    v2 = tmp_path / "memory.max"
    monkeypatch.setattr(resources, "CGROUP_LIMIT_FILES", (str(v2),))
    v2.write_text("0\n")  # not a limit of zero bytes: no limit
    assert resources.machine_memory() == physical > 0
