"""The batched alignment engine against its simple reference path.

* The two fast pair-HMM engines, ``pairhmm_batched`` (scaled linear-space forward-backward,
  jitted, padded batches) and ``pairhmm_numba`` (the same, compiled per pair), against
  ``pairhmm.match_posteriors`` (log space, numpy, one pair): equal to float64 rounding.
* ``Predictor.align_records`` (length buckets, padded batch sizes) against
  ``Predictor.align`` (one pair, its own plan call, the numpy pair-HMM): the same alignments.
* Symmetry: swapping the sequences transposes the alignment and keeps the score.
* Bounded shapes, error order, provenance, the compile cache, plot formats.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from pfamalign import compile_cache
from pfamalign.alignment import pairhmm
from pfamalign.alignment.pairhmm import PairHMM, PairHMMMixture, default_pairhmm, match_posteriors
from pfamalign.alignment import pairhmm_numba
from pfamalign.alignment.pairhmm_batched import batched_match_posteriors
from pfamalign.decoding import MAX_PLAN_POWER

AA = "ACDEFGHIKLMNPQRSTVWY"


def _random_seq(rng, n, odd=False):
    letters = AA + ("XBZU" if odd else "")
    return "".join(rng.choice(list(letters), n))


def _single_hmm() -> PairHMM:
    shipped = default_pairhmm()
    return shipped.components[-1] if isinstance(shipped, PairHMMMixture) else shipped


def _one_gap_type_hmm() -> PairHMM:
    base = _single_hmm()
    return PairHMM(pair_probs=base.pair_probs, background=base.background, gap_open=[0.03],
                   gap_extend=[0.001], gap_switch=0.0)  # tiny extension: the scan must not overflow


def _mixture() -> PairHMMMixture:
    return PairHMMMixture(components=[_single_hmm(), _one_gap_type_hmm()], prior=[0.7, 0.3])


# each engine on a list of pairs: the XLA one on a rectangular padding longer than needed
ENGINES = {"xla": lambda hmm, pairs, **kw: batched_match_posteriors(hmm, pairs, 64, 96, **kw),
           "numba": pairhmm_numba.match_posteriors_many}


@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("hmm", [default_pairhmm(), _single_hmm(), _mixture()], ids=["shipped", "single", "mixture"])
def test_forward_only_log_likelihood_ratios_equal_the_reference(hmm, local):
    rng = np.random.default_rng(1)
    pairs = [(_random_seq(rng, la, odd=True), _random_seq(rng, lb)) for la, lb in
             [(1, 1), (1, 50), (63, 2), (40, 40), (300, 280)]]
    got = pairhmm_numba.log_likelihood_ratios(hmm, pairs, local=local)
    ref = [pairhmm.log_likelihood_ratio(hmm, a, b, local=local) for a, b in pairs]
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    assert len(set(np.round(got, 6))) == len(pairs)  # not one value for all


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("hmm", [default_pairhmm(), _single_hmm(), _one_gap_type_hmm(), _mixture()],
                         ids=["shipped", "single", "one_gap_type", "mixture"])
def test_fast_posteriors_equal_the_reference(hmm, local, engine):
    rng = np.random.default_rng(0)
    pairs = [(_random_seq(rng, la, odd=True), _random_seq(rng, lb)) for la, lb in
             [(1, 1), (1, 50), (63, 2), (40, 40), (64, 64), (17, 55)]]
    out = ENGINES[engine](hmm, pairs, local=local)
    for (a, b), post in zip(pairs, out):
        ref = match_posteriors(hmm, a, b, local=local)
        assert post.shape == ref.shape == (len(a), len(b))
        np.testing.assert_allclose(post, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
@pytest.mark.parametrize("hmm", [_single_hmm(), _mixture()], ids=["single", "mixture"])
def test_fast_posteriors_of_given_emission_tables_equal_the_reference(hmm, local, engine):
    """The plan pair-HMM's path: one table per pair (the XLA engine's padding neutral)."""
    rng = np.random.default_rng(1)
    pairs = [(_random_seq(rng, la), _random_seq(rng, lb)) for la, lb in [(1, 1), (63, 2), (40, 40), (17, 55)]]
    tables = [pairhmm.plan_log_odds(rng.dirichlet(np.ones(len(b)), len(a)), 0.3) for a, b in pairs]
    out = ENGINES[engine](hmm, pairs, local=local, log_emissions=tables)
    for (a, b), table, post in zip(pairs, tables, out):
        np.testing.assert_allclose(post, match_posteriors(hmm, a, b, local=local, log_emissions=table),
                                   rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="emission tables"):
        ENGINES[engine](hmm, pairs, log_emissions=tables[:2])
    with pytest.raises(ValueError, match="shape"):  # a table that is not the pair's
        ENGINES[engine](hmm, pairs[:1], log_emissions=[np.zeros((2, 1))])
    huge = [np.full((len(a), len(b)), 800.0) for a, b in pairs[:1]]  # exp overflows: NaN before
    with pytest.raises(ValueError, match="within"):
        ENGINES[engine](hmm, pairs[:1], log_emissions=huge)
    # the largest odds the plan pair-HMM can give (MAX_PLAN_POWER, a plan entry at its floor)
    extreme = [pairhmm.plan_log_odds(np.zeros((len(a), len(b))), MAX_PLAN_POWER) for a, b in pairs[:1]]
    assert np.all(np.isfinite(ENGINES[engine](hmm, pairs[:1], log_emissions=extreme)[0]))


@pytest.mark.parametrize("engine", ENGINES)
def test_fast_posteriors_reject_empty_sequences(engine):
    with pytest.raises(ValueError, match="non-empty"):
        ENGINES[engine](default_pairhmm(), [("MKV", "MK"), ("", "A")])


def test_no_pairs_have_no_log_likelihood_ratios():
    for hmm in (_single_hmm(), _mixture()):
        assert pairhmm_numba.log_likelihood_ratios(hmm, []).shape == (0,)


def test_batched_posteriors_reject_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        batched_match_posteriors(default_pairhmm(), [("A" * 70, "A")], 64, 64)


@pytest.mark.parametrize("local", [False, True])
def test_batched_posteriors_of_a_short_key_on_a_wide_lattice_equal_the_reference(local):
    """A 300-residue query against a 3-residue key, padded to 320 x 320 (the square pads that
    ``hmm_posteriors`` uses): with short gaps (extend 0.05) the padded cells' mass grows about
    20-fold a column; unless zeroed it drove the real cells of every rescaled row to underflow
    and the posteriors to NaN."""
    base = _single_hmm()
    hmm = PairHMM(base.pair_probs, base.background, [0.02], [0.05], 0.1)
    rng = np.random.default_rng(0)
    a, b = _random_seq(rng, 300), "MKV"
    (post,) = batched_match_posteriors(hmm, [(a, b)], 320, 320, local=local)
    np.testing.assert_allclose(post, match_posteriors(hmm, a, b, local=local), rtol=1e-8, atol=1e-12)


def test_numba_posteriors_of_long_pairs_stay_finite():
    """Rows scaled through the transitions: 1,500 rows of strong or weak emissions would leave
    float64's range unscaled (e^(+-5) per row); the posteriors of the reference come back."""
    rng = np.random.default_rng(7)
    a = _random_seq(rng, 1500)
    for b in (a, _random_seq(rng, 40)):  # identical (emissions up to e^5 a row), unrelated
        (post,) = pairhmm_numba.match_posteriors_many(_single_hmm(), [(a, b)])
        np.testing.assert_allclose(post, match_posteriors(_single_hmm(), a, b), rtol=1e-8, atol=1e-12)


