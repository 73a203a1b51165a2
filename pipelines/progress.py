"""Progress bars (rich; silent when stderr is not a TTY or ``CI`` is set, where a batch job may
ask for occasional plain lines instead) and the summary table."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator


# Without bars, ``Bars(lines=True)`` prints a task's progress as a plain line at most this often
# (a log, a pipe, CI): a task that ends sooner prints none.
LINE_SECONDS = 10.0


def progress_enabled(quiet: bool = False) -> bool:
    return not quiet and sys.stderr.isatty() and not os.environ.get("CI")


class Bars:
    """A thin wrapper over ``rich.progress.Progress``: ``bars.task(desc, total)`` returns an
    ``advance(n=1)`` callable; ``bars.set(task, completed)`` moves a bar to a position.
    ``lines``: where the bars are not enabled, ``task`` reports by plain lines on standard
    error instead (``_Lines``)."""

    def __init__(self, enabled: bool, *, lines: bool = False):
        self.enabled = enabled
        self.lines = lines and not enabled
        self._line_tasks: list[_Lines] = []
        self._progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      TimeRemainingColumn(), console=Console(stderr=True),
                                      transient=False)

    def __enter__(self) -> Bars:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
        if exc_type is None:
            for task in self._line_tasks:
                task.finish()

    def task(self, description: str, total: float | None) -> Callable[[float], None]:
        if self._progress is None:
            if self.lines:
                self._line_tasks.append(_Lines(description, total))
                return self._line_tasks[-1].advance
            return lambda n=1: None
        tid = self._progress.add_task(description, total=total)
        return lambda n=1: self._progress.advance(tid, n)

    def setter(self, description: str, total: float | None) -> Callable[[float], None]:
        if self._progress is None:
            return lambda completed: None
        tid = self._progress.add_task(description, total=total)
        return lambda completed: self._progress.update(tid, completed=completed)


class _Lines:
    """A task's progress as plain lines on standard error, ``description: done/total (percent),
    elapsed, time left``: at most one every ``LINE_SECONDS``, and a last one at the end of a
    task that printed any."""

    def __init__(self, description: str, total: float | None):
        self.description, self.total = description, total
        self.completed = 0
        self.start = self.last = time.monotonic()
        self.shown = None  # ``completed`` at the last line printed

    def advance(self, n: float = 1) -> None:
        self.completed += n
        if time.monotonic() - self.last >= LINE_SECONDS:
            self.show()

    def finish(self) -> None:
        if self.shown is not None and self.shown != self.completed:
            self.show()

    def show(self) -> None:
        self.last, self.shown = time.monotonic(), self.completed
        elapsed = self.last - self.start
        done = _fmt(self.completed)
        left = ""
        if self.total:
            done += f"/{_fmt(self.total)} ({min(self.completed / self.total, 1):.0%})"
            if 0 < self.completed < self.total:
                left = f", about {_clock(elapsed * (self.total - self.completed) / self.completed)} left"
        print(f"{self.description}: {done}, {_clock(elapsed)} elapsed{left}", file=sys.stderr,
              flush=True)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@contextlib.contextmanager
def bars(enabled: bool) -> Iterator[Bars]:
    with Bars(enabled) as b:
        yield b


def _fmt(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def render_summary(summary: dict, console=None) -> None:
    """Prints the end-of-run summary: totals, per-split sizes, skipped items and why."""
    from rich.table import Table

    from pfamalign.outputs import table_console
    from pfamalign.pipelines.splits import SPLITS

    console = console or table_console()
    totals = Table(title=f"pfamalign prepare: {summary['out']}", show_header=True)
    totals.add_column("item")
    totals.add_column("count", justify="right")
    totals.add_column("detail")
    fam = summary["families"]
    seq = summary["sequences"]
    totals.add_row("families read", _fmt(fam["read"]), "")
    totals.add_row("families used", _fmt(fam["used"]), "with at least one pair")
    totals.add_row("sequences in families", _fmt(seq["total"]), "")
    totals.add_row("sequences used", _fmt(seq["used_unique"]), "unique residue strings in pairs")
    emb = summary["embeddings"]
    detail = f"{emb['embedder']} (D={emb['dim']}, {emb['dtype']}); {_fmt(emb['reused'])} " \
             "already on disk"
    if emb.get("from_cache"):
        detail += f", {_fmt(emb['from_cache'])} copied from --reuse-embeddings"
    totals.add_row("sequences embedded this run", _fmt(emb["computed_this_run"]), detail)
    totals.add_row("pairs", _fmt(summary["pairs"]["total"]), "")
    totals.add_row("residues embedded", _fmt(summary["residues"]["embedded"]), "in the dataset")
    console.print(totals)

    splits = Table(title="splits", show_header=True)
    for col in ("split", "families", "pairs", "pair residues"):
        splits.add_column(col, justify="right" if col != "split" else "left")
    order = {name: n for n, name in enumerate(SPLITS)}  # train, val, test: a reread manifest is sorted
    for name, s in sorted(summary["splits"].items(), key=lambda item: order.get(item[0], len(order))):
        splits.add_row(name, _fmt(s["families"]), _fmt(s["pairs"]), _fmt(s["residues"]))
    console.print(splits)

    skipped = summary["skipped"]
    if any(skipped.values()):
        table = Table(title="skipped", show_header=True)
        table.add_column("what")
        table.add_column("reason")
        table.add_column("count", justify="right")
        for what in ("families", "sequences", "pair candidates"):
            for reason, n in skipped.get(what, {}).items():
                table.add_row(what, reason, _fmt(n))
        console.print(table)
    for err in summary.get("errors", [])[:20]:
        console.print(f"[yellow]skipped:[/yellow] {err}", highlight=False)
    if len(summary.get("errors", [])) > 20:
        console.print(f"... and {len(summary['errors']) - 20} more (see families.tsv)")
    for note in summary.get("notes", []):
        console.print(f"note: {note}", highlight=False)
