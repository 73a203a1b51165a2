"""Shared helpers of the validation and benchmark scripts: inputs, timing, compiled memory,
child processes with their peak RSS, and table / JSON-lines output.

Scripts import it as ``import _common`` (they run as ``python scripts/NAME.py``, which puts
``scripts/`` on ``sys.path``). Timings on a shared CPU are noisy: compare configurations
measured in the same run (ratios), never absolute times across runs.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, Sequence

from pfamalign import jsonio

MIB = 1024.0**2


# ---- inputs --------------------------------------------------------------------------------


def make_problem(b: int, h: int, length: int, d: int, dv: int, *, seed: int = 0, signal: float = 1.0,
                 dtype=None):
    """A batch of self-similar pairs: q and k share a latent per position (query i resembles
    key i, like a pair of homologous sequences), so the plan concentrates near the diagonal.

    ``signal`` weighs the shared latent against independent noise (0: unrelated sequences).
    Returns (q, k, v, w): ``[b, h, L, d]`` x2, ``[b, h, L, dv]``, and a fixed output cotangent
    ``w [b, h, L, dv]`` (the loss is ``sum(w * O)``).
    """
    import jax
    import jax.numpy as jnp

    dtype = dtype or jnp.float32
    ks = jax.random.split(jax.random.PRNGKey(seed), 5)
    z = jax.random.normal(ks[0], (b, h, length, d), dtype)
    norm = math.sqrt(1.0 + signal**2)
    q = (signal * z + jax.random.normal(ks[1], z.shape, dtype)) / norm
    k = (signal * z + jax.random.normal(ks[2], z.shape, dtype)) / norm
    v = jax.random.normal(ks[3], (b, h, length, dv), dtype)
    w = jax.random.normal(ks[4], (b, h, length, dv), dtype)
    return q, k, v, w


# ---- timing and compiled memory -----------------------------------------------------------


def block(x):
    import jax

    return jax.block_until_ready(x)


def time_fn(fn: Callable, *args, repeats: int = 3, budget_s: float | None = None) -> dict:
    """Run once (compiling if ``fn`` is not compiled yet; reported as ``first_s``), then the
    min over ``repeats`` runs — fewer (at least one) once ``budget_s`` seconds are spent.
    ``result``: the last run's output."""
    t0 = time.perf_counter()
    block(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        result = block(fn(*args))
        times.append(time.perf_counter() - t0)
        if budget_s is not None and first + sum(times) > budget_s:
            break
    return {"first_s": first, "min_s": min(times), "times_s": times, "result": result}


def time_interleaved(cases: dict, *, repeats: int = 3) -> dict:
    """``{name: (fn, args)}`` -> ``{name: min seconds}``: one warm-up (compile) each, then
    ``repeats`` rounds running every case once per round, so that load changes on a shared
    machine hit all cases alike (ratios between them are the robust figure)."""
    for fn, args in cases.values():
        block(fn(*args))
    best = {name: math.inf for name in cases}
    for _ in range(max(repeats, 1)):
        for name, (fn, args) in cases.items():
            t0 = time.perf_counter()
            block(fn(*args))
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def compile_with_memory(fn: Callable, *args) -> tuple[Callable, dict]:
    """Compile ``fn`` (jitted or not) for ``args`` (arrays or ``jax.ShapeDtypeStruct``s).

    Returns the compiled callable and XLA's own accounting in bytes (temporaries, arguments,
    outputs) plus the compile time ``compile_s``."""
    import jax

    t0 = time.perf_counter()
    lowered = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args)
    compiled = lowered.compile()
    mem = {"compile_s": time.perf_counter() - t0}
    stats = compiled.memory_analysis()
    if stats is not None:
        mem.update(temp_bytes=int(stats.temp_size_in_bytes), argument_bytes=int(stats.argument_size_in_bytes),
                   output_bytes=int(stats.output_size_in_bytes))
    return compiled, mem


def fwd_bwd(transport_fn: Callable):
    """``(q, k, v, w) -> (loss, grads)`` for the loss ``sum(w * O)``, jitted; grads of q, k, v."""
    import jax
    import jax.numpy as jnp

    return jax.jit(jax.value_and_grad(lambda q, k, v, w: jnp.sum(w * transport_fn(q, k, v)), argnums=(0, 1, 2)))


def split_fwd_bwd(transport_fn: Callable):
    """Jitted forward-with-residuals and backward-only functions: ``fwd(q, k, v) -> (O, vjp)``,
    ``bwd(vjp, w) -> grads``: times the backward alone."""
    import jax

    fwd = jax.jit(lambda q, k, v: jax.vjp(transport_fn, q, k, v))
    bwd = jax.jit(lambda vjp, w: vjp(w))
    return fwd, bwd


# ---- child processes ------------------------------------------------------------------------


