"""The one output path of every command (pfamalign.outputs): atomic, never onto an input."""

import os
import pathlib

import pytest

from pfamalign import outputs
from pfamalign.outputs import (TEMPORARY_GLOB, OutputError, atomic_path, is_temporary, open_output,
                               temporary_path)


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


def test_an_output_named_gz_is_gzip_compressed_and_the_same_bytes_each_time(tmp_path):
    """``-o hits.m8.gz`` wrote plain text under a .gz name (zcat: "not in gzip format"), though
    every input may be gzip; now it is compressed, named inside as the file without .gz, and
    with mtime 0, so that the same output is the same bytes. A failed block leaves nothing."""
    import gzip

    out = tmp_path / "hits.m8.gz"
    runs = []
    for _ in range(2):
        with open_output(out) as sink:
            sink.write("q\tt\t99.5\n\u00e9\n")
        runs.append(out.read_bytes())
    assert runs[0] == runs[1] and runs[0][:2] == b"\x1f\x8b"  # gzip's magic
    assert gzip.decompress(runs[0]).decode() == "q\tt\t99.5\n\u00e9\n"
    assert b"hits.m8\0" in runs[0][:30]  # the name gzip -d would restore
    with pytest.raises(RuntimeError), open_output(tmp_path / "other.gz") as sink:
        sink.write("half")
        raise RuntimeError("failed midway")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hits.m8.gz"]


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        with open_output(tmp_path / "nope" / "out.txt"):
            pass


def test_every_temporary_name_is_matched_by_the_cleaning_pattern(tmp_path):
    """The stray-temporary cleaning (prepare, verify) matches what the atomic writes name."""
    from pfamalign.pipelines import records

    names = [temporary_path(tmp_path / n).name for n in ("plot.png", "manifest.json", "noext", "a.tar.gz")]
    assert all(n.startswith(".") and ".tmp" in n for n in names)
    assert temporary_path(tmp_path / "plot.png").suffix == ".png"  # plotting reads the format here
    legacy = [".manifest.json.999999.tmp", ".scatter-00001.tmp", ".pairs-00000-of-00002.array_record.tmp"]
    for name in names + legacy:
        (tmp_path / name).write_text("x")
    keep = ["manifest.json", ".pfamalign.lock", "tmp.txt", ".hidden"]
    for name in keep:
        (tmp_path / name).write_text("x")
    assert sorted(p.name for p in tmp_path.glob(TEMPORARY_GLOB)) == sorted(names + legacy)
    assert sorted(n for n in names + legacy + keep if is_temporary(n)) == sorted(names + legacy)
    # a pipelines write lands on its name and leaves nothing the pattern matches
    records.write_text(tmp_path / "sub.txt", "hello\n")
    assert (tmp_path / "sub.txt").read_text() == "hello\n"
    assert len(list(tmp_path.glob(TEMPORARY_GLOB))) == len(names + legacy)


def test_a_staged_directory_appears_whole_or_not_at_all(tmp_path):
    from pfamalign.outputs import staged_directory

    out = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with staged_directory(out) as work:
            assert is_temporary(work.name) and work.parent == tmp_path  # a killed run's is a stray
            (work / "config.json").write_text("{}")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []  # neither OUT nor the stage
    with staged_directory(out) as work:
        (work / "config.json").write_text("1")
    assert (out / "config.json").read_text() == "1" and list(tmp_path.iterdir()) == [out]
    with pytest.raises(OSError):  # an existing OUT is not replaced unless asked
        with staged_directory(out) as work:
            (work / "config.json").write_text("2")
    assert (out / "config.json").read_text() == "1" and list(tmp_path.iterdir()) == [out]
    with staged_directory(out, replace=True) as work:
        (work / "other.json").write_text("3")
    assert [p.name for p in out.iterdir()] == ["other.json"] and list(tmp_path.iterdir()) == [out]


def test_a_stage_a_killed_process_left_is_removed_by_the_next_build(tmp_path):
    """kill -9 runs no cleanup: the next staged_directory for the same OUT removes a stage
    whose process is gone, and keeps one whose process still runs (another build)."""
    import os
    import subprocess

    from pfamalign.outputs import staged_directory

    out = tmp_path / "ens"
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no process holds now
    dead, live = tmp_path / f".ens.{gone.pid}.tmp", tmp_path / f".ens.{os.getppid()}.tmp"
    other = tmp_path / f".ensemble.{gone.pid}.tmp"  # another output's stage: not ours to touch
    for stage in (dead, live, other):
        stage.mkdir()
        (stage / "config.json").write_text("{}")
    with staged_directory(out) as work:
        (work / "config.json").write_text("1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ens", live.name, other.name])


