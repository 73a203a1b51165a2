"""Evaluation metrics (docs/design.md §5), numpy only: aligned-pair P/R/F1 and the plan
metrics.

Aligned-pair metrics
--------------------
Per sequence pair, predicted and reference pairs are compared as *sets* of ``(i, j)``
(duplicates counted once): ``tp = |pred ∩ ref|``. Over a set of N sequence pairs:

* **micro** (the headline): pool the counts, ``P = sum tp / sum |pred|``, ``R = sum tp /
  sum |ref|``, ``F1 = 2 sum tp / (sum |pred| + sum |ref|)``. Every reference pair weighs the
  same, so long alignments weigh more.
* **macro**: mean over sequence pairs of the per-pair P, R, F1. A per-pair value whose
  denominator is 0 is undefined (NaN) and left out of the mean: precision when nothing was
  predicted, recall when the reference has no pair, F1 when both are empty. (Predicting nothing
  against a non-empty reference therefore scores recall 0 and F1 0, precision undefined.)

95 % intervals: percentile bootstrap over sequence pairs (resampling the N pairs with
replacement, ``n_boot`` times, ``numpy.random.default_rng(seed)``). Resamples depend only on
``(seed, N, n_boot)``, so two methods scored on the same pairs with the same seed see the same
resamples. Percent-identity bins are half-open: ``<30`` = [0, 30), ``30-50`` = [30, 50),
``>=50`` = [50, 100].

Reliability (calibration of the per-pair confidences)
-----------------------------------------------------
Each aligned pair of a method with confidences (the model) is one sample ``(c, y)``: its
confidence clipped to [0, 1] and whether the pair is in the reference. ``RELIABILITY_BINS``
equal bins on [0, 1] (right-closed last bin, so c = 1 lands in it); per bin the count, mean
confidence and precision (mean y). ECE = sum over bins of ``count / N * |precision - mean
confidence|``; Brier = mean ``(c - y)^2``. Everything derives from per-bin sums
(``reliability_sums``), so pairs and crossval folds pool by adding them.

Plan metrics (annotated rows: ``target[i] = c_i >= 0``)
--------------------------------------------------------
* reconstruction ``||O_i - V_{c_i}||^2`` summed over value dims, mean over annotated rows and
  heads;
* sparse CE ``-log P_{i, c_i}``; with a dustbin (``dustbin_mass`` given) unaligned rows count
  too, with ``-log P_{i, dustbin}``; probabilities are floored at ``min_prob`` so a zero
  (off-support) entry gives a large finite value;
* barycenter ``b_i = sum_j P_ij j / sum_j P_ij`` over the real keys (undefined, and left out,
  when a row has no real mass); MAE ``|b_i - c_i|``; within-5 = fraction with
  ``|b_i - c_i| <= 5``;
* monotonicity violation: over adjacent row pairs ``(i, i + 1)`` that are both annotated (and
  both have a barycenter), the fraction with ``b_{i+1} < b_i``;
* the diagonal reference: the point-mass plan of ``diagonal_target`` scored with the same
  metrics and the same V (``diagonal_plan_metrics``).
Leading axes of the plan (heads, or batch x heads of one sequence pair) are averaged over.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from pfamalign.alignment.pairs import check_target, diagonal_target, pairs_from_target

IDENTITY_BINS = (("<30", 0.0, 30.0), ("30-50", 30.0, 50.0), (">=50", 50.0, np.inf))
PRF_NAMES = ("precision", "recall", "f1")


# ---------------------------------------------------------------------------------------------
# Aligned-pair precision / recall / F1
# ---------------------------------------------------------------------------------------------

def _pair_keys(pairs, base: int) -> np.ndarray:
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if arr.size and arr.min() < 0:
        raise ValueError(f"pair indices must be >= 0, got {arr.min()}")
    return np.unique(arr[:, 0] * base + arr[:, 1])


def pair_counts(predicted, reference) -> tuple[int, int, int]:
    """``(tp, n_predicted, n_reference)`` of two pair sets ``[n, 2]`` (duplicates once)."""
    pred = np.asarray(predicted, dtype=np.int64).reshape(-1, 2)
    ref = np.asarray(reference, dtype=np.int64).reshape(-1, 2)
    base = int(max(pred[:, 1].max(initial=0), ref[:, 1].max(initial=0))) + 1
    pk, rk = _pair_keys(pred, base), _pair_keys(ref, base)
    return int(np.intersect1d(pk, rk, assume_unique=True).size), int(pk.size), int(rk.size)


def alignment_counts(predicted, target) -> tuple[int, int, int]:
    """``pair_counts`` against the reference pairs of ``target [Lq]`` (key index or -1)."""
    target = check_target(target)
    pred = np.asarray(predicted, dtype=np.int64).reshape(-1, 2)
    if pred.size and pred[:, 0].max() >= len(target):
        raise ValueError(
            f"predicted query index {pred[:, 0].max()} out of range for target length "
            f"{len(target)}")
    return pair_counts(pred, pairs_from_target(target))


def prf(tp, n_predicted, n_reference) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall, F1 from counts (scalars or arrays); NaN where undefined."""
    tp, npred, nref = (np.asarray(x, dtype=np.float64) for x in (tp, n_predicted, n_reference))
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(npred > 0, tp / npred, np.nan)
        recall = np.where(nref > 0, tp / nref, np.nan)
        f1 = np.where(npred + nref > 0, 2 * tp / (npred + nref), np.nan)
    return precision, recall, f1


