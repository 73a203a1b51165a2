"""Reading the pairs to align into pair records: sequences given as residues or one-record FASTA
files, pairs files (TSV), two rows of a Stockholm alignment, and dataset pairs.

A pair record is a dict with the keys of a dataset pair (``pfamalign.pipelines.reader``):
``q_id``, ``k_id``, ``q_seq``, ``k_seq``, ``target`` (the reference column of each query
residue, -1 where none; None without a reference alignment) and ``pid`` (percent identity, None
without one). Bad input raises ``ValueError`` (``IndexError`` for a dataset index) with a
message that says what to fix.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import sys
from typing import Iterator

FASTA_SUFFIXES = (".fa", ".fasta", ".faa", ".fas")
# Longest pairs-file line read (characters): lines are read with this bound, so a file
# without line ends (/dev/zero) is an error, not an unbounded allocation.
MAX_LINE = 1 << 20
MAX_FASTA_BYTES = 16 << 20  # a sequence argument's FASTA file: one record, read whole


def argument_path(arg: str) -> pathlib.Path | None:
    """The rule for a sequence argument: a FASTA file when it starts with ``@`` (the rest is
    the path), contains a path separator, or ends in a FASTA suffix (its path is returned);
    residues otherwise (None)."""
    if arg.startswith("@"):
        return pathlib.Path(arg[1:])
    if "/" in arg or os.sep in arg or pathlib.Path(arg).suffix.lower() in FASTA_SUFFIXES:
        return pathlib.Path(arg)
    return None


def read_sequence(arg: str, default_id: str) -> tuple[str, str]:
    """(id, residues) of a sequence argument: a FASTA file path (``argument_path``), or
    the residues.

    A FASTA file must hold exactly one record. Residues are validated (letters only, not
    empty) and upper-cased. Residues that also name a file in the working directory are read
    as residues, with a warning on standard error.
    """
    from pfamalign.residues import normalize_sequence

    path = argument_path(arg)
    if path is not None:
        if not path.is_file():
            raise ValueError(f"{arg}: no such FASTA file")
        if path.stat().st_size > MAX_FASTA_BYTES:
            raise ValueError(f"{arg}: {path.stat().st_size} bytes, more than a one-sequence FASTA "
                             f"file can hold ({MAX_FASTA_BYTES}); use --pairs for many pairs")
        from Bio import SeqIO

        try:
            records = list(SeqIO.parse(str(path), "fasta"))
        except Exception as err:  # Biopython raises several types on malformed input
            raise ValueError(f"{arg}: not a readable FASTA file ({err})") from err
        if len(records) != 1:
            raise ValueError(f"{arg}: expected exactly one FASTA record, found {len(records)} "
                             "(use --pairs for many pairs)")
        rec = records[0]
        seq_id, residues = rec.id or default_id, str(rec.seq)
    else:
        if len(arg) < 255 and pathlib.Path(arg).is_file():  # long residue strings are no names
            print(f"Warning: {arg!r} is read as residues, though a file of that name exists; "
                  f"write ./{arg} or @{arg} to read the file", file=sys.stderr)
        seq_id, residues = default_id, arg
    return seq_id, normalize_sequence(residues, name=f"{seq_id} ({arg[:20]}...)" if len(arg) > 20 else seq_id)


def pair_from_sequences(seq_a: str, seq_b: str) -> dict:
    """The pair record of two sequence arguments (see ``read_sequence``), no reference."""
    (id_a, sa), (id_b, sb) = read_sequence(seq_a, "seq_a"), read_sequence(seq_b, "seq_b")
    return _bare_pair(id_a, sa, id_b, sb)


def read_pairs_tsv(path: pathlib.Path) -> Iterator[dict]:
    """Streams the pair records of a tab-separated pairs file.

    Each non-empty line that is not a ``#`` comment holds either ``SEQ_A<TAB>SEQ_B`` (ids
    ``pairN_a`` / ``pairN_b`` for line N) or ``ID_A<TAB>SEQ_A<TAB>ID_B<TAB>SEQ_B``. Each record
    also carries ``where`` (``path:line``), for error messages about that pair. The file must
    be UTF-8 with lines of at most ``MAX_LINE`` characters.
    """
    with open(path, encoding="utf-8", newline="") as handle:
        for lineno in itertools.count(1):
            try:
                line = handle.readline(MAX_LINE + 1)
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text ({err.reason} at byte "
                                 f"{err.start} of the block read); is it a pairs file?") from None
            if not line:
                break
            if len(line) > MAX_LINE:
                raise ValueError(f"{path}:{lineno}: line longer than {MAX_LINE} characters; "
                                 "is it a pairs file (SEQ_A<TAB>SEQ_B per line)?")
            line = line.rstrip("\n\r")
            if not line.strip() or line.startswith("#"):
                continue
            cols = [c.strip() for c in line.split("\t")]
            if len(cols) == 2:
                cols = [f"pair{lineno}_a", cols[0], f"pair{lineno}_b", cols[1]]
            elif len(cols) != 4:
                raise ValueError(
                    f"{path}:{lineno}: expected 2 (SEQ_A, SEQ_B) or 4 (ID_A, SEQ_A, ID_B, SEQ_B) "
                    f"tab-separated columns, found {len(cols)}")
            yield {**_bare_pair(*cols), "where": f"{path}:{lineno}"}


def pair_from_stockholm(path: pathlib.Path, id_a: str, id_b: str) -> dict:
    """The pair record (residues, target, identity, family) of two named rows of a Stockholm
    file. A malformed file raises ``pipelines.stockholm.StockholmError`` (a ValueError)."""
    import numpy as np

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
    raise ValueError(f"{path}: no family holds both {id_a!r} and {id_b!r}")


def pair_from_dataset(data: pathlib.Path, split: str, index: int) -> dict:
    """Pair ``index`` of a dataset split (residues and target, no features)."""
    from pfamalign.pipelines import reader

    return reader.PairSource(data, split, features=False)[index]


def _bare_pair(id_a: str, seq_a: str, id_b: str, seq_b: str) -> dict:
    return {"q_id": id_a, "k_id": id_b, "q_seq": seq_a, "k_seq": seq_b, "target": None, "pid": None}
