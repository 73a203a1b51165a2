"""Decoder settings: how a transport plan (and the pair-HMM beside it) becomes one alignment.

``DecoderSettings`` is what a model directory's ``decoding.json`` holds, what ``--decoder`` and
its options override and what decoder tuning chooses; the dynamic programmes themselves are
``alignment.decode``'s, the plans ``plans.PairPlan``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import pathlib
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pfamalign import jsonio
from pfamalign.alignment.decode import MODES, OBJECTIVES, affine_decode, hybrid_decode, mea_decode_many
from pfamalign.alignment.pairhmm import AnyPairHMM, default_pairhmm, match_posteriors, plan_log_odds
from pfamalign.alignment.pairs import PairAlignment

if TYPE_CHECKING:
    from pfamalign.plans import PairPlan

DECODERS = ("affine", "mea", "hybrid", "posterior")
# The plan pair-HMM's powers: 0.05-0.2 are chosen in tuning; beyond this the plan's log-odds
# (a power times up to ~70) leave the range where a forward pass means anything.
MAX_PLAN_POWER = 10.0
# The largest |gap_open|, |gap_extend|, |gap_cost|, |threshold|, |plan_weight|: far past any useful
# value (plan mass is at most 1 a pair, BLOSUM62 at most 11), and far from where the decoders'
# sums overflow to inf (from ~1e307 they did: a wrong alignment with a score of -inf or null)
MAX_COST = 1e6


@dataclasses.dataclass(frozen=True)
class DecoderSettings:
    """How a plan becomes a discrete alignment.

    ``affine``: Gotoh DP on ``P - threshold`` with gap costs between aligned pairs (plan-mass
    units); ``mea``: maximum expected accuracy (sum of plan mass, ``gap_cost`` per unaligned
    residue); ``hybrid``: Gotoh DP on ``BLOSUM62 + plan_weight * P`` with gap costs in BLOSUM
    units (needs the sequences); ``posterior``: MEA (``gap_cost``, ``min_mass``) on ``alpha * P
    + (1 - alpha) * P_hmm``, the plan mixed with the pair-HMM's match posteriors (the model
    directory's ``pairhmm.json``, else the shipped pair-HMM; needs the sequences; ``alpha = 0``
    is ProbCons-style pair-HMM MEA, ``alpha = 1`` the plan alone).
    ``plan_power`` (``posterior``, > 0): the plan enters as the match posteriors of the plan
    pair-HMM instead of as it is: the pair-HMM's gap transitions with the plan's odds raised to
    this power as match emissions (``pairhmm.plan_log_odds``; no substitution table), so that
    with ``alpha = 1`` the plan alone carries the alignment through a path-consistent posterior.
    ``objective`` (``mea`` and ``posterior``): ``accuracy`` maximizes the expected number of
    right pairs, ``f1`` the expected F1 of the aligned pairs (it leaves out pairs less likely
    than half the F1 reached; ``alignment.decode``).
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
    objective: str = "accuracy"  # mea / posterior: "accuracy" or "f1"
    plan_power: float = 0.0  # posterior: > 0, the plan through the plan pair-HMM; 0, as it is

    def __post_init__(self):
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and (isinstance(value, bool) or not (isinstance(value, numbers.Real)
                                                                       and math.isfinite(value))):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
        for name in ("gap_open", "gap_extend", "gap_cost", "threshold", "plan_weight"):
            if abs(getattr(self, name)) > MAX_COST:
                raise ValueError(f"{name} must be at most {MAX_COST:g} in absolute value, got {getattr(self, name)}")
        if not self.gap_open >= self.gap_extend >= 0:
            raise ValueError(f"need gap_open >= gap_extend >= 0, got {self.gap_open}, {self.gap_extend}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if not 0 <= self.plan_power <= MAX_PLAN_POWER:
            raise ValueError(f"plan_power must be from 0 to {MAX_PLAN_POWER:g}, got {self.plan_power}")
        for name in ("gap_cost", "min_mass", "plan_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.min_mass > 1:  # no pair's plan or posterior mass exceeds 1: nothing would align
            raise ValueError(f"min_mass must be from 0 to 1 (a pair's plan or posterior mass is at "
                             f"most 1), got {self.min_mass}")

    @classmethod
    def for_decoder(cls, decoder: str) -> "DecoderSettings":
        """The defaults of one decoder (gap costs are in different units per decoder)."""
        if decoder == "hybrid":  # Needleman-Wunsch's BLOSUM62 gap costs, global
            return cls(decoder=decoder, gap_open=11.0, gap_extend=1.0)
        return cls(decoder=decoder)

    # Settings that mean the same to every decoder that reads them: another decoder keeps them
    # (not min_mass: posterior applies it to the mixed posterior, the others to the plan)
    SHARED = ("mode", "objective")

    def override(self, **changes) -> "DecoderSettings":
        """These settings with the ``changes`` that are not None. Another ``decoder`` starts
        from that decoder's defaults (its gap costs are in other units), keeping the
        ``SHARED`` settings it reads (a model's local mode or f1 objective stays)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown decoder setting(s) {', '.join(unknown)}; "
                            f"choose from {', '.join(sorted(names))}")
        changes = {k: v for k, v in changes.items() if v is not None}
        decoder = changes.get("decoder", self.decoder)
        base = self
        if decoder != self.decoder:
            kept = {k: getattr(self, k) for k in self.SHARED if k in self.reads(decoder)}
            base = dataclasses.replace(self.for_decoder(decoder), **kept)
        return dataclasses.replace(base, **changes)

    @classmethod
    def load(cls, directory: pathlib.Path) -> "DecoderSettings":
        path = pathlib.Path(directory) / "decoding.json"
        if not path.is_file():
            return cls()
        try:
            fields = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as err:  # ValueError: also 4,300+ digits
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
        from pfamalign.pipelines.records import write_json  # atomic: a model directory is never torn

        write_json(pathlib.Path(directory) / "decoding.json", dataclasses.asdict(self), indent=2)

    # the settings each decoder reads (``decode_many``); ``decoder`` and ``mode`` are read by all
    READS = {"affine": ("gap_open", "gap_extend", "threshold", "min_mass"),
             "mea": ("gap_cost", "min_mass", "objective"),
             "hybrid": ("plan_weight", "gap_open", "gap_extend", "min_mass"),
             "posterior": ("gap_cost", "min_mass", "objective", "alpha", "plan_power")}

    @classmethod
    def reads(cls, decoder: str) -> tuple[str, ...]:
        """The settings ``decoder`` reads: ``READS``, and ``decoder`` and ``mode`` (read by all)."""
        if not (isinstance(decoder, str) and decoder in cls.READS):
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
        return ("decoder", "mode", *cls.READS[decoder])

    def unread(self, changes: dict) -> list[str]:
        """The settings among ``changes`` (those not None) that this decoder does not read:
        given, they would change nothing."""
        return [k for k, v in changes.items() if v is not None and k not in self.reads(self.decoder)]

    def uses_pairhmm(self) -> bool:
        """Whether the decoder mixes in the pair-HMM's (substitution-table) posteriors."""
        return self.decoder == "posterior" and self.alpha < 1

    def uses_plan_hmm(self) -> bool:
        """Whether the plan enters through the plan pair-HMM (``plan_power``)."""
        return self.decoder == "posterior" and self.alpha > 0 and self.plan_power > 0

    def plan_posteriors(self, pp: "PairPlan", sequences: tuple[str, str], hmm: AnyPairHMM) -> np.ndarray:
        """The plan pair-HMM's match posteriors of one plan (the reference engine; the
        ``Predictor`` batches them)."""
        return match_posteriors(hmm, *sequences, local=self.mode == "local",
                                log_emissions=plan_log_odds(pp.real, self.plan_power))

    def decode(self, pp: "PairPlan", sequences: tuple[str, str] | None = None, *,
               hmm_posteriors: np.ndarray | None = None, hmm: AnyPairHMM | None = None,
               plan_posteriors: np.ndarray | None = None) -> PairAlignment:
        """The alignment of one plan; ``sequences`` (the two residue strings) for ``hybrid``
        and ``posterior``; for ``posterior``, ``hmm_posteriors`` (their pair-HMM match
        posteriors, if already computed, under the model of this ``mode``: local posteriors
        for local mode), ``plan_posteriors`` (with ``plan_power``: the plan pair-HMM's, if
        already computed) or ``hmm`` (the parameters; default: the shipped)."""
        return self.decode_many([pp], [sequences], hmm_posteriors=[hmm_posteriors], hmm=hmm,
                                plan_posteriors=[plan_posteriors])[0]

    def decode_many(self, plans: Sequence["PairPlan"], sequences: Sequence[tuple[str, str] | None], *,
                    hmm_posteriors: Sequence[np.ndarray | None] | None = None, hmm: AnyPairHMM | None = None,
                    plan_posteriors: Sequence[np.ndarray | None] | None = None) -> list[PairAlignment]:
        """``decode`` of each plan (the lists in step): the MEA decoders (``posterior``,
        ``mea``) decode them all at once (``mea_decode_many``), the others one by one."""
        count = len(plans)
        hmm_posteriors = hmm_posteriors or [None] * count
        plan_posteriors = plan_posteriors or [None] * count
        settings = dict(min_mass=self.min_mass, gap_cost=self.gap_cost, mode=self.mode, objective=self.objective)
        if self.decoder == "posterior":
            hmm = hmm or default_pairhmm()
            return mea_decode_many([self._posterior_mix(pp, pair, hmm, post, plan_post) for pp, pair, post, plan_post
                                    in zip(plans, sequences, hmm_posteriors, plan_posteriors)], **settings)
        if self.decoder == "mea":
            return mea_decode_many([pp.real for pp in plans], row_dustbins=[pp.row_dustbin for pp in plans],
                                   col_dustbins=[pp.col_dustbin for pp in plans], **settings)
        if self.decoder == "hybrid":
            if any(pair is None for pair in sequences):
                raise ValueError("the hybrid decoder needs the two sequences")
            return [hybrid_decode(pp.real, *pair, plan_weight=self.plan_weight, gap_open=self.gap_open,
                                  gap_extend=self.gap_extend, min_mass=self.min_mass, mode=self.mode)
                    for pp, pair in zip(plans, sequences)]
        return [affine_decode(pp.real, gap_open=self.gap_open, gap_extend=self.gap_extend,
                              threshold=self.threshold, row_dustbin=pp.row_dustbin,
                              col_dustbin=pp.col_dustbin, min_mass=self.min_mass, mode=self.mode)
                for pp in plans]

    def _posterior_mix(self, pp: "PairPlan", sequences: tuple[str, str] | None, hmm: AnyPairHMM,
                       hmm_posteriors: np.ndarray | None, plan_posteriors: np.ndarray | None) -> np.ndarray:
        """What the ``posterior`` decoder decodes: ``alpha`` x the plan (or the plan
        pair-HMM's posteriors) + ``1 - alpha`` x the pair-HMM's, each computed here unless given."""
        if sequences is None:
            raise ValueError("the posterior decoder needs the two sequences")
        if self.uses_plan_hmm() and plan_posteriors is None:
            plan_posteriors = self.plan_posteriors(pp, sequences, hmm)
        mixed = self.alpha * (plan_posteriors if self.uses_plan_hmm() else pp.real)
        if self.uses_pairhmm():
            if hmm_posteriors is None:
                hmm_posteriors = match_posteriors(hmm, *sequences, local=self.mode == "local")
            mixed += (1 - self.alpha) * hmm_posteriors  # in place: the same sum, one array less
        return mixed