def run_child(argv: Sequence[str], *, timeout: float) -> dict:
    """Run ``argv`` in a fresh process; return its stdout, exit status, wall time and peak RSS.

    The RSS is the child's ``ru_maxrss`` (``os.wait4``), from interpreter start to exit. Linux
    carries the spawning process's peak across fork and exec into it, so the figure is at
    least this (driver) process's peak: a driver that imported jax sets a floor near 180 MiB.
    A child that can report its own peak (``own_peak_rss_bytes``, the kernel's VmHWM of its
    own address space) should, and the driver use that figure. On timeout the child is killed.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                status = None
                break
            time.sleep(0.05)
        proc.returncode = 0 if status is None else os.waitstatus_to_exitcode(status)  # reaped
        out.seek(0)
        err.seek(0)
        return {"stdout": out.read().decode(), "stderr": err.read().decode()[-4000:],
                "returncode": None if status is None else proc.returncode, "timed_out": status is None,
                "wall_s": time.perf_counter() - t0, "peak_rss_bytes": usage.ru_maxrss * 1024}


def own_peak_rss_bytes() -> int:
    """This process's peak resident memory, its own address space only (``VmHWM``; unlike
    ``ru_maxrss`` it holds nothing of the parent that spawned it). Falls back to ``ru_maxrss``
    where ``/proc`` is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def failure_line(stderr: str) -> str:
    """The line of a failed Python child's stderr that says what went wrong: its last
    ``SomeError: ...`` line (jax appends notes after the traceback), else its last line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b.*", ln)]
    return (errors or lines or ["?"])[-1]


# ---- output --------------------------------------------------------------------------------


def device_name() -> str:
    """The device a benchmark runs on, in words (``jax.devices()[0]``)."""
    import jax

    dev = jax.devices()[0]
    return f"{dev.platform} {dev.device_kind} (x{jax.device_count()})"


def environment() -> dict:
    """Recorded with every JSON line: what ran and how loaded the machine was."""
    import jax

    return {"jax": jax.__version__, "backend": jax.default_backend(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2),
            "xla_flags": os.environ.get("XLA_FLAGS", "")}  # they change what XLA compiles


def add_output_args(parser: argparse.ArgumentParser, *, repeats: int | None = 3) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print JSON lines on stdout (one per row; the table goes to stderr)")
    if repeats is not None:
        parser.add_argument("--repeats", type=positive_int, default=repeats,
                            help=f"timed runs after compilation; the min is reported (default {repeats})")


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if x == 0 or math.isnan(x) or math.isinf(x):
            return str(x)
        if 1 <= abs(x) < 1e6:
            return f"{x:.2f}"
        if 1e-3 <= abs(x) < 1:  # more digits where 4 would round to 1 (e.g. cosines)
            return f"{x:.4g}" if abs(x) < 0.9995 else f"{x:.7f}"
        return f"{x:.3e}"
    if x is None:
        return "-"
    return str(x)


def format_table(rows: Iterable[dict], columns: Sequence[str]) -> str:
    rows = list(rows)
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


class Report:
    """Collects rows; prints JSON lines as rows arrive (with --json) and the table at the end
    (stdout, or stderr with --json so that stdout stays pure JSON lines)."""

    def __init__(self, title: str, columns: Sequence[str], *, json_lines: bool, script: str, config: dict):
        self.title, self.columns, self.json_lines = title, list(columns), json_lines
        self.meta = {"script": script, "config": config, "env": environment()}
        self.rows: list[dict] = []
        self.notes: list[str] = []

    def add(self, **row) -> dict:
        self.rows.append(row)
        if self.json_lines:
            print(jsonio.dumps_line({**row, **self.meta}), flush=True)
        else:  # progress, so that a long run shows life
            print("  " + ", ".join(f"{c}={_fmt(row.get(c))}" for c in self.columns if c in row),
                  file=sys.stderr, flush=True)
        return row

    def note(self, text: str) -> None:
        """A free-text line printed under the table."""
        self.notes.append(text)

    def finish(self) -> None:
        stream = sys.stderr if self.json_lines else sys.stdout
        print(f"\n{self.title}\n{format_table(self.rows, self.columns)}", file=stream)
        for text in self.notes:
            print(text, file=stream)
        stream.flush()


def int_list(text: str) -> list[int]:
    """``"512,1024"`` -> ``[512, 1024]`` (argparse type)."""
    return [int(t) for t in text.replace(" ", "").split(",") if t]


def positive_int(text: str) -> int:
    """An integer of at least 1 (argparse type)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """``"512,1024"`` -> ``[512, 1024]``, each at least 1, at least one (argparse type)."""
    values = int_list(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need one or more integers of at least 1, got {text!r}")
    return values


def existing_path(text: str) -> str:
    """A file or folder that exists (argparse type): a mistyped path is an argument error, not
    a traceback after the imports."""
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"no such file or folder: {text}")
    return text


def shapes_list(parts: int, names: str) -> Callable[[str], list[tuple[int, ...]]]:
    """An argparse type for ``"1x1024x256,2x512x64"``: ``parts`` positive integers joined by
    ``x``, named ``names`` (e.g. "BATCHxLxW") in the error."""
    def parse(text: str) -> list[tuple[int, ...]]:
        try:
            shapes = [tuple(int(x) for x in c.split("x")) for c in text.replace(" ", "").split(",") if c]
        except ValueError:
            shapes = []
        if not shapes or any(len(s) != parts or min(s) < 1 for s in shapes):
            raise argparse.ArgumentTypeError(f"need {names} items of positive integers separated by commas, "
                                             f"got {text!r}")
        return shapes

    return parse


def float_list(text: str) -> list[float]:
    """``"1,0.3"`` -> ``[1.0, 0.3]`` (argparse type)."""
    return [float(t) for t in text.replace(" ", "").split(",") if t]
