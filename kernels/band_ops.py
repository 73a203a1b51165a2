"""The contract of a banded backend: the primitives ``sinkhorn.py`` is written against.

A backend works on flattened problems ``[N, Lp, ...]`` (N = batch x heads, Lp the padded
length of a ``band.BandGeometry``) and on the band ``|i - j| <= W`` among active rows and
columns only; the dustbin spokes, potentials and centering are ``sinkhorn.py``'s. Scores and
plans are backend handles, opaque to the caller: ``XlaBandOps`` keeps the band resident as
tiles, ``PallasBandOps`` returns lazy handles and recomputes score tiles inside its kernels.
A new backend subclasses ``BandOps`` and defines every member: one it forgets leaves the class
abstract, and instantiating it raises TypeError.
"""

from __future__ import annotations

import abc
from typing import Any, Protocol, runtime_checkable

import jax

BandHandle = Any  # a backend's handle for the masked score band S
PlanHandle = Any  # a backend's handle for a plan exp(S + row_pot ⊕ col_pot) on the band


@runtime_checkable
class BandOps(Protocol):
    """Banded primitives: masked scores, log-sum-exp half steps, plans and plan products.

    Entries outside the support (off the band, or in an inactive row or column) have score
    ``-inf`` and plan entry exactly 0; a line with no entry has log-sum-exp ``-inf``.
    """

    # The capability flags: a backend sets both as plain attributes.
    @property
    @abc.abstractmethod
    def keeps_plans(self) -> bool:
        """A plan handle holds its entries, so one plan can be kept and reused across steps
        (``sinkhorn.run_steps_scaling``); False when every product rebuilds its plan tiles
        (the Pallas backends, the stored band's included)."""

    @property
    @abc.abstractmethod
    def takes_shift(self) -> bool:
        """``row_lse`` / ``col_lse`` take the previous step's value as ``shift`` for one pass,
        the caller checking the result and falling back to the exact form behind a branch.
        False: the caller never passes one (the kernels' online max is exact in one pass; the
        XLA path with ``branch_free`` has no branch to take)."""

    @abc.abstractmethod
    def scores(self, q: jax.Array, k: jax.Array, row_active: jax.Array, col_active: jax.Array,
               scale) -> BandHandle:
        """``S_ij = scale <q_i, k_j>`` on the masked band; q, k ``[N, Lp, d]``, masks
        ``[N, Lp]`` bool, scale a scalar."""

    @abc.abstractmethod
    def rescale(self, s: BandHandle, factor) -> BandHandle:
        """``factor * S`` (a new temperature); factor a scalar, possibly traced."""

    @abc.abstractmethod
    def row_lse(self, s: BandHandle, col_bias: jax.Array, shift: jax.Array | None = None) -> jax.Array:
        """``LSE_j (S_ij + col_bias_j)`` over each row's band ``[N, Lp]``; col_bias ``[N, Lp]``,
        or an extended potential ``[N, Lp + 1]`` whose last entry (the dustbin slot) is ignored
        (the caller passes it whole: a slice would be a copy, a kernel launch on a GPU).

        ``shift [N, Lp]``, when given, is a per-row stabilizer close to the result (the
        previous step's value) allowing one pass instead of a max pass and a sum pass; the
        caller checks that ``result - shift`` stayed in a safe range."""

    @abc.abstractmethod
    def col_lse(self, s: BandHandle, row_bias: jax.Array, shift: jax.Array | None = None) -> jax.Array:
        """``LSE_i (S_ij + row_bias_i)`` over each column's band ``[N, Lp]``; row_bias (``[N,
        Lp]`` or extended) and shift ``[N, Lp]`` as in ``row_lse``."""

    @abc.abstractmethod
    def plan(self, s: BandHandle, row_pot: jax.Array, col_pot: jax.Array) -> PlanHandle:
        """``P_ij = exp(S_ij + row_pot_i + col_pot_j)`` on the band; potentials ``[N, Lp]``."""

    @abc.abstractmethod
    def plan_rows(self, p: PlanHandle, y: jax.Array, x: jax.Array | None = None,
                  z: jax.Array | None = None) -> jax.Array:
        """``out_i = Σ_j P_ij <x_i, z_j> y_j`` ``[N, Lp, m]``: y ``[N, Lp, m]`` on columns,
        x ``[N, Lp, mx]`` on rows and z ``[N, Lp, mx]`` on columns, both or neither (neither:
        ``<x_i, z_j> = 1``)."""

    @abc.abstractmethod
    def plan_cols(self, p: PlanHandle, y: jax.Array, x: jax.Array | None = None,
                  z: jax.Array | None = None) -> jax.Array:
        """``out_j = Σ_i P_ij <x_i, z_j> y_i`` ``[N, Lp, m]``: y ``[N, Lp, m]`` and x on rows,
        z on columns, as in ``plan_rows``."""

    def modulated_products(self, p: PlanHandle, x: jax.Array, z: jax.Array, y_cols: jax.Array,
                           y_rows: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Both products of one modulated plan ``D_ij = P_ij <x_i, z_j>`` (the gradient's
        ``dS`` times k and times q): ``(Σ_j D_ij y_cols_j, Σ_i D_ij y_rows_i)``, each ``[N, Lp,
        m]``. By default two modulated products; a backend may form D once for both."""
        return self.plan_rows(p, y_cols, x, z), self.plan_cols(p, y_rows, x, z)
