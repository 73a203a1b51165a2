"""A ProbCons-style pair-HMM: posterior match probabilities ``P(x_i ~ y_j)`` by forward-backward.

States: a match state M (emits a residue pair) and, per gap type g (short and long gaps, or
one type), an insert state X_g (a query residue against a gap) and Y_g (a key residue against
a gap). Transitions, symmetric in the two sequences:

    M   -> X_g, M -> Y_g : gap_open[g]          M -> M : 1 - 2 sum(gap_open)
    X_g -> X_g           : gap_extend[g]        X_g -> M : (1 - gap_extend[g]) (1 - gap_switch)
    X_g -> Y_h           : (1 - gap_extend[g]) gap_switch w_h,   w_h = gap_open[h] / sum(gap_open)

and the same with X and Y exchanged (the switch lets a gap in one sequence follow a gap in the
other, as Pfam's unaligned insert regions do). Globally (``local=False``, the default) a path
starts as if from M at the origin and ends at ``(Lq, Lk)`` in any state, so end gaps are
charged like inner ones (ProbCons' choice). Locally (``local=True``) the path is a segment
that starts with a pair at any cell and ends with a pair at any cell; the residues before and
after it are flanks emitted by the background (log-odds 0) at no gap charge, with start and
end uniform over the cells (``log_start = log_end = -log(Lq Lk)``; every local path has one
of each, so the constant changes ``log Z`` and no posterior). It is Smith-Waterman's
segment, summed over instead of maximised: the posteriors of a domain inside unrelated
flanks fall off at the domain's ends instead of being stretched across the flanks.

Emissions are log-odds ``log p(a, b) - log q(a) - log q(b)`` for M and 0 for the insert
states: every path emits each residue once, so the background factors are common to all paths
and cancel from the posteriors. Residues outside the 20 standard ones score 0.

Forward and backward run row by row in log space. A row's M and X states depend on the row
above only; Y_g is a first-order recurrence along the row, ``y_j = lse(c_j, log e + y_{j-1})``,
solved at once as ``j log e + logcumsumexp_k(c_k - k log e)``. So the cost is ``Lq`` vector
operations of length ``Lk`` per state, and the memory two ``[Lq + 1, Lk + 1]`` float tables.

Parameters are learned by counting on reference alignments (``fit``): residue-pair and
background counts, gap opens, switches, and a mixture of geometric gap lengths (EM) for the
gap types. The shipped parameters (``assets/pairhmm.json``) come from
``scripts/fit_pairhmm.py`` on the training families of the bundled dataset.

A ``PairHMMMixture`` holds one such model per range of sequence identity (close and remote
homologs differ in substitutions and in gap rates) over a shared background, and mixes their
posteriors per pair by how well each explains the two sequences:

    P(i ~ j | x, y) = sum_k P(k | x, y) P_k(i ~ j | x, y),    P(k | x, y) ∝ prior_k Z_k(x, y),

``Z_k`` the likelihood ratio of the pair under model k (comparable across k because the
background is shared). It is the pair-HMM of the mixture of divergences, not a fixed one.

**The plan as emissions** (``log_emissions``, ``plan_log_odds``): any ``[Lq, Lk]`` table of
match log-odds can replace the substitution table. The ``posterior`` decoder's plan pair-HMM
uses the transport plan's own odds, ``beta log(P_ij sqrt(Lq Lk))`` (``sqrt(Lq Lk) P_ij`` is 1
where the plan is uniform), under the fitted gap transitions: the plan's evidence, made
consistent along a path with affine gaps, and no substitution matrix. ``beta`` (the decoder's
``plan_power``, about 0.05 for the trained models: their ``eps = 1`` plans are far sharper
than pair-HMM odds) is tuned on validation families.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import pathlib
from typing import Iterable

import numpy as np

from pfamalign import jsonio

RESIDUES = "ACDEFGHIKLMNPQRSTVWY"  # emission alphabet; any other letter is index 20 (scores 0)
ASSET = "pairhmm.json"


@functools.lru_cache(maxsize=None)
def _index_table() -> np.ndarray:
    table = np.full(128, len(RESIDUES), np.int64)
    for n, a in enumerate(RESIDUES):
        table[ord(a)] = table[ord(a.lower())] = n
    return table


def residue_indices(seq: str) -> np.ndarray:
    """Index of each residue in ``RESIDUES`` (20 for every other letter)."""
    return _index_table()[np.frombuffer(seq.encode("ascii"), np.uint8)]


class _Mixes:
    """What the engines ask of any pair-HMM: its ``components``, their ``prior``, and how one
    pair's per-component results combine. A single pair-HMM is the one-component mixture
    (prior 1, weight exactly 1), so no engine branches on the kind."""

    components: tuple["PairHMM", ...]
    prior: np.ndarray

    def weights(self, log_z) -> np.ndarray:
        """``P(k | x, y)`` from the components' ``log Z_k`` (last axis; any leading axes are
        pairs)."""
        log_z = np.asarray(log_z, np.float64)
        return np.exp(np.log(self.prior) + log_z - self.log_z(log_z)[..., None])

    def log_z(self, log_z) -> np.ndarray:
        """The mixture's ``log sum_k prior_k Z_k`` from the components' ``log Z_k`` (last axis)."""
        return np.logaddexp.reduce(np.log(self.prior) + np.asarray(log_z, np.float64), axis=-1)

    def mix(self, posteriors, log_z) -> np.ndarray:
        """One pair's posteriors: the components' (one array each) weighted by ``weights``."""
        if len(posteriors) == 1:
            return posteriors[0]
        return sum(w * post for w, post in zip(self.weights(log_z), posteriors))


@dataclasses.dataclass(frozen=True)
class PairHMM(_Mixes):
    """Parameters: ``pair_probs [20, 20]`` joint residue-pair probabilities of the match state
    (symmetric), ``background [20]`` residue frequencies, ``gap_open [G]``, ``gap_extend [G]``
    per gap type and ``gap_switch`` (see the module docstring)."""

    pair_probs: np.ndarray
    background: np.ndarray
    gap_open: np.ndarray
    gap_extend: np.ndarray
    gap_switch: float

    @property
    def components(self) -> tuple["PairHMM", ...]:
        return (self,)

    @property
    def prior(self) -> np.ndarray:
        return np.ones(1)

    def __post_init__(self):
        for name in ("pair_probs", "background", "gap_open", "gap_extend"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), np.float64))
        n = len(RESIDUES)
        if self.pair_probs.shape != (n, n) or self.background.shape != (n,):
            raise ValueError(f"need pair_probs [{n}, {n}] and background [{n}]")
        if self.gap_open.ndim != 1 or self.gap_open.shape != self.gap_extend.shape:
            raise ValueError("gap_open and gap_extend must be 1-d of one length (the gap types)")
        if not (np.all(self.pair_probs > 0) and np.all(self.background > 0)):
            raise ValueError("emission probabilities must be positive")
        if not (np.all(self.gap_open > 0) and 2 * self.gap_open.sum() < 1):
            raise ValueError(f"need gap_open > 0 with 2 sum(gap_open) < 1, got {self.gap_open}")
        if not (np.all(self.gap_extend > 0) and np.all(self.gap_extend < 1) and 0 <= self.gap_switch < 1):
            raise ValueError("need 0 < gap_extend < 1 and 0 <= gap_switch < 1")

    @property
    def n_gap_types(self) -> int:
        return len(self.gap_open)

    def log_odds(self) -> np.ndarray:
        """``[21, 21]`` match log-odds; row and column 20 (non-standard residues) are 0."""
        n = len(RESIDUES)
        out = np.zeros((n + 1, n + 1))
        out[:n, :n] = np.log(self.pair_probs) - np.log(self.background)[:, None] - np.log(self.background)[None, :]
        return out

    def log_transitions(self) -> dict[str, np.ndarray]:
        """Log transition probabilities: ``mm`` (scalar), ``open [G]`` (M -> X_g and M -> Y_g),
        ``extend [G]``, ``close [G]`` (X_g -> M), ``switch [G, G]`` (X_g -> Y_h and Y_g -> X_h)."""
        weights = self.gap_open / self.gap_open.sum()
        leave = np.log1p(-self.gap_extend)
        with np.errstate(divide="ignore"):  # gap_switch = 0: log 0 = -inf, no switches
            log_switch = np.log(self.gap_switch)
        return {"mm": np.log1p(-2 * self.gap_open.sum()), "open": np.log(self.gap_open),
                "extend": np.log(self.gap_extend), "close": leave + np.log1p(-self.gap_switch),
                "switch": leave[:, None] + log_switch + np.log(weights)[None, :]}

    def linear_transitions(self) -> dict[str, np.ndarray]:
        """``log_transitions`` exponentiated (the fast engines run in linear space)."""
        return {name: np.exp(value) for name, value in self.log_transitions().items()}

    # ---- persistence ---------------------------------------------------------------------
    def to_json(self, recipe: str = "") -> str:
        return jsonio.dumps({"format": "pfamalign-pairhmm", "residues": RESIDUES, "recipe": recipe,
                             "pair_probs": self.pair_probs.tolist(), "background": self.background.tolist(),
                             "gap_open": self.gap_open.tolist(), "gap_extend": self.gap_extend.tolist(),
                             "gap_switch": float(self.gap_switch)})

    @classmethod
    def from_json(cls, text: str) -> "PairHMM":
        data = json.loads(text)
        if data.get("format") != "pfamalign-pairhmm" or data.get("residues") != RESIDUES:
            raise ValueError("not a pfamalign pair-HMM parameter file (format or residue order differs)")
        return cls(pair_probs=data["pair_probs"], background=data["background"], gap_open=data["gap_open"],
                   gap_extend=data["gap_extend"], gap_switch=data["gap_switch"])


@dataclasses.dataclass(frozen=True)
class PairHMMMixture(_Mixes):
    """Pair-HMMs ``components`` (one background for all) with ``prior`` weights; ``edges``:
    the percent-identity boundaries of the reference pairs each component was counted on
    (``len(edges) + 1`` components), kept for the record."""

    components: tuple[PairHMM, ...]
    prior: np.ndarray
    edges: tuple[float, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "components", tuple(self.components))
        object.__setattr__(self, "prior", np.asarray(self.prior, np.float64))
        object.__setattr__(self, "edges", tuple(float(e) for e in self.edges))
        if not self.components or self.prior.shape != (len(self.components),):
            raise ValueError("need one prior weight per component, and at least one component")
        if not (np.all(self.prior > 0) and abs(self.prior.sum() - 1) < 1e-9):
            raise ValueError(f"the prior must be positive and sum to 1, got {self.prior}")
        if any(not np.array_equal(c.background, self.components[0].background) for c in self.components):
            raise ValueError("the components must share one background (their likelihoods are compared)")

    def to_json(self, recipe: str = "") -> str:
        return jsonio.dumps({"format": MIXTURE_FORMAT, "residues": RESIDUES, "recipe": recipe,
                             "edges": list(self.edges), "prior": self.prior.tolist(),
                             "components": [json.loads(c.to_json()) for c in self.components]})

    @classmethod
    def from_json(cls, text: str) -> "PairHMMMixture":
        data = json.loads(text)
        if data.get("format") != MIXTURE_FORMAT or data.get("residues") != RESIDUES:
            raise ValueError("not a pfamalign pair-HMM mixture file (format or residue order differs)")
        return cls(components=[PairHMM.from_json(json.dumps(c)) for c in data["components"]],
                   prior=data["prior"], edges=data.get("edges", ()))


MIXTURE_FORMAT = "pfamalign-pairhmm-mixture"
AnyPairHMM = PairHMM | PairHMMMixture


def load(text: str) -> AnyPairHMM:
    """A parameter file of either kind (one pair-HMM or a mixture), by its ``format``."""
    try:
        kind = json.loads(text).get("format")
    except (json.JSONDecodeError, AttributeError):
        kind = None
    return PairHMMMixture.from_json(text) if kind == MIXTURE_FORMAT else PairHMM.from_json(text)


def asset_path() -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files("pfamalign") / "assets" / ASSET))


MODEL_FILE = "pairhmm.json"  # a model directory's own parameters (fitted on its training families)


@functools.lru_cache(maxsize=None)
def default_pairhmm() -> AnyPairHMM:
    """The parameters shipped with the package (fitted on the bundled training families)."""
    return load(asset_path().read_text())


def model_pairhmm(model_dir: pathlib.Path) -> AnyPairHMM:
    """A model directory's pair-HMM (``pairhmm.json``, fitted on the families the model trained
    on), else the shipped one: a model evaluated on held-out families must not use
    parameters counted on them."""
    path = pathlib.Path(model_dir) / MODEL_FILE
    return load(path.read_text()) if path.is_file() else default_pairhmm()


# ---- forward-backward ----------------------------------------------------------------------

def _lse(*terms) -> np.ndarray:
    """Elementwise log-sum-exp of broadcastable arrays (-inf where all are -inf)."""
    stack = np.stack(np.broadcast_arrays(*terms))
    top = stack.max(axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(stack - safe).sum(axis=0))


def _geometric_scan(c: np.ndarray, log_decay: np.ndarray) -> np.ndarray:
    """``y[:, j] = lse(c[:, j], log_decay + y[:, j-1])`` along the last axis, for ``c [G, n]``."""
    k = np.arange(c.shape[1]) * log_decay[:, None]
    return k + np.logaddexp.accumulate(c - k, axis=1)


def _emissions(hmm: PairHMM, seq_a: str, seq_b: str) -> np.ndarray:
    return hmm.log_odds()[residue_indices(seq_a)[:, None], residue_indices(seq_b)[None, :]]


def local_log_start(lq: int, lk: int) -> float:
    """``log_start = log_end`` of the local model: uniform over the ``Lq x Lk`` cells."""
    return -float(np.log(lq) + np.log(lk))


def plan_log_odds(plan: np.ndarray, power: float) -> np.ndarray:
    """Match log-odds from a ``[Lq, Lk]`` transport plan: ``power * log(P sqrt(Lq Lk))``
    (module docstring), entries below 1e-30 read as 1e-30."""
    plan = np.asarray(plan, np.float64)
    return power * np.log(np.maximum(plan, 1e-30) * np.sqrt(plan.shape[0] * plan.shape[1]))


def log_forward_backward(hmm: PairHMM, seq_a: str, seq_b: str, *, local: bool = False,
                         log_emissions: np.ndarray | None = None
                         ) -> tuple[np.ndarray, np.ndarray, float]:
    """Log forward and backward values of the match state on the ``(Lq + 1) x (Lk + 1)``
    lattice (``[i, j]``: residues up to i and j emitted, the last pair (i-1, j-1) by M) and
    ``log Z``, the log-likelihood ratio of the two sequences against the background;
    ``local``: the segment model (module docstring); ``log_emissions``: ``[Lq, Lk]`` match
    log-odds in place of the substitution table's."""
    t = hmm.log_transitions()
    emit = _emissions(hmm, seq_a, seq_b) if log_emissions is None else checked_emissions(
        log_emissions, len(seq_a), len(seq_b))
    lq, lk = emit.shape
    g = hmm.n_gap_types
    neg = -np.inf
    start = local_log_start(lq, lk) if local else neg  # into M at any pair, from the flank
    fwd_m = np.full((lq + 1, lk + 1), neg)
    if not local:
        fwd_m[0, 0] = 0.0  # the path starts as if from M at the origin
    x_row = np.full((g, lk + 1), neg)
    y_row = np.full((g, lk + 1), neg)
    for i in range(lq + 1):
        m_row = fwd_m[i]
        if i > 0:
            m_row[1:] = _lse(t["mm"] + fwd_m[i - 1, :-1], *(t["close"][h] + x_row[h, :-1] for h in range(g)),
                             *(t["close"][h] + y_row[h, :-1] for h in range(g)), start) + emit[i - 1]
            x_row = _lse(t["open"][:, None] + fwd_m[i - 1][None, :], t["extend"][:, None] + x_row,
                         *(t["switch"][h][:, None] + y_row[h][None, :] for h in range(g)))
        enter_y = np.full((g, lk + 1), neg)  # into Y_g at (i, j) from M or X_h at (i, j - 1)
        enter_y[:, 1:] = _lse(t["open"][:, None] + m_row[None, :-1],
                              *(t["switch"][h][:, None] + x_row[h][None, :-1] for h in range(g)))
        y_row = _geometric_scan(enter_y, t["extend"])
    if local:  # the segment ends after a pair at any cell
        log_z = float(np.logaddexp.reduce(fwd_m[1:, 1:].ravel()) + start)
    else:
        log_z = float(_lse(fwd_m[lq, lk], *x_row[:, lk], *y_row[:, lk]))

    bwd_m = np.full((lq + 1, lk + 1), neg)
    x_next = np.full((g, lk + 1), neg)  # backward of X_g on row i + 1
    for i in range(lq, -1, -1):
        diag = np.full(lk + 1, neg)  # the next move is a pair: emission plus M at (i+1, j+1)
        if i < lq:
            diag[:-1] = emit[i] + bwd_m[i + 1, 1:]
        end = np.full(lk + 1, neg)  # any state may end the path globally, at (Lq, Lk)
        if i == lq and not local:
            end[lk] = 0.0
        end_m = end.copy()  # locally only M ends it, after any pair
        if local and i > 0:
            end_m[1:] = start
        # Y_g at (i, j): close to a pair, switch to X_h (down), extend to Y_g at (i, j + 1)
        leave_y = _lse(t["close"][:, None] + diag[None, :], end[None, :],
                       *(t["switch"][:, h][:, None] + x_next[h][None, :] for h in range(g)))
        y_row = _geometric_scan(leave_y[:, ::-1], t["extend"])[:, ::-1]
        y_right = np.full((g, lk + 1), neg)  # Y_h at (i, j + 1)
        y_right[:, :-1] = y_row[:, 1:]
        bwd_m[i] = _lse(t["mm"] + diag, end_m, *(t["open"][h] + x_next[h] for h in range(g)),
                        *(t["open"][h] + y_right[h] for h in range(g)))
        x_next = _lse(t["close"][:, None] + diag[None, :], end[None, :], t["extend"][:, None] + x_next,
                      *(t["switch"][:, h][:, None] + y_right[h][None, :] for h in range(g)))
    return fwd_m, bwd_m, log_z


