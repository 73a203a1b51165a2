"""Figures of a transport plan (matplotlib, Agg canvas; pyplot and its global state are never
touched, so this is safe in servers and tests).

* ``plot_plan``: plan heatmap (query rows down, key columns across) with the row and column
  marginals beside it, the decoded path overlaid and, optionally, the reference pairs and the
  dustbin masses in the marginals. Beyond ``BAND_ABOVE`` residues the full matrix would
  shrink the plan to a one-pixel line, so the heatmap shows the band around the decoded path
  in its own coordinates (query row down, key offset from the path across).

Every writer saves in the format its file extension names (``.png``, ``.svg``, ``.pdf``, ...;
``figure_format``), or ``fmt`` when given (an atomic writer's temporary name has none).
* ``plot_barycenter``: the seed paper's qualitative figure, barycenter ``b_i`` against the
  target key ``c_i`` per query row, with the diagonal reference.
"""

from __future__ import annotations

import pathlib

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pfamalign.alignment.metrics import barycenters
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


def _save(fig: Figure, path, dpi: int, fmt: str | None) -> pathlib.Path:
    path = pathlib.Path(path)
    fmt = fmt or figure_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi, format=fmt)
    return path


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


def plot_plan(plan, path, *, pairs=None, reference_pairs=None, row_dustbin=None,
              col_dustbin=None, title: str | None = None, log_scale: bool = False,
              dpi: int = 120, fmt: str | None = None, band: bool | None = None) -> pathlib.Path:
    """Writes a figure of the plan with marginals and the decoded path; returns the path.

    Args:
      plan: ``[Lq, Lk]`` plan over the real rows / keys.
      path: output file (parents are created).
      pairs: decoded alignment ``[n, 2]`` drawn as a line.
      reference_pairs: reference ``[m, 2]`` drawn as crosses.
      row_dustbin / col_dustbin: ``[Lq]`` / ``[Lk]`` dustbin masses, stacked on the marginals.
      log_scale: colour by ``log10(P + 1e-12)`` instead of P.
      fmt: figure format (default: from the extension of ``path``).
      band: draw the band around the decoded path (query row, key offset from the path)
        instead of the full matrix; default: when a sequence is longer than ``BAND_ABOVE``.
    """
    plan = _check_plan2d(plan)
    lq, lk = plan.shape
    if band if band is not None else max(lq, lk) > BAND_ABOVE:
        return _plot_band(plan, path, pairs=pairs, reference_pairs=reference_pairs,
                          row_dustbin=row_dustbin, title=title, log_scale=log_scale, dpi=dpi, fmt=fmt)
    fig = Figure(figsize=(7.5, 7.5 * min(max(lq / lk, 0.4), 2.5)))
    grid = fig.add_gridspec(2, 3, width_ratios=[5, 1.2, 0.25], height_ratios=[1.2, 5],
                            wspace=0.08, hspace=0.08)
    ax = fig.add_subplot(grid[1, 0])
    ax_top = fig.add_subplot(grid[0, 0], sharex=ax)
    ax_right = fig.add_subplot(grid[1, 1], sharey=ax)
    ax_bar = fig.add_subplot(grid[1, 2])

    shown = np.log10(plan + 1e-12) if log_scale else plan
    image = ax.imshow(shown, aspect="auto", origin="upper", cmap="viridis",
                      interpolation="nearest", extent=(-0.5, lk - 0.5, lq - 0.5, -0.5))
    fig.colorbar(image, cax=ax_bar, label="log10 P" if log_scale else "P")
    if reference_pairs is not None:
        ref = check_pairs(reference_pairs, lq, lk, proper=False)
        ax.scatter(ref[:, 1], ref[:, 0], marker="x", s=12, linewidths=0.8, color="tab:cyan",
                   label="reference")
    if pairs is not None:
        dec = check_pairs(pairs, lq, lk, proper=False)
        ax.plot(dec[:, 1], dec[:, 0], "-", lw=1.0, color="tab:red", label="decoded")
    if pairs is not None or reference_pairs is not None:
        ax.legend(loc="lower left", fontsize=7, framealpha=0.7)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")

    col_mass = plan.sum(axis=0)  # [Lk]
    ax_top.bar(np.arange(lk), col_mass, width=1.0, color="tab:blue", label="real")
    if col_dustbin is not None:
        ax_top.bar(np.arange(lk), np.asarray(col_dustbin, dtype=np.float64).reshape(lk),
                   width=1.0, bottom=col_mass, color="tab:gray", label="dustbin")
        ax_top.legend(fontsize=6, loc="upper right")
    ax_top.set_ylabel("column\nmass", fontsize=8)
    ax_top.tick_params(labelbottom=False, labelsize=7)

    _row_marginal(ax_right, plan, row_dustbin)
    if title:
        fig.suptitle(title)
    return _save(fig, path, dpi, fmt)


