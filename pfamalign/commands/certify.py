"""``pfamalign certify``: convergence, bias and stability certificates of one aligned pair."""

from __future__ import annotations


import click

from pfamalign import interrupts, jsonio
from pfamalign.commands._common import (Number, OutputFile, check_figure, check_outputs, fail, max_length_option,
                                       max_memory_option, pair_input_options, resolve_pair, sequence_paths)


MAX_TAIL_DEPTH = 1000  # each depth differentiates through R more steps: beyond this, hours
# Scores are O(10) logits: a perturbation past this is all the perturbed plan is made of, and
# near float64's top the perturbed scores overflow.
MAX_PERTURBATION = 1e6


@click.command(short_help="Certificates of one pair's transport plan.")
@pair_input_options(ensembles=False)
@click.option("--tail-depths", default="0,1,2,4", show_default=True,
              help="Tail depths R for the bias certificate (comma-separated, any order).")
@click.option("--tol", type=Number(min=0, min_open=True), default=1e-5, show_default=True,
              help="Bias tolerance tau: the certified depth is the smallest R with ||c_R|| <= tau.")
@click.option("--perturbation", type=Number(min=0, min_open=True, max=MAX_PERTURBATION), default=1e-2,
              show_default=True,
              help="Size (sup norm) of the random score perturbation for the stability bounds.")
@click.option("--score-noise", type=Number(min=0), default=None,
              help="Radius r (gauge-reduced oscillation of a score change): list the aligned pairs "
                   "certified to stay their row's and column's winner under any such change "
                   "(a balanced plan solved to convergence only: otherwise the output says it "
                   "does not apply, and why).")
@click.option("--block-rows", type=click.IntRange(min=1), default=128, show_default=True,
              help="Rows per contraction block.")
@max_length_option()
@max_memory_option("; certify solves the dense problem in float64: about 3 GB at 2,000 x 2,000 residues")
@click.option("--json", "json_out", type=OutputFile(),
              help="Write every certificate (per block, per R) as JSON here (- for standard output; "
                   "the tables then go to standard error).")
@click.option("--plot", type=OutputFile(),
              help="Figure (format from the extension: .png, .svg, .pdf, ...): contraction per block, bias "
                   "vs R, tail mass per row.")
