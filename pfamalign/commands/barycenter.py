"""``pfamalign barycenter``: transport barycenters of query rows against the reference columns."""

from __future__ import annotations

import pathlib

import click
import numpy as np

from pfamalign.commands._common import fail, read_sequence_arg


def pair_from_stockholm(path: pathlib.Path, id_a: str, id_b: str) -> dict:
    """The pair record (residues, target, identity) of two named rows of a Stockholm file."""
    from pfamalign.pipelines.pairs import family_arrays, pair_identity, pair_target
    from pfamalign.pipelines.stockholm import read_families

    for family in read_families([str(path)]):
        names = list(family.seq_ids)
        if id_a in names and id_b in names:
            fa = family_arrays(family)
            qi, ki = names.index(id_a), names.index(id_b)
            pid, _ = pair_identity(fa, np.array([qi]), np.array([ki]))
            return {"q_id": id_a, "k_id": id_b, "q_seq": fa.residues[qi], "k_seq": fa.residues[ki],
                    "target": pair_target(fa, qi, ki), "pid": float(pid[0]), "family": family.key}
    fail(f"{path}: no family holds both {id_a!r} and {id_b!r}")


@click.command()
@click.argument("seq_a", required=False)
@click.argument("seq_b", required=False)
@click.option("--stockholm", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
              help="Reference alignment holding both sequences (with --ids): gives the target columns.")
@click.option("--ids", nargs=2, metavar="ID_A ID_B", help="Row names of the pair in --stockholm.")
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
              help="Dataset directory: take pair --index of --split.")
@click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"]))
@click.option("--index", type=int, default=0, show_default=True, help="Pair index within the split.")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
              help="Model directory (default: the model shipped with pfamalign).")
@click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path), help="ESM-2 weights.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="PNG: barycenter of each query row against its target column.")
@click.option("--tsv", type=click.Path(dir_okay=False, path_type=pathlib.Path),
              help="Write the per-row table as TSV here.")
def barycenter(seq_a, seq_b, stockholm, ids, data, split, index, checkpoint, weights, plot, tsv):
    """Row-normalized transport barycenters of a pair against its reference columns.

    \b
    For each query row i: b_i = sum_j P_ij j / sum_j P_ij over the real keys, beside the
    reference column c_i (when a reference alignment is given), |b_i - c_i|, the row's real
    mass and its dustbin mass. The plot is the seed paper's qualitative figure.

    \b
    Examples:
      pfamalign barycenter --stockholm PF00595.sto --ids DLG1_HUMAN/225-308 SHAN1_RAT/664-748 --plot b.png
      pfamalign barycenter --data data/ --split test --index 3
      pfamalign barycenter MKVLAAGIVG MKVLSAGIVA
    """
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from pfamalign.alignment.metrics import barycenters, plan_metrics
    from pfamalign.inference import Predictor

    if stockholm is not None:
        if not ids:
            raise click.UsageError("--stockholm needs --ids ID_A ID_B")
        rec = pair_from_stockholm(stockholm, *ids)
    elif data is not None:
        from pfamalign.pipelines import reader

        src = reader.PairSource(data, split, features=False)
        if not 0 <= index < len(src):
            fail(f"--index {index} is out of range: split {split!r} has {len(src)} pairs")
        rec = src[index]
    elif seq_a and seq_b:
        (id_a, sa), (id_b, sb) = read_sequence_arg(seq_a, "seq_a"), read_sequence_arg(seq_b, "seq_b")
        rec = {"q_id": id_a, "k_id": id_b, "q_seq": sa, "k_seq": sb, "target": None}
    else:
        raise click.UsageError("give SEQ_A SEQ_B, or --stockholm FILE --ids A B, or --data DIR")
    try:
        predictor = Predictor(checkpoint, weights=weights)
        _, pp = predictor.align(rec["q_seq"], rec["k_seq"])
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    b = barycenters(pp.real)
    lq = len(rec["q_seq"])
    target = None if rec.get("target") is None else np.asarray(rec["target"])
    table = pd.DataFrame({
        "row": np.arange(lq), "residue": list(rec["q_seq"]),
        "target": target if target is not None else np.full(lq, -1),
        "barycenter": b, "abs_error": np.where(target >= 0, np.abs(b - target), np.nan) if target is not None
        else np.full(lq, np.nan),
        "real_mass": pp.real.sum(1), "dustbin_mass": pp.row_dustbin,
    })
    console = Console()
    tab = Table(title=f"barycenters: {rec['q_id']} vs {rec['k_id']}")
    for col in table.columns:
        tab.add_column(col, justify="right")
    for row in table.itertuples(index=False):
        tab.add_row(*[("—" if isinstance(x, float) and np.isnan(x) else f"{x:.2f}" if isinstance(x, float)
                       else str(x)) for x in row])
    console.print(tab)
    if target is not None:
        pm = plan_metrics(pp.real, target, dustbin_mass=pp.row_dustbin)
        console.print(f"barycenter MAE {pm.barycenter_mae:.2f}, within-5 {pm.within5:.3f}, "
                      f"monotonicity violation {pm.monotonicity_violation:.3f} "
                      f"({pm.n_barycenter} annotated rows)")
    if tsv:
        table.to_csv(tsv, sep="\t", index=False)
    if plot:
        from pfamalign.alignment.plots import plot_barycenter

        plot_barycenter(pp.real, target if target is not None else np.full(lq, -1), plot,
                        title=f"{rec['q_id']} vs {rec['k_id']}")
