"""Plan engines side by side: the trained Sinkhorn, N plain steps, the compiled operator (ASAP).

    python scripts/bench_engines.py --checkpoint compiled/ --json     # a `pfamalign compile` output
    python scripts/bench_engines.py --checkpoint compiled/ --lengths 128 256 --pairs 24 --steps 1 2 3

Two kinds of JSON line, every engine measured in the same run:

* ``kind="speed"``, one per engine and length L: ``plan_ms`` (the plan stage per pair:
  encoder, projections and transport, as ``Aligner.plan``; batches of ``--batch`` L x L pairs
  of random related sequences, interleaved rounds, min), ``transport_ms`` (the transport
  alone, from the same projections: the part the engines change),
  ``align_ms`` (plan + the model's decoder on one pair, min over the batch), XLA's temporary
  memory of the transport (``peak_mib``), and ``speedup`` / ``transport_speedup`` =
  sinkhorn's time / this engine's;
* ``kind="accuracy"``, one per engine: on ``--pairs`` pairs of the held-out ``--split``
  (drawn across its families), the relative l2 distance of the per-head plans to the Sinkhorn
  teacher's and the worst row / column marginal error against it, and the aligned-pair F1 of
  the default decoder and of the plan alone (MEA on the plan: the posterior decoder with
  alpha = 1), each with a bootstrap 95 % interval and the paired difference to sinkhorn
  (families resampled whole).

Engines: ``sinkhorn``, ``steps_N`` for each ``--steps``, ``asap0`` (one key-side c-transform)
and ``asap`` (key, query, key) from the checkpoint's operator. For a model whose encoder has
CETA layers, ``asap`` and ``asap0`` also run the layers' compiled operators, and
``ceta_asap`` is the Sinkhorn plan on an encoder with compiled CETA layers (the layers alone);
``--engines`` picks a subset.

* ``kind="layer"`` (CETA models, ``--layer-lengths``): one CETA layer (``--layer``) forward
  on ``--batch`` sequences of length L made of held-out test sequences joined end to end, its
  inputs captured by running the encoder: ``layer_ms`` of the layer's Sinkhorn (the transport
  op as the encoder runs it) and of its compiled operator (``asap``: 3 passes, ``asap0``: 1)
  per sequence, interleaved rounds, min; ``speedup`` = Sinkhorn's / this; ``out_rel_l2`` and
  ``plan_rel_l2``: the relative l2 distance of the layer's output ``P V`` and of its plan to
  the Sinkhorn layer's.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
from flax import nnx

import _common
from pfamalign import asap, jsonio


def engines(predictor, steps, names=None) -> dict:
    """``{name: (op_arrays, plan_of keywords)}`` (``Engine.args``) of the compared engines."""
    model_dir, model = predictor.path, predictor.model
    out = {"sinkhorn": asap.Engine()}
    out.update({f"steps_{n}": asap.Engine("steps", n) for n in steps})
    out["asap0"] = asap.Engine.load("asap", model_dir, model, passes=1)
    out["asap"] = asap.Engine.load("asap", model_dir, model, passes=3)
    out = {name: e.args() for name, e in out.items()}
    if out["asap"][1]["ceta_arrays"] is not None:  # the Sinkhorn plan, the compiled CETA layers
        ceta = {k: out["asap"][1][k] for k in ("ceta_arrays", "ceta_settings")}
        out["ceta_asap"] = (None, {**out["sinkhorn"][1], **ceta})
    return {name: args for name, args in out.items() if not names or name in names or name == "sinkhorn"}


def related_pair(rng, length: int) -> tuple[str, str]:
    """A random sequence and a copy with 25 % substitutions (no indels: exactly L x L)."""
    aa = np.array(list("ACDEFGHIKLMNPQRSTVWY"))
    a = rng.choice(aa, length)
    b = np.where(rng.random(length) < 0.25, rng.choice(aa, length), a)
    return "".join(a), "".join(b)


def speed(predictor, table, lengths, batch, repeats):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    cfg = predictor.model.cfg.transport
    project = nnx.jit(asap.projections)
    transport = jax.jit(asap.transport_of, static_argnums=0, static_argnames=("engine", "steps", "settings"))
    for length in lengths:
        seqs = [related_pair(rng, length) for _ in range(batch)]
        feats = predictor.featurize([s for p in seqs for s in p])
        args = tuple(jnp.asarray(a) for a in asap.pad_batch(list(zip(feats[0::2], feats[1::2]))))
        proj = _common.block(project(predictor.model, *args))
        cases, mem = {}, {}
        for name, (arrays, kw) in table.items():
            cases[name] = (lambda *a, o=arrays, kw=kw: asap.engine_plan(predictor.model, o, *a, **kw), args)
            kw = {k: v for k, v in kw.items() if not k.startswith("ceta_")}  # the plan's transport alone
            cases[name + "/transport"] = (lambda *p, a=arrays, kw=kw: transport(cfg, a, *p, **kw), proj)
            _, mem[name] = _common.compile_with_memory(
                lambda *p, a=arrays, kw=kw: asap.transport_of(cfg, a, *p, **kw), *proj)
        best = _common.time_interleaved(cases, repeats=repeats)
        plans = {name: np.asarray(cases[name][0](*args)[0]) for name in table}  # (plan, safe)
        for name in table:
            decode_s = np.inf  # the model's decoder, min over the batch's pairs
            for n, pair in enumerate(seqs):
                t0 = time.perf_counter()
                _decode(predictor, _pair_plan(plans[name][n], length, length), None, pair, name)
                decode_s = min(decode_s, time.perf_counter() - t0)
            plan_ms = best[name] / batch * 1e3
            yield {"script": "bench_engines", "kind": "speed", "engine": name, "L": length, "batch": batch, "plan_ms": plan_ms,
                   "transport_ms": best[name + "/transport"] / batch * 1e3,
                   "align_ms": plan_ms + decode_s * 1e3,
                   "peak_mib": mem[name].get("temp_bytes", 0) / _common.MIB,
                   "speedup": best["sinkhorn"] / best[name],
                   "transport_speedup": best["sinkhorn/transport"] / best[name + "/transport"],
                   **_common.environment()}


def layer_speed(predictor, data, split, lengths, batch, repeats, layer):
    """``kind="layer"`` lines: one CETA layer's Sinkhorn against its compiled operator."""
    import jax

    from pfamalign.evaluation import pair_records
    from pfamalign.kernels import transport

    model = predictor.model
    op = asap.load_operator(predictor.path)
    op.check(model)
    records, _, _ = pair_records(data=data, split=split, max_pairs=400, seed=1, embedder_id=predictor.config.embedder_id)
    residues = "".join(s for r in records for s in (r["q_seq"], r["k_seq"]))  # held-out families, joined
    sinkhorn = jax.jit(lambda q, k, v, lens, cfg: transport(q, k, v, lens, lens, config=cfg), static_argnums=4)
    compiled = jax.jit(asap.ceta_attend, static_argnums=(0, 2))
    plan = jax.jit(lambda cfg, a, s, q, k, lens: asap.asap_of(cfg, a, s, q, k, None, lens, lens)[0], static_argnums=(0, 2))
    teacher = jax.jit(lambda cfg, q, k, lens: asap.teacher_of(cfg, q, k, None, lens, lens)[0], static_argnums=0)
    lop = op.layers[layer]
    for length in lengths:
        if len(residues) < batch * length:
            raise SystemExit(f"{data} {split} has {len(residues)} residues; need {batch * length} for L = {length}")
        seqs = [residues[n * length : (n + 1) * length] for n in range(batch)]
        feats = np.stack(predictor.featurize(seqs))
        (cfg, q, k, _, lens, _), v = asap.ceta_inputs(model, feats, np.full(batch, length, np.int32))[layer]
        variants = {"asap": lop.settings, "asap0": dataclasses.replace(lop.settings, passes=1)}
        cases = {"sinkhorn": (lambda *a, cfg=cfg: sinkhorn(*a, cfg), (q, k, v, lens))}
        cases.update({name: (lambda *a, s=s, cfg=cfg: compiled(cfg, lop.arrays(), s, *a), (q, k, v, lens))
                      for name, s in variants.items()})
        best = _common.time_interleaved(cases, repeats=repeats)
        ref_out = np.asarray(cases["sinkhorn"][0](q, k, v, lens))
        ref_plan = np.asarray(teacher(cfg, q, k, lens))
        rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
        for name in cases:
            out = np.asarray(cases[name][0](q, k, v, lens))
            got_plan = ref_plan if name == "sinkhorn" else np.asarray(plan(cfg, lop.arrays(), variants[name], q, k, lens))
            yield {"script": "bench_engines", "kind": "layer", "engine": name, "layer": layer, "L": length,
                   "batch": batch, "heads": int(q.shape[1]), "layer_ms": best[name] / batch * 1e3,
                   "speedup": best["sinkhorn"] / best[name], "out_rel_l2": rel(out, ref_out),
                   "plan_rel_l2": rel(got_plan, ref_plan), **_common.environment()}


