"""The training reader: random access, padded batches, bucketing, checkpointable iteration."""

import pathlib
import pickle

import numpy as np
import pytest

from pfamalign.pipelines import reader
from pfamalign.pipelines.config import PrepareConfig
from pfamalign.pipelines.pairs import SamplingConfig
from pfamalign.pipelines.prepare import run_prepare

SEED = pathlib.Path(__file__).parent / "data" / "pfam_seed"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("reader") / "ds"
    cfg = PrepareConfig(inputs=(str(SEED),), out=str(out), split_fractions=(1.0, 0.0, 0.0),
                        sampling=SamplingConfig(pairs_per_family=20), records_per_shard=50,
                        embedder="builtin/onehot+blosum62")
    run_prepare(cfg, quiet=True)
    return out


def test_pair_dataset_and_source(dataset):
    ds = reader.PairDataset(dataset)
    assert ds.embedder_id == "builtin/onehot+blosum62" and ds.dim == 50
    n = ds.num_pairs("train")
    assert n > 100 and ds.num_pairs("val") == 0
    src = ds.source("train")
    assert len(src) == n
    r = src[n - 1]
    assert r["q_feat"].shape == (r["q_len"], 50) and r["q_feat"].dtype == np.float32
    assert r["k_feat"].shape == (r["k_len"], 50)
    assert r["target"].dtype == np.int32 and r["target"].shape == (r["q_len"],)
    with pytest.raises(IndexError):
        src[n]
    again = pickle.loads(pickle.dumps(src))
    assert again[3]["q_id"] == src[3]["q_id"]
    assert len(reader.PairSource(dataset, "val")) == 0
    with pytest.raises(ValueError, match="unknown split"):
        ds.source("dev")
    plain = next(reader.iter_pairs(dataset, "train"))
    assert "q_feat" not in plain and {"q_seq", "k_seq", "target", "pid"} <= plain.keys()


def test_collate_pads_and_masks(dataset):
    src = reader.PairSource(dataset, "train")
    ex = [src[i] for i in range(3)]
    b = reader.collate(ex, batch_size=4, pad_multiple=32)
    longest = max(max(e["q_len"], e["k_len"]) for e in ex)
    lpad = reader.round_up(longest, 32)
    assert b["q_feat"].shape == (4, lpad, 50) and b["k_feat"].shape == (4, lpad, 50)
    assert b["target"].shape == (4, lpad) and b["target"].dtype == np.int32
    assert b["valid"].tolist() == [True, True, True, False]
    assert b["q_len"].dtype == np.int32 and b["pid"].dtype == np.float32
    for i, e in enumerate(ex):
        assert (b["target"][i, :e["q_len"]] == e["target"]).all()
        assert (b["target"][i, e["q_len"]:] == -1).all()
        assert (b["q_feat"][i, e["q_len"]:] == 0).all()
        np.testing.assert_array_equal(b["k_feat"][i, :e["k_len"]], e["k_feat"])
        assert b["q_seq"][i] == e["q_seq"]
    assert (b["target"][3] == -1).all() and b["q_len"][3] == 0
    sep = reader.collate(ex, pad_multiple=32, same_length=False, with_strings=False)
    assert "q_seq" not in sep and sep["q_feat"].shape[1] == reader.round_up(
        max(e["q_len"] for e in ex), 32)
    with pytest.raises(ValueError, match="exceeds pad_to"):
        reader.collate(ex, pad_to=8)