def test_padded_shapes_are_few_and_fit():
    from pfamalign.inference import BATCH_SIZES, padded_batch
    from pfamalign.resources import padded_length

    lengths = {padded_length(n) for n in range(1, 4097)}
    assert len(lengths) <= 22 and all(padded_length(n) >= n for n in range(1, 4097))
    top = BATCH_SIZES[-1]
    assert all(padded_batch(n) in BATCH_SIZES and padded_batch(n) >= n for n in range(1, top + 1))
    assert padded_batch(top + 1) == 2 * top  # beyond the largest: a multiple of it


@pytest.fixture(scope="module")
def predictor():
    from pfamalign.inference import Predictor

    return Predictor()


def _records(pairs):
    return [{"q_id": f"a{n}", "k_id": f"b{n}", "q_seq": a, "k_seq": b} for n, (a, b) in enumerate(pairs)]


def _assert_same(rec, aln, pp, ref_pp):
    np.testing.assert_array_equal(rec.pairs, aln.pairs)
    np.testing.assert_allclose(rec.confidence, aln.confidence, rtol=1e-4, atol=1e-5)
    assert rec.score == pytest.approx(aln.score, rel=1e-5)
    np.testing.assert_allclose(pp.plan, ref_pp.plan, atol=1e-5)  # float32 plans, other padding


PLAN_HMM = {"decoder": "posterior", "alpha": 0.5, "objective": "f1", "plan_power": 0.05}


@pytest.mark.parametrize("decoding", [None, PLAN_HMM, {**PLAN_HMM, "alpha": 1.0, "mode": "local"}],
                         ids=["model", "plan_hmm", "plan_hmm_only_local"])
def test_align_records_equal_the_reference_path(predictor, decoding):
    from pfamalign.decoding import DecoderSettings

    decoding = decoding and DecoderSettings(**decoding)
    rng = np.random.default_rng(1)
    base = _random_seq(rng, 50)
    pairs = [(base, base[3:47]), (base[:30], _random_seq(rng, 35))]  # one batch of 2 (plans and pair-HMMs)
    out = list(predictor.align_records(_records(pairs), decoding))
    assert [r.id_a for r, _ in out] == ["a0", "a1"]  # input order
    for (a, b), (rec, pp) in zip(pairs, out):
        aln, ref_pp = predictor.align(a, b, decoding)
        _assert_same(rec, aln, pp, ref_pp)


def test_align_records_over_several_batches_and_buckets(predictor):
    """Three length buckets, one of them two batches: the pair-HMM of each batch runs on a
    worker thread ahead of its plans; every pair equals the reference path, in input order."""
    rng = np.random.default_rng(4)
    pairs = []
    for n in range(14):
        length = [30, 100, 150][n % 3] if n < 6 else 40  # buckets 64, 128, 192; eight more of 64
        a = _random_seq(rng, length)
        pairs.append((a, a[2:] + _random_seq(rng, 3)))
    out = list(predictor.align_records(_records(pairs)))
    assert [r.id_a for r, _ in out] == [f"a{n}" for n in range(len(pairs))]
    for (a, b), (rec, pp) in zip(pairs, out):
        aln, ref_pp = predictor.align(a, b)
        _assert_same(rec, aln, pp, ref_pp)


def test_a_query_met_in_every_batch_is_encoded_once(monkeypatch):
    """A search's shape (one query, subjects over three batches of one bucket, the query
    also a subject): the query is encoded in the first batch only, every sequence once, and
    every pair equals the reference path."""
    from pfamalign.inference import Predictor
    from pfamalign.model import FrozenAligner

    predictor = Predictor()
    encoded = []
    encodings = FrozenAligner.encodings
    monkeypatch.setattr(FrozenAligner, "encodings",
                        lambda self, feat, lens: encoded.extend(np.asarray(lens)) or encodings(self, feat, lens))
    rng = np.random.default_rng(9)
    query = _random_seq(rng, 45)
    subjects = [query[n:] + _random_seq(rng, n) for n in range(1, 18)] + [query]
    out = list(predictor.align_records([{"q_id": "q", "k_id": f"s{n}", "q_seq": query, "k_seq": s}
                                        for n, s in enumerate(subjects)]))
    assert len(out) == 18 and predictor.shapes == {(8, 64), (2, 64)}  # three batches
    real = [n for n in encoded if n > 1]  # padding slots of a chunk have length 1
    assert sorted(real) == sorted(len(s) for s in subjects[:-1]) + [45]  # the query once, as itself
    # looked up once per batch: the query found in the second and third batches
    assert (predictor.encodings.hits, predictor.encodings.misses, len(predictor.encodings)) == (2, 18, 18)
    for s, (rec, pp) in zip(subjects, out):
        aln, ref_pp = predictor.align(query, s)
        _assert_same(rec, aln, pp, ref_pp)


def test_the_encoding_cache_keeps_the_most_recent_within_its_bytes():
    from pfamalign.inference import EncodingCache

    cache = EncodingCache(max_bytes=3 * 400)
    feats = [np.full((5, 2), n, np.float32) for n in range(4)]
    keys = [EncodingCache.key(f, 8) for f in feats]
    assert EncodingCache.key(feats[0], 16) != keys[0]  # another padded length, another entry
    assert EncodingCache.key(feats[0].copy(), 8) == keys[0]  # by content
    for key in keys[:3]:
        cache.put(key, np.zeros(100, np.float32))  # 400 bytes each
    assert cache.get(keys[0]) is not None  # now the most recent
    cache.put(keys[3], np.zeros(100, np.float32))  # evicts the least recent: keys[1]
    assert cache.get(keys[1]) is None and cache.get(keys[2]) is not None and cache.get(keys[3]) is not None
    assert len(cache) == 3 and cache.bytes == 1200
    cache.put(keys[1], np.zeros(1000, np.float32))  # larger than the whole cache: not kept
    assert cache.get(keys[1]) is None and cache.bytes == 1200


def test_a_pair_hmm_failure_on_the_worker_reaches_the_caller(predictor, monkeypatch):
    calls = []

    def failing(seq_pairs, mode="global"):
        calls.append(threading.current_thread().name)
        raise RuntimeError("pair-HMM failed")

    monkeypatch.setattr(predictor, "hmm_posteriors", failing)
    with pytest.raises(RuntimeError, match="pair-HMM failed"):
        list(predictor.align_records(_records([("MKVLA", "MKVA"), ("GSHMK", "GSMK")])))
    assert calls and all(name.startswith("pfamalign-pairhmm") for name in calls)  # on its worker


