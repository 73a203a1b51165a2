"""Inference: load an aligner, featurize sequences, compute plans in length buckets, decode.

Shared by the ``align``, ``eval``, ``barycenter`` and ``certify`` commands: one model load,
one jit compilation per padded length, many pairs.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import pathlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from pfamalign.alignment.decode import MODES, affine_decode, hybrid_decode, mea_decode
from pfamalign.alignment.formats import AlignmentRecord
from pfamalign.alignment.pairhmm import PairHMM, default_pairhmm, match_posteriors, model_pairhmm
from pfamalign.alignment.pairs import PairAlignment

DEFAULT_MODEL = "default_model"
PAD_MULTIPLE = 64  # padded lengths are multiples of this: few shapes, few compilations


def default_model_dir() -> pathlib.Path:
    """The model shipped inside the package (trained on the bundled Pfam data, builtin features)."""
    return pathlib.Path(str(importlib.resources.files("pfamalign") / "assets" / DEFAULT_MODEL))


DECODERS = ("affine", "mea", "hybrid", "posterior")


@dataclasses.dataclass(frozen=True)
class DecoderSettings:
    """How a plan becomes a discrete alignment.

    ``affine``: Gotoh DP on ``P - threshold`` with gap costs between aligned pairs (plan-mass
    units); ``mea``: maximum expected accuracy (sum of plan mass, ``gap_cost`` per unaligned
    residue); ``hybrid``: Gotoh DP on ``BLOSUM62 + plan_weight * P`` with gap costs in BLOSUM
    units (needs the sequences); ``posterior``: MEA (``gap_cost``, ``min_mass``) on ``alpha * P
    + (1 - alpha) * P_hmm``, the plan mixed with the shipped pair-HMM's match posteriors (needs
    the sequences; ``alpha = 0`` is ProbCons-style pair-HMM MEA, ``alpha = 1`` the plan alone).
    ``mode``: ``global`` aligns end to end (end gaps charged); ``local`` finds the best-scoring
    segment (Smith-Waterman ends: flanks stay unaligned for free). A model directory may carry
    tuned values in ``decoding.json``; ``for_decoder`` gives each decoder's own defaults.
    """

    decoder: str = "affine"
    gap_open: float = 3.0  # affine: opening a gap costs three confident pairs' mass
    gap_extend: float = 0.3
    threshold: float = 0.05
    gap_cost: float = 0.0
    min_mass: float = 0.0
    plan_weight: float = 5.0  # hybrid: one unit of plan mass is worth 5 BLOSUM62 units
    mode: str = "global"
    alpha: float = 0.5  # posterior: the plan's share of the mixed posterior

    def __post_init__(self):
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.gap_open >= self.gap_extend >= 0:
            raise ValueError(f"need gap_open >= gap_extend >= 0, got {self.gap_open}, {self.gap_extend}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")

    @classmethod
    def for_decoder(cls, decoder: str) -> "DecoderSettings":
        """The defaults of one decoder (gap costs are in different units per decoder)."""
        if decoder == "hybrid":  # Needleman-Wunsch's BLOSUM62 gap costs, global
            return cls(decoder=decoder, gap_open=11.0, gap_extend=1.0)
        return cls(decoder=decoder)

    def override(self, **changes) -> "DecoderSettings":
        """These settings with the ``changes`` that are not None. Another ``decoder`` starts
        from that decoder's defaults (its gap costs are in other units)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        decoder = changes.get("decoder", self.decoder)
        base = self if decoder == self.decoder else self.for_decoder(decoder)
        return dataclasses.replace(base, **changes)

    @classmethod
    def load(cls, directory: pathlib.Path) -> "DecoderSettings":
        path = pathlib.Path(directory) / "decoding.json"
        if not path.is_file():
            return cls()
        fields = json.loads(path.read_text())
        end_gaps = fields.pop("end_gaps", None)  # files written before `mode`; `mode` wins
        if end_gaps is not None:
            fields.setdefault("mode", "global" if end_gaps else "local")
        return cls(**fields)

    def save(self, directory: pathlib.Path) -> None:
        from pfamalign.checkpoint import write_json  # atomic: a model directory is never torn

        write_json(pathlib.Path(directory) / "decoding.json", dataclasses.asdict(self))

    def uses_pairhmm(self) -> bool:
        return self.decoder == "posterior" and self.alpha < 1

    def decode(self, pp: "PairPlan", sequences: tuple[str, str] | None = None, *,
               hmm_posteriors: np.ndarray | None = None, hmm: PairHMM | None = None) -> PairAlignment:
        """The alignment of one plan; ``sequences`` (the two residue strings) for ``hybrid``
        and ``posterior``; for ``posterior``, ``hmm_posteriors`` (their pair-HMM match
        posteriors, if already computed) or ``hmm`` (the parameters; default: the shipped)."""
        if self.decoder == "posterior":
            if sequences is None:
                raise ValueError("the posterior decoder needs the two sequences")
            mixed = self.alpha * pp.real
            if self.uses_pairhmm():
                if hmm_posteriors is None:
                    hmm_posteriors = match_posteriors(hmm or default_pairhmm(), *sequences)
                mixed = mixed + (1 - self.alpha) * hmm_posteriors
            return mea_decode(mixed, min_mass=self.min_mass, gap_cost=self.gap_cost, mode=self.mode)
        if self.decoder == "mea":
            return mea_decode(pp.real, row_dustbin=pp.row_dustbin, min_mass=self.min_mass,
                              gap_cost=self.gap_cost, mode=self.mode)
        if self.decoder == "hybrid":
            if sequences is None:
                raise ValueError("the hybrid decoder needs the two sequences")
            return hybrid_decode(pp.real, *sequences, plan_weight=self.plan_weight,
                                 gap_open=self.gap_open, gap_extend=self.gap_extend,
                                 min_mass=self.min_mass, mode=self.mode)
        return affine_decode(pp.real, gap_open=self.gap_open, gap_extend=self.gap_extend,
                             threshold=self.threshold, row_dustbin=pp.row_dustbin,
                             min_mass=self.min_mass, mode=self.mode)


