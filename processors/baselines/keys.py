"""The grouping key of a rollout: a field of the rollout, or a cluster id of its first user message.

The cluster function is pluggable (``KeySpec.function``, a dotted path); the built-in
``message_template`` maps messages that differ only in their particulars (numbers, quoted strings,
paths, URLs, hex ids) to one id, so "fix the failing test in foo.py line 42" and "Fix the failing test in
bar/baz.py line 7" share a key.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import re
from collections.abc import Callable
from typing import Any

import orjson

from processors.baselines.config import KeySpec
from processors.errors import ConfigError

Record = dict[str, Any]
ClusterFunction = Callable[[str], str]
NONE_KEY = "none"

# Particulars (URLs, quoted strings, paths and file names, hex ids) become one placeholder, numbers another.
_PLACEHOLDERS = (
    (re.compile(r"https?://\S+"), " <v> "),
    (re.compile(r"`[^`]*`|\"[^\"]*\"|'[^']*'"), " <v> "),
    (re.compile(r"(?:[\w.-]*/)+[\w.-]+|\b[\w-]+\.[a-z]{1,5}\b"), " <v> "),
    (re.compile(r"\b[0-9a-f]{7,}\b"), " <v> "),
    (re.compile(r"\d+(?:\.\d+)?"), " <n> "),
)
_WORD = re.compile(r"<\w+>|\w+")
TEMPLATE_WORDS = 12


def message_template(text: str) -> str:
    """The built-in cluster id: the message's first words with its particulars replaced, hashed."""
    text = text.lower()
    for pattern, placeholder in _PLACEHOLDERS:
        text = pattern.sub(placeholder, text)
    words = _WORD.findall(text)[:TEMPLATE_WORDS]
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=32)
def load_function(path: str) -> ClusterFunction:
    """``module:function`` or ``module.function``; a ConfigError names what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"baseline key function {path!r} cannot be loaded: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"baseline key function {path!r} is not callable")
    return fn  # type: ignore[no-any-return]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: OpenAI {"type": "text", "text"}, Anthropic alike
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def first_user_message(request_json: str) -> str | None:
    """The text of the first user message of a harness request (OpenAI chat, Anthropic messages,
    Responses ``input``, Completions ``prompt``); None when it has none.

    ``request_json`` is a call record's: the gateway records the request as an envelope (method, path,
    query, kept headers and the parsed ``body``: producers/gateway/records.py ``request_json``), so the
    messages are under ``body``; a bare request body is read as well."""
    try:
        body = orjson.loads(request_json or "{}")
    except orjson.JSONDecodeError:
        return None
    if isinstance(body, dict) and isinstance(body.get("body"), dict) and "path" in body:
        body = body["body"]
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    if messages is None and isinstance(body.get("input"), list):
        messages = body["input"]
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict) and message.get("role") == "user":
                text = _text(message.get("content"))
                if text:
                    return text
        return None
    for field in ("input", "prompt"):
        value = body.get(field)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list) and value and isinstance(value[0], str):
            return value[0]
    return None


def _parsed(text: str) -> Any:
    try:
        return orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}


def field_key(rollout: Record, path: str) -> str | None:
    """A dotted path into the rollout's ``group_key``, ``task_input`` or ``metadata``."""
    root, _, rest = path.partition(".")
    sources = {"group_key": lambda: rollout.get("group_key") or {},
               "task_input": lambda: _parsed(rollout.get("task_input_json", "")),
               "metadata": lambda: _parsed(rollout.get("metadata_json", ""))}
    if root not in sources:
        raise ConfigError(f"baseline key field {path!r} must start with one of {sorted(sources)}")
    value: Any = sources[root]()
    for part in rest.split(".") if rest else []:
        value = value.get(part) if isinstance(value, dict) else None
    if value is None or value == "" or isinstance(value, dict | list):
        return None if not isinstance(value, dict | list) else orjson.dumps(
            value, option=orjson.OPT_SORT_KEYS).decode()
    return str(value)


def message_key(text: str | None, spec: KeySpec) -> str | None:
    """The cluster id of a first user message (None without one)."""
    if not text:
        return None
    return f"cluster:{load_function(spec.function)(text)}"


def rollout_key(rollout: Record, spec: KeySpec, first_message_key: str | None = None) -> str | None:
    """A rollout's key under ``spec``: ``field:<value>``, ``cluster:<id>``, ``none``; None: leave it out.
    ``first_message_key`` is ``message_key`` of the attempt's first call (key by first_user_message)."""
    if spec.by == "field":
        value = field_key(rollout, spec.field)
        key = None if value is None else f"{spec.field}:{value}"
    else:
        key = first_message_key
    if key is None:
        return NONE_KEY if spec.missing == "none" else None
    return key
