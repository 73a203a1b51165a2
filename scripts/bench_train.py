"""Training throughput (examples/s) at the reference settings (docs/design.md §1): one JSON line per config.

    python scripts/bench_train.py                         # k2_eps1 (320-d) and align_ce (builtin)
    python scripts/bench_train.py --configs k2_eps1 --reps 3
    python scripts/bench_train.py --data data_builtin   # lengths of a dataset

What is timed: the jitted training step (forward, exact tail adjoint, AdamW update) of the
real ``pfamalign.training.step`` code, global batch 64, T = 15, half band 1024, on the devices JAX
sees, with random features (320-d like ESM-2 t6 for ``k2_eps1``; the 50-d built-in one-hot +
BLOSUM62 width for ``align_ce``) and a diagonal target on every row.

Lengths: the pair lengths that ``prepare`` samples from the shared Pfam data
(``../shared/data/pfam``, seed + hmmalign families, 200 pairs per family; the test fixtures
when it is absent), or the train split of ``--data``. They are batched as training batches
them (``reader.BatchPlan``: length-bucketed windows of 32 batches, lengths padded to a
multiple of 64, q and k to one length). Each distinct padded length is compiled and timed on
its own (median of ``--reps`` steps after a warm-up step); ``examples_per_s`` is
``64 x batches / sum of their step times`` over one epoch of the plan, i.e. the steady-state
rate of a training run on that data, compile excluded. ``examples_per_s_pad1024`` is the rate
when every pair is padded to 1024 (no length bucketing), for comparison with a fixed-shape
pipeline. The reference figure is 8.5 examples/s on a TPU v6e-8 (whole training run).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import tempfile
import time

import _common
from pfamalign import jsonio

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "pfam"
FIXTURES = ROOT / "tests" / "data" / "pfam_seed"
REFERENCE_EXAMPLES_PER_S = 8.5  # TPU v6e-8, balanced R=2 (docs/design.md §1)

BENCHES = {
    # name: (embedder id, feature dim, encoder, features label)
    "k2_eps1": ("esm2_t6_8M_UR50D/layer6", 320, "none", "random 320-d (ESM-2 t6 size)"),
    "align_ce": ("builtin/onehot+blosum62", 50, "conv",
                 "random 50-d (builtin/onehot+blosum62 size)"),
}


def pair_lengths(data: str | None, pairs_per_family: int, pfam: pathlib.Path = SHARED):
    """[N, 2] pair lengths and a description of where they come from."""
    import numpy as np

    from pfamalign.pipelines.config import PrepareConfig
    from pfamalign.pipelines.pairs import SamplingConfig
    from pfamalign.pipelines.prepare import run_prepare
    from pfamalign.pipelines import reader

    if data:
        return reader.PairDataset(data).lengths("train"), f"train split of {data}"
    inputs = ([pfam / "seed_stockholm", pfam / "hmmalign_stockholm"] if pfam.is_dir()
              else [FIXTURES])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = PrepareConfig(inputs=tuple(str(p) for p in inputs), out=str(pathlib.Path(tmp) / "d"),
                            embedder="builtin/onehot",
                            sampling=SamplingConfig(pairs_per_family=pairs_per_family))
        manifest = run_prepare(cfg, quiet=True).manifest
        out = pathlib.Path(tmp) / "d"
        lengths = np.concatenate([np.load(out / s / "lengths.npy") for s in manifest["splits"]
                                  if manifest["splits"][s]["pairs"]])
    where = f"{pfam} (seed + hmmalign)" if pfam.is_dir() else "tests/data/pfam_seed"
    return lengths, f"pairs sampled by prepare from {where}, {pairs_per_family} per family"


def make_batch(rng, batch: int, length: int, dim: int, q_len, k_len):
    import numpy as np

    target = np.full((batch, length), -1, np.int32)  # diagonal target on every real row
    for b in range(batch):
        ql, kl = int(q_len[b]), int(k_len[b])
        target[b, :ql] = np.rint(np.arange(ql) * (kl - 1) / max(ql - 1, 1))
    return {"q_feat": rng.normal(size=(batch, length, dim)).astype(np.float32),
            "k_feat": rng.normal(size=(batch, length, dim)).astype(np.float32),
            "q_len": np.asarray(q_len, np.int32), "k_len": np.asarray(k_len, np.int32),
            "target": target, "valid": np.ones(batch, bool)}


def bench(name: str, lengths, source: str, *, batch: int, reps: int, seed: int,
          pad1024: bool) -> dict:
    import jax
    import numpy as np

    from pfamalign import configs
    from pfamalign.training import step as train
    from pfamalign.pipelines import reader

    embedder, dim, encoder, label = BENCHES[name]
    cfg = configs.get_config(name, embedder_id=embedder, feature_dim=dim,
                             overrides={"encoder": encoder, "train.batch_size": batch})
    mesh = train.make_mesh()
    print(f"# device: {_common.device_name()}", file=sys.stderr, flush=True)
    train.check_batch(batch, mesh)
    state = train.init_state(cfg, mesh)
    step = train.make_train_step(cfg, mesh)
    plan = reader.BatchPlan(lengths, batch, seed=seed, shuffle=True, num_epochs=1,
                            bucket_window=cfg.train.data.bucket_window)
    batches = plan.epoch(0)
    padded = [reader.round_up(int(lengths[b].max()), cfg.train.data.pad_multiple) for b in batches]
    rng = np.random.default_rng(seed)

    def time_length(length: int, members):
        q_len, k_len = lengths[members, 0], lengths[members, 1]
        host = make_batch(rng, batch, length, dim, q_len, k_len)
        t0 = time.perf_counter()
        state.params, state.opt_state, m = step(state.params, state.opt_state,
                                                train.shard_batch(host, mesh))
        jax.block_until_ready(m)
        first = time.perf_counter() - t0
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            state.params, state.opt_state, m = step(state.params, state.opt_state,
                                                    train.shard_batch(host, mesh))
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t0)
        return float(np.median(times)), first

    per_length, compile_s = {}, {}
    for length in sorted(set(padded)):
        members = batches[padded.index(length)]
        per_length[length], compile_s[length] = time_length(length, members)
        print(f"# {name}: L={length} step {per_length[length]:.3f}s "
              f"(first call {compile_s[length]:.1f}s)", file=sys.stderr, flush=True)
    total = sum(per_length[p] for p in padded)
    result = {
        "bench": "train_step", "config": name, "features": label, "encoder": encoder,
        "heads": cfg.model.heads, "head_dim": cfg.model.head_dim,
        "value_dim": cfg.model.value_dim, "dustbin": cfg.model.transport.dustbin,
        "batch": batch, "T": cfg.model.transport.base_steps, "R": cfg.model.transport.tail_steps,
        "half_band": cfg.model.transport.half_band, "eps": cfg.model.transport.eps,
        # As the op resolves impl="auto" (a kernels.config.IMPL_VARIANTS name): per padded length
        # (dense autodiff below the GPU crossover).
        "impl_by_padded_len": {str(n): cfg.model.transport.resolved_impl(length=n) for n in per_length},
        "devices": mesh.devices.size,
        "lengths": source, "pairs": int(len(lengths)),
        "mean_pair_max_len": round(float(lengths.max(axis=1).mean()), 1),
        "batches_per_epoch": len(batches),
        "mean_padded_len": round(float(np.mean(padded)), 1),
        "step_s_by_padded_len": {str(k): round(v, 4) for k, v in per_length.items()},
        "examples_per_s": round(batch * len(batches) / total, 2),
    }
    if pad1024:
        idx = batches[int(np.argmax(padded))]
        t1024, _ = time_length(1024, idx)
        result["examples_per_s_pad1024"] = round(batch / t1024, 2)
    result["reference_tpu_v6e8_examples_per_s"] = REFERENCE_EXAMPLES_PER_S
    result["ratio_vs_reference"] = round(result["examples_per_s"] / REFERENCE_EXAMPLES_PER_S, 2)
    result["host"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                      "backend": jax.default_backend()}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="k2_eps1,align_ce",
                        help="comma-separated, from: " + ", ".join(BENCHES))
    parser.add_argument("--data", default=None, help="take pair lengths from this dataset")
    parser.add_argument("--pfam", type=pathlib.Path, default=SHARED,
                        help="Pfam folder (seed_stockholm/, hmmalign_stockholm/) whose pairs give the "
                             "lengths (default ../shared/data/pfam; the test fixtures without it)")
    parser.add_argument("--pairs-per-family", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-pad1024", action="store_true",
                        help="skip the fixed-length (1024) comparison")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    for name in names:
        if name not in BENCHES:
            parser.error(f"unknown config {name!r}; choose from {', '.join(BENCHES)}")
    lengths, source = pair_lengths(args.data, args.pairs_per_family, args.pfam)
    for name in names:
        print(jsonio.dumps_line(bench(name, lengths, source, batch=args.batch, reps=args.reps,
                                      seed=args.seed, pad1024=not args.no_pad1024)), flush=True)


if __name__ == "__main__":
    main()
