"""The ``pfamalign`` command line: one click group, one module per command family."""

from __future__ import annotations

import importlib
import signal

import click

# (module under pfamalign.commands, attribute) of each command; imported lazily so that
# `pfamalign --help` stays fast and a command's heavy imports load only when it runs.
_COMMANDS = {
    "prepare": ("prepare", "prepare"),
    "train": ("train", "train"),
    "align": ("align", "align"),
    "search": ("search", "search"),
    "eval": ("evaluate", "evaluate"),
    "barycenter": ("barycenter", "barycenter"),
    "certify": ("certify", "certify"),
    "compile": ("compile", "compile_model"),
    "ensemble": ("ensemble", "ensemble"),
    "verify": ("verify", "verify"),
}


def _interrupt(err: BaseException) -> KeyboardInterrupt | None:
    """The interrupt behind ``err``: itself, or one that a compiled (numba) function turned
    into a SystemError ("returned a result with an exception set")."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _interrupted(ctx, signum: int, notes=()) -> None:
    hint = "".join(f" {note}" for note in notes)  # e.g. how to resume
    click.echo(f"\nInterrupted ({signal.Signals(signum).name}).{hint}", err=True)
    ctx.exit(128 + signum)


def _unstartable_backend() -> str | None:
    """What to tell a user whose jax cannot start its backend, or None when it can (the error
    was another): ``JAX_PLATFORMS`` naming a backend this machine lacks (jax raised a
    traceback naming another, "rocm" for "gpu", or a bare assertion for "cuda"), or
    ``XLA_FLAGS`` asking for no simulated CPU devices (0 or fewer: jax's traceback ends in
    "Could not determine process_index" or "vector::reserve", with advice to set
    ``JAX_PLATFORMS=cpu``, which does not help)."""
    import os
    import re

    platforms = os.environ.get("JAX_PLATFORMS")
    counts = re.findall(r"--xla_force_host_platform_device_count=(\S*)", os.environ.get("XLA_FLAGS", ""))
    count = counts[-1].strip("'\"").removeprefix("+") if counts else None  # XLA reads the last, "8" or +8 too
    no_devices = count is not None and not (count.isascii() and count.isdigit() and int(count) >= 1)
    if not platforms and not no_devices:
        return None
    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as err:
        detail = str(err).splitlines()[0] if str(err) else "no backend"
        if no_devices:
            return (f"XLA_FLAGS sets --xla_force_host_platform_device_count={counts[-1]} and jax cannot start "
                    f"({detail}): the number of simulated CPU devices must be a whole number of at least 1; "
                    "fix it, or take it out of XLA_FLAGS")
        return (f"JAX_PLATFORMS={platforms} names a backend jax cannot start on this machine ({detail}): "
                "unset JAX_PLATFORMS, or set it to one this machine has (cpu)")
    return None


def _out_of_memory(err: BaseException) -> str | None:
    """What to tell a user whose command ran out of memory (numpy's MemoryError, XLA's
    RESOURCE_EXHAUSTED, a shared library that could not be mapped), or None for any other error."""
    unmappable = isinstance(err, (ImportError, OSError)) and any(
        sign in str(err) for sign in ("failed to map segment", "Cannot allocate memory"))  # a library's load
    if isinstance(err, MemoryError) or unmappable or "RESOURCE_EXHAUSTED: Out of memory" in str(err):
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"out of memory ({detail}): the work needed more memory than this process could get "
                "(the machine's, its container's limit or its ulimit -v); split long sequences into "
                "domains, or give the process more memory")
    return None


def _too_deep(err: BaseException) -> str | None:
    """What to tell a user whose input was nested too deeply to read (json's RecursionError on
    a crafted or damaged settings file: ``[[[[...]]]]``), or None for any other error."""
    if isinstance(err, RecursionError):
        return (f"a file was nested too deeply to read ({err}): a JSON file handed over with the data or "
                "the model (manifest.json, config.json, decoding.json, ...) is damaged or crafted; "
                "`pfamalign verify DIRECTORY` checks one against its checksums")
    return None


def _ended_early(err: EOFError) -> str:
    """What to tell a user whose command met a file that ended early (click prints a bare
    "Aborted!" for an EOFError): the inputs say so themselves, so most likely a truncated
    compiled module (``marshal data too short``), pfamalign's or a library's: named by the
    import that read it (its ``bytecode_path``), else pfamalign's folder."""
    import os

    tb, pyc = err.__traceback__, None
    while tb is not None:
        pyc = tb.tb_frame.f_locals.get("bytecode_path", pyc)
        tb = tb.tb_next
    where = pyc if isinstance(pyc, str) else f"a __pycache__/*.pyc under {os.path.dirname(os.path.abspath(__file__))}"
    return (f"a file ended before its end ({err or 'EOFError'}): most likely a truncated compiled module "
            f"({where}); delete it (or its __pycache__ folder), or reinstall the package it belongs to")


