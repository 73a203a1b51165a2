"""Data-pipeline throughput: one JSON line per embedder with residues/s and pairs/s.

    python scripts/bench_prepare.py                               # builtin + tiny ESM-2
    python scripts/bench_prepare.py --embedders builtin/onehot --pairs-per-family 50
    python scripts/bench_prepare.py --embedders esm2_t6_8M_UR50D --weights ~/esm2_t6_8M_UR50D.pt

Each embedder runs the whole `prepare` (parse, sample, embed, write shards) into a fresh
temporary directory. ``residues_per_s`` counts the unique residues embedded per second of
embedding time (the embedder's own calls), ``pairs_per_s`` the pair records produced per second
of the whole run, ``residues_per_s_end_to_end`` embedded residues per second of the whole run.
``tiny-esm`` is a randomly initialised 2-layer ESM-2 (D=32) in the real fair-esm checkpoint
format (``tests/data/tiny_esm.py``): it times the real loader, batching and extraction code,
not a production model. Inputs default to the shared Pfam seeds (``../shared/data/pfam``), else
the test fixtures.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import platform
import tempfile
import time

from pfamalign import jsonio

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "pfam"


class _Timed:
    """Wraps an embedder and accumulates the time spent in ``embed``."""

    def __init__(self, inner):
        self.inner = inner
        self.embedder_id, self.dim = inner.embedder_id, inner.dim
        self.max_residues = inner.max_residues
        self.seconds = 0.0
        self.residues = 0

    def embed(self, seqs):
        t = time.perf_counter()
        out = self.inner.embed(seqs)
        self.seconds += time.perf_counter() - t
        self.residues += sum(len(s) for s in seqs)
        return out

    def fingerprint(self):
        return self.inner.fingerprint()


def _tiny_esm(directory: pathlib.Path) -> pathlib.Path:
    spec = importlib.util.spec_from_file_location("tiny_esm", ROOT / "tests" / "data" /
                                                  "tiny_esm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_tiny_esm(directory)


def main(argv=None) -> None:
    from pfamalign.pipelines.config import PrepareConfig
    from pfamalign.pipelines.embed import get_embedder
    from pfamalign.pipelines.pairs import SamplingConfig
    from pfamalign.pipelines.prepare import run_prepare

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pfam", nargs="+", default=None, help="Stockholm inputs")
    p.add_argument("--embedders", nargs="+", default=["builtin/onehot", "tiny-esm"])
    p.add_argument("--weights", default=None, help="ESM-2 weights for a real esm2_* embedder")
    p.add_argument("--pairs-per-family", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads (ESM-2)")
    p.add_argument("--toks-per-batch", type=int, default=4096)
    args = p.parse_args(argv)

    if args.pfam:
        inputs = [pathlib.Path(x) for x in args.pfam]
    elif SHARED.is_dir():
        inputs = [SHARED / "seed_stockholm", SHARED / "hmmalign_stockholm"]
    else:
        inputs = [ROOT / "tests" / "data" / "pfam_seed"]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name in args.embedders:
            if name == "tiny-esm":
                weights = _tiny_esm(tmp / "tiny")
                eid = weights.stem
            else:
                weights, eid = args.weights, name
            t0 = time.perf_counter()
            inner = get_embedder(eid, weights, threads=args.threads,
                                 toks_per_batch=args.toks_per_batch)
            load_s = time.perf_counter() - t0
            timed = _Timed(inner)
            cfg = PrepareConfig(inputs=tuple(map(str, inputs)), out=str(tmp / f"ds-{len(name)}"),
                                sampling=SamplingConfig(pairs_per_family=args.pairs_per_family),
                                toks_per_batch=args.toks_per_batch, overwrite=True)
            t0 = time.perf_counter()
            result = run_prepare(cfg, quiet=True, embedder=timed)
            total = time.perf_counter() - t0
            s = result.summary
            pairs = s["pairs"]["total"]
            print(jsonio.dumps_line({
                "bench": "prepare",
                "embedder": inner.embedder_id,
                "label": name,
                "dim": inner.dim,
                "families": s["families"]["used"],
                "sequences": s["sequences"]["used_unique"],
                "residues": timed.residues,
                "pairs": pairs,
                "seconds_total": round(total, 3),
                "seconds_embed": round(timed.seconds, 3),
                "seconds_load": round(load_s, 3),
                "residues_per_s": round(timed.residues / max(timed.seconds, 1e-9), 1),
                "residues_per_s_end_to_end": round(timed.residues / total, 1),
                "pairs_per_s": round(pairs / total, 1),
                "threads": args.threads,
                "cpus": os.cpu_count(),
                "machine": platform.machine(),
            }), flush=True)


if __name__ == "__main__":
    main()
