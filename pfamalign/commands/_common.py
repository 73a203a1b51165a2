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
    from pfamalign.alignment.residues import normalize_sequence

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


def quiet_progress() -> bool:
    """Progress bars stay off when not on a terminal or under CI."""
    return bool(os.environ.get("CI")) or not sys.stderr.isatty()
