"""Model directories and training checkpoints (orbax).

A **model directory** is what ``align`` / ``eval`` load::

    MODEL/config.json     {"format": "pfamalign-model", "format_version": 1,
                           "model": AlignerConfig (incl. TransportConfig, embedder id and dim)}
    MODEL/params/         the parameters (orbax, a nested dict of arrays: nnx.to_pure_dict)
    MODEL/decoding.json   the decoder settings (``decoding.DecoderSettings``), chosen on the
                          validation families at the end of ``pfamalign train``
    MODEL/training.json   what the model learnt from: {"dataset": {path, config_hash,
                          embedder_id}, "trained_on": {"split", "families": [accessions]},
                          "step": the training step the model is (a run's),
                          "decoder": {"source": "tuned" | "default_model" | ..., "split",
                          "families", "n_pairs", "f1", "f1_below30", "settings"}}; ``eval``
                          warns when the families it scores overlap these

A **run directory** (``pfamalign train --out RUN``) holds::

    RUN/config.json       the resolved run config {"model": ..., "train": ..., "data": ...}
    RUN/metrics.jsonl     process-0 metrics, one JSON object per line
    RUN/checkpoints/N/    params/, opt_state/ (orbax), data/ (grain iterator state, JSON),
                          meta/ (step, examples seen; JSON) -- the newest few steps
    RUN/model/            the final model directory (written at the end of the run)

``load_model`` accepts any of: a model directory, a run directory (its ``model/``, else its
newest checkpoint) or one checkpoint step directory (``RUN/checkpoints/N``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import pathlib
import shutil
import sys
import zipfile
from typing import Any

import jax
import numpy as np
from flax import nnx

from pfamalign import jsonio
from pfamalign.pipelines import records
from pfamalign.runs import (CHECKSUMS, MODEL_RECORDS, TRAINING_RECORD, CheckpointError, DamagedParameters,  # noqa: F401
                            add_checksums, check_parameter_files, incomplete_steps, params_unrecorded,
                            finished_steps, read_checksums, read_training_record, verify_checksums,
                            write_checksums)
from pfamalign.model import Aligner, AlignerConfig

MODEL_FORMAT = "pfamalign-model"
MODEL_FORMAT_VERSION = 1


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


# ---------------------------------------------------------------------------------------------
# Parameters <-> model
# ---------------------------------------------------------------------------------------------

def model_params(model: Aligner) -> dict:
    """The model's parameters as a nested dict of arrays."""
    return nnx.to_pure_dict(nnx.state(model))


