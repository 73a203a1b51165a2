"""Output formats: Biopython reads FASTA, Stockholm and the EMBOSS-style pair text back to the
same pairs; CIGAR decodes back; JSON loads back; hand-checked match line and CIGAR."""

import dataclasses
import io
import json
import shutil

import numpy as np
import pytest
from Bio import Align, AlignIO

from pfamalign.alignment.baselines import needleman_wunsch
from pfamalign.alignment.decode import mea_decode
from pfamalign.alignment.formats import (
    AlignmentRecord, cigar_to_pairs, format_alignment, from_json, pairs_to_cigar, to_cigar,
    pair_file_header, to_fasta, to_json, to_pair_text, to_stockholm)
from pfamalign.residues import match_symbols

AA = "ACDEFGHIKLMNPQRSTVWY"


def _pairs_from_rows(row_a, row_b):
    """Pairs of two gapped rows, by walking the columns."""
    i = j = 0
    pairs = []
    for x, y in zip(row_a, row_b):
        if x != "-" and y != "-":
            pairs.append([i, j])
        i += x != "-"
        j += y != "-"
    return pairs


def _random_record(seed, *, with_confidence=True):
    rng = np.random.default_rng(seed)
    la, lb = rng.integers(1, 150, size=2)
    seq_a = "".join(rng.choice(list(AA), la))
    seq_b = "".join(rng.choice(list(AA), lb))
    plan = rng.random((la, lb)) ** 30 * (rng.random((la, lb)) < 0.3)
    aln = mea_decode(plan)
    rec = AlignmentRecord.from_alignment(seq_a, seq_b, aln, id_a=f"query_{seed}/1-{la}",
                                         id_b=f"key{seed}")
    if not with_confidence:
        rec = AlignmentRecord(seq_a, seq_b, rec.pairs, id_a=rec.id_a, id_b=rec.id_b)
    return rec


SEEDS = list(range(8))


@pytest.mark.parametrize("seed", SEEDS)
def test_fasta_roundtrip(seed):
    rec = _random_record(seed)
    text = to_fasta(rec)
    assert max(len(line) for line in text.splitlines()) <= 60
    aln = Align.read(io.StringIO(text), "fasta")
    idx = np.asarray(aln.indices)
    got = idx[:, (idx[0] >= 0) & (idx[1] >= 0)].T
    np.testing.assert_array_equal(got.reshape(-1, 2), rec.pairs)
    legacy = AlignIO.read(io.StringIO(text), "fasta")
    assert [r.id for r in legacy] == [rec.id_a, rec.id_b]
    assert str(legacy[0].seq).replace("-", "") == rec.seq_a
    assert str(legacy[1].seq).replace("-", "") == rec.seq_b


def _pp_code(c):
    """HMMER PP code restated: 0 below .05, k in [k - .05, k + .05), * from .95."""
    if c >= 0.95:
        return "*"
    return str(int(np.searchsorted(np.arange(0.05, 0.95, 0.1), c, side="right")))


@pytest.mark.parametrize("seed", SEEDS)
def test_stockholm_roundtrip(seed):
    rec = _random_record(seed)
    text = to_stockholm(rec)
    aln = Align.read(io.StringIO(text), "stockholm")
    idx = np.asarray(aln.indices)
    np.testing.assert_array_equal(idx[:, (idx[0] >= 0) & (idx[1] >= 0)].T.reshape(-1, 2),
                                  rec.pairs)
    legacy = AlignIO.read(io.StringIO(text), "stockholm")
    rows = [str(r.seq) for r in legacy]
    assert _pairs_from_rows(*rows) == rec.pairs.tolist()
    pp = legacy.column_annotations["posterior_probability"]
    assert len(pp) == len(rows[0])
    paired = [k for k, (x, y) in enumerate(zip(*rows)) if x != "-" and y != "-"]
    assert [pp[k] for k in paired] == [_pp_code(c) for c in rec.confidence]
    assert set(pp[k] for k in range(len(pp)) if k not in set(paired)) <= {"."}


