"""Instant answers: help and argument errors load no jax (a subprocess, so this test
process's own jax import cannot hide one)."""

import subprocess
import sys

import pytest

_PROBE = """
import sys
from pfamalign.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("JAX_LOADED" if "jax" in sys.modules else "JAX_FREE", file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["align", "--help"],
    ["train", "--help"],
    ["eval", "--help"],
    ["align"],  # usage error: no sequences
    ["align", "--decoder", "nope", "AAA", "CCC"],  # bad option value
    ["eval"],  # usage error: no data
    ["train", "--config", "nope"],
])
def test_help_and_usage_errors_import_no_jax(argv):
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.stderr.strip().splitlines()[-1] == "JAX_FREE", proc.stderr


_LOADED = """
import sys
from pfamalign.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
import flax.nnx  # what a model-loading command imports
print("IPYTHON_LOADED" if sys.modules.get("IPython") else "IPYTHON_FREE", file=sys.stderr)
"""


def test_a_command_does_not_import_ipython_through_flax():
    proc = subprocess.run([sys.executable, "-c", _LOADED, "align", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.stderr.strip().splitlines()[-1] == "IPYTHON_FREE", proc.stderr
