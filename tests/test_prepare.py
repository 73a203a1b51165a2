"""`pfamalign prepare shards` end to end: dataset layout, manifest, resume, engines, bad input."""

import dataclasses
import gzip
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from pfamalign.cli import main as cli
from pfamalign.outputs import TEMPORARY_GLOB
from pfamalign.pipelines import records as rec
from pfamalign.pipelines import reader
from pfamalign.pipelines.config import PrepareConfig
from pfamalign.pipelines.locks import LOCK_NAME
from pfamalign.pipelines.pairs import SamplingConfig
from pfamalign.pipelines.prepare import PrepareError, run_prepare

DATA = pathlib.Path(__file__).parent / "data"
SEED = DATA / "pfam_seed"

# Small settings so every stage has several units: 11 chunks, several parts and shards.
ARGS = ["--pairs-per-family", "12", "--records-per-shard", "40", "--seqs-per-part", "64"]


def _cfg(out, inputs=(SEED,), **kw):
    sampling = kw.pop("sampling", SamplingConfig(pairs_per_family=12))
    kw.setdefault("records_per_shard", 40)
    kw.setdefault("seqs_per_part", 64)
    return PrepareConfig(inputs=tuple(str(i) for i in inputs), out=str(out), sampling=sampling,
                         **kw)


def _tree(root):
    """{relative path: bytes} of every file under root."""
    root = pathlib.Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _flat(text):
    return " ".join(text.split())


def _cli(args, **kw):
    return CliRunner().invoke(cli, args, env={"CI": "1", "COLUMNS": "200"},
                              catch_exceptions=False, **kw)


def _tiny_esm(directory):
    spec = importlib.util.spec_from_file_location("tiny_esm", DATA / "tiny_esm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_tiny_esm(directory)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted builtin run over the fixtures (kept work dir for inspection)."""
    out = tmp_path_factory.mktemp("ref") / "ds"
    result = run_prepare(_cfg(out, keep_work=True), quiet=True)
    return result


# ------------------------------------------------------------------------------------------
# Layout and contents
# ------------------------------------------------------------------------------------------

def test_dataset_layout_manifest_and_records(reference):
    out, m = reference.out, reference.manifest
    assert m["embedder"] == {"id": "builtin/onehot", "dim": 25, "dtype": "float16",
                             "fingerprint": "builtin/onehot"}
    assert set(m["splits"]) == {"train", "val", "test"}
    # shard checksums and record counts
    for row in m["shards"]:
        path = out / row["path"]
        assert rec.file_sha256(path) == row["sha256"] and path.stat().st_size == row["bytes"]
        assert rec.count_array_record(path) == row["records"]
    import pandas as pd

    shards = pd.read_csv(out / "shards.tsv", sep="\t")
    assert list(shards["sha256"]) == [r["sha256"] for r in m["shards"]]
    families = pd.read_csv(out / "families.tsv", sep="\t", keep_default_na=False)
    assert len(families) == 11
    xyppx = families[families["key"] == "PF02162.8"].iloc[0]
    assert xyppx["skip"] == "fewer than two sequences within the length limits"
    # every pair: counts per split, embeddings by index match the hash, stored once
    emb = reader.EmbeddingSource(out)
    index = pd.read_csv(out / "embeddings" / "index.tsv", sep="\t")
    assert index["hash"].is_unique and len(index) == m["embeddings"]["count"] == len(emb)
    used = set()
    total = 0
    for split in ("train", "val", "test"):
        pairs = list(reader.iter_pairs(out, split))
        assert len(pairs) == m["splits"][split]["pairs"]
        lengths = np.load(out / split / "lengths.npy")
        assert lengths.tolist() == [[p["q_len"], p["k_len"]] for p in pairs]
        for p in pairs:
            assert p["split"] == split
            for side in ("q", "k"):
                r = emb.record(p[f"{side}_emb"])
                assert r["hash"] == p[f"{side}_hash"] == rec.seq_hash(p[f"{side}_seq"])
                assert r["emb"].dtype == np.float16 and r["emb"].shape == (p[f"{side}_len"], 25)
                used.add(p[f"{side}_hash"])
        total += len(pairs)
    assert used == set(index["hash"])
    assert total == m["summary"]["pairs"]["total"] > 0
    # one family is wholly in one split
    fam_split = {}
    for split in ("train", "val", "test"):
        for p in reader.iter_pairs(out, split):
            assert fam_split.setdefault(p["family"], split) == split


def test_a_refusal_for_changed_inputs_names_the_files():
    """The inputs are recorded as [name, digest] lists: the refusal names the file whose
    contents changed, and the files added or dropped (it said "inputs: (a long value) ->
    (a long value)")."""
    from pfamalign.pipelines.prepare import _what_differs

    old = {"inputs": [["PF00041.sto", "a" * 64], ["PF00076.sto", "b" * 64]], "seed": 0}
    new = {"inputs": [["PF00041.sto", "c" * 64], ["PF00595.sto", "d" * 64]], "seed": 0}
    assert _what_differs(old, new, "h0", "h1") == (
        "input PF00041.sto: its contents changed; input PF00595.sto: new; input PF00076.sto: no longer given")


def test_cli_prints_summary_and_rerun_is_a_no_op(tmp_path):
    out = tmp_path / "ds"
    res = _cli(["prepare", "shards", "--pfam", str(SEED), "--out", str(out), *ARGS])
    assert res.exit_code == 0, res.output
    for text in ("families read", "sequences used", "pairs", "splits", "skipped",
                 "shorter than min_len=10", "fewer than two sequences within the length limits"):
        assert text in res.output
    def files():  # the dataset's files (the lock file records each run that held it)
        return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*")
                if p.is_file() and p.name != LOCK_NAME}

    before = files()
    assert not (out / "work").exists()
    res = _cli(["prepare", "shards", "--pfam", str(SEED), "--out", str(out), *ARGS])
    assert res.exit_code == 0 and "already complete" in _flat(res.output)
    assert files() == before
    # other options: refused, then replaced with --overwrite
    res = CliRunner().invoke(cli, ["prepare", "shards", "--pfam", str(SEED), "--out", str(out),
                                   *ARGS, "--seed", "1"], env={"CI": "1"})
    assert res.exit_code != 0 and "different configuration (seed: 0 -> 1)" in _flat(res.output)
    old_hash = json.loads((out / "manifest.json").read_text())["config_hash"]
    res = _cli(["prepare", "shards", "--pfam", str(SEED), "--out", str(out), "--seed", "1",
                "--overwrite"])
    assert res.exit_code == 0 and json.loads((out / "manifest.json").read_text())[
        "config"]["seed"] == 1
    assert f"replaced the dataset of config {old_hash} (--overwrite)" in _flat(res.output)


