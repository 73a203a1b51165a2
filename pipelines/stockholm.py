"""A streaming Stockholm reader: one family at a time, from files, directories or Pfam-A.seed.gz.

Two levels, so the expensive part can run in worker processes:

* :func:`iter_raw_families` streams a file line by line and yields each family's lines
  (``# STOCKHOLM 1.0`` ... ``//``) with its ``#=GF AC`` / ``#=GF ID``. Only one family is held in
  memory; a 300 MB ``Pfam-A.seed.gz`` is never loaded whole. Gzip is detected by magic bytes,
  text is decoded as latin-1 (Pfam-A.seed has non-UTF-8 bytes in its free-text fields).
* :func:`parse_family` turns those lines into a :class:`Family`: sequence names and aligned rows
  (original case and gap characters kept), plus the ``#=GC RF`` line when present.

Supported layout: ``#=GF/#=GS/#=GR/#=GC`` annotation (only AC, ID and RF are kept), blank lines,
``//`` separators, several families per file, and interleaved (wrapped) blocks where each
sequence name reappears once per block and the pieces are concatenated. A name that appears
twice *within one block* is a duplicate sequence id (an error: it cannot be told apart from a
block boundary). Gap characters are ``-``, ``.`` and ``~``; any other character that is not a
residue letter (``pfamalign.residues``) is an error.
Every error is a :class:`StockholmError` naming the file and the 1-based line.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import hashlib
import io
import zlib
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from pfamalign.limits import MAX_LINE
from pfamalign.residues import first_invalid

GAP_CHARS = "-.~"
_PFAM_ACC = re.compile(r"^(PF\d{5})(\.\d+)?$")
_VERSION = re.compile(r"\.\d+$")

# Suffixes taken from a directory without sniffing (so empty or broken ones are reported).
STOCKHOLM_SUFFIXES = (".sto", ".sth", ".stk", ".stockholm", ".seed", ".ann")


class StockholmError(ValueError):
    """Malformed Stockholm input; ``str()`` is ``"FILE:LINE: message"``."""

    def __init__(self, path: str | os.PathLike, line: int, message: str):
        self.path = str(path)
        self.line = int(line)
        self.message = message
        super().__init__(f"{self.path}:{self.line}: {message}")

    def __reduce__(self):  # picklable across worker processes
        return (StockholmError, (self.path, self.line, self.message))


@dataclasses.dataclass(frozen=True)
class RawFamily:
    """One family's lines as read from the stream (or the error that stopped reading it).

    ``input_index`` / ``index`` (the file's position in the input list, the family's ordinal
    within the file) identify the family for chunking and resume; ``start_line`` is 1-based.
    """

    source: str
    input_index: int
    index: int
    start_line: int
    lines: tuple[str, ...]
    accession: str | None = None
    name: str | None = None
    error: StockholmError | None = None

    @property
    def key(self) -> str:
        """The family key: ``#=GF AC`` (with version), else a Pfam-like file stem, else ID,
        else the file stem, the family's ordinal and a digest of its lines."""
        return family_key(self.accession, self.name, self.source, self.index, self.lines)


@dataclasses.dataclass(frozen=True)
class Family:
    """A parsed family: ``rows[i]`` is the aligned row of ``seq_ids[i]`` (case and gaps kept)."""

    key: str
    name: str
    source: str
    start_line: int
    seq_ids: tuple[str, ...]
    rows: tuple[str, ...]
    rf: str | None = None

    @property
    def accession_base(self) -> str:
        return accession_base(self.key)

    @property
    def n_columns(self) -> int:
        return len(self.rows[0]) if self.rows else 0


def accession_base(key: str) -> str:
    """``PF00041.24`` -> ``PF00041`` (the version suffix is dropped)."""
    return _VERSION.sub("", key)


