"""Reading a prepared dataset: random-access pair sources, padded batches, eval records.

The one input pipeline of training, its validation and the benchmarks (see
pipelines/README.md for the batch contract)::

    from pfamalign.pipelines import reader
    ds = reader.PairDataset("data/")                 # manifest: ds.embedder_id, ds.dim
    it = reader.batch_iterator("data/", "train", batch_size=16, seed=0)
    batch = next(it)          # dict of numpy arrays: q_feat [B, Lq_pad, D] float32, ...
    state = it.get_state()    # save with the model checkpoint; later:
    it = reader.batch_iterator("data/", "train", batch_size=16, seed=0)
    it.set_state(state)       # continues with exactly the next batch

``max_len`` / ``max_pairs`` select the pairs (``select_pairs``); multi-host training passes
``process_index`` / ``process_count``: every process plans the same global batches and loads
only its own rows, padded like the whole global batch. Validation reads one finite,
length-sorted epoch (``shuffle=False, num_epochs=1, bucket_window=None,
drop_remainder=False``).

Evaluation::

    for pair in reader.iter_pairs("data/", "test"):   # unbatched, residues + target
        pair["q_seq"], pair["k_seq"], pair["target"], pair["pid"]

Batches are planned per epoch from ``lengths.npy`` without touching the records: the split is
shuffled with ``(seed, epoch)``, cut into windows of ``bucket_window`` batches, each window is
sorted by pair length and cut into batches (length bucketing), and the batch order is shuffled.
Lengths are padded up to a multiple of ``pad_multiple`` (q and k to the same length when
``same_length``), so a run sees at most ``max_len / pad_multiple`` distinct shapes.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from collections.abc import Iterator, Sequence

import numpy as np

from pfamalign.pipelines import records as rec
from pfamalign.pipelines.config import FORMAT_VERSION
from pfamalign.pipelines.splits import SPLITS

STRING_FIELDS = ("family", "q_id", "k_id", "q_seq", "k_seq")


def dataset_files(manifest: dict) -> list[str]:
    """The files (relative to the dataset) its manifest names besides itself: the tables,
    each split's lengths, the embeddings index and the shards."""
    files = ["shards.tsv", manifest.get("families_table", "families.tsv")]
    files += [split["lengths"] for split in manifest.get("splits", {}).values()
              if "lengths" in split]
    if "index" in manifest.get("embeddings", {}):
        files.append(manifest["embeddings"]["index"])
    return files + [row["path"] for row in manifest.get("shards", [])]


MAX_FEATURE_DIM = 1 << 16  # per-residue features; ESM-2's widest model (15B) has 5,120


def _numbers(manifest: dict) -> list[tuple[str, object, int, int]]:
    """(name, value, least, most) of the numbers a reader sizes its work by."""
    from pfamalign.jsonio import MAX_INT

    numbers = [("embedder.dim", manifest["embedder"]["dim"], 1, MAX_FEATURE_DIM),
               ("embeddings.count", manifest["embeddings"]["count"], 0, MAX_INT)]
    return numbers + [(f"splits.{name}.pairs", split["pairs"], 0, MAX_INT)
                      for name, split in manifest.get("splits", {}).items()]


def manifest_problems(manifest: dict) -> list[str]:
    """What keeps a manifest from being read as its dataset's: files it names outside the
    dataset (absolute, ``..``), shards the splits or the embeddings read that its checksummed
    ``shards`` rows do not record (a manifest handed over with them would have the dataset
    read, and ``verify`` vouch for, other files), and numbers that are not counts in range
    (the feature width sizes every batch: a damaged one is a traceback or a huge allocation
    later)."""
    try:
        rows = {row["path"] for row in manifest.get("shards", [])}
        read = [name for split in manifest.get("splits", {}).values() for name in split.get("shards", [])]
        read += list(manifest.get("embeddings", {}).get("shards", []))
        named = dataset_files(manifest) + [row["path"] for row in manifest.get("tables", [])]
        numbers = _numbers(manifest)
        if manifest["embeddings"]["count"] and not manifest["embeddings"]["shards"]:
            raise KeyError("embeddings.shards")  # embeddings counted, none to read them from
    except (AttributeError, TypeError, KeyError) as err:  # "splits": "x", a shard row without a path
        return [f"manifest.json is not shaped as a dataset manifest ({type(err).__name__}: {err})"]
    problems = [f"manifest.json names {name!r}, not a file inside the dataset" for name in named + read
                if not rec.stays_inside(name)]
    problems += [f"manifest.json reads the shard {name!r}, which its shards table does not record"
                 for name in read if rec.stays_inside(name) and name not in rows]
    return problems + [f"manifest.json: {name} must be a whole number from {least} to {most}, got {repr(value)[:40]}"
                       for name, value, least, most in numbers
                       if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most]


