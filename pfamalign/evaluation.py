"""Evaluation against reference alignments: the model and the baselines, same protocol.

Every method is scored on the same sequence pairs:
- aligned-pair precision / recall / F1 of its discrete alignment against the reference pairs
  (micro = pooled counts, the headline; macro = mean over pairs), overall and by percent-
  identity bin, with bootstrap 95 % intervals over pairs (the same resamples for every method);
- for methods with a plan (the model, the diagonal reference): the seed paper's plan metrics
  (sparse CE, barycenter MAE, within-5, monotonicity violation; reconstruction when the model
  exposes values).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Callable, Iterable, Sequence

import numpy as np

from pfamalign import jsonio
from pfamalign.alignment.baselines import diagonal_pairs, needleman_wunsch, smith_waterman
from pfamalign.alignment.metrics import (IDENTITY_BINS, PlanMetrics, alignment_counts,
                                         diagonal_plan_metrics, paired_f1_difference, plan_metrics,
                                         prf_by_identity)

BASELINES: dict[str, Callable] = {
    "diagonal": lambda r: diagonal_pairs(len(r["q_seq"]), len(r["k_seq"])),
    "nw": lambda r: needleman_wunsch(r["q_seq"], r["k_seq"]).pairs,
    "sw": lambda r: smith_waterman(r["q_seq"], r["k_seq"]).pairs,
}
LABELS = {"model": "pfamalign", "diagonal": "diagonal", "nw": "NW-BLOSUM62", "sw": "SW-BLOSUM62"}


@dataclasses.dataclass
class Evaluation:
    """Per-method aligned-pair counts ``[N, 3]`` and plan metrics, plus per-pair identity."""

    methods: list[str]
    counts: dict[str, list] = dataclasses.field(default_factory=dict)
    plan: dict[str, list] = dataclasses.field(default_factory=dict)
    pid: list = dataclasses.field(default_factory=list)
    families: list = dataclasses.field(default_factory=list)

    def summary(self, *, n_boot: int = 1000, seed: int = 0) -> dict:
        pid = np.asarray(self.pid, np.float64)
        out = {"n_pairs": len(self.pid), "n_families": len(set(self.families)), "methods": {}}
        for m in self.methods:
            entry = {"label": LABELS.get(m, m),
                     "prf": prf_by_identity(np.asarray(self.counts[m], np.int64).reshape(-1, 3), pid,
                                            n_boot=n_boot, seed=seed)}
            if self.plan.get(m):
                entry["plan_metrics"] = PlanMetrics.pool(self.plan[m]).to_dict()
            out["methods"][m] = entry
        if "model" in self.methods:  # paired: model minus each baseline on the same pairs
            model = np.asarray(self.counts["model"], np.int64).reshape(-1, 3)
            for key, groups in (("model_minus", None), ("model_minus_by_family", self.families)):
                out[key] = {m: paired_f1_difference(model, np.asarray(self.counts[m], np.int64).reshape(-1, 3),
                                                    pid, groups=groups, n_boot=n_boot, seed=seed)
                            for m in self.methods if m != "model"}
        return out


def evaluate(records: Iterable[dict], *, predictor=None, features: str = "records",
             baselines: Sequence[str] = ("diagonal", "nw", "sw"), decoding=None,
             batch_size: int = 8, advance=lambda n=1: None) -> Evaluation:
    """Scores the model (when ``predictor`` is given) and the baselines on ``records``.

    Records are pair dicts with ``q_seq``, ``k_seq``, ``target`` and ``pid`` (the pipelines'
    pair record); with ``features="records"`` they also carry ``q_feat`` / ``k_feat`` (the
    dataset's stored embeddings), with ``features="featurize"`` the predictor embeds residues.
    ``decoding``: DecoderSettings for the model (default: the model's own).
    """
    for b in baselines:
        if b not in BASELINES:
            raise ValueError(f"unknown baseline {b!r}; choose from {sorted(BASELINES)}")
    methods = (["model"] if predictor is not None else []) + list(baselines)
    ev = Evaluation(methods, {m: [] for m in methods}, {"model": [], "diagonal": []})
    pending: list[dict] = []

    def flush():
        if predictor is not None and pending:
            if features == "records":
                feats = [(r["q_feat"], r["k_feat"]) for r in pending]
            else:
                flat = predictor.featurize([s for r in pending for s in (r["q_seq"], r["k_seq"])])
                feats = list(zip(flat[0::2], flat[1::2]))
            for r, pp in zip(pending, predictor.plans(feats, batch_size=batch_size)):
                aln = predictor.decode(pp, decoding, (r["q_seq"], r["k_seq"]))
                ev.counts["model"].append(alignment_counts(aln.pairs, r["target"]))
                ev.plan["model"].append(plan_metrics(pp.real, r["target"], dustbin_mass=pp.row_dustbin))
        advance(len(pending))
        pending.clear()

    for rec in records:
        target = np.asarray(rec["target"])
        ev.pid.append(float(rec["pid"]))
        ev.families.append(rec.get("family", ""))
        for b in baselines:
            ev.counts[b].append(alignment_counts(BASELINES[b](rec), target))
        ev.plan["diagonal"].append(diagonal_plan_metrics(target, len(rec["k_seq"]), dustbin=predictor is not None))
        pending.append(rec)
        if len(pending) >= 4 * batch_size:
            flush()
    flush()
    return ev


# ---- reporting ----------------------------------------------------------------------------------


def _fmt(cell: dict) -> str:
    v, lo, hi = cell["value"], cell["low"], cell["high"]
    if not np.isfinite(v):
        return "—"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) else f"{v:.3f}"


def _fmt_signed(cell: dict, value: bool = True) -> str:
    v, lo, hi = cell["value"], cell["low"], cell["high"]
    if not np.isfinite(v):
        return "—"
    ci = f"[{lo:+.3f}, {hi:+.3f}]" if np.isfinite(lo) else ""
    return f"{v:+.3f} {ci}".strip() if value else (ci or "—")


def render(summary: dict, console=None) -> None:
    """Prints the F1 table (by identity bin) and the plan-metric table with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if sys.stdout.isatty() else 150)  # no wrapping in logs
    bins = ["all"] + [name for name, _, _ in IDENTITY_BINS]
    first = next(iter(summary["methods"].values()))["prf"]
    tab = Table(title=f"aligned-pair F1 (micro, 95% bootstrap CI) — {summary['n_pairs']} pairs, "
                      f"{summary['n_families']} families; NW/SW: BLOSUM62, gap open 11, extend 1")
    tab.add_column("method", no_wrap=True)
    for b in bins:
        tab.add_column(f"{b} (n={first[b]['n_pairs']})", justify="right", no_wrap=True)
    tab.add_column("precision", justify="right")
    tab.add_column("recall", justify="right")
    for m, entry in summary["methods"].items():
        prf = entry["prf"]
        tab.add_row(entry["label"], *[_fmt(prf[b]["micro"]["f1"]) for b in bins],
                    f"{prf['all']['micro']['precision']['value']:.3f}",
                    f"{prf['all']['micro']['recall']['value']:.3f}")
    console.print(tab)
    if summary.get("model_minus"):
        tab = Table(title="pfamalign minus baseline, micro F1 (paired bootstrap 95% CI: "
                          "resampling pairs / whole families)")
        tab.add_column("baseline", no_wrap=True)
        for b in bins:
            tab.add_column(b, justify="right", no_wrap=True)
        for m, diff in summary["model_minus"].items():
            by_family = summary.get("model_minus_by_family", {}).get(m)
            tab.add_row(LABELS.get(m, m), *[_fmt_signed(diff[b]) for b in bins])
            if by_family:
                tab.add_row("  by family", *[_fmt_signed(by_family[b], value=False) for b in bins])
        console.print(tab)
    plan_methods = {m: e["plan_metrics"] for m, e in summary["methods"].items() if "plan_metrics" in e}
    if plan_methods:
        names = ["sparse_ce", "barycenter_mae", "within5", "monotonicity_violation", "reconstruction"]
        tab = Table(title="plan metrics (seed paper)")
        tab.add_column("method", no_wrap=True)
        for n in names:
            tab.add_column(n, justify="right")
        for m, pm in plan_methods.items():
            tab.add_row(LABELS.get(m, m), *["—" if not np.isfinite(pm[n]) else f"{pm[n]:.4f}" for n in names])
        console.print(tab)


def plot(summary: dict, path) -> pathlib.Path:
    """Grouped bars: micro F1 with its 95 % interval per method and identity bin."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bins = ["all"] + [name for name, _, _ in IDENTITY_BINS]
    methods = list(summary["methods"])
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    width = 0.8 / max(len(methods), 1)
    for n, m in enumerate(methods):
        prf = summary["methods"][m]["prf"]
        vals = np.array([prf[b]["micro"]["f1"]["value"] for b in bins])
        lo = np.array([prf[b]["micro"]["f1"]["low"] for b in bins])
        hi = np.array([prf[b]["micro"]["f1"]["high"] for b in bins])
        err = np.nan_to_num(np.stack([vals - lo, hi - vals]), nan=0.0)
        x = np.arange(len(bins)) + (n - (len(methods) - 1) / 2) * width
        ax.bar(x, np.nan_to_num(vals), width, yerr=err, capsize=3, label=summary["methods"][m]["label"])
    ax.set_xticks(np.arange(len(bins)))
    ax.set_xticklabels([f"{b}\n(n={summary['methods'][methods[0]]['prf'][b]['n_pairs']})" for b in bins])
    ax.set_xlabel("percent identity of the reference pair")
    ax.set_ylabel("aligned-pair F1 (micro)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=120)
    return path


def to_json(summary: dict) -> str:
    return jsonio.dumps(summary)
