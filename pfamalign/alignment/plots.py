"""Figures of a transport plan (matplotlib, Agg canvas; pyplot and its global state are never
touched, so this is safe in servers and tests).

* ``plot_plan``: plan heatmap (query rows down, key columns across) with the row and column
  marginals beside it, the decoded path overlaid and, optionally, the reference pairs and the
  dustbin masses in the marginals.
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


def _save(fig: Figure, path, dpi: int) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def plot_plan(plan, path, *, pairs=None, reference_pairs=None, row_dustbin=None,
              col_dustbin=None, title: str | None = None, log_scale: bool = False,
              dpi: int = 120) -> pathlib.Path:
    """Writes a PNG of the plan with marginals and the decoded path; returns the path.

    Args:
      plan: ``[Lq, Lk]`` plan over the real rows / keys.
      path: output file (parents are created).
      pairs: decoded alignment ``[n, 2]`` drawn as a line.
      reference_pairs: reference ``[m, 2]`` drawn as crosses.
      row_dustbin / col_dustbin: ``[Lq]`` / ``[Lk]`` dustbin masses, stacked on the marginals.
      log_scale: colour by ``log10(P + 1e-12)`` instead of P.
    """
    plan = _check_plan2d(plan)
    lq, lk = plan.shape
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

    row_mass = plan.sum(axis=1)  # [Lq]
    ax_right.barh(np.arange(lq), row_mass, height=1.0, color="tab:blue")
    if row_dustbin is not None:
        ax_right.barh(np.arange(lq), np.asarray(row_dustbin, dtype=np.float64).reshape(lq),
                      height=1.0, left=row_mass, color="tab:gray")
    ax_right.set_xlabel("row mass", fontsize=8)
    ax_right.tick_params(labelleft=False, labelsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, path, dpi)


def plot_barycenter(plan, target, path, *, diagonal: bool = True, title: str | None = None,
                    dpi: int = 120) -> pathlib.Path:
    """Writes a PNG of the barycenter ``b_i`` vs the target ``c_i`` per query row.

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
    return _save(fig, path, dpi)
