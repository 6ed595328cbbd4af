"""The renderer's byte-bounded caches: their budgets, a thread-safe LRU sized in bytes, and the memo of rendered
conversation texts keyed by a secret digest of their JSON."""

from __future__ import annotations

import hashlib
import math
import secrets
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from producers.rendered_prompt import Message

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class CacheBudgets:
    """Bytes each of the renderer's caches may hold (0: that cache is off). Every one is an LRU: over
    its budget the least recently used entries go; a single entry larger than the budget is not kept."""

    token_cache_bytes: int = 32 * 1024 * 1024
    render_memo_bytes: int = 16 * 1024 * 1024
    output_memo_bytes: int = 8 * 1024 * 1024


# What an LRU entry costs beside its value: the ordered dict's slot and node, the key object.
LRU_ENTRY_BYTES = 160


class ByteLru(Generic[K, V]):
    """A thread-safe LRU map bounded by the bytes its values hold (as the caller sizes them, plus
    ``LRU_ENTRY_BYTES`` an entry)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, nbytes: int) -> None:
        size = nbytes + LRU_ENTRY_BYTES
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1]

    def memory(self) -> dict[str, int]:
        with self._lock:
            return {"bytes": self._bytes, "max_bytes": self.max_bytes, "entries": len(self._items)}


class RenderMemo:
    """Rendered texts of recent conversations, keyed by a digest of their exact JSON, in a byte budget.

    Only plain JSON values are keyed (dicts with string keys, lists, strings, ints, finite floats, bools,
    None), where equal JSON means equal values to the template; anything else is rendered every time.

    The key is the 16-byte keyed BLAKE2b of the JSON, not the JSON (a conversation's JSON is as large as
    its text: keeping it doubled what the memo held). Equal digests stand for equal JSON: the key is a
    secret drawn per process, so no one can search for two conversations that collide (keyed BLAKE2b is
    a pseudorandom function: without the key a collision takes about 2**128 tries, and a request learns
    nothing of the digests), and by chance, with n lookups against at most m entries, a collision has
    probability below n*m / 2**128 (1e12 lookups against 1e6 entries: 3e-21)."""

    def __init__(self, *, enabled: bool = True, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.enabled = enabled and max_bytes > 0
        self._texts: ByteLru[bytes, str] = ByteLru(max_bytes)
        self._secret = secrets.token_bytes(32)

    @property
    def max_bytes(self) -> int:
        return self._texts.max_bytes

    def key(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None,
            add_generation_prompt: bool, template_kwargs: Mapping[str, Any] | None = None) -> bytes | None:
        value = [list(messages), list(tools) if tools else None, add_generation_prompt]
        if template_kwargs:
            value.append(dict(template_kwargs))
        if not self.enabled or not _plain_json(value):
            return None
        return hashlib.blake2b(orjson.dumps(value), digest_size=16, key=self._secret).digest()

    def get(self, key: bytes | None) -> str | None:
        return None if key is None else self._texts.get(key)

    def put(self, key: bytes | None, text: str) -> None:
        if key is not None:
            self._texts.put(key, text, sys.getsizeof(text) + sys.getsizeof(key))

    def memory(self) -> dict[str, int]:
        return self._texts.memory()


def _plain_json(value: Any) -> bool:
    if value is None or type(value) in (str, int, bool):
        return True
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return all(_plain_json(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _plain_json(v) for k, v in value.items())
    return False