def certify(seq_a, seq_b, stockholm, ids, data, split, index, checkpoint, weights, tail_depths, tol,
            perturbation, score_noise, block_rows, max_length, max_memory, json_out, plot):
    """Certificates of the transport plan of one pair (docs/design.md §6).

    \b
    - projective contraction per block: exact rho_H = tanh²(Δ/4) and the range bound
      tanh²(Ω/2), summarised over blocks (min / median / p90 / max);
    - the a posteriori bias of the stopped-base gradient, ||c_R|| = ||D_x z_T^T eta_R||,
      and the certified tail depth (smallest R with ||c_R|| <= --tol); the cotangent is the
      reconstruction loss when a reference alignment is given, else a random unit one;
    - marginals of the output plan: sender (row) and receiver (column) errors, total mass, and
      feasibility (spoke / none with Lq != Lk cannot meet unit targets: rows tend to the
      expected row sum instead);
    - ceta: the plan's own bound ||P(S) - P(T)||_1 <= (M / tau) ||S - T||_inf and its gauge
      form (M / 2 tau) osc(S - T), both plans converged in float64, with lhs / rhs ratio;
      lipschitz (largest row sum) and the row softmax's receiver imbalance;
    - softmax_ot: the row softmax as semi-relaxed OT: half-oscillation bound and its tightness,
      tail mass, 4 delta (1 - delta), margins, locked rows, drift of the solver's plans;
    - with --score-noise r: the aligned pairs certified stable under perturbations of size r.

    Time: float64 solves to convergence and a gradient per tail depth, growing steeply with
    length: on two CPU cores about 7 s for two 30-residue sequences, a minute at 200 x 200,
    over 15 minutes at 1,500 x 1,500 (the memory check comes first; progress shows each stage).

    \b
    Examples:
      pfamalign certify MKVLAAGIVGLLLA MKVLSAGIVGLA --json cert.json --plot cert.png
      pfamalign certify --data data/ --split test --index 0 --score-noise 1e-3
    """
    from rich.console import Console
    from rich.table import Table

    from pfamalign.certify import certify_pair, contraction_verdict, plot_certificates
    from pfamalign.inference import Predictor
    from pfamalign.outputs import table_console
    from pfamalign.resources import CERTIFY_FIXED_BYTES, budget, check_memory, estimate_certify_bytes

    try:
        depths = tuple(int(x) for x in tail_depths.split(","))
    except ValueError:  # also an empty item ("1,,2")
        depths = ()
    if not depths or not all(0 <= d <= MAX_TAIL_DEPTH for d in depths):
        raise click.BadParameter(f"expected comma-separated refinement depths R, integers from 0 "
                                 f"to {MAX_TAIL_DEPTH} (e.g. 0,1,2,4), got {tail_depths!r}",
                                 param_hint="--tail-depths")
    from pfamalign.outputs import atomic_path, open_output

    sources = (*sequence_paths(seq_a, seq_b), stockholm, data, checkpoint, weights)
    check_outputs(json_out, plot, inputs=sources)
    plot_fmt = check_figure(plot)
    pair = resolve_pair(seq_a, seq_b, stockholm, ids, data, split, index)
    try:
        lengths = len(pair["q_seq"]), len(pair["k_seq"])
        predictor = Predictor(checkpoint, weights=weights, max_length=max_length)
        if max(lengths) <= max_length:  # a longer one is refused by its length first; checked once
            check_memory(estimate_certify_bytes(*lengths), budget(max_memory),  # the runtime is mapped
                         f"certifying {lengths[0]} x {lengths[1]} residues", fixed=CERTIFY_FIXED_BYTES)
        with Console(stderr=True).status(f"certifying {lengths[0]} x {lengths[1]} residues") as status:
            def stage(name: str) -> None:
                interrupts.check()  # an interrupt Python dropped midway stops the next stage
                status.update(f"certifying: {name}")

            result = certify_pair(predictor, pair, tail_depths=depths, tol=tol, perturbation=perturbation,
                                  block_rows=block_rows, score_noise=score_noise, progress=stage)
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    console = table_console(stderr=str(json_out) == "-")  # stdout carries the JSON alone
    c = result["contraction"]
    tab = Table(title=f"projective contraction: {contraction_verdict(c)}")
    for col in ("", "count", "min", "median", "p90", "max"):
        tab.add_column(col, justify="right")
    for name in ("delta", "rho_H", "range_bound"):
        d = c[name]
        tab.add_row(name, str(d["count"]),
                    *[_contraction_number(d[q]) for q in ("min", "median", "p90", "max")])
    console.print(tab)
    b = result["bias"]
    tab = Table(title=f"tail bias ({b['cotangent']} cotangent), certified depth at tol {b['tol']:g}: "
                      f"{b['certified_tail_depth']}")
    for col in ("R", "||eta_R||", "||c_R||", "||full - stopped||", "identity residual", "||grad_full||"):
        tab.add_column(col, justify="right")
    for r in b["rows"]:
        tab.add_row(str(r["tail_steps"]), *[f"{r[k]:.3e}" for k in ("eta_norm", "bias_norm", "gap_norm", "residual", "grad_norm")])
    console.print(tab)
    print_plan_certificates(console, result)
    if json_out:
        with open_output(json_out, inputs=sources) as sink:
            sink.write(jsonio.dumps(result, indent=1))
    if plot:
        with atomic_path(plot, inputs=sources) as tmp:
            plot_certificates(result, tmp, title=f"{pair['q_id']} vs {pair['k_id']}",
                              names=(pair["q_id"], pair["k_id"]), fmt=plot_fmt)