def test_a_plan_failure_on_the_worker_reaches_the_caller(predictor, monkeypatch):
    """Plans are computed on a worker thread of their own, a batch ahead of the decoding;
    when they fail, the window's pair-HMM work has ended before the error reaches the caller
    (nothing keeps running behind a failed call)."""
    import time

    calls, hmm_work = [], []
    real_posteriors = predictor.hmm_posteriors
    under_way = threading.Event()

    def failing(batch, **kw):
        calls.append(threading.current_thread().name)
        under_way.wait(30)  # the pair-HMM work has started (else close() may cancel it unstarted)
        raise RuntimeError("plan failed")

    def slow_posteriors(seq_pairs, **kw):
        hmm_work.append("started")
        under_way.set()
        time.sleep(0.5)
        out = real_posteriors(seq_pairs, **kw)
        hmm_work.append("ended")
        return out

    monkeypatch.setattr(predictor, "_plan_batch", failing)
    monkeypatch.setattr(predictor, "hmm_posteriors", slow_posteriors)
    with pytest.raises(RuntimeError, match="plan failed"):
        list(predictor.align_records(_records([("MKVLA", "MKVA"), ("GSHMK", "GSMK")])))
    assert calls and all(name.startswith("pfamalign-plans") for name in calls)
    assert hmm_work == ["started", "ended"]


def test_a_window_of_many_pairs_takes_the_numba_engine(predictor, monkeypatch):
    """``BULK_PAIRS`` pairs in one window: their pair-HMM runs on the numba engine (fewer: on
    the XLA one until numba has started), and the alignments equal the reference path's."""
    from pfamalign.alignment import numba_jit

    calls = {"numba": 0, "xla": 0}
    real_numba, real_xla = pairhmm_numba.match_posteriors_many, batched_match_posteriors

    def numba_spy(hmm, pairs, **kw):
        calls["numba"] += len(pairs)
        return real_numba(hmm, pairs, **kw)

    def xla_spy(hmm, pairs, *args, **kw):
        calls["xla"] += 1
        return real_xla(hmm, pairs, *args, **kw)

    monkeypatch.setattr(pairhmm_numba, "match_posteriors_many", numba_spy)
    monkeypatch.setattr("pfamalign.alignment.pairhmm_batched.batched_match_posteriors", xla_spy)
    rng = np.random.default_rng(8)
    pairs = [(_random_seq(rng, 20 + n), _random_seq(rng, 30)) for n in range(numba_jit.BULK_PAIRS)]
    out = list(predictor.align_records(_records(pairs)))
    assert calls == {"numba": len(pairs), "xla": 0}
    for (a, b), (rec, pp) in list(zip(pairs, out))[:3]:
        aln, ref_pp = predictor.align(a, b)
        _assert_same(rec, aln, pp, ref_pp)
    monkeypatch.setattr(numba_jit, "_started", False)  # a fresh process, two pairs
    list(predictor.align_records(_records(pairs[:2])))
    assert calls == {"numba": len(pairs), "xla": 1}


_NUMBA_CACHED = """
from pfamalign.alignment import decode, pairhmm_numba
from pfamalign.alignment.decode import mea_decode_many
from pfamalign.alignment.pairhmm import default_pairhmm
posts = pairhmm_numba.match_posteriors_many(default_pairhmm(), [("MKVLA", "MKIV")])  # starts numba
mea_decode_many(posts)
for kernel in (pairhmm_numba._kernel(2), *decode._compiled_dp()):
    print(sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values()))
"""


def test_a_second_process_loads_the_numba_kernels_from_the_cache(tmp_path):
    """The pair-HMM kernel and the DP's two: compiled and written by the first process, read
    by the second (numba keys a closure's entries by what it captured: a kernel that
    captured another kernel would miss every time)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    runs = [subprocess.run([sys.executable, "-c", _NUMBA_CACHED], env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    first, second = ([tuple(map(int, line.split())) for line in r.stdout.splitlines()] for r in runs)
    assert first == [(0, 1)] * 3 and second == [(1, 0)] * 3, [r.stderr[-500:] for r in runs]


_GAP_VARIANTS = """
import dataclasses, sys
from pfamalign.alignment import pairhmm_numba
from pfamalign.alignment.pairhmm import default_pairhmm
full = default_pairhmm().components[0]
one = dataclasses.replace(full, gap_open=full.gap_open[:1], gap_extend=full.gap_extend[:1])
for hmm in [{"1": one, "2": full}[g] for g in sys.argv[1:]]:
    post = pairhmm_numba.match_posteriors_many(hmm, [("MKVLAAGIVGLLLAWE", "MKVLSAGIVGLAWE")])[0]
    kernel = pairhmm_numba._kernel(hmm.n_gap_types)
    (compiled,) = kernel.overloads.values()
    print(hmm.n_gap_types, sum(kernel.stats.cache_hits.values()), compiled.fndesc.unique_name, repr(post.sum()))
