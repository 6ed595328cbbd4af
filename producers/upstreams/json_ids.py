"""Read a model server's JSON answer without turning its echo of the prompt into Python ints.

vLLM answers a token-in request with the prompt ids it ran (``prompt_token_ids``), thousands of them, only
for the gateway to check that they are the ids it sent. Parsing them makes one Python int per id, and
checking them serializes them back. Here the array's bytes are cut out before parsing and compared with
the bytes that were sent: equal bytes are equal ids.

Why a cut is safe: the parsed answer holds a per-process placeholder where the array was. The caller
uses the cut bytes only when the placeholder is found exactly where the ids belong, which proves the cut
was that value and nothing else; otherwise (the name inside a string, a key of another object, an answer
shaped differently) the answer is parsed whole, as before.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import orjson

# A string no server sends: where the parsed answer holds it, the ids were cut out.
PLACEHOLDER = f"tokentrail-ids-{secrets.token_hex(8)}"
_PLACEHOLDER_JSON = orjson.dumps(PLACEHOLDER)
_SPACE = b" \t\r\n"


def load_with_ids(content: bytes, key: str, holder: Callable[[Any], Any]) -> tuple[Any, Any, bytes | None]:
    """``(answer, ids, None)`` as ``orjson.loads`` reads them (``ids``: ``holder(answer)[key]``, None if
    absent), or ``(answer, None, ids_json)`` when the array of ids was cut out unparsed (then the answer
    holds ``PLACEHOLDER`` in its place). ``holder`` finds the object that holds ``key`` in an answer."""
    doc, cut = _load_cutting(content, key)
    if cut is not None:
        if _value(holder, doc, key) == PLACEHOLDER:
            return doc, None, cut
        doc = orjson.loads(content)  # the cut was somewhere else: read the answer whole
    return doc, _value(holder, doc, key), None


def _value(holder: Callable[[Any], Any], doc: Any, key: str) -> Any:
    found = holder(doc)
    return found.get(key) if isinstance(found, dict) else None


def _load_cutting(content: bytes, key: str) -> tuple[Any, bytes | None]:
    """``content`` parsed with the first array named ``key`` replaced by ``PLACEHOLDER``, and that array's
    JSON bytes; ``(orjson.loads(content), None)`` when there is no such array to cut."""
    name = orjson.dumps(key)
    at = content.find(name)
    if at < 0:
        return orjson.loads(content), None
    start = _skip_space(content, at + len(name))
    if content[start:start + 1] != b":":
        return orjson.loads(content), None
    start = _skip_space(content, start + 1)
    end = content.find(b"]", start) + 1  # an array of ints holds no other bracket
    if content[start:start + 1] != b"[" or end <= 0:
        return orjson.loads(content), None
    try:
        return orjson.loads(content[:start] + _PLACEHOLDER_JSON + content[end:]), content[start:end]
    except orjson.JSONDecodeError:  # not where a value is (inside a string): read it as it is
        return orjson.loads(content), None


def _skip_space(content: bytes, i: int) -> int:
    while content[i:i + 1] and content[i:i + 1] in _SPACE:
        i += 1
    return i