def check_many(pairs, log_emissions) -> None:
    """The fast engines' input checks: every sequence non-empty, one emission table per pair
    when tables are given (each table's shape: ``checked_emissions``)."""
    if any(not a or not b for a, b in pairs):
        raise ValueError("both sequences must be non-empty")
    if log_emissions is not None and len(log_emissions) != len(pairs):
        raise ValueError(f"{len(log_emissions)} emission tables for {len(pairs)} pairs")


# The fast engines (numba, XLA) exponentiate each match log-odds: beyond this float64's exp
# overflows or underflows to 0 (the plan pair-HMM reaches at most 691, at MAX_PLAN_POWER).
MAX_LOG_EMISSION = 700.0


def checked_emissions(log_emissions, lq: int, lk: int) -> np.ndarray:
    emit = np.asarray(log_emissions, np.float64)
    if emit.shape != (lq, lk):
        raise ValueError(f"log_emissions has shape {emit.shape}, the sequences need {(lq, lk)}")
    if not np.isfinite(emit).all():
        raise ValueError("log_emissions must be finite")
    if np.abs(emit).max(initial=0.0) > MAX_LOG_EMISSION:
        raise ValueError(f"log_emissions must lie within +-{MAX_LOG_EMISSION:g} (the fast engines "
                         f"exponentiate them), got {np.abs(emit).max():.4g}")
    return emit