"""


def test_kernel_variants_compiled_by_two_processes_load_into_one_apart(tmp_path):
    """The pair-HMM kernel per gap count, each compiled by its own process, then both read from
    the disk cache by a third: numba names a kernel by its qualified name and a per-process
    counter, so without the variant in the name the two shared their symbols' and environment's
    names ("descr is NULL" at the return)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def run(*gaps):
        out = subprocess.run([sys.executable, "-c", _GAP_VARIANTS, *gaps], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return [line.split() for line in out.stdout.splitlines()]

    alone = run("1") + run("2")
    both = run("1", "2")
    assert [row[1] for row in alone] == ["0", "0"] and [row[1] for row in both] == ["1", "1"]  # from the cache
    assert both[0][2] != both[1][2]  # two names
    assert [row[3] for row in both] == [row[3] for row in alone]  # and each its own kernel's result


def test_without_a_writable_cache_numba_kernels_still_compile(monkeypatch):
    import numba.core.caching

    from pfamalign.alignment import numba_jit

    def nowhere(self, py_func):
        raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")

    monkeypatch.setattr(numba.core.caching.FunctionCache, "__init__", nowhere)
    monkeypatch.setattr(numba_jit, "_started", numba_jit._started)  # restored afterwards

    @numba_jit.njit()
    def twice(x):
        return 2 * x

    assert twice(21) == 42 and numba_jit.started()


def test_threads_asking_at_once_share_one_kernel():
    """The pair-HMM pool's first tasks all ask for the kernel: one is built (two dispatchers
    once compiled the same kernel twice)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from pfamalign.alignment import numba_jit

    built = []

    @numba_jit.kernel_factory
    def make(n):
        time.sleep(0.05)  # long enough for every thread to ask before the first is done
        built.append(n)
        return object()

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(make, [2, 2, 2, 2, 1]))
    assert sorted(built) == [1, 2] and len({id(k) for k in got[:4]}) == 1 and got[4] is not got[0]


def test_the_cli_keeps_numba_kernels_in_its_cache_directory(tmp_path):
    show = "from pfamalign import compile_cache; import os; compile_cache.enable(); print(os.environ['NUMBA_CACHE_DIR'])"

    def numba_dir(**env):
        base = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        return subprocess.run([sys.executable, "-c", show], env={**base, **env}, capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()

    assert numba_dir(**{compile_cache.ENV: str(tmp_path / "c")}) == str(tmp_path / "c" / "numba")
    mine = str(tmp_path / "mine")  # the user's own choice wins
    assert numba_dir(**{compile_cache.ENV: str(tmp_path / "c"), "NUMBA_CACHE_DIR": mine}) == mine


def test_a_damaged_numba_cache_entry_is_compiled_again(tmp_path):
    """numba's loader raises on a damaged entry (EOFError for an empty index, which click
    printed as "Aborted!", UnpicklingError for garbage) in every later process; the entry is
    dropped and the kernel compiled, and the next process loads the rewritten entry."""
    (tmp_path / "kern.py").write_text("from pfamalign.alignment.numba_jit import njit\n\n\n"
                                      "@njit()\ndef twice(x):\n    return 2 * x\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kern; "
            "print(kern.twice(21), sum(kern.twice.stats.cache_hits.values()))")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "nc")}

    def run():
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert run() == ["42", "0"] and run() == ["42", "1"]  # compiled, then loaded
    (index,) = (tmp_path / "nc").rglob("*.nbi")
    (data,) = (tmp_path / "nc").rglob("*.nbc")
    whole = index.read_bytes()
    for damaged, content in ((index, b""), (index, whole[:len(whole) // 2]), (index, b"garbage" * 20),
                             (data, b""), (data, b"garbage" * 20)):
        damaged.write_bytes(content)
        assert run() == ["42", "0"], (damaged.suffix, content[:10])  # compiled again
        assert run() == ["42", "1"]  # and written again


@pytest.mark.slow
def test_align_records_equal_the_reference_on_pfam_pairs(predictor, shared_pfam):
    from pfamalign import inputs

    sto = sorted((shared_pfam / "hmmalign_stockholm").glob("*.sto"))
    seqs = []
    for path in sto[:5]:
        ids = [line.split()[0] for line in path.read_text().splitlines()
               if line and not line.startswith(("#", "//"))][:3]
        seqs += [inputs.pair_from_stockholm(path, ids[0], ids[1])["q_seq"],
                 inputs.pair_from_stockholm(path, ids[1], ids[2])["k_seq"]]
    rng = np.random.default_rng(2)
    pairs = [(seqs[i], seqs[j]) for i, j in rng.integers(0, len(seqs), (24, 2))]
    for (a, b), (rec, pp) in zip(pairs, predictor.align_records(_records(pairs), window=16)):
        aln, ref_pp = predictor.align(a, b)
        _assert_same(rec, aln, pp, ref_pp)


def test_unpadding_both_directions_at_once_is_symmetrize_bit_for_bit():
    from pfamalign.plans import symmetrize, unpad, unpad_symmetric

    rng = np.random.default_rng(11)
    ab, ba = (rng.random((4, 65, 65)).astype(np.float32) for _ in range(2))
    lq, lk = np.array([64, 1, 30, 64]), np.array([64, 50, 1, 7])
    fused = unpad_symmetric(ab, ba, lq, lk)
    for got, p, q in zip(fused, unpad(ab, lq, lk), unpad(ba, lk, lq)):
        np.testing.assert_array_equal(got.plan, symmetrize(p, q).plan)
        assert got.plan.shape == p.plan.shape and got.plan.dtype == np.float64
    # the dustbin lines are the padded plan's last ones
    np.testing.assert_array_equal(unpad(ab, lq, lk)[2].plan[-1], np.r_[ab[2, -1, :1], ab[2, -1, -1]])


def test_swapping_the_sequences_transposes_the_alignment(predictor):
    rng = np.random.default_rng(3)
    a = _random_seq(rng, 45)
    b = a[:20] + _random_seq(rng, 6) + a[24:]
    (ab, pp_ab), (ba, pp_ba) = predictor.align_records(_records([(a, b), (b, a)]))  # shapes as above
    np.testing.assert_array_equal(ab.pairs, ba.pairs[:, ::-1])
    assert ab.score == pytest.approx(ba.score, rel=1e-12)
    np.testing.assert_array_equal(pp_ab.plan, pp_ba.plan.T)
    # the model alone is asymmetric: the one-direction plans differ beyond rounding
    fa, fb = predictor.featurize([a, b])
    one_ab, one_ba = predictor.plans([(fa, fb), (fb, fa)])
    assert np.abs(one_ab.real - one_ba.real.T).max() > 1e-3


def test_align_records_yields_the_pairs_before_a_bad_one(predictor):
    recs = _records([("MKV", "MKIV"), ("MKV", "M" * (predictor.max_length + 1)), ("MK", "MK")])
    recs[1]["where"] = "pairs.tsv:2"
    stream = predictor.align_records(recs)
    assert next(stream)[0].id_a == "a0"
    with pytest.raises(ValueError, match="^pairs.tsv:2: sequence of"):
        next(stream)


def test_provenance_is_written_by_every_format_that_has_room(predictor):
    from pfamalign.alignment.formats import format_alignment

    rec, _ = next(predictor.align_records(_records([("MKVLAAGIVG", "MKVLSAGIVG")] * 2)))
    prov = predictor.provenance()
    assert prov["model"].startswith("align_ce (shipped) sha256:") and prov["decoder"]["name"] == "posterior"
    assert prov["version"].startswith("pfamalign ")
    text = format_alignment(rec, "pair", provenance=prov)
    assert f"# Model: {prov['model']}" in text and "# Decoder: name=posterior" in text
    assert "# Aligned_region: a0 1-10, b0 1-10 (1-based inclusive)" in text
    sto = format_alignment(rec, "stockholm", provenance=prov)
    assert f"#=GF CC Model: {prov['model']}" in sto and "#=GF CC Version: pfamalign" in sto
    doc = json.loads(format_alignment(rec, "json", provenance=prov))
    assert doc["provenance"] == json.loads(json.dumps(prov)) and "0-based" in doc["coordinates"]


def test_model_hash_follows_the_parameter_bytes_and_the_config(tmp_path):
    from pfamalign.inference import default_model_dir, model_content_hash

    copy = tmp_path / "model"
    shutil.copytree(default_model_dir(), copy)
    hmm = default_pairhmm()
    assert model_content_hash(copy, hmm) == model_content_hash(default_model_dir(), hmm)
    victim = max((f for f in (copy / "params").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    assert model_content_hash(copy, hmm) != model_content_hash(default_model_dir(), hmm)
    assert model_content_hash(default_model_dir(), _one_gap_type_hmm()) != model_content_hash(default_model_dir(), hmm)
    # the config too: another eps is another plan, so other exported programs
    shutil.rmtree(copy)
    shutil.copytree(default_model_dir(), copy)
    config = json.loads((copy / "config.json").read_text())
    config["model"]["transport"]["eps"] *= 2
    (copy / "config.json").write_text(json.dumps(config))
    assert model_content_hash(copy, hmm) != model_content_hash(default_model_dir(), hmm)


def test_model_hash_reads_its_files_in_chunks(tmp_path):
    """It read each parameter file whole: a model whose params/ held a 5 GB (sparse) file,
    recorded in its checksums, took 5 GB to align. A sparse 1 GiB file now hashes in bounded
    memory (a fresh process's peak), to the digest of its bytes."""
    import hashlib
    import subprocess
    import sys

    model = tmp_path / "model"
    (model / "params").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "params" / "small").write_bytes(b"abc")
    with open(model / "params" / "huge", "wb") as f:
        f.truncate(1 << 30)
    # VmHWM, this process's own peak (ru_maxrss keeps the forking pytest worker's across exec)
    probe = ("import re, sys; from pfamalign.alignment.pairhmm import default_pairhmm; "
             "from pfamalign.inference import model_content_hash; "
             "print(model_content_hash(sys.argv[1], default_pairhmm()), "
             "re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")
    proc = subprocess.run([sys.executable, "-c", probe, str(model)], capture_output=True, text=True, timeout=300)
    got, peak_kib = proc.stdout.split()
    assert int(peak_kib) < 800 << 10, peak_kib  # reading the file whole: over 1.2 GiB
    want = hashlib.sha256(b"config.json\x002\x00{}")
    want.update(f"params/huge\0{1 << 30}\0".encode())
    for _ in range(1 << 10):
        want.update(bytes(1 << 20))
    want.update(b"params/small\x003\x00abc")
    want.update(default_pairhmm().to_json().encode())
    assert got == "sha256:" + want.hexdigest()[:16]


