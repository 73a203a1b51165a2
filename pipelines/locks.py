"""One writer per output directory: an exclusive lock that a second run meets with a message
naming the holder.

``directory_lock(out, "prepare")`` takes ``flock`` on ``out/.pfamalign.lock`` (created, and
kept: removing it would let a third run lock a different file; only a run that fails removes
the one it created, so that a refused directory is left as the user had it). The kernel drops the lock
when its process ends, however it ends, so a killed run never leaves a stale lock; the file
holds the holder's pid, host, start time and command for the message. ``flock`` is per host:
on shared storage written from several hosts (NFS) it does not exclude the other hosts.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import pathlib
import socket
import sys
from collections.abc import Iterator

LOCK_NAME = ".pfamalign.lock"


class LockError(RuntimeError):
    """The directory is in use by another run (the message names it)."""


@contextlib.contextmanager
def directory_lock(directory: os.PathLike, what: str) -> Iterator[pathlib.Path]:
    """Holds the exclusive lock of ``directory`` (created if missing) for the block. A block
    that fails removes the lock file it created (a run refused an existing directory of the
    user's leaves nothing in it), and a directory it created if nothing else was written."""
    directory = pathlib.Path(directory)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    made_lock = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            raise LockError(f"{directory} is in use by another {what} run ({holder}); wait for "
                            "it to finish or stop it, or use another directory") from None
        started = datetime.datetime.now().isoformat(timespec="seconds")
        holder = f"{_this_process()}, started {started}: {' '.join(sys.argv)[:300]}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode("utf-8", "replace"), 0)
        try:
            yield path
        except Exception:
            if made_lock:
                path.unlink()
                if created and not any(directory.iterdir()):  # failed before writing anything
                    directory.rmdir()
            raise
        finally:
            os.ftruncate(fd, 0)  # an empty lock file: nobody holds it
    finally:
        os.close(fd)  # releases the lock


def holder(directory: os.PathLike) -> str | None:
    """Who holds the lock of ``directory`` now (the pid, host, start and command it recorded),
    or None when nobody does (no lock file, or a lock its holder's end released)."""
    try:
        fd = os.open(pathlib.Path(directory) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:  # a shared probe: refused while an exclusive holder lives
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
        return None
    finally:
        os.close(fd)  # releases the probe


def names_this_process(record: str) -> bool:
    """Whether a lock record (``holder``'s answer) names this process as the holder."""
    return record.startswith(f"{_this_process()},")


def _this_process() -> str:
    """How a lock record names its holder (``directory_lock`` writes it, ``names_this_process``
    reads it)."""
    return f"pid {os.getpid()} on {socket.gethostname()}"