def test_a_full_disk_ends_prepare_in_one_line_naming_the_dataset(small_disk):
    """ArrayRecord's write failure was a RuntimeError and a buffered write's a nameless
    OSError: a traceback, or "cannot write the output". Now one line names what could not be
    written and says the work is kept for the rerun."""
    out = small_disk / "ds"
    res = CliRunner().invoke(cli, ["prepare", "shards", "--pfam", str(SEED), "--out", str(out), *ARGS],
                             env={"CI": "1"})
    assert res.exit_code == 1, res.output
    message = _flat(res.output)
    assert f"Error: cannot write {out}" in message and "No space left on device; free some space" in message
    assert "re-run the same command to resume" in message and "Traceback" not in res.output


def test_an_empty_split_is_reported_with_what_to_change(tmp_path):
    """One family over train and val: the split it was not assigned to is empty, and prepare
    says so (even with -q) rather than training finding no validation pairs later."""
    from pfamalign.pipelines.splits import assign_split

    family = SEED / "PF05371.sto"
    got = assign_split("PF05371", seed=0, fractions=(0.5, 0.5, 0.0))
    empty = {"train": "val", "val": "train"}[got]
    res = _cli(["prepare", "shards", "--pfam", str(family), "--out", str(tmp_path / "ds"),
                "--pairs-per-family", "4", "--splits", "0.5,0.5,0", "--seed", "0", "-q"])
    assert res.exit_code == 0, res.output
    text = _flat(res.output)
    assert f"Warning: the {empty} split is empty" in text
    assert "--splits 0.5,0.5,0" in text and "--seed 0" in text
    assert f"the {got} split is empty" not in text
    assert "the test split" not in text  # asked to be empty (fraction 0): no warning
    summary = json.loads((tmp_path / "ds" / "manifest.json").read_text())["summary"]
    assert len(summary["warnings"]) == 1 and summary["warnings"][0].startswith(f"the {empty} split")