def _check_counts(counts) -> np.ndarray:
    arr = np.asarray(counts, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"counts must be [N, 3] (tp, n_predicted, n_reference), got {arr.shape}")
    if arr.size and (arr.min() < 0 or np.any(arr[:, 0] > arr[:, 1:].min(axis=1))):
        raise ValueError("counts must be >= 0 with tp <= n_predicted and tp <= n_reference")
    return arr


def _micro(sums: np.ndarray) -> np.ndarray:
    """``[..., 3]`` pooled counts -> ``[..., 3]`` (precision, recall, F1)."""
    return np.stack(prf(sums[..., 0], sums[..., 1], sums[..., 2]), axis=-1)


def _nanmean(x: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)  # all-NaN slices -> NaN
        return np.nanmean(x, axis=axis)


def prf_summary(counts, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """Micro and macro P/R/F1 over sequence pairs with percentile-bootstrap intervals.

    Args:
      counts: ``[N, 3]`` per sequence pair ``(tp, n_predicted, n_reference)``.
      n_boot: bootstrap resamples (0 disables the intervals: low = high = NaN).
      seed: seed of ``numpy.random.default_rng``.
      level: central interval mass.

    Returns:
      ``{"n_pairs": N, "micro": {"precision": {"value", "low", "high"}, "recall": ...,
      "f1": ...}, "macro": {...}}``; every number is NaN when N == 0, the intervals when N < 2.
    """
    counts = _check_counts(counts)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    n = len(counts)
    per_pair = np.stack(prf(*counts.T), axis=-1) if n else np.zeros((0, 3))  # [N, 3]
    micro = _micro(counts.sum(axis=0)) if n else np.full(3, np.nan)  # [3]
    macro = _nanmean(per_pair, axis=0) if n else np.full(3, np.nan)  # [3]

    lo = hi = np.full((2, 3), np.nan)  # [micro/macro, metric]
    if n >= 2 and n_boot:  # one pair has no spread to resample: no interval (as paired_f1_difference)
        rng = np.random.default_rng(seed)
        chunk = max(1, 2_000_000 // n)
        boot = []  # [n_boot, 2, 3]
        for start in range(0, n_boot, chunk):
            idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))  # [b, N]
            boot.append(np.stack([_micro(counts[idx].sum(axis=1)),
                                  _nanmean(per_pair[idx], axis=1)], axis=1))
        boot = np.concatenate(boot)
        alpha = 100 * (1 - level) / 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=RuntimeWarning)
            lo, hi = np.nanpercentile(boot, [alpha, 100 - alpha], axis=0)

    def table(k, point):
        return {name: {"value": float(point[m]), "low": float(lo[k, m]), "high": float(hi[k, m])}
                for m, name in enumerate(PRF_NAMES)}

    return {"n_pairs": n, "micro": table(0, micro), "macro": table(1, macro)}


