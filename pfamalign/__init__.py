"""pfamalign: protein pairwise alignment with a differentiable banded Sinkhorn aligner."""

__version__ = "0.1.0"