def _decode(predictor, pp, decoding, pair, engine: str):
    """``Predictor.decode`` with the plan check an engine's Predictor uses: masses bounded for
    the trained solve only (``PairPlan.check``)."""
    pp.check(marginals=engine == "sinkhorn")
    return (decoding or predictor.decoding).decode(pp, pair, hmm=predictor.pairhmm)


def _pair_plan(head_mean, lq, lk):
    """The pair's plan ``[lq + 1, lk + 1]`` (dustbin row and column) of a padded head-mean
    plan ``[pad + 1, pad + 1]`` (the A -> B direction only: the engines compared as solvers)."""
    from pfamalign.plans import unpad

    return unpad(head_mean[None], np.array([lq]), np.array([lk]))[0]


def accuracy(predictor, table, data, split, n_pairs, seed, n_boot, batch):
    from pfamalign.alignment.metrics import alignment_counts, paired_f1_difference, prf_summary
    from pfamalign.evaluation import pair_records

    records, _, features = pair_records(data=data, split=split, max_pairs=n_pairs, seed=seed,
                                        embedder_id=predictor.config.embedder_id)
    records = list(records)
    if features != "records":
        raise SystemExit(f"{data} was embedded with another embedder than the model's")
    plan_only = dataclasses.replace(predictor.decoding, decoder="posterior", alpha=1.0)
    counts = {name: {"default": [], "plan_only": []} for name in table}
    errs = {name: {"num": 0.0, "den": 0.0, "row": 0.0, "col": 0.0, "s": 0.0} for name in table}
    order = sorted(range(len(records)), key=lambda i: max(len(records[i]["q_seq"]), len(records[i]["k_seq"])))
    for start in range(0, len(order), batch):
        recs = [records[i] for i in order[start : start + batch]]
        pairs = [(np.asarray(r["q_feat"], np.float32), np.asarray(r["k_feat"], np.float32)) for r in recs]
        longest = max(max(len(a), len(b)) for a, b in pairs)
        args = asap.pad_batch(pairs, pad=-(-longest // 256) * 256)  # few shapes: few compilations
        teacher = np.asarray(asap.engine_plan(predictor.model, None, *args, engine="sinkhorn", heads_mean=False)[0])
        for name, (arrays, kw) in table.items():
            t0 = time.perf_counter()
            full = np.asarray(asap.engine_plan(predictor.model, arrays, *args, **kw, heads_mean=False)[0])
            errs[name]["s"] += time.perf_counter() - t0
            err = errs[name]
            err["num"] += float(np.sum((full - teacher) ** 2))
            err["den"] += float(np.sum(teacher ** 2))
            err["row"] = max(err["row"], float(np.max(np.abs(full.sum(-1) - teacher.sum(-1)))))
            err["col"] = max(err["col"], float(np.max(np.abs(full.sum(-2) - teacher.sum(-2)))))
            head_mean = full.mean(1)
            for n, r in enumerate(recs):
                pp = _pair_plan(head_mean[n], len(r["q_seq"]), len(r["k_seq"]))
                pair = (r["q_seq"], r["k_seq"])
                counts[name]["default"].append(alignment_counts(_decode(predictor, pp, None, pair, name).pairs, r["target"]))
                counts[name]["plan_only"].append(alignment_counts(_decode(predictor, pp, plan_only, pair, name).pairs,
                                                                  r["target"]))
    pid = np.array([records[i]["pid"] for i in order], np.float64)
    fams = [records[i].get("family", "") for i in order]
    for name in table:
        row = {"script": "bench_engines", "kind": "accuracy", "engine": name, "split": split, "n_pairs": len(records),
               "n_families": len(set(fams)), "plan_rel_l2": float(np.sqrt(errs[name]["num"] / errs[name]["den"])),
               "row_marginal_err": errs[name]["row"], "col_marginal_err": errs[name]["col"],
               "plan_s_total": errs[name]["s"]}
        for which in ("default", "plan_only"):
            c = np.asarray(counts[name][which], np.int64)
            f1 = prf_summary(c, n_boot=n_boot, seed=seed)["micro"]["f1"]
            diff = paired_f1_difference(c, np.asarray(counts["sinkhorn"][which], np.int64), pid, groups=fams,
                                        n_boot=n_boot, seed=seed)["all"]
            row[f"f1_{which}"] = f1
            row[f"f1_{which}_minus_sinkhorn"] = {k: diff[k] for k in ("value", "low", "high")}
        yield row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=_common.existing_path, required=True, help="a compiled model directory (`pfamalign compile`)")
    parser.add_argument("--data", default="data_b62_1k", help="dataset of the held-out pairs "
                        "(default: data_b62_1k, built as the shipped model's TRAINING.md says)")
    parser.add_argument("--split", default="test", help="held-out split (families unseen in training)")
    parser.add_argument("--pairs", type=int, default=48, help="held-out pairs for the accuracy lines (0: none)")
    parser.add_argument("--lengths", type=_common.positive_int, nargs="+", default=[128, 256, 512], help="speed lengths L")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3, 4], help="steps of the `steps` engines")
    parser.add_argument("--batch", type=int, default=4, help="pairs per plan batch (sequences per layer batch)")
    parser.add_argument("--engines", nargs="+", default=None,
                        help="engines to measure besides sinkhorn (default: all)")
    parser.add_argument("--layer-lengths", type=int, nargs="*", default=[128, 256, 512, 1024],
                        help="L of the CETA layer lines (CETA models; none: skip)")
    parser.add_argument("--layer", type=int, default=0, help="the CETA layer timed")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    _common.add_output_args(parser, repeats=3)
    args = parser.parse_args(argv)

    from pfamalign.inference import Predictor

    predictor = Predictor(args.checkpoint)
    table = engines(predictor, args.steps, args.engines)
    rows = []
    layers = args.layer_lengths if asap.ceta_layers(predictor.model) else []
    for row in layer_speed(predictor, args.data, args.split, layers, args.batch, args.repeats, args.layer) \
            if layers else ():
        rows.append(row)
        if args.json:
            print(jsonio.dumps_line(row), flush=True)
    for row in speed(predictor, table, args.lengths, args.batch, args.repeats):
        rows.append(row)
        if args.json:
            print(jsonio.dumps_line(row), flush=True)
    if args.pairs:
        for row in accuracy(predictor, table, args.data, args.split, args.pairs, args.seed, args.bootstrap, args.batch):
            rows.append(row)
            if args.json:
                print(jsonio.dumps_line(row), flush=True)
    out = sys.stderr if args.json else sys.stdout
    if layers:
        print(_common.format_table([r for r in rows if r["kind"] == "layer"],
                                   ["engine", "layer", "L", "layer_ms", "speedup", "out_rel_l2", "plan_rel_l2"]),
              file=out)
    print(_common.format_table([r for r in rows if r["kind"] == "speed"],
                               ["engine", "L", "plan_ms", "speedup", "transport_ms", "transport_speedup",
                                "align_ms", "peak_mib"]), file=out)
    flat = [{**r, "f1": r["f1_default"]["value"], "d_f1": r["f1_default_minus_sinkhorn"]["value"],
             "f1_plan": r["f1_plan_only"]["value"], "d_f1_plan": r["f1_plan_only_minus_sinkhorn"]["value"]}
            for r in rows if r["kind"] == "accuracy"]
    print(_common.format_table(flat, ["engine", "plan_rel_l2", "row_marginal_err", "col_marginal_err", "f1",
                                      "d_f1", "f1_plan", "d_f1_plan"]), file=out)


if __name__ == "__main__":
    main()
