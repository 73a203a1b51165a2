"""The streaming Stockholm reader: real Pfam files, multi-family gz streams, malformed input."""

import gzip
import pathlib
import re
import tracemalloc

import pytest

from pfamalign.pipelines import stockholm as st

DATA = pathlib.Path(__file__).parent / "data" / "pfam_seed"


def _biopython_rows(path):
    from Bio import AlignIO

    aln = AlignIO.read(str(path), "stockholm")
    return [r.id for r in aln], [str(r.seq).replace(".", "-") for r in aln]


def _norm(rows):
    return [r.replace(".", "-") for r in rows]


def _write(tmp_path, text, name="x.sto"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------
# Real data
# ------------------------------------------------------------------------------------------

def test_fixture_files_match_biopython():
    files = sorted(DATA.glob("*.sto"))
    assert len(files) == 11
    for path in files:
        (fam,) = st.read_families(path)
        ids, rows = _biopython_rows(path)
        assert list(fam.seq_ids) == ids, path
        assert _norm(fam.rows) == rows, path


def test_every_shared_file_matches_biopython_and_manifest(shared_pfam):
    import pandas as pd

    manifest = pd.read_csv(shared_pfam / "manifest.tsv", sep="\t")
    manifest = manifest[manifest["dir"] != "full_match_columns"]
    assert len(manifest) == 33
    for row in manifest.itertuples():
        path = shared_pfam / row.dir / row.file
        (fam,) = st.read_families(path)
        ids, rows = _biopython_rows(path)
        assert list(fam.seq_ids) == ids, path
        assert _norm(fam.rows) == rows, path
        assert len(fam.rows) == row.n_seqs, path
        assert str(fam.n_columns) == str(row.aln_cols), path
        lengths = [sum(c.isalpha() for c in r) for r in fam.rows]
        assert min(lengths) == int(row.min_len) and max(lengths) == int(row.max_len), path
        if row.accession != "-":
            assert fam.key == row.accession
        assert st.accession_base(fam.key) == row.file[:7]


def test_hmmalign_rows_degap_to_the_seed_fasta(shared_pfam):
    from Bio import SeqIO

    for path in sorted((shared_pfam / "hmmalign_stockholm").glob("*.sto")):
        (fam,) = st.read_families(path)
        fasta = shared_pfam / "hmmalign_stockholm" / "seed_fasta" / f"{path.stem}_seed.fasta"
        expected = {r.id: str(r.seq).upper() for r in SeqIO.parse(str(fasta), "fasta")}
        got = {i: "".join(c for c in row if c.isalpha()).upper()
               for i, row in zip(fam.seq_ids, fam.rows)}
        assert got == expected, path
        # hmmalign: RF marks match columns, which hold exactly the upper-case residues
        assert fam.rf is not None and len(fam.rf) == fam.n_columns
        for row in fam.rows:
            for c, rf in zip(row, fam.rf):
                if c.isalpha():
                    assert c.isupper() == (rf != "."), (path, c, rf)


def test_multi_family_gz_streams_like_single_files(shared_pfam, tmp_path):
    files = sorted((shared_pfam / "seed_stockholm").glob("*.sto")) + sorted(
        (shared_pfam / "hmmalign_stockholm").glob("*.sto"))
    big = tmp_path / "Pfam-A.seed.gz"
    with gzip.open(big, "wb") as out:
        for f in files:
            out.write(f.read_bytes())
    streamed = list(st.read_families(big))
    single = [next(iter(st.read_families(f))) for f in files]
    for i, (a, b) in enumerate(zip(streamed, single)):
        assert a.seq_ids == b.seq_ids and a.rows == b.rows and a.name == b.name
        if b.key == "PF05371":  # no AC/ID lines: keyed by file stem alone; in a stream by
            assert re.fullmatch(rf"Pfam-A#{i}-[0-9a-f]{{8}}", a.key)  # position and content
        else:
            assert a.key == b.key
    raws = list(st.iter_raw_families(big))
    assert [r.index for r in raws] == list(range(len(files)))


def test_streaming_holds_one_family_at_a_time(tmp_path):
    """A ~12 MB multi-family stream is read with a few MB of peak Python memory."""
    fam = (DATA / "PF00041.sto").read_text()  # 24.5 kB, 98 sequences
    path = tmp_path / "many.sto.gz"
    with gzip.open(path, "wt", compresslevel=1) as out:
        for i in range(500):
            out.write(fam.replace("PF00041.20", f"PF{i:05d}.1"))
    tracemalloc.start()
    n = 0
    for _raw in st.iter_raw_families(path):
        n += 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == 500
    assert peak < 4_000_000, f"peak {peak / 1e6:.1f} MB: the stream is being buffered"


def test_inputs_expand_directories_in_name_order(tmp_path):
    (tmp_path / "b.sto").write_text((DATA / "PF02184.sto").read_text())
    (tmp_path / "a.sto").write_text((DATA / "PF02294.sto").read_text())
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "sub").mkdir()
    files, notes = st.expand_inputs([tmp_path])
    assert [f.name for f in files] == ["a.sto", "b.sto"]
    assert any("notes.txt" in n for n in notes)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        st.expand_inputs([tmp_path / "missing.sto"])
    import os

    os.mkfifo(tmp_path / "pipe.sto")  # what `--pfam <(zcat x.sto.gz)` passes: there, but read once
    with pytest.raises(FileNotFoundError, match="not a regular file"):
        st.expand_inputs([tmp_path / "pipe.sto"])


