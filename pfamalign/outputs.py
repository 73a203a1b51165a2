"""Where every command's output goes: standard output, or a file written atomically.

``open_output(path, inputs=...)`` is the one way a command writes a user-named file: the text
goes to a temporary file in the target directory and is renamed into place only when the
block ends without an error, so an interrupted or failed run leaves the previous file (or
none) and never a truncated one. An output path that names one of the command's inputs is
refused before anything is opened (``align --pairs f.tsv -o f.tsv`` would otherwise truncate
its own input), and a missing parent directory is a clear error, not a traceback. An output
path that is a symbolic link is written through: the link's target is replaced, the link kept.
A path ending in ``.gz`` is written gzip-compressed.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import glob
import gzip
import io
import os
import pathlib
import shutil
import sys
from typing import IO, Iterable, Iterator

from pfamalign import interrupts


class OutputError(ValueError):
    """An output path that cannot be written as asked (the message says how to fix it)."""


class UnwritableOutput(OSError):
    """The system refused to create or rename an atomic write's temporary file, or to write
    to the output (a full disk): the message names the output the user gave (the temporary
    is an implementation detail) and what to do.
    An OSError, as any other failure to write: a command ends in one ``Error:`` line."""

    def __init__(self, path: pathlib.Path, err: OSError, made: str | None):
        advice = _ADVICE.get(err.errno)
        super().__init__(f"cannot write {path}: {err.strerror or err}" + (f" (creating {made})" if made else "")
                         + (f"; {advice}" if advice else ""))


_WRITE_ELSEWHERE = "write the output to a directory where you can create files"
_ADVICE = {errno.EACCES: _WRITE_ELSEWHERE, errno.EPERM: _WRITE_ELSEWHERE, errno.EROFS: _WRITE_ELSEWHERE,
           errno.ENOENT: _WRITE_ELSEWHERE,  # /proc, /sys: directories no file can be made in
           errno.ENOSPC: "free some space or write the output elsewhere",
           errno.EDQUOT: "free some space or write the output elsewhere"}


@contextlib.contextmanager
def _named_as(path: pathlib.Path, tmp: pathlib.Path, kind: str = "file") -> Iterator[None]:
    """Re-raises an OSError about the temporary ``tmp`` (creating, renaming it) as
    ``UnwritableOutput`` naming ``path``; any other error passes unchanged."""
    try:
        yield
    except shutil.Error as err:  # copytree's list of (source, destination, why) failures
        failure = _copy_failure(err, tmp)
        if failure is None:
            raise
        raise UnwritableOutput(path, failure, None) from err
    except OSError as err:
        named = [os.path.abspath(f) for f in (err.filename, err.filename2)
                 if isinstance(f, (str, os.PathLike))]
        if not named and err.errno in _FULL:  # a write error carries no file name: this one's
            raise UnwritableOutput(path, err, None) from err
        if os.path.abspath(tmp) not in named:
            raise
        raise UnwritableOutput(path, err, f"a {kind} in {tmp.parent}") from err


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # errors of writing, not of naming a file


def write_error_in_text(text: str, path: os.PathLike, codes: Iterable[int]) -> UnwritableOutput | None:
    """The write error a library reported only as text (copytree's ``[Errno 28] ...``,
    TensorStore's ``os_error_code='28'``, ArrayRecord's bare "No space left on device") as an
    ``UnwritableOutput`` naming ``path``, when its errno is one of ``codes``; else None."""
    code = _errno_in_text(text, codes)
    return None if code is None else UnwritableOutput(pathlib.Path(path), OSError(code, os.strerror(code)), None)


def _errno_in_text(text: str, codes: Iterable[int]) -> int | None:
    import re

    found = re.search(r"\[Errno (\d+)\]|os_error_code='(\d+)'", text)
    named = [int(found[1] or found[2])] if found else [c for c in codes if os.strerror(c) in text]
    return next((c for c in named if c in codes), None)


def _copy_failure(err: shutil.Error, tmp: pathlib.Path) -> OSError | None:
    """The first failure of a ``shutil.copytree`` into ``tmp`` that ``_ADVICE`` knows (a full
    disk, a denied write) as an OSError; None when there is none (the raw list then stands)."""
    entries = err.args[0] if err.args and isinstance(err.args[0], list) else []
    for entry in entries:
        if len(entry) == 3 and inside(entry[1], tmp) and (code := _errno_in_text(str(entry[2]), _ADVICE)):
            return OSError(code, os.strerror(code))
    return None


def _unnamed_write_error(err: OSError) -> bool:
    """A write error that names no file: a full disk met by a buffered write's flush."""
    return err.errno in _FULL and err.filename is None and not isinstance(err, UnwritableOutput)


