"""Reading the pairs to align into pair records: sequences given as residues or FASTA files
(``-`` = standard input; one reader, ``read_fasta``, for every FASTA the package reads), pairs
files (TSV), two rows of a Stockholm alignment, and dataset pairs. Files may be
gzip-compressed (``open_text``) and may start with a UTF-8 byte-order mark.

A pair record is a dict with the keys of a dataset pair (``pfamalign.pipelines.reader``):
``q_id``, ``k_id``, ``q_seq``, ``k_seq``, ``target`` (the reference column of each query
residue, -1 where none; None without a reference alignment) and ``pid`` (percent identity, None
without one). Bad input raises ``ValueError`` (``IndexError`` for a dataset index) with a
message that says what to fix. Streaming readers of many records (``read_fasta``,
``read_pairs_tsv``) *yield* a ``BadRecord`` (a ValueError naming ``file:line``) in place of a
record they cannot use and go on, so a batch job can report it and continue; raise it to stop.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gzip
import io
import itertools
import os
import pathlib
import re
import sys
import zlib
from typing import IO, Iterable, Iterator

from pfamalign.limits import MAX_LINE

FASTA_SUFFIXES = (".fa", ".fasta", ".faa", ".fas")
MAX_RECORD = 1 << 22  # residues per FASTA record (far above any protein; bounds memory)
STDIN = "-"
GZIP_MAGIC = b"\x1f\x8b"
PAIRS_LINES = "lines of SEQ_A<TAB>SEQ_B or ID_A<TAB>SEQ_A<TAB>ID_B<TAB>SEQ_B ('#': a comment)"


class BadRecord(ValueError):
    """One unusable record of a batch input; the message starts with its ``file:line``."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclasses.dataclass(frozen=True)
class FastaRecord:
    id: str
    seq: str
    where: str  # file:line of the header
    description: str = ""  # the header after the id (BLAST's definition line is id + description)


def _bounded_lines(handle: IO[str], source: str, kind: str = "FASTA", *,
                   strict_utf8: bool = True) -> Iterator[tuple[int, str]]:
    """(1-based number, text without the newline) of each line; a line over MAX_LINE raises
    (``kind``: the file's kind, for the hint), and so does a line that is not UTF-8, by its
    own number (``open_text`` decodes with surrogateescape: a strict decoder fails on a
    chunk read ahead, at an earlier line), unless ``strict_utf8`` is off: then the line
    comes with its bad bytes as surrogates (``not_utf8``), for the reader to refuse only the
    record that holds it. A byte-order mark opening the text (Windows editors write one) is
    dropped."""
    lineno = 0
    while True:
        try:
            line = handle.readline(MAX_LINE + 1)
        except UnicodeDecodeError as err:  # a strict stream (standard input): decoded ahead
            raise ValueError(f"{source}: not UTF-8 text at or after line {lineno + 1} ({err.reason})") from err
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise ValueError(f"{source}:{lineno + 1}: the compressed file is truncated or corrupt "
                             f"({err})") from err
        except OSError as err:  # a read error mid-file (EIO, a closed standard input)
            raise ValueError(f"{source}:{lineno + 1}: read error ({err.strerror or err})") from err
        if not line:
            return
        lineno += 1
        if lineno == 1:
            line = line.removeprefix("\ufeff")
        if strict_utf8 and (why := not_utf8(line)):
            raise ValueError(f"{source}:{lineno}: {why}")
        if len(line.rstrip("\n\r")) > MAX_LINE:
            raise ValueError(f"{source}:{lineno}: line longer than {MAX_LINE} characters; "
                             f"is this a {kind} file?")
        yield lineno, line.rstrip("\n\r")


def not_utf8(line: str) -> str | None:
    """What is wrong with a line decoded with surrogateescape (``open_text``) whose bytes are
    not all UTF-8, naming the first such byte; None for a line that is UTF-8."""
    if not line.isascii() and (bad := next((c for c in line if "\udc80" <= c <= "\udcff"), None)):
        return f"not UTF-8 text (byte 0x{ord(bad) - 0xdc00:02x})"
    return None


