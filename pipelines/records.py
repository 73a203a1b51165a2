"""Record codec, sequence hashing and atomic ArrayRecord I/O shared by every stage.

A record is a flat ``dict`` of JSON scalars (str, int, float, bool, None) and numpy arrays.
On disk it is ``b"PFR1" + uint32 header length + JSON header + raw array bytes``; the header
holds the scalars and, per array, its name, little-endian dtype, shape and byte offset. The
encoding is canonical (sorted keys, fixed dtypes), so equal records give equal bytes: resumed
and uninterrupted runs write byte-identical files. Decoding needs no pickle.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np

from pfamalign import interrupts, jsonio
from pfamalign.outputs import temporary_path, write_error_in_text

MAGIC = b"PFR1"
_HEADER = struct.Struct("<I")

# ArrayRecord options: one record per chunk, so a random read decodes only that record.
# Pair shards and one-hot features use the default codec (zstd); float16 language-model
# embeddings hardly compress (8 % smaller, 5x slower to read) and intermediate work files are
# read back at once, so those are stored uncompressed.
WRITER_OPTIONS = "group_size:1"
UNCOMPRESSED_OPTIONS = "group_size:1,uncompressed"


def seq_hash(residues: str) -> str:
    """The cache key of a residue string: 32 hex chars of BLAKE2b-128 of its ASCII bytes."""
    return hashlib.blake2b(residues.encode("ascii"), digest_size=16).hexdigest()


def encode(record: Mapping[str, object]) -> bytes:
    """Encodes a flat record (JSON scalars and numpy arrays) canonically to bytes."""
    scalars: dict[str, object] = {}
    arrays: list[list[object]] = []
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(record):
        value = record[name]
        if isinstance(value, np.ndarray):
            arr = np.ascontiguousarray(value)
            dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
            arr = arr.astype(dtype, copy=False)
            blob = arr.tobytes()
            arrays.append([name, dtype.str, list(arr.shape), offset, len(blob)])
            blobs.append(blob)
            offset += len(blob)
        elif isinstance(value, np.generic):
            scalars[name] = value.item()
        elif value is None or isinstance(value, (str, int, float, bool)):
            scalars[name] = value
        else:
            raise TypeError(f"record field {name!r} has unsupported type {type(value).__name__}")
    header = json.dumps({"a": arrays, "s": scalars}, sort_keys=True, separators=(",", ":"))
    head = header.encode("utf-8")
    return b"".join([MAGIC, _HEADER.pack(len(head)), head, *blobs])


def decode(data: bytes) -> dict[str, object]:
    """Decodes bytes written by :func:`encode` (arrays are read-only views of ``data``)."""
    if data[:4] != MAGIC:
        raise ValueError(f"not a pfamalign record (magic {data[:4]!r}, expected {MAGIC!r})")
    try:
        (n,) = _HEADER.unpack_from(data, 4)
        start = 8 + n
        header = json.loads(data[8:start].decode("utf-8"))
        out: dict[str, object] = dict(header["s"])
        for name, dtype, shape, offset, nbytes in header["a"]:
            arr = np.frombuffer(data, dtype=np.dtype(dtype),
                                count=nbytes // np.dtype(dtype).itemsize, offset=start + offset)
            out[name] = arr.reshape(shape)
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"damaged pfamalign record ({type(err).__name__}: {err})") from None
    return out


# ------------------------------------------------------------------------------------------
# Files: every committed file is written to a temporary name, fsynced and renamed, so a file
# that exists under its final name is complete (a kill -9 leaves at most a temporary file
# behind: ``pfamalign.outputs.temporary_path``, matched by ``TEMPORARY_GLOB``).
# ------------------------------------------------------------------------------------------

def _fsync(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: pathlib.Path, path: pathlib.Path) -> None:
    """Makes ``tmp`` durable and renames it to ``path`` (atomic on POSIX filesystems); not
    after a Ctrl-C that a library swallowed (``pfamalign.interrupts``)."""
    interrupts.check()
    _fsync(tmp)
    _fault_point(path)
    os.replace(tmp, path)


def write_array_record(path: os.PathLike, records: Iterable[bytes], *,
                       options: str = WRITER_OPTIONS) -> int:
    """Atomically writes encoded records to an ArrayRecord file; returns how many."""
    from array_record.python.array_record_module import ArrayRecordWriter

    path = pathlib.Path(path)
    tmp = temporary_path(path)
    writer = ArrayRecordWriter(str(tmp), options)
    n = 0
    try:
        try:
            for rec in records:
                writer.write(rec)
                n += 1
        finally:
            writer.close()
    except RuntimeError as err:  # ArrayRecord's C++ writer reports a failed write(2) as text
        tmp.unlink(missing_ok=True)
        raise _system_error(err, path) from err
    except BaseException:  # a failing producer (an embedder error mid-part) leaves no temporary
        tmp.unlink(missing_ok=True)
        raise
    commit(tmp, path)
    return n


_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EROFS, errno.EIO)


def _system_error(err: RuntimeError, path: pathlib.Path) -> Exception:
    """ArrayRecord's ``RuntimeError("write() failed: No space left on device; ...")`` as the
    OSError it stands for (``UnwritableOutput``, naming ``path``: a command ends in one line
    saying what to do); any other RuntimeError unchanged."""
    return write_error_in_text(str(err), path, _WRITE_ERRNOS) or err


def read_array_record(path: os.PathLike) -> Iterator[bytes]:
    """Yields the raw records of one ArrayRecord file in order."""
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path))
    try:
        n = reader.num_records()
        step = 256
        for start in range(0, n, step):
            yield from reader.read(list(range(start, min(n, start + step))))
    finally:
        reader.close()


def array_records(files: list[str]):
    """Random access to the records of ArrayRecord ``files`` (``source[i]``: bytes; ``len``):
    array_record's own source, which grain's subclass wraps (and imports jax for)."""
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    return ArrayRecordDataSource(files)


def count_array_record(path: os.PathLike) -> int:
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path))
    try:
        return reader.num_records()
    finally:
        reader.close()


def write_bytes(path: os.PathLike, data: bytes) -> None:
    """Atomically writes a file (a failed write leaves no temporary file behind)."""
    path = pathlib.Path(path)
    tmp = temporary_path(path)
    try:
        tmp.write_bytes(data)
        commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: os.PathLike, text: str) -> None:
    """Atomically writes a text file."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: os.PathLike, obj: object, *, indent: int = 1) -> None:
    """Atomically writes ``obj`` as JSON with sorted keys and a final newline (pfamalign's one
    JSON policy: ``pfamalign.jsonio``). ``indent``: 1 for the dataset's files (manifest,
    work files), 2 for a model or run directory's (``config.json``, whose bytes the model's
    content hash reads, ``decoding.json``, ...)."""
    write_text(path, jsonio.dumps(obj, indent=indent, sort_keys=True) + "\n")


def stays_inside(name) -> bool:
    """Whether a file name recorded in a manifest or a checksums table is a relative path that
    stays inside its directory (no absolute path, no ``..``): what a handed-over one may name."""
    relative = pathlib.PurePosixPath(name) if isinstance(name, str) else None
    return relative is not None and bool(relative.parts) and not relative.is_absolute() and ".." not in relative.parts


def file_sha256(path: os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------
# Test seam: the resume tests set ``FAULT_HOOK`` (tests/faultkill.py) to kill the process right
# before a commit's rename. Production code never sets it, and no environment variable does,
# so a variable in a user's shell cannot trigger a kill.
# ------------------------------------------------------------------------------------------

FAULT_HOOK: Callable[[pathlib.Path], None] | None = None


def _fault_point(path: pathlib.Path) -> None:
    if FAULT_HOOK is not None:
        FAULT_HOOK(path)
