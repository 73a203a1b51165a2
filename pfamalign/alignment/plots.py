"""Figures of a transport plan (matplotlib, Agg canvas; pyplot and its global state are never
touched, so this is safe in servers and tests).

* ``plot_plan``: plan heatmap (query rows down, key columns across, residues numbered from 1
  as in every text output) with the row and column marginals beside it, each decoded pair
  marked on its cell (a line through them would draw gaps as pairs) and, optionally, the
  reference pairs and the dustbin masses in the marginals. Beyond ``BAND_ABOVE`` residues the
  full matrix would shrink the plan to a one-pixel line, so the heatmap shows the band around
  the decoded path in its own coordinates (query row down, key offset from the path across),
  and says how much of the plan's mass the band holds.

Every writer saves in the format its file extension names (``.png``, ``.svg``, ``.pdf``, ...;
``figure_format``), or ``fmt`` when given (an atomic writer's temporary name has none), through
``save_figure`` (SVG text as text, PDF fonts as TrueType).
* ``plot_barycenter``: the qualitative picture of a plan, barycenter ``b_i`` against the
  target key ``c_i`` per query row, with the diagonal reference.
"""

from __future__ import annotations

import pathlib

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pfamalign.alignment.metrics import barycenters, plan_metrics
from pfamalign.alignment.pairs import check_pairs, check_target, diagonal_target


def _check_plan2d(plan) -> np.ndarray:
    arr = np.asarray(plan, dtype=np.float64)
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"plan must be a non-empty [Lq, Lk] (pick one head), got {arr.shape}")
    return arr


def figure_format(path) -> str:
    """The figure format a file name asks for (its extension, lower case; ``png`` without
    one); a ValueError names the supported ones."""
    suffix = pathlib.Path(path).suffix.lower().lstrip(".")
    fmt = suffix or "png"
    supported = FigureCanvasAgg(Figure()).get_supported_filetypes()
    supported.pop("pgf", None)  # needs a LaTeX installation, and would fail after all the work
    if fmt not in supported:
        raise ValueError(f"cannot write a figure as .{fmt}; name the file with one of "
                         f"{', '.join('.' + k for k in sorted(supported))}")
    return fmt


def save_figure(fig: Figure, path, dpi: int, fmt: str | None = None) -> pathlib.Path:
    """Writes ``fig`` in ``fmt`` (default: ``figure_format(path)``); every figure of the
    package is saved here. Text stays text in an SVG (searchable, editable) and a PDF embeds
    TrueType fonts (journals refuse matplotlib's default Type 3)."""
    import matplotlib

    path = pathlib.Path(path)
    fmt = fmt or figure_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    with matplotlib.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42, "ps.fonttype": 42}):
        if fmt == "svgz":  # matplotlib's gzip header names the file written: an atomic write's
            import gzip    # temporary, which `gunzip -N` would restore
            import io

            svg = io.BytesIO()
            fig.savefig(svg, dpi=dpi, format="svg", bbox_inches="tight", pad_inches=0.15)
            with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
                out.write(svg.getvalue())
        else:
            fig.savefig(path, dpi=dpi, format=fmt, bbox_inches="tight", pad_inches=0.15)  # no label cut off
    return path


def integer_ticks(axis) -> None:
    """Ticks of ``axis`` (an ``ax.xaxis`` / ``ax.yaxis``) on whole numbers only: residue
    numbers, blocks, steps are never 2.5."""
    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def residue_label(name: str) -> str:
    """An axis of residue numbers: whose, and that they count from 1 (as every text output)."""
    return f"{name} residue (1-based)"


def _plan_norm(plan: np.ndarray, log_scale: bool):
    """``(values shown, norm, colour bar label)``: a square-root scale from 0 (a plan's weak
    alternatives stay visible beside its peaks), or log10 with ``log_scale``."""
    from matplotlib.colors import PowerNorm

    if log_scale:
        return np.log10(plan + 1e-12), None, "plan mass, log10 $P_{ij}$"
    return plan, PowerNorm(0.5, vmin=0.0, vmax=_finite_max(plan)), \
        "plan mass $P_{ij}$ (square-root scale)"


