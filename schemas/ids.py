"""Deterministic event ids: a hash of what defines each event.

Re-delivery, replay and crash recovery recompute the same ids, so sinks can deduplicate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import orjson

ID_HEX_CHARS = 32  # 128 bits of sha256: collision-free at any realistic volume, short in storage


def event_id(kind: str, *parts: object) -> str:
    """Hash of the event kind and its defining parts (strings, ints, lists, dicts: canonical JSON)."""
    payload = orjson.dumps([kind, *parts], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(payload).hexdigest()[:ID_HEX_CHARS]


def call_id(rollout_id: str, attempt_id: str, call_index: int) -> str:
    return event_id("call", rollout_id, attempt_id, call_index)


def env_event_id(rollout_id: str, attempt_id: str, kind: str, index: int) -> str:
    return event_id("env", rollout_id, attempt_id, kind, index)


def ids_digest(ids_packed: bytes) -> str:
    """sha256 of packed little-endian uint32 ids, the hash a prompt carries."""
    return hashlib.sha256(ids_packed).hexdigest()


def content_hash(obj: object) -> str:
    """Content hash of a configuration (reward, credit, sample): its id."""
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def combine(ids: Iterable[str]) -> str:
    return event_id("set", sorted(ids))
