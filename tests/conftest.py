"""Test-session setup: 8 simulated CPU devices, the --full flag for slow cases."""

import os
import pathlib

# Must happen before JAX starts its backend: every test sees 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("CI", os.environ.get("CI", ""))
os.environ.setdefault("PFAMALIGN_CACHE_DIR", "")  # in-process CLI runs: no persistent compile cache

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "pfam"


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", help="also run the cases marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="slow: run with --full")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_pfam():
    """The shared real Pfam data directory, or skip when this machine does not have it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared Pfam data not found at {SHARED_DATA}")
    return SHARED_DATA


def make_seed_dataset(out: pathlib.Path, *, pairs_per_family: int, max_len: int,
                      split_fractions: tuple[float, float, float], seed: int) -> pathlib.Path:
    """A small dataset of the repository's Pfam seed fixtures on builtin features."""
    from pfamalign.pipelines.config import PrepareConfig
    from pfamalign.pipelines.pairs import SamplingConfig
    from pfamalign.pipelines.prepare import run_prepare

    fixtures = pathlib.Path(__file__).resolve().parent / "data" / "pfam_seed"
    run_prepare(PrepareConfig(inputs=(str(fixtures),), out=str(out), embedder="builtin/onehot+blosum62",
                              sampling=SamplingConfig(pairs_per_family=pairs_per_family, max_len=max_len),
                              split_fractions=split_fractions, seed=seed), quiet=True)
    return out


@pytest.fixture(scope="session")
def seed_dataset(tmp_path_factory):
    """Every split non-empty; shared read-only by the command tests."""
    return make_seed_dataset(tmp_path_factory.mktemp("seed_data") / "ds", pairs_per_family=6,
                             max_len=160, split_fractions=(0.4, 0.2, 0.4), seed=1)