def naming(err: OSError, path: os.PathLike) -> OSError:
    """A write error that names no file as ``UnwritableOutput`` naming ``path``, the output
    the command was writing; any other error unchanged."""
    return UnwritableOutput(pathlib.Path(path), err, None) if _unnamed_write_error(err) else err


def describe(err: OSError) -> str:
    """An OSError as one line for the user: a write error that names no file (the standard
    output on a full disk, ``> /dev/full``) says what could not be written and what to do."""
    if _unnamed_write_error(err):
        return f"cannot write the output: {err.strerror}; {_ADVICE.get(err.errno, 'write the output elsewhere')}"
    return str(err)


def same_file(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Whether two paths name one file (after links; False when either cannot be resolved)."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def inside(path: os.PathLike, directory: os.PathLike) -> bool:
    """Whether ``path`` lies below ``directory`` (after links)."""
    return pathlib.Path(directory).resolve() in pathlib.Path(path).resolve().parents


def shipped_assets() -> pathlib.Path:
    """The package's ``assets`` directory (the shipped models): an input of every command."""
    import importlib.resources

    return pathlib.Path(str(importlib.resources.files("pfamalign") / "assets"))


def check_output_path(path: os.PathLike, inputs: Iterable[os.PathLike | None] = ()) -> pathlib.Path:
    """``path`` as a Path after the checks every output gets: it is not one of ``inputs`` and
    replaces no file inside one that is a directory (a dataset, a model: a new file there is
    fine), its directory exists, and it is not a directory itself."""
    if str(path).endswith(("/", os.sep)):  # pathlib would drop the slash and write a file
        raise OutputError(f"output {path} names a directory; give a file name")
    path = pathlib.Path(path)
    for source in (*inputs, shipped_assets()):  # the shipped models are read by every default run
        if source is None or str(source) == "-":
            continue
        source = pathlib.Path(source)
        if same_file(path, source):
            raise OutputError(f"output {path} is also an input; write the output to another file")
        if path.exists() and source.is_dir() and inside(path, source):
            raise OutputError(f"output {path} would replace a file of the input directory {source} "
                              f"(a dataset's, a model's); write the output elsewhere")
    if path.is_dir():
        raise OutputError(f"output {path} is a directory; give a file name")
    _check_parent(path)
    return path


def check_output_directory(path: os.PathLike) -> pathlib.Path:
    """An output directory about to be built beside its place (``staged_directory``): its
    parent exists and can take it. Checked before the work, not found after it."""
    path = pathlib.Path(path)
    _check_parent(path)
    return path


def _check_parent(path: pathlib.Path) -> None:
    if not path.parent.is_dir():
        blocker = next((d for d in path.parents if d.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise OutputError(f"output {path}: {blocker} is a file, not a directory; write the "
                              f"output elsewhere")
        raise OutputError(f"output directory {path.parent} does not exist; create it first "
                          f"(mkdir -p {path.parent})")
    # an atomic write creates its temporary beside the output (a device or a FIFO is written
    # in place): found now, not after the work (access() reports a read-only file system to root too)
    if not (path.exists() and not path.is_file()) and not os.access(path.parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: its directory {path.parent} is not writable (a read-only "
                          f"file system, or no permission); {_WRITE_ELSEWHERE}")


# Every temporary name starts with "." and holds ".tmp": ``temporary_path``'s
# ``.STEM.PID.tmp.SUFFIX`` (files and ``staged_directory``'s directories), the pipelines' fixed
# ``.NAME.tmp`` and older runs' ``.NAME.PID.tmp``; what cleans or reports stray temporaries
# matches this pattern.
TEMPORARY_GLOB = ".*.tmp*"


def temporary_path(path: pathlib.Path) -> pathlib.Path:
    """The temporary name beside ``path`` that an atomic write fills before the rename (every
    atomic write's, the pipelines' too); it keeps the suffix, from which plotting libraries
    take the image format."""
    return path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")


def is_temporary(name: str) -> bool:
    """Whether a file name is a temporary one (``TEMPORARY_GLOB``)."""
    return fnmatch.fnmatchcase(name, TEMPORARY_GLOB)


@contextlib.contextmanager
def atomic_path(path: os.PathLike, inputs: Iterable[os.PathLike | None] = ()) -> Iterator[pathlib.Path]:
    """Yields a temporary path to write (by any library: a plot, an archive); renames it onto
    ``path`` when the block succeeds, removes it when it fails. A symbolic link is resolved
    first, so the rename replaces its target and the link stays; an existing file keeps its
    permissions. A path that exists and is not a regular file (``/dev/null``, a FIFO,
    ``/dev/stdout``) is yielded itself: written in place, never replaced."""
    path = given = check_output_path(path, inputs)
    if path.exists() and not path.is_file():  # a device, a FIFO, /dev/stdout: written in place
        with _named_as(given, path):  # (a rename would put a regular file where /dev/null was)
            yield path
        return
    if path.is_symlink():
        path = pathlib.Path(os.path.realpath(path))
        check_output_path(path)  # a dangling link's target directory may be missing
    tmp = temporary_path(path)
    try:
        with _named_as(given, tmp):  # the error names the user's path, not the temporary
            yield tmp
            interrupts.check()  # a Ctrl-C a library swallowed midway: the output is not whole
            if not tmp.exists():  # not a success: what was written is gone
                raise UnwritableOutput(given, OSError(None, VANISHED), None)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            if path.exists():  # the file replaced keeps its permissions
                shutil.copymode(path, tmp)
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):  # e.g. a read-only file system: its own error stands
            tmp.unlink(missing_ok=True)


VANISHED = ("the file being written vanished (its directory was removed or moved, or the "
            "temporary file deleted); nothing was saved: run the command again")


def _remove_dead_stages(out: pathlib.Path) -> None:
    """Removes the staged directories for ``out`` that a killed process left (``kill -9``: no
    ``finally`` ran); one whose process still runs (another build, or a pid reused) is kept."""
    prefix, suffix = f".{out.stem}.", f".tmp{out.suffix}"
    for stage in out.parent.glob(f"{glob.escape(prefix)}*{glob.escape(suffix)}"):
        pid = stage.name[len(prefix):len(stage.name) - len(suffix)]
        if stage.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stage, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): alive
        return True
    return True


@contextlib.contextmanager
def staged_directory(out: os.PathLike, *, replace: bool = False) -> Iterator[pathlib.Path]:
    """Yields an empty directory beside ``out``, under a temporary name (``temporary_path``, so
    what reports strays sees one left by a killed process), to fill; renames it onto ``out``
    when the block succeeds and removes it when it fails: an output directory is never half
    written. ``replace``: an existing ``out`` is swapped out (else the rename fails on it)."""
    out = pathlib.Path(out)
    work = temporary_path(out)
    shutil.rmtree(work, ignore_errors=True)
    _remove_dead_stages(out)
    with _named_as(out, work, "directory"):
        work.mkdir(parents=True)
    old = work.with_name(work.name + ".old")
    try:
        with _named_as(out, work, "directory"):
            yield work
            interrupts.check()
            if replace and out.exists():
                os.replace(out, old)
            os.replace(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def table_console(stderr: bool = False):
    """A rich console for a command's tables: the terminal's width on a terminal, else 150
    columns (into a file or a pipe, ``$COLUMNS`` or rich's 80 would wrap them or elide their
    numbers)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream is not None and stream.isatty() else 150)


@contextlib.contextmanager
def open_output(path: os.PathLike | None, inputs: Iterable[os.PathLike | None] = (), *,
                mode: str = "w") -> Iterator[IO]:
    """A text sink: standard output when ``path`` is None or ``-``, else an atomic file. A
    closed standard output (``>&-``: Python's ``sys.stdout`` is None) is an OSError naming the
    way out."""
    if path is None or str(path) == "-":
        if sys.stdout is None:
            raise OSError("standard output is closed: write to a file with -o FILE, or redirect it (> FILE)")
        yield sys.stdout if "b" not in mode else sys.stdout.buffer
        return
    with atomic_path(path, inputs) as tmp:
        # a file name that is not UTF-8 (held as surrogate escapes: BLAST7's "# Database:") is
        # written as its own bytes, not refused after the work
        text = {"encoding": "utf-8", "errors": "surrogateescape"}
        if pathlib.Path(path).suffix != ".gz":
            with open(tmp, mode, **({} if "b" in mode else text)) as sink:
                yield sink
            return
        # -o hits.m8.gz: gzip, as every input may be (mtime 0: the same output, the same bytes)
        with open(tmp, mode.replace("t", "").replace("b", "") + "b") as raw, \
                gzip.GzipFile(pathlib.Path(path).name, "wb", fileobj=raw, mtime=0) as packed:  # named x.fa
            if "b" in mode:
                yield packed
            else:
                with io.TextIOWrapper(packed, **text) as sink:
                    yield sink