def test_a_fifo_is_written_in_place_not_replaced(tmp_path):
    """A path that exists and is not a regular file (a FIFO here; /dev/null, /dev/stdout) is
    written to itself: a rename would leave a regular file where the device or pipe was."""
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    with open_output(fifo) as sink:
        sink.write("through the pipe\n")
    reader.join(timeout=10)
    assert got == ["through the pipe\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    import os

    out = tmp_path / "out.txt"
    out.write_text("old")
    os.chmod(out, 0o640)
    with open_output(out) as sink:
        sink.write("new")
    assert out.read_text() == "new" and os.stat(out).st_mode & 0o777 == 0o640


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_an_output_where_no_file_can_be_made_is_an_error_naming_the_path_given():
    """/proc takes no new file, for root too: the error names the output asked for and what to
    do, not the temporary file the atomic write tried to create beside it."""
    from pfamalign.outputs import staged_directory

    out = pathlib.Path("/proc/pfamalign-out.txt")
    with pytest.raises(OSError) as raised:
        with open_output(out) as sink:
            sink.write("lost")
    message = str(raised.value)
    assert message.startswith(f"cannot write {out}: ") and "(creating a file in /proc)" in message
    assert message.endswith("; write the output to a directory where you can create files")
    assert temporary_path(out).name not in message and ".tmp" not in message
    with pytest.raises(OSError, match=r"^cannot write /proc/plot.png: .*where you can create files$"):
        with atomic_path("/proc/plot.png") as tmp:  # a library opening the temporary itself
            tmp.write_bytes(b"\x89PNG")
    with pytest.raises(OSError, match=r"^cannot write /proc/model: .*\(creating a directory in /proc\)"):
        with staged_directory("/proc/model"):
            pass


def test_an_error_that_is_not_about_the_temporary_passes_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        with open_output(tmp_path / "out.txt") as sink:
            sink.write("x")
            open(tmp_path / "missing-input.txt")  # the block's own error, not the output's
    assert raised.value.filename == str(tmp_path / "missing-input.txt")
    assert not (tmp_path / "out.txt").exists()


def test_a_closed_standard_output_is_an_error_naming_the_way_out(monkeypatch, tmp_path):
    """`pfamalign align A B >&-`: Python starts with ``sys.stdout`` None. Writing there is an
    OSError (the command line's one `Error:` line, exit 1), not an AttributeError's
    traceback; a file output still works."""
    import sys

    monkeypatch.setattr(sys, "stdout", None)
    for path in (None, "-"):
        with pytest.raises(OSError, match="standard output is closed: write to a file with -o FILE"):
            with open_output(path):
                pass
    with open_output(tmp_path / "out.txt") as sink:
        sink.write("kept\n")
    assert (tmp_path / "out.txt").read_text() == "kept\n"


def test_an_unwritable_output_directory_is_refused_before_any_work(tmp_path, monkeypatch):
    """`eval --json ro/e.json` on a read-only file system ran the whole evaluation, then failed
    naming its temporary; the check every output gets now asks the system first (access(),
    which reports a read-only file system to root too: here it is made to say no)."""
    from pfamalign.outputs import check_output_path

    read_only, real = tmp_path / "ro", os.access
    read_only.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if pathlib.Path(p) == read_only else real(p, mode, **kw))
    with pytest.raises(OutputError, match=f"cannot write {read_only / 'e.json'}: its directory {read_only} is not writable"):
        check_output_path(read_only / "e.json")
    assert check_output_path(tmp_path / "e.json") == tmp_path / "e.json"


def test_a_directory_copy_that_fills_the_disk_is_one_line_naming_the_output(tmp_path):
    """compile and ensemble copy a model into a staged directory; on a full disk copytree
    raises shutil.Error with every file's failure (one 6 KB line of tuples): the user gets
    the output named and what to do, and nothing is left."""
    import shutil

    from pfamalign.outputs import UnwritableOutput, staged_directory

    out = tmp_path / "compiled"
    with pytest.raises(UnwritableOutput) as caught:
        with staged_directory(out) as work:
            raise shutil.Error([(str(tmp_path / "model" / f"f{i}"), str(work / f"f{i}"),
                                 f"[Errno 28] No space left on device: '{work / f'f{i}'}'") for i in range(20)])
    assert str(caught.value) == f"cannot write {out}: No space left on device; free some space or write the output elsewhere"
    assert list(tmp_path.iterdir()) == []
    # a failure that is not about writing the copy (an unreadable source) keeps its own message
    with pytest.raises(shutil.Error):
        with staged_directory(out) as work:
            raise shutil.Error([(str(tmp_path / "model" / "f"), str(work / "f"), "[Errno 5] Input/output error")])