@dataclasses.dataclass
class PairPlan:
    """The dense plan of one pair: ``plan [Lq + 1, Lk + 1]``, last column the rows' dustbin
    mass (the model's plans have no column dustbin: the last row stays zero)."""

    plan: np.ndarray

    @property
    def real(self) -> np.ndarray:
        return self.plan[:-1, :-1]

    @property
    def row_dustbin(self) -> np.ndarray:
        return self.plan[:-1, -1]


class Predictor:
    """A loaded aligner and its featurizer.

    Args:
      checkpoint: model directory (``pfamalign train`` output ``RUN/model``); None = the
        default model shipped with the package.
      weights: ESM-2 weights for checkpoints trained on ESM-2 features.
      max_length: longest sequence accepted (residues).
      engine: how plans are computed (``pfamalign.asap.ENGINES``): ``sinkhorn`` (the trained
        steps), ``steps`` (``steps`` plain Sinkhorn steps) or ``asap`` (the operator that
        ``pfamalign compile`` wrote into the model directory).
    """

    def __init__(self, checkpoint: str | pathlib.Path | None = None, *, weights=None,
                 max_length: int = 4096, engine: str = "sinkhorn", steps: int | None = None):
        from pfamalign import checkpoint as ckpt
        from pfamalign.pipelines.embed import get_embedder

        path = pathlib.Path(checkpoint) if checkpoint is not None else default_model_dir()
        if not (path / "config.json").is_file():
            hint = ("train one with `pfamalign train` and pass RUN_DIR/model" if checkpoint is not None
                    else "the package was installed without its default model; reinstall pfamalign "
                         "or pass --checkpoint")
            raise FileNotFoundError(f"no aligner model at {path} (config.json missing): {hint}")
        self.path = path
        self.model, self.config = ckpt.load_model(path)
        self.engine = None  # the model's own plan
        if engine != "sinkhorn" or steps is not None:
            from pfamalign.asap import Engine

            self.engine = Engine.load(engine, path, self.model, steps=steps)
        self.decoding = DecoderSettings.load(path)
        self.pairhmm = model_pairhmm(path)
        self.embedder = get_embedder(self.config.embedder_id, weights)
        limit = self.embedder.max_residues
        self.max_length = min(max_length, limit) if limit else max_length

    # ---- featurization ------------------------------------------------------------------
    def featurize(self, sequences: Sequence[str]) -> list[np.ndarray]:
        for seq in sequences:
            if len(seq) > self.max_length:
                raise ValueError(
                    f"sequence of {len(seq)} residues is longer than this model accepts "
                    f"({self.max_length}); split it into domains or raise --max-length")
        return [np.asarray(f, np.float32) for f in self.embedder.embed(list(sequences))]

    # ---- plans --------------------------------------------------------------------------
    def plans(self, feature_pairs: Iterable[tuple[np.ndarray, np.ndarray]], *,
              batch_size: int = 8) -> Iterator[PairPlan]:
        """Dense plans, in input order, computed in batches of equal padded length."""
        batch: list[tuple[np.ndarray, np.ndarray]] = []
        for pair in feature_pairs:
            batch.append(pair)
            if len(batch) == batch_size:
                yield from self._plan_batch(batch)
                batch = []
        if batch:
            yield from self._plan_batch(batch)

    def _plan_batch(self, batch):
        lq = np.array([a.shape[0] for a, _ in batch], np.int32)
        lk = np.array([b.shape[0] for _, b in batch], np.int32)
        pad = int(-(-max(lq.max(), lk.max()) // PAD_MULTIPLE) * PAD_MULTIPLE)
        dim = batch[0][0].shape[1]
        xq = np.zeros((len(batch), pad, dim), np.float32)
        xk = np.zeros((len(batch), pad, dim), np.float32)
        for n, (a, b) in enumerate(batch):
            xq[n, : len(a)], xk[n, : len(b)] = a, b
        plan = self.model.plan if self.engine is None else functools.partial(self.engine.plan, self.model)
        out = np.asarray(plan(xq, xk, lq, lk))  # jit-compiled per padded shape
        for n in range(len(batch)):  # [B, pad, pad + 1]: real keys, then the dustbin column
            full = np.zeros((lq[n] + 1, lk[n] + 1), np.float64)
            full[: lq[n], : lk[n]] = out[n, : lq[n], : lk[n]]
            full[: lq[n], lk[n]] = out[n, : lq[n], -1]
            yield PairPlan(full)

    # ---- alignment ----------------------------------------------------------------------
    def decode(self, pp: PairPlan, decoding: DecoderSettings | None = None,
               sequences: tuple[str, str] | None = None) -> PairAlignment:
        return (decoding or self.decoding).decode(pp, sequences, hmm=self.pairhmm)

    def align(self, seq_a: str, seq_b: str, decoding: DecoderSettings | None = None
              ) -> tuple[PairAlignment, PairPlan]:
        fa, fb = self.featurize([seq_a, seq_b])
        pp = next(self.plans([(fa, fb)]))
        return self.decode(pp, decoding, (seq_a, seq_b)), pp

    def align_records(self, pairs: Iterable[dict], decoding: DecoderSettings | None = None
                      ) -> Iterator[tuple[AlignmentRecord, PairPlan]]:
        """Streams the alignment record and plan of each pair record (``pfamalign.inputs``).
        A ValueError about one pair starts with its ``where`` (a pairs-file line) if it has one."""
        for pair in pairs:
            try:
                aln, pp = self.align(pair["q_seq"], pair["k_seq"], decoding)
                rec = AlignmentRecord.from_alignment(pair["q_seq"], pair["k_seq"], aln,
                                                     id_a=pair["q_id"], id_b=pair["k_id"])
            except ValueError as err:
                if "where" not in pair:
                    raise
                raise ValueError(f"{pair['where']}: {err}") from err
            yield rec, pp