def test_refuses_a_foreign_non_empty_directory(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(PrepareError, match="not empty"):
        run_prepare(_cfg(tmp_path), quiet=True)
    assert (tmp_path / "precious.txt").exists()


@pytest.mark.parametrize("layout", ["work_notes", "work_input", "work_foreign_config", "manifest_list",
                                    "manifest_foreign", "replacement_notes"])
def test_a_users_work_or_manifest_is_not_taken_for_prepares(tmp_path, layout):
    """An --out holding a user's ``work/``, ``replacement/`` or ``manifest.json`` (names prepare
    uses too) is refused as a foreign directory, with --overwrite too, and loses nothing: it used
    to delete a ``work/`` holding no ``config.json`` or one of another shape (the input, when
    --pfam named it), and crash on a manifest that is not a JSON object."""
    out = tmp_path / "out"
    files = {"work_notes": {"work/notes.txt": "mine"},
             "work_input": {"work/PF00076.sto": (SEED / "PF00076.sto").read_text()},  # --pfam out/work
             "work_foreign_config": {"work/config.json": '{"lr": 0.1}', "work/data.txt": "mine"},
             "manifest_list": {"manifest.json": "[1, 2]"},
             "manifest_foreign": {"manifest.json": '{"name": "my app"}', "families.tsv": "mine"},
             "replacement_notes": {"replacement/notes.txt": "mine"}}[layout]
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    inputs = (out / "work",) if layout == "work_input" else (SEED,)
    for overwrite in (False, True):
        with pytest.raises(PrepareError, match="not a pfamalign dataset"):
            run_prepare(_cfg(out, inputs, overwrite=overwrite), quiet=True)
        assert {name: (out / name).read_text() for name in files} == files


def test_worker_pool_gives_identical_bytes(reference, tmp_path):
    out = tmp_path / "ds"
    run_prepare(_cfg(out, workers=2), quiet=True)
    ref = {k: v for k, v in _tree(reference.out).items() if not k.startswith("work/")}
    assert _tree(out) == ref


# ------------------------------------------------------------------------------------------
# Resume after kill -9
# ------------------------------------------------------------------------------------------

FAULTKILL = pathlib.Path(__file__).parent / "faultkill.py"


def _entry(kill_at=None):
    """The command prefix: the CLI, or the CLI killed before commit ``kill_at`` (test seam)."""
    if kill_at is None:
        return [sys.executable, "-m", "pfamalign.cli"]
    return [sys.executable, str(FAULTKILL), str(kill_at)]


def _run_cli_subprocess(out, extra=(), env_extra=None, kill_at=None):
    env = dict(os.environ, CI="1", **(env_extra or {}))
    cmd = [*_entry(kill_at), "prepare", "shards", "--pfam", str(SEED),
           "--out", str(out), *ARGS, "-q", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _commit_points(reference):
    """Numbers of the atomic commits that land in each stage of the reference run."""
    work = reference.out / "work"
    n_chunks = len(list((work / "chunks").glob("*.rec")))
    n_parts = json.loads((work / "plan.json").read_text())["n_parts"]
    first_emb = 1 + n_chunks + 1 + n_parts + 1 + 1
    return {"ingest": 4, "embed": first_emb + 1, "finalize": first_emb + n_parts + 2}


@pytest.mark.parametrize("stage", ["ingest", "embed", "finalize"])
def test_resume_after_kill_is_byte_identical(reference, tmp_path, stage):
    kill_at = _commit_points(reference)[stage]
    out = tmp_path / "ds"
    first = _run_cli_subprocess(out, kill_at=kill_at)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert not (out / "manifest.json").exists()
    work = out / "work"
    if stage == "ingest":
        assert not (work / "ingest.json").exists()
    elif stage == "embed":
        assert (work / "plan.json").exists() and any((work / "emb").glob("part-*"))
    else:
        assert (out / "embeddings" / "index.tsv").exists()
    assert list(out.rglob(TEMPORARY_GLOB)), "the kill should leave a temporary file behind"
    second = _run_cli_subprocess(out)
    assert second.returncode == 0, second.stderr
    ref = {k: v for k, v in _tree(reference.out).items() if not k.startswith("work/")}
    assert _tree(out) == ref


def _kill_when(cmd, env, ready, timeout=600.0):
    """Starts cmd, sends SIGKILL as soon as ready() holds; returns the exit code."""
    proc = subprocess.Popen(cmd, env=env)
    start = time.time()
    while proc.poll() is None and time.time() - start < timeout:
        if ready():
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    return proc.wait()


@pytest.mark.slow
def test_external_kill_during_esm_embedding_resumes_identically(tmp_path):
    """A real `kill -9` from outside, mid-plan and mid-embedding (tiny ESM-2)."""
    pytest.importorskip("esm")
    weights = _tiny_esm(tmp_path / "w")
    common = ["--embedder", weights.stem, "--weights", str(weights), "--threads", "1",
              "--pairs-per-family", "40", "--max-len", "2000", "--long-seqs", "window",
              "--seqs-per-part", "32"]
    env = dict(os.environ, CI="1")
    base = [sys.executable, "-m", "pfamalign.cli", "prepare", "shards", "--pfam", str(SEED), "-q"]
    ref, out = tmp_path / "ref", tmp_path / "ds"
    subprocess.run(base + ["--out", str(ref), *common], env=env, check=True, timeout=900)
    cmd = base + ["--out", str(out), *common]
    rc = _kill_when(cmd, env, lambda: (out / "work" / "ingest.json").exists())
    assert rc == -signal.SIGKILL
    rc = _kill_when(cmd, env, lambda: len(list((out / "work" / "emb").glob("part-*"))) >= 3)
    assert rc == -signal.SIGKILL
    subprocess.run(cmd, env=env, check=True, timeout=900)
    assert _tree(out) == _tree(ref)


# ------------------------------------------------------------------------------------------
# ESM-2 (tiny, real checkpoint format)
# ------------------------------------------------------------------------------------------

def test_esm_dataset_embeds_each_unique_sequence_once(tmp_path, monkeypatch):
    """Every unique sequence is embedded once, and the weights file hashed once (prepare asks
    for the embedder's fingerprint up to three times)."""
    pytest.importorskip("esm")
    from pfamalign.pipelines import embed
    from pfamalign.pipelines.embed import get_embedder

    weights = _tiny_esm(tmp_path / "w")
    inner = get_embedder(weights.stem, weights, threads=1)
    seen, hashed, fingerprint_file = [], [], embed._fingerprint_file
    monkeypatch.setattr(embed, "_fingerprint_file", lambda path: hashed.append(path) or fingerprint_file(path))

    class Counting:
        embedder_id, dim, max_residues = inner.embedder_id, inner.dim, inner.max_residues

        def embed(self, seqs):
            seen.extend(seqs)
            return inner.embed(seqs)

        def fingerprint(self):
            return inner.fingerprint()

    out = tmp_path / "ds"
    files = [SEED / f for f in ("PF00041.sto", "PF00076.sto", "PF02184.sto", "PF02294.sto")]
    result = run_prepare(_cfg(out, inputs=files, sampling=SamplingConfig(pairs_per_family=30)),
                         quiet=True, embedder=Counting())
    m = result.manifest
    assert m["embedder"]["id"] == f"{weights.stem}/layer2" and m["embedder"]["dim"] == 32
    assert len(seen) == len(set(seen)) == m["embeddings"]["count"]
    assert hashed == [weights]
    n_pair_seqs = sum(2 * m["splits"][s]["pairs"] for s in ("train", "val", "test"))
    assert n_pair_seqs > len(seen)  # sequences are shared by several pairs
    pair = next(p for s in ("train", "val", "test") for p in
                reader.PairSource(out, s, features=True) if True)
    ref = inner.embed([pair["q_seq"]])[0].astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(pair["q_feat"], ref)
    # the same dataset through the CLI (real weights resolution), byte-identical
    out2 = tmp_path / "ds2"
    res = _cli(["prepare", "shards", *sum((["--pfam", str(f)] for f in files), []),
                "--out", str(out2), "--embedder", weights.stem, "--weights", str(weights),
                "--pairs-per-family", "30", "--records-per-shard", "40", "-q"])
    assert res.exit_code == 0, res.output
    # (seqs_per_part differs from the CLI default, so only records are compared)
    for s in ("train", "val", "test"):
        a = [dict(p, q_emb=0, k_emb=0) for p in reader.iter_pairs(out, s, features=False)]
        b = [dict(p, q_emb=0, k_emb=0) for p in reader.iter_pairs(out2, s, features=False)]
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.keys() == y.keys()
            assert all(np.array_equal(x[k], y[k]) for k in x)


def test_missing_esm_weights_fail_before_any_work(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("esm", reason="fair-esm not installed (pip install 'pfamalign[embed]')")  # else: the install message
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    monkeypatch.delenv("PFAMALIGN_ESM_WEIGHTS", raising=False)
    res = CliRunner().invoke(cli, ["prepare", "shards", "--pfam", str(SEED), "--out",
                                   str(tmp_path / "ds"), "--embedder", "esm2_t6_8M_UR50D"],
                             env={"CI": "1"})
    assert res.exit_code == 1
    assert "esm2_t6_8M_UR50D.pt" in res.output and "--weights" in res.output
    assert not (tmp_path / "ds").exists()


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------

def test_malformed_input_names_file_and_line_and_skip_bad_continues(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(SEED / "PF00076.sto", inputs / "a_good.sto")
    (inputs / "b_bad.sto").write_text("# STOCKHOLM 1.0\n#=GF AC PF77777.1\nseqA ACDEFGHIKL\n"
                                      "seqB ACDEFG#IKL\n//\n")
    (inputs / "c_empty.sto").write_text("")
    (inputs / "d_dup.sto").write_text("# STOCKHOLM 1.0\n#=GF AC PF88888.1\nseqA ACDEFGHIKL\n"
                                      "seqA ACDEFGHIKL\n//\n")
    out = tmp_path / "ds"
    res = CliRunner().invoke(cli, ["prepare", "shards", "--pfam", str(inputs), "--out", str(out)],
                             env={"CI": "1"})
    assert res.exit_code == 1
    assert f"{inputs / 'b_bad.sto'}:4: invalid character '#'" in res.output
    assert "--skip-bad" in res.output
    res = _cli(["prepare", "shards", "--pfam", str(inputs), "--out", str(out), "--skip-bad",
                "--overwrite"])
    assert res.exit_code == 0, res.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["summary"]["skipped"]["families"] == {"malformed Stockholm": 3}
    errors = "\n".join(m["summary"]["errors"])
    assert "b_bad.sto:4: invalid character" in errors
    assert "c_empty.sto:1: no Stockholm alignment found (empty file?)" in errors
    assert "d_dup.sto:4: duplicate sequence id 'seqA'" in errors
    assert m["summary"]["families"]["used"] == 1
    assert "skipped:" in res.output and "b_bad.sto:4" in res.output


def test_a_malformed_second_copy_of_a_family_is_reported_as_malformed(tmp_path):
    """--skip-bad: a later copy of an accession already read that does not parse is skipped as
    malformed Stockholm (what it is, and what the Beam engine, which parses every family, says),
    not as a duplicate key; a well-formed copy is the duplicate."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    good = "# STOCKHOLM 1.0\n#=GF AC PF66666.1\ns1/1-10  ACDEFGHIKL\ns2/1-10  ACDEFGHIKM\n//\n"
    (inputs / "a.sto").write_text(good)
    (inputs / "b.sto").write_text(good.replace("ACDEFGHIKM", "ACDEFG*IKM"))
    (inputs / "c.sto").write_text(good)
    s = run_prepare(_cfg(tmp_path / "ds", inputs=[inputs], skip_bad=True), quiet=True).summary
    assert s["skipped"]["families"] == {"malformed Stockholm": 1, "duplicate family key": 1}
    errors = "\n".join(s["errors"])
    assert "b.sto:4: invalid character '*'" in errors and "PF66666.1 already read from" in errors


def test_duplicate_family_and_nonstandard_residues(tmp_path):
    odd = tmp_path / "odd.sto"
    odd.write_text("# STOCKHOLM 1.0\n#=GF AC PF66666.1\n"
                   "s1/1-12  ACDXBZUOJKLM\ns2/1-12  ACDEFGHIKLMN\ns3/1-12  ACDXBZUOJKLm\n//\n")
    out = tmp_path / "ds"
    result = run_prepare(_cfg(out, inputs=[odd, odd]), quiet=True)
    s = result.summary
    assert s["skipped"]["families"] == {"duplicate family key": 1}
    assert s["pairs"]["total"] == 3
    recs = [p for split in ("train", "val", "test") for p in reader.iter_pairs(out, split,
                                                                                features=True)]
    seqs = {p["q_seq"] for p in recs} | {p["k_seq"] for p in recs}
    assert seqs == {"ACDXBZUOJKLM", "ACDEFGHIKLMN"}  # s3 folds to s1's residues
    # one embedding for s1 and s3 (same residue string)
    assert result.manifest["embeddings"]["count"] == 2
    p = next(p for p in recs if p["q_seq"] == "ACDXBZUOJKLM")
    from pfamalign.pipelines.embed import AA_ALPHABET

    letters = [AA_ALPHABET[i] for i in p["q_feat"].argmax(axis=1)]
    assert "".join(letters) == "ACDXBZUOXKLM"


# ------------------------------------------------------------------------------------------
# Real data, multi-family stream, Beam
# ------------------------------------------------------------------------------------------

def test_fold_dataset_takes_its_splits_from_the_fold(tmp_path):
    from pfamalign.pipelines.splits import assign_fold_split

    out = tmp_path / "fold"
    res = _cli(["prepare", "shards", "--pfam", str(SEED), "--out", str(out), "--fold", "1/3",
                "--pairs-per-family", "4", "-q"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["fold"] == [1, 3] and "split_fractions" not in manifest["config"]
    import pandas as pd

    fams = pd.read_csv(out / "families.tsv", sep="\t", keep_default_na=False)
    assert len(fams) > 5
    for key, split in zip(fams["key"], fams["split"]):
        assert split == assign_fold_split(key, fold=1, n_folds=3)
    assert "test" in set(fams["split"]) and "train" in set(fams["split"])
    # a fold is part of the dataset's identity; without one the config keeps its old keys
    # (so the hashes of datasets made before folds existed do not change)
    args = dict(input_digests=[], embedder_id="builtin/onehot", embedder_fingerprint="x", dim=21)
    plain = _cfg(tmp_path / "a").output_config(**args)
    assert "fold" not in plain and plain["split_fractions"] == [0.8, 0.1, 0.1]
    assert _cfg(tmp_path / "a", fold=(0, 3)).output_config(**args) != _cfg(
        tmp_path / "a", fold=(1, 3)).output_config(**args)
    for bad, message in (("1-3", "expected K/N"), ("3/3", "0 <= K < N")):
        res = CliRunner().invoke(cli, ["prepare", "shards", "--pfam", str(SEED), "--out",
                                       str(tmp_path / "bad"), "--fold", bad], env={"CI": "1"})
        assert res.exit_code != 0 and message in _flat(res.output) and "Traceback" not in res.output


def test_real_data_versions_share_a_split(shared_pfam, tmp_path):
    out = tmp_path / "ds"
    result = run_prepare(_cfg(out, inputs=[shared_pfam / "seed_stockholm",
                                           shared_pfam / "hmmalign_stockholm"],
                              sampling=SamplingConfig(pairs_per_family=8)), quiet=True)
    import pandas as pd

    fams = pd.read_csv(out / "families.tsv", sep="\t", keep_default_na=False)
    assert len(fams) == 33
    for acc in ("PF00041", "PF00076"):
        rows = fams[fams["accession_base"] == acc]
        assert len(rows) == 2 and rows["split"].nunique() == 1
    assert result.summary["families"]["used"] == 32
    for split in ("train", "val", "test"):
        for p in reader.iter_pairs(out, split):
            t = p["target"]
            assert (np.diff(t[t >= 0]) > 0).all() and p["n_aligned"] == (t >= 0).sum()


def test_pfam_seed_gz_stream(shared_pfam, tmp_path):
    files = sorted((shared_pfam / "seed_stockholm").glob("*.sto"))
    gz = tmp_path / "Pfam-A.seed.gz"
    with gzip.open(gz, "wb") as f:
        for p in files:
            f.write(p.read_bytes())
    a = run_prepare(_cfg(tmp_path / "gz", inputs=[gz], families_per_chunk=4), quiet=True)
    b = run_prepare(_cfg(tmp_path / "dir", inputs=[shared_pfam / "seed_stockholm"]), quiet=True)
    # PF05371 has no AC/ID: keyed "PF05371" by its file name, "Pfam-A#14-<digest>" in the stream
    assert a.summary["pairs"]["total"] == b.summary["pairs"]["total"]
    for split in ("train", "val", "test"):
        ra = [p for p in reader.iter_pairs(a.out, split) if not p["family"].startswith("Pfam-A#14-")]
        rb = [p for p in reader.iter_pairs(b.out, split) if p["family"] != "PF05371"]
        assert [(p["family"], p["q_id"], p["k_id"]) for p in ra] == \
            [(p["family"], p["q_id"], p["k_id"]) for p in rb]


def test_chunks_are_read_in_stream_order_past_ten_thousand_inputs():
    """The Beam engine globs its chunk files: past 9,999 inputs a sort by name would put
    chunk-10000 before chunk-1001 (and reorder the shards); the stream order sorts by number."""
    from pfamalign.pipelines.stages import chunk_name, in_stream_order

    names = [chunk_name(i, c) for i in (999, 1000, 1001, 9999, 10000, 10001) for c in (0, 1)]
    assert sorted(names) != names  # what a name sort does
    assert in_stream_order(reversed(names)) == names


def test_beam_engine_matches_local(reference, tmp_path):
    pytest.importorskip("apache_beam", reason="Apache Beam not installed (pip install "
                        "'pfamalign[beam]')")
    out = tmp_path / "ds"
    run_prepare(_cfg(out, engine="beam", beam_args=("--runner=FnApiRunner",)), quiet=True)
    ref = {k: v for k, v in _tree(reference.out).items() if not k.startswith("work/")}
    assert _tree(out) == ref


def test_beam_engine_without_beam_is_refused_before_out_is_made(tmp_path, monkeypatch):
    """--engine beam where Apache Beam is missing: one PrepareError saying how to install it,
    and no --out directory left behind (a None module makes its import fail)."""
    monkeypatch.setitem(sys.modules, "apache_beam", None)
    out = tmp_path / "ds"
    with pytest.raises(PrepareError, match=r"pip install 'pfamalign\[beam\]'"):
        run_prepare(_cfg(out, engine="beam"), quiet=True)
    assert not out.exists()


def test_reuse_embeddings_of_an_earlier_dataset(reference, tmp_path):
    from pfamalign.pipelines.embed import get_embedder

    first = tmp_path / "first"
    subset = [SEED / "PF00041.sto", SEED / "PF00076.sto"]
    run_prepare(_cfg(first, inputs=subset), quiet=True)
    inner = get_embedder("builtin/onehot")
    seen = []

    class Counting:
        embedder_id, dim, max_residues = inner.embedder_id, inner.dim, None

        def embed(self, seqs):
            seen.extend(seqs)
            return inner.embed(seqs)

        def fingerprint(self):
            return inner.fingerprint()

    out = tmp_path / "ds"
    result = run_prepare(_cfg(out, reuse_embeddings=(str(first),)), quiet=True,
                         embedder=Counting())
    emb = result.summary["embeddings"]
    assert emb["from_cache"] > 0 and emb["computed_this_run"] == len(seen)
    assert emb["from_cache"] + len(seen) == emb["count"]
    ref = {k: v for k, v in _tree(reference.out).items() if not k.startswith("work/")}
    assert _tree(out) == ref
    with pytest.raises(PrepareError, match=r"reuse-embeddings .*: its embeddings are builtin/onehot \(weights "
                       r"fingerprint .*, this run needs builtin/onehot\+blosum62 .* differ in: id, fingerprint"):
        run_prepare(_cfg(tmp_path / "other", embedder="builtin/onehot+blosum62",
                         reuse_embeddings=(str(first),)), quiet=True)


def test_esm_resume_after_kill_is_byte_identical(tmp_path):
    pytest.importorskip("esm")
    weights = _tiny_esm(tmp_path / "w")
    files = [SEED / f for f in ("PF00076.sto", "PF02184.sto", "PF02790.sto")]
    opts = ["--embedder", weights.stem, "--weights", str(weights), "--threads", "1",
            "--pairs-per-family", "15", "--seqs-per-part", "16"]
    ref = tmp_path / "ref"
    res = _cli(["prepare", "shards", *sum((["--pfam", str(f)] for f in files), []),
                "--out", str(ref), *opts, "-q", "--keep-work"])
    assert res.exit_code == 0, res.output
    n_parts = json.loads((ref / "work" / "plan.json").read_text())["n_parts"]
    assert n_parts >= 2
    shutil.rmtree(ref / "work")
    # commits: config, 3 chunks, ingest.json, n_parts plans, plan.json, embed parts...
    kill_at = 1 + 3 + 1 + n_parts + 1 + 2  # the second embedding part
    out = tmp_path / "ds"
    env = dict(os.environ, CI="1")
    args = ["prepare", "shards", *sum((["--pfam", str(f)] for f in files), []), "--out",
            str(out), *opts, "-q"]
    first = subprocess.run([*_entry(kill_at), *args], env=env, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert (out / "work" / "plan.json").exists() and not (out / "manifest.json").exists()
    assert len(list((out / "work" / "emb").glob("part-*"))) == 1
    subprocess.run([*_entry(), *args], env=env, check=True, timeout=300)
    assert _tree(out) == _tree(ref)


def test_esm_out_of_memory_resumes_with_a_smaller_batch_size(tmp_path):
    """ESM-2 out of memory mid-embedding: the error names the batch size and suggests half; the
    re-run with a smaller --toks-per-batch resumes (finished parts kept, the recorded batch size
    in the config hash) instead of starting over, and a later re-run finds it complete."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("esm")
    from pfamalign.pipelines.embed import EmbedderError, get_embedder

    weights = _tiny_esm(tmp_path / "w")
    files = [SEED / f for f in ("PF00076.sto", "PF02184.sto", "PF02790.sto")]
    calls = []

    def esm(toks_per_batch, fail_at=None):
        e = get_embedder(weights.stem, weights, threads=1, toks_per_batch=toks_per_batch)
        model = e.model

        def forward(toks, **kw):  # the real model; the allocator's failure injected at one call
            calls.append(toks.shape[0])
            if len(calls) == fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return model(toks, **kw)

        e.model = forward
        return e

    def cfg(out, toks_per_batch, **kw):
        return _cfg(out, inputs=files, sampling=SamplingConfig(pairs_per_family=15),
                    seqs_per_part=16, toks_per_batch=toks_per_batch, **kw)

    out = tmp_path / "ds"
    with pytest.raises(EmbedderError, match=r"out of memory .*--toks-per-batch 4096\): re-run "
                                            r"with a smaller --toks-per-batch, e.g. 2048"):
        run_prepare(cfg(out, 4096), quiet=True, embedder=esm(4096, fail_at=3))
    kept = sorted(p.name for p in (out / "work" / "emb").glob("part-*"))
    assert len(kept) == 2 and not (out / "manifest.json").exists()
    calls.clear()
    result = run_prepare(cfg(out, 300), quiet=True, embedder=esm(300))
    assert calls and max(calls) < 16  # the smaller batches did run
    assert result.manifest["config"]["embedder"]["toks_per_batch"] == 4096  # as started
    reference = run_prepare(cfg(tmp_path / "ref", 4096), quiet=True, embedder=esm(4096))
    assert result.manifest["config_hash"] == reference.manifest["config_hash"]
    assert 0 < result.summary["embeddings"]["computed_this_run"] < reference.summary["embeddings"]["count"]
    for s in ("train", "val", "test"):  # the same records; embeddings equal up to rounding
        a = list(reader.iter_pairs(out, s, features=True))
        b = list(reader.iter_pairs(tmp_path / "ref", s, features=True))
        assert [p["q_seq"] for p in a] == [p["q_seq"] for p in b]
        for x, y in zip(a, b):
            np.testing.assert_allclose(x["q_feat"], y["q_feat"], rtol=2e-3, atol=2e-3)
    again = run_prepare(cfg(out, 64), quiet=True, embedder=esm(64))
    assert again.already_complete
    # the same for an --overwrite's rebuild beside the finished dataset
    calls.clear()
    with pytest.raises(EmbedderError, match="out of memory"):
        run_prepare(cfg(out, 4096, seed=5, overwrite=True), quiet=True, embedder=esm(4096, fail_at=3))
    rebuilt = run_prepare(cfg(out, 300, seed=5, overwrite=True), quiet=True, embedder=esm(300))
    assert 0 < rebuilt.summary["embeddings"]["computed_this_run"] < rebuilt.summary["embeddings"]["count"]
    assert rebuilt.manifest["config"]["embedder"]["toks_per_batch"] == 4096 and rebuilt.manifest["config"]["seed"] == 5
    # another option changed as well: still refused, naming both
    with pytest.raises(PrepareError, match="toks_per_batch.*seed|seed.*toks_per_batch"):
        run_prepare(cfg(out, 64, seed=7), quiet=True, embedder=esm(64))