# ---- compile cache -------------------------------------------------------------------------

def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "c"))
    assert compile_cache.cache_dir() == tmp_path / "c"
    monkeypatch.setenv(compile_cache.ENV, "")
    assert compile_cache.cache_dir() is None and compile_cache.enable() is None
    monkeypatch.delenv(compile_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform != "darwin":
        assert compile_cache.cache_dir() == tmp_path / "xdg" / "pfamalign"


def test_without_a_home_or_a_writable_directory_the_cache_is_off(monkeypatch, tmp_path, capsys):
    """No $HOME and no passwd entry (a container's arbitrary uid: ``Path.home()`` raises), or a
    cache directory that cannot be made or written: the cache is off with one warning, and
    the command runs (every command, --help too, failed in ``Path.home()``)."""
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def homeless():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(pathlib.Path, "home", staticmethod(homeless))
    assert compile_cache.cache_dir() is None and compile_cache.enable() is None
    assert "no home directory to keep the compile cache in" in capsys.readouterr().err
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # no home needed then
    assert compile_cache.cache_dir() == tmp_path / "xdg" / "pfamalign"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "file" / "cache"))  # under a file: cannot be made
    assert compile_cache.cache_dir() is None
    assert f"the cache directory {tmp_path / 'file' / 'cache'} cannot be made" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_cache_directory_others_can_write_is_not_used(monkeypatch, tmp_path, capsys):
    """What the cache holds runs as this process (compiled executables, numba's pickled
    kernels): one that another user can write to (the folder or one in it, where the files
    live), or that belongs to another, is not used."""
    shared = tmp_path / "shared"
    (shared / "programs").mkdir(parents=True)
    monkeypatch.setenv(compile_cache.ENV, str(shared))

    def cache_dir():
        compile_cache._others_can_write.cache_clear()  # checked once a process: here, each time
        return compile_cache.cache_dir()

    shared.chmod(0o700)
    assert cache_dir() == shared
    shared.chmod(0o777)
    assert cache_dir() is None and compile_cache.enable() is None
    assert f"the cache directory {shared} is writable by other users" in capsys.readouterr().err
    shared.chmod(0o755)
    (shared / "programs").chmod(0o777)  # the top folder made private, as advised, but not below it
    assert cache_dir() is None
    assert "writable by other users (its folder programs)" in capsys.readouterr().err
    (shared / "programs").chmod(0o700)
    shared.chmod(0o770)  # group-writable: safe only where the group is the user's own
    monkeypatch.setattr(compile_cache, "_shared_group", lambda gid: False)
    assert cache_dir() == shared
    monkeypatch.setattr(compile_cache, "_shared_group", lambda gid: True)
    assert cache_dir() is None
    shared.chmod(0o700)
    monkeypatch.setattr(os, "getuid", lambda: shared.stat().st_uid + 1)
    assert cache_dir() is None
    assert "belongs to another user" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_only_the_users_private_group_counts_as_the_user(monkeypatch):
    """A group is the user's alone only when named after the user, with no other member,
    listed or by primary group (users whose primary group it is are not in its member list:
    "users", "nogroup")."""
    import grp
    import pwd
    import types

    me = types.SimpleNamespace(pw_name="ann", pw_uid=1000, pw_gid=1000)
    users = [me, types.SimpleNamespace(pw_name="bob", pw_uid=1001, pw_gid=100)]
    groups = {1000: ("ann", []), 100: ("users", []), 1002: ("ann", ["bob"])}
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: me)
    monkeypatch.setattr(pwd, "getpwall", lambda: users)
    monkeypatch.setattr(grp, "getgrgid", lambda gid: types.SimpleNamespace(
        gr_name=groups[gid][0], gr_mem=groups[gid][1]))
    assert not compile_cache._shared_group(1000)
    assert compile_cache._shared_group(100)  # bob's primary group, no member listed
    assert compile_cache._shared_group(1002)
    users.append(types.SimpleNamespace(pw_name="cy", pw_uid=1003, pw_gid=1000))
    assert compile_cache._shared_group(1000)


def test_exported_programs_of_the_least_recently_used_models_are_removed(monkeypatch, tmp_path):
    """Each model's programs (about 2 MB a padded length, parameters baked in) stayed in the
    cache forever: a sweep over many models filled it. The PROGRAM_DIRS most recently used
    models' directories are kept; reading a program refreshes its model's age."""
    import os

    import jax
    import jax.numpy as jnp

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "c"))
    export = lambda: jax.export.export(jax.jit(lambda x: x + 1.0))(  # noqa: E731
        jax.ShapeDtypeStruct((2,), jnp.float32)).serialize()
    n, blob = compile_cache.PROGRAM_DIRS, export()
    for k in range(n + 3):  # programs of n + 3 models, model 0 the oldest
        path = compile_cache.program_path(f"model{k}", "plans")
        path.parent.mkdir(parents=True)
        path.write_bytes(compile_cache._sealed(blob))
        os.utime(path.parent, (1000 + k, 1000 + k))
    compile_cache.exported_program(compile_cache.program_path("model0", "plans"), export)  # a read: used now
    compile_cache.exported_program(compile_cache.program_path("new", "plans"), export)  # a write: the eviction
    kept = {d.name for d in (tmp_path / "c" / "programs").iterdir()}
    assert len(kept) == n and {"new", "model0", f"model{n + 2}"} <= kept
    assert not {"model1", "model2", "model3", "model4"} & kept


_COMPILE_ONCE = """
from pfamalign import compile_cache
compile_cache.enable()
import jax, jax.numpy as jnp
counter = compile_cache.CompileCounter()
jax.jit(lambda x: jnp.cumsum(x * 2.0 + 1.0))(jnp.arange(5.0)).block_until_ready()
print(counter.compiled, counter.cached)
"""


def _env(cache):
    return {**os.environ, compile_cache.ENV: str(cache), "JAX_PLATFORMS": "cpu"}


