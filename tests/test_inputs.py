"""Library inputs of the commands (pfamalign.inputs) and the one JSON policy (pfamalign.jsonio),
without a model."""

from __future__ import annotations

import io
import json
import pathlib

import numpy as np
import pytest

from pfamalign import inputs, jsonio

SEED = pathlib.Path(__file__).resolve().parent / "data" / "pfam_seed"


def test_pairs_tsv_records_ids_and_lines(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("# comment\n\nMKV\tMKL\nx1\tAAA\tx2\tCCC\n")
    got = list(inputs.read_pairs_tsv(path))
    assert [(p["q_id"], p["q_seq"], p["k_id"], p["k_seq"]) for p in got] == [
        ("pair3_a", "MKV", "pair3_b", "MKL"), ("x1", "AAA", "x2", "CCC")]
    assert got[1]["where"] == f"{path}:4" and got[1]["target"] is None


@pytest.mark.parametrize("header", ["query\ttarget", "Seq_A\tSeq_B", "id_a\tseq_a\tid_b\tseq_b",
                                    "# comment\nsequence1\tsequence2"])
def test_a_first_line_of_column_names_is_a_header_not_a_pair(tmp_path, header):
    path = tmp_path / "pairs.tsv"
    path.write_text(f"{header}\nMKV\tMKL\nQUERY\tTARGET\n")  # later lines are pairs, words or not
    got = list(inputs.read_pairs_tsv(path))
    assert [(p["q_seq"], p["k_seq"]) for p in got] == [("MKV", "MKL"), ("QUERY", "TARGET")]
    assert inputs.count_pairs_tsv(path) == 2
    path.write_text(f"{header}\nquery\ttarget\n")  # only the first pair line can be a header
    assert [(p["q_seq"], p["k_seq"]) for p in inputs.read_pairs_tsv(path)] == [("query", "target")]
    assert inputs.count_pairs_tsv(path) == 1
    path.write_text(f"{header}\n")
    with pytest.raises(ValueError, match="no pairs in"):
        inputs.read_pairs_tsv(path)


@pytest.mark.parametrize("first", ["antigen\tantibody", "id\theavy\tid\tlight", "query_sequence\ttarget_sequence"])
def test_a_first_line_that_looks_like_other_column_names_is_read_with_a_warning(tmp_path, capsys, first):
    """Column names made of residue letters that ``_HEADER_WORDS`` lacks ("antigen") aligned
    as a pair without a word, and "query_sequence" was a bad record: each stays a pair (a
    mistyped sequence is not skipped silently), and a warning says how to skip the line."""
    path = tmp_path / "pairs.tsv"
    path.write_text(f"{first}\nMKV\tMKL\n")
    got = list(inputs.read_pairs_tsv(path))
    assert len(got) == 2 and got[1]["q_seq"] == "MKV"
    err = capsys.readouterr().err
    assert err.startswith(f"Warning: {path}:1 (") and "start it with '#' to skip it" in err, err
    for plain in ("MKV\tMKL", "mkvlaagivgllaamkvlaagivgllaamkvlaagivg\tMKVL", "x1\tMKV\tx2\tMKL"):
        path.write_text(f"{plain}\nMKV\tMKL\n")  # residues (upper case, or too long for a name)
        list(inputs.read_pairs_tsv(path))
        assert capsys.readouterr().err == "", plain
    for peptides in ("mkvlaaglll\tmkvlaggllv\nmkv\tmkl\n", "MKV-LAAGLLL\tMKVLAGG-LLV\nMKV\tMKL\n", "mkv\tmkl\n"):
        path.write_text(peptides)  # short lower-case peptides as the file's others are; a gap; one line
        assert len(list(inputs.read_pairs_tsv(path))) == peptides.count("\n")
        assert capsys.readouterr().err == "", peptides


def test_bad_pairs_tsv_line_is_yielded_as_a_bad_record_and_reading_goes_on(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("MKV\tMKL\nMKV\nAAA\tCCC\n")
    first, bad, last = inputs.read_pairs_tsv(path)
    assert first["q_seq"] == "MKV" and last["q_seq"] == "AAA"
    assert isinstance(bad, inputs.BadRecord) and bad.where == f"{path}:2"
    assert str(bad).startswith(f"{path}:2: expected 2")


def test_pairs_tsv_count_is_the_number_of_items_read_and_none_for_a_pipe(tmp_path):
    """A batch's progress total: counted in a pass that keeps no sequence, from a regular file
    only (plain or gzip, a byte-order mark, CR line ends); a pipe cannot be read twice."""
    import gzip
    import os

    text = "\ufeff# comment\n\nMKV\tMKL\nMKV\n \t \nx1\tAAA\tx2\tCCC\r\n#\tMKV\tMKL\nAAA\tCCC"
    path = tmp_path / "pairs.tsv"
    path.write_text(text, encoding="utf-8")
    zipped = tmp_path / "pairs.tsv.gz"
    zipped.write_bytes(gzip.compress(text.encode()))
    for source in (path, zipped):
        assert inputs.count_pairs_tsv(source) == len(list(inputs.read_pairs_tsv(source))) == 4
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # never opened: that would wait for a writer
    assert inputs.count_pairs_tsv(fifo) is None and inputs.count_pairs_tsv("-") is None
    path.write_bytes(b"MKV\tMKL\n\xff\tMKL\n")  # the reader's error to report, not the count's
    assert inputs.count_pairs_tsv(path) is None


def test_sequence_arguments(tmp_path):
    assert inputs.pair_from_sequences("mkv", "MKL")["q_seq"] == "MKV"
    two = tmp_path / "two.fasta"
    two.write_text(">a\nMKV\n>b\nMKL\n")
    with pytest.raises(ValueError, match="expected exactly one FASTA record, found 2"):
        inputs.read_sequence(str(two), "seq_a")


def test_stockholm_pair_and_missing_ids():
    sto = SEED / "PF00041.sto"
    names = [line.split()[0] for line in sto.read_text().splitlines() if line and not line.startswith(("#", "/"))]
    pair = inputs.pair_from_stockholm(sto, names[0], names[1])
    assert len(pair["target"]) == len(pair["q_seq"]) and 0 <= pair["pid"] <= 100
    with pytest.raises(ValueError, match=r"has no row named 'nothere' \(row names are NAME/START-END"):
        inputs.pair_from_stockholm(sto, names[0], "nothere")
    with pytest.raises(ValueError, match=f"names '{names[0]}' twice"):
        inputs.pair_from_stockholm(sto, names[0], names[0])


def test_stockholm_pair_from_a_family_without_rows_says_so(tmp_path):
    """(It was an IndexError, printed as 'list index out of range'.)"""
    empty = tmp_path / "empty.sto"
    empty.write_text("# STOCKHOLM 1.0\n#=GF ID empty\n//\n")
    with pytest.raises(ValueError, match="holds no sequence rows"):
        inputs.pair_from_stockholm(empty, "a/1-2", "b/1-2")


def test_json_policy_is_strict_and_plain():
    obj = {"nan": float("nan"), "inf": np.float32("inf"), "arr": np.array([1.5, np.nan]),
           "flag": np.bool_(True), "path": pathlib.Path("a/b"), 3: (1, 2)}
    line = jsonio.dumps_line(obj)
    assert "\n" not in line
    assert json.loads(line) == {"nan": None, "inf": None, "arr": [1.5, None], "flag": True,
                                "path": "a/b", "3": [1, 2]}


# ---- FASTA ---------------------------------------------------------------------------------


def test_fasta_reader_joins_lines_names_records_and_reports_bad_ones(tmp_path):
    path = tmp_path / "many.fa"
    path.write_text(">a first\nmkv\nLL\n\n>b\nMK1\n>\nAAA\n>c\n>d\nWW\r\n")
    got = list(inputs.read_fasta(path))
    assert [(r.id, r.seq, r.where) for r in (got[0], got[4])] == [("a", "MKVLL", f"{path}:1"),
                                                                  ("d", "WW", f"{path}:10")]
    bad = got[1:4]
    assert all(isinstance(b, inputs.BadRecord) for b in bad)
    assert [b.where for b in bad] == [f"{path}:5", f"{path}:7", f"{path}:9"]
    assert "non-protein character '1'" in str(bad[0]) and "without a name" in str(bad[1])
    assert "has no residues" in str(bad[2])


def test_fasta_records_keep_descriptions_drop_spaces_in_sequences_and_name_a_bad_line(tmp_path):
    path = tmp_path / "genbank.fa"
    path.write_text(">sp|P1|A_HUMAN\tKinase A, tabbed\tOS=Homo sapiens\n"
                    "mkvll aaggi\tvgLLL\n  QSPED  \n"  # blocks of residues, as GenBank writes them
                    ">b\nMKVLL\nAAG1I\n"                 # the bad character on the record's 2nd line
                    ">c\nMKV\u00a0LL\n")                  # a no-break space is no residue
    a, b, c = inputs.read_fasta(path)
    assert (a.id, a.description, a.seq, a.where) == ("sp|P1|A_HUMAN", "Kinase A, tabbed\tOS=Homo sapiens",
                                                     "MKVLLAAGGIVGLLLQSPED", f"{path}:1")
    assert isinstance(b, inputs.BadRecord) and b.where == f"{path}:4"
    assert "character '1' at position 9 (1-based), on line 6" in str(b)
    assert isinstance(c, inputs.BadRecord) and r"'\xa0' at position 4" in str(c) and "on line 8" in str(c)


@pytest.mark.parametrize("text, message", [
    ("MKV\n>a\nMKV\n", "many.fa:1: not FASTA: sequence before the first '>'"),
    ("", "no FASTA records"),
    ("\n\n", "no FASTA records"),
])
def test_text_that_is_not_fasta_raises_naming_the_line(tmp_path, text, message):
    path = tmp_path / "many.fa"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        list(inputs.read_fasta(path))


def test_fasta_lines_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_LINE", 10)
    path = tmp_path / "long.fa"
    path.write_text(">a\nMKVLLMKVLLMKV\n")
    with pytest.raises(ValueError, match="long.fa:2: line longer than 10 characters"):
        list(inputs.read_fasta(path))
    path.write_bytes(b"\xff\xfe>a\nMKVL\n")  # not text before any record: the file is refused
    with pytest.raises(ValueError, match="long.fa:1: not UTF-8"):
        list(inputs.read_fasta(path))


def test_a_byte_that_is_not_utf8_is_named_at_its_own_line(tmp_path, monkeypatch):
    """The decoder reads ahead in chunks: a bad byte on line 5 was reported at line 1 (any
    small file), on line 201 of a pairs file at line 178."""
    fasta = tmp_path / "bad.fa"
    fasta.write_bytes(b">s1\nMKVLAAGIVG\n>s2\nMKVLSAGIVG\n>s\xe93\nMKVLSAGIVG\n>s4 ok\nMKVL\n"
                      b">s5\nMKV\n\xff\nLL\n>s6\nMKIL\n")
    got = list(inputs.read_fasta(fasta))  # only the records holding such a byte are left out
    assert [r.id if isinstance(r, inputs.FastaRecord) else str(r) for r in got] == [
        "s1", "s2", f"{fasta}:5: not UTF-8 text (byte 0xe9); the record starting at line 5 is left out "
        "(save the file as UTF-8)", "s4",
        f"{fasta}:11: not UTF-8 text (byte 0xff); the record starting at line 9 is left out "
        "(save the file as UTF-8)", "s6"]
    pairs = tmp_path / "bad.tsv"
    rows = [f"a{i}\tMKVLAAGIVG\tb{i}\tMKVLSAGIVG\n".encode() for i in range(300)]
    rows[200] = b"a\xe9\tMKVLAAGIVG\tb\tMKVLSAGIVG\n"
    pairs.write_bytes(b"".join(rows))
    with pytest.raises(ValueError, match=r"bad.tsv:201: not UTF-8 text"):
        list(inputs.read_pairs_tsv(pairs))
    monkeypatch.setattr(inputs, "MAX_LINE", 10)  # and an over-long line of a pairs file is not "FASTA"
    with pytest.raises(ValueError, match=r"bad.tsv:1: line longer than 10 characters; is this a pairs \(TSV\) file\?"):
        list(inputs.read_pairs_tsv(pairs))


def test_dash_reads_fasta_from_standard_input(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(">q\nMKVL\n>k\nMKIL\n>r\nMRVL\n"))
    pairs = list(inputs.fasta_pairs("-"))
    assert [(p["q_id"], p["k_id"], p["where"]) for p in pairs] == [("q", "k", "<stdin>:3"),
                                                                   ("q", "r", "<stdin>:5")]
    monkeypatch.setattr("sys.stdin", io.StringIO(">only\nmkvl\n"))
    assert inputs.read_sequence("-", "seq_a") == ("only", "MKVL")


def test_multi_fasta_pairs_first_against_others_or_all_pairs(tmp_path):
    path = tmp_path / "fam.fasta"
    path.write_text(">a\nMKV\n>b\nMKL\n>c\nM*K\n>d\nMRL\n")
    first = list(inputs.fasta_pairs(path))
    assert isinstance(first[0], inputs.BadRecord) and first[0].where == f"{path}:5"
    assert [(p["q_id"], p["k_id"]) for p in first[1:]] == [("a", "b"), ("a", "d")]
    every = [p for p in inputs.fasta_pairs(path, all_pairs=True) if isinstance(p, dict)]
    assert [(p["q_id"], p["k_id"]) for p in every] == [("a", "b"), ("a", "d"), ("b", "d")]
    for all_pairs, items in ((False, 3), (True, 4)):  # the bad record and the pairs: a progress total
        pairs = inputs.fasta_pairs(path, all_pairs=all_pairs)
        assert len(pairs) == len(list(pairs)) == len(list(pairs)) == items
    # the first record is the one every other is aligned against: no other takes its place
    path.write_text(">a\nM1V\n>b\nMKL\n>c\nMRL\n")
    with pytest.raises(ValueError, match=rf"the first record.*unusable: {path}:1: record 'a'.*--all-pairs"):
        inputs.fasta_pairs(path)
    assert [(p["q_id"], p["k_id"]) for p in inputs.fasta_pairs(path, all_pairs=True)
            if isinstance(p, dict)] == [("b", "c")]
    path.write_text(">a\nMKV\n")
    with pytest.raises(ValueError, match="at least two usable FASTA records"):
        list(inputs.fasta_pairs(path))
    # an aligned FASTA: every record refused for its gaps, and the error says why
    path.write_text(">a\nMK-V\n>b\nMKL-\n")
    with pytest.raises(ValueError, match=rf"found 0; skipped {path}:1: record 'a' has a non-protein "
                                         rf"character '-' at position 3.*skipped {path}:3:"):
        list(inputs.fasta_pairs(path))


def test_a_record_a_model_cannot_take_is_named_once_by_its_own_line(tmp_path):
    """``screened`` (a model's length limit) turns a record it rejects into one BadRecord at the
    record's own line, named, and pairs the others; a rejected first record raises as a bad
    one does (before, each pair with it failed, blamed on the other record's line)."""
    too_long = lambda seq: "too long" if len(seq) > 4 else None
    path = tmp_path / "fam.fasta"
    path.write_text(">a\nMKV\n>LONG\nMKVLAG\n>b\nMK1\n>c\nMRL\n>d\nMRI\n")
    pairs = inputs.fasta_pairs(path).screened(too_long)
    items = list(pairs)
    assert [str(x) for x in items if isinstance(x, inputs.BadRecord)] == [
        f"{path}:3: record 'LONG': too long", f"{path}:5: record 'b' has a non-protein character '1' at "
        "position 3 (1-based), on line 6; expected residue letters only (no gaps or digits; one '*' may end "
        "a record)"]
    assert [(p["q_id"], p["k_id"]) for p in items if isinstance(p, dict)] == [("a", "c"), ("a", "d")]
    assert len(pairs) == len(items) == 4
    every = inputs.fasta_pairs(path, all_pairs=True).screened(too_long)
    assert [(p["q_id"], p["k_id"]) for p in every if isinstance(p, dict)] == [("a", "c"), ("a", "d"), ("c", "d")]
    path.write_text(">LONG\nMKVLAG\n>b\nMKL\n>c\nMRL\n")
    with pytest.raises(ValueError, match=rf"the first record.*unusable: {path}:1: record 'LONG': too long"):
        inputs.fasta_pairs(path).screened(too_long)
    assert [(p["q_id"], p["k_id"]) for p in inputs.fasta_pairs(path, all_pairs=True).screened(too_long)
            if isinstance(p, dict)] == [("b", "c")]


def test_one_trailing_stop_is_dropped_from_every_kind_of_input(tmp_path):
    """The FASTA reader's stop rule holds for a residue argument and a pairs file too (before,
    'MKVL*' on the command line was refused where the same FASTA record was taken)."""
    from pfamalign.residues import input_sequence

    assert inputs.read_sequence("mkvl*", "seq_a") == ("seq_a", "MKVL")
    assert input_sequence("MKVL*") == "MKVL"
    for bad in ("MK*VL", "MKVL**", "*"):
        with pytest.raises(ValueError, match="non-protein character '\\*'|is empty"):
            input_sequence(bad)
    with pytest.raises(ValueError, match="is empty"):
        inputs.read_sequence("*", "seq_a")


def test_a_translations_trailing_stop_is_dropped_and_an_inner_one_refused(tmp_path):
    """transeq and other translators end a protein with '*': one trailing stop is not a residue;
    a '*' anywhere else is still an error (a stop inside a protein is not one protein)."""
    path = tmp_path / "translated.fa"
    path.write_text(">a\nMKVL\nAG*\n>b\nMKV*LAG\n>c\n*\n")
    a, b, c = inputs.read_fasta(path)
    assert (a.id, a.seq) == ("a", "MKVLAG")
    assert isinstance(b, inputs.BadRecord) and "non-protein character '*' at position 4" in str(b)
    assert isinstance(c, inputs.BadRecord) and "has no residues" in str(c)


def test_a_stockholm_file_given_as_fasta_is_named_as_such(tmp_path):
    path = tmp_path / "PF00041.sto"
    path.write_text("# STOCKHOLM 1.0\nA MKV\n//\n")
    with pytest.raises(ValueError, match=r"PF00041.sto:1: a Stockholm alignment, not FASTA"):
        list(inputs.read_fasta(path))


def test_a_multi_fasta_held_whole_is_bounded_in_residues(tmp_path, monkeypatch):
    """Pairs and search hold every record at once: an 8 MB gzip of 2,000 records of 4 M residues
    each took 8 GB before failing. Past MAX_IN_MEMORY residues in all, the file is refused by
    name as it is read (here at a limit of 100 residues)."""
    from click.testing import CliRunner

    from pfamalign.cli import main

    path = tmp_path / "many.fa"
    path.write_text("".join(f">s{i}\n{'ACDEFGHIKL' * 4}\n" for i in range(3)))  # 120 residues
    assert len(inputs.fasta_pairs(path)) == 2
    monkeypatch.setattr(inputs, "MAX_IN_MEMORY", 100)
    with pytest.raises(ValueError, match=f"{path}: more than 100 residues in all, past what pfamalign holds"):
        inputs.fasta_pairs(path)
    res = CliRunner().invoke(main, ["search", str(path), str(path)])
    assert res.exit_code != 0 and "more than 100 residues in all" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # no traceback


# ---- found missing by a mutation sweep: limits taken at their value, messages ---------------------

def _settings():
    """A settings dataclass with a plain and an optional int field."""
    import dataclasses

    @dataclasses.dataclass
    class S:
        n: int = 0
        m: int | None = None

    return S


def test_a_settings_integer_of_exactly_2_53_is_taken_one_past_it_refused():
    S = _settings()
    assert jsonio.check_fields(S, {"n": 2 ** 53}, "s") == {"n": 2 ** 53}
    assert jsonio.check_fields(S, {"n": -2 ** 53}, "s") == {"n": -2 ** 53}
    with pytest.raises(ValueError, match="at most 2\\*\\*53"):
        jsonio.check_fields(S, {"n": 2 ** 53 + 1}, "s")


def test_many_duplicate_ids_are_named_ten_then_counted(tmp_path, capsys):
    path = tmp_path / "dup.fa"
    path.write_text("".join(f">d{i:02d}\nMKV\n>d{i:02d}\nMKL\n" for i in range(12)))
    list(inputs.read_fasta(path))
    err = capsys.readouterr().err
    assert "'d09' and 2 more;" in err and "'d10'" not in err, err


def test_residues_in_memory_up_to_the_limit_are_taken(tmp_path, monkeypatch):
    path = tmp_path / "many.fa"
    path.write_text("".join(f">s{i}\n{'ACDEFGHIKL' * 4}\n" for i in range(3)))  # 120 residues
    monkeypatch.setattr(inputs, "MAX_IN_MEMORY", 120)
    assert len(inputs.fasta_pairs(path)) == 2
    monkeypatch.setattr(inputs, "MAX_IN_MEMORY", 119)
    with pytest.raises(ValueError, match="more than 119 residues"):
        inputs.fasta_pairs(path)


def test_a_null_or_a_bool_for_a_plain_int_field_is_refused():
    S = _settings()
    assert jsonio.check_fields(S, {"m": None}, "s") == {"m": None}
    for bad in (None, True):
        with pytest.raises(ValueError, match="n must be a finite int"):
            jsonio.check_fields(S, {"n": bad}, "s")


def test_changes_name_nested_fields_by_their_whole_path():
    assert jsonio.changes({"a": {"b": {"c": 1}}, "d": 1}, {"a": {"b": {"c": 2}}, "d": 1}) == [("a.b.c", 1, 2)]


def test_a_line_of_exactly_max_line_characters_is_taken(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_LINE", 10)
    path = tmp_path / "a.fa"
    path.write_text(">a\n" + "A" * 10 + "\n")
    assert [r.seq for r in inputs.read_fasta(path)] == ["A" * 10]
    path.write_text(">a\n" + "A" * 11 + "\n")
    with pytest.raises(ValueError, match=":2: line longer than 10"):
        list(inputs.read_fasta(path))


def test_a_bad_character_opening_a_line_is_named_on_that_line(tmp_path):
    path = tmp_path / "a.fa"
    path.write_text(">a\nMKV\n1KV\n")
    (bad,) = inputs.read_fasta(path)
    assert isinstance(bad, inputs.BadRecord) and "position 4 (1-based), on line 3;" in str(bad), bad


def test_a_record_of_exactly_max_record_residues_is_taken(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_RECORD", 10)
    path = tmp_path / "a.fa"
    path.write_text(">a\nMKVLA\nMKVLA\n")
    assert [r.seq for r in inputs.read_fasta(path)] == ["MKVLAMKVLA"]
    path.write_text(">a\nMKVLA\nMKVLAG\n")
    with pytest.raises(ValueError, match="record longer than 10 residues"):
        list(inputs.read_fasta(path))


def test_too_few_usable_records_name_three_skipped_and_count_the_rest(tmp_path):
    path = tmp_path / "a.fa"
    path.write_text(">ok\nMKV\n" + "".join(f">b{i}\nMK1\n" for i in range(5)))
    with pytest.raises(ValueError, match=r"found 1; skipped .*; and 2 more$"):
        inputs.fasta_pairs(path)


def test_column_names_of_32_characters_are_warned_about(tmp_path, capsys):
    path = tmp_path / "pairs.tsv"
    path.write_text(f"{'a' * 32}\t{'b' * 32}\nMKV\tMKL\n")
    list(inputs.read_pairs_tsv(path))
    assert "looks like column names" in capsys.readouterr().err


def test_a_missing_row_is_named_with_an_example_of_the_files_names():
    sto = SEED / "PF00041.sto"
    names = sorted(line.split()[0] for line in sto.read_text().splitlines()
                   if line.strip() and not line.startswith(("#", "/")))
    with pytest.raises(ValueError, match=f"e.g. '{names[0]}'"):
        inputs.pair_from_stockholm(sto, names[0], "nothere")
