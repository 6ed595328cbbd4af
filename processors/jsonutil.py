"""Canonical JSON (sorted keys, no whitespace, no NaN) and dotted-path lookups into parsed JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


class NotCanonicalJSON(ValueError):
    """The value has no exact JSON form (NaN, infinity, or an unsupported type)."""


def _default(obj: object) -> object:
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        value = float(obj)
        if not math.isfinite(value):
            raise NotCanonicalJSON(f"non-finite float {value!r}")
        return value
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise NotCanonicalJSON(f"{type(obj).__name__} is not JSON-serializable")


def canonical_json(value: Any) -> str:
    """One exact text for a value: the same value always gives the same bytes."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False, default=_default)
    except ValueError as exc:  # allow_nan=False raises ValueError for NaN / inf
        if isinstance(exc, NotCanonicalJSON):
            raise
        raise NotCanonicalJSON(str(exc)) from exc
    except TypeError as exc:
        raise NotCanonicalJSON(str(exc)) from exc


_MISSING = object()


def get_path(value: Any, path: str, default: Any = _MISSING) -> Any:
    """``get_path({"a": {"b": [1, 2]}}, "a.b.1") == 2``; an empty path returns the value itself."""
    current = value
    if not path:
        return current
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.lstrip("-").isdigit() and -len(current) <= int(part) < len(
                current):
            current = current[int(part)]
        else:
            if default is _MISSING:
                raise KeyError(f"path {path!r}: no {part!r}")
            return default
    return current


def loads_object(text: str, what: str) -> dict[str, Any]:
    """Parse a JSON object field (task_input_json, metadata_json...) with an error naming the field."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object")
    return value
