"""Test-session setup: 8 simulated CPU devices, the --full flag for slow cases, and worker
processes where pytest-xdist is installed."""

import gc
import os
import pathlib
import signal

# Must happen before JAX starts its backend: every test sees 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("CI", os.environ.get("CI", ""))
os.environ.setdefault("PFAMALIGN_CACHE_DIR", "")  # in-process CLI runs: no persistent compile cache

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "pfam"


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the cases marked slow, with XLA's default (full) optimization")


QUICK_COMPILE = "--xla_backend_optimization_level=0"


def _gpu_run(config) -> bool:
    """Whether this run selects the compiled GPU kernels (``-m gpu``)."""
    return "gpu" in (config.option.markexpr or "")


def pytest_configure(config):
    """The fast subset compiles XLA programs without LLVM's optimization passes: most of a
    case's time is compiling programs it runs once on tiny inputs (the default subset took
    17 min with them, 10.5 min without, on 2 cores). The same HLO, the same fusions and the
    same transcendental functions (exp, log: the same ulp errors); only float32 summation
    orders can differ, which every tolerance here must absorb anyway. ``--full``, a GPU run
    (``-m gpu``) and an ``XLA_FLAGS`` that sets the level itself keep XLA's default. Set here,
    before any test starts JAX's backend, and inherited by the commands tests start."""
    flags = os.environ.get("XLA_FLAGS", "")
    if config.getoption("--full") or _gpu_run(config) or "xla_backend_optimization_level" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {QUICK_COMPILE}".strip()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Run on worker processes (``-n auto``: up to MAX_WORKERS) unless told otherwise (``-n 0``:
    one process), when pytest-xdist (the test extra) is installed: most of a case's time is
    single-threaded XLA compilation, so two workers on two cores take about 2/3 of the time.
    A GPU run (``-m gpu``) stays in one process: each would claim most of the GPU's memory."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return  # no xdist, or this is a worker (its numprocesses is None too)
    if config.option.numprocesses is not None:
        return
    if _gpu_run(config) or config.option.usepdb:
        return
    config.option.numprocesses = "auto"
    if config.option.dist == "no":
        config.option.dist = "loadfile"  # a module's cases share its fixtures and compiled programs
    if config.option.maxworkerrestart is None:
        # A worker that dies (a segfault in a native library) ends the run at once, naming the
        # test it ran: pytest-xdist 3.8's loadfile scheduler re-queues a dead worker's finished
        # files as empty work, and the run can then wait forever with every worker idle.
        config.option.maxworkerrestart = "0"


MAX_WORKERS = 4  # each worker holds its own 8 CPU devices and compiled programs (1-3 GB)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown without it
def pytest_xdist_auto_num_workers(config):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(MAX_WORKERS, cores)


# XLA's CPU backend maps each compiled executable's code and data as a few memory mappings of
# its own, held while jax's caches hold the executable. Linux refuses a process more than
# vm.max_map_count (65,530 by default) mappings, and a compile that then cannot map its code
# segfaults or aborts the worker: it did so at 99 % of two CI runs (a worker peaked at 59,000
# mappings by the suite's end). Between modules, a worker past this many drops its compiled
# programs (peak 25,400 since).
MAX_MAPPINGS = 16_000


def _mappings() -> int:
    """This process's memory mappings (0 where /proc is not there to count them)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:
        return 0


@pytest.hookimpl(trylast=True)  # after the module's fixtures are torn down: theirs go too
def pytest_runtest_teardown(item, nextitem):
    """At the end of a module, a worker holding MAX_MAPPINGS or more drops jax's caches."""
    if (nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None)) \
            and _mappings() >= MAX_MAPPINGS:
        jax.clear_caches()
        gc.collect()  # executables in reference cycles (traced closures) are freed only by a collection


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="slow: run with --full")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def foreground_sigint():
    """Python's own SIGINT handler in place, as in a shell's foreground job, for a test that
    delivers a Ctrl-C in this process: a background job (``pytest ... &``, ``nohup``) starts
    with SIGINT ignored, Python keeps it so, and so does the command line (``interrupts``)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def small_disk(tmp_path):
    """An empty 64 KiB file system (tmpfs): writes there meet a full disk. Root only: the test
    skips where mount is not allowed."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


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
