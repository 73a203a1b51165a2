"""Small helpers shared by the commands: error exit, sequence arguments, tables."""

from __future__ import annotations

import os
import pathlib
import sys

import click


def fail(message: str, code: int = 2):
    """Prints ``Error: message`` to stderr and exits (no traceback: the message says what to fix)."""
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


FASTA_SUFFIXES = (".fa", ".fasta", ".faa", ".fas")


def read_sequence_arg(arg: str, default_id: str) -> tuple[str, str]:
    """(id, residues) from a command-line argument: a FASTA file path, or the residues.

    A FASTA file must hold exactly one record. Residues are validated (letters only, not
    empty) and upper-cased.
    """
    from pfamalign.residues import normalize_sequence

    path = pathlib.Path(arg)
    looks_like_path = os.sep in arg or path.suffix.lower() in FASTA_SUFFIXES
    if looks_like_path or (len(arg) < 255 and path.is_file()):  # long residue strings are no names
        if not path.is_file():
            fail(f"{arg}: no such FASTA file")
        from Bio import SeqIO

        try:
            records = list(SeqIO.parse(str(path), "fasta"))
        except Exception as err:  # Biopython raises several types on malformed input
            fail(f"{arg}: not a readable FASTA file ({err})")
        if len(records) != 1:
            fail(f"{arg}: expected exactly one FASTA record, found {len(records)} "
                 "(use --pairs for many pairs)")
        rec = records[0]
        seq_id, residues = rec.id or default_id, str(rec.seq)
    else:
        seq_id, residues = default_id, arg
    try:
        return seq_id, normalize_sequence(residues, name=f"{seq_id} ({arg[:20]}...)" if len(arg) > 20 else seq_id)
    except ValueError as err:
        fail(str(err))


def pair_input_options(f):
    """Click options naming one sequence pair: SEQ_A SEQ_B, a Stockholm file with two row
    ids, or a dataset pair; plus the model to use."""
    options = [
        click.argument("seq_a", required=False),
        click.argument("seq_b", required=False),
        click.option("--stockholm", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
                     help="Reference alignment holding both sequences (with --ids): gives the target columns."),
        click.option("--ids", nargs=2, metavar="ID_A ID_B", help="Row names of the pair in --stockholm."),
        click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
                     help="Dataset directory: take pair --index of --split."),
        click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"])),
        click.option("--index", type=int, default=0, show_default=True, help="Pair index within the split."),
        click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=pathlib.Path),
                     help="Model directory (default: the model shipped with pfamalign)."),
        click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path), help="ESM-2 weights."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def resolve_pair(seq_a, seq_b, stockholm, ids, data, split, index) -> dict:
    """The pair record chosen by ``pair_input_options``: residues, ids, and (when a reference
    alignment is known) ``target`` and ``pid``; ``target`` is None for bare sequences."""
    if stockholm is not None:
        if not ids:
            raise click.UsageError("--stockholm needs --ids ID_A ID_B")
        return pair_from_stockholm(stockholm, *ids)
    if data is not None:
        from pfamalign.pipelines import reader

        src = reader.PairSource(data, split, features=False)
        if not 0 <= index < len(src):
            fail(f"--index {index} is out of range: split {split!r} has {len(src)} pairs")
        return src[index]
    if seq_a and seq_b:
        (id_a, sa), (id_b, sb) = read_sequence_arg(seq_a, "seq_a"), read_sequence_arg(seq_b, "seq_b")
        return {"q_id": id_a, "k_id": id_b, "q_seq": sa, "k_seq": sb, "target": None, "pid": None}
    raise click.UsageError("give SEQ_A SEQ_B, or --stockholm FILE --ids ID_A ID_B, or --data DIR")


def pair_from_stockholm(path: pathlib.Path, id_a: str, id_b: str) -> dict:
    """The pair record (residues, target, identity) of two named rows of a Stockholm file."""
    import numpy as np

    from pfamalign.pipelines.pairs import family_arrays, pair_identity, pair_target
    from pfamalign.pipelines.stockholm import StockholmError, read_families

    try:
        for family in read_families([str(path)]):
            names = list(family.seq_ids)
            if id_a in names and id_b in names:
                fa = family_arrays(family)
                qi, ki = names.index(id_a), names.index(id_b)
                pid, _ = pair_identity(fa, np.array([qi]), np.array([ki]))
                return {"q_id": id_a, "k_id": id_b, "q_seq": fa.residues[qi], "k_seq": fa.residues[ki],
                        "target": pair_target(fa, qi, ki), "pid": float(pid[0]), "family": family.key}
    except StockholmError as err:
        fail(str(err))
    fail(f"{path}: no family holds both {id_a!r} and {id_b!r}")


DECODER_FIELDS = ("decoder", "gap_open", "gap_extend", "threshold", "gap_cost", "min_mass", "plan_weight",
                  "end_gaps")


def decoder_options(f):
    """Click options overriding the model's decoding settings (``decoding.json`` in the model
    directory, else the built-in defaults)."""
    options = [
        click.option("--decoder", type=click.Choice(["affine", "mea", "hybrid"]), default=None,
                     help="Plan decoder: affine-gap DP on the plan, maximum expected accuracy, or "
                          "affine-gap DP on BLOSUM62 + plan weight x plan. Default: the model's "
                          "decoding.json (the shipped model: hybrid)."),
        click.option("--gap-open", type=float, default=None,
                     help="affine / hybrid: cost of opening a gap (plan-mass / BLOSUM62 units)."),
        click.option("--gap-extend", type=float, default=None, help="affine / hybrid: cost of each further gap residue."),
        click.option("--plan-weight", type=float, default=None,
                     help="hybrid: BLOSUM62 units per unit of plan mass."),
        click.option("--end-gaps/--free-end-gaps", default=None,
                     help="affine / hybrid: charge leading and trailing gaps (global alignment) "
                          "or leave them free (local)."),
        click.option("--threshold", type=float, default=None, help="affine: mass subtracted from every aligned pair."),
        click.option("--gap-cost", type=float, default=None, help="mea: cost per unaligned residue."),
        click.option("--min-mass", type=float, default=None, help="Never align a pair with less plan mass."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def decoder_settings(base, options: dict):
    """``base`` (a DecoderSettings) with the options the user gave; pops them from ``options``.
    Choosing another decoder starts from that decoder's defaults (its own gap units)."""
    import dataclasses

    given = {k: options.pop(k) for k in DECODER_FIELDS}
    if given["decoder"] is not None and given["decoder"] != base.decoder:
        base = type(base).for_decoder(given["decoder"])
    try:
        return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    except ValueError as err:
        fail(str(err))
