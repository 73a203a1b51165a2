"""Output formats of a pairwise alignment: EMBOSS-style pair text, aligned FASTA, Stockholm,
CIGAR and JSON.

Every format writes the *full* alignment: all residues of both sequences appear, unaligned ones
opposite a gap (a local alignment's flanks too), so each output describes exactly ``pairs``.
The one exception is the pair text of a *local* alignment (``AlignmentRecord.local``), which
shows its aligned region only, from the first aligned pair to the last, as EMBOSS ``water``
writes it (its block numbers are the region's residue numbers, its header counts the region's
columns). Between two aligned pairs the unaligned residues of ``seq_a`` come first, then those
of ``seq_b``.

Conventions:

* Match line (pair text): ``|`` identical residues (``residues.identical_pairs``: never
  ``X`` with ``X``), ``:`` BLOSUM62 score > 0, ``.`` other aligned pairs, space opposite a
  gap. The pair text header counts identity / similarity over its ``Length`` (all columns,
  gaps included), as EMBOSS does; the JSON ``identity`` is over *aligned pairs*
  (``identical pairs / aligned pairs``; null without pairs).
* Confidence symbols (pair text, Stockholm ``#=GC PP_cons``) follow HMMER's posterior
  probability code: ``0`` for [0, 0.05), ``1`` for [0.05, 0.15), ..., ``9`` for [0.85, 0.95),
  ``*`` for >= 0.95; ``.`` in gap columns.
* CIGAR is relative to ``seq_a`` as the *reference* (SAM's view, ``seq_b`` the read): ``M`` an
  aligned pair (identical or not), ``D`` a ``seq_a`` residue opposite a gap (deleted from
  ``seq_b``), ``I`` a ``seq_b`` residue opposite a gap (inserted in ``seq_b``). The string starts
  at residue 0 of both sequences (flanks are ``D``/``I``, never clipped), so
  ``sum(M + D) = len(seq_a)`` and ``sum(M + I) = len(seq_b)``. ``extended=True`` writes ``=``
  / ``X`` instead of ``M`` (identical / different residues).
* JSON: ``pairs`` as 0-based ``[i, j]``, per-pair ``confidence`` (null for the baselines),
  ``score``, lengths, ``identity``, ``mode`` (``local`` or ``global``: how it was decoded);
  ``from_json`` reads it back.
* Coordinates: every text output numbers residues 1-based inclusive (``Aligned_region`` in
  the pair text and Stockholm, the block ends of the pair text); only the JSON ``pairs`` are
  0-based indices (and say so in ``coordinates``).
* Provenance (pair text header, Stockholm ``#=GF CC`` lines, a JSON ``provenance`` object; the
  same ``provenance_lines`` for any other text writer such as a hit table): the program and
  version, the model (name and content hash) and the decoder with its settings, so a result
  can be traced and repeated. Writers take it as ``provenance=`` (None: nothing written).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import numpy as np

from pfamalign import jsonio
from pfamalign.alignment.pairs import PairAlignment, check_confidence, check_pairs
from pfamalign.residues import match_symbols, normalize_sequence

JSON_FORMAT = "pfamalign.pairwise/1"
_EMBOSS_RULE = "#" + "=" * 39
_EMBOSS_END = "#" + "-" * 39
_NAME_WIDTH = 13  # EMBOSS pair format: 13-character names, then a 6-wide coordinate


def id_problem(value) -> str | None:
    """Why ``value`` cannot name a sequence in the output formats (FASTA headers, Stockholm
    rows and tabular columns split on whitespace), or None."""
    if not isinstance(value, str) or not value or re.search(r"\s", value):
        return f"must be a non-empty string without whitespace, got {value!r}"
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class AlignmentRecord:
    """Two sequences, their ids and an alignment between them: what every writer takes.

    Sequences are validated and upper-cased (``residues.normalize_sequence``); ids must be
    non-empty and free of whitespace; ``pairs`` must be a proper alignment within the lengths.
    """

    seq_a: str
    seq_b: str
    pairs: np.ndarray  # [n, 2]
    _: dataclasses.KW_ONLY
    id_a: str = "seq_a"
    id_b: str = "seq_b"
    confidence: np.ndarray | None = None  # [n]
    score: float | None = None
    local: bool = False  # decoded in local mode: the pair text shows the aligned region only

    def __post_init__(self):
        object.__setattr__(self, "seq_a", normalize_sequence(self.seq_a, name="seq_a"))
        object.__setattr__(self, "seq_b", normalize_sequence(self.seq_b, name="seq_b"))
        for name in ("id_a", "id_b"):
            problem = id_problem(getattr(self, name))
            if problem is not None:
                raise ValueError(f"{name} {problem}")
        pairs = np.array(check_pairs(self.pairs, len(self.seq_a), len(self.seq_b), proper=True))
        confidence = check_confidence(self.confidence, len(pairs))
        confidence = None if confidence is None else np.array(confidence)
        for array in (pairs, confidence):  # frozen as the record is: checked once, kept so
            if array is not None:
                array.flags.writeable = False
        object.__setattr__(self, "pairs", pairs)
        object.__setattr__(self, "confidence", confidence)
        if self.score is not None:
            object.__setattr__(self, "score", float(self.score))

    @classmethod
    def from_alignment(cls, seq_a: str, seq_b: str, alignment: PairAlignment, *,
                       id_a: str = "seq_a", id_b: str = "seq_b", local: bool = False) -> "AlignmentRecord":
        """Wraps a decoder / baseline result (its lengths must match the sequences);
        ``local``: decoded in local mode."""
        if (alignment.query_length, alignment.key_length) != (len(seq_a), len(seq_b)):
            raise ValueError(
                f"alignment is {alignment.query_length} x {alignment.key_length} but the "
                f"sequences have lengths {len(seq_a)} and {len(seq_b)}")
        return cls(seq_a, seq_b, alignment.pairs, id_a=id_a, id_b=id_b,
                   confidence=alignment.confidence, score=alignment.score, local=local)

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """Per alignment column, the residue index of ``seq_a`` and of ``seq_b`` (-1 = gap):
        two ``[n_columns]`` int arrays."""
        col_a, col_b = [], []
        prev_i = prev_j = -1
        for i, j in list(map(tuple, self.pairs)) + [(len(self.seq_a), len(self.seq_b))]:
            run_a = range(prev_i + 1, i)
            run_b = range(prev_j + 1, j)
            col_a += list(run_a) + [-1] * len(run_b)
            col_b += [-1] * len(run_a) + list(run_b)
            if i < len(self.seq_a):  # a real pair, not the end sentinel
                col_a.append(i)
                col_b.append(j)
            prev_i, prev_j = i, j
        return np.asarray(col_a, dtype=np.int64), np.asarray(col_b, dtype=np.int64)

    def gapped(self) -> tuple[str, str]:
        """The two aligned rows with ``-`` for gaps."""
        col_a, col_b = self.columns()
        return _gapped_row(self.seq_a, col_a), _gapped_row(self.seq_b, col_b)

    @property
    def n_identical(self) -> int:
        return match_symbols(self.seq_a, self.seq_b, self.pairs).count("|")

    @property
    def n_similar(self) -> int:
        """Identical or BLOSUM62-positive pairs."""
        return sum(s in "|:" for s in match_symbols(self.seq_a, self.seq_b, self.pairs))

    @property
    def identity(self) -> float:
        """Identical pairs / aligned pairs (NaN without pairs)."""
        return self.n_identical / len(self.pairs) if len(self.pairs) else float("nan")

    def format(self, fmt: str = "text", *, provenance: dict | None = None) -> str:
        """This alignment as ``pfamalign align -f FMT`` writes one pair (``ONE_PAIR``: text,
        emboss, fasta, stockholm, cigar, json); ``provenance`` in the formats that carry it."""
        if fmt not in ONE_PAIR:
            raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(ONE_PAIR)}")
        return format_alignment(self, ONE_PAIR[fmt], provenance=provenance)


def aligned_region(rec: AlignmentRecord) -> str:
    """The residues spanned by the aligned pairs, 1-based inclusive: ``A 3-120, B 1-118``
    (``none`` without pairs)."""
    if not len(rec.pairs):
        return "none"
    (i0, j0), (i1, j1) = rec.pairs[0] + 1, rec.pairs[-1] + 1
    return f"{rec.id_a} {i0}-{i1}, {rec.id_b} {j0}-{j1} (1-based inclusive)"


def provenance_lines(provenance: dict | None) -> list[str]:
    """``Key: value`` lines of a provenance record (``Predictor.provenance``): what every
    text writer prints, each behind its own comment marker. Nested settings are flattened
    to ``name=value`` words."""
    if not provenance:
        return []
    out = []
    for key, value in provenance.items():
        if isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items())
        out.append(f"{key.capitalize()}: {value}")
    return out


def _gapped_row(seq: str, cols: np.ndarray) -> str:
    chars = np.frombuffer(seq.encode("ascii"), dtype="S1")
    row = np.where(cols >= 0, chars[np.maximum(cols, 0)], b"-")
    return row.tobytes().decode("ascii")


def confidence_symbols(confidence) -> str:
    """HMMER posterior-probability code of each value: ``0``-``9`` or ``*`` (>= 0.95)."""
    conf = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
    digits = np.floor(conf * 10 + 0.5).astype(np.int64)  # 0 on [0, .05), k on [k-.05, k+.05)
    return "".join("*" if c >= 0.95 else str(min(d, 9)) for c, d in zip(conf, digits))


def _column_text(rec: AlignmentRecord, per_pair: list[str], gap: str) -> str:
    """One character per column: ``per_pair[k]`` in the k-th pair column, ``gap`` elsewhere."""
    col_a, col_b = rec.columns()
    out = np.full(len(col_a), gap, dtype="<U1")
    out[(col_a >= 0) & (col_b >= 0)] = per_pair
    return "".join(out.tolist())


def _pct(num: int, den: int) -> str:
    """EMBOSS's ``n/N (p%)``, laid out as ``needle`` writes it (the count right-aligned in five
    places, the percentage in four); ``den`` is a column count (0 for a local alignment of
    nothing, as water writes one: 0.0%)."""
    return f"{num:>5}/{den} ({100.0 * num / den if den else 0.0:4.1f}%)"


def pair_file_header(*, program: str = "pfamalign", provenance: dict | None = None) -> str:
    """What opens an EMBOSS pair file, once however many alignments follow: the program, the
    format and what produced the alignments (``provenance_lines``), where EMBOSS puts its
    run date and command line."""
    lines = ["#" * 40, f"# Program: {program}", *(f"# {line}" for line in provenance_lines(provenance)),
             "# Align_format: srspair", "#" * 40, ""]
    return "\n".join(lines) + "\n"


def to_pair_text(rec: AlignmentRecord, *, width: int = 50, program: str = "pfamalign",
                 provenance: dict | None = None, file_header: bool = True, plain: bool = False) -> str:
    """EMBOSS ``needle``'s default pair text, ``srspair`` (readable by the legacy
    ``Bio.AlignIO.read(..., "emboss")``; ``plain=True`` leaves out what EMBOSS does not write,
    the ``Aligned_pairs``, ``Mean_confidence`` and ``Aligned_region`` keys and the confidence
    line, for the stricter ``Bio.Align`` reader). A block where a sequence has no residue numbers it
    ``n ---- n`` (the last residue written), as ``srspair`` does. ``file_header=False``: the
    alignment alone, for the second and later alignments of a file (``pair_file_header``
    opens it once, as EMBOSS writes many pairs).

    Blocks of ``width`` columns (50, as ``needle`` writes them; Biopython's reader takes a
    match line's 50 columns): ``seq_a`` line with 1-based start / end residue numbers, the
    match line, the ``seq_b`` line, and (when the record has confidences) a ``confidence`` line
    of posterior-probability symbols. Names longer than 13 characters are truncated in the
    blocks (as EMBOSS does); the header keeps them whole. A local record (``rec.local``)
    shows the columns from its first aligned pair to its last, as ``water`` writes a local
    alignment (none without pairs): ``Length``, identity, similarity and gaps count those columns.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    row_a, row_b = rec.gapped()
    n_pairs = len(rec.pairs)
    markup = _column_text(rec, match_symbols(rec.seq_a, rec.seq_b, rec.pairs), " ")
    conf = None if rec.confidence is None or plain else _column_text(
        rec, list(confidence_symbols(rec.confidence)), ".")
    done_a = done_b = 0  # residues written so far
    if rec.local:  # water's view: the flanks are not part of a local alignment (none: no columns)
        col_a, col_b = rec.columns()
        paired = np.flatnonzero((col_a >= 0) & (col_b >= 0))
        region = slice(int(paired[0]), int(paired[-1]) + 1) if n_pairs else slice(0, 0)
        row_a, row_b, markup = row_a[region], row_b[region], markup[region]
        conf = None if conf is None else conf[region]
        done_a, done_b = (int(x) for x in rec.pairs[0]) if n_pairs else (0, 0)
    n_cols = len(row_a)
    n_gaps = row_a.count("-") + row_b.count("-")
    header = [
        _EMBOSS_RULE, "#", "# Aligned_sequences: 2", f"# 1: {rec.id_a}", f"# 2: {rec.id_b}",
        "# Matrix: BLOSUM62 (match line)", "#", f"# Length: {n_cols}",
        *([] if plain else [f"# Aligned_pairs: {n_pairs}"]),
        f"# Identity:   {_pct(rec.n_identical, n_cols)}",
        f"# Similarity: {_pct(rec.n_similar, n_cols)}",
        f"# Gaps:       {_pct(n_gaps, n_cols)}",
    ]
    if rec.score is not None:
        header.append(f"# Score: {rec.score:.4f}")
    if rec.confidence is not None and n_pairs and not plain:
        header.append(f"# Mean_confidence: {rec.confidence.mean():.4f}")
    if not plain:
        header.append(f"# Aligned_region: {aligned_region(rec)}")
    header += ["#", _EMBOSS_RULE, ""]

    lines = []
    for start in range(0, n_cols, width):
        chunk_a, chunk_b = row_a[start:start + width], row_b[start:start + width]
        block = []
        for name, chunk, done in ((rec.id_a, chunk_a, done_a), (rec.id_b, chunk_b, done_b)):
            n_res = len(chunk) - chunk.count("-")
            first = done + 1 if n_res else done
            block.append(f"{name[:_NAME_WIDTH]:<{_NAME_WIDTH}} {first:>6} {chunk} "
                         f"{done + n_res:>6}")
        done_a += len(chunk_a) - chunk_a.count("-")
        done_b += len(chunk_b) - chunk_b.count("-")
        block.insert(1, " " * 21 + markup[start:start + width])  # spaces kept, as needle keeps them
        if conf is not None:
            block.append(f"{'confidence':<21}{conf[start:start + width]}")
        lines += block + [""]
    text = "\n".join(header + lines + ["", _EMBOSS_END, _EMBOSS_END, ""])  # needle's blank line
    return pair_file_header(program=program, provenance=provenance) + text if file_header else text


def to_fasta(rec: AlignmentRecord, *, width: int | None = 60) -> str:
    """Aligned FASTA (``-`` for gaps), rows wrapped at ``width`` (None: one line each)."""
    out = []
    for name, row in zip((rec.id_a, rec.id_b), rec.gapped()):
        out.append(f">{name}")
        step = width or len(row)
        out += [row[k:k + step] for k in range(0, len(row), step)]
    return "\n".join(out) + "\n"


def stockholm_names(id_a: str, id_b: str) -> tuple[str, str]:
    """Row names a Stockholm file can hold: a name starting with ``#`` (a markup line) or
    ``//`` (the end of the alignment) gets a leading ``_``, and two equal names (a sequence
    aligned with itself) become ``NAME_a`` and ``NAME_b``."""
    legal = lambda name: "_" + name if name.startswith(("#", "//")) else name
    name_a, name_b = legal(id_a), legal(id_b)
    return (f"{name_a}_a", f"{name_b}_b") if name_a == name_b else (name_a, name_b)


def to_stockholm(rec: AlignmentRecord, *, provenance: dict | None = None) -> str:
    """Stockholm 1.0, one block named ``#=GF ID NAME_A_vs_NAME_B``; per-column confidences as
    ``#=GC PP_cons`` (HMMER code, ``.`` in gap columns); the score, aligned region and
    provenance as ``#=GF CC`` comments.
    Names the grammar cannot hold are renamed, with a ``#=GF CC`` line saying so
    (``stockholm_names``)."""
    name_a, name_b = stockholm_names(rec.id_a, rec.id_b)
    row_a, row_b = rec.gapped()
    tags = [name_a, name_b] + (["#=GC PP_cons"] if rec.confidence is not None else [])
    pad = max(len(t) for t in tags) + 1
    # an ID names each alignment of a file (HMMER refuses a many-alignment file without one)
    out = ["# STOCKHOLM 1.0", f"#=GF ID {name_a}_vs_{name_b}", "#=GF AU pfamalign"]
    if rec.score is not None:
        out.append(f"#=GF CC score {rec.score:.6g}")
    out.append(f"#=GF CC Aligned_region: {aligned_region(rec)}")
    out += [f"#=GF CC {line}" for line in provenance_lines(provenance)]
    out += [f"#=GF CC renamed {side} {given!r} to {name!r} (Stockholm needs distinct names that "
            "start with neither '#' nor '//')"
            for side, given, name in (("seq_a", rec.id_a, name_a), ("seq_b", rec.id_b, name_b))
            if name != given]
    out += [f"{name_a:<{pad}}{row_a}", f"{name_b:<{pad}}{row_b}"]
    if rec.confidence is not None:
        conf = _column_text(rec, list(confidence_symbols(rec.confidence)), ".")
        out.append(f"{'#=GC PP_cons':<{pad}}{conf}")
    return "\n".join(out + ["//", ""])


def pairs_to_cigar(pairs, length_a: int, length_b: int, *,
                   column_ops: list[str] | None = None) -> str:
    """CIGAR of an alignment (conventions in the module docstring).

    ``column_ops`` optionally overrides the op of each *pair* (``=`` / ``X``), in pair order.
    """
    rec_pairs = check_pairs(pairs, length_a, length_b, proper=True)
    ops = []  # (op, count) runs
    prev_i = prev_j = -1

    def push(op, n):
        if n <= 0:
            return
        if ops and ops[-1][0] == op:
            ops[-1][1] += n
        else:
            ops.append([op, n])

    for k, (i, j) in enumerate(list(map(tuple, rec_pairs)) + [(length_a, length_b)]):
        push("D", i - prev_i - 1)
        push("I", j - prev_j - 1)
        if k < len(rec_pairs):
            push(column_ops[k] if column_ops is not None else "M", 1)
        prev_i, prev_j = i, j
    return "".join(f"{n}{op}" for op, n in ops)


def to_cigar(rec: AlignmentRecord, *, extended: bool = False) -> str:
    """CIGAR of the record, ``seq_a`` as the reference; ``extended`` uses ``=`` / ``X``."""
    ops = None
    if extended:
        ops = ["=" if s == "|" else "X" for s in match_symbols(rec.seq_a, rec.seq_b, rec.pairs)]
    return pairs_to_cigar(rec.pairs, len(rec.seq_a), len(rec.seq_b), column_ops=ops)


def cigar_to_pairs(cigar: str) -> tuple[np.ndarray, int, int]:
    """Decodes a CIGAR (ops ``M = X D I``) into ``(pairs [n, 2], length_a, length_b)``."""
    if not re.fullmatch(r"(\d+[MX=DI])*", cigar):
        raise ValueError(f"not a CIGAR of M/=/X/D/I operations: {cigar!r}")
    i = j = 0
    pairs = []
    for count, op in re.findall(r"(\d+)([MX=DI])", cigar):
        n = int(count)
        if n == 0:
            raise ValueError(f"CIGAR operation with length 0 in {cigar!r}")
        if op in "MX=":
            pairs += [(i + k, j + k) for k in range(n)]
            i += n
            j += n
        elif op == "D":
            i += n
        else:
            j += n
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return arr, i, j


def to_json(rec: AlignmentRecord, *, indent: int | None = None, provenance: dict | None = None,
            extra: dict | None = None) -> str:
    """JSON document (format ``pfamalign.pairwise/1``); ``provenance`` as an object; ``extra``:
    more fields (e.g. ``align --score-noise``'s ``stable``), added before the provenance."""
    doc = {
        "format": JSON_FORMAT,
        "id_a": rec.id_a, "id_b": rec.id_b,
        "seq_a": rec.seq_a, "seq_b": rec.seq_b,
        "length_a": len(rec.seq_a), "length_b": len(rec.seq_b),
        "n_aligned": len(rec.pairs),
        "pairs": rec.pairs,
        "confidence": rec.confidence,
        "score": rec.score,
        "identity": rec.identity,
        "mode": "local" if rec.local else "global",
        "cigar": to_cigar(rec),
        "coordinates": "pairs: 0-based [i, j] residue indices",
    }
    doc.update(extra or {})
    if provenance:
        doc["provenance"] = provenance
    return jsonio.dumps(doc, indent=indent)


def from_json(text: str) -> AlignmentRecord:
    """Reads ``to_json`` output back (validating it like any record)."""
    doc = json.loads(text)
    if doc.get("format") != JSON_FORMAT:
        raise ValueError(f"not a {JSON_FORMAT} document: format={doc.get('format')!r}")
    rec = AlignmentRecord(doc["seq_a"], doc["seq_b"], np.asarray(doc["pairs"]).reshape(-1, 2),
                          id_a=doc["id_a"], id_b=doc["id_b"], confidence=doc["confidence"],
                          score=doc["score"], local=doc.get("mode") == "local")
    if (len(rec.seq_a), len(rec.seq_b)) != (doc["length_a"], doc["length_b"]):
        raise ValueError("length_a / length_b disagree with the sequences")
    return rec


FORMATS = {"pair": to_pair_text, "fasta": to_fasta, "stockholm": to_stockholm,
           # many pairs: the file header (``pair_file_header``, provenance included) is written once
           "pair_block": lambda rec: to_pair_text(rec, file_header=False) + "\n",
           "emboss": functools.partial(to_pair_text, plain=True),
           "emboss_block": lambda rec: to_pair_text(rec, file_header=False, plain=True) + "\n",
           "cigar": lambda rec: to_cigar(rec) + "\n",
           "cigar_tsv": lambda rec: f"{rec.id_a}\t{rec.id_b}\t{to_cigar(rec)}\n",  # many pairs
           "json": lambda rec, **kw: to_json(rec, **kw) + "\n"}
WITH_PROVENANCE = ("pair", "emboss", "stockholm", "json")  # fasta and cigar have no place for it
# The format names users give (``pfamalign align -f``, ``AlignmentRecord.format``) -> the
# ``FORMATS`` writer of one pair, and of each pair of many (a CIGAR then needs its pair's ids;
# the pair text's file header is written once)
ONE_PAIR = {"text": "pair", "emboss": "emboss", "fasta": "fasta", "stockholm": "stockholm",
            "cigar": "cigar", "json": "json"}
MANY_PAIRS = {**ONE_PAIR, "text": "pair_block", "emboss": "emboss_block", "cigar": "cigar_tsv"}
# The formats a batch job's skipped record can be written into (a '#' line, a JSON object);
# a FASTA or Stockholm file with such a line would no longer parse (stderr has them anyway)
SKIPPED_IN_OUTPUT = ("pair", "pair_block", "cigar_tsv", "json")


def format_alignment(rec: AlignmentRecord, fmt: str, *, provenance: dict | None = None,
                     extra: dict | None = None) -> str:
    """Renders ``rec`` in one of ``FORMATS`` (``pair``; ``emboss``: the pair text without
    pfamalign's keys and confidence line; ``*_block``: without the file header; ``fasta``,
    ``stockholm``, ``cigar``, ``cigar_tsv``: ``id_a<TAB>id_b<TAB>cigar``, ``json``) with
    default options, ending with a newline; ``provenance`` in the formats that carry it
    (``WITH_PROVENANCE``); ``extra`` fields only in ``json``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {sorted(FORMATS)}")
    if extra and fmt != "json":
        raise ValueError(f"the {fmt} format has no place for extra fields ({', '.join(extra)})")
    kw = {"extra": extra} if extra else {}
    if fmt in WITH_PROVENANCE and provenance:
        kw["provenance"] = provenance
    return FORMATS[fmt](rec, **kw)
