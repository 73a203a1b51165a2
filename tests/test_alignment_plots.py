"""Plots: a non-trivial PNG is written (size, shape, not blank), and what the figures show:
each decoded pair marked on 1-based, named axes, the band's share of the mass, the barycenter's
error panel, text kept as text in SVG and PDF."""

import matplotlib.image as mpimg
import numpy as np
import pytest

from pfamalign.alignment.decode import mea_decode
from pfamalign.alignment.metrics import diagonal_plan
from pfamalign.alignment.pairs import pairs_from_target
from pfamalign.alignment.plots import plot_barycenter, plot_plan


def _plan_and_target(lq=40, lk=55, seed=0):
    rng = np.random.default_rng(seed)
    target = np.where(rng.random(lq) < 0.8, np.sort(rng.choice(lk, lq, replace=False)), -1)
    plan = rng.random((lq, lk)) * 0.02
    plan[np.flatnonzero(target >= 0), target[target >= 0]] += 0.8
    plan /= plan.sum(1, keepdims=True) * 1.1
    return plan, target


def _check_png(path, min_bytes=5000):
    assert path.exists() and path.stat().st_size > min_bytes
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
    assert float(image[..., :3].std()) > 0.01  # not a blank canvas


@pytest.mark.parametrize("with_dustbin", [False, True])
def test_plot_plan_writes_png(tmp_path, with_dustbin):
    plan, target = _plan_and_target()
    aln = mea_decode(plan)
    kwargs = {}
    if with_dustbin:
        kwargs = dict(row_dustbin=1 - plan.sum(1), col_dustbin=np.full(plan.shape[1], 0.05),
                      log_scale=True)
    out = plot_plan(plan, tmp_path / "sub" / "plan.png", pairs=aln.pairs,
                    reference_pairs=pairs_from_target(target), title="test plan", **kwargs)
    _check_png(out)


def test_plot_barycenter_writes_png(tmp_path):
    plan, target = _plan_and_target(seed=1)
    _check_png(plot_barycenter(plan, target, tmp_path / "bary.png", title="barycenters"))
    _check_png(plot_barycenter(diagonal_plan(30, 20), np.arange(30) * 0 - 1,
                               tmp_path / "diag.png", diagonal=False))


def test_plot_validation(tmp_path):
    with pytest.raises(ValueError, match="one head"):
        plot_plan(np.ones((2, 3, 4)), tmp_path / "x.png")
    with pytest.raises(ValueError, match="length"):
        plot_barycenter(np.ones((3, 4)), np.array([0, 1]), tmp_path / "x.png")


# ---- what the figures show (the audit of 2026-11-29) ---------------------------------------

def test_the_plan_figure_marks_each_decoded_pair_on_1_based_named_axes():
    from matplotlib.collections import PathCollection

    from pfamalign.alignment.plots import plan_figure

    plan, target = _plan_and_target()
    aln = mea_decode(plan)
    fig = plan_figure(plan, pairs=aln.pairs, names=("LAR_DROME", "IL7RA_HUMAN"))
    heat = fig.axes[0]
    assert heat.get_xlabel() == "IL7RA_HUMAN residue (1-based)"
    assert heat.get_ylabel() == "LAR_DROME\nresidue (1-based)"  # two lines: a wide plan's heatmap is short
    marks = [c for c in heat.collections if isinstance(c, PathCollection) and c.get_label() == "decoded pair"]
    assert len(marks) == 1  # one mark per pair, no line through them (a line would draw gaps as pairs)
    np.testing.assert_array_equal(marks[0].get_offsets(), aln.pairs[:, ::-1] + 1)
    assert not [line for line in heat.get_lines() if len(line.get_xdata()) > 1]
    image = heat.get_images()[0]
    assert image.get_extent() == [0.5, plan.shape[1] + 0.5, plan.shape[0] + 0.5, 0.5]  # residue 1 on cell 1
    assert image.norm.vmin == 0 and "square-root" in fig.axes[3].get_ylabel()  # the colour bar says its scale


