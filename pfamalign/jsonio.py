"""The one JSON output policy: strict JSON, NaN and infinities become null, numpy scalars and
arrays plain Python, paths strings. Every JSON file, document and line pfamalign writes goes
through here (``pfamalign.pipelines`` too: this module imports only numpy). Reading: the
fields of a settings object read from a user's file are checked by ``check_fields``."""

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


_SCALARS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def changes(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(key, old value, new value)`` of each field that differs between two settings
    documents, nested fields named ``a.b`` (a field one lacks: None on that side)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out


def check_fields(cls, data, what: str) -> dict:
    """``data`` (a settings dataclass's fields read from JSON) as a dict, after the checks
    that keep a bad file from becoming a traceback: a JSON object, no unknown keys, and each
    scalar field (annotated ``str``, ``int``, ``float`` or ``bool``) of its type (no bool for
    a number, no NaN or infinity). Raises ValueError naming ``what``."""
    import dataclasses

    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(data).__name__}")
    fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(fields)}")
    for name, value in data.items():
        kind, optional = fields[name].removesuffix(" | None"), fields[name].endswith(" | None")
        kinds = _SCALARS.get(kind)
        if kinds is None or (optional and value is None):
            continue
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"{what}: {name} must be a finite {kind}, got {value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            # 10**400 overflowed float() later (a traceback); its digits cannot even be printed
            raise ValueError(f"{what}: {name} must be a {kind} of at most 2**53 in size, got a number of "
                             f"{value.bit_length()} bits")
    return dict(data)


MAX_INT = 2 ** 53  # the largest integer a JSON settings field may hold (exact as a float too)
