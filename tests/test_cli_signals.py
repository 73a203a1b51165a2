"""An interrupted command (Ctrl-C, SIGTERM, SIGHUP) exits 128 + signal, as shells and `train` report
it, keeps the previous output file and leaves no temporary beside it."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupted_batch_exits_128_plus_the_signal_and_leaves_no_temporary(signum, tmp_path):
    rng = random.Random(0)
    residues = lambda: "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(250))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{residues()}\t{residues()}\n" for _ in range(2000)))  # minutes
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    proc = subprocess.Popen([sys.executable, "-m", "pfamalign.cli", "align", "--pairs", str(pairs),
                             "-f", "json", "-o", str(out)], stderr=subprocess.PIPE, text=True,
                            # as from a terminal, whatever this run inherited (nohup ignores SIGHUP,
                            # a shell's background job SIGINT)
                            preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    temporaries = lambda: [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    deadline = time.monotonic() + 120
    while not temporaries() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert temporaries(), "the job wrote no temporary output (finished or failed early)"
    time.sleep(0.3)  # inside the job: the output is being written
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, stderr
    assert f"Interrupted ({signal.Signals(signum).name})" in stderr
    assert "Traceback" not in stderr
    assert out.read_text() == "previous\n"
    assert not temporaries()


def test_an_interrupt_inside_a_compiled_function_is_an_interrupt(monkeypatch):
    """numba turns a Ctrl-C inside a compiled function into a SystemError ("returned a result
    with an exception set") whose context is the KeyboardInterrupt: still exit 130."""
    from click.testing import CliRunner

    from pfamalign import batch
    from pfamalign.cli import main

    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemError("CPUDispatcher(tie_tables) returned a result with an exception set")
        yield

    monkeypatch.setattr(batch, "aligned", interrupted)
    res = CliRunner().invoke(main, ["align", "ACDEFG", "ACDEF", "--max-memory", "0"])
    assert res.exit_code == 130 and "Interrupted (SIGINT)" in res.output, res.output
    monkeypatch.setattr(batch, "aligned", lambda *a, **k: (_ for _ in ()).throw(SystemError("other")))
    res = CliRunner().invoke(main, ["align", "ACDEFG", "ACDEF"])
    assert isinstance(res.exception, SystemError)  # any other SystemError is a bug: not hidden


class _Finalized:
    """Dies with a Ctrl-C Python drops: the handler's raise lands inside this finalizer,
    which runs on the main thread the moment its last reference goes (``del``), where a
    garbage-collector callback (jax's) runs on whichever thread collects, and
    ``gc.collect()`` returns at once while another thread's collection is under way (xdist's
    I/O thread), so staged there it can miss. Both drop the raise through the same
    ``sys.unraisablehook``."""

    def __del__(self):
        import threading

        # to this thread (os.kill may wake another, and the handler then runs whenever): the
        # handler runs in the loop below, inside the finalizer, and its raise is dropped
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        for _ in range(10_000):
            pass


def _watch_dropped(monkeypatch) -> tuple[list, list]:
    """(what Python dropped, what of it was printed): the exception types the command line's
    ``sys.unraisablehook`` (``interrupts._unraisable``) was given, and those it passed on to
    the hook before it (standing in for Python's, which prints them)."""
    from pfamalign import interrupts

    dropped, printed = [], []
    wrap = interrupts._unraisable

    def watched(hook):
        inner = wrap(hook)
        return lambda unraisable: (dropped.append(unraisable.exc_type), inner(unraisable))

    monkeypatch.setattr(interrupts, "_unraisable", watched)
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(unraisable.exc_type))
    return dropped, printed


def test_an_interrupt_python_drops_still_stops_the_command(tmp_path, monkeypatch, foreground_sigint):
    """Python drops an exception raised inside a garbage-collector callback (jax registers
    one) or a finalizer ("Exception ignored in ..."): a Ctrl-C landing there used to vanish,
    the command finishing with exit 0 and its outputs written. The signal is recorded: no
    output is committed, exit 130, and the dropped raise is not printed (a traceback of
    Python's, "Exception ignored in: <function _xla_gc_callback ...>")."""
    from click.testing import CliRunner

    from pfamalign import batch
    from pfamalign.cli import main

    real = batch.aligned

    def aligned(*args, **kwargs):
        dying = _Finalized()
        del dying  # the last reference: the finalizer runs here, on this (the main) thread
        yield from real(*args, **kwargs)

    dropped, printed = _watch_dropped(monkeypatch)
    monkeypatch.setattr(batch, "aligned", aligned)
    out = tmp_path / "out.json"
    res = CliRunner().invoke(main, ["align", "ACDEFG", "ACDEF", "-f", "json", "-o", str(out)])
    assert dropped == [KeyboardInterrupt] and printed == []  # staged as meant; not printed
    assert res.exit_code == 130 and "Interrupted (SIGINT)" in res.output, res.output
    assert not out.exists() and not list(tmp_path.iterdir())
    monkeypatch.undo()
    again = CliRunner().invoke(main, ["align", "ACDEFG", "ACDEF", "-f", "json", "-o", str(out)])
    assert again.exit_code == 0 and out.exists()  # the next command starts afresh


