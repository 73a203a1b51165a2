"""Model-independent alignment toolkit: MEA decoding of transport plans, substitution-matrix
baselines, evaluation metrics, output formats, plots and certificates.

Submodules (import what you need; ``plots`` pulls in matplotlib):

* ``pairs``         -- ``PairAlignment``, pair / target conversions, the diagonal reference
* ``decode``        -- ``mea_decode`` (maximum expected accuracy or F1 of a plan; ``mea_decode_many``
                       for many), ``affine_decode`` and ``hybrid_decode`` (affine gaps)
* ``pairhmm``       -- a learned pair-HMM: match posteriors by forward-backward, fitting by counting
* ``pairhmm_numba``, ``pairhmm_batched`` -- the same posteriors, compiled (numba) and batched (XLA)
* ``numba_jit``     -- when a process starts using numba, and its kernel cache
* ``prefilter``     -- search's word prefilter
* ``baselines``     -- Needleman-Wunsch, Smith-Waterman (BLOSUM62, 11/1), diagonal pairs
* ``metrics``       -- aligned-pair P/R/F1 (micro, macro, bootstrap, identity bins), plan metrics
* ``formats``       -- pair text, aligned FASTA, Stockholm, CIGAR, JSON
* ``plots``         -- plan heatmap with marginals and path, barycenter plot
* ``certificates``  -- contraction, receiver-mass, tail-mass, plan and softmax perturbation
                       certificates (docs/design.md §6)
"""

from pfamalign.alignment.baselines import diagonal_pairs, needleman_wunsch, smith_waterman
from pfamalign.alignment.decode import mea_decode
from pfamalign.alignment.formats import AlignmentRecord, format_alignment
from pfamalign.alignment.metrics import PlanMetrics, alignment_counts, plan_metrics, prf_summary
from pfamalign.alignment.pairs import PairAlignment, diagonal_target, pairs_from_target

__all__ = [
    "AlignmentRecord", "PairAlignment", "PlanMetrics", "alignment_counts", "diagonal_pairs",
    "diagonal_target", "format_alignment", "mea_decode", "needleman_wunsch", "pairs_from_target",
    "plan_metrics", "prf_summary", "smith_waterman",
]
