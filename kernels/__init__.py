"""The transport op: banded tail-refinement Sinkhorn with the exact one-reference-tile adjoint.

``transport`` is the one public entry point; ``TransportConfig`` holds its settings. See
``sinkhorn.py`` for the maths and ``band.py`` for the tiled layout.
"""

from pfamalign.kernels.api import (Potentials, TransportResult, scaling_plan_of_scores, scaling_transport_plan,
                                   transport, transport_plan)
from pfamalign.kernels.reference import SolveStats
from pfamalign.kernels.config import BlockSizes, DustbinTokens, TransportConfig, resolve_impl

__all__ = [
    "BlockSizes", "DustbinTokens", "Potentials", "SolveStats", "TransportConfig", "TransportResult", "resolve_impl",
    "transport",
    "transport_plan",
    "scaling_transport_plan",
    "scaling_plan_of_scores",
]
