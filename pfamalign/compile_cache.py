"""The persistent compilation caches of the command line (XLA's, and numba's beside it), and a
count of compilations.

Every ``pfamalign`` process would otherwise recompile the model's plan and the pair-HMM for
each padded shape (about two seconds per shape on a laptop CPU). With the cache, the second
run of a command loads the executables from disk.

Where: ``$PFAMALIGN_CACHE_DIR`` if set (an empty value turns the cache off), else the user's
cache directory (``$XDG_CACHE_HOME/pfamalign``, ``~/.cache/pfamalign``; ``~/Library/Caches``
on macOS), in a subdirectory per jax version. Concurrent processes: jax writes an entry with a
plain file write, so a reader could see a half-written one; a size limit turns on jax's own
file lock around every read and write (and evicts least-recently-used entries beyond it).

This module imports no jax at import time: ``enable`` configures jax through its environment
variables when jax is not loaded yet (``pfamalign --help`` must stay jax-free).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import sys

ENV = "PFAMALIGN_CACHE_DIR"
MAX_BYTES = 2 << 30  # 2 GiB: a bound on the directory, and what turns on jax's file lock

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # every executable built or loaded
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


def cache_dir() -> pathlib.Path | None:
    """The compilation cache directory, or None when ``$PFAMALIGN_CACHE_DIR`` is empty, there
    is no home directory to put it in, or the directory is not private (``_others_can_write``)
    or cannot be written (``_unwritable``)."""
    override = os.environ.get(ENV)
    if override is not None:
        directory = pathlib.Path(override).expanduser() if override.strip() else None
    elif os.environ.get("XDG_CACHE_HOME") and sys.platform != "darwin":
        directory = pathlib.Path(os.environ["XDG_CACHE_HOME"]) / "pfamalign"
    else:
        try:
            home = pathlib.Path.home()
        except (RuntimeError, KeyError):  # no $HOME and no passwd entry: a container's arbitrary uid
            _warn_once(f"Warning: no home directory to keep the compile cache in, so it is off; set {ENV} "
                       "to a directory of your own to keep compiled programs between runs")
            return None
        directory = home / "Library" / "Caches" / "pfamalign" if sys.platform == "darwin" else \
            home / ".cache" / "pfamalign"
    if directory is not None and (why := _others_can_write(directory)):
        _warn_once(f"Warning: the cache directory {directory} {why}: what it holds runs as this "
                   "process (compiled code, and numba's pickled kernels), so it is not used; "
                   f"make it private (chmod -R go-w), or set {ENV} to a directory of your own")
        return None
    if directory is not None and (why := _unwritable(directory)):
        _warn_once(f"Warning: the cache directory {directory} {why}, so the compile cache is off; "
                   f"set {ENV} to a directory you can write")
        return None
    return directory


@functools.lru_cache(maxsize=None)
def _unwritable(directory: pathlib.Path) -> str | None:
    """Why this process could not keep its cache in ``directory``, or None; checked on the
    folder it is, or would be made in (nothing is made here: a cache that is off leaves no
    trace). jax would still read an unwritable cache, warning on each entry, and its size lock
    needs write access even to read."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot be made ({existing} is not a folder)"
    if not os.access(existing, os.W_OK | os.X_OK):
        return "is not writable" if existing == directory else f"cannot be made ({existing} is not writable)"
    return None


@functools.lru_cache(maxsize=None)
def _others_can_write(directory: pathlib.Path) -> str | None:
    """Why another user could put files into the cache (``directory`` or a folder in it: the
    executables and pickles live in those) -- owned by another user, or writable by others or
    by a group another user is in -- or None: a shared cache would run their code in every
    user's job. Checked once a process per directory."""
    if not hasattr(os, "getuid"):  # Windows: no such modes
        return None
    for folder, _, _ in os.walk(directory):  # nothing when it is not made yet (it will be ours)
        try:
            info = os.stat(folder)
        except OSError:  # gone meanwhile, or unreadable (the cache then fails on its own)
            continue
        where = "" if folder == str(directory) else f" (its folder {os.path.relpath(folder, directory)})"
        if info.st_uid != os.getuid():
            return f"belongs to another user{where}"
        if info.st_mode & 0o002 or (info.st_mode & 0o020 and _shared_group(info.st_gid)):
            return f"is writable by other users{where}"
    return None