def _row_marginal(ax, plan: np.ndarray, row_dustbin) -> None:
    """Row mass (and the dustbin stacked on it) as horizontal bars beside the heatmap."""
    lq = plan.shape[0]
    row_mass = plan.sum(axis=1)  # [Lq]
    ax.barh(np.arange(lq), row_mass, height=1.0, color="tab:blue")
    if row_dustbin is not None:
        ax.barh(np.arange(lq), np.asarray(row_dustbin, dtype=np.float64).reshape(lq),
                height=1.0, left=row_mass, color="tab:gray")
    ax.set_xlabel("row mass", fontsize=8)
    ax.tick_params(labelleft=False, labelsize=7)


def _plot_band(plan, path, *, pairs, reference_pairs, row_dustbin, title, log_scale, dpi, fmt):
    """``plot_plan`` of a long pair: the band around the decoded path, the path at offset 0,
    the reference pairs at their offsets, the row mass (and dustbin) beside it."""
    lq, lk = plan.shape
    half = BAND_HALF_WIDTH
    band, centre = _band(plan, pairs, half)
    fig = Figure(figsize=(6.0, 9.0))
    grid = fig.add_gridspec(1, 3, width_ratios=[5, 1.2, 0.25], wspace=0.08)
    ax = fig.add_subplot(grid[0, 0])
    ax_right = fig.add_subplot(grid[0, 1], sharey=ax)
    ax_bar = fig.add_subplot(grid[0, 2])
    shown = np.log10(band + 1e-12) if log_scale else band
    image = ax.imshow(shown, aspect="auto", origin="upper", cmap="viridis", interpolation="nearest",
                      extent=(-half - 0.5, half + 0.5, lq - 0.5, -0.5))
    fig.colorbar(image, cax=ax_bar, label="log10 P" if log_scale else "P")
    ax.axvline(0, color="tab:red", lw=0.6, alpha=0.6, label="decoded path")
    if reference_pairs is not None:
        ref = check_pairs(reference_pairs, lq, lk, proper=False)
        ax.scatter(ref[:, 1] - centre[ref[:, 0]], ref[:, 0], marker="x", s=8, linewidths=0.6,
                   color="tab:cyan", label="reference")
    ax.legend(loc="lower left", fontsize=7, framealpha=0.7)
    ax.set_xlim(-half - 0.5, half + 0.5)
    ax.set_xlabel("key offset from the decoded path (residues)")
    ax.set_ylabel("query position i")
    _row_marginal(ax_right, plan, row_dustbin)
    fig.suptitle(f"{title + ': ' if title else ''}band of {2 * half + 1} keys around the path "
                 f"({lq} x {lk})", fontsize=10)
    return _save(fig, path, dpi, fmt)


def plot_barycenter(plan, target, path, *, diagonal: bool = True, title: str | None = None,
                    dpi: int = 120, fmt: str | None = None) -> pathlib.Path:
    """Writes a figure of the barycenter ``b_i`` vs the target ``c_i`` per query row.

    Args:
      plan: ``[Lq, Lk]``; target: ``[Lq]`` key per row or -1 (unaligned rows are not drawn).
      diagonal: also draw the diagonal reference ``round(i (Lk-1)/(Lq-1))``.
    """
    plan = _check_plan2d(plan)
    lq, lk = plan.shape
    target = check_target(target, key_length=lk)
    if target.shape != (lq,):
        raise ValueError(f"target has length {len(target)} but the plan has Lq={lq}")
    b = barycenters(plan)  # [Lq]
    rows = np.arange(lq)
    ann = target >= 0

    fig = Figure(figsize=(7.0, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(rows, b, "-", lw=1.2, color="tab:red", label="barycenter $b_i$")
    ax.scatter(rows[ann], target[ann], s=8, color="black", label="target $c_i$", zorder=3)
    if diagonal:
        ax.plot(rows, diagonal_target(lq, lk), "--", lw=0.8, color="tab:gray",
                label="diagonal reference")
    ax.set_xlim(-0.5, lq - 0.5)
    ax.set_ylim(-0.5, lk - 0.5)
    ax.set_xlabel("query position i")
    ax.set_ylabel("key position")
    ax.legend(fontsize=8, loc="upper left")
    if title:
        ax.set_title(title)
    return _save(fig, path, dpi, fmt)
