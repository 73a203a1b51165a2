"""Inference: load an aligner, featurize sequences, compute plans in length buckets, decode.

Shared by the ``align``, ``eval``, ``barycenter`` and ``certify`` commands: one model load,
one jit compilation per padded length, many pairs.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import math
import numbers
import pathlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from pfamalign import jsonio
from pfamalign.alignment.decode import MODES, affine_decode, hybrid_decode, mea_decode
from pfamalign.alignment.formats import AlignmentRecord
from pfamalign.alignment.pairhmm import PairHMM, default_pairhmm, match_posteriors, model_pairhmm
from pfamalign.alignment.pairs import PairAlignment
from pfamalign.resources import check_align_memory

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
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and not (isinstance(value, numbers.Real) and math.isfinite(value)):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
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
        try:
            fields = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a readable decoding.json ({err})") from None
        if isinstance(fields, dict) and "end_gaps" in fields:  # files written before `mode`
            end_gaps = fields.pop("end_gaps")
            fields.setdefault("mode", "global" if end_gaps else "local")  # `mode` wins
        fields = jsonio.check_fields(cls, fields, str(path))
        try:
            return cls(**fields)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

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


# How far a plan's masses may stray from their bounds (``PairPlan.check``): the trained
# models' 17-step plans stay within 0.05, a solve at eps = 1e-6 reaches rows of mass 2.
PLAN_TOL = 0.25


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

    def check(self, tol: float = PLAN_TOL) -> None:
        """Raises ValueError unless the plan is one (docs/design.md §3.3, §9): finite,
        non-negative, no entry (a confidence) and no key column above 1 + ``tol`` (the solve
        ends on the column half-step), and each query row's mass (real + dustbin) within
        ``tol`` of [min(1, r), max(1, r)], r = (Lk + 1) / (Lq + 1): with unbalanced targets
        the rows are off by about the ratio of the totals. A broken solve (too small an eps,
        overflow) is far outside these bounds, and its confidences would be meaningless."""
        plan = self.plan
        if not np.all(np.isfinite(plan)):
            raise ValueError("the transport plan is not finite (overflow in the solve); "
                             "the model's transport settings (eps) do not fit this pair")
        lq, lk = plan.shape[0] - 1, plan.shape[1] - 1
        ratio = (lk + 1) / (lq + 1)
        rows, cols = plan[:-1].sum(axis=1), plan[:-1, :-1].sum(axis=0)
        low, high = (1 - tol) * min(1.0, ratio), (1 + tol) * max(1.0, ratio)
        bad = [what for what, failed in (
            ("negative mass", plan.min(initial=0.0) < -tol),
            (f"an entry of {plan.max(initial=0.0):.3g}", plan.max(initial=0.0) > 1 + tol),
            (f"a key column of mass {cols.max(initial=0.0):.3g}", cols.max(initial=0.0) > 1 + tol),
            (f"query rows of mass {rows.min(initial=1.0):.3g} to {rows.max(initial=1.0):.3g} "
             f"(expected {low:.3g} to {high:.3g})",
             rows.min(initial=low) < low or rows.max(initial=high) > high)) if failed]
        if bad:
            raise ValueError(f"the transport plan is not a plan ({'; '.join(bad)}); the solve did "
                             "not converge with the model's transport settings (eps, steps)")


class Predictor:
    """A loaded aligner and its featurizer.

    Args:
      checkpoint: model directory (``pfamalign train`` output ``RUN/model``); None = the
        default model shipped with the package.
      weights: ESM-2 weights for checkpoints trained on ESM-2 features.
      max_length: longest sequence accepted (residues).
      max_memory: refuse a pair whose estimated memory (``pfamalign.resources``) is larger
        (bytes; None: no limit).
    """

    def __init__(self, checkpoint: str | pathlib.Path | None = None, *, weights=None,
                 max_length: int = 4096, max_memory: int | None = None):
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
        self.decoding = DecoderSettings.load(path)
        self.pairhmm = model_pairhmm(path)
        self.embedder = get_embedder(self.config.embedder_id, weights)
        limit = self.embedder.max_residues
        self.max_length = min(max_length, limit) if limit else max_length
        self.max_memory = max_memory  # bytes per pair (``resources``); None: no limit

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
        out = np.asarray(self.model.plan(xq, xk, lq, lk))  # jit-compiled per padded shape
        for n in range(len(batch)):  # [B, pad, pad + 1]: real keys, then the dustbin column
            full = np.zeros((lq[n] + 1, lk[n] + 1), np.float64)
            full[: lq[n], : lk[n]] = out[n, : lq[n], : lk[n]]
            full[: lq[n], lk[n]] = out[n, : lq[n], -1]
            yield PairPlan(full)

    # ---- alignment ----------------------------------------------------------------------
    def decode(self, pp: PairPlan, decoding: DecoderSettings | None = None,
               sequences: tuple[str, str] | None = None) -> PairAlignment:
        pp.check()  # a failed solve is an error for this pair, not an alignment
        return (decoding or self.decoding).decode(pp, sequences, hmm=self.pairhmm)

    def align(self, seq_a: str, seq_b: str, decoding: DecoderSettings | None = None
              ) -> tuple[PairAlignment, PairPlan]:
        check_align_memory(len(seq_a), len(seq_b), self.max_memory)
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