def identity_bin(percent_identity) -> np.ndarray:
    """Bin label per value (percent in [0, 100]): ``"<30"``, ``"30-50"`` or ``">=50"``."""
    pid = np.asarray(percent_identity, dtype=np.float64)
    if np.any(~np.isfinite(pid)) or np.any((pid < 0) | (pid > 100)):
        raise ValueError("percent identity must be in [0, 100] (a percentage, not a fraction)")
    labels = np.empty(pid.shape, dtype=object)
    for name, low, high in IDENTITY_BINS:
        labels[(pid >= low) & (pid < high)] = name
    return labels


def prf_by_identity(counts, percent_identity, *, n_boot: int = 1000, seed: int = 0,
                    level: float = 0.95) -> dict:
    """``prf_summary`` overall (``"all"``) and per percent-identity bin (every bin present,
    NaN when it holds no pair)."""
    counts = _check_counts(counts)
    labels = identity_bin(percent_identity)
    if labels.shape != (len(counts),):
        raise ValueError(
            f"percent_identity must have shape ({len(counts)},), got {labels.shape}")
    out = {"all": prf_summary(counts, n_boot=n_boot, seed=seed, level=level)}
    for name, _, _ in IDENTITY_BINS:
        out[name] = prf_summary(counts[labels == name], n_boot=n_boot, seed=seed, level=level)
    return out


