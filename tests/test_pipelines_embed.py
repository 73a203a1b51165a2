"""Embedders: the builtin featurizer and ESM-2 through the real fair-esm loader (tiny model)."""

import importlib.util
import pathlib

import numpy as np
import pytest

from pfamalign.pipelines import embed

DATA = pathlib.Path(__file__).parent / "data"


def _tiny_esm_module():
    spec = importlib.util.spec_from_file_location("tiny_esm", DATA / "tiny_esm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_esm(tmp_path_factory):
    pytest.importorskip("esm", reason="fair-esm not installed (pip install 'pfamalign[embed]')")
    return _tiny_esm_module().build_tiny_esm(tmp_path_factory.mktemp("esm"))


# ------------------------------------------------------------------------------------------
# builtin
# ------------------------------------------------------------------------------------------

def test_builtin_onehot():
    e = embed.get_embedder("builtin")
    assert e.embedder_id == "builtin/onehot" and e.dim == 25 and e.max_residues is None
    (f,) = e.embed(["ACdY"])
    assert f.shape == (4, 25) and f.dtype == np.float32
    assert f.sum(axis=1).tolist() == [1, 1, 1, 1]
    assert [embed.AA_ALPHABET[i] for i in f.argmax(axis=1)] == list("ACDY")
    x = embed.AA_ALPHABET.index("X")
    odd = e.embed(["XBZUOJ"])[0].argmax(axis=1)
    assert [embed.AA_ALPHABET[i] for i in odd] == list("XBZUOX")  # J reads as X
    assert odd[0] == x
    with pytest.raises(ValueError, match="invalid residue '-' at position 3"):
        e.embed(["AC-D"])


def test_builtin_blosum62():
    from Bio.Align import substitution_matrices

    e = embed.get_embedder("builtin/onehot+blosum62")
    assert e.dim == 50
    (f,) = e.embed(["WU"])
    b62 = substitution_matrices.load("BLOSUM62")
    assert f[0, 25 + embed.AA_ALPHABET.index("W")] == b62["W", "W"] / 4
    assert f[1, 25:].tolist() == e.embed(["C"])[0][0, 25:].tolist()  # U scored as C
    np.testing.assert_array_equal(e.featurize("WU"), f)


def test_unknown_embedder_ids():
    for bad in ("builtin/nope", "esm1b_t33", "onehot"):
        with pytest.raises(embed.EmbedderError):
            embed.get_embedder(bad)
    assert embed.parse_embedder_id("esm2_t6_8M_UR50D/layer-1") == ("esm2", "esm2_t6_8M_UR50D", -1)


# ------------------------------------------------------------------------------------------
# ESM-2 weights resolution and errors
# ------------------------------------------------------------------------------------------

def test_missing_weights_say_which_file_and_where(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("esm", reason="fair-esm not installed (pip install 'pfamalign[embed]')")  # else: the install message
    monkeypatch.delenv(embed.WEIGHTS_ENV, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torchhome"))
    with pytest.raises(embed.EmbedderError) as info:
        embed.get_embedder("esm2_t6_8M_UR50D")
    msg = str(info.value)
    assert "esm2_t6_8M_UR50D.pt" in msg
    assert str(tmp_path / "torchhome" / "hub" / "checkpoints" / "esm2_t6_8M_UR50D.pt") in msg
    assert "--weights" in msg and embed.WEIGHTS_ENV in msg
    assert "https://dl.fbaipublicfiles.com/fair-esm/models/esm2_t6_8M_UR50D.pt" in msg
    with pytest.raises(embed.EmbedderError, match="does not exist"):
        embed.get_embedder("esm2_t6_8M_UR50D", weights=tmp_path / "nope.pt")


def test_weights_found_by_file_dir_env_and_hub(tiny_esm, tmp_path, monkeypatch):
    name = tiny_esm.stem
    monkeypatch.delenv(embed.WEIGHTS_ENV, raising=False)
    assert embed.resolve_esm_weights(name, tiny_esm) == tiny_esm
    assert embed.resolve_esm_weights(name, tiny_esm.parent) == tiny_esm
    monkeypatch.setenv(embed.WEIGHTS_ENV, str(tiny_esm.parent))
    assert embed.resolve_esm_weights(name) == tiny_esm
    monkeypatch.delenv(embed.WEIGHTS_ENV)
    hub = tmp_path / "th" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    (hub / tiny_esm.name).write_bytes(tiny_esm.read_bytes())
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    assert embed.resolve_esm_weights(name) == hub / tiny_esm.name
    with pytest.raises(embed.EmbedderError, match="must be named 'esm2_t6_8M_UR50D.pt'"):
        embed.resolve_esm_weights("esm2_t6_8M_UR50D", tiny_esm)
    empty = tmp_path / "empty"
    empty.mkdir()  # an explicit directory without the file is an error, not a hint: the hub copy is not taken
    with pytest.raises(embed.EmbedderError, match=f"--weights names the directory .*empty, which has no {name}.pt"):
        embed.resolve_esm_weights(name, empty)
    monkeypatch.setenv(embed.WEIGHTS_ENV, str(empty))
    with pytest.raises(embed.EmbedderError, match=f"PFAMALIGN_ESM_WEIGHTS names the directory .*which has no {name}.pt"):
        embed.resolve_esm_weights(name)


def test_unreadable_weights(tiny_esm, tmp_path):
    bad = tmp_path / "garbage"
    bad.mkdir()
    (bad / tiny_esm.name).write_bytes(b"not a checkpoint at all")
    with pytest.raises(embed.EmbedderError, match="not a PyTorch checkpoint"):
        embed.get_embedder(tiny_esm.stem, weights=bad)
    cut = tmp_path / "cut"
    cut.mkdir()
    data = tiny_esm.read_bytes()
    (cut / tiny_esm.name).write_bytes(data[: len(data) // 2])
    with pytest.raises(embed.EmbedderError, match="truncated or not a fair-esm"):
        embed.get_embedder(tiny_esm.stem, weights=cut)


# ------------------------------------------------------------------------------------------
# ESM-2 extraction
# ------------------------------------------------------------------------------------------

def test_esm_layers_and_extraction_match_fair_esm(tiny_esm):
    import esm
    import torch

    e = embed.get_embedder(tiny_esm.stem, tiny_esm, threads=1)
    assert e.embedder_id == f"{tiny_esm.stem}/layer2" and e.dim == 32
    assert embed.get_embedder(f"{tiny_esm.stem}/layer-1", tiny_esm).embedder_id == e.embedder_id
    l1 = embed.get_embedder(f"{tiny_esm.stem}/layer1", tiny_esm)
    with pytest.raises(embed.EmbedderError, match="out of range"):
        embed.get_embedder(f"{tiny_esm.stem}/layer3", tiny_esm)

    seqs = ["MKVLAAGICK", "ACDEFGHIKLMNPQRSTVWYXBZUO", "MST"]
    out = e.embed(seqs)
    assert [o.shape for o in out] == [(10, 32), (25, 32), (3, 32)]
    # the reference: fair-esm's own loader, batch converter and forward, one sequence at a time
    import argparse

    with torch.serialization.safe_globals([argparse.Namespace]):
        model, alphabet = esm.pretrained.load_model_and_alphabet_local(str(tiny_esm))
    model.eval()
    conv = alphabet.get_batch_converter()
    _, _, toks = conv([(str(i), s) for i, s in enumerate(seqs)])
    assert torch.equal(toks, e.tokens(seqs))
    for s, o in zip(seqs, out):
        _, _, t = conv([("x", s)])
        with torch.no_grad():
            ref = model(t, repr_layers=[2])["representations"][2][0, 1:len(s) + 1].numpy()
        np.testing.assert_allclose(o, ref, atol=1e-5)
    assert not np.allclose(l1.embed(seqs[:1])[0], out[0])
    # J is not an ESM token: read as X
    np.testing.assert_allclose(e.embed(["MJK"])[0], e.embed(["MXK"])[0], atol=1e-6)


def test_the_weights_fingerprint_reads_the_whole_file(tmp_path):
    """Two files of one size differing only in the middle: the fingerprint read the first and
    last MiB, so different weights made datasets of one configuration (and --reuse-embeddings
    took the other's embeddings)."""
    a, b = tmp_path / "a" / "w.pt", tmp_path / "b" / "w.pt"
    a.parent.mkdir(), b.parent.mkdir()
    data = bytearray(np.random.default_rng(0).bytes(5 << 20))
    a.write_bytes(bytes(data))
    data[len(data) // 2] ^= 1
    b.write_bytes(bytes(data))
    assert embed._fingerprint_file(a) != embed._fingerprint_file(b)
    assert embed._fingerprint_file(a).startswith(f"w.pt:{5 << 20}:")


def test_esm_device_threads_and_layer_errors_name_what_was_given(tiny_esm, monkeypatch):
    import torch

    with pytest.raises(embed.EmbedderError, match="unknown torch device 'foo'"):
        embed.get_embedder(tiny_esm.stem, tiny_esm, device="foo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(embed.EmbedderError, match="device 'cuda': this torch has no CUDA GPU available"):
        embed.get_embedder(tiny_esm.stem, tiny_esm, device="cuda")
    with pytest.raises(embed.EmbedderError, match="threads must be at least 1, got -1"):
        embed.get_embedder(tiny_esm.stem, tiny_esm, threads=-1)
    with pytest.raises(embed.EmbedderError, match=r"layer -4 out of range .* use 0..2, or -1 for the last"):
        embed.get_embedder(f"{tiny_esm.stem}/layer-4", tiny_esm)


def test_esm_without_regression_file(tiny_esm, tmp_path):
    d = tmp_path / "noreg"
    d.mkdir()
    (d / tiny_esm.name).write_bytes(tiny_esm.read_bytes())
    e = embed.get_embedder(tiny_esm.stem, d)
    ref = embed.get_embedder(tiny_esm.stem, tiny_esm)
    np.testing.assert_array_equal(e.embed(["MKV"])[0], ref.embed(["MKV"])[0])


def test_esm_long_sequences_refuse_or_window(tiny_esm):
    rng = np.random.default_rng(0)
    long = "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), size=1500))
    e = embed.get_embedder(tiny_esm.stem, tiny_esm)
    assert e.max_residues == 1022
    with pytest.raises(embed.EmbedderError, match="1500 residues; ESM-2 takes at most 1022"):
        e.embed([long])
    w = embed.get_embedder(tiny_esm.stem, tiny_esm, long_policy="window")
    assert w.max_residues is None
    (f,) = w.embed([long])
    assert f.shape == (1500, 32)
    starts = embed.window_starts(1500)
    assert starts == [0, 478]
    first = w.embed([long[:1022]])[0]
    second = w.embed([long[478:]])[0]
    # residues up to the midpoint between window centres come from the first window
    np.testing.assert_allclose(f[:700], first[:700], atol=1e-5)
    np.testing.assert_allclose(f[800:], second[800 - 478:], atol=1e-5)


def test_window_geometry():
    assert embed.window_starts(1022) == [0]
    assert embed.window_starts(3000) == [0, 511, 1022, 1533, 1978]
    parts = [np.full((4, 1), w, np.float32) for w in range(3)]
    out = embed.stitch_windows(8, [0, 2, 4], parts)
    assert out[:, 0].tolist() == [0, 0, 1, 1, 1, 2, 2, 2] or out[:, 0].tolist() == [
        0, 0, 0, 1, 1, 2, 2, 2]


def test_out_of_memory_is_told_from_other_torch_errors():
    torch = pytest.importorskip("torch")
    assert embed._out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert embed._out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. "
                                             "DefaultCPUAllocator: not enough memory: you tried "
                                             "to allocate 68719476736 bytes."))
    assert not embed._out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_out_of_memory_advice_fits_the_batch(tiny_esm):
    """Halving --toks-per-batch helps a batch of several sequences; a sequence longer than
    the batch size is a batch of its own, which no smaller batch size shrinks."""
    torch = pytest.importorskip("torch")
    e = embed.get_embedder(tiny_esm.stem, tiny_esm, toks_per_batch=64, threads=1)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    e.model = out_of_memory
    with pytest.raises(embed.EmbedderError, match=r"embedding 2 sequences of up to 20 residues "
                                                  r"\(--toks-per-batch 64\): re-run with a smaller --toks-per-batch, e.g. 32"):
        e.embed(["MKVLAAGIVG" * 2] * 3)
    with pytest.raises(embed.EmbedderError, match=r"embedding one sequence of 100 residues: this sequence "
                                                  r"does not fit alone"):
        e.embed(["M" + "K" * 99])