def test_a_second_process_compiles_nothing(tmp_path):
    runs = [subprocess.run([sys.executable, "-c", _COMPILE_ONCE], env=_env(tmp_path / "cache"),
                           capture_output=True, text=True, timeout=120) for _ in range(2)]
    (c1, h1), (c2, h2) = [tuple(map(int, r.stdout.split())) for r in runs]
    assert c1 >= 1 and h1 == 0
    assert c2 == 0 and h2 == c1
    entries = list((tmp_path / "cache").rglob("*-cache"))
    assert len(entries) == c1 and list((tmp_path / "cache").rglob(".lockfile"))  # jax's file lock is on


_API_ALIGN = """
import os
import jax, pfamalign
from pfamalign import compile_cache
if os.environ.get("OWN_CACHE"):  # the user's own jax cache, set before the aligner
    jax.config.update("jax_compilation_cache_dir", os.environ["OWN_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # every program, however quick
counter = compile_cache.CompileCounter()
pfamalign.PairAligner().align("MKVLAAGIVGLLLA", "MKVLSAGIVGLA")
print(counter.compiled, counter.cached)
"""


def test_a_second_python_api_process_compiles_nothing(tmp_path):
    """A ``PairAligner`` turns on the command line's compile cache (a second process loads what
    the first compiled), but keeps a jax cache the process set itself."""
    runs = [subprocess.run([sys.executable, "-c", _API_ALIGN], env=_env(tmp_path / "cache"),
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    (c1, h1), (c2, h2) = [tuple(map(int, r.stdout.split())) for r in runs]
    assert c1 >= 1 and c2 == 0 and h2 >= 1
    own = subprocess.run([sys.executable, "-c", _API_ALIGN], capture_output=True, text=True, timeout=300,
                         env={**_env(tmp_path / "other"), "OWN_CACHE": str(tmp_path / "own")})
    assert own.returncode == 0, own.stderr[-2000:]
    assert list((tmp_path / "own").rglob("*-cache")) and not list((tmp_path / "other").rglob("*-cache"))


@pytest.mark.slow
def test_processes_sharing_the_cache_at_once_leave_it_whole(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _COMPILE_ONCE], env=_env(tmp_path / "cache"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    after = subprocess.run([sys.executable, "-c", _COMPILE_ONCE], env=_env(tmp_path / "cache"),
                           capture_output=True, text=True, timeout=120)
    compiled, cached = map(int, after.stdout.split())
    assert compiled == 0 and cached >= 1  # every entry readable: none torn by the concurrent writers


@pytest.mark.slow
def test_a_second_align_command_compiles_nothing(tmp_path):
    argv = [sys.executable, "-m", "pfamalign.cli", "align", "-v", "MKVLAAGIVGLLLA", "MKVLSAGIVGLA"]
    runs = [subprocess.run(argv, env=_env(tmp_path / "cache"), capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert "programs compiled: 0," not in runs[0].stderr
    assert "programs compiled: 0, loaded from the compile cache: " in runs[1].stderr


# ---- exported plan programs -----------------------------------------------------------------

_WARM_ALIGN = """
import sys
from pfamalign.cli import main
main(["align", *sys.argv[1:], "MKVLAAGIVGLLLAQSPEDRWKNLTTGYFHAE", "MKVLSAGIVGLAQSPDRWKNLSTGYFAE"],
     standalone_mode=False)
print("imported:", " ".join(m for m in ("flax", "orbax.checkpoint", "numba") if m in sys.modules))
"""


@pytest.mark.parametrize("options", [[], ["--checkpoint", "default"]], ids=["default", "named"])
def test_a_warm_align_needs_neither_flax_nor_the_checkpoint(tmp_path, options):
    """Nor numba, whose start-up (0.4 s) is for jobs of many pairs (``numba_jit``); nor when
    the model is named (``--checkpoint``: the training record's name came from the checkpoint
    module, 0.3 s of imports)."""
    runs = [subprocess.run([sys.executable, "-c", _WARM_ALIGN, *options], env=_env(tmp_path / "cache"),
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    first, second = (r.stdout.rsplit("imported:", 1) for r in runs)
    assert first[1].split() == ["flax", "orbax.checkpoint"]  # the first run restores and exports
    assert second[1].split() == []  # the second runs the exported program
    assert first[0] == second[0]  # the same alignment, byte for byte
    programs = sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "programs").rglob("*.jaxexport"))
    assert programs == ["plans_both_ways", "posteriors"]  # one shape each: exported once, then read


def test_exported_plans_are_the_models(tmp_path, monkeypatch):
    from pfamalign.inference import Predictor, pad_batch

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))
    predictor = Predictor()
    rng = np.random.default_rng(5)
    pairs = [(_random_seq(rng, 40), _random_seq(rng, 55)), (_random_seq(rng, 60), _random_seq(rng, 12))]
    batch = pad_batch([tuple(predictor.featurize(pair)) for pair in pairs])
    assert predictor.programs.plans_both_ways(*batch) is None  # batches: through the model
    xq, xk, lq, lk = pad_batch([tuple(predictor.featurize(pairs[0]))])  # one pair
    exported = predictor.programs.plans_both_ways(xq, xk, lq, lk)
    model = predictor.model.plans_both_ways(xq, xk, lq, lk)
    for got, want in zip(exported, model):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)
    # a damaged file is exported again; a plan the scaling solve calls unsafe comes from the model
    (path,) = (tmp_path / "cache" / "programs").rglob("*.jaxexport")
    path.write_bytes(b"damaged")
    again = Predictor()
    assert again.programs.any()
    np.testing.assert_allclose(np.asarray(again.programs.plans_both_ways(xq, xk, lq, lk)[0]),
                               np.asarray(model[0]), atol=1e-6, rtol=0)
    assert path.read_bytes() != b"damaged"

    class Unsafe:  # an exported program whose solve left float32's range
        def call(self, *args):
            return (np.full_like(np.asarray(model[0]), np.nan), np.asarray(model[1])), np.array(False)

    again.programs._loaded[xq.shape[:2]] = Unsafe()
    np.testing.assert_array_equal(np.asarray(again.programs.plans_both_ways(xq, xk, lq, lk)[0]),
                                  np.asarray(model[0]))


def test_a_program_whose_bytes_changed_is_exported_again(monkeypatch, tmp_path):
    """A program's parameters are baked into its bytes: one changed there still deserializes
    and runs, computing something else (here the constant 3 read as 5). The file carries its
    SHA-256; one that does not match (or a file written before) is exported again."""
    import jax
    import jax.numpy as jnp

    export = lambda: jax.export.export(jax.jit(lambda x: x * 3.0))(  # noqa: E731
        jax.ShapeDtypeStruct((2,), jnp.float32)).serialize()
    path = tmp_path / "times3.jaxexport"
    np.testing.assert_array_equal(compile_cache.exported_program(path, export).call(jnp.ones(2)), [3, 3])
    data = bytearray(path.read_bytes())
    at = data.find(np.float32(3.0).tobytes())
    data[at:at + 4] = np.float32(5.0).tobytes()
    damaged = bytes(data)
    blob = damaged.rpartition(compile_cache._SEAL)[0]
    np.testing.assert_array_equal(jax.export.deserialize(bytearray(blob)).call(jnp.ones(2)), [5, 5])
    for on_disk in (damaged, blob):  # a changed byte; the bare blob of an older cache
        path.write_bytes(on_disk)
        np.testing.assert_array_equal(compile_cache.exported_program(path, export).call(jnp.ones(2)), [3, 3])
        rewritten = path.read_bytes()  # exported again: its seal holds
        assert rewritten != on_disk and compile_cache._unsealed(rewritten)


def test_the_frozen_programs_are_the_models(predictor):
    """``FrozenAligner`` (the model split once, plain ``jax.jit``): the model's encodings and
    plans of both directions, from features or from encodings; a replaced ``model.cfg``
    makes the ``Predictor`` split again."""
    import dataclasses

    from pfamalign.inference import pad_batch
    from pfamalign.model import FrozenAligner

    model = predictor.model
    frozen = FrozenAligner(model)
    rng = np.random.default_rng(10)
    pairs = [(_random_seq(rng, 40), _random_seq(rng, 55)), (_random_seq(rng, 60), _random_seq(rng, 12))]
    xq, xk, lq, lk = pad_batch([tuple(predictor.featurize(pair)) for pair in pairs])
    for side, lens in ((xq, lq), (xk, lk)):
        np.testing.assert_allclose(np.asarray(frozen.encodings(side, lens)),
                                   np.asarray(model.encodings(side, lens)), atol=1e-6, rtol=0)
    encoded = (np.asarray(model.encodings(xq, lq)), np.asarray(model.encodings(xk, lk)))
    for kw in ({}, {"encoded": encoded}):
        for got, want in zip(frozen.plans_both_ways(xq, xk, lq, lk, **kw), model.plans_both_ways(xq, xk, lq, lk, **kw)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)
    first = predictor._frozen()
    assert predictor._frozen() is first and first.matches(model)
    cfg = model.cfg
    try:
        model.cfg = dataclasses.replace(cfg)  # another transport setting, say: split again
        assert predictor._frozen() is not first and predictor._frozen().matches(model)
    finally:
        model.cfg = cfg


@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
def test_the_exported_pair_hmm_program_gives_the_reference_posteriors(tmp_path, monkeypatch, local):
    from pfamalign.alignment import pairhmm_batched

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))
    pairhmm_batched._exported.cache_clear()
    rng = np.random.default_rng(6)
    pairs = [(_random_seq(rng, 40), _random_seq(rng, 33)), (_random_seq(rng, 5), _random_seq(rng, 60))]
    hmm = default_pairhmm()
    for attempt in ("exports", "loads"):
        out = batched_match_posteriors(hmm, pairs, 64, 64, local=local)
        for (a, b), post in zip(pairs, out):
            np.testing.assert_allclose(post, match_posteriors(hmm, a, b, local=local), rtol=1e-9, atol=1e-12)
        (path,) = (tmp_path / "cache" / "programs" / "pairhmm").glob("*.jaxexport")
        if attempt == "exports":
            written = path.stat().st_mtime_ns
            pairhmm_batched._exported.cache_clear()  # as a new process: read it back
        else:
            assert path.stat().st_mtime_ns == written  # read, not exported again
    pairhmm_batched._exported.cache_clear()