def plausible_posteriors(post: np.ndarray, tol: float = 1e-6) -> bool:
    """Whether ``post`` can be match posteriors: finite, within [0, 1], and no row or column
    summing past 1 (a residue is matched at most once). The fast engines scale each lattice
    row by its largest entry, which cannot hold a row whose entries span more than float64's
    range (sharp or repeated plan emissions): their answer for such a pair fails this check
    (NaN, or mass past 1) and the caller recomputes it here, in log space."""
    post = np.asarray(post)
    return bool(np.isfinite(post).all() and post.min(initial=0.0) >= -tol and post.max(initial=0.0) <= 1 + tol
                and post.sum(1).max(initial=0.0) <= 1 + tol and post.sum(0).max(initial=0.0) <= 1 + tol)


def match_posteriors(hmm: AnyPairHMM, seq_a: str, seq_b: str, *, local: bool = False,
                     log_emissions: np.ndarray | None = None) -> np.ndarray:
    """``[Lq, Lk]`` posterior probability that query residue i is aligned to key residue j
    (for a mixture: the components' posteriors weighted by ``PairHMMMixture.weights``);
    ``local``: under the segment model (the module docstring); ``log_emissions``: ``[Lq,
    Lk]`` match log-odds in place of the substitution table's (e.g. ``plan_log_odds``)."""
    if not seq_a or not seq_b:
        raise ValueError("both sequences must be non-empty")
    kw = {"local": local, "log_emissions": log_emissions}
    solved = [log_forward_backward(c, seq_a, seq_b, **kw) for c in hmm.components]
    return hmm.mix([_posterior(*fb) for fb in solved], [log_z for _, _, log_z in solved])