def fasta_records(handle: IO[str], source: str, *, validate: bool = True
                  ) -> Iterator[FastaRecord | BadRecord]:
    """Streams the records of FASTA text (id = first word of the header, the rest its
    description; sequence lines joined, spaces and tabs inside them dropped, as GenBank-style
    blocks of ten residues have them). ``validate``: one trailing ``*`` (a stop) dropped,
    residues checked and upper-cased, a bad record yielded as a ``BadRecord`` (the line of
    its first bad character named); without it (aligned FASTA with gaps) the rows come as written.
    Text that is not FASTA at all (no header before the first sequence line, an over-long
    line) raises."""
    from pfamalign.residues import first_invalid, input_sequence

    header: tuple[int, str] | None = None
    parts: list[str] = []
    starts: list[tuple[int, int]] = []  # (offset in the record, line number) of each sequence line
    size = 0
    undecodable: tuple[str, str] | None = None  # (file:line, why) of the record's first non-UTF-8 line

    def finish():
        lineno, text = header
        where = f"{source}:{lineno}"
        if undecodable is not None:  # this record only: the batch goes on
            at, why = undecodable
            return BadRecord(at, f"{why}; the record starting at line {lineno} is left out "
                                 "(save the file as UTF-8)")
        words = text.split(maxsplit=1)
        if not words:
            return BadRecord(where, "FASTA header without a name")
        name, description = words[0], words[1].strip() if len(words) > 1 else ""
        seq = "".join(parts)
        if not validate:
            return FastaRecord(name, seq, where, description)
        if not seq.removesuffix("*"):  # one '*' is a stop codon, not a residue (input_sequence)
            return BadRecord(where, f"record {name!r} has no residues")
        try:
            return FastaRecord(name, input_sequence(seq, name=f"record {name!r}"), where, description)
        except ValueError as err:
            pos = first_invalid(seq)
            if pos is None:
                return BadRecord(where, str(err))
            line = next(n for offset, n in reversed(starts) if offset <= pos)
            return BadRecord(where, f"record {name!r} has a non-protein character {seq[pos]!r} at position "
                                    f"{pos + 1} (1-based), on line {line}; expected residue letters only "
                                    "(no gaps or digits; one '*' may end a record)")

    for lineno, line in _bounded_lines(handle, source, strict_utf8=False):
        why = not_utf8(line)
        if line.startswith(">"):
            if header is not None:
                yield finish()
            header, parts, starts, size, undecodable = (lineno, line[1:]), [], [], 0, None
        elif why and header is None:  # before any record: not FASTA text at all
            raise ValueError(f"{source}:{lineno}: {why}")
        if why and undecodable is None:  # the record's first such line; it is left out
            undecodable = (f"{source}:{lineno}", why)
        if line.startswith(">") or not line.strip():
            continue
        if header is None:
            if line.startswith("# STOCKHOLM"):
                raise ValueError(f"{source}:{lineno}: a Stockholm alignment, not FASTA (convert it, "
                                 "e.g. `esl-reformat fasta`, or give it to --stockholm where a "
                                 "command takes one)")
            hint = " (a tab-separated pairs file? give it to --pairs)" if "\t" in line else ""
            raise ValueError(f"{source}:{lineno}: not FASTA: sequence before the first '>' header{hint}")
        starts.append((size, lineno))
        line = line.strip().replace(" ", "").replace("\t", "")  # not other whitespace: a bad character
        size += len(line)
        if size > MAX_RECORD:
            raise ValueError(f"{source}:{header[0]}: record longer than {MAX_RECORD} residues")
        parts.append(line)
    if header is not None:
        yield finish()


@contextlib.contextmanager
def open_text(name: str, what: str, *, newline: str | None = None
              ) -> Iterator[tuple[IO[str], str]]:
    """(UTF-8 text handle, name for messages) of ``-`` (standard input) or a file, gzip-compressed
    or not. Compression is told by the magic bytes, peeked without seeking, so a pipe (process
    substitution, ``/dev/fd/N``) works too. ``what`` names the kind of file in errors."""
    if name == STDIN:
        raw = getattr(sys.stdin, "buffer", None)  # a terminal or pipe: peekable bytes below
        if raw is None or not hasattr(raw, "peek") or raw.peek(2)[:2] != GZIP_MAGIC:
            yield sys.stdin, "<stdin>"
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream, \
                io.TextIOWrapper(stream, encoding="utf-8", errors="surrogateescape", newline=newline) as text:
            yield text, "<stdin>"
        return
    if os.path.isdir(name):
        raise ValueError(f"{name}: is a directory; give a {what} file")
    try:
        raw = open(name, "rb")
    except OSError as err:
        raise ValueError(f"{name}: cannot read {what} file ({err.strerror})") from err
    with raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == GZIP_MAGIC else raw
        # surrogateescape: a byte that is not UTF-8 is named at its own line (_bounded_lines)
        with io.TextIOWrapper(stream, encoding="utf-8", errors="surrogateescape", newline=newline) as text:
            yield text, name


