"""The one JSON output policy: strict JSON, NaN and infinities become null, numpy scalars and
arrays plain Python, paths strings. Every JSON file, document and line pfamalign writes goes
through here (``pfamalign.pipelines`` too: this module imports only numpy)."""

from __future__ import annotations

import json
import math
import os

import numpy as np


def clean(x):
    """A JSON-safe copy of ``x`` (dicts, lists, tuples, floats, paths, and numpy or jax
    scalars and arrays)."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if hasattr(x, "__array__"):  # numpy (and jax) scalars and arrays -> Python values
        return clean(np.asarray(x).tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return x


def dumps(x, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    return json.dumps(clean(x), indent=indent, sort_keys=sort_keys, allow_nan=False)


def dumps_line(x) -> str:
    """One JSON-lines record (compact, no newline)."""
    return dumps(x, indent=None)