# ------------------------------------------------------------------------------------------
# Layout variants
# ------------------------------------------------------------------------------------------

INTERLEAVED = """# STOCKHOLM 1.0
#=GF ID   toy
#=GF AC   PF99999.1
#=GS seq1/1-10 AC P00001.1

seq1/1-10    AC-DE
#=GR seq1/1-10 PP 99.99
seq2/3-12    ACqDE
#=GC RF      xx.xx

seq1/1-10    FGHIK
seq2/3-12    F-HIK
#=GC RF      xxxxx
//
"""


def test_interleaved_blocks_are_concatenated(tmp_path):
    (fam,) = st.read_families(_write(tmp_path, INTERLEAVED))
    assert fam.key == "PF99999.1" and fam.name == "toy"
    assert fam.seq_ids == ("seq1/1-10", "seq2/3-12")
    assert fam.rows == ("AC-DEFGHIK", "ACqDEF-HIK")
    assert fam.rf == "xx.xxxxxxx"


def test_latin1_bytes_and_crlf_are_accepted(tmp_path):
    text = INTERLEAVED.replace("#=GF ID   toy", "#=GF AU   M\xfcller J").replace("\n", "\r\n")
    path = tmp_path / "latin.sto"
    path.write_bytes(text.encode("latin-1"))
    (fam,) = st.read_families(path)
    assert fam.rows == ("AC-DEFGHIK", "ACqDEF-HIK")


def test_family_keys_fall_back_to_stem_id_and_position(tmp_path):
    body = "seqA  ACDE\nseqB  ACDE\n//\n"
    p = _write(tmp_path, "# STOCKHOLM 1.0\n" + body, "PF05371.sto")
    assert next(st.read_families(p)).key == "PF05371"
    multi = ("# STOCKHOLM 1.0\n#=GF ID fam_a\n" + body + "# STOCKHOLM 1.0\n" + body)
    p = _write(tmp_path, multi, "mixed.sto")
    first, second = st.read_families(p)
    assert first.key == "fam_a" and re.fullmatch(r"mixed#1-[0-9a-f]{8}", second.key)
    (tmp_path / "other").mkdir()
    p2 = _write(tmp_path / "other", multi.replace("seqB  ACDE", "seqB  ACDF"), "mixed.sto")
    assert list(st.read_families(p2))[1].key != second.key  # another family, same file name
    assert st.accession_base("PF00041.24") == "PF00041"


# ------------------------------------------------------------------------------------------
# Malformed input: errors name file and line; --skip-bad continues
# ------------------------------------------------------------------------------------------

GOOD = "# STOCKHOLM 1.0\n#=GF AC PF00001.1\nseqA  ACDE\nseqB  AC-E\n//\n"


@pytest.mark.parametrize("text, line, fragment", [
    ("seqA ACDE\n", 1, "expected a '# STOCKHOLM 1.0' header"),
    ("# STOCKHOLM 1.0\nseqA ACDE\nseqB ACDE\n", 3, "missing '//'"),
    ("# STOCKHOLM 1.0\nseqA ACDE\n# STOCKHOLM 1.0\nseqB AC\n//\n", 3, "before the '//'"),
    ("# STOCKHOLM 1.0\nseqA AC DE\n//\n", 2, "found 3 fields"),
    ("# STOCKHOLM 1.0\nseqA AC*E\n//\n", 2, "invalid character '*' at column 3"),
    ("# STOCKHOLM 1.0\nseqA ACDE\nseqB ACDE\nseqA ACDE\n//\n", 4, "duplicate sequence id 'seqA' (also at line 2 "),
    # interleaved: the clash is in the second block, with its own earlier line (it named line 2)
    ("# STOCKHOLM 1.0\nseqA AC\nseqB AC\n\nseqA DE\nseqB DE\nseqA DE\n//\n", 7,
     "duplicate sequence id 'seqA' (also at line 5 of this block)"),
    ("# STOCKHOLM 1.0\nseqA ACDE\nseqB ACD\n//\n", 3, "has 3 alignment columns"),
    ("", 1, "no Stockholm alignment found (empty file?)"),
])
def test_errors_name_file_and_line(tmp_path, text, line, fragment):
    path = _write(tmp_path, text, "bad.sto")
    with pytest.raises(st.StockholmError) as info:
        list(st.read_families(path))
    err = info.value
    assert err.path == str(path) and err.line == line, str(err)
    assert fragment in str(err)
    assert str(err).startswith(f"{path}:{line}: ")