def read_fasta(path: str | os.PathLike) -> Iterator[FastaRecord | BadRecord]:
    """Streams the records of a FASTA file, ``-`` for standard input (see ``fasta_records``,
    ``open_text``); a file without any record raises. Records sharing an id are kept, with one
    warning on standard error at the end (outputs could not tell their rows apart)."""
    with open_text(str(path), "FASTA") as (lines, source):
        count, ids = 0, collections.Counter()
        for count, record in enumerate(fasta_records(lines, source), 1):
            if isinstance(record, FastaRecord):
                ids[record.id] += 1
            yield record
        if count == 0:
            raise ValueError(f"{source}: no FASTA records (a record starts with a '>' header line)")
        _warn_duplicates(source, [i for i, n in ids.items() if n > 1])


def _warn_duplicates(source: str, duplicates: list[str]) -> None:
    if duplicates:
        shown = ", ".join(map(repr, duplicates[:10])) + (
            f" and {len(duplicates) - 10} more" if len(duplicates) > 10 else "")
        print(f"Warning: {source}: records share the id(s) {shown}; their output rows cannot be "
              "told apart (rename them to make every id unique)", file=sys.stderr)


# Residues of a multi-FASTA file held whole (align's pairs, search's query and database): past
# UniProtKB/Swiss-Prot's ~0.2 G, at ~1 GB of memory, where a gzip of a few MB could ask for more
MAX_IN_MEMORY = 1 << 30


def fasta_in_memory(path: str | os.PathLike) -> list[FastaRecord | BadRecord]:
    """``read_fasta`` as a list, for work that needs every record at once; over
    ``MAX_IN_MEMORY`` residues in all raises (an 8 MB gzip of 2,000 records of 4 M residues
    took 8 GB), naming the file."""
    items, total = [], 0
    for item in read_fasta(path):
        total += len(item.seq) if isinstance(item, FastaRecord) else 0
        if total > MAX_IN_MEMORY:
            raise ValueError(f"{path}: more than {MAX_IN_MEMORY:,} residues in all, past what pfamalign holds "
                             "in memory at once (about 1 GB): give a smaller file")
        items.append(item)
    return items


def fasta_pairs(path: str | os.PathLike, *, all_pairs: bool = False) -> FastaPairs:
    """Pair records of a multi-FASTA file: the first record against each of the others, or
    every pair (i < j) with ``all_pairs``. Bad records are passed on as ``BadRecord``, before
    the pairs, except a bad first record without ``all_pairs``, which raises (another record
    would silently take its place). Every pair needs the records in memory, so the file is
    read at the call: one with fewer than two usable records raises then, and ``len()`` is
    the number of items. ``FastaPairs.screened`` applies a model's length limit to each record
    by the same rules."""
    return _pairs_of_records(path, fasta_in_memory(path), all_pairs)


def _pairs_of_records(path, items: list, all_pairs: bool) -> FastaPairs:
    records = [item for item in items if not isinstance(item, BadRecord)]
    bad = [item for item in items if isinstance(item, BadRecord)]
    if len(records) < 2:
        skipped = "".join(f"; skipped {b}" for b in bad[:3])
        skipped += f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ValueError(f"{path}: need at least two usable FASTA records to align, found "
                         f"{len(records)}{skipped}")
    if isinstance(items[0], BadRecord) and not all_pairs:
        raise ValueError(f"{path}: the first record, which every other one is aligned against, is "
                         f"unusable: {bad[0]}; fix it (or pass --all-pairs to align every pair of the "
                         f"usable records)")
    return FastaPairs(records, bad, all_pairs, path)