def log_likelihood_ratio(hmm: AnyPairHMM, seq_a: str, seq_b: str, *, local: bool = False) -> float:
    """``log P(x, y | homologous) / P(x) P(y)``: the pair's likelihood under the pair-HMM,
    summed over all its alignments (forward), against both sequences drawn from the
    background; for a mixture, ``log sum_k prior_k Z_k``. ``local``: under the segment model
    (unrelated flanks cost nothing). The homology score of ``pfamalign search``."""
    if not seq_a or not seq_b:
        raise ValueError("both sequences must be non-empty")
    return float(hmm.log_z([log_forward_backward(c, seq_a, seq_b, local=local)[2] for c in hmm.components]))


def _posterior(fwd_m: np.ndarray, bwd_m: np.ndarray, log_z: float) -> np.ndarray:
    return np.minimum(np.exp(fwd_m[1:, 1:] + bwd_m[1:, 1:] - log_z), 1.0)


# ---- fitting by counting ---------------------------------------------------------------------

def _gap_runs(target: np.ndarray, key_length: int) -> tuple[list[int], int, int, int]:
    """The gap runs of one reference alignment (as the model reads it: between consecutive
    pairs, before the first and after the last) and its transition counts.

    Returns (run lengths, M -> M count, gap openings, switches). A segment with unaligned
    residues in both sequences is read as a query run, then a switch, then a key run.
    """
    rows = np.flatnonzero(target >= 0)
    corners = [(-1, -1)] + [(int(i), int(target[i])) for i in rows] + [(len(target), key_length)]
    runs, mm, opens, switches = [], 0, 0, 0
    for (i0, j0), (i1, j1) in zip(corners[:-1], corners[1:]):
        di, dj = i1 - i0 - 1, j1 - j0 - 1
        if di == 0 and dj == 0:
            mm += (i1, j1) != (len(target), key_length)  # the end is no transition
            continue
        opens += 1
        switches += di > 0 and dj > 0
        runs += [d for d in (di, dj) if d > 0]
    return runs, mm, opens, switches