def dataset_problems(path: pathlib.Path, manifest: dict, *, full: bool = False) -> list[str]:
    """The files of a dataset that are missing, and the shards and tables that differ from
    its manifest: by size (cheap, on every open), and by SHA-256 with ``full`` (``pfamalign
    verify``). Manifests written before the tables were recorded check those for presence.
    A manifest naming files outside the dataset, or damaged (``manifest_problems``), is
    checked no further."""
    problems = manifest_problems(manifest)
    if problems:
        return problems
    shards = {row["path"]: row for row in manifest.get("shards", []) + manifest.get("tables", [])}
    for name in dataset_files(manifest):
        file, row = path / name, shards.get(name)
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif row is None:
            continue
        elif file.stat().st_size != row["bytes"]:
            problems.append(f"{name} has {file.stat().st_size} bytes, the manifest says "
                            f"{row['bytes']}")
        elif full and rec.file_sha256(file) != row["sha256"]:
            problems.append(f"{name} fails its SHA-256 (corrupt or modified)")
    return problems


FAILED = "failed.json"  # in OUT/work: `prepare` stopped on an error (not a kill)


def unfinished_prepare(path: pathlib.Path) -> str | None:
    """What a directory holding the work of an unfinished `pfamalign prepare` (no manifest
    yet) is, and what to do; None for any other directory."""
    if not (path / "work").is_dir():
        return None
    from pfamalign.pipelines.locks import holder

    running = holder(path)
    if running is not None:
        return (f"a dataset being prepared: `pfamalign prepare` is writing it now ({running}); wait "
                "for it to finish")
    if (path / "work" / FAILED).exists():
        return ("an unfinished dataset: `pfamalign prepare` stopped on an error before it wrote "
                "manifest.json; fix what it reported and run it again")
    return ("an unfinished dataset: `pfamalign prepare` was stopped before it wrote manifest.json; "
            "re-run the same command to finish it")