@dataclasses.dataclass(frozen=True)
class FastaPairs:
    """The items of ``fasta_pairs``: its bad records, then the pair records, made as they are
    iterated; ``len()`` counts both (a batch's progress total)."""
    records: list[FastaRecord]
    bad: list[BadRecord]
    all_pairs: bool
    path: str | os.PathLike = ""

    def screened(self, sequence_problem) -> FastaPairs:
        """These pairs without the records that ``sequence_problem(seq)`` (a message, or None)
        rejects, each a BadRecord of its own, named once, not once per pair it is in (e.g. a
        model's length limit: ``Predictor.sequence_problem``); as ``fasta_pairs``, a rejected
        first record raises without ``all_pairs``."""
        items = [*self.bad]
        for rec in self.records:
            problem = sequence_problem(rec.seq)
            items.append(rec if problem is None else BadRecord(rec.where, f"record {rec.id!r}: {problem}"))
        items.sort(key=lambda item: _line_of(item.where))  # file order: the first record stays first
        return _pairs_of_records(self.path, items, self.all_pairs)

    def __len__(self) -> int:
        n = len(self.records)
        return len(self.bad) + (n * (n - 1) // 2 if self.all_pairs else n - 1)

    def __iter__(self) -> Iterator[dict | BadRecord]:
        yield from self.bad
        firsts = self.records if self.all_pairs else self.records[:1]
        for n, a in enumerate(firsts):
            for b in self.records[n + 1:]:
                yield {**bare_pair(a.id, a.seq, b.id, b.seq), "where": b.where}


def _line_of(where: str) -> int:
    """The line number of a ``file:line``."""
    return int(where.rpartition(":")[2])


def argument_path(arg: str) -> pathlib.Path | None:
    """The rule for a sequence argument: a FASTA file when it starts with ``@`` (the rest is
    the path), contains a path separator, ends in a FASTA suffix, or contains a ``.`` and
    names an existing path (residues hold neither ``/`` nor ``.``, so ``q.txt``, ``q.seq``
    are files); its path is returned. Residues otherwise (None). ``-`` (standard input) is
    decided before this rule."""
    if arg.startswith("@"):
        return pathlib.Path(arg[1:])
    path = pathlib.Path(arg)
    if "/" in arg or os.sep in arg or path.suffix.lower() in FASTA_SUFFIXES or (
            "." in arg and path.exists()):
        return path
    return None


def fasta_argument(arg: str) -> str:
    """The file a FASTA-file argument names: ``@FILE`` is FILE (the form ``argument_path``
    reads, e.g. for a file named like residues), anything else as given."""
    if arg == "@":
        raise ValueError("'@' names no file: write @FILE to read FILE as FASTA (e.g. @query.txt)")
    return arg.removeprefix("@")


ALIGN_MANY = "give one multi-FASTA file alone, or use --pairs, for many pairs"  # align's batch inputs


def read_sequence(arg: str, default_id: str, *, many: str = ALIGN_MANY) -> tuple[str, str]:
    """(id, residues) of a sequence argument: ``-`` (standard input), a FASTA file path
    (``argument_path``; plain or gzip, a pipe such as ``<(...)`` too), or the residues.

    A FASTA file must hold exactly one record (``many``: what to do instead, in the error).
    Residues are validated (letters only, not empty; one trailing stop dropped) and
    upper-cased. Residues that also name a file or directory in the working directory are
    read as residues, with a warning on standard error.
    """
    from pfamalign.residues import input_sequence

    name = fasta_argument(arg)  # '@' alone names no file: an error
    path = None if arg == STDIN else argument_path(arg)
    if arg == STDIN or path is not None:
        if path is not None and not path.exists():  # exists, not is_file: /dev/fd/N is a pipe
            raise ValueError(f"{arg}: no such FASTA file")
        records = list(read_fasta(name))  # the name as the user wrote it
        if len(records) != 1:
            raise ValueError(f"{arg}: expected exactly one FASTA record, found {len(records)} ({many})")
        if isinstance(records[0], BadRecord):
            raise records[0]
        return records[0].id, records[0].seq
    if 0 < len(arg) < 255 and pathlib.Path(arg).exists():  # long residue strings are no names
        kind = "directory" if pathlib.Path(arg).is_dir() else "file"
        print(f"Warning: {arg!r} is read as residues, though a {kind} of that name exists"
              + (f"; write ./{arg} or @{arg} to read the file" if kind == "file" else ""),
              file=sys.stderr)
    name = f"{default_id} ({arg[:20]}...)" if len(arg) > 20 else default_id
    try:
        return default_id, input_sequence(arg, name=name)
    except ValueError as err:
        if "." in arg:  # a mistyped file name, more likely than residues with a dot
            raise ValueError(f"{err}; nor is there a file named {arg}") from None
        raise


def pair_from_sequences(seq_a: str, seq_b: str, *, many: str = ALIGN_MANY) -> dict:
    """The pair record of two sequence arguments (see ``read_sequence``), no reference."""
    (id_a, sa), (id_b, sb) = read_sequence(seq_a, "seq_a", many=many), read_sequence(seq_b, "seq_b", many=many)
    return bare_pair(id_a, sa, id_b, sb)


def read_pairs_tsv(path: str | os.PathLike) -> Iterator[dict | BadRecord]:
    """Streams the pair records of a tab-separated pairs file (``-``: standard input; gzip
    or not, see ``open_text``).

    Each non-empty line that is not a ``#`` comment holds either ``SEQ_A<TAB>SEQ_B`` (ids
    ``pairN_a`` / ``pairN_b`` for line N) or ``ID_A<TAB>SEQ_A<TAB>ID_B<TAB>SEQ_B``. Each record
    also carries ``where`` (``path:line``), for error messages about that pair; a malformed
    line comes as a ``BadRecord``. A first line naming the columns (``query<TAB>target``,
    ``id_a<TAB>seq_a<TAB>id_b<TAB>seq_b``: see ``_HEADER_WORDS``) is a header, skipped; the
    lines after it are pairs whatever they hold. The file must be UTF-8 with lines of at most ``MAX_LINE``
    characters. The file is read up to its first pair at the call, so that one without pairs,
    or a FASTA or Stockholm file given by mistake, raises once before any work.
    """
    stack = contextlib.ExitStack()
    try:
        handle, source = stack.enter_context(open_text(str(path), "pairs", newline=""))
        lines = _bounded_lines(handle, source, "pairs (TSV)")
        first = _first_pair_line(lines, source)
        second = next((item for item in lines if _holds_a_pair(item[1])), None)  # what pairs look like here
    except BaseException:
        stack.close()
        raise
    _warn_if_column_names(source, first, second)
    return _pair_records(stack, itertools.chain([first], [second] if second else [], lines), source)


def count_pairs_tsv(path: str | os.PathLike) -> int | None:
    """The number of items ``read_pairs_tsv(path)`` yields (pairs and bad lines), by a first
    pass that keeps no sequence: a batch's progress total. None for standard input and for
    anything but a regular file (a pipe cannot be read twice), or a file the reader refuses."""
    if str(path) == STDIN or not os.path.isfile(path):
        return None
    try:
        with open_text(str(path), "pairs", newline="") as (handle, source):
            pair_lines = (line for _, line in _bounded_lines(handle, source, "pairs (TSV)") if _holds_a_pair(line))
            first = next(pair_lines, None)
            return sum(1 for _ in pair_lines) + (first is not None and not _is_header(first))
    except (ValueError, OSError):  # the reader reports it
        return None


def _first_pair_line(lines: Iterator[tuple[int, str]], source: str) -> tuple[int, str]:
    """The first pair line (after a header, if the first is one); a file without one, or
    one that starts as FASTA or Stockholm (one error, not one per line), raises."""
    header_seen = False
    for lineno, line in lines:
        if line.startswith(("# STOCKHOLM", ">")):
            kind, instead = (("FASTA", "give a multi-FASTA file as SEQ_A") if line.startswith(">")
                             else ("Stockholm", "convert it to FASTA (e.g. esl-reformat fasta FILE) "
                                                "and give it as SEQ_A; certify and barycenter take "
                                                "--stockholm FILE --ids ID_A ID_B"))
            raise ValueError(f"{source}:{lineno}: looks like {kind}, not a pairs file ({instead}); "
                             f"--pairs expects {PAIRS_LINES}")
        if _holds_a_pair(line):
            if not header_seen and _is_header(line):  # named columns: not a pair of words
                header_seen = True
                continue
            return lineno, line
    raise ValueError(f"no pairs in {source}; --pairs expects {PAIRS_LINES}")


# Column names a first line may carry. All but a few are made of residue letters ("query",
# "target"), so without this a header would align as a pair.
_HEADER_WORDS = frozenset(f"{stem}{tag}" for stem in ("seq", "sequence", "query", "subject",
                                                      "target", "template", "protein")
                          for tag in ("", "s", "_a", "_b", "a", "b", "1", "2", "_1", "_2"))


def _sequence_cells(line: str) -> list[str]:
    """A pairs-file line's sequence columns (none for a line of another width)."""
    cols = [c.strip() for c in line.split("\t")]
    return cols if len(cols) == 2 else cols[1::2] if len(cols) == 4 else []


def _is_header(line: str) -> bool:
    """Whether a pairs-file line names its columns (its sequence columns are column names)."""
    seqs = _sequence_cells(line)
    return bool(seqs) and all(c.lower() in _HEADER_WORDS for c in seqs)


def _names_like(line: str) -> bool:
    """Whether a pairs-file line's sequence cells look like column names: short, with lower
    case or characters neither a residue nor a gap is (an underscore, a digit, a space)."""
    seqs = _sequence_cells(line)
    return bool(seqs) and all(0 < len(c) <= 32 and re.search(r"[a-z]|[^A-Za-z*-]", c) for c in seqs)


def _warn_if_column_names(source: str, first: tuple[int, str], second: tuple[int, str] | None) -> None:
    """A warning on standard error when the first pair line looks like column names that are
    not ``_HEADER_WORDS`` ("antigen<TAB>antibody", "heavy_chain<TAB>light_chain") and the next
    does not (a file of short lower-case peptides is not warned about): it is read as a pair
    all the same (skipping a mistyped sequence would lose it silently), and the warning says
    how to skip it."""
    (lineno, line) = first
    if _names_like(line) and second is not None and not _names_like(second[1]):
        print(f"Warning: {source}:{lineno} ({', '.join(_sequence_cells(line))}) is read as a pair, though it "
              "looks like column names: start it with '#' to skip it (a first line of query, target, seq_a, "
              "seq_b, ... is skipped)", file=sys.stderr, flush=True)


def _holds_a_pair(line: str) -> bool:
    """Whether a pairs-file line is a pair (not blank, not a ``#`` comment)."""
    return bool(line.strip()) and not line.startswith("#")


def _pair_records(stack: contextlib.ExitStack, lines: Iterable[tuple[int, str]], source: str
                  ) -> Iterator[dict | BadRecord]:
    with stack:
        for lineno, line in lines:
            if not _holds_a_pair(line):
                continue
            cols = [c.strip() for c in line.split("\t")]
            if len(cols) == 2:
                cols = [f"pair{lineno}_a", cols[0], f"pair{lineno}_b", cols[1]]
            elif len(cols) != 4:
                yield BadRecord(f"{source}:{lineno}", "expected 2 (SEQ_A, SEQ_B) or 4 (ID_A, SEQ_A, "
                                f"ID_B, SEQ_B) tab-separated columns, found {len(cols)}")
                continue
            yield {**bare_pair(*cols), "where": f"{source}:{lineno}"}


def pair_from_stockholm(path: pathlib.Path, id_a: str, id_b: str) -> dict:
    """The pair record (residues, target, identity, family) of two named rows of a Stockholm
    file. A malformed file raises ``pipelines.stockholm.StockholmError`` (a ValueError)."""
    import numpy as np

    from pfamalign.pipelines.pairs import family_arrays, pair_identity, pair_target
    from pfamalign.pipelines.stockholm import read_families

    if id_a == id_b:
        raise ValueError(f"--ids names {id_a!r} twice; give two different rows of {path}")
    seen = set()
    for family in read_families([str(path)]):
        names = list(family.seq_ids)
        seen.update(names)
        if id_a in names and id_b in names:
            fa = family_arrays(family)
            qi, ki = names.index(id_a), names.index(id_b)
            pid, _ = pair_identity(fa, np.array([qi]), np.array([ki]))
            return {"q_id": id_a, "k_id": id_b, "q_seq": fa.residues[qi], "k_seq": fa.residues[ki],
                    "target": pair_target(fa, qi, ki), "pid": float(pid[0]), "family": family.key}
    absent = [name for name in (id_a, id_b) if name not in seen]
    if absent and not seen:
        raise ValueError(f"{path} holds no sequence rows (an empty family?): give a Stockholm file "
                         "with the two rows to align")
    if absent:
        raise ValueError(f"{path} has no row named {' or '.join(map(repr, absent))} (row names are "
                         f"NAME/START-END as in the file, e.g. {sorted(seen)[0]!r})")
    raise ValueError(f"{path}: no family holds both {id_a!r} and {id_b!r}")


def pair_from_dataset(data: pathlib.Path, split: str, index: int) -> dict:
    """Pair ``index`` of a dataset split (residues and target, no features)."""
    from pfamalign.pipelines import reader

    reader.PairDataset(data).require_pairs(split, data)  # an empty split is no index's fault
    return reader.PairSource(data, split, features=False)[index]


def bare_pair(id_a: str, seq_a: str, id_b: str, seq_b: str) -> dict:
    """The pair record of two named sequences, no reference alignment."""
    return {"q_id": id_a, "k_id": id_b, "q_seq": seq_a, "k_seq": seq_b, "target": None, "pid": None}
