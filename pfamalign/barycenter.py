"""Row-normalized transport barycenters of one pair against its reference columns: the table
(and the plan metrics, docs/design.md §5) behind ``pfamalign barycenter``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from pfamalign.alignment.metrics import PlanMetrics, barycenters
from pfamalign.evaluation import model_plan_metrics
from pfamalign.inference import Predictor
from pfamalign.plans import PairPlan

if TYPE_CHECKING:
    import pandas as pd


@dataclasses.dataclass(frozen=True)
class PairBarycenters:
    """``table``: one row per query residue (``row``, ``residue``, ``target`` (-1: none),
    ``barycenter``, ``abs_error`` (NaN: no target), ``real_mass``, ``dustbin_mass``);
    ``metrics``: the plan metrics when a reference alignment is known, else None."""

    table: pd.DataFrame
    plan: PairPlan
    metrics: PlanMetrics | None


def pair_barycenters(predictor: Predictor, pair: dict) -> PairBarycenters:
    """The barycenter table of a pair record (``pfamalign.inputs``) under ``predictor``'s plan."""
    import pandas as pd

    _, pp = predictor.align(pair["q_seq"], pair["k_seq"], symmetric=False)  # the transport plan
    b = barycenters(pp.real)
    lq = len(pair["q_seq"])
    known = pair.get("target") is not None
    target = np.asarray(pair["target"]) if known else np.full(lq, -1)
    table = pd.DataFrame({
        "row": np.arange(lq), "residue": list(pair["q_seq"]), "target": target, "barycenter": b,
        "abs_error": np.where(target >= 0, np.abs(b - target), np.nan),
        "real_mass": pp.real.sum(1), "dustbin_mass": pp.row_dustbin,
    })
    metrics = (model_plan_metrics(pp.real, pp.row_dustbin, target, dustbin=predictor.config.dustbin)
               if known else None)
    return PairBarycenters(table, pp, metrics)