def paired_f1_difference(counts_a, counts_b, percent_identity, *, groups=None, n_boot: int = 1000,
                         seed: int = 0, level: float = 0.95) -> dict:
    """Micro F1 of method a minus method b on the same pairs, with a *paired* percentile
    bootstrap (both methods resampled with the same indices), overall (``"all"``) and per
    identity bin: ``{bin: {"value", "low", "high", "n_pairs", "n_groups"}}``.

    ``groups``: a label per pair (e.g. its family) to resample whole groups (a cluster
    bootstrap: pairs of one family are not independent); None resamples pairs. A cell of one
    group has no interval (``low`` / ``high`` NaN): every resample would be that group.
    """
    a, b = _check_counts(counts_a), _check_counts(counts_b)
    if a.shape != b.shape:
        raise ValueError(f"the two methods must be scored on the same pairs: {a.shape} vs {b.shape}")
    labels = identity_bin(percent_identity)
    if labels.shape != (len(a),):
        raise ValueError(f"percent_identity must have shape ({len(a)},), got {labels.shape}")
    group_ids = np.arange(len(a)) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    if group_ids.shape != (len(a),):
        raise ValueError(f"groups must have one label per pair ({len(a)}), got shape {group_ids.shape}")
    rng = np.random.default_rng(seed)
    alpha = 100 * (1 - level) / 2
    f1 = lambda sums: _micro(sums)[..., 2]  # noqa: E731
    out = {}
    for name, mask in [("all", np.ones(len(a), bool))] + [(n, labels == n) for n, _, _ in IDENTITY_BINS]:
        in_cell = np.unique(group_ids[mask], return_inverse=True)[1]  # each pair's group, 0 .. G-1
        n_groups = int(in_cell.max()) + 1 if mask.any() else 0
        cell = {"value": float("nan"), "low": float("nan"), "high": float("nan"),
                "n_pairs": int(mask.sum()), "n_groups": n_groups}
        if n_groups:
            cell["value"] = float(f1(a[mask].sum(0)) - f1(b[mask].sum(0)))
        if n_groups >= 2 and n_boot:  # one group (one family) has no spread to resample: no CI
            # a resample's pooled counts: how often it drew each group times the group's counts
            # (integer sums, so exactly the sums of the resampled pairs' counts)
            per_group = [np.zeros((n_groups, 3), np.int64) for _ in (a, b)]
            for sums, counts in zip(per_group, (a[mask], b[mask])):
                np.add.at(sums, in_cell, counts)
            draws = rng.integers(0, n_groups, size=(n_boot, n_groups))
            diff = np.empty(n_boot)
            step = max(1, _BOOT_CELLS // n_groups)  # resamples at a time: a bounded [step, G] table
            for at in range(0, n_boot, step):
                part = draws[at:at + step]
                drawn = np.bincount((part + n_groups * np.arange(len(part))[:, None]).ravel(),
                                    minlength=len(part) * n_groups).reshape(len(part), n_groups)
                diff[at:at + step] = f1(drawn @ per_group[0]) - f1(drawn @ per_group[1])
            cell["low"], cell["high"] = (float(x) for x in np.nanpercentile(diff, [alpha, 100 - alpha]))
        out[name] = cell
    return out


_BOOT_CELLS = 1 << 22  # (resample, group) draw counts a paired bootstrap tallies at once (its
# draws themselves are made whole, [n_boot, groups], as the generator has always made them)


# ---------------------------------------------------------------------------------------------
# Reliability of the per-pair confidences
# ---------------------------------------------------------------------------------------------

RELIABILITY_BINS = 10
RELIABILITY_SUMS = ("count", "confidence", "correct", "squared_error")  # columns of the sums


def pairs_in_reference(pairs, target) -> np.ndarray:
    """``[n]`` bool: whether each predicted pair ``(i, j)`` is a reference pair of ``target``."""
    target = check_target(target)
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.size and (pairs.min() < 0 or pairs[:, 0].max() >= len(target)):
        raise ValueError(f"predicted pairs out of range for target length {len(target)}")
    return target[pairs[:, 0]] == pairs[:, 1]


def reliability_sums(confidence, correct, *, n_bins: int = RELIABILITY_BINS) -> np.ndarray:
    """Per-bin sums ``[n_bins, 4]`` (columns ``RELIABILITY_SUMS``: count, sum of confidence,
    sum of correct, sum of ``(c - y)^2``) of aligned pairs with ``confidence [n]`` (>= 0;
    clipped to 1: plan masses may exceed 1 by rounding) and ``correct [n]`` (bool)."""
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    y = np.asarray(correct).reshape(-1)
    if y.shape != conf.shape:
        raise ValueError(f"confidence and correct differ in length: {conf.size} vs {y.size}")
    if y.dtype != bool:
        raise ValueError(f"correct must be bool, got dtype {y.dtype}")
    if not np.all(np.isfinite(conf)) or (conf.size and conf.min() < 0):
        raise ValueError("confidences must be finite and >= 0")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    conf = np.minimum(conf, 1.0)
    b = np.minimum((conf * n_bins).astype(np.int64), n_bins - 1)  # [n]
    y = y.astype(np.float64)
    columns = (np.ones_like(conf), conf, y, (conf - y) ** 2)
    return np.stack([np.bincount(b, weights=w, minlength=n_bins) for w in columns], axis=1)


def reliability(sums) -> dict:
    """The reliability table of ``reliability_sums`` (added over any pairs / folds):
    ``{"bins": [{"low", "high", "count", "mean_confidence", "precision"}], "ece", "brier",
    "n_pairs"}``; an empty bin's means, and ECE / Brier without pairs, are NaN."""
    sums = np.asarray(sums, dtype=np.float64)
    if sums.ndim != 2 or sums.shape[1] != len(RELIABILITY_SUMS) or not len(sums):
        raise ValueError(f"sums must be [n_bins, {len(RELIABILITY_SUMS)}], got {sums.shape}")
    count, conf, correct, sq = sums.T
    n = count.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf, precision = conf / count, correct / count
        gaps = np.where(count > 0, np.abs(precision - mean_conf), 0.0)
        ece, brier = (np.sum(count * gaps) / n, sq.sum() / n) if n else (np.nan, np.nan)
    edges = np.linspace(0.0, 1.0, len(sums) + 1).round(12)  # 0.6, not 0.6000000000000001
    bins = [{"low": float(edges[k]), "high": float(edges[k + 1]), "count": int(count[k]),
             "mean_confidence": float(mean_conf[k]), "precision": float(precision[k])}
            for k in range(len(sums))]
    return {"bins": bins, "ece": float(ece), "brier": float(brier), "n_pairs": int(n)}


# ---------------------------------------------------------------------------------------------
# Plan metrics (docs/design.md §5.2)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PlanMetrics:
    """Plan metrics of one sequence pair (or pooled over many), with the counts they average.

    ``n_annotated`` rows x heads weigh reconstruction; ``n_ce`` rows x heads weigh sparse CE;
    ``n_barycenter`` weigh MAE and within-5; ``n_consecutive`` weigh monotonicity violation.
    A metric with count 0 is NaN.
    """

    reconstruction: float
    sparse_ce: float
    barycenter_mae: float
    within5: float
    monotonicity_violation: float
    n_annotated: int
    n_ce: int
    n_barycenter: int
    n_consecutive: int

    _WEIGHTS = {"reconstruction": "n_annotated", "sparse_ce": "n_ce",
                "barycenter_mae": "n_barycenter", "within5": "n_barycenter",
                "monotonicity_violation": "n_consecutive"}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def pool(cls, items) -> "PlanMetrics":
        """Pools over sequence pairs: each metric is the count-weighted mean (a mean over all
        rows of all pairs, not a mean of per-pair means). NaN metrics with count 0 are
        skipped; a metric that is NaN with a positive count (reconstruction without values)
        stays NaN."""
        items = list(items)
        if not items:
            raise ValueError("pool needs at least one PlanMetrics")
        fields = {}
        for metric, weight in cls._WEIGHTS.items():
            w = np.array([getattr(m, weight) for m in items], dtype=np.float64)
            x = np.array([getattr(m, metric) for m in items], dtype=np.float64)
            keep = w > 0
            fields[metric] = float(np.sum(x[keep] * w[keep]) / w[keep].sum()) if keep.any() \
                else float("nan")
        for weight in set(cls._WEIGHTS.values()):
            fields[weight] = int(sum(getattr(m, weight) for m in items))
        return cls(**fields)


def barycenters(plan) -> np.ndarray:
    """``b [..., Lq]``: ``sum_j P_ij j / sum_j P_ij`` over the real keys; NaN for a row with no
    real mass."""
    plan = np.asarray(plan, dtype=np.float64)
    if plan.ndim < 2:
        raise ValueError(f"plan must be [..., Lq, Lk], got {plan.shape}")
    mass = plan.sum(axis=-1)  # [..., Lq]
    first = plan @ np.arange(plan.shape[-1], dtype=np.float64)  # [..., Lq]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mass > 0, first / mass, np.nan)


def _mean(x: np.ndarray) -> tuple[float, int]:
    return (float(x.mean()) if x.size else float("nan")), int(x.size)


def plan_metrics(plan, target, *, values=None, outputs=None, dustbin_mass=None,
                 min_prob: float = 1e-12) -> PlanMetrics:
    """docs/design.md §5 plan metrics of one sequence pair.

    Args:
      plan: ``[..., Lq, Lk]`` plan over the real rows and keys (leading axes: heads).
      target: ``[Lq]`` reference key per query row, -1 for unaligned rows.
      values: ``V [..., Lk, dv]`` (broadcast against the plan's leading axes); needed for
        reconstruction (NaN without it).
      outputs: ``O [..., Lq, dv]``; defaults to ``P V``. Pass the model's output for dustbin
        configs, whose ``O_i`` includes the dustbin value.
      dustbin_mass: ``[..., Lq]`` mass of each row on the dustbin column; when given, unaligned
        rows enter the sparse CE with ``-log`` of it.
      min_prob: floor of the probabilities inside the CE log.
    """
    plan = np.asarray(plan, dtype=np.float64)
    if plan.ndim < 2 or plan.shape[-1] == 0 or plan.shape[-2] == 0:
        raise ValueError(f"plan must be a non-empty [..., Lq, Lk], got {plan.shape}")
    lq, lk = plan.shape[-2:]
    target = check_target(target, key_length=lk)
    if target.shape != (lq,):
        raise ValueError(f"target has length {len(target)} but the plan has Lq={lq}")
    if not 0 < min_prob < 1:
        raise ValueError(f"min_prob must be in (0, 1), got {min_prob}")
    ann = np.flatnonzero(target >= 0)  # annotated rows
    c = target[ann]  # their keys

    # reconstruction
    recon, n_ann = float("nan"), ann.size * int(np.prod(plan.shape[:-2], dtype=np.int64))
    if values is not None:
        values = np.asarray(values, dtype=np.float64)
        if values.ndim < 2 or values.shape[-2] != lk:
            raise ValueError(f"values must be [..., Lk={lk}, dv], got {values.shape}")
        if outputs is None:
            outputs = plan @ values  # [..., Lq, dv]
        outputs = np.asarray(outputs, dtype=np.float64)
        if outputs.ndim < 2 or outputs.shape[-2] != lq or outputs.shape[-1] != values.shape[-1]:
            raise ValueError(f"outputs must be [..., Lq={lq}, dv={values.shape[-1]}], "
                             f"got {outputs.shape}")
        err = np.sum((outputs[..., ann, :] - values[..., c, :]) ** 2, axis=-1)  # [..., n_ann]
        err = np.broadcast_to(err, np.broadcast_shapes(err.shape, plan.shape[:-2] + (ann.size,)))
        recon, n_ann = _mean(err)
    elif outputs is not None:
        raise ValueError("outputs given without values: reconstruction needs V")

    # sparse CE
    probs = [plan[..., ann, c]]  # [..., n_ann]
    if dustbin_mass is not None:
        dustbin_mass = np.asarray(dustbin_mass, dtype=np.float64)
        if dustbin_mass.shape[-1:] != (lq,):
            raise ValueError(f"dustbin_mass must be [..., Lq={lq}], got {dustbin_mass.shape}")
        dust = np.broadcast_to(dustbin_mass, plan.shape[:-1])
        probs.append(dust[..., target < 0])
    ce, n_ce = _mean(-np.log(np.maximum(np.concatenate(probs, axis=-1), min_prob)))

    # barycenter, within-5, monotonicity
    b = barycenters(plan)  # [..., Lq]
    err = np.abs(b[..., ann] - c)  # [..., n_ann], NaN where b undefined
    err = err[np.isfinite(err)]
    mae, n_bary = _mean(err)
    within5, _ = _mean((err <= 5).astype(np.float64))
    adjacent = ann[:-1][np.diff(ann) == 1]  # rows i with i and i+1 both annotated
    b0, b1 = b[..., adjacent], b[..., adjacent + 1]
    both = np.isfinite(b0) & np.isfinite(b1)
    mono, n_cons = _mean((b1[both] < b0[both]).astype(np.float64))
    return PlanMetrics(reconstruction=recon, sparse_ce=ce, barycenter_mae=mae, within5=within5,
                       monotonicity_violation=mono, n_annotated=n_ann, n_ce=n_ce,
                       n_barycenter=n_bary, n_consecutive=n_cons)


def diagonal_plan(query_length: int, key_length: int) -> np.ndarray:
    """Point-mass plan ``[Lq, Lk]`` of the diagonal reference (one 1 per row)."""
    plan = np.zeros((query_length, key_length))
    plan[np.arange(query_length), diagonal_target(query_length, key_length)] = 1.0
    return plan


def diagonal_plan_metrics(target, key_length: int, *, values=None, dustbin: bool = False,
                          min_prob: float = 1e-12) -> PlanMetrics:
    """The diagonal reference scored like a model plan, with the same V.

    ``dustbin=True`` scores it as a dustbin config would (unaligned rows enter the CE with
    dustbin mass 0, i.e. ``-log(min_prob)``). The CE of a point mass is 0 on hits and
    ``-log(min_prob)`` on misses, so it mostly reflects ``min_prob``.
    """
    target = check_target(target, key_length=key_length)
    plan = diagonal_plan(len(target), key_length)
    dust = np.zeros(len(target)) if dustbin else None
    return plan_metrics(plan, target, values=values, dustbin_mass=dust, min_prob=min_prob)