def _shared_group(gid: int) -> bool:
    """Whether group ``gid`` may hold another user: anything but this user's private group
    (named after the user, no other member listed, no other user's primary group), which a
    umask of 002 makes every new directory writable by."""
    import grp
    import pwd

    try:
        me, group = pwd.getpwuid(os.getuid()), grp.getgrgid(gid)
    except KeyError:  # a group or user the system cannot name
        return True
    if group.gr_name != me.pw_name or any(member != me.pw_name for member in group.gr_mem):
        return True
    return any(user.pw_gid == gid and user.pw_uid != me.pw_uid for user in pwd.getpwall())


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    print(message, file=sys.stderr)


def _settings(directory: pathlib.Path) -> dict[str, object]:
    return {"jax_compilation_cache_dir": str(directory / f"xla-jax{_jax_version()}"),
            "jax_persistent_cache_min_compile_time_secs": 0,  # every shape: each costs seconds here
            "jax_persistent_cache_min_entry_size_bytes": -1,
            "jax_compilation_cache_max_size": MAX_BYTES}


def enable() -> pathlib.Path | None:
    """Turns the persistent cache on for this process (and its children); returns its
    directory, or None when turned off. Call before the first compilation. numba's kernels
    (``alignment.pairhmm_numba``) are cached under the same directory unless
    ``$NUMBA_CACHE_DIR`` says otherwise (numba writes each entry to a temporary file and
    renames it: safe for concurrent processes; it keys entries by the kernel's source)."""
    directory = cache_dir()
    if directory is None:
        return None
    if not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = str(directory / "numba")  # read when numba is imported
        if "numba" in sys.modules:
            sys.modules["numba"].config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
    settings = _settings(directory)
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)  # read by jax when it is imported
    if "jax" in sys.modules:  # already imported: its configuration is set
        import jax

        for name, value in settings.items():
            jax.config.update(name, value)
    return pathlib.Path(settings["jax_compilation_cache_dir"])


def enable_unless_configured() -> pathlib.Path | None:
    """``enable`` for the Python API, unless this process gave jax a compilation cache of its
    own (``$JAX_COMPILATION_CACHE_DIR`` or ``jax.config``), which it keeps. It takes effect
    only before the process's first jax compilation, when jax decides whether it has a cache.
    Returns the directory turned on, or None."""
    configured = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if "jax" in sys.modules:
        configured = configured or sys.modules["jax"].config.jax_compilation_cache_dir
    return None if configured else enable()


class CompileCounter:
    """Counts the executables jax builds (``compiled``) or loads from the persistent cache
    (``cached``) while it is registered; ``pfamalign align --verbose`` prints it."""

    def __init__(self):
        import jax

        self.executables = self.cached = 0  # every one built or loaded; of those, loaded
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        self.executables += event == _BACKEND_COMPILE

    def _on_event(self, event: str, **kwargs) -> None:
        self.cached += event == _CACHE_HIT

    @property
    def compiled(self) -> int:
        return self.executables - self.cached

    def close(self) -> None:
        from jax._src import monitoring  # the public module has no unregister

        monitoring.unregister_event_duration_listener(self._on_duration)
        monitoring.unregister_event_listener(self._on_event)


# ---- exported programs ----------------------------------------------------------------------
# A persistent cache entry saves the compilation, not the tracing and lowering before it (a
# few hundred ms of a short command). ``jax.export`` saves those too: a program exported once
# is deserialized and called. Each is named by what determines it (the caller's key) and
# ``_build_tag`` (backend, jax's version, the package source), under ``CACHE/programs/``.

def program_path(*parts: str) -> pathlib.Path | None:
    """Where the exported program named ``parts`` (directories, then the file stem) lives for
    this backend, jax and package source (``_build_tag``), or None when the cache is off."""
    directory = cache_dir()
    if directory is None:
        return None
    *dirs, stem = parts
    return directory.joinpath("programs", *dirs, f"{stem}.{_build_tag()}.jaxexport")