def _geometric_mixture(lengths: np.ndarray, n_types: int, iterations: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-likelihood mixture of geometric run lengths (``P(L) = (1 - e) e^(L-1)``, L >= 1)
    by EM: returns the weights and extension probabilities, shortest gaps first."""
    lengths = np.asarray(lengths, np.float64)
    weights = np.full(n_types, 1.0 / n_types)
    extend = np.quantile(1 - 1 / lengths, np.linspace(0.25, 0.9, n_types)).clip(0.05, 0.99)
    for _ in range(iterations):
        log_p = np.log(weights)[:, None] + np.log1p(-extend)[:, None] + (lengths - 1)[None, :] * np.log(extend)[:, None]
        resp = np.exp(log_p - np.logaddexp.reduce(log_p, axis=0))
        weights = resp.sum(1) / resp.sum()
        extend = ((resp * (lengths - 1)).sum(1) / (resp * lengths).sum(1)).clip(1e-3, 1 - 1e-6)
    order = np.argsort(extend)
    return weights[order], extend[order]


def fit(records: Iterable[dict], *, n_gap_types: int = 2, pseudocount: float = 1.0) -> PairHMM:
    """Supervised maximum-likelihood parameters from reference alignments (pair records with
    ``q_seq``, ``k_seq`` and ``target``): residue-pair counts of the aligned pairs (both
    orders, so the emissions are symmetric), background counts of all residues, transition
    counts, and an EM mixture of geometric gap lengths for the gap types; ``pseudocount`` is
    added to every count."""
    n = len(RESIDUES)
    pairs = np.zeros((n + 1, n + 1))
    background = np.zeros(n + 1)
    runs: list[int] = []
    mm = opens = switches = 0
    for rec in records:
        a, b = residue_indices(rec["q_seq"]), residue_indices(rec["k_seq"])
        target = np.asarray(rec["target"])
        rows = np.flatnonzero(target >= 0)
        np.add.at(pairs, (a[rows], b[target[rows]]), 1.0)
        np.add.at(pairs, (b[target[rows]], a[rows]), 1.0)
        background += np.bincount(a, minlength=n + 1) + np.bincount(b, minlength=n + 1)
        r, m, o, s = _gap_runs(target, len(b))
        runs += r
        mm, opens, switches = mm + m, opens + o, switches + s
    if not runs or mm == 0:
        raise ValueError("the reference alignments have no gaps or no consecutive pairs to count")
    pair_probs = pairs[:n, :n] + pseudocount
    background = background[:n] + pseudocount
    weights, extend = _geometric_mixture(np.asarray(runs), n_gap_types)
    open_total = (opens + pseudocount) / (2 * (mm + opens) + 2 * pseudocount)  # per side
    return PairHMM(pair_probs=pair_probs / pair_probs.sum(), background=background / background.sum(),
                   gap_open=open_total * weights, gap_extend=extend,
                   gap_switch=(switches + pseudocount) / (len(runs) + 2 * pseudocount))


IDENTITY_EDGES = (30.0, 50.0)  # percent: the identity bins of the evaluation, one component each


def fit_mixture(records: Iterable[dict], *, edges: Iterable[float] = IDENTITY_EDGES,
                n_gap_types: int = 2, pseudocount: float = 1.0) -> PairHMMMixture:
    """One ``fit`` per percent-identity bin of the reference pairs (records with ``pid``),
    over the background of all of them; the prior is each bin's share of the pairs. An edge
    of a bin that cannot be counted (no pairs, or no gaps or consecutive pairs) is dropped,
    so that bin merges with a neighbour; with no edge left it is one HMM (a one-component
    mixture), and an error only if the pairs cannot be counted at all."""
    records = list(records)
    pid = np.array([float(r["pid"]) for r in records])
    edges = sorted(float(e) for e in edges)
    overall = fit(records, n_gap_types=n_gap_types, pseudocount=pseudocount)
    while True:
        bins = np.searchsorted(edges, pid, side="right")
        components, counts, failed = [], [], None
        for k in range(len(edges) + 1):
            members = [r for r, b in zip(records, bins) if b == k]
            try:
                one = fit(members, n_gap_types=n_gap_types, pseudocount=pseudocount)
            except ValueError:  # no pairs, or nothing to count in this bin
                failed = k
                break
            components.append(dataclasses.replace(one, background=overall.background))
            counts.append(len(members))
        if failed is None:
            return PairHMMMixture(components=components, prior=np.asarray(counts) / sum(counts),
                                  edges=edges)
        edges.pop(min(failed, len(edges) - 1))  # an edge of that bin: it merges with a neighbour


def fit_for_model(model_dir: pathlib.Path, data_dir, *, split: str = "train") -> AnyPairHMM:
    """Counts the pair-HMM on a dataset's ``split`` (the model's training families) and writes
    it into the model directory (``MODEL_FILE``, atomically), so that the ``posterior``
    decoder of that model never uses parameters counted on the families it is scored on."""
    from pfamalign.pipelines import reader, records

    hmm = fit_mixture(reader.iter_pairs(data_dir, split))
    recipe = f"counted on the {split} split of {reader.PairDataset(data_dir).config_hash}"
    records.write_text(pathlib.Path(model_dir) / MODEL_FILE, hmm.to_json(recipe))
    return hmm