def test_the_band_figure_says_how_much_of_the_plan_it_shows():
    from pfamalign.alignment.plots import BAND_HALF_WIDTH, _band, plan_figure

    lq, lk = 500, 520
    rng = np.random.default_rng(3)
    plan = rng.random((lq, lk)) * 1e-3
    cols = np.sort(rng.choice(lk, lq, replace=False))
    plan[np.arange(lq), cols] += 0.5
    pairs = np.stack([np.arange(lq), cols], 1)[::2]  # every other row aligned: the others unmarked
    fig = plan_figure(plan, pairs=pairs, title="long")
    band, _ = _band(plan, pairs, BAND_HALF_WIDTH)
    assert f"hold {band.sum() / plan.sum():.0%} of the plan's mass" in fig._suptitle.get_text()
    (marks,) = [c for c in fig.axes[0].collections if c.get_label().startswith("decoded pair")]
    assert len(marks.get_offsets()) == len(pairs)


def test_figures_keep_text_as_text_in_svg_and_truetype_in_pdf(tmp_path):
    plan, target = _plan_and_target()
    plot_plan(plan, tmp_path / "p.svg", pairs=mea_decode(plan).pairs, names=("alpha", "beta"))
    svg = (tmp_path / "p.svg").read_text()
    assert "<text" in svg and "beta residue (1-based)" in svg  # searchable, editable text
    plot_barycenter(plan, target, tmp_path / "b.pdf")
    pdf = (tmp_path / "b.pdf").read_bytes()
    assert b"/Type3" not in pdf and (b"TrueType" in pdf or b"CIDFontType2" in pdf)


def test_pairs_on_cells_too_small_for_a_dot_are_drawn_as_runs():
    """Below 2 points a cell (a 400-residue pair; 30 x 600), a dot covered its cells and the
    plan along the path: each run of consecutive pairs is a thin line, never across a gap."""
    from matplotlib.collections import LineCollection

    from pfamalign.alignment.plots import plan_figure

    plan = np.full((380, 390), 1e-4)
    pairs = np.array([(i, i) for i in range(100)] + [(i, i + 5) for i in range(150, 300)] + [(350, 360)])
    plan[pairs[:, 0], pairs[:, 1]] = 0.5
    fig = plan_figure(plan, pairs=pairs)
    (runs,) = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    assert runs.get_label() == "decoded pair"
    ends = [(tuple(seg[0]), tuple(seg[-1])) for seg in runs.get_segments()]
    assert ends == [((1, 1), (100, 100)), ((156, 151), (305, 300))]  # (key, query), 1-based
    (single,) = [c for c in fig.axes[0].collections if c is not runs and len(c.get_offsets()) == 1]
    np.testing.assert_array_equal(single.get_offsets(), [[361, 351]])
    lone = plan_figure(np.full((250, 250), 1 / 62500), pairs=np.array([(10, 12)]))  # no run at all
    labels = [t.get_text() for a in lone.axes if a.get_legend() for t in a.get_legend().get_texts()]
    assert labels.count("decoded pair") == 1


def test_a_figure_without_aligned_pairs_says_so():
    """No pair: no "decoded pair" in the legend, the title says it, and the band view of a long
    pair is centred on the diagonal, as its axis and title now say."""
    from pfamalign.alignment.plots import plan_figure

    rng = np.random.default_rng(4)
    for lq, lk in ((40, 50), (31, 600)):
        fig = plan_figure(rng.random((lq, lk)) / lk, pairs=np.zeros((0, 2), np.int64), title="t",
                          row_dustbin=np.full(lq, 0.1))
        labels = [t.get_text() for legend in fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]
                  for t in legend.get_texts()]
        assert not [x for x in labels if x.startswith("decoded pair")]
        assert "no aligned pairs" in fig._suptitle.get_text()
        if lk == 600:  # the band view: its legend names the grey dustbin bars too
            assert "around the diagonal" in fig._suptitle.get_text() and "dustbin mass" in labels
            assert fig.axes[0].get_xlabel().startswith("offset from the diagonal")


def test_an_svgz_names_no_temporary_file_in_its_gzip_header(tmp_path):
    import gzip

    from pfamalign.outputs import atomic_path

    plan, _ = _plan_and_target()
    with atomic_path(tmp_path / "p.svgz") as tmp:
        plot_plan(plan, tmp, fmt="svgz")
    data = (tmp_path / "p.svgz").read_bytes()
    assert data[3] & 0x08 == 0  # FNAME flag off: `gunzip -N` restores no hidden temporary's name
    assert b"tmp" not in data[:64] and gzip.decompress(data).lstrip().startswith(b"<?xml")


