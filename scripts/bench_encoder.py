"""Encoder token mixers, forward + backward: time and compiled memory against dense softmax.

One layer of each kind (``pfamalign.encoder``; width 128, 4 heads x 32, one sequence of length L,
gradients of the loss ``sum(w * out)`` with respect to the input and every parameter):

  * ``conv``: one residual conv block (kernel 9) — the shipped encoder's layer;
  * ``softmax``: dense softmax attention (the baseline of the ratios);
  * ``ceta``: doubly stochastic attention through the transport op (full band, T=15, R=2);
  * ``gsa_dense_kK`` / ``gsa_gather_kK``: gated sparse attention with top-k (k = K at every
    length: ``topk_fraction`` 1, ``topk_min`` K), local window 8, selection applied as a mask on
    dense scores or by gathering the selected keys; indexer KL off (its weight 0), so the rows
    time the selection path itself;
  * ``indexer_kK``: the lightning indexer and the top-k alone (forward; it passes no gradient):
    the indexer's share of the gsa rows.

Ratios: ``time_vs_softmax`` and ``mem_vs_softmax`` at the same L in the same run (memory: XLA's
compiled temporaries). A kind stops at the next length once one call takes more than
``--max-call-s``. JSON lines with ``--json``; a table on stderr.

    python scripts/bench_encoder.py --json
    python scripts/bench_encoder.py --lengths 128,512,2048 --ks 32 --repeats 2
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import _common
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pfamalign import configs
from pfamalign.model import build_model

KINDS = ("softmax", "conv", "ceta", "gsa_dense", "gsa_gather", "indexer")


def layer_fn(kind: str, k: int):
    """``(params, x, w, lens) -> loss`` of one layer and its parameters."""
    name = {"conv": "align_ce", "softmax": "align_attn", "ceta": "align_ceta"}.get(kind, "align_orthgsa")
    cfg = configs.get_config(name, embedder_id="builtin/onehot+blosum62", feature_dim=50).model
    cfg = dataclasses.replace(cfg, encoder_layers=1, residual="plain", topk=k, topk_min=k,
                              topk_fraction=1.0, indexer_weight=0.0)
    model = build_model(cfg)
    block = model.encoder.blocks[0]
    if kind == "conv":
        mod = block
        call = lambda m, x, lens: m(x, (jnp.arange(x.shape[1]) < lens[:, None])[..., None].astype(x.dtype))
    elif kind == "indexer":
        mod = block.attn

        def call(m, x, lens):
            idx, keep = _select(m, x, lens, cfg)
            return jnp.where(keep, idx, 0).astype(jnp.float32).sum(-1, keepdims=True)
    else:
        mod = block.attn
        sparse = {"gsa_dense": False, "gsa_gather": True}.get(kind)
        call = lambda m, x, lens: m.out(m.mix(x, lens, sparse=sparse)[0])
    graphdef, state = nnx.split(mod)
    params = nnx.to_pure_dict(state)

    def loss(params, x, w, lens):
        out = call(nnx.merge(graphdef, params), x, lens)
        return jnp.sum(w[..., : out.shape[-1]] * out)

    if kind == "indexer":  # forward only: top-k passes no gradient
        return jax.jit(loss), params
    return jax.jit(jax.grad(loss, argnums=(0, 1))), params


def _select(attn, x, lens, cfg):
    from pfamalign import encoder as enc

    scores = attn.index_scores(x)
    return enc.select_keys(scores, lens, enc.topk_per_length(lens, cfg), cfg.topk_local, cfg.topk)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=_common.positive_int_list, default=[128, 256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--ks", type=_common.int_list, default=[16, 32, 64])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--max-call-s", type=float, default=20.0,
                        help="a kind stops at the next length once a call takes longer (default 20)")
    _common.add_output_args(parser, repeats=3)
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or (unknown := sorted(set(kinds) - set(KINDS))):
        parser.error(f"--kinds must name some of {', '.join(KINDS)}; got {args.kinds!r}")
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()})", file=sys.stderr)
    cases = [(kind, k) for kind in kinds for k in (args.ks if kind.startswith(("gsa", "indexer")) else [None])]
    stopped, rows = set(), []
    for length in args.lengths:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(1, length, 128)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(1, length, 128)), jnp.float32)
        lens = jnp.array([length], jnp.int32)
        base = None
        for kind, k in cases:
            label = kind if k is None else f"{kind}_k{k}"
            if label in stopped:
                continue
            fn, params = layer_fn(kind, k or 32)
            compiled, mem = _common.compile_with_memory(fn, params, x, w, lens)
            t = _common.time_fn(compiled, params, x, w, lens, repeats=args.repeats,
                                budget_s=3 * args.max_call_s)
            row = {"kind": label, "L": length, "k": k, "fwd_bwd_s": t["min_s"],
                   "temp_MiB": mem.get("temp_bytes", 0) / _common.MIB, "compile_s": mem["compile_s"]}
            if kind == "softmax":
                base = row
            if base is not None:
                row["time_vs_softmax"] = row["fwd_bwd_s"] / base["fwd_bwd_s"]
                row["mem_vs_softmax"] = row["temp_MiB"] / max(base["temp_MiB"], 1e-9)
            row.update(_common.environment())
            rows.append(row)
            if args.json:
                print(_common.jsonio.dumps_line(row), flush=True)
            print(f"L={length} {label}: {row['fwd_bwd_s']:.4f} s, {row['temp_MiB']:.1f} MiB",
                  file=sys.stderr, flush=True)
            if t["min_s"] > args.max_call_s:
                stopped.add(label)
    print(_common.format_table(rows, ["kind", "L", "fwd_bwd_s", "time_vs_softmax", "temp_MiB",
                                      "mem_vs_softmax"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
