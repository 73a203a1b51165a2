"""An interrupted command (Ctrl-C, SIGTERM) exits 128 + signal, as shells and `train` report
it, keeps the previous output file and leaves no temporary beside it."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_batch_exits_128_plus_the_signal_and_leaves_no_temporary(signum, tmp_path):
    rng = random.Random(0)
    residues = lambda: "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(250))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{residues()}\t{residues()}\n" for _ in range(2000)))  # minutes
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    proc = subprocess.Popen([sys.executable, "-m", "pfamalign.cli", "align", "--pairs", str(pairs),
                             "-f", "json", "-o", str(out)], stderr=subprocess.PIPE, text=True)
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
