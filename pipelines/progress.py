"""Progress bars (rich; silent when stderr is not a TTY or ``CI`` is set) and the summary table."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator


def progress_enabled(quiet: bool = False) -> bool:
    return not quiet and sys.stderr.isatty() and not os.environ.get("CI")


class Bars:
    """A thin wrapper over ``rich.progress.Progress``: ``bars.task(desc, total)`` returns an
    ``advance(n=1)`` callable; ``bars.set(task, completed)`` moves a bar to a position."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
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

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def task(self, description: str, total: float | None) -> Callable[[float], None]:
        if self._progress is None:
            return lambda n=1: None
        tid = self._progress.add_task(description, total=total)
        return lambda n=1: self._progress.advance(tid, n)

    def setter(self, description: str, total: float | None) -> Callable[[float], None]:
        if self._progress is None:
            return lambda completed: None
        tid = self._progress.add_task(description, total=total)
        return lambda completed: self._progress.update(tid, completed=completed)


@contextlib.contextmanager
def bars(enabled: bool) -> Iterator[Bars]:
    with Bars(enabled) as b:
        yield b


def _fmt(n) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n)


def render_summary(summary: dict, console=None) -> None:
    """Prints the end-of-run summary: totals, per-split sizes, skipped items and why."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
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
    totals.add_row("embedded this run", _fmt(emb["computed_this_run"]), detail)
    totals.add_row("pairs", _fmt(summary["pairs"]["total"]), "")
    totals.add_row("residues embedded", _fmt(summary["residues"]["embedded"]), "")
    console.print(totals)

    splits = Table(title="splits", show_header=True)
    for col in ("split", "families", "pairs", "pair residues"):
        splits.add_column(col, justify="right" if col != "split" else "left")
    for name, s in summary["splits"].items():
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
