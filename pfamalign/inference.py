"""Inference: load an aligner, featurize sequences, compute plans in length buckets, decode.

The ``Predictor`` (model, featurizer, plan programs and batching) lives here; how a plan is
decoded is ``decoding.DecoderSettings``, a plan itself ``plans.PairPlan``.

Shared by every command that aligns (``align``, ``search``, ``eval``, ``barycenter``,
``certify``, ``compile``, ``ensemble``), decoder tuning and the Python API: one model load, one
jit compilation per padded length, many pairs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import importlib.resources
import json
import os
import pathlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from pfamalign import resources
from pfamalign.alignment import numba_jit, pairhmm
from pfamalign.alignment.formats import AlignmentRecord
from pfamalign.alignment.pairhmm import AnyPairHMM, model_pairhmm, plan_log_odds
from pfamalign.alignment.pairs import PairAlignment
from pfamalign.compile_cache import standard_rules
from pfamalign.decoding import DecoderSettings
from pfamalign.plans import PairPlan, unpad, unpad_symmetric
from pfamalign.resources import check_align_memory, check_budget_usable, padded_length, pairs_at_once
from pfamalign.runs import check_parameter_files

DEFAULT_MODEL = "default_model"
# a batch is padded up to the next of these: few shapes. Larger batches brought no more
# pairs/s on the 2-core host (compute-bound; 32 measured no faster than 4 or 8).
BATCH_SIZES = (1, 2, 4, 8)


def bucketed_batches(lengths: Sequence[int], limit=None) -> list[tuple[int, list[int]]]:
    """``(padded length, indices)`` batches of the pairs whose longer sequences have these
    ``lengths``: grouped by bucket (``padded_length``, in order of first appearance), at most
    ``BATCH_SIZES[-1]`` pairs each, or ``limit(padded length)`` (a memory budget's)."""
    buckets: dict[int, list[int]] = {}
    for n, length in enumerate(lengths):
        buckets.setdefault(padded_length(length), []).append(n)
    sizes = {pad: BATCH_SIZES[-1] if limit is None else limit(pad) for pad in buckets}
    return [(pad, members[start: start + sizes[pad]]) for pad, members in buckets.items()
            for start in range(0, len(members), sizes[pad])]


def padded_batch(size: int) -> int:
    """The batch size a batch of ``size`` pairs is computed at (extra slots repeat a pair)."""
    return next((b for b in BATCH_SIZES if b >= size), -(-size // BATCH_SIZES[-1]) * BATCH_SIZES[-1])


def pad_batch(pairs, *, pad: int | None = None, size: int | None = None):
    """Zero-padded ``(q_feat [size, pad, D], k_feat [size, pad, D], q_len [size], k_len [size])``
    of feature pairs ``[(q [Lq, D], k [Lk, D])]``: both sides at one padded length ``pad``
    (default: the bucket of the longest sequence, ``padded_length``), ``size`` slots (default:
    one per pair; slots past the pairs repeat the first pair). The one padding of the plan
    calls (``Predictor``) and of the ASAP fit and benchmarks (``pfamalign.asap``)."""
    size = size or len(pairs)
    slots = [pairs[n] if n < len(pairs) else pairs[0] for n in range(size)]
    lq = np.array([a.shape[0] for a, _ in slots], np.int32)
    lk = np.array([b.shape[0] for _, b in slots], np.int32)
    pad = pad or padded_length(int(max(lq.max(), lk.max())))
    dim = slots[0][0].shape[1]
    xq = np.zeros((size, pad, dim), np.float32)
    xk = np.zeros((size, pad, dim), np.float32)
    for n, (a, b) in enumerate(slots):
        xq[n, : len(a)], xk[n, : len(b)] = a, b
    return xq, xk, lq, lk


ENSEMBLE_FILE = "ensemble.json"  # marks an ensemble directory (``pfamalign.ensemble``)
# the models shipped inside the package, by the name ``--checkpoint`` accepts
SHIPPED_MODELS = {"default": DEFAULT_MODEL, "ensemble": "ensemble_model"}


def shipped_model_dir(name: str = "default") -> pathlib.Path:
    """A model shipped inside the package (trained on the bundled Pfam data, builtin
    features): ``default``, or ``ensemble`` (the default model and a CETA model, their
    posteriors averaged: more accurate, about three times slower; TRAINING.md)."""
    return pathlib.Path(str(importlib.resources.files("pfamalign") / "assets" / SHIPPED_MODELS[name]))


def default_model_dir() -> pathlib.Path:
    return shipped_model_dir("default")


def finished_run_model(path: pathlib.Path) -> pathlib.Path | None:
    """``RUN/model`` when ``path`` is a run directory whose training finished (``pfamalign
    train`` wrote its model directory: parameters, pair-HMM, tuned decoder and, last,
    ``training.json``); else None (a run killed while finishing is read from its last
    checkpoint, as an unfinished run is)."""
    from pfamalign.runs import TRAINING_RECORD

    model = path / "model"
    finished = all((model / name).exists() for name in ("config.json", "params", TRAINING_RECORD))
    return model if finished else None


def model_content_hash(model_dir: pathlib.Path, hmm: AnyPairHMM) -> str:
    """``sha256:`` + 16 hex digits over a model's files (its config and every parameter file,
    names and bytes) and the parameters of its pair-HMM: whatever computes an alignment
    changes it; the decoder settings are recorded beside it (``Predictor.provenance``)."""
    config_path, params_path = _model_files(model_dir)
    named = [("config.json", config_path)] + sorted(
        (f"params/{f.relative_to(params_path).as_posix()}", f)
        for f in pathlib.Path(params_path).rglob("*") if f.is_file())
    digest = hashlib.sha256()
    for name, f in named:
        with open(f, "rb") as handle:  # in chunks: a parameter file may be large (or sparse and huge)
            digest.update(f"{name}\0{os.fstat(handle.fileno()).st_size}\0".encode())  # unambiguous boundaries
            while block := handle.read(1 << 20):
                digest.update(block)
    digest.update(hmm.to_json().encode())
    return "sha256:" + digest.hexdigest()[:16]


def _model_files(model_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``(config.json, params/)`` of a model, run or checkpoint directory
    (``checkpoint.resolve_model_path``; a model directory's without importing flax)."""
    model_dir = pathlib.Path(model_dir)
    if (model_dir / "config.json").is_file() and (model_dir / "params").is_dir():
        return model_dir / "config.json", model_dir / "params"  # as resolve_model_path reads it first
    from pfamalign.checkpoint import resolve_model_path

    return resolve_model_path(model_dir)


class Predictor:
    """A loaded aligner and its featurizer.

    Args:
      checkpoint: model directory (``pfamalign train`` output ``RUN/model``); None = the
        default model shipped with the package.
      weights: ESM-2 weights for checkpoints trained on ESM-2 features.
      max_length: longest sequence accepted (residues).
      max_memory: refuse a pair whose estimated memory (``pfamalign.resources``) is larger
        (bytes; None: no limit).
      engine: how plans are computed (``pfamalign.asap.ENGINES``), both directions of a
        symmetrized plan included: ``sinkhorn`` (the trained steps), ``steps`` (``steps`` plain
        Sinkhorn steps) or ``asap`` (the operator that ``pfamalign compile`` wrote into the
        model directory).
    """

    def __new__(cls, checkpoint: str | pathlib.Path | None = None, **kwargs):
        # an ensemble directory (``pfamalign.ensemble``) loads wherever a model directory does
        path = predictor_path(checkpoint)
        if cls is Predictor and (path / ENSEMBLE_FILE).is_file():
            from pfamalign.ensemble import EnsemblePredictor

            return super().__new__(EnsemblePredictor)
        return super().__new__(cls)

    def __init__(self, checkpoint: str | pathlib.Path | None = None, *, weights=None,
                 max_length: int = 4096, max_memory: int | None = None, engine: str = "sinkhorn",
                 steps: int | None = None):
        from pfamalign.pipelines.embed import get_embedder

        path = predictor_path(checkpoint)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(_no_model(path, checkpoint))
        _warn_if_unfinished(path)
        self._read_directory(path)
        self.programs = None  # exported plan programs (``PlanPrograms``), for the model's own plan
        if engine != "sinkhorn" or steps is not None:
            from pfamalign.asap import Engine

            self.engine = Engine.load(engine, path, self.model, steps=steps)
        else:
            self.programs = PlanPrograms.of(self)
        if self.programs is None or not self.programs.any():
            _ = self.model  # restore now: a broken model is an error here, not mid-run
        else:  # programs named by the parameters' own bytes: their checksums are checked as on restore
            check_parameter_files(_model_files(path)[1])
        model_fields = (self.config.to_dict() if "_restored" in vars(self)
                        else json.loads((path / "config.json").read_text(encoding="utf-8"))["model"])
        self._transport_fields = model_fields.get("transport", {})
        self._set_featurizer(model_fields["name"], get_embedder(model_fields["embedder_id"], weights),
                             max_length=max_length, max_memory=max_memory)
        self.encodings = EncodingCache()  # the encoder's outputs of the sequences met so far

    # ---- the setup a model's and an ensemble's (``EnsemblePredictor``) share ------------
    def _read_directory(self, path: pathlib.Path) -> None:
        """What the directory ``path`` itself gives: the decoder (its ``decoding.json``; without
        one, as a checkpoint of an unfinished run or a hand-made ensemble has, the shipped
        model's, as `train --no-tune` writes: never the affine defaults of DecoderSettings())
        and the pair-HMM (its ``pairhmm.json``, else the shipped); no engine (the plan is the
        model's own)."""
        self.path = path
        tuned = (path / "decoding.json").is_file()
        self.decoding = DecoderSettings.load(path if tuned else default_model_dir())
        self.pairhmm = model_pairhmm(path)
        self.engine = None  # the model's own plan

    def _set_featurizer(self, name: str, embedder, *, max_length: int, max_memory: int | None,
                        plan_models: int = 1, shapes: set[tuple[int, int]] | None = None) -> None:
        """The model's name, its featurizer and the limits of a pair: ``max_length`` capped at
        what the embedder accepts, ``max_memory`` (bytes: the budget each pair is checked
        against and its batches fit, ``resources``; None: no limit) for ``plan_models``
        models' plans (an ensemble: its members); ``shapes`` (the (batch, padded length) of
        the plan calls) a new set unless shared."""
        self.name = name
        self.embedder = embedder
        limit = embedder.max_residues
        self.max_length = min(max_length, limit) if limit else max_length
        self._embedder_limits = bool(limit) and limit < max_length  # not the caller's max_length
        check_budget_usable(max_memory, plan_models)  # one error, not one per pair of a batch
        self.max_memory = max_memory
        self.plan_models = plan_models
        self.shapes: set[tuple[int, int]] = set() if shapes is None else shapes

    # ---- the model, restored when first needed ------------------------------------------
    @functools.cached_property
    def _restored(self):
        from pfamalign import checkpoint as ckpt

        return ckpt.load_model(self.path)

    @functools.cached_property
    def model(self):
        """The ``Aligner``. Restored in the constructor, except when exported plan programs of
        this model are cached (``PlanPrograms``): then only if a plan needs it."""
        return self._restored[0]

    @functools.cached_property
    def config(self):
        return self._restored[1]

    # ---- provenance ---------------------------------------------------------------------
    @functools.cached_property
    def model_hash(self) -> str:
        return model_content_hash(self.path, self.pairhmm)

    def provenance(self, decoding: DecoderSettings | None = None) -> dict:
        """What produced an alignment (the formats with a place for it record it): program
        and version, model name and content hash, decoder and the settings it reads (the
        others changed nothing, as ``--gap-open`` with the posterior decoder is refused)."""
        from pfamalign import __version__

        shipped = " (shipped)" if self.path in {shipped_model_dir(n) for n in SHIPPED_MODELS} else ""
        decoding = decoding or self.decoding
        settings = {k: getattr(decoding, k) for k in decoding.reads(decoding.decoder) if k != "decoder"}
        return {"version": f"pfamalign {__version__}",
                "model": f"{self.name}{shipped} {self.model_hash}",
                "decoder": {"name": decoding.decoder, **settings, "symmetrized": True},
                **({"engine": self.engine.describe()} if self.engine is not None else {})}

    # ---- featurization ------------------------------------------------------------------
    def featurize(self, sequences: Sequence[str]) -> list[np.ndarray]:
        for seq in sequences:
            problem = self.sequence_problem(seq)
            if problem is not None:
                raise ValueError(problem)
        return [np.asarray(f, np.float32) for f in self.embedder.embed(list(sequences))]

    # ---- plans --------------------------------------------------------------------------
    def plans(self, feature_pairs: Iterable[tuple[np.ndarray, np.ndarray]], *,
              batch_size: int = 8, symmetric: bool = False) -> Iterator[PairPlan]:
        """Dense plans, in input order, computed in batches of up to ``batch_size`` pairs,
        as many at once as fit in ``max_memory`` at the batch's padded length (its longest
        pair's). ``symmetric``: each plan is ``symmetrize``d (what the aligner decodes)."""
        batch: list[tuple[np.ndarray, np.ndarray]] = []
        # the sizes a batch is computed at (``padded_batch``): a cap among them holds its padding too
        sizes = tuple(sorted({padded_batch(n) for n in range(1, batch_size + 1)} | set(BATCH_SIZES)))
        caps: dict[int, int] = {}  # per padded length, worked out once (it reads the address space left)
        longest = 0
        for pair in feature_pairs:
            length = max(len(x) for x in pair)
            pad = padded_length(max(longest, length))
            if pad not in caps:
                caps[pad] = min(batch_size, self._pairs_at_once(pad, sizes))
            if batch and len(batch) >= caps[pad]:
                yield from self._plan_batch(batch, symmetric=symmetric)
                batch, longest = [], 0
            batch.append(pair)
            longest = max(longest, length)
        if batch:
            yield from self._plan_batch(batch, symmetric=symmetric)

    @standard_rules
    def _plan_batch(self, batch, *, pad: int | None = None, symmetric: bool = False) -> list[PairPlan]:
        """The plans of ``batch`` (feature pairs) in one jitted call at padded length ``pad``
        (default: the bucket of the longest sequence) and a ``padded_batch`` size;
        ``symmetric``: both directions in the same call, from the sequences' encodings (each
        sequence encoded once in a process, ``EncodingCache``; a single pair's exported
        program encodes inside)."""
        xq, xk, lq_all, lk_all = pad_batch(batch, pad=pad, size=padded_batch(len(batch)))
        self.shapes.add(xq.shape[:2])
        lq, lk = lq_all[: len(batch)], lk_all[: len(batch)]
        if not symmetric:  # jit-compiled per shape
            plan = self.model.plan if self.engine is None else functools.partial(self.engine.plan, self.model)
            return unpad(np.asarray(plan(xq, xk, lq_all, lk_all)), lq, lk)
        both = self.programs.plans_both_ways(xq, xk, lq_all, lk_all) if self.programs is not None else None
        if both is None and self.engine is None:  # each sequence encoded once in a process
            encoded = self._encoded(batch, pad=xq.shape[1], size=xq.shape[0])
            both = self._frozen().plans_both_ways(xq, xk, lq_all, lk_all, encoded=encoded)
        elif both is None:
            both = self.engine.plans_both_ways(self.model, xq, xk, lq_all, lk_all)
        ab, ba = (np.asarray(x) for x in both)
        return unpad_symmetric(ab, ba, lq, lk)

    def _frozen(self):
        """The model's inference programs on its parameters split once (``FrozenAligner``),
        split again when a caller has replaced ``model.cfg``."""
        from pfamalign.model import FrozenAligner

        frozen = self.__dict__.get("_frozen_aligner")
        if frozen is None or not frozen.matches(self.model):
            frozen = self.__dict__["_frozen_aligner"] = FrozenAligner(self.model)
        return frozen

    def _encoded(self, batch, *, pad: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The model's encodings ``([size, pad, W], [size, pad, W])`` of the two sides of
        ``batch`` (feature pairs; slots past them repeat the first pair, as ``pad_batch``):
        from ``self.encodings`` where a sequence was met before (a search's query, every
        sequence of ``--all-pairs``), the others encoded together in ``padded_batch`` sizes."""
        slots = [batch[n] if n < len(batch) else batch[0] for n in range(size)]
        keys = [[EncodingCache.key(f, pad) for f in pair] for pair in slots]
        feats = {key: f for pair, pair_keys in zip(slots, keys) for key, f in zip(pair_keys, pair)}
        found = {key: self.encodings.get(key) for key in feats}
        missing = [key for key, h in found.items() if h is None]
        for start in range(0, len(missing), BATCH_SIZES[-1]):
            chunk = missing[start: start + BATCH_SIZES[-1]]
            x = np.zeros((padded_batch(len(chunk)), pad, feats[chunk[0]].shape[1]), np.float32)
            lens = np.ones(len(x), np.int32)
            for n, key in enumerate(chunk):
                x[n, : len(feats[key])], lens[n] = feats[key], len(feats[key])
            for key, h in zip(chunk, np.asarray(self._frozen().encodings(x, lens))):
                found[key] = h.copy()  # not a view of the batch: the cache keeps it alone
                self.encodings.put(key, found[key])
        return tuple(np.stack([found[pair[side]] for pair in keys]) for side in (0, 1))

    # ---- alignment ----------------------------------------------------------------------
    def checks_marginals(self) -> bool:
        """Whether ``PairPlan.check`` bounds a plan's row and column masses: only for the
        model's own balanced solve with unit dustbin targets (or none), which its bounds
        describe. An engine's plans approximate their masses; with a free (or KL-relaxed)
        side one direction's key column may hold several rows' mass, and a symmetrized plan
        carries it into the other direction's rows; a ``capacity`` dustbin's targets (the
        sequence lengths) leave the rows of a fixed-step solve off by more (1.26 seen on
        held-out pairs) without anything being broken."""
        if "model" in vars(self):  # restored: its configuration (a caller may have changed it)
            transport = dataclasses.asdict(self.model.cfg.transport)
        else:  # as saved (missing fields take ``TransportConfig``'s defaults): no restore for this
            transport = self._transport_fields
        return (self.engine is None and transport.get("marginals", "balanced") == "balanced"
                and transport.get("dustbin", "none") != "capacity")

    def decode(self, pp: PairPlan, decoding: DecoderSettings | None = None,
               sequences: tuple[str, str] | None = None, *,
               hmm_posteriors: np.ndarray | None = None) -> PairAlignment:
        pp.check(marginals=self.checks_marginals())  # a failed solve is an error, not an alignment
        return (decoding or self.decoding).decode(pp, sequences, hmm_posteriors=hmm_posteriors,
                                                  hmm=self.pairhmm)

    def decode_batch(self, plans: Sequence[PairPlan], seq_pairs: Sequence[tuple[str, str]],
                     decoding: DecoderSettings | None = None, *,
                     hmm_posteriors: Sequence[np.ndarray] | None = None) -> list[PairAlignment]:
        """The alignments of a batch of plans of ``seq_pairs`` (the fast path of ``decode``):
        every plan checked first, then the pair-HMM posteriors the decoder needs, batched
        (``hmm_posteriors``: those of ``seq_pairs``, if already computed)."""
        decoding = decoding or self.decoding
        for pp in plans:
            pp.check(marginals=self.checks_marginals())  # a failed solve is an error
        posts = [None] * len(plans)
        if decoding.uses_pairhmm():
            posts = hmm_posteriors or self.hmm_posteriors(seq_pairs, mode=decoding.mode)
        plan_posts = self.plan_posteriors(seq_pairs, plans, decoding)
        return decoding.decode_many(plans, seq_pairs, hmm_posteriors=posts, hmm=self.pairhmm,
                                    plan_posteriors=plan_posts)

    @standard_rules
    def align(self, seq_a: str, seq_b: str, decoding: DecoderSettings | None = None, *,
              symmetric: bool = True) -> tuple[PairAlignment, PairPlan]:
        """One pair, the simple way (the reference the batched ``align_records`` is tested
        against): its own plan call, the numpy pair-HMM. ``symmetric=False``: the plan of
        the A -> B direction only (a transport plan with A's row marginals)."""
        check_align_memory(len(seq_a), len(seq_b), self.max_memory, self.plan_models)
        fa, fb = self.featurize([seq_a, seq_b])
        pp = next(self.plans([(fa, fb)], symmetric=symmetric))
        return self.decode(pp, decoding, (seq_a, seq_b)), pp

    def align_records(self, pairs: Iterable[dict], decoding: DecoderSettings | None = None, *,
                      window: int = 128) -> Iterator[tuple[AlignmentRecord, PairPlan]]:
        """Streams the alignment record and plan of each pair record (``pfamalign.inputs``),
        in input order. A ValueError about one pair starts with its ``where`` (a pairs-file
        line) if it has one; the pairs before it are yielded first.

        Batched: up to ``window`` pairs are read ahead, grouped by length bucket
        (``padded_length``) and computed in batches of ``padded_batch`` sizes -- one jitted
        plan call per batch, so a run compiles at most one program per (batch size, bucket)
        that it meets. A window of ``numba_jit.BULK_PAIRS`` or more pairs starts numba's
        kernels (pair-HMM, MEA DP) for the rest of the process (``numba_jit``).
        """
        decoding = decoding or self.decoding
        pending: list[dict] = []
        for pair in pairs:
            problem = self.pair_problem(pair["q_seq"], pair["k_seq"])
            if problem is not None:
                yield from self._align_window(pending, decoding)
                pending = []
                raise ValueError(f"{pair['where']}: {problem}" if "where" in pair else problem)
            pending.append(pair)
            if len(pending) == window:
                yield from self._align_window(pending, decoding)
                pending = []
        yield from self._align_window(pending, decoding)

    def sequence_problem(self, seq: str) -> str | None:
        """Why this model cannot embed ``seq`` (None: it can): the one length check before a
        plan (``pair_problem``, ``featurize``, ``search.usable_records``)."""
        if not seq:
            return "empty sequence"
        if len(seq) > self.max_length:
            if self._embedder_limits:
                return (f"sequence of {len(seq)} residues is longer than this model accepts "
                        f"({self.max_length}, its embedder's limit); split it into domains")
            return (f"sequence of {len(seq)} residues is longer than the limit of {self.max_length} residues; "
                    "split it into domains or raise --max-length (max_length= in Python)")
        return None

    def _pairs_at_once(self, pad: int, sizes=BATCH_SIZES) -> int:
        """The most pairs (one of ``sizes``) planned together at padded length ``pad`` within
        ``max_memory`` (each pair was checked alone: ``pair_problem``)."""
        return pairs_at_once(pad, self.max_memory, self.plan_models, sizes)

    def _batches(self, lengths: Sequence[int]) -> list[tuple[int, list[int]]]:
        """``bucketed_batches`` of pairs with these longer lengths, as many at once as fit."""
        return bucketed_batches(lengths, self._pairs_at_once)

    def pair_problem(self, seq_a: str, seq_b: str) -> str | None:
        """Why this model cannot align these sequences (None: it can): an empty one, one
        longer than ``max_length``, or more memory than ``max_memory``."""
        problem = self.sequence_problem(seq_a) or self.sequence_problem(seq_b)
        if problem is not None:
            return problem
        try:
            check_align_memory(len(seq_a), len(seq_b), self.max_memory, self.plan_models)
        except ValueError as err:
            return str(err)
        return None

    @standard_rules
    def hmm_posteriors(self, seq_pairs: Sequence[tuple[str, str]], *, mode: str = "global",
                       log_emissions: Sequence[np.ndarray] | None = None,
                       bulk: bool | None = None) -> list[np.ndarray]:
        """The model's pair-HMM match posteriors of each ``(seq_a, seq_b)``, in order (tested
        equal to ``pairhmm.match_posteriors``). ``mode``: the decoder's (``local``: the
        segment model, flanks free); ``log_emissions``: per pair, match log-odds in place of
        the substitution table's (``plan_posteriors``). ``bulk``: the numba engine
        (``pairhmm_numba``) rather than the XLA one (``pairhmm_batched``: pairs bucketed by
        padded length, one exported program per batch); by default as
        ``numba_jit.for_job``."""
        if bulk is None:
            bulk = numba_jit.for_job(len(seq_pairs))
        if bulk:
            from pfamalign.alignment.pairhmm_numba import match_posteriors_many

            out = match_posteriors_many(self.pairhmm, list(seq_pairs), local=mode == "local",
                                        log_emissions=log_emissions)
        else:
            from pfamalign.alignment.pairhmm_batched import batched_match_posteriors

            out = [None] * len(seq_pairs)
            for pad, chunk in self._batches([max(len(a), len(b)) for a, b in seq_pairs]):
                padded = chunk + chunk[:1] * (padded_batch(len(chunk)) - len(chunk))  # one shape per size
                tables = None if log_emissions is None else [log_emissions[n] for n in padded]
                posts = batched_match_posteriors(self.pairhmm, [seq_pairs[n] for n in padded], pad, pad,
                                                 local=mode == "local", log_emissions=tables)
                for n, post in zip(chunk, posts):
                    out[n] = post
        for n, post in enumerate(out):  # a pair past the scaled engines' range: the log-space reference
            if not pairhmm.plausible_posteriors(post):
                out[n] = pairhmm.match_posteriors(self.pairhmm, *seq_pairs[n], local=mode == "local",
                                                  log_emissions=None if log_emissions is None else log_emissions[n])
        return out

    def plan_posteriors(self, seq_pairs: Sequence[tuple[str, str]], plans: Sequence[PairPlan],
                        decoding: DecoderSettings) -> list[np.ndarray | None]:
        """The plan pair-HMM's match posteriors of each plan (``DecoderSettings.plan_power``),
        batched as ``hmm_posteriors``; Nones when the decoder does not use them."""
        if not decoding.uses_plan_hmm():
            return [None] * len(plans)
        return self.hmm_posteriors(seq_pairs, mode=decoding.mode,
                                   log_emissions=[plan_log_odds(pp.real, decoding.plan_power) for pp in plans])

    def _align_window(self, pairs: list[dict], decoding: DecoderSettings):
        done: dict[int, tuple[AlignmentRecord, PairPlan]] = {}
        batches = self._batches([max(len(pair["q_seq"]), len(pair["k_seq"])) for pair in pairs])
        sequences = [[(pairs[n]["q_seq"], pairs[n]["k_seq"]) for n in chunk] for _, chunk in batches]
        # The sequence pair-HMM needs no plan: a batch's posteriors are computed on worker
        # threads while another computes the plans and this thread decodes (jax and numba
        # release the GIL; two cores stay busy), each at most one batch ahead (memory).
        numba_jit.for_job(len(pairs))  # a window of many pairs: numba's kernels (pair-HMM, DP) from now on
        posteriors = _Lookahead(lambda seqs: self.hmm_posteriors(seqs, mode=decoding.mode),
                                sequences if decoding.uses_pairhmm() else [], worker="pairhmm")
        plans_of = _Lookahead(lambda item: self._plan_batch([tuple(self.featurize(pair)) for pair in item[1]],
                                                            pad=item[0], symmetric=True),
                              [(pad, seqs) for (pad, _), seqs in zip(batches, sequences)], worker="plans")
        try:
            for b, ((pad, chunk), seqs) in enumerate(zip(batches, sequences)):
                plans = plans_of.get(b)
                alignments = self.decode_batch(plans, seqs, decoding, hmm_posteriors=posteriors.get(b))
                for n, pp, seq_pair, aln in zip(chunk, plans, seqs, alignments):
                    rec = AlignmentRecord.from_alignment(*seq_pair, aln, id_a=pairs[n]["q_id"],
                                                         id_b=pairs[n]["k_id"],
                                                         local=decoding.mode == "local")
                    done[n] = rec, pp
        finally:
            plans_of.close()
            posteriors.close()
        for n in range(len(pairs)):
            yield done.pop(n)


class PlanPrograms:
    """The symmetric plan programs of one model for single pairs, one per padded length
    (``model.export_plans_both_ways``: the parameters baked in), exported to the user's cache
    directory (``compile_cache.exported_program``, under ``programs/<model content hash>/``).
    With them a warm ``pfamalign align A B`` imports no flax and restores no checkpoint. The
    first call at a length exports the program from the restored model and runs the exported
    program (so only it is compiled). The model content hash (config, parameters, pair-HMM)
    and ``compile_cache.program_path``'s build tag (backend, jax, package source) name the
    file: an edited model, another jax or other code never meets an old program. Plans the
    scaling solve reports unsafe are recomputed by the model (``Aligner.plans_both_ways``).
    Batches go through the model: they amortize its tracing."""

    def __init__(self, predictor: "Predictor", name: str):
        self._predictor, self.name = predictor, name  # name: the model content hash
        self._loaded: dict[tuple[int, int], object] = {}

    @classmethod
    def of(cls, predictor: "Predictor") -> "PlanPrograms | None":
        """The programs of ``predictor``'s model, or None when there is no cache directory."""
        from pfamalign.compile_cache import cache_dir

        if cache_dir() is None:
            return None
        try:
            return cls(predictor, predictor.model_hash.removeprefix("sha256:"))
        except (OSError, ValueError):  # a broken model directory: the restore says what is wrong
            return None

    def _path(self, stem: str) -> pathlib.Path:
        from pfamalign.compile_cache import program_path

        return program_path(self.name, f"plans_both_ways-{stem}")

    def any(self) -> bool:
        """Whether any program of this model (for this backend, jax and source) is cached."""
        pattern = self._path("*")
        return any(pattern.parent.glob(pattern.name))

    def plans_both_ways(self, xq, xk, lq, lk):
        """``(ab, ba)`` plans of the padded batch (as ``Aligner.plans_both_ways``), or None
        when the program cannot be had (the caller computes them through the model)."""
        from pfamalign.compile_cache import exported_program

        shape = xq.shape[:2]
        if shape[0] != 1:  # single pairs only: each program holds the parameters (2 MB)
            return None

        def export() -> bytes:  # the model (and flax) only on a miss
            from pfamalign.model import export_plans_both_ways

            return export_plans_both_ways(self._predictor.model, *shape)

        if shape not in self._loaded:
            self._loaded[shape] = exported_program(self._path("x".join(map(str, shape))), export)
        program = self._loaded[shape]
        if program is None:
            return None
        both, safe = program.call(xq, xk, lq, lk)
        return both if bool(safe) else self._predictor.model.plans_both_ways(xq, xk, lq, lk)


class EncodingCache:
    """The model's encoder outputs of sequences met before, by their features' bytes and
    padded length, least recently used out beyond ``max_bytes``: a sequence that comes back
    in a later batch is encoded once (a search encoded its query for every subject: the
    encoder is a quarter of a pair's work). Thread-safe: ``align_records`` plans on a worker
    thread while its caller may plan a pair of its own (``align``)."""

    def __init__(self, max_bytes: int = 256 << 20):
        import threading
        from collections import OrderedDict

        self.max_bytes, self.bytes = max_bytes, 0
        self._entries: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(feat: np.ndarray, pad: int) -> tuple:
        return hashlib.blake2b(np.ascontiguousarray(feat).tobytes(), digest_size=16).digest(), feat.shape, pad

    def get(self, key: tuple) -> np.ndarray | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end(key)
            return value

    def put(self, key: tuple, value: np.ndarray) -> None:
        with self._lock:
            if key in self._entries or value.nbytes > self.max_bytes:
                return
            self._entries[key] = value
            self.bytes += value.nbytes
            while self.bytes > self.max_bytes:
                self.bytes -= self._entries.popitem(last=False)[1].nbytes

    def __len__(self) -> int:
        return len(self._entries)


class _Lookahead:
    """``fn(items[n])`` computed on the thread named ``worker`` (one per name), at most
    ``ahead`` items before the one asked for (``get(n)``, n in order; None past the items)."""

    def __init__(self, fn, items: Sequence, *, worker: str, ahead: int = 1):
        self._fn, self._items, self._ahead, self._worker = fn, items, ahead, worker
        self._futures: dict[int, object] = {}
        self._next = 0
        self._submit_through(ahead)  # the first items start now

    def _submit_through(self, last: int) -> None:
        while self._next < min(len(self._items), last + 1):
            self._futures[self._next] = resources.thread_pool(self._worker, 1).submit(self._fn, self._items[self._next])
            self._next += 1

    def get(self, n: int):
        if n >= len(self._items):
            return None
        self._submit_through(n + self._ahead)
        return self._futures.pop(n).result()

    def close(self) -> None:
        """Cancels what has not started and waits for what has: a caller that stops early
        (an error, an abandoned generator) leaves no work running behind it."""
        for future in self._futures.values():
            future.cancel()
        concurrent.futures.wait(list(self._futures.values()))
        self._futures.clear()


def _warn_if_unfinished(path: pathlib.Path) -> None:
    """A run's ``model/`` that training did not finish (no ``training.json``, written last: the
    run stopped while it tuned the decoder or recorded its data) loads, with a warning: its
    decoder and pair-HMM may be the defaults, not the model's own. So does a run stopped
    before its ``model/`` (its newest checkpoint)."""
    if (path / "checkpoints").is_dir() and finished_run_model(path) is None:
        import sys

        from pfamalign.runs import finished_steps

        steps = finished_steps(path / "checkpoints")
        if steps:  # a run stopped before its model: its newest checkpoint loads
            print(f"Warning: {path} is an unfinished run: aligning with its newest checkpoint (step "
                  f"{steps[-1]}) and the shipped model's decoder; re-run the same `pfamalign train` "
                  "command to finish it", file=sys.stderr)
        return
    if path.name != "model" or not (path.parent / "checkpoints").is_dir():
        return  # not a run's model (checked first: a warm align imports no checkpoint code)
    from pfamalign.runs import TRAINING_RECORD, finished_steps, read_training_record
    from pfamalign.pipelines.locks import holder, names_this_process

    try:
        record = read_training_record(path)
    except (OSError, ValueError):  # unreadable: `pfamalign verify` names it; the model still loads
        record = {}
    step = record.get("step") if isinstance(record, dict) else None
    if isinstance(step, int) and not isinstance(step, bool):
        newer = [s for s in finished_steps(path.parent / "checkpoints") if s > step]
        if newer:  # a finished run extended (--steps) since: in progress, or stopped before it finished
            import sys

            running = holder(path.parent)
            state = ("stopped before it finished: re-run the same `pfamalign train` command to finish it"
                     if running is None else f"still running ({running})")
            print(f"Warning: {path} is the model of step {step}, but its run has trained on to "
                  f"step {newer[-1]} since, {state}; this loads step {step} "
                  f"({path.parent / 'checkpoints' / str(newer[-1])} holds the newer parameters)", file=sys.stderr)
    if record is None:
        import sys

        running = holder(path.parent)
        if running is None:
            print(f"Warning: {path} is unfinished (no {TRAINING_RECORD}: its decoder may not be tuned); "
                  f"re-run the same `pfamalign train` command to finish it", file=sys.stderr)
        elif not names_this_process(running):  # this process is the run, loading it to tune its decoder
            print(f"Warning: {path} is not finished yet: its run is in progress ({running}); its "
                  "decoder may not be tuned", file=sys.stderr)


def _no_model(path: pathlib.Path, checkpoint) -> str:
    """Why ``path`` (what ``checkpoint`` names) is no model directory, and what to pass."""
    if checkpoint is None:
        return (f"no aligner model at {path} (config.json missing): the package was installed without "
                "its default model; reinstall pfamalign or pass --checkpoint")
    what = ("a model directory (`pfamalign train`'s RUN or RUN/model, an ensemble, a `pfamalign compile` "
            f"output) or a shipped model's name ({', '.join(SHIPPED_MODELS)})")
    if path.is_file():
        if (path.parent / "config.json").is_file():
            return f"{path} is a file, not a model directory; pass its directory {path.parent}"
        return f"{path} is a file, not a model directory; give {what}"
    if not path.exists():
        return f"no model at {path}: no such directory; give {what}"
    kind = " (a dataset of `pfamalign prepare`)" if (path / "manifest.json").is_file() else ""
    return f"no aligner model at {path}{kind} (config.json missing); give {what}"


def predictor_path(checkpoint: str | pathlib.Path | None) -> pathlib.Path:
    """The directory a Predictor reads: the shipped model by default, a finished run's
    ``model/`` for its run directory (decoder, pair-HMM and compiled engine live there), else
    the path given (a model, ensemble or checkpoint directory) or the shipped model named."""
    if checkpoint is None:
        return default_model_dir()
    if isinstance(checkpoint, str) and not checkpoint.strip():  # Path("") would be the working directory
        raise FileNotFoundError("the model is an empty name; give a model directory, or None for the "
                                "default model")
    return finished_run_model(path := model_directory(checkpoint)) or path


def model_directory(value: str | os.PathLike) -> pathlib.Path:
    """``value`` as a path, or the shipped model it names (``SHIPPED_MODELS``: ``default``,
    ``ensemble``; ``ensemble/MEMBER``: one of its members) where no such path exists."""
    if isinstance(value, str) and not pathlib.Path(value).exists():
        name, _, member = value.partition("/")
        if name in SHIPPED_MODELS:
            return shipped_model_dir(name) / member if member else shipped_model_dir(name)
    return pathlib.Path(value)