class PairDataset:
    """A prepared dataset directory: manifest metadata and per-split sources."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        manifest_path = self.path / "manifest.json"
        if not manifest_path.exists():
            hint = unfinished_prepare(self.path)
            raise FileNotFoundError(f"{manifest_path} not found: not a prepared dataset"
                                    + (f" ({hint})" if hint else ""))
        try:
            self.manifest = json.loads(manifest_path.read_text())
            version = self.manifest.get("format_version")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError, RecursionError) as err:
            raise ValueError(f"{manifest_path} is damaged ({err}); re-run prepare") from None
        if version != FORMAT_VERSION:
            raise ValueError(f"{self.path} has dataset format {version}; this pfamalign reads "
                             f"format {FORMAT_VERSION} (re-run prepare)")
        damaged = dataset_problems(self.path, self.manifest)  # before any work needs them
        if damaged:
            raise ValueError(f"{self.path} is damaged: " + "; ".join(damaged[:3]) + ". Re-run "
                             "prepare into a new directory (`pfamalign verify` checks every byte)")

    @property
    def embedder_id(self) -> str:
        return self.manifest["embedder"]["id"]

    @property
    def dim(self) -> int:
        return int(self.manifest["embedder"]["dim"])

    @property
    def config_hash(self) -> str:
        return self.manifest["config_hash"]

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(s for s in SPLITS if s in self.manifest["splits"])

    def num_pairs(self, split: str) -> int:
        return int(self._split(split)["pairs"])

    def lengths(self, split: str) -> np.ndarray:
        """[N, 2] int32 (q_len, k_len) in record order."""
        self._split(split)
        return np.load(self.path / split / "lengths.npy")

    def source(self, split: str, *, features: bool = True) -> PairSource:
        return PairSource(self.path, split, features=features)

    def require_pairs(self, split: str, shown=None) -> None:
        """ValueError, with the pairs of every split and what to do, when ``split`` has none
        (``shown``: the dataset as the user named it)."""
        if split not in self.splits or self.num_pairs(split) == 0:
            counts = ", ".join(f"{s} {self.num_pairs(s)}" for s in self.splits)
            raise ValueError(f"{shown or self.path} has no pairs in split {split!r} (pairs per split: {counts}); "
                             f"choose a split that has pairs with --split, or prepare the dataset again with a "
                             f"larger {split} fraction in --splits (splits take whole families)")

    def _split(self, split: str) -> dict:
        if split not in self.manifest["splits"]:
            raise ValueError(f"unknown split {split!r}; {self.path} has {list(self.splits)}")
        return self.manifest["splits"][split]


class _ArrayRecordFiles:
    """Lazily opened ArrayRecord files (reopened in each process after pickling)."""

    _files: list[str]
    _len: int
    _source = None

    def __len__(self) -> int:
        return self._len

    def _src(self):
        if self._source is None:
            self._source = rec.array_records(self._files)
        return self._source

    def _read(self, index: int) -> dict:
        """Record ``index``, decoded; a damaged file is a ValueError naming the dataset
        (array_record raises RuntimeError on a corrupt chunk)."""
        try:
            return rec.decode(self._src()[index])
        except RuntimeError as err:
            raise ValueError(f"a shard of {self.path} is damaged ({err}); `pfamalign verify "
                             f"{self.path}` names it; re-run prepare") from None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_source"] = None
        return state


class EmbeddingSource(_ArrayRecordFiles):
    """Random access to the per-sequence embeddings: ``src[i]`` -> float32 [L, D]."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        manifest = json.loads((self.path / "manifest.json").read_text())
        self._files = [str(self.path / f) for f in manifest["embeddings"]["shards"]]
        self._len = int(manifest["embeddings"]["count"])
        self.dim = int(manifest["embedder"]["dim"])

    def record(self, index: int) -> dict:
        return self._read(int(index))

    def __getitem__(self, index: int) -> np.ndarray:
        emb = np.asarray(self.record(index)["emb"], dtype=np.float32)
        if emb.ndim != 2 or emb.shape[1] != self.dim:  # else a broadcast error in the batch it joins
            raise ValueError(f"embedding {index} of {self.path} has shape {emb.shape}, where its manifest's "
                             f"embedder.dim is {self.dim}: the manifest or a shard is damaged; re-run prepare")
        return emb


class PairSource(_ArrayRecordFiles):
    """A grain random-access source over one split's pair records.

    ``src[i]`` is a dict: ``family``, ``family_id``, ``pair_index``, ``split``, ``q_id``,
    ``k_id``, ``q_seq``, ``k_seq`` (str); ``q_len``, ``k_len``, ``n_aligned``, ``q_emb``,
    ``k_emb`` (int); ``pid`` (float, percent); ``target`` int32 [q_len]; and with
    ``features=True`` also ``q_feat`` [q_len, D], ``k_feat`` [k_len, D] float32.
    Picklable (files reopen lazily in each process).
    """

    def __init__(self, path: str | os.PathLike, split: str, *, features: bool = True):
        ds = PairDataset(path)
        info = ds._split(split)
        self.path = ds.path
        self.split = split
        self.features = features
        self.dim = ds.dim
        self._files = [str(ds.path / f) for f in info["shards"]]
        self._len = int(info["pairs"])
        self._emb = EmbeddingSource(ds.path) if features else None

    def __getitem__(self, index: int) -> dict:
        index = int(index)
        if not 0 <= index < self._len:
            raise IndexError(f"pair index {index} out of range for {self._len} pairs "
                             f"in split {self.split!r}")
        r = self._read(index)
        r["target"] = np.asarray(r["target"], dtype=np.int32)
        if self.features:
            r["q_feat"] = self._emb[r["q_emb"]]
            r["k_feat"] = self._emb[r["k_emb"]]
        return r

    def __repr__(self) -> str:
        return f"PairSource({str(self.path)!r}, {self.split!r}, n={self._len})"


