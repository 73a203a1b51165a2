"""Per-residue embedders behind one interface.

    emb = get_embedder("builtin/onehot")                      # no weights needed
    emb = get_embedder("esm2_t6_8M_UR50D/layer6", weights="~/models/esm2_t6_8M_UR50D.pt")
    feats = emb.embed(["MKV...", "MST..."])                   # list of float32 [L, D]
    emb.embedder_id, emb.dim                                  # canonical id, feature dim

Embedder ids:

* ``builtin/onehot`` (D=25) — one-hot over ``AA_ALPHABET`` (``ACDEFGHIKLMNPQRSTVWY`` +
  ``XBZUO``). ``builtin`` alone means ``builtin/onehot``.
* ``builtin/onehot+blosum62`` (D=50) — the one-hot, then the residue's BLOSUM62 row over the
  same 25 letters, divided by 4 (U scored as C, O as K).
* ``esm2_<name>[/layer<N>]`` — ESM-2 through fair-esm; ``N`` may be negative (from the top);
  the canonical id names the absolute layer, e.g. ``esm2_t6_8M_UR50D/layer6`` (the default is
  the last layer).

``feature_layout(embedder_id)`` says which columns hold the one-hot and the BLOSUM62 rows (and
their scale): the model reads its substitution channel through it (docs/design.md §4).

Residues (``pfamalign.residues``): ASCII letters, case folded. X, B, Z, U, O are ESM-2 tokens
of their own (fair-esm's alphabet) and builtin columns of their own. The only other letter, J,
is not in ESM-2's vocabulary (fair-esm raises ``KeyError``); both embedders read it as X.
Anything else is a ``ValueError`` naming the (1-based) position.

ESM-2 sequence limit: 1022 residues (1024 tokens with BOS/EOS). ``long_policy="refuse"``
(default) raises for longer sequences — the prepare pipeline leaves such sequences out and
counts them; ``long_policy="window"`` embeds windows of 1022 residues with stride 511 and
takes each residue from the window where it is most central (at least 255 residues of
context on each side away from the sequence ends).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import os
import pathlib
import re
import warnings
from collections.abc import Sequence

import numpy as np

from pfamalign import residues
from pfamalign.residues import AA_ALPHABET

ESM_MAX_RESIDUES = 1022
WEIGHTS_ENV = "PFAMALIGN_ESM_WEIGHTS"
TRUST_ENV = "PFAMALIGN_TRUST_WEIGHTS"
ESM_URL = "https://dl.fbaipublicfiles.com/fair-esm"

_ESM_ID = re.compile(r"^(esm2_[A-Za-z0-9_]+?)(?:/layer(-?\d+))?$")
_TO_ALPHABET = str.maketrans(residues.EMBEDDING_MAP)


class EmbedderError(ValueError):
    """An embedder cannot be built or used (bad id, missing or unreadable weights, ...)."""


class Embedder(abc.ABC):
    """Turns residue strings into per-residue feature arrays."""

    embedder_id: str  # canonical id, recorded in the dataset manifest
    dim: int  # feature dimension D
    max_residues: int | None  # longest sequence accepted (None: no limit)

    @abc.abstractmethod
    def embed(self, sequences: Sequence[str]) -> list[np.ndarray]:
        """Returns one float32 array [len(seq), dim] per sequence, in order."""

    def fingerprint(self) -> str:
        """Identifies the weights (part of the dataset's config hash)."""
        return self.embedder_id


# ------------------------------------------------------------------------------------------
# builtin
# ------------------------------------------------------------------------------------------

def _residues(seq: str) -> str:
    """``seq`` upper-cased over ``AA_ALPHABET`` (J read as X)."""
    bad = residues.first_invalid(seq)
    if bad is not None:
        raise ValueError(f"invalid residue {seq[bad]!r} at position {bad + 1} (residues must be "
                         "letters; remove gaps and other symbols)")
    return seq.upper().translate(_TO_ALPHABET)


@dataclasses.dataclass(frozen=True)
class FeatureLayout:
    """Where an embedder's features hold residue identity.

    ``onehot``: the columns of the one-hot over ``alphabet``; ``substitution_rows``: the
    columns of the residue's BLOSUM62 row over ``alphabet``, stored divided by
    ``substitution_scale``. None where the features have no such columns (ESM-2's are learned).
    """

    alphabet: str = AA_ALPHABET
    onehot: slice | None = None
    substitution_rows: slice | None = None
    substitution_scale: float = 1.0

    @property
    def has_substitution(self) -> bool:
        """Whether the features hold both parts of a substitution score: one-hot and BLOSUM62 rows."""
        return self.onehot is not None and self.substitution_rows is not None


_N = len(AA_ALPHABET)
_BUILTIN_LAYOUTS = {  # rows / 4: BLOSUM62 scores (-4 .. 11) at about the one-hot's scale
    "onehot": FeatureLayout(onehot=slice(0, _N)),
    "onehot+blosum62": FeatureLayout(onehot=slice(0, _N), substitution_rows=slice(_N, 2 * _N),
                                     substitution_scale=4.0),
}


def feature_layout(embedder_id: str) -> FeatureLayout:
    """The feature layout of the embedder named by ``embedder_id`` (without building it)."""
    kind, name, _ = parse_embedder_id(embedder_id)
    if kind == "esm2":
        return FeatureLayout()
    if name not in _BUILTIN_LAYOUTS:
        raise EmbedderError(f"unknown builtin features {name!r}; choose one of "
                            f"{', '.join('builtin/' + f for f in _BUILTIN_LAYOUTS)}")
    return _BUILTIN_LAYOUTS[name]


def _builtin_table(layout: FeatureLayout) -> np.ndarray:
    """[128, D] float32 lookup table indexed by the ASCII code of an ``AA_ALPHABET`` letter."""
    letters = np.frombuffer(layout.alphabet.encode("ascii"), np.uint8)
    dim = max(s.stop for s in (layout.onehot, layout.substitution_rows) if s is not None)
    table = np.zeros((128, dim), dtype=np.float32)
    table[letters, layout.onehot] = np.eye(len(letters))
    if layout.substitution_rows is not None:  # U, O scored as C, K
        scores = residues.substitution_scores(layout.alphabet, layout.alphabet)
        table[letters, layout.substitution_rows] = scores / layout.substitution_scale
    return table


class BuiltinEmbedder(Embedder):
    """Weight-free featurizer: one-hot of the residue alphabet, optionally + BLOSUM62 rows."""

    max_residues = None

    def __init__(self, features: str = "onehot"):
        self.features = features
        self.embedder_id = f"builtin/{features}"
        self._table = _builtin_table(feature_layout(self.embedder_id))
        self.dim = int(self._table.shape[1])

    def featurize(self, seq: str) -> np.ndarray:
        """One sequence -> float32 [L, D]."""
        return self._table[np.frombuffer(_residues(seq).encode("ascii"), dtype=np.uint8)]

    def embed(self, sequences: Sequence[str]) -> list[np.ndarray]:
        return [self.featurize(s) for s in sequences]


# ------------------------------------------------------------------------------------------
# ESM-2 (fair-esm)
# ------------------------------------------------------------------------------------------

def _weights_help(name: str) -> str:
    hub = _torch_hub_checkpoints()
    return (f"It needs the fair-esm checkpoint file '{name}.pt' ({ESM_URL}/models/{name}.pt; "
            f"no contact-regression file). Put it at {hub / (name + '.pt')} (the torch hub cache), or pass "
            f"--weights /path/to/{name}.pt (or a directory holding it), or set "
            f"{WEIGHTS_ENV}=/path/to/{name}.pt. Keep the original file name: fair-esm derives "
            "the architecture from it.")


def _torch_hub_checkpoints() -> pathlib.Path:
    try:
        import torch

        return pathlib.Path(torch.hub.get_dir()) / "checkpoints"
    except ImportError:
        home = os.environ.get("TORCH_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torch")
        return pathlib.Path(home) / "hub" / "checkpoints"


def resolve_esm_weights(name: str, weights: str | os.PathLike | None = None) -> pathlib.Path:
    """Finds ``{name}.pt``: ``weights`` (file or directory), then ``$PFAMALIGN_ESM_WEIGHTS``,
    then the torch hub cache. Raises :class:`EmbedderError` saying which file is needed."""
    candidates: list[tuple[str, pathlib.Path]] = []
    if weights is not None:
        candidates.append(("--weights", pathlib.Path(weights).expanduser()))
    if os.environ.get(WEIGHTS_ENV):
        candidates.append((f"${WEIGHTS_ENV}", pathlib.Path(os.environ[WEIGHTS_ENV]).expanduser()))
    candidates.append(("torch hub cache", _torch_hub_checkpoints() / f"{name}.pt"))
    searched = []
    for origin, path in candidates:
        if path.is_dir():
            path = path / f"{name}.pt"
            if not path.is_file() and origin != "torch hub cache":  # a choice, not a hint: no fallback
                raise EmbedderError(f"{origin} names the directory {path.parent}, which has no {name}.pt. "
                                    + _weights_help(name))
        elif not path.exists() and origin != "torch hub cache":
            raise EmbedderError(f"{origin} points to {path}, which does not exist. "
                                + _weights_help(name))
        if path.is_file():
            if path.stem != name:
                raise EmbedderError(
                    f"weights file {path} (from {origin}) does not match embedder {name!r}: "
                    f"the file must be named '{name}.pt' because fair-esm derives the "
                    "architecture from the file name (rename it or change --embedder)")
            return path
        searched.append(f"{path} ({origin})")
    raise EmbedderError(f"ESM-2 weights for {name!r} not found (looked for: "
                        f"{'; '.join(searched)}). " + _weights_help(name))


def _fingerprint_file(path: pathlib.Path) -> str:
    """``NAME:SIZE:SHA256[:16]`` of the whole file: two weights files differing anywhere give
    datasets of different configurations (until 2026-11-30 only the first and last MiB were
    read, and weights differing in between shared a dataset's hash and its embeddings)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return f"{path.name}:{path.stat().st_size}:{h.hexdigest()[:16]}"


def trusted_weights() -> bool:
    """Whether ``$PFAMALIGN_TRUST_WEIGHTS`` allows full unpickling: only an explicit yes
    (1, true, yes, on); unset, empty, 0, false, no and off keep weights-only loading, and any
    other value is an error (a typo must not run a file's code)."""
    value = os.environ.get(TRUST_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise EmbedderError(f"${TRUST_ENV}={os.environ[TRUST_ENV]!r}: give 1 to allow full unpickling of "
                        "trusted weights files, or unset it (0 / false / no / off also keep it off)")


def load_esm(path: pathlib.Path):
    """Loads a fair-esm ESM-2 checkpoint.

    The file is loaded with ``weights_only=True`` (no code runs, whatever the file holds);
    fair-esm's own checkpoints hold an ``argparse.Namespace``, which is allow-listed.
    Checkpoints needing more can be loaded with ``PFAMALIGN_TRUST_WEIGHTS=1`` (full
    unpickling: trusted files only). The contact-regression file fair-esm keeps beside it is
    never read: residue representations do not use the contact head, and a file read for
    nothing could only fail (or, trusted, run code).
    """
    import argparse
    import pickle

    import esm
    import torch

    name = path.stem
    trust = trusted_weights()
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise EmbedderError(f"cannot read ESM-2 weights {path}: {err}") from err
    if magic != b"PK\x03\x04" and magic[:1] != b"\x80":
        raise EmbedderError(f"{path} is not a PyTorch checkpoint (corrupt or incomplete "
                            "download?); download it again. " + _weights_help(name))
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # regression weights absent: contacts unused here
            # never fair-esm's load_model_and_alphabet_local: its torch.load relies on the
            # torch default, which unpickles arbitrary objects before torch 2.6
            model_data = torch.load(str(path), map_location="cpu", weights_only=not trust)
            return esm.pretrained.load_model_and_alphabet_core(name, model_data, None)
    except pickle.UnpicklingError as err:
        raise EmbedderError(
            f"cannot load ESM-2 weights {path} in weights-only mode ({err}). If you trust the "
            f"file, set {TRUST_ENV}=1 to allow full unpickling.") from err
    except (PermissionError, FileNotFoundError) as err:
        raise EmbedderError(f"cannot read ESM-2 weights {path}: {err}") from err
    except Exception as err:  # corrupt zip, wrong keys, wrong shapes, ...
        raise EmbedderError(
            f"cannot read ESM-2 weights {path}: {type(err).__name__}: {err}. The file is "
            "truncated or not a fair-esm ESM-2 checkpoint; download it again. "
            + _weights_help(name)) from err


def window_starts(length: int, window: int = ESM_MAX_RESIDUES) -> list[int]:
    """Start offsets of windows of ``window`` residues, stride ``window // 2``, covering all."""
    if length <= window:
        return [0]
    stride = window // 2
    starts = list(range(0, length - window, stride))
    return starts + [length - window]


def stitch_windows(length: int, starts: Sequence[int], parts: Sequence[np.ndarray]) -> np.ndarray:
    """Each residue from the window where it is most central. ``parts[w]`` is [window, D]."""
    idx = np.arange(length)
    margins = np.full((len(starts), length), -1, dtype=np.int64)
    for w, (s, part) in enumerate(zip(starts, parts)):
        e = s + len(part)
        inside = (idx >= s) & (idx < e)
        margins[w, inside] = np.minimum(idx[inside] - s, e - 1 - idx[inside])
    best = margins.argmax(axis=0)
    out = np.empty((length, parts[0].shape[1]), dtype=np.float32)
    for w, s in enumerate(starts):
        sel = best == w
        out[sel] = parts[w][idx[sel] - s]
    return out


class EsmEmbedder(Embedder):
    """ESM-2 per-residue representations of one layer, batched by tokens, on CPU or GPU."""

    def __init__(self, name: str, layer: int | None, weights: pathlib.Path, *,
                 long_policy: str = "refuse", toks_per_batch: int = 4096,
                 threads: int | None = None, device: str = "cpu"):
        if long_policy not in ("refuse", "window"):
            raise EmbedderError(f"long_policy must be 'refuse' or 'window', got {long_policy!r}")
        import torch

        if threads is not None and int(threads) < 1:
            raise EmbedderError(f"threads must be at least 1, got {threads}")
        try:
            torch_device = torch.device(device)
        except RuntimeError as err:
            raise EmbedderError(f"unknown torch device {device!r} ({err}); give cpu, cuda or cuda:N") from err
        if torch_device.type == "cuda" and not torch.cuda.is_available():
            raise EmbedderError(f"device {device!r}: this torch has no CUDA GPU available (torch "
                                f"{torch.__version__}); give --device cpu, or install a CUDA build of torch")
        if threads:
            torch.set_num_threads(int(threads))
        self.name = name
        self.weights = weights
        self._fingerprint = None
        self.model, self.alphabet = load_esm(weights)
        try:
            self.model.eval().to(torch_device)
        except (RuntimeError, AssertionError) as err:  # a device this torch cannot use
            raise EmbedderError(f"cannot move ESM-2 to device {device!r}: {err}") from err
        self.device = device
        n_layers = int(self.model.num_layers)
        chosen = n_layers if layer is None else int(layer)
        if chosen < 0:
            chosen += n_layers + 1
        if not 0 <= chosen <= n_layers:
            raise EmbedderError(f"layer {layer} out of range for {name} ({n_layers} layers; "
                                f"use 0..{n_layers}, or -1 for the last)")
        self.layer = chosen
        self.embedder_id = f"{name}/layer{chosen}"
        self.dim = int(self.model.embed_dim)
        self.long_policy = long_policy
        self.max_residues = ESM_MAX_RESIDUES if long_policy == "refuse" else None
        self.toks_per_batch = int(toks_per_batch)
        self._lut = np.full(256, self.alphabet.unk_idx, dtype=np.int64)
        for c in AA_ALPHABET:
            self._lut[ord(c)] = self.alphabet.get_idx(c)

    def tokens(self, seqs: Sequence[str]):
        """[b, max_len + 2] int64 tokens: <cls> residues <eos> <pad>..., the same tensor as
        fair-esm's ``BatchConverter`` (which tokenizes ~100x slower, in Python)."""
        import torch

        a = self.alphabet
        width = max(len(s) for s in seqs) + int(a.prepend_bos) + int(a.append_eos)
        toks = np.full((len(seqs), width), a.padding_idx, dtype=np.int64)
        for i, s in enumerate(seqs):
            start = int(a.prepend_bos)
            if a.prepend_bos:
                toks[i, 0] = a.cls_idx
            toks[i, start:start + len(s)] = self._lut[np.frombuffer(s.encode("ascii"), np.uint8)]
            if a.append_eos:
                toks[i, start + len(s)] = a.eos_idx
        return torch.from_numpy(toks)

    def fingerprint(self) -> str:
        """The embedder id and its weights file's fingerprint, the file read once an embedder
        (prepare asks up to three times; a pass over the 3B model's weights takes ~9 s)."""
        if self._fingerprint is None:
            self._fingerprint = f"{self.embedder_id}@{_fingerprint_file(self.weights)}"
        return self._fingerprint

    def embed(self, sequences: Sequence[str]) -> list[np.ndarray]:
        import esm
        import torch

        items: list[tuple[int, int, str]] = []  # (sequence index, window start, residues)
        for si, seq in enumerate(sequences):
            seq = _residues(seq)
            if len(seq) > ESM_MAX_RESIDUES:
                if self.long_policy == "refuse":
                    raise EmbedderError(
                        f"sequence {si} has {len(seq)} residues; ESM-2 takes at most "
                        f"{ESM_MAX_RESIDUES} (long_policy='refuse'; use 'window' to embed "
                        "overlapping windows, or leave such sequences out)")
                items.extend((si, s, seq[s:s + ESM_MAX_RESIDUES])
                             for s in window_starts(len(seq)))
            else:
                items.append((si, 0, seq))
        data = esm.data.FastaBatchedDataset([str(i) for i in range(len(items))],
                                            [it[2] for it in items])
        batches = data.get_batch_indices(self.toks_per_batch, extra_toks_per_seq=2)
        reps: list[np.ndarray | None] = [None] * len(items)
        with torch.no_grad():
            for batch in batches:
                toks = self.tokens([items[i][2] for i in batch])
                try:
                    out = self.model(toks.to(self.device), repr_layers=[self.layer])
                except (torch.OutOfMemoryError, RuntimeError) as err:
                    if not _out_of_memory(err):
                        raise
                    if len(batch) > 1:
                        what = (f"{len(batch)} sequences of up to {toks.shape[1] - 2} residues (--toks-per-batch "
                                f"{self.toks_per_batch}): re-run with a smaller --toks-per-batch, e.g. "
                                f"{max(1, self.toks_per_batch // 2)}")
                    else:  # a batch of its own: a smaller batch size cannot help
                        what = (f"one sequence of {toks.shape[1] - 2} residues: this sequence does not fit "
                                "alone: leave such lengths out (--max-len), embed windows of them "
                                "(--long-seqs window, on sequences over 1022), or use a device with more "
                                "memory or a smaller ESM-2")
                    raise EmbedderError(f"ESM-2 ran out of memory on {self.device} embedding {what}"
                                        f"; a dataset resumes with its finished parts kept") from err
                rep = out["representations"][self.layer]  # [b, T, D]
                for row, i in enumerate(batch):
                    n = len(items[i][2])
                    reps[i] = rep[row, 1:n + 1].float().cpu().numpy()
        result: list[list[tuple[int, np.ndarray]]] = [[] for _ in sequences]
        for (si, start, _), r in zip(items, reps):
            result[si].append((start, r))
        out_list = []
        for si, parts in enumerate(result):
            if len(parts) == 1:
                out_list.append(np.ascontiguousarray(parts[0][1], dtype=np.float32))
            else:
                out_list.append(stitch_windows(len(sequences[si]), [s for s, _ in parts],
                                               [p for _, p in parts]))
        return out_list


def _out_of_memory(err: BaseException) -> bool:
    """Whether torch failed for want of memory: a CUDA ``OutOfMemoryError``, or the CPU
    allocator's RuntimeError (which has no class of its own)."""
    import torch

    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or any(
        phrase in text for phrase in ("out of memory", "can't allocate memory",
                                      "not enough memory"))


# ------------------------------------------------------------------------------------------
# Factory
# ------------------------------------------------------------------------------------------

def parse_embedder_id(embedder_id: str) -> tuple[str, str, int | None]:
    """``(kind, name, layer)``: ``("builtin", features, None)`` or ``("esm2", name, layer)``."""
    eid = embedder_id.strip()
    if eid in ("builtin", "builtin/"):
        return "builtin", "onehot", None
    if eid.startswith("builtin/"):
        return "builtin", eid.split("/", 1)[1], None
    m = _ESM_ID.match(eid)
    if m:
        return "esm2", m.group(1), None if m.group(2) is None else int(m.group(2))
    raise EmbedderError(f"unknown embedder {embedder_id!r}: use builtin/onehot, "
                        "builtin/onehot+blosum62 or an ESM-2 model such as "
                        "esm2_t6_8M_UR50D[/layerN]")


def get_embedder(embedder_id: str, weights: str | os.PathLike | None = None, *,
                 long_policy: str = "refuse", toks_per_batch: int = 4096,
                 threads: int | None = None, device: str = "cpu") -> Embedder:
    """Builds the embedder named by ``embedder_id`` (see the module docstring)."""
    kind, name, layer = parse_embedder_id(embedder_id)
    if kind == "builtin":
        if weights is not None:  # they would be ignored: a sign of the wrong model or option
            raise EmbedderError(f"embedder {embedder_id!r} is built in and takes no ESM-2 weights; "
                                "leave out --weights (weights=)")
        return BuiltinEmbedder(name)
    try:
        import esm  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        raise EmbedderError(f"embedder {embedder_id!r} needs torch and fair-esm: pip install "
                            "torch==2.13.0 && pip install 'pfamalign[embed]'") from err
    path = resolve_esm_weights(name, weights)
    return EsmEmbedder(name, layer, path, long_policy=long_policy,
                       toks_per_batch=toks_per_batch, threads=threads, device=device)