@functools.lru_cache(maxsize=None)
def _build_tag() -> str:
    """What an exported program depends on besides its name: the backend it was lowered for,
    jax's version, and this package's source (a hash of every module: an edited or upgraded
    pfamalign never runs a program that older code exported)."""
    import importlib.util

    import jax

    # the three packages' own directories: in an editable install kernels/ and pipelines/
    # are not inside pfamalign/
    roots = [pathlib.Path(location) for package in ("pfamalign", "pfamalign.kernels", "pfamalign.pipelines")
             for location in importlib.util.find_spec(package).submodule_search_locations]
    return f"{jax.default_backend()}-jax{_jax_version()}-src{source_digest(*roots)}"


def source_digest(*roots: pathlib.Path) -> str:
    """A short hash of the names and bytes of every Python module under each of ``roots``."""
    import hashlib

    digest = hashlib.sha256()
    for root in roots:
        for module in sorted(root.rglob("*.py")):
            name = f"{root.name}/{module.relative_to(root).as_posix()}"
            digest.update(name.encode() + b"\0" + module.read_bytes())
    return digest.hexdigest()[:12]


def _evict_other_builds(path: pathlib.Path) -> None:
    """Removes the files of the program at ``path`` that another jax or source exported for
    this backend (they would never be read again)."""
    stem, tag = path.name.split(".", 1)
    backend = tag.split("-", 1)[0]
    for old in path.parent.glob(f"{stem}.{backend}-*.jaxexport"):
        if old != path:
            old.unlink(missing_ok=True)


def exported_program(path: pathlib.Path, export):
    """The program at ``path`` (``jax.export.Exported``), or ``export()``'s serialized program,
    written there atomically first; a file that does not deserialize, or whose bytes are not
    those written (``_sealed``), is exported again. None when jax.export cannot serialize
    here (it needs flatbuffers): the caller traces instead."""
    import jax

    try:
        program = jax.export.deserialize(bytearray(_unsealed(path.read_bytes())))
        with contextlib.suppress(OSError):  # used: its model's programs are the newest kept
            os.utime(path.parent)
        return program
    except Exception:  # noqa: BLE001 -- none yet, or a damaged or foreign file: export it
        pass
    try:
        blob = export()
        program = jax.export.deserialize(bytearray(blob))
    except ImportError:
        return None
    from pfamalign.pipelines import records

    try:  # an unwritable cache is not used
        path.parent.mkdir(parents=True, exist_ok=True)
        records.write_bytes(path, _sealed(blob))
        _evict_other_builds(path)
        _evict_other_models(path)
    except OSError:
        pass
    return program


_SEAL = b"\npfamalign-sha256:"


def _sealed(blob: bytes) -> bytes:
    """``blob`` and its SHA-256: a program's parameters are baked into its bytes, and a
    flipped byte there deserializes and runs, giving wrong plans without an error."""
    import hashlib

    return blob + _SEAL + hashlib.sha256(blob).hexdigest().encode()


def _unsealed(data: bytes) -> bytes:
    """The blob of ``_sealed`` bytes; ValueError where the digest does not match (a damaged
    file, or one written before the seal)."""
    import hashlib

    blob, seal, digest = data.rpartition(_SEAL)
    if not seal or hashlib.sha256(blob).hexdigest().encode() != digest:
        raise ValueError("not the bytes written: damaged")
    return blob


PROGRAM_DIRS = 16  # models whose exported programs are kept (the most recently used)


def _evict_other_models(path: pathlib.Path) -> None:
    """Keeps the ``PROGRAM_DIRS`` most recently used models' program directories under
    ``CACHE/programs/`` (each holds about 2 MB a padded length, its parameters baked in):
    a sweep over many models would otherwise leave every one's programs behind."""
    import shutil

    root = cache_dir()
    if root is None or path.parent.parent != root / "programs":
        return
    models = sorted((d for d in path.parent.parent.iterdir() if d.is_dir()),
                    key=lambda d: d.stat().st_mtime, reverse=True)
    for old in models[PROGRAM_DIRS:]:
        if old != path.parent:
            shutil.rmtree(old, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def _jax_version() -> str:
    from importlib.metadata import version

    return version("jax")


def standard_rules(fn):
    """``fn`` run under jax's standard numpy promotion rules, whatever the process set: a
    caller's ``jax_numpy_dtype_promotion="strict"`` or ``jax_numpy_rank_promotion="raise"``
    failed the model's and the pair-HMM's programs as they were traced (and only when not
    cached: an exported program ran). The rules are per thread, so each function a worker
    thread runs carries them too."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        import jax

        with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
            return fn(*args, **kwargs)

    return run