def test_emboss_format_is_read_by_biopythons_strict_emboss_reader():
    """-f emboss: EMBOSS's keys and rows only, so Bio.Align's reader (which refuses any other
    header key or row) reads one pair and a many-pair file, pairs and statistics intact; the
    text format's extras are exactly what it leaves out."""
    recs = [_random_record(seed, with_confidence=True) for seed in SEEDS[:3]]
    prov = {"version": "pfamalign 9.9", "model": "m", "decoder": {"name": "posterior"}}
    many = pair_file_header(provenance=prov) + "".join(format_alignment(r, "emboss_block") for r in recs)
    for text, expected in ((format_alignment(recs[0], "emboss", provenance=prov), recs[:1]), (many, recs)):
        alns = list(Align.parse(io.StringIO(text), "emboss"))
        assert len(alns) == len(expected)
        for aln, rec in zip(alns, expected):
            idx = np.asarray(aln.indices)
            np.testing.assert_array_equal(idx[:, (idx[0] >= 0) & (idx[1] >= 0)].T.reshape(-1, 2), rec.pairs)
            assert aln.annotations["Identity"] == rec.n_identical and aln.annotations["Similarity"] == rec.n_similar
    rich = to_pair_text(recs[0]).splitlines()
    plain = to_pair_text(recs[0], plain=True).splitlines()
    assert [x for x in rich if x not in plain] == [x for x in rich if x.startswith(
        ("# Aligned_pairs:", "# Mean_confidence:", "# Aligned_region:", "confidence "))]


def _many_pair_stockholm() -> str:
    recs = [_random_record(seed) for seed in SEEDS[:3]]
    recs = [dataclasses.replace(r, id_a=f"q{n}", id_b=f"s{n}") for n, r in enumerate(recs)]
    return "".join(to_stockholm(r) for r in recs)


def test_every_stockholm_alignment_is_named_and_biopython_reads_a_many_pair_file():
    """Each block carries #=GF ID NAME_A_vs_NAME_B (HMMER refuses a file of several alignments
    without one); Biopython reads every block."""
    text = _many_pair_stockholm()
    assert [line for line in text.splitlines() if line.startswith("#=GF ID")] == [
        f"#=GF ID q{n}_vs_s{n}" for n in range(3)]
    assert len(list(AlignIO.parse(io.StringIO(text), "stockholm"))) == 3