def _finite_max(values) -> float:
    """The largest finite value, at least 1e-12 (an axis or colour scale needs a positive
    finite top, whatever a plan holds: zeros, or NaN where a solve failed)."""
    top = np.nanmax(np.where(np.isfinite(values), values, np.nan)) if np.isfinite(values).any() else 0.0
    return max(float(top), 1e-12)


def _cell_points(ax, n_rows: int, n_cols: int) -> float:
    """The side, in points, of the smaller edge of one heatmap cell of ``ax``."""
    box = ax.get_position()
    width, height = ax.figure.get_size_inches()
    return 72 * min(box.width * width / n_cols, box.height * height / n_rows)


def _pair_marks(ax, rows, cols, cell_points: float, *, color: str, label: str) -> None:
    """Aligned pairs, the cell's colour left visible around them: hollow squares a cell wide
    on large cells, a dot 0.7 of a cell wide on small ones, and on cells too small for a
    visible dot (below 2 points: from about 160 residues) a thin
    half-transparent line through each run of consecutive pairs (never across a gap: that
    would draw the gap as pairs), single pairs as dots."""
    if not len(rows):
        return
    if cell_points >= 6:
        ax.scatter(cols, rows, marker="s", s=min(cell_points, 14) ** 2, facecolors="none",
                   edgecolors=color, linewidths=1.0, label=label)
    elif cell_points >= 2:
        ax.scatter(cols, rows, marker="o", s=(0.7 * cell_points) ** 2, linewidths=0, color=color, label=label)
    else:
        from matplotlib.collections import LineCollection

        breaks = np.flatnonzero((np.diff(rows) != 1) | (np.diff(cols) != 1)) + 1
        runs = list(zip(np.split(rows, breaks), np.split(cols, breaks)))
        lines = [np.column_stack([c, r]) for r, c in runs if len(r) > 1]
        single = np.array([(r[0], c[0]) for r, c in runs if len(r) == 1]).reshape(-1, 2)
        if lines:
            ax.add_collection(LineCollection(lines, colors=color, linewidths=0.8, alpha=0.75, label=label))
        if len(single):
            ax.scatter(single[:, 1], single[:, 0], marker="o", s=1.5 ** 2, linewidths=0, color=color,
                       alpha=0.75, label=None if lines else label)


BAND_ABOVE = 400  # residues: longer plans are drawn as the band around the decoded path
BAND_HALF_WIDTH = 30


def _band(plan: np.ndarray, pairs, half: int) -> tuple[np.ndarray, np.ndarray]:
    """``(band [Lq, 2 half + 1], centre [Lq])``: ``band[i, d] = P[i, centre_i + d - half]``
    (0 outside the plan), centred on the decoded path (interpolated between its pairs; the
    diagonal without pairs)."""
    lq, lk = plan.shape
    rows = np.arange(lq)
    dec = None if pairs is None else check_pairs(pairs, lq, lk, proper=False)
    if dec is not None and len(dec):
        centre = np.rint(np.interp(rows, dec[:, 0], dec[:, 1])).astype(np.int64)
    else:
        centre = diagonal_target(lq, lk)
    cols = centre[:, None] + np.arange(-half, half + 1)[None, :]
    inside = (cols >= 0) & (cols < lk)
    band = np.where(inside, plan[rows[:, None], np.clip(cols, 0, lk - 1)], 0.0)
    return band, centre


def plot_plan(plan, path, *, dpi: int = 120, fmt: str | None = None, **figure) -> pathlib.Path:
    """Writes ``plan_figure(plan, **figure)`` to ``path`` (parents are created; ``fmt``:
    the figure format, default from the extension) and returns the path."""
    return save_figure(plan_figure(plan, **figure), path, dpi, fmt)