def iter_pairs(path: str | os.PathLike, split: str, *, features: bool = False) -> Iterator[dict]:
    """Every pair record of a split in stored order (for evaluation)."""
    src = PairSource(path, split, features=features)
    for i in range(len(src)):
        yield src[i]


# ------------------------------------------------------------------------------------------
# Batching
# ------------------------------------------------------------------------------------------

def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-int(n) // multiple) * multiple)


def collate(examples: Sequence[dict], *, batch_size: int | None = None, pad_multiple: int = 64,
            same_length: bool = True, pad_to: int | None = None, dim: int | None = None,
            with_strings: bool = True) -> dict[str, np.ndarray]:
    """Pads pair examples (with features) into one batch of numpy arrays.

    Returns ``q_feat`` [B, Lq_pad, D] and ``k_feat`` [B, Lk_pad, D] float32 (zero padding),
    ``q_len``, ``k_len`` [B] int32, ``target`` [B, Lq_pad] int32 (-1 unaligned and padding),
    ``pid`` [B] float32 (percent), ``valid`` [B] bool (False for filler rows when fewer than
    ``batch_size`` examples are given), and with ``with_strings`` the numpy str arrays
    ``family``, ``q_id``, ``k_id``, ``q_seq``, ``k_seq`` [B].
    """
    n = len(examples)
    b = batch_size or n
    if n > b:
        raise ValueError(f"{n} examples do not fit batch_size={b}")
    if dim is None:
        dim = int(examples[0]["q_feat"].shape[1])
    max_q = max((e["q_len"] for e in examples), default=1)
    max_k = max((e["k_len"] for e in examples), default=1)
    if pad_to is not None:
        if max(max_q, max_k) > pad_to:
            raise ValueError(f"a pair of lengths ({max_q}, {max_k}) exceeds pad_to={pad_to}")
        lq = lk = pad_to
    elif same_length:
        lq = lk = round_up(max(max_q, max_k), pad_multiple)
    else:
        lq, lk = round_up(max_q, pad_multiple), round_up(max_k, pad_multiple)
    out = {
        "q_feat": np.zeros((b, lq, dim), np.float32),
        "k_feat": np.zeros((b, lk, dim), np.float32),
        "q_len": np.zeros((b,), np.int32),
        "k_len": np.zeros((b,), np.int32),
        "target": np.full((b, lq), -1, np.int32),
        "pid": np.zeros((b,), np.float32),
        "valid": np.zeros((b,), bool),
    }
    for i, e in enumerate(examples):
        q, k = e["q_len"], e["k_len"]
        out["q_feat"][i, :q] = e["q_feat"]
        out["k_feat"][i, :k] = e["k_feat"]
        out["q_len"][i], out["k_len"][i] = q, k
        out["target"][i, :q] = e["target"]
        out["pid"][i] = e["pid"]
        out["valid"][i] = True
    if with_strings:
        for name in STRING_FIELDS:
            out[name] = np.asarray([e[name] for e in examples] + [""] * (b - n), dtype=str)
    return out


def select_pairs(lengths: np.ndarray, *, max_len: int = 0, max_pairs: int = 0) -> np.ndarray:
    """Record indices of the pairs whose sequences are at most ``max_len`` long (0 = all),
    then at most ``max_pairs`` of them evenly spaced in stored order (0 = all; records are
    stored family by family, so the families spread evenly and most show, but a family of
    fewer pairs than the spacing may not)."""
    lengths = np.asarray(lengths).reshape(-1, 2)
    keep = np.arange(len(lengths))
    if max_len:
        keep = np.flatnonzero(lengths.max(axis=1) <= max_len)
    if max_pairs and len(keep) > max_pairs:
        keep = keep[np.linspace(0, len(keep) - 1, max_pairs).round().astype(int)]
    return keep


