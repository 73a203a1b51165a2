"""Test-only entry point: ``python tests/faultkill.py N ARGS...`` runs ``pfamalign ARGS...``
and kills itself with SIGKILL right before the N-th atomic commit (the temporary file is
complete, the rename is not done), exactly as a ``kill -9`` at that instant would. The hook
lives here, not in the package: nothing a user sets can arm it. ``sigterm_at`` interrupts an
in-process training run."""

import os
import signal
import sys


def arm(kill_at: int) -> None:
    from pfamalign.pipelines import records

    count = 0

    def hook(path):
        nonlocal count
        count += 1
        if count >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    records.FAULT_HOOK = hook


def sigterm_at(monkeypatch, step: int) -> None:
    """In-process: the training loop receives SIGTERM while preparing batch ``step``."""
    from pfamalign.training import loop

    prepare = loop._prepare_batch

    def send_sigterm(batch, at):
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return prepare(batch, at)

    monkeypatch.setattr(loop, "_prepare_batch", send_sigterm)


if __name__ == "__main__":
    arm(int(sys.argv[1]))
    from pfamalign.cli import main

    main(sys.argv[2:], prog_name="pfamalign")