class _LazyGroup(click.Group):
    def invoke(self, ctx):
        """Runs the command; an interrupt exits 128 + signal, as shells and `train` report it
        (click would print "Aborted!" and exit 1), also one that a garbage-collector callback
        swallowed (the command ran on: ``interrupts``) or that surfaced as another error."""
        from pfamalign import interrupts, outputs

        try:
            with interrupts.handled():
                result = super().invoke(ctx)
            if interrupts.received() is not None:  # swallowed: the command ran on (and wrote nothing)
                _interrupted(ctx, interrupts.received())
            return result
        except (KeyboardInterrupt, SystemError) as err:
            interrupt = _interrupt(err)
            if interrupt is None:
                raise
            signum = interrupt.signum if isinstance(interrupt, interrupts.Terminated) else signal.SIGINT
            _interrupted(ctx, signum, getattr(interrupt, "__notes__", ()))
        except click.exceptions.Exit:  # a command's (or our own) chosen exit status
            raise
        except (RuntimeError, AssertionError) as err:  # XLA's errors are RuntimeErrors
            reason = _unstartable_backend() or _out_of_memory(err) or _too_deep(err)
            if reason is None:
                raise
            click.echo(f"Error: {reason}", err=True)
            ctx.exit(1)
        except BrokenPipeError:  # `pfamalign search ... | head`: the reader has what it wanted
            import os
            import sys

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
            ctx.exit(128 + signal.SIGPIPE)  # as a shell reports a process that SIGPIPE ended
        except (SystemExit, Exception) as err:
            failed = not (isinstance(err, SystemExit) and err.code in (0, None))
            if failed and interrupts.received() is not None:  # an error the signal caused (a library
                _interrupted(ctx, interrupts.received())        # cut midway): the signal is the news
            if failed and (reason := _out_of_memory(err)) is not None:
                click.echo(f"Error: {reason}", err=True)
                ctx.exit(1)
            if isinstance(err, EOFError):
                click.echo(f"Error: {_ended_early(err)}", err=True)
                ctx.exit(1)
            if not isinstance(err, OSError):
                raise
            click.echo(f"Error: {outputs.describe(err)}", err=True)  # a full disk, a read-only file
            ctx.exit(1)                                                # system, a gone directory

    def list_commands(self, ctx):
        return sorted(_COMMANDS)

    def get_command(self, ctx, name):
        if name not in _COMMANDS:
            return None
        module, attr = _COMMANDS[name]
        return getattr(importlib.import_module(f"pfamalign.commands.{module}"), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pfamalign")
def main():
    """Protein pairwise alignment with a differentiable banded Sinkhorn transport aligner.

    \b
    Typical use:
      pfamalign prepare shards --pfam Pfam-A.seed.gz --out data/         # build a dataset
      pfamalign train --data data/ --config align_ce --out runs/align_ce # train an aligner
      pfamalign align SEQ_A SEQ_B                                        # align two sequences
      pfamalign search query.fasta db.fasta                              # rank hits, E-values
      pfamalign compile --data data/ -o compiled/                        # compiled plan (--engine asap)

    \b
    Compiled XLA programs are cached in the user's cache directory (~/.cache/pfamalign),
    so only a command's first run compiles; PFAMALIGN_CACHE_DIR=DIR moves the cache,
    PFAMALIGN_CACHE_DIR= (empty) turns it off.
    """
    import sys

    from pfamalign import compile_cache

    for stream in (sys.stdout, sys.stderr):
        # an encoding that cannot hold every character (PYTHONIOENCODING=latin-1, an ASCII
        # locale outside Python's UTF-8 mode) prints escapes, not a traceback halfway through the
        # output; -o files are UTF-8 whatever the locale
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    compile_cache.enable()  # jax-free: configures jax before a command imports it
    # flax.nnx imports IPython (about 0.2 s of every model-loading command) only to ask whether
    # it runs inside an IPython shell, which a command never does: None in sys.modules makes
    # that import fail at once (flax catches the ImportError). Inside IPython it is loaded.
    sys.modules.setdefault("IPython", None)


def run():
    """The ``pfamalign`` program: ``main``, then the interpreter's teardown (jax's exit handlers
    take a moment) with interrupts ignored. The command has finished by then: a Ctrl-C in that
    moment printed a KeyboardInterrupt traceback from an exit handler, and ending the process
    there could cut the final flush of its output."""
    try:
        main()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    run()