def abstract_params(config: AlignerConfig, *, sharding=None) -> tuple[nnx.GraphDef, dict]:
    """``(graphdef, {path: ShapeDtypeStruct})`` of a model, without allocating it."""
    abstract = nnx.eval_shape(lambda: Aligner(config, rngs=nnx.Rngs(params=0)))
    graphdef, state = nnx.split(abstract)

    def struct(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return graphdef, jax.tree.map(struct, nnx.to_pure_dict(state))


def model_from_params(config: AlignerConfig, params: dict) -> Aligner:
    """An ``Aligner`` holding ``params`` (a nested dict as saved)."""
    graphdef, _ = abstract_params(config)
    return nnx.merge(graphdef, params)


# ---------------------------------------------------------------------------------------------
# Model directories
# ---------------------------------------------------------------------------------------------

def write_training_record(directory: str | os.PathLike, record: dict) -> None:
    """Writes ``MODEL/training.json`` (see the module docstring), the last file of a finished
    model, then adds the checksums of its ``MODEL_RECORDS`` to those of its parameters (a
    model directory: one with ``params/``; an ensemble records them with its ``ensemble.json``),
    so that ``verify`` notices an edited decoder."""
    from pfamalign.inference import ENSEMBLE_FILE

    directory = pathlib.Path(directory)
    text = jsonio.dumps(record, indent=2, sort_keys=True) + "\n"  # as records.write_json writes it
    # the checksums first: a kill between the two leaves an unfinished model (no training.json)
    # that the next run finishes, never a finished one whose settings cannot be verified
    digest = {TRAINING_RECORD: hashlib.sha256(text.encode()).hexdigest()}
    settings = tuple(name for name in MODEL_RECORDS if name != TRAINING_RECORD)
    if (directory / "params").is_dir() and (directory / CHECKSUMS).is_file():
        add_checksums(directory, settings, extra=digest)
    elif (directory / ENSEMBLE_FILE).is_file():  # an ensemble: its members and decoder
        add_checksums(directory, (ENSEMBLE_FILE, *settings), extra=digest)
    records.write_text(directory / TRAINING_RECORD, text)


def save_model(directory: str | os.PathLike, model: Aligner, config: AlignerConfig | None = None,
               *, params: dict | None = None) -> pathlib.Path:
    """Writes a model directory (``config.json`` + ``params/``), replacing one already there.

    ``config`` defaults to ``model.cfg``; ``params`` (a nested dict, e.g. a replicated
    training state) defaults to the model's own. Every process must call it (orbax
    coordinates the writes); process 0 writes ``config.json``.
    """
    ocp = _ocp()
    directory = pathlib.Path(directory).absolute()
    config = config or model.cfg
    params = params if params is not None else model_params(model)
    directory.mkdir(parents=True, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    with _orbax_writing(directory / "params"):
        try:
            ckptr.save(directory / "params", params, force=True)
            ckptr.wait_until_finished()
        except Exception:
            # its background writes (the step metadata's among them: the first wait raised
            # before reaching them) end before the temporary is removed, not after
            with contextlib.suppress(Exception):
                ckptr.close()
            raise
    if jax.process_index() == 0:
        write_checksums(directory, ("params",))
        records.write_json(directory / "config.json", {"format": MODEL_FORMAT,
                                                        "format_version": MODEL_FORMAT_VERSION,
                                                        "model": config.to_dict()}, indent=2)
    return directory


# What a model directory is made of: its copies (``copy_model``) follow links only for these
MODEL_PARTS = ("config.json", "params", CHECKSUMS, *MODEL_RECORDS)


def check_copyable(source: pathlib.Path) -> None:
    """Raises CheckpointError when copying the model ``source`` would read something that is not
    a regular file (``/dev/zero``, a FIFO: a copy that never ends) or loop (a link back up the
    tree), links followed; called before slow work too (``ensemble``'s tuning, ``compile``'s fit)."""
    seen = set()
    for top, dirs, files in os.walk(source, followlinks=True):
        if os.path.realpath(top) in seen:  # a link back up the tree: the copy would never end
            raise CheckpointError(f"{top} links back into the model (a loop): remove the link and run again")
        seen.add(os.path.realpath(top))
        dirs[:] = [d for d in dirs if not _skipped_link(source, pathlib.Path(top) / d)]  # left out: not walked
        for name in files:
            path = pathlib.Path(top) / name
            if not path.is_file() and not (path.is_symlink() and _skipped_link(source, path)):
                raise CheckpointError(f"{path} is not a regular file (a device, a FIFO, a broken link): a model "
                                      "directory holds regular files only; remove it and run again")


def _skipped_link(source: pathlib.Path, path: pathlib.Path) -> bool:
    """Whether ``copy_model`` leaves ``path`` out: a link outside the model's parts."""
    return path.is_symlink() and path.relative_to(source).parts[0] not in MODEL_PARTS


def copy_model(source: pathlib.Path, dest: pathlib.Path, *, ignore=None, dirs_exist_ok: bool = False) -> None:
    """Copies a model directory (``ensemble``'s members, ``compile``'s copy), links followed
    where they are the model's own parts (``params/`` kept on shared storage) and left out
    elsewhere: a handed-over model's ``notes.txt`` linked to a file outside was copied in, its
    bytes then vouched for by nothing; a special file is refused (``check_copyable``)."""
    source = pathlib.Path(source)
    check_copyable(source)

    def leave_out(folder, names):
        skipped = {n for n in names if _skipped_link(source, pathlib.Path(folder) / n)}
        return skipped | (set(ignore(folder, names)) if ignore else set())

    shutil.copytree(source, dest, ignore=leave_out, dirs_exist_ok=dirs_exist_ok)


def read_model_config(path: pathlib.Path) -> AlignerConfig:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # ValueError: also 4,300+ digits
        raise CheckpointError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict) or "model" not in data:
        raise CheckpointError(f"{path} has no 'model' section: not a pfamalign model/run config")
    version = data.get("format_version", MODEL_FORMAT_VERSION)
    if data.get("format", MODEL_FORMAT) == MODEL_FORMAT and version != MODEL_FORMAT_VERSION:
        raise CheckpointError(f"{path}: model format {version}; this pfamalign reads "
                              f"{MODEL_FORMAT_VERSION}")
    try:
        return AlignerConfig.from_dict(data["model"])
    except (ValueError, OverflowError) as err:  # OverflowError: a number past what a float holds
        raise CheckpointError(f"{path}: {err}") from None


def resolve_model_path(path: str | os.PathLike) -> tuple[pathlib.Path, pathlib.Path]:
    """``(config.json, params directory)`` of a model dir, run dir or checkpoint step dir."""
    path = pathlib.Path(path).absolute()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if (path / "config.json").is_file() and (path / "params").is_dir():
        return path / "config.json", path / "params"  # model directory
    from pfamalign.inference import finished_run_model

    if (model := finished_run_model(path)) is not None:
        return model / "config.json", model / "params"
    if (path / "checkpoints").is_dir() and (path / "config.json").is_file():
        steps = finished_steps(path / "checkpoints")
        if not steps:
            raise CheckpointError(f"{path} is a run directory without a finished checkpoint")
        return path / "config.json", path / "checkpoints" / str(steps[-1]) / "params"
    if (path / "params").is_dir() and (path.parent.parent / "config.json").is_file():
        return path.parent.parent / "config.json", path / "params"  # RUN/checkpoints/N
    raise CheckpointError(f"{path} is not a model directory (config.json + params/), a run "
                          "directory or a checkpoint step directory")


def _orbax_failure(err: BaseException) -> str:
    """What a failed orbax read says, in one line: its innermost cause (e.g. TensorStore's
    "Data corruption detected"), not the outer error's dump of the array spec. Also silences
    the read's orphans from here on (``_silence_orphaned_reads``)."""
    _silence_orphaned_reads()
    text = str(err := _innermost(err)).strip()
    return (text.splitlines()[0][:300] if text else type(err).__name__)


def _innermost(err: BaseException) -> BaseException:
    """The exception at the bottom of ``err``'s chain of causes, as a traceback shows it: a
    context its raise suppressed (``from None``: json's decode error hides the StopIteration
    holding a bare offset, shown as "...: 0") ends the chain."""
    while (nxt := err.__cause__ or (None if err.__suppress_context__ else err.__context__)) is not None:
        err = nxt
    return err


@functools.cache  # one hook for the process, however many reads fail
def _silence_orphaned_reads() -> None:
    """A failed orbax read leaves TensorStore reads pending; they fail again as their
    coroutines are collected or their callbacks meet a closed event loop at exit, and Python
    prints each as an unraisable traceback (hundreds of lines of array specs, after the
    error); one collected as the interpreter shuts down fails on a lazy import instead
    ("sys.meta_path is None", seen in CI under load). Those messages, and only they, are
    dropped."""
    previous = sys.unraisablehook

    def hook(unraisable):
        text = str(unraisable.exc_value)
        if not (text == "Event loop is closed" or text.startswith("Encountered error while reading array")
                or (isinstance(unraisable.exc_value, ImportError) and "Python is likely shutting down" in text)):
            previous(unraisable)

    sys.unraisablehook = hook


@contextlib.contextmanager
def _orbax_writing(where: pathlib.Path):
    """Around an orbax save into ``where``: a failed write (a full disk: TensorStore's
    ``RESOURCE_EXHAUSTED ... os_error_code='28'``, raised as a ValueError after absl has
    logged it from each writer thread) ends in one error naming ``where``, an
    ``UnwritableOutput`` where it was the disk, else a ``CheckpointError``; the save's
    temporary directory is removed and its orphaned tasks' tracebacks are not printed."""
    import errno
    import logging

    _silence_orphaned_reads()  # a failing save's callbacks meet its closed loop during the save
    _silence_orphaned_writes()
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # each writer thread logs the failure the save raises
    try:
        yield
    except Exception as err:
        _remove_until_gone(lambda: list(where.parent.glob(f"{where.name}.orbax-checkpoint-tmp*")))
        from pfamalign.outputs import write_error_in_text

        disk = write_error_in_text(str(_innermost(err)), where, (errno.ENOSPC, errno.EDQUOT, errno.EACCES,
                                                                 errno.EROFS))
        if disk is not None:
            raise disk from None
        raise CheckpointError(f"cannot save {where}: {_orbax_failure(err)}") from None
    finally:
        logger.setLevel(level)


def _remove_until_gone(paths, settle: float = 0.2, limit: float = 10.0) -> None:
    """Removes the directories ``paths()`` lists until none is left for ``settle`` seconds
    (at most ``limit``): a failed save's writes still queued in TensorStore's threads can
    create their directories again after the exception, presumably how a single removal left
    the temporary behind in two of three CI runs of the full-disk test (2026-12-01)."""
    import time

    deadline = time.monotonic() + limit
    while True:
        for path in paths():
            shutil.rmtree(path, ignore_errors=True)
        time.sleep(settle)
        if not paths() or time.monotonic() > deadline:
            return


@functools.cache  # one filter for the process
def _silence_orphaned_writes() -> None:
    """A failed orbax save leaves its other write tasks failed and unawaited; asyncio logs
    each as "Task (or _GatheringFuture) exception was never retrieved" with its traceback when
    it is collected. Those of orbax's writes, and only they, are dropped."""
    import logging
    import traceback

    def keep(record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "exception was never retrieved" not in text.split("\n", 1)[0]:
            return True
        if record.exc_info and record.exc_info[1] is not None:
            text += "".join(traceback.format_exception(*record.exc_info))
        return not ("orbax" in text or "OCDBT" in text)

    logging.getLogger("asyncio").addFilter(keep)


@contextlib.contextmanager
def _quiet_absl():
    """Silences absl's warnings while orbax reads parameters: a training checkpoint's
    parameters have no ``_CHECKPOINT_METADATA`` of their own (the step directory has it), and
    orbax says so on every load, which is no news to a user."""
    import logging

    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_model(path: str | os.PathLike, *, impl: str | None = "auto"
               ) -> tuple[Aligner, AlignerConfig]:
    """``(model, config)`` from a model directory, a run directory or a checkpoint step.

    ``impl="auto"`` lets the kernels choose for this host (``kernels.resolve_impl``: the
    Pallas kernels on TPU, the XLA path on CPU, on GPU dense autodiff, the stored-band
    kernels or the XLA path by length and problem; the plan is the same); ``None`` keeps
    the saved implementation; any other value forces it.
    """
    config_path, params_path = resolve_model_path(path)
    config = read_model_config(config_path)
    if impl is not None and impl != config.transport.impl:
        config = dataclasses.replace(
            config, transport=dataclasses.replace(config.transport, impl=impl))
    # restore onto this process's first device, whatever topology saved it
    check_parameter_files(params_path)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    graphdef, abstract = abstract_params(config, sharding=device)
    cached = _params_cache_file(params_path)
    params = _read_cached_params(cached, abstract) if cached is not None else None
    if params is None:
        params = _restore_params(abstract, config_path, params_path,
                                 then=f"; `pfamalign verify {params_path.parent}` checks its files")
        if cached is not None:
            _write_cached_params(cached, params)
    return nnx.merge(graphdef, params), config


def restore_model(config: AlignerConfig, config_path: pathlib.Path, params_path: pathlib.Path) -> Aligner:
    """``config``'s model with the parameters restored from ``params_path`` itself: no
    checksum pass and no parameter cache, read or written (``verify``, which checks the files
    itself and must judge them, not a cached copy of what they once held)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    graphdef, abstract = abstract_params(config, sharding=device)
    return nnx.merge(graphdef, _restore_params(abstract, config_path, params_path))


def _restore_params(abstract: dict, config_path: pathlib.Path, params_path: pathlib.Path, then: str = "") -> dict:
    """The parameters of ``params_path`` (orbax) in the shapes ``abstract`` gives; a
    CheckpointError naming the mismatch or the failure (followed by ``then``, what to do)."""
    try:
        mismatches = param_mismatches(abstract, params_path)
    except DamagedParameters as err:
        raise DamagedParameters(f"{err}{then}") from None
    if mismatches:  # checked first: a failed orbax restore also prints tracebacks at exit
        raise CheckpointError(f"{config_path} does not match the parameters in {params_path} "
                              f"({'; '.join(mismatches[:3])}); restore the config.json saved "
                              "with these parameters")
    try:
        with _quiet_absl():
            params = _local_checkpointer(_ocp()).restore(params_path, abstract)
    except Exception as err:  # orbax raises several types on foreign / truncated data
        raise CheckpointError(f"cannot restore parameters from {params_path}: {_orbax_failure(err)}{then}") from None
    # flipped bits in a value orbax reads without complaint (no checksums to catch them) read
    # as inf or NaN, which the solve then reported as an overflow blamed on eps and the pair
    bad = [name for name, x in _flat_names(params) if not np.isfinite(np.asarray(x)).all()]
    if bad:
        raise DamagedParameters(f"{params_path} is damaged: {', '.join(bad[:3])}"
                                f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''} hold non-finite "
                                f"values (inf or NaN){then}")
    return params


# ---------------------------------------------------------------------------------------------
# The parameter cache: a model's parameters as one .npz in the user's cache directory
# ---------------------------------------------------------------------------------------------
# Importing orbax and restoring through it is about 0.15 s of every ``pfamalign align``; a
# verified model's parameters are copied, once, into ``CACHE/params/<sha256>.npz`` (numpy,
# never pickled), named by the hash of its checksums file -- the parameters' content, checked
# file by file above -- so an edited model never meets another's copy. A copy that does not
# read back exactly as the model's tree (names, shapes, dtypes) is ignored and rewritten.

def _params_cache_file(params_path: pathlib.Path) -> pathlib.Path | None:
    """Where the cached copy of these (checksummed) parameters lives, or None: no cache
    directory, or a model without a checksums file to name them by."""
    from pfamalign.compile_cache import cache_dir

    directory, sums = cache_dir(), params_path.parent / CHECKSUMS
    if directory is None or params_unrecorded(params_path.parent):
        return None
    digest = hashlib.sha256(params_path.name.encode() + b"\0" + sums.read_bytes()).hexdigest()
    return directory / "params" / f"{digest}.npz"


def param_mismatches(abstract: dict, params_path: pathlib.Path) -> list[str]:
    """How the saved parameters (their orbax metadata: names, shapes, dtypes) differ from the
    tree a config asks for (``abstract_params``); empty when they fit. Reads no array.
    DamagedParameters where the directory's own tree listing (``_METADATA``) is missing or
    unreadable, or the metadata cannot be read or lacks names that listing records: a damaged
    store, not a config to blame."""
    jax.devices()  # orbax needs a backend: one that cannot start raises its own error, not a mismatch
    params_path = pathlib.Path(params_path).absolute()
    listed = _listed_names(params_path)
    if not listed:  # orbax then reads an empty tree, and every name would be "missing"
        raise _damaged(params_path, "its _METADATA (orbax's listing of the parameters) is missing, "
                                    "unreadable or empty")
    _silence_orphaned_reads()  # damaged files fail reads in TensorStore's threads, printed as they fail
    _silence_orphaned_writes()  # and their unawaited tasks, logged by asyncio as they are collected
    try:
        with _quiet_absl():  # a checkpoint step's params/ has no metadata file of its own: a warning
            meta = _local_checkpointer(_ocp()).metadata(params_path)
    except ImportError:  # orbax's own libraries failed to load (a ulimit -v too low): not the data
        raise
    except Exception as err:  # orbax raises several types on foreign / truncated data
        raise _damaged(params_path, f"no readable parameter metadata ({_orbax_failure(err)})") from None
    saved = dict(_flat_names(getattr(meta, "item_metadata", meta)))
    unreadable = sorted(listed - set(saved))
    if unreadable:  # a damaged OCDBT tree drops these names from the metadata without an error
        more = f" and {len(unreadable) - 3} more" if len(unreadable) > 3 else ""
        raise _damaged(params_path, f"{', '.join(unreadable[:3])}{more} listed in its _METADATA but unreadable")
    wanted = dict(_flat_names(abstract))
    out = [f"{name} is missing from the parameters" for name in sorted(set(wanted) - set(saved))]
    out += [f"{name} is in the parameters but not in the model" for name in sorted(set(saved) - set(wanted))]
    for name in sorted(set(wanted) & set(saved)):
        have, want = saved[name], wanted[name]
        if tuple(have.shape) != tuple(want.shape) or np.dtype(have.dtype) != np.dtype(want.dtype):
            out.append(f"{name} is {tuple(have.shape)} {np.dtype(have.dtype)} in the parameters, "
                       f"the config asks for {tuple(want.shape)} {np.dtype(want.dtype)}")
    return out


def _damaged(params_path: pathlib.Path, why: str) -> DamagedParameters:
    return DamagedParameters(f"{params_path} is damaged: {why}")


def _listed_names(params_path: pathlib.Path) -> set[str]:
    """The parameter names ``params_path/_METADATA`` (orbax's JSON listing of the tree) holds,
    as ``_flat_names`` spells them; empty when it is missing or not that listing."""
    try:
        tree = json.loads((params_path / "_METADATA").read_text(encoding="utf-8"))["tree_metadata"]
        return {"/".join(str(k["key"]) for k in entry["key_metadata"]) for entry in tree.values()}
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return set()


def _flat_names(tree) -> list[tuple[str, Any]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [("/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path), leaf) for path, leaf in leaves]


def _read_cached_params(path: pathlib.Path, abstract: dict) -> dict | None:
    """The parameters from the cached copy, placed as ``abstract`` says; None unless every
    name, shape and dtype matches."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {name: saved[name] for name in saved.files}
        os.utime(path)  # recently used: the last to be evicted
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    names = _flat_names(abstract)
    if sorted(arrays) != sorted(name for name, _ in names):
        return None
    leaves = []
    for name, struct in names:
        arr = arrays[name]
        if arr.shape != tuple(struct.shape) or arr.dtype != struct.dtype:
            return None
        leaves.append(jax.device_put(arr, struct.sharding))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract), leaves)


def _write_cached_params(path: pathlib.Path, params: dict) -> None:
    """Writes the copy atomically (a temporary file, then a rename) and keeps the newest
    ``PARAMS_CACHE_FILES`` copies (reads refresh a copy's age); a cache that cannot be
    written (read-only, full) is simply not used."""
    from pfamalign.outputs import is_temporary

    data = io.BytesIO()
    np.savez(data, **{name: np.asarray(leaf) for name, leaf in _flat_names(params)})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        records.write_bytes(path, data.getvalue())
        copies = sorted((f for f in path.parent.glob("*.npz") if not is_temporary(f.name)),
                        key=lambda f: f.stat().st_mtime, reverse=True)
        for old in copies[PARAMS_CACHE_FILES:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


PARAMS_CACHE_FILES = 16  # cached parameter copies kept (the most recently used)


def _local_checkpointer(ocp):
    """A checkpointer for this process alone. By default orbax synchronises every process of
    a multi-process run around a restore; a model directory is read by one process (process
    0 finishing a trained model, after the others have left), so the others must not be
    waited for."""
    if jax.process_count() == 1:
        return ocp.StandardCheckpointer()
    me = jax.process_index()
    return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"load_model_{me}"))