def test_skip_bad_reports_and_continues(tmp_path):
    bad_middle = "# STOCKHOLM 1.0\n#=GF AC PF00002.1\nseqA AC*E\nseqB ACDE\n//\n"
    junk = "this is not stockholm\nmore junk\n"
    path = _write(tmp_path, GOOD + junk + GOOD.replace("PF00001", "PF00003") + bad_middle
                  + GOOD.replace("PF00001", "PF00004"), "mixed.sto")
    raws = list(st.iter_raw_families(path, skip_bad=True))
    errors = [r for r in raws if r.error is not None]
    assert len(errors) == 1 and errors[0].error.line == 6  # the junk line
    parsed = []
    for r in raws:
        if r.error is None:
            try:
                parsed.append(st.parse_family(r).key)
            except st.StockholmError as err:
                assert err.line == 15 and "invalid character" in str(err)
    assert parsed == ["PF00001.1", "PF00003.1", "PF00004.1"]
    with pytest.raises(st.StockholmError):
        list(st.iter_raw_families(path))


def test_truncated_gz_family_is_reported(tmp_path):
    path = tmp_path / "cut.sto.gz"
    with gzip.open(path, "wt") as f:
        f.write(GOOD + "# STOCKHOLM 1.0\nseqA ACDE\n")
    raws = list(st.iter_raw_families(path, skip_bad=True))
    assert raws[0].error is None and raws[1].error is not None
    assert "missing '//'" in str(raws[1].error)


def test_stockholm_error_pickles():
    import pickle

    err = st.StockholmError("f.sto", 7, "boom")
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.line, again.message, str(again)) == ("f.sto", 7, "boom", str(err))


@pytest.mark.parametrize("typed", ["É", "😀", "*"])
def test_an_invalid_character_is_named_as_typed(tmp_path, typed):
    path = tmp_path / "u.sto"
    path.write_bytes(f"# STOCKHOLM 1.0\nA/1-4 MK{typed}V\nB/1-4 MKVV\n//\n".encode("utf-8"))
    with pytest.raises(st.StockholmError, match=f"invalid character '{re.escape(typed)}' at column 3"):
        list(st.read_families(path))


def test_a_utf8_sequence_name_is_read_as_written(tmp_path):
    """The file is decoded as latin-1 (Pfam's free text has such bytes), but a UTF-8 name is
    the name the user wrote and types in ``--ids``; a latin-1 byte that is not UTF-8 stays."""
    path = tmp_path / "u.sto"
    path.write_bytes("# STOCKHOLM 1.0\nséqA MKVLAAG\nseqB MKVLSAG\n".encode() + b"caf\xe9 MKVLSAG\n//\n")
    fam = st.parse_family(next(st.iter_raw_families(path)))
    assert fam.seq_ids == ("séqA", "seqB", "caf\xe9")


def test_a_line_past_the_limit_is_an_error_not_read_whole(tmp_path):
    """A 200 KB gzip holding one 200 MB sequence line was read into memory whole (a 3 GB one
    ran out of memory): lines are read up to MAX_LINE, and a longer one names its line."""
    import gzip

    from pfamalign.inputs import MAX_LINE
    from pfamalign.pipelines.stockholm import StockholmError, iter_raw_families

    path = tmp_path / "bomb.sto.gz"
    with gzip.open(path, "wt") as f:
        f.write("# STOCKHOLM 1.0\n#=GF AC PF00001.1\nseqA/1-10 " + "A" * (2 * MAX_LINE) + "\n//\n")
    with pytest.raises(StockholmError, match=f"bomb.sto.gz:3: line longer than {MAX_LINE} characters"):
        list(iter_raw_families(path))
    (bad,) = iter_raw_families(path, skip_bad=True)  # reported as a bad stretch, reading stops
    assert bad.error is not None and bad.error.line == 3