def family_key(accession: str | None, name: str | None, source: str, index: int,
               lines: Sequence[str] = ()) -> str:
    if accession:
        return accession
    stem = _file_stem(source)
    if index == 0 and _PFAM_ACC.match(stem):
        return stem
    if name:
        return name
    # nothing names it: two files of one name in two folders hold different families, which
    # must not be taken for duplicates of each other (the same family twice still is one)
    digest = hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{stem}#{index}-{digest}"


def _file_stem(path: str) -> str:
    name = pathlib.Path(path).name
    for suffix in (".gz",) + STOCKHOLM_SUFFIXES + (".txt",):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


# ------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------

def open_text(path: str | os.PathLike) -> io.TextIOBase:
    """Opens a plain or gzip-compressed (detected by magic bytes) text file as latin-1."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="latin-1", newline=None)
    return open(path, encoding="latin-1", newline=None)


def _sniff_stockholm(path: pathlib.Path) -> bool:
    try:
        with open_text(path) as f:
            for _, line in _lines(f):
                if line.strip():
                    return line.startswith("# STOCKHOLM")
    except (OSError, _ReadError):
        return False
    return False


def expand_inputs(paths: Iterable[str | os.PathLike]) -> tuple[list[pathlib.Path], list[str]]:
    """Expands files and directories into the ordered list of Stockholm files to read.

    A directory contributes its regular files (not recursing), sorted by name: files with a
    Stockholm suffix (optionally ``.gz``) always, others only when their first non-empty line
    is a ``# STOCKHOLM`` header. Returns ``(files, notes)``; notes list ignored files.
    """
    files: list[pathlib.Path] = []
    notes: list[str] = []
    for p in paths:
        path = pathlib.Path(p)
        if path.is_dir():
            for child in sorted(path.iterdir()):
                if not child.is_file() or child.name.startswith("."):
                    continue
                name = child.name[:-3] if child.name.endswith(".gz") else child.name
                if name.endswith(STOCKHOLM_SUFFIXES) or _sniff_stockholm(child):
                    files.append(child)
                else:
                    notes.append(f"ignored {child} (not a Stockholm file)")
        elif path.is_file():
            files.append(path)
        elif path.exists():  # a pipe (`<(...)`), a device: read twice (hashed, then parsed)
            raise FileNotFoundError(f"input {path} is not a regular file (a pipe?): prepare reads each "
                                    "input twice; save it to a file first")
        else:
            raise FileNotFoundError(f"input {path} does not exist")
    return files, notes


# ------------------------------------------------------------------------------------------
# Level 1: split the stream into families
# ------------------------------------------------------------------------------------------

def _raw_position(f) -> int:
    buf = f.buffer
    raw = getattr(buf, "fileobj", None)  # gzip: position in the compressed file
    try:
        return (raw if raw is not None else buf).tell()
    except (OSError, ValueError):
        return 0


class _ReadError(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


UTF8_BOM = "\xef\xbb\xbf"  # the UTF-8 byte order mark (some editors write one), as latin-1


def _lines(f) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of a text stream, past a UTF-8 byte order mark; a truncated
    or corrupt gzip stream or an unreadable file ends in ``_ReadError`` instead of EOFError /
    zlib / OS errors."""
    lineno = 0
    try:
        while line := f.readline(MAX_LINE + 1):  # bounded: a gzip of one 3 GB line was read whole
            lineno += 1
            if len(line.rstrip("\r\n")) > MAX_LINE:
                raise _ReadError(lineno, f"line longer than {MAX_LINE} characters: not a Stockholm alignment")
            yield lineno, line.removeprefix(UTF8_BOM) if lineno == 1 else line
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise _ReadError(lineno + 1, f"the compressed file is truncated or corrupt after line "
                         f"{lineno} ({err}); download it again") from None
    except OSError as err:
        raise _ReadError(lineno + 1, f"cannot read the file after line {lineno}: {err}") from None