def test_batch_plan_epochs_determinism_and_bucketing(dataset):
    lengths = reader.PairDataset(dataset).lengths("train")
    n = len(lengths)
    plan = reader.BatchPlan(lengths, 8, seed=3, num_epochs=2)
    assert len(plan) == 2 * (n // 8)
    epoch0 = np.concatenate([plan[i] for i in range(n // 8)])
    assert len(set(epoch0.tolist())) == len(epoch0) == (n // 8) * 8
    again = reader.BatchPlan(lengths, 8, seed=3, num_epochs=2)
    assert all((plan[i] == again[i]).all() for i in range(len(plan)))
    assert not all((plan[i] == plan[i + n // 8]).all() for i in range(n // 8))  # reshuffled
    other = reader.BatchPlan(lengths, 8, seed=4, num_epochs=1)
    assert not all((plan[i] == other[i]).all() for i in range(n // 8))
    # bucketing cuts padding against unbucketed batches of the same shuffle
    def padded(p):
        return sum(8 * reader.round_up(lengths[p[i]].max(), 64) for i in range(n // 8))
    flat = reader.BatchPlan(lengths, 8, seed=3, bucket_window=1, num_epochs=1)
    assert padded(plan) < padded(flat)
    keep = reader.BatchPlan(lengths, 8, seed=3, drop_remainder=False, num_epochs=1)
    assert len(keep) == -(-n // 8)
    assert sorted(np.concatenate([keep[i] for i in range(len(keep))]).tolist()) == list(range(n))
    forever = reader.BatchPlan(lengths, 8, seed=3)
    assert len(forever) > 10**12 and (forever[len(plan) // 2 + 1] == plan[len(plan) // 2 + 1]).all()


def test_batch_iterator_state_restores_exactly(dataset):
    kw = dict(batch_size=4, seed=7, pad_multiple=32)
    it = reader.batch_iterator(dataset, "train", **kw)
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    resumed = reader.batch_iterator(dataset, "train", **kw)
    resumed.set_state(state)
    got = [next(resumed) for _ in range(3)]
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    b = expected[0]
    assert b["q_feat"].shape[0] == 4 and b["q_feat"].shape[1] % 32 == 0
    assert b["q_feat"].shape == b["k_feat"].shape and b["valid"].all()


def test_batch_dataset_finite_epoch_covers_every_pair(dataset):
    n = reader.PairDataset(dataset).num_pairs("train")
    ds = reader.batch_dataset(dataset, "train", batch_size=16, num_epochs=1, shuffle=False,
                              drop_remainder=False)
    seen = []
    for batch in ds:
        seen.extend(zip(batch["q_id"][batch["valid"]], batch["k_id"][batch["valid"]]))
    assert len(seen) == n
    ids = [(p["q_id"], p["k_id"]) for p in reader.iter_pairs(dataset, "train")]
    assert sorted(seen) == sorted(ids)


def test_every_process_pads_its_rows_like_the_whole_global_batch(dataset):
    """Two processes load their halves of each global batch padded to the same length, the
    length the whole batch needs (rows of different lengths: a half padded to its own longest
    row would give the processes' shards different shapes)."""
    kw = dict(batch_size=8, num_epochs=1, shuffle=False, bucket_window=None, with_strings=False, pad_multiple=16)
    whole = reader.batch_dataset(dataset, "train", **kw)
    halves = [reader.batch_dataset(dataset, "train", process_index=i, process_count=2, **kw) for i in range(2)]
    differ = 0
    for n in range(len(whole)):
        shapes = {h[n]["q_feat"].shape[1:] for h in halves} | {whole[n]["q_feat"].shape[1:]}
        assert len(shapes) == 1, (n, shapes)
        longest = np.maximum(whole[n]["q_len"], whole[n]["k_len"])
        differ += -(-longest[:4].max() // 16) != -(-longest[4:].max() // 16)
    assert differ  # some batch whose halves alone would pad differently


@pytest.mark.parametrize("index, count", [(2, 2), (-1, 2), (0, 0), (0, -2)])
def test_a_process_outside_the_process_count_is_refused(dataset, index, count):
    """process_index 2 (or -1) of 2 loaded batches of padding rows alone; process_count 0 was a
    ZeroDivisionError, -2 a message about a batch of -4."""
    with pytest.raises(ValueError, match="must be from 0 to process_count - 1"):
        reader.batch_dataset(dataset, "train", batch_size=8, process_index=index, process_count=count)


def test_unfinished_dataset_is_explained(tmp_path):
    (tmp_path / "work").mkdir()
    with pytest.raises(FileNotFoundError, match="an unfinished dataset: `pfamalign prepare` was stopped.*re-run the same command"):
        reader.PairDataset(tmp_path)


@pytest.mark.slow
def test_multiprocess_prefetch_state_restores(dataset):
    kw = dict(batch_size=4, seed=2, pad_multiple=32, with_strings=False)
    plain = reader.batch_iterator(dataset, "train", **kw)
    expected = [next(plain) for _ in range(6)]
    it = reader.batch_iterator(dataset, "train", worker_count=2, **kw)
    first = [next(it) for _ in range(3)]
    state = it.get_state()
    it.close()
    resumed = reader.batch_iterator(dataset, "train", worker_count=2, **kw)
    resumed.set_state(state)
    rest = [next(resumed) for _ in range(3)]
    resumed.close()
    for a, b in zip(expected, first + rest):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_an_array_record_write_that_fails_midway_leaves_nothing(tmp_path):
    """A producer that raises mid-file (an embedder error in a part) leaves neither the file nor
    its temporary behind, and the error reaches the caller."""
    from pfamalign.pipelines.records import count_array_record, write_array_record

    def failing():
        yield b"one"
        raise RuntimeError("embedder failed")

    with pytest.raises(RuntimeError, match="embedder failed"):
        write_array_record(tmp_path / "part.rec", failing())
    assert list(tmp_path.iterdir()) == []
    assert write_array_record(tmp_path / "part.rec", [b"one", b"two"]) == 2
    assert count_array_record(tmp_path / "part.rec") == 2 and len(list(tmp_path.iterdir())) == 1


def test_a_full_disk_under_an_array_record_writer_is_an_unwritable_output(small_disk):
    """ArrayRecord reports a failed write(2) as RuntimeError("write() failed: No space left on
    device; ..."): prepare ended in a traceback. It is now the OSError a command turns into one
    line naming the file, and no temporary is left."""
    from pfamalign.outputs import UnwritableOutput
    from pfamalign.pipelines import records

    path = small_disk / "part.array_record"
    with pytest.raises(UnwritableOutput) as caught:
        records.write_array_record(path, (b"x" * 4096 for _ in range(100)))
    assert str(caught.value) == f"cannot write {path}: No space left on device; free some space or write the output elsewhere"
    assert list(small_disk.iterdir()) == []


def test_array_record_errors_that_are_not_about_writing_pass_unchanged():
    from pfamalign.pipelines import records

    other = RuntimeError("Invalid argument: bad options")
    assert records._system_error(other, pathlib.Path("x")) is other


def test_select_pairs_keeps_max_len_and_spreads_its_picks():
    """``max_len`` keeps a pair whose longer sequence is exactly that long; ``max_pairs`` picks
    evenly spaced records across the stored order (families are stored one after another), not
    the first ones."""
    assert reader.select_pairs([[160, 1], [161, 2], [100, 160]], max_len=160).tolist() == [0, 2]
    assert reader.select_pairs(np.full((100, 2), 50), max_pairs=5).tolist() == [0, 25, 50, 74, 99]
