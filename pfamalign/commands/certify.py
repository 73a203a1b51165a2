"""``pfamalign certify``: convergence, bias and stability certificates of one aligned pair."""

from __future__ import annotations

import pathlib

import click

from pfamalign import jsonio
from pfamalign.commands._common import (check_outputs, fail, pair_input_options, resolve_pair,
                                       sequence_paths)


@click.command()
@pair_input_options
@click.option("--tail-depths", default="0,1,2,4", show_default=True,
              help="Tail depths R for the bias certificate (comma-separated).")
@click.option("--tol", type=float, default=1e-5, show_default=True,
              help="Bias tolerance tau: the certified depth is the first R with ||c_R|| <= tau.")
@click.option("--perturbation", type=float, default=1e-2, show_default=True,
              help="Size (sup norm) of the random score perturbation for the stability bound.")
@click.option("--block-rows", type=int, default=128, show_default=True, help="Rows per contraction block.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="Write every certificate (per block, per R) as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="PNG: contraction per block, bias vs R, tail mass per row.")
def certify(seq_a, seq_b, stockholm, ids, data, split, index, checkpoint, weights, tail_depths, tol,
            perturbation, block_rows, json_out, plot):
    """Certificates of the transport plan of one pair (seed paper §§ 4-5).

    \b
    - projective contraction per block: exact rho_H = tanh²(Δ/4) and the range bound
      tanh²(Ω/2), summarised over blocks (min / median / p90 / max);
    - the a posteriori bias of the stopped-base gradient, ||c_R|| = ||D_x z_T^T eta_R||,
      and the certified tail depth (first R with ||c_R|| <= --tol); the cotangent is the
      reconstruction loss when a reference alignment is given, else a random unit one;
    - receiver-mass imbalance ||A^T 1 - 1||_inf of the row softmax vs the Sinkhorn plan, and
      the score-perturbation bound ||P(S) - P(T)||_1 <= (n / tau) ||S - T||_inf;
    - row tail mass 1 - max_j P_i(j) (softmax vs Sinkhorn).

    \b
    Examples:
      pfamalign certify MKVLAAGIVGLLLA MKVLSAGIVGLA --json cert.json --plot cert.png
      pfamalign certify --data data/ --split test --index 0
    """
    from rich.console import Console
    from rich.table import Table

    from pfamalign.certify import certify_pair, plot_certificates
    from pfamalign.inference import Predictor

    try:
        depths = tuple(int(x) for x in tail_depths.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {tail_depths!r}", param_hint="--tail-depths")
    from pfamalign.outputs import atomic_path, open_output

    sources = (*sequence_paths(seq_a, seq_b), stockholm, data, checkpoint, weights)
    check_outputs(json_out, plot, inputs=sources)
    pair = resolve_pair(seq_a, seq_b, stockholm, ids, data, split, index)
    try:
        result = certify_pair(Predictor(checkpoint, weights=weights), pair, tail_depths=depths,
                              tol=tol, perturbation=perturbation, block_rows=block_rows)
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    console = Console()
    c = result["contraction"]
    tab = Table(title=f"projective contraction: {c['certified_blocks']}/{c['total_blocks']} blocks certified")
    for col in ("", "count", "min", "median", "p90", "max"):
        tab.add_column(col, justify="right")
    for name in ("delta", "rho_H", "range_bound"):
        d = c[name]
        tab.add_row(name, str(d["count"]), *[f"{d[q]:.4g}" for q in ("min", "median", "p90", "max")])
    console.print(tab)
    b = result["bias"]
    tab = Table(title=f"tail bias ({b['cotangent']} cotangent), certified depth at tol {b['tol']:g}: "
                      f"{b['certified_tail_depth']}")
    for col in ("R", "||eta_R||", "||c_R||", "||full - stopped||", "identity residual", "||grad_full||"):
        tab.add_column(col, justify="right")
    for r in b["rows"]:
        tab.add_row(str(r["tail_steps"]), *[f"{r[k]:.3e}" for k in ("eta_norm", "bias_norm", "gap_norm", "residual", "grad_norm")])
    console.print(tab)
    cons, tm = result["conservative"], result["tail_mass"]
    tab = Table(title="conservative transport and tail mass")
    for col in ("", "row softmax", "Sinkhorn plan"):
        tab.add_column(col, justify="right")
    rm = cons["receiver_mass_imbalance"]
    tab.add_row("receiver-mass imbalance ||A^T1 - 1||_inf", f"{rm['softmax']:.4g}", f"{rm['sinkhorn']:.4g}")
    tab.add_row("tail mass (median)", f"{tm['softmax']['median']:.4g}", f"{tm['sinkhorn']['median']:.4g}")
    tab.add_row("tail mass (max)", f"{tm['softmax']['max']:.4g}", f"{tm['sinkhorn']['max']:.4g}")
    console.print(tab)
    sp = cons["score_perturbation"]
    console.print(f"score perturbation |S-T|_inf={sp['perturbation_inf']:.3g}: ||P(S)-P(T)||_1 = {sp['lhs']:.4g} "
                  f"<= (n/tau)||S-T||_inf = {sp['rhs']:.4g}  ({'holds' if sp['holds'] else 'VIOLATED'})")
    if json_out:
        with open_output(json_out, inputs=sources) as sink:
            sink.write(jsonio.dumps(result, indent=1))
    if plot:
        with atomic_path(plot, inputs=sources) as tmp:
            plot_certificates(result, tmp)