def test_an_output_directory_in_an_unwritable_place_is_refused_before_any_work(tmp_path, monkeypatch):
    """ensemble tuned every member, then failed to write on a read-only file system; compile
    said nothing of it either. Both refuse first (os.access, which reports a read-only file
    system to root too)."""
    from pfamalign import asap, ensemble
    from pfamalign.outputs import check_output_directory

    read_only, real = tmp_path / "ro", os.access
    read_only.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if pathlib.Path(p) == read_only else real(p, mode, **kw))
    said = f"cannot write {read_only / 'e'}: its directory {read_only} is not writable"
    with pytest.raises(OutputError, match=said):
        check_output_directory(read_only / "e")
    with pytest.raises(OutputError, match=said):  # before the models or the data are read
        ensemble.build(read_only / "e", [tmp_path / "no-model-a", tmp_path / "no-model-b"], tmp_path / "no-data")
    with pytest.raises(OutputError, match=said):
        asap.check_output_dir(tmp_path / "model", read_only / "e")
    with pytest.raises(OutputError, match="output directory .*missing does not exist"):
        check_output_directory(tmp_path / "missing" / "e")
    assert check_output_directory(tmp_path / "e") == tmp_path / "e"


def test_an_output_whose_folder_vanished_midway_is_an_error(tmp_path):
    """Its folder removed or moved (or the temporary deleted) while the output is written:
    nothing is saved, so the write fails naming the output, instead of ending as a success."""
    import shutil

    for undo in (shutil.rmtree, lambda d: d.rename(d.with_name("moved"))):
        folder = tmp_path / "gone"
        folder.mkdir()
        with pytest.raises(outputs.UnwritableOutput,
                           match=r"cannot write .*gone/out\.txt: the file being written vanished"):
            with outputs.open_output(folder / "out.txt") as sink:
                sink.write("x")
                sink.flush()
                undo(folder)
        assert not (folder / "out.txt").exists()
        shutil.rmtree(tmp_path / "moved", ignore_errors=True)


def test_tables_into_a_file_or_a_pipe_keep_their_width(monkeypatch):
    """A command's tables (eval, certify, barycenter, prepare's summary) are 150 columns wide
    when not written to a terminal: $COLUMNS (20 in a narrow pane, say) elided every number
    of certify's tables and blanked barycenter's."""
    from rich.table import Table

    from pfamalign.outputs import table_console

    monkeypatch.setenv("COLUMNS", "20")
    console = table_console()
    assert console.width == 150 and table_console(stderr=True).width == 150
    table = Table()
    for name in ("depth", "bias", "bound", "ratio"):
        table.add_column(name)
    table.add_row("4", "1.234567e-05", "2.345678e-04", "0.052631")
    with console.capture() as captured:
        console.print(table)
    assert "1.234567e-05" in captured.get() and "…" not in captured.get()


# ---- found missing by a mutation sweep ----------------------------------------------------------

def test_a_gz_output_carries_no_timestamp(tmp_path, monkeypatch):
    import time

    from pfamalign.outputs import open_output

    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    with open_output(tmp_path / "a.txt.gz") as sink:
        sink.write("x\n")
    assert (tmp_path / "a.txt.gz").read_bytes()[4:8] == b"\0\0\0\0"  # MTIME: 0


def test_a_new_file_inside_an_input_directory_is_fine(tmp_path):
    from pfamalign.outputs import check_output_path

    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    assert check_output_path(data / "new.json", inputs=[data]) == data / "new.json"


def test_a_hard_link_to_an_input_is_refused_as_the_input(tmp_path):
    import os

    from pfamalign.outputs import OutputError, check_output_path

    src = tmp_path / "pairs.tsv"
    src.write_text("MKV\tMKL\n")
    os.link(src, tmp_path / "h.tsv")
    with pytest.raises(OutputError, match="is also an input"):
        check_output_path(tmp_path / "h.tsv", inputs=[src])
