"""Local alignment on domains embedded in random flanks: one JSON line per method, then the
paired F1 differences.

    python scripts/bench_local.py --data DATA_DIR --pairs 300            # both sides flanked
    python scripts/bench_local.py --data DATA_DIR --pairs 300 --embed key
    python scripts/bench_local.py --data DATA_DIR --pairs 300 --flank 0 0  # no flanks (control)
    python scripts/bench_local.py --data DATA_DIR --pairs 300 --relax 0 0.1 1 10  # relax grid

Takes ``--pairs`` pairs of the (held-out) ``--split`` at random (seeded), embeds each domain
(the key, or both sequences) between flanks of uniform random length in ``--flank MIN MAX``
whose residues are drawn i.i.d. from the background residue frequencies of the dataset's
train split, and shifts the Pfam reference pairs accordingly. Every method aligns the same
flanked pairs:

* ``sw`` / ``nw``: Smith-Waterman / Needleman-Wunsch, BLOSUM62 11 / 1 (Biopython);
* ``model_global`` / ``model_local``: the model's decoder settings (``decoding.json``; the
  shipped model: hybrid, BLOSUM62 + 2 x plan, 11 / 1) in each ``mode``;
* ``plan_global`` / ``plan_local``: the plan decoded on its own (``affine`` defaults).

Per method: aligned-pair precision / recall / F1 against the shifted reference (micro, with
bootstrap 95 % intervals over pairs; pairs into the flanks count as false positives) and the
flank false-positive rate, aligned pairs that involve a flank residue per flank residue. A
``plan`` line says where the plan puts flank rows (mean dustbin mass of flank and domain
query rows, share of the plan's real mass on flank rows or columns). Then the paired F1
differences (bootstrap over pairs and over whole families).

``--relax LAM ...`` repeats the model's methods and the ``plan`` line with the model's own
scores under semi-relaxed transport (``marginals="rows"``: every query row sends its unit
mass, the key columns pay a KL penalty of weight LAM for missing their target; ``0``: free
columns, the row softmax), each line tagged with its ``transport``. This changes the
transport at inference only (the model was trained with its own marginals): it measures what
a looser key side does to the same scores, e.g. whether flank columns are left empty.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

import _common
from pfamalign import jsonio
from pfamalign.alignment.baselines import needleman_wunsch, smith_waterman
from pfamalign.alignment.metrics import pair_counts, paired_f1_difference, prf_summary
from pfamalign.alignment.pairs import pairs_from_target
from pfamalign.decoding import DecoderSettings
from pfamalign.inference import Predictor
from pfamalign.pipelines.reader import iter_pairs
from pfamalign.residues import AA_ALPHABET

STANDARD = AA_ALPHABET[:20]  # the 20 standard residues (the rest are rare codes)
DIFFERENCES = [("model_local", "model_global"), ("model_local", "sw"), ("model_local", "nw"),
               ("plan_local", "plan_global"), ("model_global", "nw")]


def background_frequencies(data, split: str = "train") -> np.ndarray:
    """Frequencies of the 20 standard residues over every sequence of ``split`` (rare codes
    left out)."""
    counts = dict.fromkeys(STANDARD, 0)
    for rec in iter_pairs(data, split):
        for seq in (rec["q_seq"], rec["k_seq"]):
            for ch in seq:
                if ch in counts:
                    counts[ch] += 1
    freq = np.array([counts[a] for a in STANDARD], np.float64)
    return freq / freq.sum()


def embed(seq: str, rng, freq: np.ndarray, flank: tuple[int, int]) -> tuple[str, int, int]:
    """``seq`` between two random flanks; returns the flanked sequence and the flank lengths."""
    left, right = (int(n) for n in rng.integers(flank[0], flank[1] + 1, size=2))
    draw = lambda n: "".join(rng.choice(list(STANDARD), size=n, p=freq))
    return draw(left) + seq + draw(right), left, right


def flanked_pairs(records, rng, freq, flank, embed_query: bool):
    """Yields ``(record, q_seq, k_seq, reference pairs, query domain range, key domain range)``
    with the reference shifted into the flanked coordinates."""
    for rec in records:
        q_seq, k_seq = rec["q_seq"], rec["k_seq"]
        qa, qb = 0, len(q_seq)
        if embed_query:
            q_seq, qa, _ = embed(q_seq, rng, freq, flank)
            qb = qa + len(rec["q_seq"])
        k_seq, ka, _ = embed(k_seq, rng, freq, flank)
        kb = ka + len(rec["k_seq"])
        ref = pairs_from_target(rec["target"]) + np.array([qa, ka])
        yield rec, q_seq, k_seq, ref, (qa, qb), (ka, kb)


def flank_counts(pairs: np.ndarray, q_dom, k_dom, lq: int, lk: int) -> tuple[int, int]:
    """(aligned pairs with a flank residue on either side, flank residues of both sequences)."""
    pairs = np.asarray(pairs).reshape(-1, 2)
    in_q = (pairs[:, 0] >= q_dom[0]) & (pairs[:, 0] < q_dom[1])
    in_k = (pairs[:, 1] >= k_dom[0]) & (pairs[:, 1] < k_dom[1])
    flank_residues = (lq - (q_dom[1] - q_dom[0])) + (lk - (k_dom[1] - k_dom[0]))
    return int((~(in_q & in_k)).sum()), flank_residues


def with_transport(model, **fields) -> None:
    """Replaces fields of ``model``'s transport configuration in place (the jitted plan
    functions recompile for the new configuration)."""
    cfg = model.cfg
    model.cfg = dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, **fields))


def transport_variants(model, relax: list[float]) -> list[tuple[str, dict]]:
    """(label, transport fields) per variant: the model as trained, then rows + relax LAM."""
    trained = model.cfg.transport
    out = [(f"trained ({trained.dustbin}, {trained.marginals})", {})]
    for lam in relax:
        if lam < 0:
            raise ValueError(f"--relax needs LAM >= 0, got {lam}")
        out.append((f"rows, relax {lam:g}" if lam else "rows (softmax)",
                    {"marginals": "rows", "relax": lam or None}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=_common.existing_path, required=True, help="prepared dataset directory")
    ap.add_argument("--split", default="test")
    ap.add_argument("--pairs", type=_common.positive_int, default=300, help="pairs sampled from the split")
    ap.add_argument("--flank", type=int, nargs=2, default=(50, 200), metavar=("MIN", "MAX"),
                    help="flank length range (residues, each side, uniform)")
    ap.add_argument("--embed", choices=("both", "key"), default="both",
                    help="flank both sequences or only the key")
    ap.add_argument("--checkpoint", type=_common.existing_path, default=None, help="model directory (default: the shipped model)")
    ap.add_argument("--relax", type=float, nargs="*", default=[], metavar="LAM",
                    help="also score semi-relaxed transport of the model's scores: rows unit, key "
                         "columns a KL penalty of weight LAM (0: the row softmax)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-boot", type=int, default=1000)
    args = ap.parse_args(argv)
    if not 0 <= args.flank[0] <= args.flank[1]:
        ap.error(f"--flank needs 0 <= MIN <= MAX, got {args.flank}")

    rng = np.random.default_rng(args.seed)
    records = list(iter_pairs(args.data, args.split))
    chosen = sorted(rng.choice(len(records), size=min(args.pairs, len(records)), replace=False))
    records = [records[i] for i in chosen]
    freq = background_frequencies(args.data)
    predictor = Predictor(args.checkpoint)
    decoder = predictor.decoding  # the model's tuned decoder
    try:
        variants = transport_variants(predictor.model, args.relax)
    except ValueError as err:
        ap.error(str(err))
    baselines = {"sw": lambda a, b: smith_waterman(a, b), "nw": lambda a, b: needleman_wunsch(a, b)}
    plan_only = DecoderSettings.for_decoder("affine")
    decoders = {f"{name}_{mode}": settings.override(mode=mode)
                for mode in ("global", "local") for name, settings in (("model", decoder), ("plan", plan_only))}

    cases = list(flanked_pairs(records, rng, freq, tuple(args.flank), args.embed == "both"))
    pid = [rec["pid"] for rec, *_ in cases]
    family = [rec["family"] for rec, *_ in cases]
    setup = {"split": args.split, "pairs": len(records), "flank": list(args.flank), "embed": args.embed,
             "seed": args.seed, "checkpoint": str(predictor.path), "decoder": decoder.decoder}
    counts: dict[str, list] = {}  # "method" or "method[transport]" -> per-pair counts
    seq_pairs = [(q, k) for _, q, k, *_ in cases]
    features = [tuple(predictor.featurize(pair)) for pair in seq_pairs]  # every variant plans these
    posteriors = {mode: predictor.hmm_posteriors(seq_pairs, mode=mode) if decoder.uses_pairhmm()
                  else [None] * len(cases) for mode in ("global", "local")}  # plan-independent

    def report(name: str, per_pair: list, flank: np.ndarray, **tags) -> None:
        summary = prf_summary(per_pair, n_boot=args.n_boot, seed=args.seed)
        fp, residues = flank
        print(jsonio.dumps_line({"method": name, **tags, **setup, "micro": summary["micro"],
                                 "flank_pairs": int(fp), "flank_residues": int(residues),
                                 "flank_fp_rate": fp / residues if residues else None}), flush=True)

    for name, align in baselines.items():
        counts[name], flank = [], np.zeros(2, np.int64)
        for _, q_seq, k_seq, ref, q_dom, k_dom in cases:
            pairs = align(q_seq, k_seq).pairs
            counts[name].append(pair_counts(pairs, ref))
            flank += flank_counts(pairs, q_dom, k_dom, len(q_seq), len(k_seq))
        report(name, counts[name], flank)

    trained = predictor.model.cfg
    for v, (label, fields) in enumerate(variants):
        predictor.model.cfg = trained
        with_transport(predictor.model, **fields)
        key = (lambda m: m) if v == 0 else (lambda m, label=label: f"{m}[{label}]")
        per = {m: [] for m in decoders}
        flank = {m: np.zeros(2, np.int64) for m in decoders}
        dustbin_flank, dustbin_domain, flank_share = [], [], []
        for n, ((_, q_seq, k_seq, ref, q_dom, k_dom), pp) in enumerate(zip(cases, predictor.plans(features))):
            for m, settings in decoders.items():
                pairs = settings.decode(pp, (q_seq, k_seq), hmm_posteriors=posteriors[settings.mode][n],
                                        hmm=predictor.pairhmm).pairs
                per[m].append(pair_counts(pairs, ref))
                flank[m] += flank_counts(pairs, q_dom, k_dom, len(q_seq), len(k_seq))
            q_in = np.zeros(len(q_seq), bool)
            q_in[q_dom[0]:q_dom[1]] = True
            k_in = np.zeros(len(k_seq), bool)
            k_in[k_dom[0]:k_dom[1]] = True
            dustbin_flank.extend(pp.row_dustbin[~q_in])
            dustbin_domain.extend(pp.row_dustbin[q_in])
            on_flanks = pp.real[~q_in].sum() + pp.real[q_in][:, ~k_in].sum()
            flank_share.append(on_flanks / max(pp.real.sum(), 1e-12))
        for m in decoders:
            counts[key(m)] = per[m]
            report(m, per[m], flank[m], transport=label)
        print(jsonio.dumps_line({"plan": "where the flanks go", "transport": label, **setup,
                                 "mean_dustbin_mass_flank_rows": float(np.mean(dustbin_flank)) if dustbin_flank else None,
                                 "mean_dustbin_mass_domain_rows": float(np.mean(dustbin_domain)),
                                 "mean_real_mass_share_on_flanks": float(np.mean(flank_share))}), flush=True)
    predictor.model.cfg = trained

    differences = list(DIFFERENCES)
    for label, _ in variants[1:]:
        differences += [(f"plan_local[{label}]", "plan_local"), (f"model_local[{label}]", "model_local")]
    for a, b in differences:
        row = {"difference": f"{a} - {b}", **setup}
        for label, groups in (("pairs", None), ("families", family)):
            cell = paired_f1_difference(counts[a], counts[b], pid, groups=groups, n_boot=args.n_boot,
                                        seed=args.seed)["all"]
            row["f1_diff"] = cell["value"]
            row[f"ci_{label}"] = [cell["low"], cell["high"]]
        print(jsonio.dumps_line(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
