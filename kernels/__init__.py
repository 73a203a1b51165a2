"""The transport op: banded tail-refinement Sinkhorn with the exact one-reference-tile adjoint.

``transport`` is the op (outputs, gradients, potentials); ``TransportConfig`` holds its
settings. ``transport_plan`` gives the op's dense plan for inspection and decoding, and
``scaling_transport_plan`` / ``scaling_plan_of_scores`` the inference plan computed in the
scaling domain (``scaling.py``, checked against the reference). See ``sinkhorn.py`` for the
maths and ``band.py`` for the tiled layout.
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
