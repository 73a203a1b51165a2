"""Evaluation against reference alignments: every metric of ``pfamalign eval`` and of the
validation inside ``pfamalign train`` is computed here.

Every method is scored on the same sequence pairs:
- aligned-pair precision / recall / F1 of its discrete alignment against the reference pairs
  (micro = pooled counts, the headline; macro = mean over pairs), overall and by percent-
  identity bin, with bootstrap 95 % intervals over pairs (the same resamples for every method);
- seconds spent per method (the model: plans and decoding; external aligners: their
  subprocesses included);
- for methods with a plan (the model, the diagonal reference): the plan metrics
  (sparse CE, barycenter MAE, within-5, monotonicity violation; reconstruction when the model
  exposes values), by ``model_plan_metrics`` in both paths;
- for the model: the reliability of its per-pair confidences (confidence bin vs precision,
  ECE, Brier; ``metrics.reliability``), from per-bin sums accumulated pair by pair.

One definition of the model's plan metrics (``model_plan_metrics``, docs/design.md §5): they
are those of the plan the model decodes, the head-mean plan ``[Lq, Lk]`` with its dustbin
column. The sparse CE follows the training loss (``model.loss_targets``): aligned rows score
``-log P_{i, c_i}``; unaligned rows score ``-log`` of their dustbin mass in dustbin
configurations and are left out without a dustbin (a model without a dustbin has no way to
leave a row unaligned; counting those rows at ``-log(min_prob)`` made ``eval`` and the training
validation disagree for k2_eps1 / k4_eps1). The diagonal reference is scored the same way.
Reconstruction averages the heads' errors (each head has its own values).
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pfamalign import jsonio
from pfamalign.alignment.baselines import (EXTERNAL_ALIGNERS, ExternalAlignerError, diagonal_pairs,
                                           external_align, needleman_wunsch, smith_waterman)
from pfamalign.alignment.metrics import (IDENTITY_BINS, RELIABILITY_BINS, RELIABILITY_SUMS,
                                         PlanMetrics, alignment_counts, diagonal_plan_metrics,
                                         paired_f1_difference, pairs_in_reference, plan_metrics,
                                         prf_by_identity, reliability, reliability_sums)
from pfamalign.checkpoint import read_training_record
from pfamalign.model import Aligner, aligner_loss, objective
from pfamalign.outputs import open_output, table_console

BASELINES: dict[str, Callable] = {
    "diagonal": lambda r: diagonal_pairs(len(r["q_seq"]), len(r["k_seq"])),
    "nw": lambda r: needleman_wunsch(r["q_seq"], r["k_seq"]).pairs,
    "sw": lambda r: smith_waterman(r["q_seq"], r["k_seq"]).pairs,
    "probcons": lambda r: external_align("probcons", r["q_seq"], r["k_seq"]).pairs,
    "muscle": lambda r: external_align("muscle", r["q_seq"], r["k_seq"]).pairs,
}
LABELS = {"model": "pfamalign", "diagonal": "diagonal", "nw": "NW-BLOSUM62", "sw": "SW-BLOSUM62",
          "probcons": "ProbCons", "muscle": "MUSCLE"}
PLAN_METRICS = ("reconstruction", "sparse_ce", "barycenter_mae", "within5",
                "monotonicity_violation")


def model_plan_metrics(real, row_dustbin, target, *, dustbin: bool, values=None,
                       outputs=None) -> PlanMetrics:
    """The plan metrics of one pair's head-mean plan (see the module docstring).

    ``real [Lq, Lk]``, ``row_dustbin [Lq]``: the plan over the real keys and each row's
    dustbin mass; ``dustbin``: whether the model has one. ``values [H, Lk, dv]`` and
    ``outputs [H, Lq, dv]`` (per head) give the reconstruction."""
    return plan_metrics(real, target, values=values, outputs=outputs,
                        dustbin_mass=row_dustbin if dustbin else None)


# ---- validation inside training -----------------------------------------------------------


@nnx.jit
def eval_batch(model: Aligner, batch: dict):
    """The training objective's metrics, the per-head dense plans ``[B, H, Lq + 1, Lk + 1]``,
    the values and the dustbin value of one padded batch (jitted per shape)."""
    _, metrics = aligner_loss(model, batch)
    q_len = jnp.where(batch["valid"], batch["q_len"], 0)
    k_len = jnp.where(batch["valid"], batch["k_len"], 0)
    plan, v, tv = model.head_plans(batch["q_feat"], batch["k_feat"], q_len, k_len)
    return metrics, plan, v, tv


def validate(model: Aligner, batches: Iterable[dict]) -> dict[str, float]:
    """Validation metrics of padded batches (``pipelines.reader``): the training objective
    (``val/loss``, ``val/recon``, ``val/ce``, ``val/mono``), the plan metrics
    (``val/<metric>``, ``model_plan_metrics``) and the diagonal reference scored with the same
    values (``diag/<metric>``); {} without pairs."""
    dustbin = model.cfg.dustbin
    device = jax.local_devices()[0]
    # parameters on the device before the first batch: host arrays (the training loop's copy)
    # would come back from eval_batch as device arrays, and the second batch recompile for them
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.device_put(state, device))
    # each term pooled over its own count (a mean of batch means would move with the batch size)
    counts = {"recon": "n_annotated", "ce": "n_ce", "mono": "n_mono", "encoder_aux": "n_pairs"}
    ours, diag, sums, weight = [], [], {k: 0.0 for k in counts}, {k: 0.0 for k in counts}
    for batch in batches:
        metrics, plan, v, tv = jax.device_get(eval_batch(model, jax.device_put(batch, device)))
        metrics = {**metrics, "n_pairs": int(np.sum(batch["valid"]))}  # aux: a mean over the pairs
        for key, count in counts.items():
            sums[key] += float(metrics[key]) * float(metrics[count])
            weight[key] += float(metrics[count])
        for b in np.flatnonzero(batch["valid"]):
            ql, kl = int(batch["q_len"][b]), int(batch["k_len"][b])
            target = batch["target"][b, :ql]
            p = plan[b, :, :ql, :kl].astype(np.float64)  # [H, ql, kl]
            dust = plan[b, :, :ql, -1].astype(np.float64)  # [H, ql]
            values = v[b, :, :kl].astype(np.float64)  # [H, kl, dv]
            outputs = p @ values + dust[..., None] * tv[:, None, :]
            ours.append(model_plan_metrics(p.mean(0), dust.mean(0), target, dustbin=dustbin,
                                           values=values, outputs=outputs))
            diag.append(diagonal_plan_metrics(target, kl, values=values, dustbin=dustbin))
    if not ours:
        return {}
    terms = {k: sums[k] / max(weight[k], 1.0) for k in counts}
    out = {f"val/{k}": terms[k] for k in ("recon", "ce", "mono")}
    out["val/loss"] = objective(model.cfg, terms["recon"], terms["ce"], terms["mono"], terms["encoder_aux"])
    for prefix, items in (("val", ours), ("diag", diag)):
        pooled = PlanMetrics.pool(items)
        out.update({f"{prefix}/{m}": float(getattr(pooled, m)) for m in PLAN_METRICS})
    out["val/n_pairs"] = len(ours)
    return out


# ---- scoring against reference alignments ---------------------------------------------------


@dataclasses.dataclass
class Evaluation:
    """Per-method aligned-pair counts ``[N, 3]``, plan metrics and seconds, plus per-pair
    identity and family (version-free accession: the family bootstrap's clusters);
    ``reliability``: per-bin sums ``[bins, 4]`` (``metrics.reliability_sums``) of the methods
    with confidences; ``skipped``: requested baselines that could not run, with the reason."""

    methods: list[str]
    counts: dict[str, list] = dataclasses.field(default_factory=dict)
    plan: dict[str, list] = dataclasses.field(default_factory=dict)
    pid: list = dataclasses.field(default_factory=list)
    families: list = dataclasses.field(default_factory=list)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    reliability: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def summary(self, *, n_boot: int = 1000, seed: int = 0) -> dict:
        pid = np.asarray(self.pid, np.float64)
        out = {"n_pairs": len(self.pid), "n_families": len(set(self.families)), "n_boot": n_boot,
               "methods": {}, "skipped_baselines": dict(self.skipped)}
        for m in self.methods:
            entry = {"label": LABELS.get(m, m), "seconds": self.seconds.get(m, 0.0),
                     "prf": prf_by_identity(np.asarray(self.counts[m], np.int64).reshape(-1, 3), pid,
                                            n_boot=n_boot, seed=seed)}
            if self.plan.get(m):
                entry["plan_metrics"] = PlanMetrics.pool(self.plan[m]).to_dict()
            if m in self.reliability:
                entry["reliability"] = reliability(self.reliability[m])
            out["methods"][m] = entry
        if "model" in self.methods:  # paired: model minus each baseline on the same pairs
            model = np.asarray(self.counts["model"], np.int64).reshape(-1, 3)
            for key, groups in (("model_minus", None), ("model_minus_by_family", self.families)):
                out[key] = {m: paired_f1_difference(model, np.asarray(self.counts[m], np.int64).reshape(-1, 3),
                                                    pid, groups=groups, n_boot=n_boot, seed=seed)
                            for m in self.methods if m != "model"}
        return out


def model_plans(predictor, records: Sequence[dict], *, features: str = "records",
                batch_size: int = 8, symmetric: bool = True) -> Iterator:
    """The model's ``PairPlan`` of each record, in order: from the records' stored
    embeddings (``features="records"``) or embedding their residues (``"featurize"``).
    Symmetrized, as ``align`` decodes it (``symmetric=False``: the A -> B transport plan
    the training loop validates): eval and tuning score what the user gets, and each
    sequence is encoded once, so both directions cost less than one did through nnx.jit."""
    if features == "records":
        feats = [(r["q_feat"], r["k_feat"]) for r in records]
    else:
        flat = predictor.featurize([s for r in records for s in (r["q_seq"], r["k_seq"])])
        feats = list(zip(flat[0::2], flat[1::2]))
    return predictor.plans(feats, batch_size=batch_size, symmetric=symmetric)


def evaluate(records: Iterable[dict], *, predictor=None, features: str = "records",
             baselines: Sequence[str] = ("diagonal", "nw", "sw"), decoding=None,
             batch_size: int = 8, symmetric: bool = True, advance=lambda n=1: None) -> Evaluation:
    """Scores the model (when ``predictor`` is given) and the baselines on ``records``.

    Records are pair dicts with ``q_seq``, ``k_seq``, ``target`` and ``pid`` (the pipelines'
    pair record); with ``features="records"`` they also carry ``q_feat`` / ``k_feat`` (the
    dataset's stored embeddings), with ``features="featurize"`` the predictor embeds residues.
    ``decoding``: DecoderSettings for the model (default: the model's own); ``symmetric``:
    ``model_plans``' (the plan ``align`` decodes; False: the one-direction plan). An external
    baseline whose binary is not installed is left out and named in ``Evaluation.skipped``.
    """
    for b in baselines:
        if b not in BASELINES:
            raise ValueError(f"unknown baseline {b!r}; choose from {sorted(BASELINES)}")
    skipped = {b: EXTERNAL_ALIGNERS[b].missing() for b in baselines if b in EXTERNAL_ALIGNERS}
    skipped = {b: why for b, why in skipped.items() if why}
    baselines = [b for b in baselines if b not in skipped]
    methods = (["model"] if predictor is not None else []) + baselines
    if not methods:
        raise ValueError("nothing to score: no model and no baselines"
                         + (f" ({'; '.join(skipped.values())})" if skipped else ""))
    dustbin = predictor is not None and predictor.config.dustbin
    ev = Evaluation(methods, {m: [] for m in methods}, {"model": [], "diagonal": []},
                    seconds={m: 0.0 for m in methods}, skipped=skipped)
    if predictor is not None:
        ev.reliability["model"] = np.zeros((RELIABILITY_BINS, len(RELIABILITY_SUMS)))
    pending: list[dict] = []

    def flush():
        if predictor is not None and pending:
            start = time.perf_counter()
            plans = list(model_plans(predictor, pending, features=features, batch_size=batch_size,
                                     symmetric=symmetric))
            seqs = [(r["q_seq"], r["k_seq"]) for r in pending]
            for r, pp, aln in zip(pending, plans, predictor.decode_batch(plans, seqs, decoding)):
                ev.counts["model"].append(alignment_counts(aln.pairs, r["target"]))
                if aln.confidence is not None:
                    ev.reliability["model"] += reliability_sums(
                        aln.confidence, pairs_in_reference(aln.pairs, r["target"]))
                ev.plan["model"].append(model_plan_metrics(pp.real, pp.row_dustbin, r["target"],
                                                           dustbin=dustbin))
            ev.seconds["model"] += time.perf_counter() - start
        advance(len(pending))
        pending.clear()

    from pfamalign.pipelines.stockholm import accession_base

    for rec in records:
        target = np.asarray(rec["target"])
        ev.pid.append(float(rec["pid"]))
        # one cluster of the family bootstrap per family, not per Pfam version of it (the
        # seed and hmmalign files of RRM_1 are PF00076.13 and .25: the splits keep them together)
        ev.families.append(accession_base(rec.get("family", "")))
        for b in baselines:
            start = time.perf_counter()
            try:
                pairs = BASELINES[b](rec)
            except ExternalAlignerError as err:  # name the pair: the user can rerun it alone
                raise ExternalAlignerError(f"{err} (on the pair {rec.get('q_id', '?')} / "
                                           f"{rec.get('k_id', '?')})") from err
            ev.seconds[b] += time.perf_counter() - start
            ev.counts[b].append(alignment_counts(pairs, target))
        ev.plan["diagonal"].append(diagonal_plan_metrics(target, len(rec["k_seq"]), dustbin=dustbin))
        pending.append(rec)
        if len(pending) >= 4 * batch_size:
            flush()
    flush()
    return ev


def sample_across_families(families: Sequence[str], max_pairs: int, *, seed: int = 0,
                           shuffle_families: bool = True) -> np.ndarray:
    """Sorted indices of at most ``max_pairs`` items, drawn round-robin over the families
    (``families``: one label per item): each round takes one random item of every family
    not yet exhausted, families in a random order. Every family is represented when
    ``max_pairs`` >= the number of families, family counts differ by at most one (beyond
    exhausted families) and the draw is a function of ``seed``. ``shuffle_families=False``:
    the families in sorted order in every round, and no draw for that order (each family's
    items drawn first from the seed): the test pairs of ``scripts/crossval.py``, whose
    published figures were made with this draw."""
    labels = np.unique(np.asarray(families, dtype=str), return_inverse=True)[1].reshape(-1)
    rng = np.random.default_rng(seed)
    count = labels.max() + 1 if labels.size else 0
    position = rng.permutation(count) if shuffle_families else np.arange(count)
    rank = np.empty(labels.size, np.int64)  # the round in which each item is drawn
    for family in range(position.size):
        members = rng.permutation(np.flatnonzero(labels == family))
        rank[members] = np.arange(members.size)
    order = np.lexsort((position[labels], rank))  # by round, then family position
    return np.sort(order[:max(max_pairs, 0)])


def stockholm_records(paths, *, pairs_per_family: int, seed: int, max_len: int = 1022, errors=None,
                      left_out: list[str] | None = None):
    """Pair records sampled from Stockholm files (the same sampler as `prepare`). A malformed
    family raises, or with ``errors`` (a ``batch.BatchErrors``) is reported there (file:line)
    and skipped; a family that yields no pair (too short, one sequence) is named in
    ``left_out`` (``file:line: family K: why``), and so is a second copy of a family key
    (a directory and a file in it, or a copy: its pairs would count twice), as `prepare`
    leaves it out."""
    from pfamalign.inputs import BadRecord
    from pfamalign.pipelines.pairs import SamplingConfig, sample_family
    from pfamalign.pipelines.stockholm import StockholmError, expand_inputs, iter_inputs, parse_family

    paths = [str(p) for p in paths]
    if not expand_inputs(paths)[0]:
        raise ValueError(f"no Stockholm files in {', '.join(paths)} (a directory contributes its *.sto / "
                         "*.stockholm files and files starting with a '# STOCKHOLM' line)")
    cfg = SamplingConfig(pairs_per_family=pairs_per_family, max_len=max_len)
    first_read: dict[str, str] = {}  # family key -> file:line of its first copy
    for raw in iter_inputs(paths, skip_bad=errors is not None):
        where = f"{raw.source}:{raw.start_line}"
        if raw.error is None and raw.key in first_read:
            if left_out is not None:
                left_out.append(f"{where}: family {raw.key}: a second copy (first read at "
                                f"{first_read[raw.key]}; its pairs would count twice)")
            continue
        try:
            family = parse_family(raw)
        except StockholmError as err:
            if errors is None:
                raise
            errors.add(BadRecord(f"{err.path}:{err.line}", err.message))
            continue  # a malformed copy claims no key (as in `prepare --skip-bad`)
        first_read[raw.key] = where
        sampled = sample_family(family, cfg, seed=seed, split="eval")
        if not sampled.pairs and left_out is not None:  # said, not silently dropped
            why = sampled.skip or "no pair of its sequences shares enough aligned columns"
            if sampled.seq_skips:
                why += " (" + ", ".join(f"{n} {what}" for what, n in sorted(sampled.seq_skips.items())) + ")"
            left_out.append(f"{raw.source}:{raw.start_line}: family {family.key}: {why}")
        yield from sampled.pairs


def pair_records(*, data=None, split: str = "test", stockholm: Sequence = (),
                 pairs_per_family: int = 50, seed: int = 0, max_pairs: int | None = None,
                 embedder_id: str | None = None, errors=None, left_out: list[str] | None = None,
                 shuffle_families: bool = True) -> tuple[Iterable[dict], int, str]:
    """``(records, how many, features)`` of one source: a dataset split (``data``), else
    pairs sampled from the ``stockholm`` files. ``max_pairs`` draws that many across the
    families (``sample_across_families``, seeded by ``seed``, ``shuffle_families`` as there)
    rather than the first ones, which would all come from one family. ``features`` is
    ``"records"`` when the dataset's stored embeddings are the model's (``embedder_id``),
    else ``"featurize"``."""
    if data is not None:
        from pfamalign.pipelines import reader

        ds = reader.PairDataset(data)
        ds.require_pairs(split, data)
        same = embedder_id is not None and ds.embedder_id == embedder_id
        source = ds.source(split, features=same)
        chosen = range(len(source))
        if max_pairs is not None and max_pairs < len(source):
            families = [r["family"] for r in reader.iter_pairs(data, split)]
            chosen = sample_across_families(families, max_pairs, seed=seed,
                                            shuffle_families=shuffle_families)
        return (source[i] for i in chosen), len(chosen), "records" if same else "featurize"
    records = list(stockholm_records(stockholm, pairs_per_family=pairs_per_family, seed=seed,
                                     errors=errors, left_out=left_out))
    if max_pairs is not None and max_pairs < len(records):
        chosen = sample_across_families([r["family"] for r in records], max_pairs, seed=seed,
                                        shuffle_families=shuffle_families)
        records = [records[i] for i in chosen]
    return records, len(records), "featurize"


def training_overlap(model_dir, families: Iterable[str]) -> dict | None:
    """The evaluated families (keys or accessions) that the model in ``model_dir`` trained on
    (``trained_on``) or had its decoder tuned on (``tuned_on``), by version-free accession,
    from the model's training record; None when the model has none."""
    from pfamalign.pipelines.stockholm import accession_base

    record = read_training_record(model_dir)
    if record is None or "trained_on" not in record:  # (an ensemble of models without records)
        return None
    evaluated = {accession_base(f) for f in families}
    return {"trained_on": sorted(evaluated & set(record["trained_on"]["families"])),
            "tuned_on": sorted(evaluated & set((record.get("decoder") or {}).get("families", [])))}


def run(*, data=None, split: str = "test", stockholm: Sequence = (), pairs_per_family: int = 50,
        max_pairs: int | None = None, predictor=None,
        baselines: Sequence[str] = ("diagonal", "nw", "sw"), decoding=None, n_boot: int = 1000,
        seed: int = 0, json_path=None, plot_path=None, quiet: bool = False, errors=None) -> dict:
    """``pfamalign eval``: scores the pairs of one source (``pair_records``), writes the JSON
    and the plot (atomically) when asked, and returns the summary; with a model, the summary's
    ``training_overlap`` names the scored families the model trained or was tuned on.
    ValueError for unusable inputs; a malformed Stockholm family goes to ``errors`` (a
    ``batch.BatchErrors``; None: it raises) and into the summary's ``errors``."""
    from pfamalign.pipelines.progress import Bars, progress_enabled

    embedder_id = predictor.config.embedder_id if predictor is not None else None
    left_out: list[str] = []
    records, total, features = pair_records(
        data=data, split=split, stockholm=stockholm, pairs_per_family=pairs_per_family, seed=seed,
        max_pairs=max_pairs, embedder_id=embedder_id, errors=errors, left_out=left_out)
    with Bars(progress_enabled(quiet)) as bars:
        ev = evaluate(records, predictor=predictor, features=features, baselines=baselines,
                      decoding=decoding, advance=bars.task("scoring pairs", total))
    if not ev.pid:
        why = left_out + [str(e) for e in (errors.records if errors is not None else [])]
        raise ValueError("no pairs to score" + (f": {'; '.join(why[:3])}" if why else ""))
    summary = ev.summary(n_boot=n_boot, seed=seed)
    summary["left_out"] = left_out
    if errors is not None:
        summary["errors"] = [{"where": e.where, "error": str(e)} for e in errors.records]
    # what was scored on what, as every output of `align` records it
    summary["source"] = {**({"data": str(data), "split": split} if data is not None
                            else {"stockholm": [str(s) for s in stockholm], "pairs_per_family": pairs_per_family}),
                         "max_pairs": max_pairs, "seed": seed}
    if predictor is not None:
        summary["training_overlap"] = training_overlap(predictor.path, ev.families)
        summary["provenance"] = predictor.provenance(decoding)
    if json_path:  # a user's file: links written through, devices in place, mode kept (outputs)
        with open_output(json_path) as sink:
            sink.write(jsonio.dumps(summary, indent=2, sort_keys=True) + "\n")
    if plot_path:
        plot(summary, plot_path)
    return summary


# ---- reporting ----------------------------------------------------------------------------------


def _numbers(cell: dict) -> tuple[float, float, float]:
    """``(value, low, high)``: a summary read back from its JSON holds null where it had NaN."""
    return tuple(np.nan if cell[k] is None else cell[k] for k in ("value", "low", "high"))


def _fmt(cell: dict) -> str:
    v, lo, hi = _numbers(cell)
    if not np.isfinite(v):
        return "—"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) else f"{v:.3f}"


def _fmt_value(cell: dict) -> str:
    """The value alone; "—" where it is undefined (NaN, or null read back from JSON)."""
    v = _numbers(cell)[0]
    return f"{v:.3f}" if np.isfinite(v) else "—"


def _fmt_signed(cell: dict, value: bool = True) -> str:
    v, lo, hi = _numbers(cell)
    if not np.isfinite(v):
        return "—"
    ci = f"[{lo:+.3f}, {hi:+.3f}]" if np.isfinite(lo) else ""
    return f"{v:+.3f} {ci}".strip() if value else (ci or "—")


def render(summary: dict, console=None) -> None:
    """Prints the F1 table (by identity bin) and the plan-metric table with rich."""
    from rich.table import Table

    console = console or table_console()
    for error in summary.get("errors", ()):
        console.print(f"skipped (malformed): {error['error']}", markup=False, highlight=False)
    bins = ["all"] + [name for name, _, _ in IDENTITY_BINS]
    first = next(iter(summary["methods"].values()))["prf"]
    # n_boot 0 computes no intervals (summaries from before n_boot was recorded had them)
    ci = _interval_words(summary, "95% bootstrap CI", "no CI")
    prov = summary.get("provenance")
    model = f"\npfamalign: {prov['model']}, {prov['decoder']['name']} decoder" if prov else ""
    substitution = ("; NW/SW: BLOSUM62, gap open 11, extend 1"
                    if {"nw", "sw"} & set(summary["methods"]) else "")  # only beside their rows
    tab = Table(title=f"aligned-pair F1 (micro, {ci}) — {_counted(summary, 'n_pairs', 'pair')}, "
                      f"{_counted(summary, 'n_families', 'family')}{substitution}{model}")
    tab.add_column("method", no_wrap=True)
    for b in bins:
        tab.add_column(f"{b} (n={first[b]['n_pairs']})", justify="right", no_wrap=True)
    tab.add_column("precision", justify="right")
    tab.add_column("recall", justify="right")
    for m, entry in summary["methods"].items():
        prf = entry["prf"]
        tab.add_row(entry["label"], *[_fmt(prf[b]["micro"]["f1"]) for b in bins],
                    _fmt_value(prf["all"]["micro"]["precision"]), _fmt_value(prf["all"]["micro"]["recall"]))
    console.print(tab)
    for m, why in summary.get("skipped_baselines", {}).items():
        console.print(f"[bold]{LABELS.get(m, m)} not scored[/bold]: {why}")
    console.print("seconds per method: " + ", ".join(
        f"{e['label']} {e['seconds']:.1f}" for e in summary["methods"].values()))
    for entry in summary["methods"].values():
        if "reliability" in entry:
            rel = entry["reliability"]
            num = lambda x: "—" if x is None or not np.isfinite(x) else f"{x:.4f}"
            console.print(f"calibration of {entry['label']}'s pair confidences: ECE "
                          f"{num(rel['ece'])}, Brier {num(rel['brier'])} over {rel['n_pairs']} "
                          f"aligned pairs (per confidence bin: --json, --plot)")
    if summary.get("model_minus"):
        paired = "paired bootstrap 95% CI: resampling pairs / whole families" if summary.get("n_boot", 1) else ci
        tab = Table(title=f"pfamalign minus baseline, micro F1 ({paired})")
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
        finite = lambda x: x is not None and np.isfinite(x)  # noqa: E731  (null once read back from JSON)
        # a metric no method has (reconstruction without a reconstruction head) is left out, not a column of —
        names = [n for n in names if any(finite(pm.get(n)) for pm in plan_methods.values())]
        tab = Table(title="plan metrics")
        tab.add_column("method", no_wrap=True)
        for n in names:
            tab.add_column(n, justify="right")
        for m, pm in plan_methods.items():
            tab.add_row(LABELS.get(m, m), *[f"{pm[n]:.4f}" if finite(pm.get(n)) else "—" for n in names])
        console.print(tab)


# One colour per method in every figure (the colour cycle would give "diagonal" another colour
# when the model is left out)
METHOD_COLOURS = {"model": "tab:red", "probcons": "tab:blue", "muscle": "tab:purple",
                  "nw": "tab:green", "sw": "tab:olive", "diagonal": "tab:gray"}
_BIN_LABELS = {"all": "all", "<30": "<30 %", "30-50": "30–50 %", ">=50": "≥50 %"}


def figure(summary: dict):
    """Grouped bars: micro F1 with its 95 % interval per method and identity bin (a bin
    without pairs is marked, not drawn as zero; no interval without a bootstrap); beside
    them, when a method has confidences, its reliability panel (``_reliability_panel``)."""
    from matplotlib.figure import Figure

    bins = ["all"] + [name for name, _, _ in IDENTITY_BINS]
    methods = list(summary["methods"])
    calibrated = [m for m in methods if "reliability" in summary["methods"][m]]
    fig = Figure(figsize=(8 + 4.5 * bool(calibrated), 4.8))
    if calibrated:
        ax, rel_ax = fig.subplots(1, 2, width_ratios=[8, 4.5])
    else:
        ax = fig.add_subplot(111)
    width = 0.8 / max(len(methods), 1)
    for n, m in enumerate(methods):
        prf = summary["methods"][m]["prf"]
        vals, lo, hi = (np.array([prf[b]["micro"]["f1"][k] for b in bins], np.float64)
                        for k in ("value", "low", "high"))
        x = np.arange(len(bins)) + (n - (len(methods) - 1) / 2) * width
        colour = METHOD_COLOURS.get(m, f"C{n}")
        shown = np.isfinite(vals)
        ax.bar(x[shown], vals[shown], width, color=colour, label=summary["methods"][m]["label"])
        ci = shown & np.isfinite(lo) & np.isfinite(hi)
        if ci.any():
            ax.errorbar(x[ci], vals[ci], yerr=np.stack([vals - lo, hi - vals])[:, ci], fmt="none",
                        ecolor="black", elinewidth=0.8, capsize=3)
    counts = [summary["methods"][methods[0]]["prf"][b]["n_pairs"] for b in bins]
    for k, count in enumerate(counts):
        if count == 0:
            ax.text(k, 0.02, "no pairs", ha="center", va="bottom", fontsize=8, color="grey")
    ax.set_xticks(np.arange(len(bins)))
    ax.set_xlim(-0.5, len(bins) - 0.5)  # every bin's place, an empty one too
    ax.set_xticklabels([f"{_BIN_LABELS.get(b, b)}\n(n={c})" for b, c in zip(bins, counts)])
    ax.set_xlabel("percent identity of the reference pair")
    ax.set_ylabel("aligned-pair F1 (micro)")
    ax.set_ylim(0, 1.2)  # room above 1 for the intervals' caps and the legend
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.legend(fontsize=8, loc="upper center", ncol=min(len(methods), 3), frameon=False)
    interval = _interval_words(summary, "95 % bootstrap intervals over pairs", "no intervals")
    ax.set_title(f"{_counted(summary, 'n_pairs', 'pair')} of {_counted(summary, 'n_families', 'family')}; "
                 f"{interval}", fontsize=9)
    if calibrated:
        _reliability_panel(rel_ax, {summary["methods"][m]["label"]: (summary["methods"][m]["reliability"],
                                                                     METHOD_COLOURS.get(m, f"C{methods.index(m)}"))
                                    for m in calibrated})
    fig.tight_layout()
    return fig


def _reliability_panel(ax, tables: dict) -> None:
    """Reliability curve per method (label -> (``metrics.reliability`` table, colour)):
    precision against mean confidence per non-empty bin, marker area by the bin's share of
    the pairs; grey bars on the right-hand axis: the share of pairs per bin (of the first
    method); the diagonal is perfect calibration."""
    share_ax = ax.twinx()
    ax.set_zorder(share_ax.get_zorder() + 1)  # the curves over the bars
    ax.patch.set_visible(False)
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="calibrated")
    for n, (label, (rel, colour)) in enumerate(tables.items()):
        bins = [b for b in rel["bins"] if b["count"]]
        share = np.array([b["count"] for b in bins], np.float64) / max(rel["n_pairs"], 1)
        if n == 0:
            share_ax.bar([b["low"] for b in rel["bins"]],
                         [b["count"] / max(rel["n_pairs"], 1) for b in rel["bins"]],
                         width=[b["high"] - b["low"] for b in rel["bins"]], align="edge", color="lightgrey")
        ece = "—" if rel["ece"] is None or not np.isfinite(rel["ece"]) else f"{rel['ece']:.3f}"
        x, y = [b["mean_confidence"] for b in bins], [b["precision"] for b in bins]
        ax.plot(x, y, "-", marker=".", color=colour, label=f"{label} (ECE {ece}; area: share of pairs)")
        ax.scatter(x, y, s=20 + 400 * share, alpha=0.4, color=colour)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.03)
    share_ax.set_ylim(0, 1.03)
    share_ax.set_ylabel("share of aligned pairs (grey bars)", fontsize=8)
    share_ax.tick_params(labelsize=7)
    ax.set_xlabel("confidence of an aligned pair (bin mean)")
    ax.set_ylabel("precision (fraction in the reference)")
    ax.set_title("reliability", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", frameon=False)  # above a calibrated curve: empty


def plot(summary: dict, path) -> pathlib.Path:
    """``figure`` written atomically, in the format of ``path``'s extension."""
    from pfamalign.alignment.plots import figure_format, save_figure
    from pfamalign.outputs import atomic_path

    fmt = figure_format(path)
    with atomic_path(path) as tmp:
        save_figure(figure(summary), tmp, dpi=120, fmt=fmt)
    return pathlib.Path(path)


def _counted(summary: dict, key: str, noun: str) -> str:
    """``"1 pair"``, ``"5 families"``: a count of the summary and its noun, agreeing."""
    n = summary.get(key, "?")
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def _interval_words(summary: dict, some: str, none: str) -> str:
    """What the intervals of a summary are: ``some``, or why there are none (``--bootstrap
    0``, or too few pairs or families to resample: every bound null)."""
    if not summary.get("n_boot", 1):
        return f"{none} (--bootstrap 0)"
    bounds = [by_bin["micro"]["f1"][k] for entry in summary.get("methods", {}).values()
              for by_bin in entry["prf"].values() for k in ("low", "high")]
    if bounds and all(x is None or not np.isfinite(x) for x in bounds):
        return f"{none} (too few pairs to resample)"
    return some


def to_json(summary: dict) -> str:
    return jsonio.dumps(summary)