# ---------------------------------------------------------------------------------------------
# Training checkpoints
# ---------------------------------------------------------------------------------------------

STEP_METADATA = "_CHECKPOINT_METADATA"  # orbax's, of a checkpoint step: its parts and commit time


def _json_object_or_unreadable(path: pathlib.Path) -> bool:
    """Whether ``path`` holds a JSON object or no JSON at all (orbax passes over the latter)."""
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError, RecursionError):
        return True


def _bookkeeping_problem(step: int, data, meta) -> str | None:
    """What is wrong with a checkpoint's data-iterator state (``data/metadata``: grain's, an
    object) and bookkeeping (``meta/metadata``: its step, examples seen and pending log
    lines), as ``loop`` reads them; None when they fit."""
    whole = lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0  # noqa: E731
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    if not isinstance(data, dict):
        return "data/metadata is not a data-iterator state (a JSON object)"
    if not (isinstance(meta, dict) and whole(meta.get("step"))):
        return "meta/metadata is not a checkpoint's bookkeeping (a JSON object with a whole step)"
    if meta["step"] != step:
        return f"meta/metadata records step {meta['step']} in the directory of step {step}"
    if not whole(meta.get("examples_seen", 0)):
        return "meta/metadata's examples_seen is not a whole number"
    window = meta.get("log_window", [])
    if not (isinstance(window, list) and all(isinstance(r, dict) and all(number(v) for v in r.values())
                                             for r in window)):
        return "meta/metadata's log_window is not a list of metric lines"
    return None