def iter_raw_families(path: str | os.PathLike, *, input_index: int = 0, skip_bad: bool = False,
                      on_bytes: Callable[[int], None] | None = None) -> Iterator[RawFamily]:
    """Streams one file's families. With ``skip_bad`` a broken stretch is yielded as a
    :class:`RawFamily` with ``error`` set and reading resumes at the next family; otherwise the
    error is raised. A file without any family is an error ("empty file"). ``on_bytes`` is
    called now and then with the number of (compressed) bytes read so far."""
    source = str(path)
    index = 0
    lines: list[str] = []
    start = 0
    acc = name = None
    in_family = False
    skipping = False  # after an error inside a family: drop lines up to the next '//'

    def fail(line_no: int, message: str) -> RawFamily:
        err = StockholmError(source, line_no, message)
        if not skip_bad:
            raise err
        return RawFamily(source, input_index, index, line_no, (), acc, name, err)

    lineno = 0
    try:
        with open_text(path) as f:
            for lineno, line in _lines(f):
                if on_bytes is not None and lineno % 4096 == 0:
                    on_bytes(_raw_position(f))
                line = line.rstrip("\r\n")
                if skipping:
                    if line.startswith("//"):
                        skipping = False
                    elif line.startswith("# STOCKHOLM"):
                        skipping = False
                        in_family, start, lines, acc, name = True, lineno, [line], None, None
                    continue
                if not in_family:
                    stripped = line.strip()
                    if not stripped:
                        continue
                    if line.startswith("# STOCKHOLM"):
                        in_family, start, lines, acc, name = True, lineno, [line], None, None
                        continue
                    acc = name = None
                    yield fail(lineno, "expected a '# STOCKHOLM 1.0' header line, found "
                               f"{_show(line)}; is this a Stockholm file?")
                    index += 1
                    skipping = True
                    continue
                if line.startswith("//"):
                    yield RawFamily(source, input_index, index, start, tuple(lines), acc, name)
                    index += 1
                    in_family, lines = False, []
                    continue
                if line.startswith("# STOCKHOLM"):
                    yield fail(lineno, f"new '# STOCKHOLM' header before the '//' that closes the "
                               f"family started at line {start}; add the missing '//'")
                    index += 1
                    in_family, start, lines, acc, name = True, lineno, [line], None, None
                    continue
                if line.startswith("#=GF"):
                    parts = line.split(None, 2)
                    if len(parts) == 3 and parts[1] == "AC":
                        acc = parts[2].strip()
                    elif len(parts) == 3 and parts[1] == "ID":
                        name = parts[2].strip()
                lines.append(line)
            if on_bytes is not None:
                on_bytes(_raw_position(f))
    except _ReadError as err:
        yield fail(err.line, str(err))  # the rest of the file cannot be read: stop here
        return
    if in_family:
        # the family is cut short: name its first line, where it started
        yield fail(lineno, f"file ended inside the family started at line {start} "
                   "(missing '//' terminator; truncated download?)")
        index += 1
    elif index == 0:
        yield fail(max(lineno, 1), "no Stockholm alignment found (empty file?)")


def iter_inputs(paths: Sequence[str | os.PathLike], *, skip_bad: bool = False,
                ) -> Iterator[RawFamily]:
    """Streams every family of every input (files and directories, in order)."""
    files, _ = expand_inputs(paths)
    for i, path in enumerate(files):
        yield from iter_raw_families(path, input_index=i, skip_bad=skip_bad)


def _as_typed(text: str) -> str:
    """The first character of latin-1-decoded ``text`` as the user typed it: a UTF-8
    character (``É`` read as ``Ã``, ``\x89``) when its bytes start one, else as read."""
    if text[:1].isascii():
        return text[:1]
    head = text[:4].encode("latin-1", "replace")
    for size in range(2, len(head) + 1):
        try:
            return head[:size].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return text[:1]


def _as_written(text: str) -> str:
    """Latin-1-decoded ``text`` as UTF-8 where its bytes are UTF-8 (a sequence name
    ``séqA``, which a user types so in ``--ids``), else as read."""
    if text.isascii():
        return text
    try:
        return text.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return text


