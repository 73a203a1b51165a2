"""Instant answers: help and argument errors load no jax (a subprocess, so this test
process's own jax import cannot hide one)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository: the shipped model's path

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


def test_verifying_a_dataset_imports_no_jax(seed_dataset):
    """A dataset's checksums are files and digests: ``verify`` imported jax and flax for them
    (through the model checkpoints' module), about a third of its time."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, "verify", str(seed_dataset)], capture_output=True,
                          text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert "problem" not in proc.stderr and lines[-1] == "JAX_FREE", proc.stderr
    assert f"checked dataset {seed_dataset}" in proc.stdout and "ok: everything with a checksum" in proc.stdout


def test_the_command_list_gives_each_command_a_whole_summary():
    """``pfamalign --help`` cut each command's first docstring sentence at 45 characters
    ("Align SEQ_A with SEQ_B (residue strings or FASTA files; -..."): each has its own."""
    from click.testing import CliRunner

    from pfamalign.cli import _COMMANDS, main

    lines = CliRunner().invoke(main, ["--help"], terminal_width=120).output.split("Commands:")[1].strip().splitlines()
    assert [line.split()[0] for line in lines] == sorted(_COMMANDS)
    assert not [line for line in lines if line.rstrip().endswith("...")], lines


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


@pytest.mark.parametrize("platforms", ["gpu", "cuda"])
@pytest.mark.parametrize("command", [["align", "MKVL", "MKVLL"], ["verify", "pfamalign/assets/default_model"]])
def test_a_backend_this_machine_lacks_is_one_error_line(platforms, command):
    """``JAX_PLATFORMS=gpu`` on a machine without one: a 64-line traceback ending in jax's
    "Unable to initialize backend 'rocm'" (a backend the user never named), and for "cuda" a
    bare AssertionError. Now one line that names the variable and the way out. ``verify``
    called the shipped model damaged ("config.json does not match the parameters")."""
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("this machine has an accelerator")
    res = subprocess.run([sys.executable, "-m", "pfamalign.cli", *command], capture_output=True, cwd=ROOT,
                         text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": platforms})
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"Error: JAX_PLATFORMS={platforms} names a backend jax cannot start") \
        and res.stderr.count("\n") == 1, res.stderr


@pytest.mark.parametrize("count", ["0", "-2"])
def test_no_simulated_cpu_devices_is_one_error_line_naming_xla_flags(count):
    """``--xla_force_host_platform_device_count=0`` (or negative): a 70-line traceback, or with
    ``JAX_PLATFORMS=cpu`` an error blaming that variable, whose advice was to set it to cpu."""
    for extra in ({}, {"JAX_PLATFORMS": "cpu"}):
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}", **extra}
        res = subprocess.run([sys.executable, "-m", "pfamalign.cli", "align", "MKVL", "MKVLL"], capture_output=True,
                             cwd=ROOT, text=True, timeout=300, env=env)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.startswith(f"Error: XLA_FLAGS sets --xla_force_host_platform_device_count={count}") \
            and res.stderr.count("\n") == 1, res.stderr