def plan_figure(plan, *, pairs=None, reference_pairs=None, row_dustbin=None, col_dustbin=None,
                title: str | None = None, names: tuple[str, str] = ("query", "key"),
                log_scale: bool = False, band: bool | None = None) -> Figure:
    """The figure of the plan with marginals and the decoded pairs.

    Args:
      plan: ``[Lq, Lk]`` plan over the real rows / keys.
      pairs: decoded alignment ``[n, 2]``, each pair marked on its cell.
      reference_pairs: reference ``[m, 2]`` drawn as crosses.
      row_dustbin / col_dustbin: ``[Lq]`` / ``[Lk]`` dustbin masses, stacked on the marginals.
      names: the two sequences' names, for the axes (numbered from 1, as the text outputs).
      log_scale: colour by ``log10(P + 1e-12)`` instead of a square-root scale of P.
      band: draw the band around the decoded path (query row, key offset from the path)
        instead of the full matrix; default: when a sequence is longer than ``BAND_ABOVE``.
    """
    plan = _check_plan2d(plan)
    lq, lk = plan.shape
    if band if band is not None else max(lq, lk) > BAND_ABOVE:
        return _band_figure(plan, pairs=pairs, reference_pairs=reference_pairs, row_dustbin=row_dustbin,
                            title=title, names=names, log_scale=log_scale)
    width = 7.5
    height = width * float(np.clip(lq / lk, 0.7, 1.6))  # inches; the marginals keep theirs
    fig = Figure(figsize=(width, height))
    grid = fig.add_gridspec(2, 3, width_ratios=[5, 1.2, 0.25], height_ratios=[1.25, height - 2.45],
                            wspace=0.08, hspace=0.2 / (height - 1.2), top=1 - (0.55 if title else 0.2) / height,
                            bottom=0.65 / height)
    ax = fig.add_subplot(grid[1, 0])
    ax_top = fig.add_subplot(grid[0, 0], sharex=ax)
    ax_right = fig.add_subplot(grid[1, 1], sharey=ax)
    ax_bar = fig.add_subplot(grid[1, 2])
    ax_key = fig.add_subplot(grid[0, 1:])  # the legend's place: no data under it
    ax_key.axis("off")

    shown, norm, label = _plan_norm(plan, log_scale)
    image = ax.imshow(shown, aspect="auto", origin="upper", cmap="viridis", norm=norm,
                      interpolation="nearest", extent=(0.5, lk + 0.5, lq + 0.5, 0.5))
    fig.colorbar(image, cax=ax_bar, label=label)
    cell = _cell_points(ax, lq, lk)
    if reference_pairs is not None:
        ref = check_pairs(reference_pairs, lq, lk, proper=False)
        ax.scatter(ref[:, 1] + 1, ref[:, 0] + 1, marker="x", s=max(min(cell, 6), 2) ** 2, linewidths=0.8,
                   color="tab:cyan", label="reference pair")
    no_pairs = pairs is not None and not len(pairs)
    if pairs is not None:
        dec = check_pairs(pairs, lq, lk, proper=False)
        _pair_marks(ax, dec[:, 0] + 1, dec[:, 1] + 1, cell, color="tab:red", label="decoded pair")
    ax.set_xlabel(residue_label(names[1]))
    ax.set_ylabel(residue_label(names[0]).replace(" residue", "\nresidue"))  # a short heatmap: two lines
    integer_ticks(ax.xaxis)
    integer_ticks(ax.yaxis)

    col_mass = plan.sum(axis=0)  # [Lk]
    _bars(ax_top, col_mass, color="tab:blue", label="plan mass")
    if col_dustbin is not None:
        _bars(ax_top, np.asarray(col_dustbin, dtype=np.float64).reshape(lk), under=col_mass,
              color="tab:gray", label="dustbin mass")
    ax_top.set_ylabel("column\nmass", fontsize=8)
    ax_top.tick_params(labelbottom=False, labelsize=7)

    _row_marginal(ax_right, plan, row_dustbin)
    handles, labels = ax.get_legend_handles_labels()
    more = ax_top.get_legend_handles_labels()
    if handles or col_dustbin is not None or row_dustbin is not None:
        ax_key.legend(handles + more[0], labels + more[1], loc="center", fontsize=7, frameon=False)
    if title or no_pairs:
        fig.suptitle(f"{title or ''}{' (no aligned pairs)' if no_pairs else ''}".strip(), fontsize=10)
    return fig


