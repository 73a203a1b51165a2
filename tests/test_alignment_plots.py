"""Plots: a non-trivial PNG is written (size, shape, not blank). Nothing more is claimed."""

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
