"""The one output path of every command (pfamalign.outputs): atomic, never onto an input."""

import pytest

from pfamalign.outputs import OutputError, atomic_path, open_output


def test_output_equal_to_an_input_is_refused_and_the_input_survives(tmp_path):
    src = tmp_path / "pairs.tsv"
    src.write_text("AAA\tCCC\n")
    with pytest.raises(OutputError, match="also an input"):
        with open_output(src, inputs=[src]) as sink:
            sink.write("lost")
    assert src.read_text() == "AAA\tCCC\n"


def test_failed_block_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    with pytest.raises(RuntimeError):
        with open_output(out) as sink:
            sink.write("half")
            raise RuntimeError("interrupted")
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_successful_block_replaces_the_file(tmp_path):
    out = tmp_path / "out.txt"
    with open_output(out) as sink:
        sink.write("new\n")
    assert out.read_text() == "new\n"
    with atomic_path(tmp_path / "x.bin") as tmp:
        tmp.write_bytes(b"\x00\x01")
    assert (tmp_path / "x.bin").read_bytes() == b"\x00\x01"


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        with open_output(tmp_path / "nope" / "out.txt"):
            pass
