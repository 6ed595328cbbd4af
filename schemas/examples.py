"""Example records generated from a schema: every field filled, every optional branch taken.

Used by the round-trip and compatibility tests and by ``tokentrail schemas fixtures``, which writes
the committed encoded fixtures that every later schema version must still read.
"""

from __future__ import annotations

from typing import Any

from schemas.tokens import pack_floats, pack_ids

PRIMITIVE_EXAMPLES: dict[str, Any] = {
    "null": None, "boolean": True, "int": 7, "long": 1_700_000_000_000_000, "float": 0.5,
    "double": -1.25, "string": "example", "bytes": pack_ids([1, 2, 3, 151_935]),
}


def example_record(schema: dict[str, Any]) -> dict[str, Any]:
    named: dict[str, dict[str, Any]] = {}
    return _value(schema, named)


def _value(t: Any, named: dict[str, dict[str, Any]]) -> Any:
    if isinstance(t, str):
        if t in PRIMITIVE_EXAMPLES:
            return PRIMITIVE_EXAMPLES[t]
        return _value(named[t.rsplit(".", 1)[-1]], named)
    if isinstance(t, list):  # union: the first non-null branch, so optional fields are exercised
        branch = next((b for b in t if b != "null"), "null")
        return _value(branch, named)
    kind = t["type"]
    if kind == "record":
        named[t["name"]] = t
        out = {}
        for field in t["fields"]:
            if field["name"].endswith("logprobs") or field["name"] in ("advantages", "weights"):
                out[field["name"]] = pack_floats([-0.5, -1.0, -2.0, -0.25])
            else:
                out[field["name"]] = _value(field["type"], named)
        return out
    if kind == "enum":
        named[t["name"]] = t
        return t["symbols"][0]
    if kind == "fixed":
        named[t["name"]] = t
        return b"\x00" * t["size"]
    if kind == "array":
        return [_value(t["items"], named)]
    if kind == "map":
        return {"key": _value(t["values"], named)}
    return _value(kind, named)
