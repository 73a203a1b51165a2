"""How far the fused half steps' stabilizer is from the log-sum-exp it stands in for.

The stored-band half steps (``TransportConfig(fused_steps=True)``) walk the band once against
a guess of each line's LSE, the one the previous potentials imply (``-u_prev`` for a row,
``-v_prev`` for a column: ``pallas_gpu._shifted_walk_lse``), and walk it again exactly where a
line's terms left ``[-SAFE_LOG, SAFE_LOG]`` around it. This runs centered Sinkhorn steps with
unit targets on a random band in float64 (numpy, independent of the op) from zero potentials,
as the base solve starts, and prints per step the largest ``|LSE - guess|`` over rows and over
columns, and the steps whose walks would run twice (beyond ``SAFE_LOG``; the kernel tests a
line's largest term, which lies within log(2W + 1) below its LSE).

    python scripts/validate_shifted_walks.py                      # L 1024, W 256, d 64 (~20 s)
    python scripts/validate_shifted_walks.py --length 256 --half-band 32 --json
"""

from __future__ import annotations

import argparse

import numpy as np

import _common


def _lse(x, axis):
    m = np.max(x, axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(np.log(np.sum(np.exp(x - m), axis, keepdims=True)) + m, axis)


def distances(scores, steps: int) -> list[tuple[float, float]]:
    """Per step from zero potentials: (max_i |LSE_row_i - (-u_prev_i)|, max_j |LSE_col_j -
    (-v_prev_j)|) of ``sinkhorn._full_step``'s centered steps (unit targets, kappa 1)."""
    n = scores.shape[0]
    u, v, out = np.zeros(n), np.zeros(n), []
    for _ in range(steps):
        row = _lse(scores + v[None, :], 1)
        col = _lse(scores - row[:, None], 0)  # û = -row
        out.append((float(np.max(np.abs(row + u))), float(np.max(np.abs(col + v)))))
        c = np.mean(-row)
        u, v = -row - c, -col + c
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=1024, help="L (default 1024)")
    ap.add_argument("--half-band", type=int, default=256, help="W (default 256)")
    ap.add_argument("--dim", type=int, default=64, help="d (default 64)")
    ap.add_argument("--steps", type=int, default=17, help="Sinkhorn steps, T + R (default 17)")
    ap.add_argument("--eps", type=_common.float_list, default=[1.0, 0.3, 0.1, 0.05])
    ap.add_argument("--gains", type=_common.float_list, default=[1.0, 3.0],
                    help="the q, k entries' standard deviations (the scores' scale)")
    ap.add_argument("--seed", type=int, default=0)
    _common.add_output_args(ap, repeats=None)
    args = ap.parse_args(argv)
    from pfamalign.kernels.config import SAFE_LOG

    rep = _common.Report("Shifted walks: |LSE - guess| per Sinkhorn step (float64)",
                         ["eps", "gain", "step1_rows", "step1_cols", "later_max", "steps_walked_twice"],
                         json_lines=args.json, script="validate_shifted_walks", config=vars(args))
    rng = np.random.default_rng(args.seed)
    i = np.arange(args.length)
    band = np.abs(i[:, None] - i[None, :]) <= args.half_band
    for eps in args.eps:
        for gain in args.gains:
            q, k = (gain * rng.standard_normal((args.length, args.dim)) for _ in range(2))
            scores = np.where(band, q @ k.T / (np.sqrt(args.dim) * eps), -np.inf)
            d = distances(scores, args.steps)
            rep.add(eps=eps, gain=gain, step1_rows=d[0][0], step1_cols=d[0][1],
                    later_max=max(max(x) for x in d[1:]) if len(d) > 1 else None,
                    steps_walked_twice=sum(max(x) > SAFE_LOG for x in d), per_step=d)
    rep.note(f"A step's walks run twice where a line is beyond SAFE_LOG = {SAFE_LOG:g} of its guess.")
    rep.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