def _bars(ax, values: np.ndarray, *, under=None, horizontal: bool = False, **style) -> None:
    """One bar a residue (numbered from 1), stacked on ``under``: one filled step patch, where
    ``bar`` drew a rectangle each (the band figure at L 900: 1.62 s with them, 0.35 s now)."""
    edges = np.arange(len(values) + 1) + 0.5
    base = 0.0 if under is None else np.asarray(under, dtype=np.float64)
    ax.stairs(base + values, edges, baseline=base, fill=True, linewidth=0,
              orientation="horizontal" if horizontal else "vertical", **style)


def _row_marginal(ax, plan: np.ndarray, row_dustbin, inside=None) -> None:
    """Row mass (and the dustbin stacked on it) as horizontal bars beside the heatmap;
    ``inside`` [Lq]: the part of each row's mass that the heatmap shows (the band view)."""
    lq = plan.shape[0]
    row_mass = plan.sum(axis=1)  # [Lq]
    total = row_mass.copy()
    _bars(ax, row_mass, color="tab:blue" if inside is None else "lightsteelblue", horizontal=True)
    if inside is not None:
        _bars(ax, inside, color="tab:blue", horizontal=True)
    if row_dustbin is not None:
        dustbin = np.asarray(row_dustbin, dtype=np.float64).reshape(lq)
        _bars(ax, dustbin, under=row_mass, color="tab:gray", horizontal=True)
        total = total + dustbin
    ax.set_xlim(0, 1.1 * _finite_max(total))
    ax.set_xlabel("row mass", fontsize=8)
    ax.tick_params(labelleft=False, labelsize=7)


def _band_figure(plan, *, pairs, reference_pairs, row_dustbin, title, names, log_scale) -> Figure:
    """``plan_figure`` of a long pair: the band around the decoded path, each decoded pair at
    offset 0 of its row (a row without a pair has no mark), the reference pairs at their
    offsets, beside it each row's mass and the part of it inside the band."""
    lq, lk = plan.shape
    half = BAND_HALF_WIDTH
    band, centre = _band(plan, pairs, half)
    fig = Figure(figsize=(6.0, 9.0))
    grid = fig.add_gridspec(1, 3, width_ratios=[5, 1.2, 0.25], wspace=0.2, top=0.93, bottom=0.13)
    ax = fig.add_subplot(grid[0, 0])
    ax_right = fig.add_subplot(grid[0, 1], sharey=ax)
    ax_bar = fig.add_subplot(grid[0, 2])
    shown, norm, label = _plan_norm(band, log_scale)
    image = ax.imshow(shown, aspect="auto", origin="upper", cmap="viridis", norm=norm, interpolation="nearest",
                      extent=(-half - 0.5, half + 0.5, lq + 0.5, 0.5))
    fig.colorbar(image, cax=ax_bar, label=label)
    dec = None if pairs is None else check_pairs(pairs, lq, lk, proper=False)
    path = "decoded path" if dec is not None and len(dec) else "diagonal"  # _band's centre
    if dec is not None and len(dec):
        ax.scatter(dec[:, 1] - centre[dec[:, 0]], dec[:, 0] + 1, marker="|", s=16, linewidths=0.9,
                   color="tab:red", label="decoded pair (offset 0)")
    if reference_pairs is not None:
        ref = check_pairs(reference_pairs, lq, lk, proper=False)
        ax.scatter(ref[:, 1] - centre[ref[:, 0]], ref[:, 0] + 1, marker="x", s=8, linewidths=0.6,
                   color="tab:cyan", label="reference pair")
    ax.set_xlim(-half - 0.5, half + 0.5)
    ax.set_xlabel(f"offset from the {path}\n({names[1]} residues)", fontsize=9)
    ax.set_ylabel(residue_label(names[0]))
    integer_ticks(ax.yaxis)  # residue numbers (a one-residue sequence had 0.6 ... 1.4)
    _row_marginal(ax_right, plan, row_dustbin, inside=band.sum(axis=1))
    handles, labels = ax.get_legend_handles_labels()
    dustbin = ([_patch("tab:gray")], ["dustbin mass"]) if row_dustbin is not None else ([], [])
    fig.legend(handles + [_patch("tab:blue"), _patch("lightsteelblue")] + dustbin[0],
               labels + ["row mass in the band", "row mass outside it"] + dustbin[1],
               loc="lower center", ncol=2, fontsize=7, frameon=False)
    held = float(band.sum()) / max(float(plan.sum()), 1e-300)
    fig.suptitle(f"{title + chr(10) if title else ''}{lq} x {lk}: the ±{half} residues around the {path} "
                 f"hold {held:.0%} of the plan's mass{' (no aligned pairs)' if path == 'diagonal' and dec is not None else ''}",
                 fontsize=9)
    return fig