class TrainCheckpoints:
    """orbax ``CheckpointManager`` over ``RUN/checkpoints``: parameters, optimizer state, the
    data-iterator state and bookkeeping, saved together at one step."""

    def __init__(self, directory: str | os.PathLike, *, keep: int = 3):
        ocp = _ocp()
        self.directory = pathlib.Path(directory).absolute()
        # cleanup_tmp_directories: a save killed midway leaves STEP.orbax-checkpoint-tmp*;
        # a resume removes it (the run's lock keeps any other writer out)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=False,
                                               cleanup_tmp_directories=True)
        for meta in sorted(self.directory.glob(f"*/{STEP_METADATA}")) if self.directory.is_dir() else ():
            if meta.parent.name.isdigit() and not _json_object_or_unreadable(meta):
                # orbax reads every step's at once and fails on the first ("Metadata dict must be
                # a dictionary"), naming neither file nor step (unreadable JSON it passes over)
                raise CheckpointError(f"{meta}: not a checkpoint's metadata (a JSON object); remove that step "
                                      "directory to resume from the one before")
        try:
            self._mngr = ocp.CheckpointManager(self.directory, options=options)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise CheckpointError(f"cannot open the checkpoints in {self.directory}: {_orbax_failure(err)}; "
                                  f"`pfamalign verify {self.directory.parent}` checks them") from None

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mngr.all_steps())

    def save(self, step: int, *, params, opt_state, data_state: dict, meta: dict) -> None:
        ocp = _ocp()
        with _orbax_writing(self.directory / str(step)):
            self._mngr.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
                data=ocp.args.JsonSave(data_state), meta=ocp.args.JsonSave(meta)), force=True)
            self._mngr.wait_until_finished()
        if jax.process_index() == 0:
            # the data-iterator state and bookkeeping too: a changed position would resume
            # on other batches without a word
            write_checksums(self.directory / str(step), ("params", "opt_state", "data", "meta", STEP_METADATA))

    def restore(self, step: int, *, params, opt_state) -> tuple[Any, Any, dict, dict]:
        """``(params, opt_state, data_state, meta)``; ``params`` / ``opt_state`` are abstract
        targets (ShapeDtypeStructs with shardings)."""
        ocp = _ocp()
        problems = verify_checksums(self.directory / str(step))
        if problems:
            raise CheckpointError(f"checkpoint {self.directory / str(step)} fails its checksums: "
                                  + "; ".join(problems[:5]) + "; remove that step directory to "
                                  "resume from the one before")
        where = self.directory / str(step)
        damaged = lambda why: CheckpointError(  # noqa: E731
            f"cannot restore checkpoint {where}: {why}; `pfamalign verify {self.directory.parent}` checks "
            "the run; remove that step directory to resume from the one before")
        try:
            mismatches = param_mismatches(params, where / "params")
        except DamagedParameters as err:
            raise damaged(err) from None
        if mismatches:  # checked first: orbax's own error names neither file nor fix
            raise CheckpointError(f"checkpoint {where} does not match the run's config.json "
                                  f"({'; '.join(mismatches[:3])}): config.json was edited or is another "
                                  "run's; restore it from a copy, or give a new --out")
        try:
            with _quiet_absl():
                r = self._mngr.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(params), opt_state=ocp.args.StandardRestore(opt_state),
                    data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
        except Exception as err:  # orbax raises several types on damaged data (no checksums to catch it)
            raise damaged(_orbax_failure(err)) from None
        problem = _bookkeeping_problem(step, r.data, r.meta)
        if problem:  # JSON orbax returns as read: a wrong shape was a KeyError traceback mid-resume
            raise damaged(problem)
        return r.params, r.opt_state, r.data, r.meta

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()