def _show(line: str, width: int = 40) -> str:
    return repr(line if len(line) <= width else line[:width] + "...")


# ------------------------------------------------------------------------------------------
# Level 2: parse one family
# ------------------------------------------------------------------------------------------

def parse_family(raw: RawFamily) -> Family:
    """Parses one family's lines (see the module docstring for the accepted layout)."""
    if raw.error is not None:
        raise raw.error
    source = raw.source
    ids: list[str] = []
    pieces: dict[str, list[str]] = {}
    first_line: dict[str, int] = {}
    last_block: dict[str, int] = {}
    last_line: dict[str, int] = {}  # the id's line in the block it was last seen in
    rf_pieces: list[str] = []
    block = 0
    prev_blank = False
    for offset, line in enumerate(raw.lines[1:], start=1):
        lineno = raw.start_line + offset
        if not line.strip():
            prev_blank = True
            continue
        if prev_blank:
            block += 1
            prev_blank = False
        if line.startswith("#"):
            if line.startswith("#=GC"):
                parts = line.split()
                if len(parts) == 3 and parts[1] == "RF":
                    rf_pieces.append(parts[2])
            continue
        parts = line.split()
        if len(parts) != 2:
            raise StockholmError(source, lineno, "expected '<sequence name> <aligned residues>', "
                                 f"found {len(parts)} fields: {_show(line)}")
        seq_id, aligned = _as_written(parts[0]), parts[1]
        bad = first_invalid(aligned, GAP_CHARS)
        if bad is not None:
            raise StockholmError(source, lineno, f"invalid character {_as_typed(aligned[bad:])!r} at column "
                                 f"{bad + 1} of sequence {seq_id!r} (allowed: letters, "
                                 "gaps '-', '.', '~')")
        if seq_id in pieces:
            if last_block[seq_id] == block:
                raise StockholmError(source, lineno, f"duplicate sequence id {seq_id!r} (also at "
                                     f"line {last_line[seq_id]} of this block); sequence ids must be "
                                     "unique within a family")
            pieces[seq_id].append(aligned)
        else:
            ids.append(seq_id)
            pieces[seq_id] = [aligned]
            first_line[seq_id] = lineno
        last_block[seq_id], last_line[seq_id] = block, lineno
    rows = tuple("".join(pieces[i]) for i in ids)
    if rows:  # the most common width is the alignment's: the odd row is the one to blame
        width, n_width = collections.Counter(map(len, rows)).most_common(1)[0]
        ref = next(i for i, row in zip(ids, rows) if len(row) == width)
        for seq_id, row in zip(ids, rows):
            if len(row) != width:
                raise StockholmError(source, first_line[seq_id], f"sequence {seq_id!r} has "
                                     f"{len(row)} alignment columns but {ref!r} has {width} "
                                     f"({n_width} of {len(rows)} rows); every row of an "
                                     "alignment must have the same length")
    rf = "".join(rf_pieces) or None
    if rf is not None and rows and len(rf) != len(rows[0]):
        rf = None
    return Family(key=raw.key, name=raw.name or "", source=source, start_line=raw.start_line,
                  seq_ids=tuple(ids), rows=rows, rf=rf)


def check_parses(raw: RawFamily) -> RawFamily:
    """``raw``, with ``error`` set when it does not parse. With --skip-bad the engines call it
    before a family claims its key, so that a broken first copy of a family does not make a
    later valid copy a duplicate (the worker parses again: cheap next to pair sampling)."""
    if raw.error is not None:
        return raw
    try:
        parse_family(raw)
    except StockholmError as err:
        return dataclasses.replace(raw, error=err)
    return raw


def read_families(paths: Sequence[str | os.PathLike] | str | os.PathLike) -> Iterator[Family]:
    """Convenience: streams and parses every family of the given inputs (errors raise)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for raw in iter_inputs(paths):
        yield parse_family(raw)