def _patch(color: str):
    from matplotlib.patches import Patch

    return Patch(color=color)


def plot_barycenter(plan, target, path, *, dpi: int = 120, fmt: str | None = None, **figure) -> pathlib.Path:
    """Writes ``barycenter_figure(plan, target, **figure)`` to ``path`` (as ``plot_plan``)."""
    return save_figure(barycenter_figure(plan, target, **figure), path, dpi, fmt)


def barycenter_figure(plan, target, *, diagonal: bool = True, title: str | None = None,
                      names: tuple[str, str] = ("query", "key")) -> Figure:
    """The figure of the barycenter ``b_i`` vs the target ``c_i`` per query row, each
    row's most likely key sized by its share of the row, and below it the error ``b_i - c_i``
    of the rows with a target (none: "no reference").

    Args:
      plan: ``[Lq, Lk]``; target: ``[Lq]`` key per row or -1 (unaligned rows are not drawn).
      diagonal: also draw the diagonal reference ``round(i (Lk-1)/(Lq-1))``.
      names: the two sequences' names, for the axes (numbered from 1).
    """
    plan = _check_plan2d(plan)
    lq, lk = plan.shape
    target = check_target(target, key_length=lk)
    if target.shape != (lq,):
        raise ValueError(f"target has length {len(target)} but the plan has Lq={lq}")
    b = barycenters(plan)  # [Lq]; NaN for a row without mass
    rows = np.arange(1, lq + 1)
    ann = (target >= 0) & np.isfinite(b)  # a row without mass has no barycenter to score

    fig = Figure(figsize=(7.0, 6.0 if ann.any() else 4.5))
    ax, ax_err = (fig.subplots(2, 1, sharex=True, height_ratios=[3, 1]) if ann.any()
                  else (fig.add_subplot(), None))
    ax.plot(rows, b + 1, "-", lw=1.2, color="tab:red", label="barycenter $b_i$")
    # a diffuse row's barycenter is an average of far-apart keys: its most likely key, drawn
    # by how much of the row it holds, tells a confident row from a spread one
    row_mass = plan.sum(axis=1)
    held = row_mass > 0
    share = plan.max(axis=1)[held] / row_mass[held]
    ax.scatter(rows[held], plan.argmax(axis=1)[held] + 1, s=3 + 40 * share, color="tab:blue", alpha=0.45,
               linewidths=0, label="most likely key (area: its share of the row)")
    if ann.any():
        ax.scatter(rows[ann], target[ann] + 1, s=8, color="black", label="reference $c_i$", zorder=3)
    if diagonal:
        ax.plot(rows, diagonal_target(lq, lk) + 1, "--", lw=0.8, color="tab:gray",
                label="diagonal reference")
    ax.margins(0.02)  # the end points are drawn whole
    ax.set_ylabel(residue_label(names[1]))
    ax.legend(fontsize=8, loc="upper left")
    if ax_err is not None:
        scored = plan_metrics(plan, target)  # the figures `eval` and training report
        ax_err.axhline(0, color="tab:gray", lw=0.8)
        ax_err.bar(rows[ann], b[ann] - target[ann], width=1.0, color="tab:red")
        ax_err.set_ylabel("$b_i - c_i$", fontsize=9)
        ax_err.set_title(f"mean |b - c| {scored.barycenter_mae:.2f} residues; within 5: "
                         f"{scored.within5:.0%} of {scored.n_barycenter} rows", fontsize=8)
    (ax_err or ax).set_xlabel(residue_label(names[0]))
    heading = (title or "") + ("" if ann.any() else (" (no reference)" if title else "no reference"))
    if heading:
        ax.set_title(heading, fontsize=10)
    fig.tight_layout()
    return fig
