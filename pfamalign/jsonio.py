"""Strict JSON output: NaN and infinities become null, numpy scalars and arrays plain Python."""

from __future__ import annotations

import json
import math

import numpy as np


def clean(x):
    """A JSON-safe copy of ``x`` (dicts, lists, tuples, numpy values, floats)."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return clean(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dumps(x, *, indent: int | None = 2) -> str:
    return json.dumps(clean(x), indent=indent, allow_nan=False)