class BatchPlan:
    """Random-access source of batches as index lists: element ``i`` is the record indices of
    batch ``i`` (epoch ``i // batches_per_epoch``). Deterministic in ``seed``.

    ``records``: the record indices to plan over (default all, e.g. ``select_pairs``);
    ``bucket_window=None`` sorts each whole epoch by length (one window). A finite plan over
    no records is empty; any other plan needs one batch."""

    def __init__(self, lengths: np.ndarray, batch_size: int, *, seed: int = 0,
                 shuffle: bool = True, num_epochs: int | None = None,
                 bucket_window: int | None = 32, drop_remainder: bool = True,
                 records: np.ndarray | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
        self.records = np.arange(len(lengths)) if records is None else np.asarray(records, np.int64)
        self.lengths = lengths[self.records]
        self.n = len(self.records)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.num_epochs = num_epochs
        self.bucket_window = max(self.n // batch_size + 1 if bucket_window is None
                                 else int(bucket_window), 1)
        self.drop_remainder = drop_remainder
        full, rest = divmod(self.n, batch_size)
        self.batches_per_epoch = full + (1 if rest and not drop_remainder else 0)
        self._cache: tuple[int, list[np.ndarray]] | None = None
        if self.batches_per_epoch == 0 and (self.n or num_epochs is None):
            raise ValueError(f"{self.n} usable pairs, fewer than one batch of {batch_size}")

    def __len__(self) -> int:
        if self.num_epochs is None:
            return (sys.maxsize // self.batches_per_epoch) * self.batches_per_epoch
        return self.batches_per_epoch * self.num_epochs

    def epoch(self, epoch: int) -> list[np.ndarray]:
        """The batches (record index arrays) of one epoch."""
        cached = self._cache
        if cached is not None and cached[0] == epoch:
            return cached[1]
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.n) if self.shuffle else np.arange(self.n)
        size = self.batch_size * self.bucket_window
        key = self.lengths.max(axis=1)
        batches: list[np.ndarray] = []
        for start in range(0, self.n, size):
            window = order[start:start + size]
            if self.bucket_window > 1:
                window = window[np.argsort(key[window], kind="stable")]
            batches.extend(self.records[window[i:i + self.batch_size]]
                           for i in range(0, len(window), self.batch_size))
        if self.drop_remainder:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (epoch, batches)
        return batches

    def __getitem__(self, index: int) -> np.ndarray:
        index = int(index)
        if index < 0 or index >= len(self):
            raise IndexError(index)
        epoch, b = divmod(index, self.batches_per_epoch)
        return self.epoch(epoch)[b]

    def __getstate__(self):
        return dict(self.__dict__, _cache=None)


class _LoadBatch:
    """Picklable grain map function: a global batch's record indices -> this process's rows
    (``batch_size / process_count`` of them), padded. With ``same_length`` the padded length
    comes from the whole global batch, so it is the same on every process."""

    def __init__(self, source: PairSource, lengths: np.ndarray, *, batch_size: int,
                 pad_multiple: int, same_length: bool, pad_to: int | None, with_strings: bool,
                 process_index: int, process_count: int):
        self.source, self.lengths = source, lengths
        self.rows = batch_size // process_count
        self.first = process_index * self.rows
        self.pad_multiple, self.same_length, self.pad_to = pad_multiple, same_length, pad_to
        self.with_strings = with_strings

    def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        pad_to = self.pad_to
        if pad_to is None and self.same_length:
            pad_to = round_up(int(self.lengths[indices].max()), self.pad_multiple)
        mine = indices[self.first:self.first + self.rows]
        examples = [self.source[i] for i in mine]
        for i, e in zip(mine, examples):  # the plan padded by the table: a damaged one must not pass
            if (e["q_len"], e["k_len"]) != tuple(int(x) for x in self.lengths[i]):
                raise ValueError(
                    f"{self.source.path / self.source.split / 'lengths.npy'} disagrees with the records: "
                    f"pair {int(i)} is {tuple(int(x) for x in self.lengths[i])} residues there, "
                    f"({e['q_len']}, {e['k_len']}) in its record; the dataset is damaged (`pfamalign verify "
                    f"{self.source.path}` checks it; prepare builds it again)")
        return collate(examples, batch_size=self.rows,
                       pad_multiple=self.pad_multiple, same_length=self.same_length,
                       pad_to=pad_to, dim=self.source.dim, with_strings=self.with_strings)


def batch_dataset(path: str | os.PathLike, split: str, *, batch_size: int, seed: int = 0,
                  shuffle: bool = True, num_epochs: int | None = None, pad_multiple: int = 64,
                  same_length: bool = True, pad_to: int | None = None,
                  bucket_window: int | None = 32, drop_remainder: bool = True,
                  with_strings: bool = True, max_len: int = 0, max_pairs: int = 0,
                  process_index: int = 0, process_count: int = 1):
    """A ``grain.MapDataset`` whose element ``i`` is padded batch ``i`` (see :func:`collate`).

    ``num_epochs=None`` repeats forever. With ``drop_remainder=False`` the last batch of an
    epoch is filled to ``batch_size`` with rows whose ``valid`` is False. ``max_len`` /
    ``max_pairs`` select the pairs (:func:`select_pairs`). Multi-host: every process plans the
    same global batches of ``batch_size`` and loads only its own ``batch_size /
    process_count`` rows (``process_index``-th slice), padded like the whole global batch.
    """
    import grain

    if not (isinstance(process_count, int) and process_count >= 1 and isinstance(process_index, int)
            and 0 <= process_index < process_count):  # else batches of padding rows alone, or 1/0
        raise ValueError(f"process_index {process_index!r} must be from 0 to process_count - 1, and "
                         f"process_count {process_count!r} at least 1")
    if batch_size % process_count:
        raise ValueError(f"batch_size {batch_size} is not divisible by the {process_count} "
                         "processes")
    if process_count > 1 and not same_length and pad_to is None:
        raise ValueError("several processes pad one global batch alike: use same_length or pad_to")
    lengths = PairDataset(path).lengths(split)
    try:
        plan = BatchPlan(lengths, batch_size, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                         bucket_window=bucket_window, drop_remainder=drop_remainder,
                         records=select_pairs(lengths, max_len=max_len, max_pairs=max_pairs))
    except ValueError as err:
        raise ValueError(f"{path}: the {split} split (max_len={max_len or 'none'}): "
                         f"{err}") from None
    load = _LoadBatch(PairSource(path, split, features=True), lengths, batch_size=batch_size,
                      pad_multiple=pad_multiple, same_length=same_length, pad_to=pad_to,
                      with_strings=with_strings, process_index=process_index,
                      process_count=process_count)
    return grain.MapDataset.source(plan).map(load)


def batch_iterator(path: str | os.PathLike, split: str, *, num_threads: int = 2,
                   prefetch: int = 4, worker_count: int = 0, **options):
    """A checkpointable ``grain.DatasetIterator`` over the padded batches of
    :func:`batch_dataset` (``options``: its keyword arguments).

    ``it.get_state()`` / ``it.set_state(state)`` save and restore the position exactly (store
    the state in the training checkpoint). ``num_threads``/``prefetch`` control grain's thread
    prefetch; ``worker_count > 0`` adds multiprocess prefetch (``mp_prefetch``).
    """
    import grain

    it_ds = batch_dataset(path, split, **options).to_iter_dataset(
        grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch))
    if worker_count > 0:
        from absl import flags

        if not flags.FLAGS.is_parsed():  # grain's workers read absl flags (defaults suffice)
            flags.FLAGS.mark_as_parsed()
        it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return iter(it_ds)