def test_an_output_that_cannot_be_written_is_one_error_line(tmp_path):
    """An OSError of the output (here: a directory squats on the temporary's name) is an
    `Error:` line and exit 1, not a traceback; the previous file stays."""
    from click.testing import CliRunner

    from pfamalign.cli import main
    from pfamalign.outputs import temporary_path

    out = tmp_path / "out.txt"
    out.write_text("previous\n")
    temporary_path(out).mkdir()  # CliRunner runs in this process: the same pid in the name
    res = CliRunner().invoke(main, ["align", "ACDEFG", "ACDEF", "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert f"Error: cannot write {out}: Is a directory" in res.output and "Traceback" not in res.output
    assert out.read_text() == "previous\n"


def test_a_dropped_interrupt_stops_a_batch_at_its_next_step(tmp_path, monkeypatch, foreground_sigint):
    """`search` scores its pairs in chunks; a Ctrl-C Python dropped during the first chunk
    used to let every chunk run (70 s on a Pfam seed, all-vs-all) before the command stopped
    at its output. Each progress step checks for it (``batch_progress``): one chunk runs."""
    from click.testing import CliRunner

    from pfamalign import search
    from pfamalign.alignment import pairhmm_numba
    from pfamalign.cli import main

    real, chunks = pairhmm_numba.log_likelihood_ratios, []

    def scored(*args, **kwargs):
        chunks.append(len(args[1]))
        if len(chunks) == 1:
            _Finalized()  # unreferenced: its finalizer runs at once, here on the main thread
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "SCORE_CHUNK", 2)
    monkeypatch.setattr(pairhmm_numba, "log_likelihood_ratios", scored)
    dropped, printed = _watch_dropped(monkeypatch)
    db = tmp_path / "db.fasta"
    db.write_text("".join(f">s{i}\n{'ACDEFGHIKLMNPQRSTVWY'[i:] + 'MKV' * i}\n" for i in range(12)))
    out = tmp_path / "hits.tsv"
    res = CliRunner().invoke(main, ["search", str(db), str(db), "--decoys", "10", "-o", str(out)])
    assert dropped == [KeyboardInterrupt] and printed == []
    assert res.exit_code == 130 and "Interrupted (SIGINT)" in res.output, res.output
    assert len(chunks) == 1, chunks  # stopped at the first step after the drop
    assert not out.exists() and sorted(tmp_path.iterdir()) == [db]


def test_an_interrupt_after_the_command_is_quiet_and_keeps_its_output(tmp_path):
    """A Ctrl-C while the interpreter shuts down (after the command, in the exit handlers,
    where jax's take a moment) prints no KeyboardInterrupt traceback and costs no output: the
    command's status and its flushed output stand. The interrupt is sent from an exit handler
    registered before the program runs (handlers run last-registered first, so it runs last)."""
    script = ("import atexit, os, signal, sys, time\n"
              "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
              "from pfamalign import cli\n"
              "sys.argv = ['pfamalign', '--version']\n"
              "cli.run()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.returncode == 0, out.stderr
    assert "KeyboardInterrupt" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "version" in out.stdout


def test_a_command_run_in_process_from_a_worker_thread_runs():
    """CliRunner in a thread pool: the command failed with "signal only works in main thread"
    (its interrupt handlers); now it runs without them there, as from the main thread."""
    import concurrent.futures
    import signal as signals

    from click.testing import CliRunner

    from pfamalign.cli import main

    args = ["align", "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE", "MKVLSAGIVGLAQSPDRWKNLSTGYFAE", "-f", "cigar"]
    before = signals.getsignal(signals.SIGINT)
    here = CliRunner().invoke(main, args)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        there = pool.submit(CliRunner().invoke, main, args).result()
    assert here.exit_code == 0 and there.exit_code == 0, there.exception
    assert there.output == here.output and signals.getsignal(signals.SIGINT) is before


def test_a_hook_chained_on_during_a_command_outlives_it(monkeypatch):
    """``handled`` puts back the ``sys.unraisablehook`` it found only where its own is still
    the one in place: a hook chained on meanwhile (checkpoint's silencer of orphaned
    TensorStore reads, installed once per process) was dropped before the exit it is for."""
    from pfamalign import interrupts

    base = lambda unraisable: None  # noqa: E731
    monkeypatch.setattr(sys, "unraisablehook", base)
    with interrupts.handled():
        assert sys.unraisablehook is not base
    assert sys.unraisablehook is base
    with interrupts.handled():
        ours = sys.unraisablehook
        chained = lambda unraisable: ours(unraisable)  # noqa: E731
        sys.unraisablehook = chained
    assert sys.unraisablehook is chained
