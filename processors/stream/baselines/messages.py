"""The values of the baselines' two internal topics and tables. Pure: no Kafka here.

  tokentrail.baseline-by-rollout  key rollout id; one tag byte, then
      F  json {"attempt_id", "key", "event_us"}: the cluster key of an attempt's first call (tokentrail.calls)
      R  a CompletedRollout, Avro as on tokentrail.rollouts (complete, counted)
      W  json: a feedback Reward the baselines read (from tokentrail.rewards)
  tokentrail.baseline-by-key      key the grouping key; a member: json {"key", "member", "reward"} and the
                                  rollout's Avro bytes (``pack``)

Tables keep a JSON head and the rollouts it holds as bytes behind it (``pack``/``unpack``), so a rollout is
never re-encoded.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

from processors.errors import InvalidEvent

Record = dict[str, Any]
FIRST, ROLLOUT, REWARD = b"F", b"R", b"W"
_LEN = struct.Struct("<I")


def tagged(tag: bytes, body: bytes) -> bytes:
    return tag + body


def first_message(attempt_id: str, key: str | None, event_us: int) -> bytes:
    return FIRST + orjson.dumps({"attempt_id": attempt_id, "key": key, "event_us": event_us})


def reward_message(reward: Record) -> bytes:
    return REWARD + orjson.dumps(reward)


def read_tagged(value: bytes, topic: str) -> tuple[bytes, Any]:
    """(tag, body): the JSON decoded for F and W, the rollout's bytes for R; InvalidEvent otherwise."""
    tag, body = value[:1], bytes(value[1:])
    if tag == ROLLOUT:
        return tag, body
    if tag in (FIRST, REWARD):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidEvent(f"not a baseline message on {topic}: {exc}") from exc
        if isinstance(data, dict):
            return tag, data
    raise InvalidEvent(f"not a baseline message on {topic}: {value[:80]!r}")


def pack(head: Record, blobs: list[bytes]) -> bytes:
    """A JSON head (with ``sizes``, one per blob, added) and the blobs behind it."""
    data = orjson.dumps({**head, "sizes": [len(b) for b in blobs]})
    return b"".join([_LEN.pack(len(data)), data, *blobs])


def unpack(value: bytes) -> tuple[Record, list[bytes]]:
    try:
        (n,) = _LEN.unpack_from(value)
        head = orjson.loads(value[4:4 + n])
        blobs, pos = [], 4 + n
        for size in head.pop("sizes"):
            blobs.append(bytes(value[pos:pos + size]))
            pos += size
    except (struct.error, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise InvalidEvent(f"not a packed baseline value: {exc}") from exc
    if pos != len(value):
        raise InvalidEvent("a packed baseline value has trailing or missing bytes")
    return head, blobs