def _table(title, sections: list[dict], fields):
    """One row per ``(label, key)`` of ``fields``, one column per head (``sections``)."""
    from rich.table import Table

    tab = Table(title=title)
    tab.add_column("")
    for h in range(len(sections)):
        tab.add_column(f"head {h}", justify="right")
    fmt = lambda x: x if isinstance(x, str) else str(x) if isinstance(x, (bool, int)) else f"{x:.4g}"
    for label, get in fields:
        tab.add_row(label, *[fmt(get(sec)) for sec in sections])
    return tab


def print_plan_certificates(console, result: dict) -> None:
    """The marginals, ceta, softmax_ot (one column per head), encoder and stable_matches sections."""
    key = lambda k: (lambda d: d[k])
    console.print(_table("marginals of the output plan", result["marginals"], [
        ("sender error max|row sum - 1|", key("sender_error")),
        ("receiver error max|column sum - 1|", key("receiver_error")),
        ("total mass", key("total_mass")), ("feasible (unit targets)", key("feasible")),
        ("expected row sum", key("expected_row_sum")), ("base steps", key("steps")),
        ("l1 distance to the converged plan", key("l1_to_converged"))]))
    console.print(_table("ceta: the plan's bound ||P(S)-P(T)||_1 <= (M/2tau) osc(S-T), float64",
                         result["ceta"], [
        ("lhs ||P(S)-P(T)||_1", key("lhs")), ("rhs (M/tau)||S-T||_inf", key("rhs_sup")),
        ("rhs (M/2tau) osc(S-T)", key("rhs_gauge")), ("ratio lhs / rhs", key("ratio")),
        ("vacuity radius 2 tau", key("vacuity_radius")), ("converged", key("converged")),
        ("applies (feasible, converged)", key("applies")), ("lipschitz (max row sum)", key("lipschitz")),
        ("softmax receiver imbalance (/ Lq/Lk)", key("softmax_receiver_imbalance")),
        ("plan receiver imbalance", key("plan_receiver_imbalance"))]))
    console.print(_table("softmax_ot: the row softmax as semi-relaxed OT", result["softmax_ot"], [
        ("row bound ratio median", key("row_bound_ratio_median")),
        ("row bound ratio p90", key("row_bound_ratio_p90")), ("bound violations", key("violations")),
        ("tail mass delta median", lambda o: o["tail_mass"]["median"]),
        ("4 delta (1 - delta) max", lambda o: o["local_constant"]["max"]),
        ("argmax margin median", lambda o: o["margin"]["median"]),
        ("locked fraction (p_max >= 0.9999)", key("locked_fraction")),
        ("plan tail mass median", lambda o: o["plan_tail_mass"]["median"]),
        ("drift ||P^(t)-P^(t-1)||_1, last step", lambda o: o["drift"][-1] if o["drift"] else float("nan"))]))
    layers = result.get("encoder", {}).get("layers", [])  # a transformer encoder's attention, per layer
    if layers:
        from rich.table import Table

        tab = Table(title="encoder attention per layer")
        fields = [k for k in ("sender_error", "receiver_error", "receiver_imbalance", "tail_mass_median",
                              "locked_fraction") if any(k in layer for layer in layers)]
        for col in ("layer", "attention", *fields):
            tab.add_column(col, justify="right")
        for layer in layers:
            tab.add_row(str(layer["layer"]), layer["attention"],
                        *[f"{layer[k]:.3g}" if k in layer else "" for k in fields])
        console.print(tab)
    st = result.get("stable_matches")
    if st is not None:
        if st["applies"]:
            console.print(f"stable matches at r={st['score_noise']:g} (entry > {st['threshold']:.4g}): "
                          f"{st['certified']} of {st['aligned']} aligned pairs")
        else:
            console.print(f"stable matches at r={st['score_noise']:g}: not certified ({st['reason']})")


def _contraction_number(x: float) -> str:
    """``.4g``, except a rate just below 1 (a certified block of a long band: rho_H =
    tanh^2(delta / 4)), written as its distance to 1 rather than rounded up to an uncertified 1."""
    return f"1 - {1 - x:.2g}" if 0.99995 <= x < 1 else f"{x:.4g}"