def test_the_barycenter_figure_shows_the_error_only_against_a_reference():
    from pfamalign.alignment.plots import barycenter_figure

    plan, target = _plan_and_target(seed=1)
    with_ref = barycenter_figure(plan, target, names=("q", "k"))
    assert len(with_ref.axes) == 2 and "within 5" in with_ref.axes[1].get_title()
    assert with_ref.axes[1].get_xlabel() == "q residue (1-based)"
    labels = [t.get_text() for t in with_ref.axes[0].get_legend().get_texts()]
    assert "reference $c_i$" in labels
    alone = barycenter_figure(plan, np.full(len(target), -1), title="x")
    assert len(alone.axes) == 1 and alone.axes[0].get_title() == "x (no reference)"
    assert "reference $c_i$" not in [t.get_text() for t in alone.axes[0].get_legend().get_texts()]


def test_figures_of_plans_with_empty_rows_or_failed_cells_still_draw():
    from pfamalign.alignment.plots import barycenter_figure, plan_figure

    plan, target = _plan_and_target(lq=30, lk=40, seed=2)
    broken = plan.copy()
    broken[3, 4] = np.nan  # a failed solve's cell: the scales take the finite values
    plan_figure(broken, pairs=mea_decode(plan).pairs)
    plan_figure(broken, band=True)
    empty = plan.copy()
    empty[5] = 0.0  # a row without mass has no barycenter: not scored, no "most likely key"
    fig = barycenter_figure(empty, target)
    scored = int(((target >= 0) & (np.arange(30) != 5)).sum())
    assert f"of {scored} rows" in fig.axes[1].get_title() and "nan" not in fig.axes[1].get_title()


def test_the_band_figure_numbers_residues_with_whole_numbers():
    """A one-residue sequence against 1,500 (the band view) had its residue axis at 0.6 ... 1.4."""
    from pfamalign.alignment.plots import plan_figure

    plan = np.random.default_rng(0).random((1, 1500)) / 1500
    fig = plan_figure(plan, pairs=np.array([[0, 700]]))
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_yticks() if 0.5 <= t <= 1.5]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


@pytest.mark.parametrize("lk", [55, 600])  # the full matrix, and the band view
def test_the_marginals_show_each_residues_mass_with_its_dustbin_stacked_on_it(lk):
    """Each residue's bar is its line's plan mass at its 1-based number, the dustbin's bar
    stands on it, and the band view's inner bar is the mass inside the band."""
    from matplotlib.patches import StepPatch

    from pfamalign.alignment.plots import BAND_HALF_WIDTH, _band, plan_figure

    plan, _ = _plan_and_target(lq=40, lk=lk)
    pairs = mea_decode(plan).pairs
    row_dustbin, col_dustbin = np.linspace(0.01, 0.2, 40), np.linspace(0.02, 0.1, lk)
    fig = plan_figure(plan, pairs=pairs, row_dustbin=row_dustbin, col_dustbin=col_dustbin)
    bars = lambda label: [p.get_data() for ax in fig.axes if label(ax) for p in ax.patches
                          if isinstance(p, StepPatch)]
    rows = bars(lambda ax: ax.get_xlabel() == "row mass")
    expected = [(plan.sum(1), 0.0)] + ([] if lk == 55 else [(None, 0.0)]) + [(plan.sum(1) + row_dustbin, plan.sum(1))]
    assert len(rows) == len(expected)
    for data, (top, base) in zip(rows, expected):
        np.testing.assert_array_equal(data.edges, np.arange(41) + 0.5)
        if top is not None:
            np.testing.assert_allclose(data.values, top, rtol=1e-12)
            np.testing.assert_allclose(data.baseline, base, rtol=1e-12)
    if lk == 600:  # inside the band: what the heatmap shows of each row, less than the row here
        band, _ = _band(plan, pairs, BAND_HALF_WIDTH)
        np.testing.assert_allclose(rows[1].values, band.sum(1), rtol=1e-12)
        assert np.all(band.sum(1) < plan.sum(1) - 1e-3)
        return
    cols = bars(lambda ax: ax.get_ylabel() == "column\nmass")
    assert len(cols) == 2
    np.testing.assert_allclose(cols[0].values, plan.sum(0), rtol=1e-12)
    np.testing.assert_allclose(cols[1].values, plan.sum(0) + col_dustbin, rtol=1e-12)
    np.testing.assert_allclose(cols[1].baseline, plan.sum(0), rtol=1e-12)
    np.testing.assert_array_equal(cols[0].edges, np.arange(lk + 1) + 0.5)