def test_global_and_local_pair_hmm_programs_never_share_a_cache_entry(tmp_path, monkeypatch):
    """One cache directory, a global then a local pair-HMM of the same shape, each read back as
    a new process would: two exported programs, each mode's posteriors its own reference's
    (a key without the mode gave the local ones the global posteriors, 0.085 off)."""
    from pfamalign.alignment import pairhmm_batched

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))
    rng = np.random.default_rng(7)
    pairs = [(_random_seq(rng, 40), _random_seq(rng, 33))]
    hmm = default_pairhmm()
    try:
        for local in (False, True, False):
            pairhmm_batched._exported.cache_clear()
            (post,) = batched_match_posteriors(hmm, pairs, 64, 64, local=local)
            np.testing.assert_allclose(post, match_posteriors(hmm, *pairs[0], local=local), rtol=1e-9, atol=1e-12)
    finally:
        pairhmm_batched._exported.cache_clear()
    assert len(list((tmp_path / "cache" / "programs" / "pairhmm").glob("*.jaxexport"))) == 2


def test_threads_asking_for_one_pair_hmm_program_together_export_it_once(tmp_path, monkeypatch):
    """A mixture's components ask for their posteriors program on threads of their own: the
    same program is exported once, not once a thread."""
    import threading
    import time

    from pfamalign.alignment import pairhmm_batched

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))
    pairhmm_batched._exported.cache_clear()
    real, exports = compile_cache.exported_program, []

    def slow_export(path, export):
        exports.append(path)
        time.sleep(0.3)  # both threads arrive while the first exports
        return real(path, export)

    monkeypatch.setattr(compile_cache, "exported_program", slow_export)
    params = {k: np.asarray(v, np.float64) for k, v in _single_hmm().linear_transitions().items()}
    emit = np.ones((1, 64, 64))
    threads = [threading.Thread(target=pairhmm_batched._posteriors_program, args=(params, emit, False))
               for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        pairhmm_batched._exported.cache_clear()
    assert len(exports) == 1


def test_the_source_digest_follows_every_module(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 2\n")
    first = compile_cache.source_digest(tmp_path / "pkg")
    assert compile_cache.source_digest(tmp_path / "pkg") == first
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 3\n")  # an edit deep in the package
    edited = compile_cache.source_digest(tmp_path / "pkg")
    (tmp_path / "pkg" / "sub" / "b.py").rename(tmp_path / "pkg" / "b.py")  # a move, same bytes
    moved = compile_cache.source_digest(tmp_path / "pkg")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "c.py").write_text("z = 4\n")
    both = compile_cache.source_digest(tmp_path / "pkg", tmp_path / "kernels")  # another root counts
    assert len({first, edited, moved, both}) == 4


def test_the_build_tag_hashes_kernels_and_pipelines_too():
    # an editable install keeps kernels/ and pipelines/ outside pfamalign/: their source
    # is part of the programs (the plan program runs the scaling solve)
    import importlib.util

    tag = compile_cache._build_tag()
    roots = [pathlib.Path(loc) for name in ("pfamalign", "pfamalign.kernels", "pfamalign.pipelines")
             for loc in importlib.util.find_spec(name).submodule_search_locations]
    assert any(r.name == "kernels" for r in roots) and any(r.name == "pipelines" for r in roots)
    assert tag.endswith("-src" + compile_cache.source_digest(*roots))


def test_a_program_exported_by_other_code_is_neither_read_nor_kept(tmp_path, monkeypatch):
    import jax

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "cache"))
    path = compile_cache.program_path("demo", "double-4")
    assert path.name.endswith(f".{compile_cache._build_tag()}.jaxexport")
    path.parent.mkdir(parents=True)
    backend = jax.default_backend()
    old_source = path.parent / f"double-4.{backend}-jax0.0.1-src000000000000.jaxexport"
    other_backend = path.parent / "double-4.tpu-jax0.0.1-src000000000000.jaxexport"
    other_program = path.parent / f"double-8.{backend}-jax0.0.1-src000000000000.jaxexport"

    def export(fn):
        return bytes(jax.export.export(jax.jit(fn))(jax.ShapeDtypeStruct((4,), np.float32)).serialize())

    for stale in (old_source, other_backend, other_program):
        stale.write_bytes(export(lambda x: x * 3.0))
    program = compile_cache.exported_program(path, lambda: export(lambda x: x * 2.0))
    np.testing.assert_array_equal(np.asarray(program.call(np.ones(4, np.float32))), 2.0)
    assert path.exists() and not old_source.exists()
    assert other_backend.exists() and other_program.exists()  # not this program's builds here


