"""``pfamalign barycenter``: transport barycenters of query rows against the reference columns."""

from __future__ import annotations


import click
import numpy as np

from pfamalign.commands._common import (OutputFile, check_figure, check_outputs, fail, max_length_option,
                                       pair_input_options, resolve_pair, sequence_paths)


@click.command(short_help="Transport barycenters of a pair against its reference columns.")
@pair_input_options()
@click.option("--plot", type=OutputFile(),
              help="Figure (format from the extension: .png, .svg, .pdf, ...): barycenter of each query row "
                   "against its target column.")
@click.option("--tsv", type=OutputFile(),
              help="Write the per-row table as TSV here (- for standard output; the display then "
                   "goes to standard error).")
@max_length_option()
def barycenter(seq_a, seq_b, stockholm, ids, data, split, index, checkpoint, weights, plot, tsv, max_length):
    """Row-normalized transport barycenters of a pair against its reference columns.

    \b
    For each query row i: b_i = sum_j P_ij j / sum_j P_ij over the real keys, beside the
    reference column c_i (when a reference alignment is given), |b_i - c_i|, the row's real
    mass and its dustbin mass. The plot shows the plan at a glance. Rows,
    columns and barycenters are 0-based plan indices (residue i + 1 of the sequence); a row
    without a reference column shows target — (--tsv: -1) and no error.

    \b
    Examples:
      pfamalign barycenter --stockholm PF00595.sto --ids DLG4_RAT/65-149 DLG1_DROME/216-300 --plot b.png
      pfamalign barycenter --data data/ --split test --index 3
      pfamalign barycenter MKVLAAGIVG MKVLSAGIVA
    """
    from rich.table import Table

    from pfamalign.barycenter import pair_barycenters
    from pfamalign.inference import Predictor
    from pfamalign.outputs import atomic_path, open_output, table_console

    sources = (*sequence_paths(seq_a, seq_b), stockholm, data, checkpoint, weights)
    check_outputs(tsv, plot, inputs=sources)
    plot_fmt = check_figure(plot)
    pair = resolve_pair(seq_a, seq_b, stockholm, ids, data, split, index)
    try:
        result = pair_barycenters(Predictor(checkpoint, weights=weights, max_length=max_length), pair)
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    table, pm = result.table, result.metrics
    console = table_console(stderr=str(tsv) == "-")  # stdout carries the TSV alone
    tab = Table(title=f"barycenters: {pair['q_id']} vs {pair['k_id']}")
    for col in table.columns:
        tab.add_column(col, justify="right")
    for row in table.itertuples(index=False):
        cells = row._replace(target=np.nan) if row.target < 0 else row  # -1: no reference column
        tab.add_row(*[("—" if isinstance(x, float) and np.isnan(x) else f"{x:.2f}" if isinstance(x, float)
                       else str(x)) for x in cells])
    console.print(tab)
    if pm is not None:
        console.print(f"barycenter MAE {pm.barycenter_mae:.2f}, within-5 {pm.within5:.3f}, "
                      f"monotonicity violation {pm.monotonicity_violation:.3f} "
                      f"({pm.n_barycenter} annotated rows)")
    if tsv:
        with open_output(tsv, inputs=sources) as sink:
            table.to_csv(sink, sep="\t", index=False)
    if plot:
        from pfamalign.alignment.plots import plot_barycenter

        with atomic_path(plot, inputs=sources) as tmp:
            plot_barycenter(result.plan.real, table["target"].to_numpy(), tmp,
                            title=f"{pair['q_id']} vs {pair['k_id']}", names=(pair["q_id"], pair["k_id"]),
                            fmt=plot_fmt)
