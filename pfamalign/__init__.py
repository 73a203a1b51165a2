"""pfamalign: protein pairwise alignment with a differentiable banded Sinkhorn aligner.

The Python API (``pfamalign.pairwise``): ``pfamalign.align(seq_a, seq_b)`` and
``pfamalign.PairAligner``, returning ``AlignmentRecord``s.
"""

__version__ = "0.1.0"
__all__ = ["PairAligner", "align", "AlignmentRecord", "__version__"]


def __getattr__(name: str):
    # imported when first used: the command line's start stays free of jax and the model
    if name in ("PairAligner", "align", "AlignmentRecord"):
        from pfamalign import pairwise

        return getattr(pairwise, name)
    raise AttributeError(f"module 'pfamalign' has no attribute {name!r}")