@pytest.mark.skipif(shutil.which("hmmbuild") is None, reason="HMMER's hmmbuild is not installed (apt install hmmer)")
def test_hmmer_reads_a_many_pair_stockholm_file(tmp_path):
    """hmmbuild builds one model per pair of a many-pair file, named by its ID."""
    import subprocess

    (tmp_path / "pairs.sto").write_text(_many_pair_stockholm())
    out = subprocess.run(["hmmbuild", "--amino", str(tmp_path / "p.hmm"), str(tmp_path / "pairs.sto")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    names = [line.split()[1] for line in (tmp_path / "p.hmm").read_text().splitlines() if line.startswith("NAME")]
    assert names == [f"q{n}_vs_s{n}" for n in range(3)]


@pytest.mark.parametrize("seed", SEEDS)
def test_pair_text_roundtrip(seed):
    rec = _random_record(seed, with_confidence=seed % 2 == 0)
    text = to_pair_text(rec)
    aln = AlignIO.read(io.StringIO(text), "emboss")  # checks every start / end coordinate
    rows = [str(r.seq) for r in aln]
    assert _pairs_from_rows(*rows) == rec.pairs.tolist()
    assert rows[0].replace("-", "") == rec.seq_a and rows[1].replace("-", "") == rec.seq_b
    assert aln.annotations["identity"] == rec.n_identical
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert len(line) <= 21 + 50 + 7
    # blocks of 50 columns, as needle writes them (Biopython's readers take 50 match-line columns)
    chunks = [line[21:].split()[0] for line in text.splitlines()
              if line.startswith(rec.id_a[:13] + " ")]
    assert chunks and all(len(c) == 50 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 50


def test_many_pairs_share_one_emboss_file_header_with_the_provenance():
    """As EMBOSS writes many pairs: one file header (program, what produced the file), then one
    alignment section per pair; Biopython's emboss reader reads every pair back, and a single
    pair's text is that header and its section."""
    recs = [_random_record(seed, with_confidence=True) for seed in SEEDS[:3]]
    prov = {"version": "pfamalign 9.9", "model": "m sha256:00", "decoder": {"name": "posterior"}}
    text = pair_file_header(provenance=prov) + "".join(format_alignment(r, "pair_block") for r in recs)
    assert text.count("# Program: pfamalign") == 1 and text.count("# Model: m sha256:00") == 1
    assert text.index("# Model:") < text.index("# Align_format: srspair") < text.index("# Aligned_sequences")
    alns = list(AlignIO.parse(io.StringIO(text), "emboss"))
    assert [[str(r.seq).replace("-", "") for r in a] for a in alns] == [[r.seq_a, r.seq_b] for r in recs]
    single = to_pair_text(recs[0], provenance=prov)
    assert single == pair_file_header(provenance=prov) + format_alignment(recs[0], "pair_block")[:-1]


def test_pair_text_match_line_by_hand():
    # M=M |, K=K |, V-I BLOSUM62 +3 :, W-C -2 ., then seq_a's A and seq_b's G unaligned
    rec = AlignmentRecord("MKVWA", "MKICG", [[0, 0], [1, 1], [2, 2], [3, 3]], id_a="a",
                          id_b="b", confidence=[1.0, 0.97, 0.5, 0.04], score=2.51)
    text = to_pair_text(rec)
    lines = text.splitlines()
    k = next(n for n, line in enumerate(lines) if line.startswith("a   "))
    assert lines[k] == "a                  1 MKVWA-      5"
    assert lines[k + 1] == " " * 21 + "||:.  "
    assert lines[k + 2] == "b                  1 MKIC-G      5"
    assert lines[k + 3] == "confidence           **50.."
    # EMBOSS's denominators: the 6 columns (gaps included), not the 4 aligned pairs
    assert "# Identity:       2/6 (33.3%)" in text and "# Similarity:     3/6 (50.0%)" in text
    assert "# Gaps:           2/6 (33.3%)" in text and "# Aligned_pairs: 4" in text
    assert "# Align_format: srspair" in text and "# Score: 2.5100" in text
    assert rec.identity == 0.5  # the JSON's identity: over aligned pairs
    assert to_cigar(rec) == "4M1D1I"
    assert to_cigar(rec, extended=True) == "2=2X1D1I"


def test_pair_text_numbers_an_all_gap_block_as_emboss_does():
    """A block where a sequence has no residue gives that sequence's line ``n ---- n`` (n its
    residues before the block; EMBOSS's srspair), not a start past its end; a later block
    starts at n + 1."""
    rec = AlignmentRecord("MKV", "WWWWWWMKV", [[0, 6], [1, 7], [2, 8]], id_a="a", id_b="b")
    blocks = [line for line in to_pair_text(rec, width=5, plain=True).splitlines() if line[:2] in ("a ", "b ")]
    assert blocks == ["a                  0 -----      0", "b                  1 WWWWW      5",
                      "a                  1 -MKV      3", "b                  6 WMKV      9"]


def test_aligned_region_is_one_based_and_inclusive():
    """The first and last aligned pairs' residues, counted from 1, both ends included."""
    from pfamalign.alignment.formats import aligned_region

    rec = AlignmentRecord("MKVLA", "WWMKVL", [[1, 3], [2, 4], [3, 5]], id_a="a", id_b="b")
    assert aligned_region(rec) == "a 2-4, b 4-6 (1-based inclusive)"
    assert aligned_region(AlignmentRecord("MK", "MK", np.zeros((0, 2), int), id_a="a", id_b="b")) == "none"


def test_unknown_residues_are_never_identical():
    """X against X is no identity (BLOSUM62 scores it -1): match line, identity, hit table."""
    from pfamalign.search import hit_columns

    rec = AlignmentRecord("MXK", "MXK", [[0, 0], [1, 1], [2, 2]], id_a="a", id_b="b")
    assert match_symbols(rec.seq_a, rec.seq_b, rec.pairs) == ["|", ".", "|"]
    assert rec.n_identical == 2 and "# Identity:       2/3 (66.7%)" in to_pair_text(rec)
    cols = hit_columns(rec)
    assert cols["mismatch"] == 1 and cols["pident"] == pytest.approx(200 / 3)


def test_nothing_aligned_prints_no_nan():
    rec = AlignmentRecord("MKV", "WW", np.zeros((0, 2)), id_a="a", id_b="b")
    text = to_pair_text(rec)
    assert "nan" not in text and "# Identity:       0/5 ( 0.0%)" in text


@pytest.mark.parametrize("ids, names", [
    (("x", "x"), ["x_a", "x_b"]),
    (("#=GC", "//"), ["_#=GC", "_//"]),
    (("a", "b"), ["a", "b"]),
])
def test_stockholm_rows_get_names_the_grammar_can_hold(ids, names):
    from Bio import AlignIO

    rec = AlignmentRecord("MKVLA", "MKVA", [[0, 0], [1, 1], [2, 2], [4, 3]], id_a=ids[0], id_b=ids[1])
    text = to_stockholm(rec)
    assert [r.id for r in AlignIO.read(io.StringIO(text), "stockholm")] == names
    assert text.count("#=GF CC renamed") == sum(n != i for n, i in zip(names, ids))


def test_cigar_by_hand_and_roundtrip():
    # pairs (0,0),(1,1),(3,2) of lengths 5, 4: MM, a[2] unaligned, M, a[4] and b[3] unaligned
    assert pairs_to_cigar([[0, 0], [1, 1], [3, 2]], 5, 4) == "2M1D1M1D1I"
    assert pairs_to_cigar(np.zeros((0, 2)), 2, 3) == "2D3I"
    pairs, la, lb = cigar_to_pairs("2M1D1M1D1I")
    assert pairs.tolist() == [[0, 0], [1, 1], [3, 2]] and (la, lb) == (5, 4)
    assert cigar_to_pairs("2=1X")[0].tolist() == [[0, 0], [1, 1], [2, 2]]
    for seed in SEEDS:
        rec = _random_record(seed)
        pairs, la, lb = cigar_to_pairs(to_cigar(rec))
        np.testing.assert_array_equal(pairs, rec.pairs)
        assert (la, lb) == (len(rec.seq_a), len(rec.seq_b))
    with pytest.raises(ValueError, match="CIGAR"):
        cigar_to_pairs("3M2S")
    with pytest.raises(ValueError, match="length 0"):
        cigar_to_pairs("0M")


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_json_roundtrip(seed):
    rec = _random_record(seed, with_confidence=seed % 2 == 0)
    doc = json.loads(to_json(rec))
    assert doc["pairs"] == rec.pairs.tolist()
    assert doc["length_a"] == len(rec.seq_a) and doc["n_aligned"] == len(rec.pairs)
    back = from_json(to_json(rec))
    np.testing.assert_array_equal(back.pairs.reshape(-1, 2), rec.pairs)
    assert (back.seq_a, back.seq_b, back.id_a, back.id_b) == (rec.seq_a, rec.seq_b, rec.id_a,
                                                              rec.id_b)
    if rec.confidence is None:
        assert back.confidence is None and doc["confidence"] is None
    else:
        np.testing.assert_array_equal(back.confidence, rec.confidence)
    assert back.score == pytest.approx(rec.score)


def test_json_identity_and_baseline_record():
    aln = needleman_wunsch("MKVLLA", "MKALLA")
    rec = AlignmentRecord.from_alignment("MKVLLA", "MKALLA", aln)
    doc = json.loads(to_json(rec))
    assert doc["identity"] == pytest.approx(5 / 6) and doc["confidence"] is None
    assert doc["score"] == pytest.approx(aln.score)
    empty = json.loads(to_json(AlignmentRecord("MK", "WW", np.zeros((0, 2), int))))
    assert empty["identity"] is None and empty["pairs"] == [] and empty["cigar"] == "2D2I"


def test_format_dispatch_and_validation():
    rec = AlignmentRecord("mkv", "MKV", [[0, 0], [1, 1], [2, 2]])
    assert rec.seq_a == "MKV"
    for fmt in ("pair", "fasta", "stockholm", "cigar", "json"):
        assert format_alignment(rec, fmt).endswith("\n")
    with pytest.raises(ValueError, match="unknown format"):
        format_alignment(rec, "clustal")
    with pytest.raises(ValueError, match="non-protein"):
        AlignmentRecord("MK-V", "MKV", [[0, 0]])
    with pytest.raises(ValueError, match="proper"):
        AlignmentRecord("MKV", "MKV", [[1, 1], [0, 2]])
    with pytest.raises(ValueError, match="out of range"):
        AlignmentRecord("MKV", "MK", [[0, 2]])
    with pytest.raises(ValueError, match="whitespace"):
        AlignmentRecord("MKV", "MKV", [[0, 0]], id_a="my seq")
    with pytest.raises(ValueError, match="confidence"):
        AlignmentRecord("MKV", "MKV", [[0, 0]], confidence=[0.1, 0.2])
    with pytest.raises(ValueError, match="lengths"):
        AlignmentRecord.from_alignment("MKV", "MK", needleman_wunsch("MKV", "MKV"))


@pytest.mark.skipif(not __import__("shutil").which("needle"), reason="EMBOSS needle is not installed")
@pytest.mark.parametrize("seq_a, seq_b", [
    ("MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE", "MKVLSAGIVGLAQSPDRWKNLSTGYFAE"),
    ("MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAEGGGGGGGWWPLKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE",
     "MKVLSAGIVGLAQSPDRWKNLSTGYFAEPLKVLAGIVGLLAQSPDRWKNLTGYFHAEK"),
])
def test_emboss_output_is_what_needle_writes_for_the_same_alignment(tmp_path, seq_a, seq_b):
    """-f emboss against EMBOSS itself: needle's alignment, written by to_pair_text(plain=True),
    gives needle's Length / Identity / Similarity / Gaps lines and its blocks byte for byte
    (count and percentage padding, match lines with their trailing spaces)."""
    import subprocess

    for name, seq in (("a", seq_a), ("b", seq_b)):
        (tmp_path / f"{name}.fa").write_text(f">{name}\n{seq}\n")
    needle = subprocess.run(["needle", "-asequence", tmp_path / "a.fa", "-bsequence", tmp_path / "b.fa",
                             "-gapopen", "10", "-gapextend", "0.5", "-outfile", "stdout", "-auto"],
                            capture_output=True, text=True, check=True).stdout
    row_a, row_b = (str(r.seq) for r in AlignIO.read(io.StringIO(needle), "emboss"))
    col_a, col_b = (np.cumsum([c != "-" for c in row]) - 1 for row in (row_a, row_b))
    both = [n for n in range(len(row_a)) if row_a[n] != "-" and row_b[n] != "-"]
    rec = AlignmentRecord(seq_a, seq_b, [[col_a[n], col_b[n]] for n in both], id_a="a", id_b="b")
    ours = to_pair_text(rec, plain=True)
    assert rec.gapped() == (row_a, row_b)  # the same alignment, laid out the same way
    keys = ("# Length:", "# Identity:", "# Similarity:", "# Gaps:")
    assert [x for x in ours.splitlines() if x.startswith(keys)] == \
        [x for x in needle.splitlines() if x.startswith(keys)]
    blocks = lambda text: text[text.index("\na ") + 1:text.index("\n#---")]  # noqa: E731
    assert blocks(ours) == blocks(needle)


_WATER_CORE = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSG"


@pytest.mark.skipif(not __import__("shutil").which("water"), reason="EMBOSS water is not installed")
@pytest.mark.parametrize("seq_a, seq_b", [
    ("WWPPWWPPGGHHWWPPGGHH" + _WATER_CORE + "WWPPGGHHWWPPGG",
     "CCNNCCEE" + _WATER_CORE[:40] + "DDCCNNRRCCEEDDCCNNRRCCSS"),
    ("PPPPGGGG" + _WATER_CORE[:20] + "WW" + _WATER_CORE[20:] + "HHHH", "CCC" + _WATER_CORE + "CCC"),
])
def test_a_local_alignment_is_written_as_water_writes_it(tmp_path, seq_a, seq_b):
    """-f emboss of a local record against EMBOSS water: water's local alignment, written by
    to_pair_text(plain=True) from a record marked local, gives water's Length / Identity /
    Similarity / Gaps lines and its blocks byte for byte (the aligned region only, numbered
    from its first residues); the same record not marked local shows the flanks."""
    import subprocess

    for name, seq in (("a", seq_a), ("b", seq_b)):
        (tmp_path / f"{name}.fa").write_text(f">{name}\n{seq}\n")
    water = subprocess.run(["water", "-asequence", tmp_path / "a.fa", "-bsequence", tmp_path / "b.fa",
                            "-gapopen", "10", "-gapextend", "0.5", "-outfile", "stdout", "-auto"],
                           capture_output=True, text=True, check=True).stdout
    aligned = Align.read(io.StringIO(water), "emboss")
    idx = np.asarray(aligned.indices)
    pairs = idx[:, (idx[0] >= 0) & (idx[1] >= 0)].T
    rec = AlignmentRecord(seq_a, seq_b, pairs, id_a="a", id_b="b", local=True)
    ours = to_pair_text(rec, plain=True)
    keys = ("# Length:", "# Identity:", "# Similarity:", "# Gaps:")
    assert [x for x in ours.splitlines() if x.startswith(keys)] == \
        [x for x in water.splitlines() if x.startswith(keys)]
    blocks = lambda text: text[text.index("\na ") + 1:text.index("\n#---")]  # noqa: E731
    assert blocks(ours) == blocks(water)
    whole = to_pair_text(dataclasses.replace(rec, local=False), plain=True)
    assert f"# Length: {len(rec.gapped()[0])}" in whole and blocks(whole).startswith(f"{'a':<13} {1:>6} ")


def test_local_records_keep_their_mode_through_json():
    rec = AlignmentRecord("GGMKVLAGG", "WMKVLW", [[2, 1], [3, 2], [4, 3], [5, 4]], local=True)
    assert json.loads(to_json(rec))["mode"] == "local" and from_json(to_json(rec)).local
    assert json.loads(to_json(dataclasses.replace(rec, local=False)))["mode"] == "global"
    text = to_pair_text(rec)
    assert "# Length: 4" in text and "seq_a              3 MKVL      6" in text
    nothing = to_pair_text(AlignmentRecord("GGG", "WWW", np.zeros((0, 2), int), local=True), plain=True)
    assert "# Length: 0" in nothing and "# Gaps:           0/0 ( 0.0%)" in nothing  # no region, no blocks
    assert not any(line.startswith(("seq_a ", "seq_b ")) for line in nothing.splitlines())


def test_a_confidence_that_is_not_finite_is_refused():
    """A NaN confidence (a JSON null read back) would print as a 20-character symbol."""
    with pytest.raises(ValueError, match="confidence must be finite"):
        AlignmentRecord("MKV", "MKV", [[0, 0], [1, 1]], confidence=[0.5, float("nan")])