def test_without_a_cache_directory_the_model_is_restored_at_once(monkeypatch):
    from pfamalign.inference import Predictor

    monkeypatch.setenv(compile_cache.ENV, "")
    predictor = Predictor()
    assert predictor.programs is None and "model" in vars(predictor)


# ---- plots ---------------------------------------------------------------------------------

def test_plot_format_follows_the_extension(tmp_path):
    from pfamalign.alignment.plots import figure_format, plot_plan

    plan = np.eye(30) * 0.9 + 0.003
    pairs = np.stack([np.arange(30), np.arange(30)], 1)
    plot_plan(plan, tmp_path / "p.svg", pairs=pairs)
    assert b"<svg" in (tmp_path / "p.svg").read_bytes()[:500]
    plot_plan(plan, tmp_path / "p.pdf", pairs=pairs)
    assert (tmp_path / "p.pdf").read_bytes().startswith(b"%PDF")
    plot_plan(plan, tmp_path / "p.png", pairs=pairs)
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    plot_plan(plan, tmp_path / "tmpname", pairs=pairs, fmt="svg")  # an atomic writer's temporary
    assert b"<svg" in (tmp_path / "tmpname").read_bytes()[:500]
    with pytest.raises(ValueError, match=r"cannot write a figure as \.docx"):
        figure_format("plan.docx")


def test_long_plans_are_drawn_as_the_band_around_the_path(tmp_path):
    import matplotlib.image as mpimg

    from pfamalign.alignment.plots import _band, plot_plan

    lq, lk = 900, 1000
    rng = np.random.default_rng(4)
    path_j = np.sort(rng.choice(lk, lq, replace=False))
    plan = rng.random((lq, lk)) * 1e-4
    plan[np.arange(lq), path_j] = 0.9
    pairs = np.stack([np.arange(lq), path_j], 1)
    band, centre = _band(plan, pairs, 30)
    np.testing.assert_array_equal(centre, path_j)
    np.testing.assert_array_equal(band[:, 30], 0.9)  # the path at offset 0
    out = plot_plan(plan, tmp_path / "long.png", pairs=pairs, title="long")
    image = mpimg.imread(out)
    assert image.shape[0] > 500 and float(image[..., :3].std()) > 0.01


def test_align_cli_verbose_provenance_and_svg_plot(tmp_path):
    from click.testing import CliRunner

    from pfamalign.cli import main

    plot = tmp_path / "plan.svg"
    res = CliRunner().invoke(main, ["align", "MKVLAAGIVGLLLA", "MKVLSAGIVGLA", "-f", "json", "-v",
                                    "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.splitlines()[0])
    assert doc["provenance"]["model"].startswith("align_ce (shipped) sha256:")
    assert "programs compiled:" in res.stderr and "plan batches" in res.stderr
    assert b"<svg" in plot.read_bytes()[:500]
    bad = CliRunner().invoke(main, ["align", "MKV", "MKV", "--plot", str(tmp_path / "p.docx")])
    assert bad.exit_code == 2 and "cannot write a figure as .docx" in bad.output


def test_align_verbose_counts_numba_kernels_compiled_then_loaded(tmp_path):
    """A multi-FASTA of 17 records (16 pairs: numba's engines): the first run compiles the
    pair-HMM and DP kernels, the second reads all three from the cache directory."""
    rng = np.random.default_rng(12)
    fasta = tmp_path / "many.fasta"
    fasta.write_text("".join(f">s{n}\n{_random_seq(rng, 40 + n)}\n" for n in range(17)))
    env = {k: v for k, v in _env(tmp_path / "cache").items() if k != "NUMBA_CACHE_DIR"}
    argv = [sys.executable, "-m", "pfamalign.cli", "align", str(fasta), "-v", "-o", str(tmp_path / "out.txt")]
    runs = [subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert "16 pair(s)" in runs[0].stderr
    assert "numba kernels compiled: 3, loaded from its cache: 0" in runs[0].stderr
    assert "numba kernels compiled: 0, loaded from its cache: 3" in runs[1].stderr
    assert list((tmp_path / "cache" / "numba").rglob("*.nbi"))  # in the command line's cache directory


@pytest.mark.parametrize("mode", ["global", "local"])
def test_predictor_hmm_posteriors_equal_the_reference_either_engine(mode):
    # pairs of several padded lengths and an odd count per bucket: the bucketing and the filler
    # rows must give back every pair's own posteriors, in order; the last pair is a domain
    # inside long random flanks (the local model's scaled start / end weights)
    from pfamalign.inference import Predictor, default_model_dir

    predictor = Predictor(default_model_dir())
    rng = np.random.default_rng(5)
    pairs = [(_random_seq(rng, la), _random_seq(rng, lb)) for la, lb in
             [(30, 41), (200, 150), (12, 9), (130, 70), (64, 65), (5, 300), (77, 77)]]
    domain = _random_seq(rng, 80)
    pairs.append((_random_seq(rng, 150) + domain + _random_seq(rng, 200), domain))
    for bulk in (False, True):  # the XLA engine, the numba one
        got = predictor.hmm_posteriors(pairs, mode=mode, bulk=bulk)
        for (a, b), post in zip(pairs, got):
            np.testing.assert_allclose(post, match_posteriors(predictor.pairhmm, a, b, local=mode == "local"),
                                       rtol=1e-8, atol=1e-12)


# ---- found missing by a mutation sweep ----------------------------------------------------------

def test_the_build_tag_names_the_backend_and_the_jax_version(monkeypatch):
    """An exported program is another program on another backend or jax: the tag the cache
    names its directory by must say both."""
    import jax

    from pfamalign import compile_cache

    tag = lambda: (compile_cache._build_tag.cache_clear(), compile_cache._build_tag())[1]  # noqa: E731
    try:
        here = tag()
        with monkeypatch.context() as patch:
            patch.setattr(jax, "default_backend", lambda: "nobackend")
            elsewhere = tag()
            patch.setattr(compile_cache, "_jax_version", lambda: "0.0.1")
            older = tag()
    finally:
        compile_cache._build_tag.cache_clear()
    assert elsewhere.startswith("nobackend-") and here.split("-", 1)[1] == elsewhere.split("-", 1)[1]
    assert "-jax0.0.1-" in older and len({here, elsewhere, older}) == 3


def test_a_blank_cache_dir_setting_turns_the_cache_off(monkeypatch):
    from pfamalign import compile_cache

    monkeypatch.setenv(compile_cache.ENV, "  ")
    assert compile_cache.cache_dir() is None
