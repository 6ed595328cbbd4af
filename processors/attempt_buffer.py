"""One attempt's buffer in the assembler (``processors/assembler.py``): its events, checked and kept
Avro-encoded, what is still missing, and the compact state bytes (for a faust table with changelog recovery)
that hold one or more buffers.

Calls are kept without their request/response bodies: the text the verifiers need is extracted once, on
arrival. Small decoded facts (event ids, counts, call texts) sit beside the blobs, so completeness checks and
loading the state never decode them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

from processors.errors import ConflictingEvent, InvalidEvent, RolloutTooLarge
from processors.response_text import response_text
from schemas.codec import Codec, get_codec

Record = dict[str, Any]
EVENT_NAMES = ("AttemptStarted", "CallRecord", "EnvStep", "AttemptFinished")

_STATE_MAGIC = b"TTRA"
_STATE_VERSION = 1


def _codec() -> Codec:
    return get_codec()  # single-object encoding, resolved against schemas/ and schemas/history/


def _encode(name: str, record: Record) -> bytes:
    try:
        return _codec().encode(name, record)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # fastavro's ways of saying "no"
        raise InvalidEvent(f"{name} {record.get('event_id')} does not fit its schema: {exc!r}") from exc


def call_done_us(call: Record) -> int:
    timings = call["timings"]
    return int(timings["received_at_us"]) + round(float(timings.get("total_ms") or 0.0) * 1000)


def _event_time_us(name: str, record: Record) -> int:
    return call_done_us(record) if name == "CallRecord" else int(record["created_at_us"])


def _ranges(indices: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3,7"``."""
    out: list[str] = []
    start = prev = None
    for i in indices:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)


# ---------------------------------------------------------------------------------------- validation


def check_identity(name: str, record: Record, rollout_id: str, attempt_id: str | None) -> None:
    if record.get("rollout_id") != rollout_id:
        raise InvalidEvent(f"{name} {record.get('event_id')} belongs to rollout "
                           f"{record.get('rollout_id')!r}, not {rollout_id!r}")
    if attempt_id is not None and record.get("attempt_id") != attempt_id:
        raise InvalidEvent(f"{name} {record.get('event_id')} belongs to attempt {record.get('attempt_id')!r}")
    if not record.get("event_id"):
        raise InvalidEvent(f"{name} has an empty event_id")


def _check_call(call: Record) -> None:
    where = f"CallRecord {call['event_id']} (call {call.get('call_index')})"
    if int(call["call_index"]) < 0:
        raise InvalidEvent(f"{where}: negative call_index")
    out_len = len(call["output_ids"])
    if out_len % 4:
        raise InvalidEvent(f"{where}: output_ids has {out_len} bytes, not a multiple of 4")
    if len(call["output_logprobs"]) != out_len:
        raise InvalidEvent(f"{where}: {len(call['output_logprobs']) // 4} logprobs for {out_len // 4} "
                           "output ids")
    prompt = call["prompt"]
    if prompt["length"] < 0:
        raise InvalidEvent(f"{where}: negative prompt length")
    if prompt.get("ids") is not None:
        if len(prompt["ids"]) != 4 * prompt["length"]:
            raise InvalidEvent(f"{where}: prompt ids hold {len(prompt['ids']) // 4} tokens, "
                               f"length says {prompt['length']}")
    else:
        if not prompt.get("base_call_id"):
            raise InvalidEvent(f"{where}: prompt has neither ids nor a delta base")
        new_len = len(prompt.get("new_ids") or b"")
        if new_len % 4 or prompt["base_prefix_len"] < 0 or \
                prompt["base_prefix_len"] + new_len // 4 != prompt["length"]:
            raise InvalidEvent(f"{where}: delta prompt sizes do not add up to its length")


def _check_finished(record: Record) -> None:
    if record["call_count"] < 0 or record["event_count"] < 0:
        raise InvalidEvent(f"AttemptFinished {record['event_id']}: negative counts")


# ---------------------------------------------------------------------------------------- one attempt


@dataclass
class AttemptBuffer:
    """Everything seen so far of one attempt; events kept Avro-encoded."""

    rollout_id: str
    attempt_id: str
    started: bytes | None = None
    finished: bytes | None = None
    calls: dict[int, bytes] = field(default_factory=dict)
    env: dict[int, bytes] = field(default_factory=dict)
    # Small decoded facts, so completeness checks never decode the blobs.
    started_id: str | None = None
    finished_id: str | None = None
    call_event_ids: dict[int, str] = field(default_factory=dict)
    env_event_ids: dict[int, str] = field(default_factory=dict)
    call_texts: dict[int, str] = field(default_factory=dict)
    call_ok: dict[int, bool] = field(default_factory=dict)
    attempt_number: int | None = None
    call_count: int | None = None
    event_count: int | None = None
    finish_status: str | None = None
    last_event_us: int = 0

    # -- accepting events

    @property
    def size_bytes(self) -> int:
        """What the buffer holds: its encoded events and call texts (the bulk of its state)."""
        blobs = [b for b in (self.started, self.finished) if b is not None]
        return (sum(map(len, blobs)) + sum(map(len, self.calls.values())) + sum(map(len, self.env.values()))
                + sum(len(t) for t in self.call_texts.values()))

    def add(self, name: str, record: Record, room: int | None = None) -> bool:
        """Buffer one event. Returns False for a duplicate (same event id in the same slot).

        Raises InvalidEvent for malformed events, ConflictingEvent when a different event claims an
        occupied slot, and RolloutTooLarge when the event would take more than ``room`` bytes (None: no
        limit); the buffer is unchanged then.
        """
        try:
            return self._add(name, record, room)
        except (KeyError, TypeError) as exc:  # a required field is missing or of the wrong type
            raise InvalidEvent(f"{name} {record.get('event_id')} is malformed: {exc!r}") from exc

    @staticmethod
    def _fit(name: str, record: Record, needed: int, room: int | None) -> None:
        if room is not None and needed > room:
            raise RolloutTooLarge(
                f"{name} {record.get('event_id')} would take {needed:,} bytes of rollout state with "
                f"{max(room, 0):,} left under the cap (processors.max_rollout_bytes); kept out of the state, "
                "so its attempt will be emitted INCOMPLETE")

    def _add(self, name: str, record: Record, room: int | None = None) -> bool:
        check_identity(name, record, self.rollout_id, self.attempt_id)
        eid = record["event_id"]
        if name == "AttemptStarted":
            if self.started_id is not None:
                return self._same(self.started_id, eid, "AttemptStarted")
            if int(record.get("attempt_number", 1)) < 1:
                raise InvalidEvent(f"AttemptStarted {eid}: attempt_number must be >= 1")
            blob = _encode(name, record)
            self._fit(name, record, len(blob), room)
            self.started, self.started_id = blob, eid
            self.attempt_number = int(record.get("attempt_number", 1))
        elif name == "AttemptFinished":
            if self.finished_id is not None:
                return self._same(self.finished_id, eid, "AttemptFinished")
            _check_finished(record)
            blob = _encode(name, record)
            self._fit(name, record, len(blob), room)
            self.finished, self.finished_id = blob, eid
            self.call_count, self.event_count = int(record["call_count"]), int(record["event_count"])
            self.finish_status = str(record["status"])
        elif name == "CallRecord":
            index = int(record["call_index"])
            if index in self.call_event_ids:
                return self._same(self.call_event_ids[index], eid, f"call {index}")
            _check_call(record)
            text = response_text(record.get("response_json") or "")
            slim = dict(record, request_json="", response_json="")  # bodies live on the calls topic
            if record.get("subject"):
                # A subject's output text must not sit in this state (and its changelog) in the clear: it
                # stays in the slim record, which the codec seals with the rest; build_rollout reads it back.
                slim["response_json"], text = text, ""
            blob = _encode(name, slim)
            self._fit(name, record, len(blob) + len(text), room)
            self.calls[index] = blob
            self.call_texts[index] = text
            self.call_event_ids[index] = eid
            self.call_ok[index] = record["status"] == "OK"
        elif name == "EnvStep":
            index = int(record["event_index"])
            if index < 0:
                raise InvalidEvent(f"EnvStep {eid}: negative event_index")
            if index in self.env_event_ids:
                return self._same(self.env_event_ids[index], eid, f"env event {index}")
            blob = _encode(name, record)
            self._fit(name, record, len(blob), room)
            self.env[index] = blob
            self.env_event_ids[index] = eid
        else:
            raise InvalidEvent(f"the assembler does not take {name} events")
        self.last_event_us = max(self.last_event_us, _event_time_us(name, record))
        return True

    @staticmethod
    def _same(known: str, new: str, slot: str) -> bool:
        if known != new:
            raise ConflictingEvent(f"{slot} is already held by event {known}; {new} claims it too")
        return False

    # -- completeness

    def missing(self) -> list[str]:
        """What stops this attempt from being complete; empty when it is complete."""
        out: list[str] = []
        if self.started_id is None:
            out.append("start")
        if self.finished_id is None:
            out.append("finish")
            return out  # without the finish the expected counts are unknown
        assert self.call_count is not None and self.event_count is not None
        for label, seen, count, count_name in (("calls", self.call_event_ids, self.call_count, "call_count"),
                                               ("env events", self.env_event_ids, self.event_count, "event_count")):
            absent = [i for i in range(count) if i not in seen]
            if absent:
                out.append(f"{label} {_ranges(absent)} of {count}")
            extra = sorted(i for i in seen if i >= count)
            if extra:
                out.append(f"unexpected {label} {_ranges(extra)} beyond {count_name} {count}")
        return out

    def is_complete(self) -> bool:
        return not self.missing()

    def present_event_ids(self) -> list[str]:
        ids = [self.started_id, self.finished_id, *self.call_event_ids.values(), *self.env_event_ids.values()]
        return sorted(i for i in ids if i)

    # -- serialization

    def header(self) -> dict[str, Any]:
        """The small facts of the buffer, so loading it never decodes the events."""
        return {"r": self.rollout_id, "a": self.attempt_id, "s": self.started_id, "f": self.finished_id,
                "an": self.attempt_number, "cc": self.call_count, "ec": self.event_count,
                "fs": self.finish_status, "le": self.last_event_us,
                "c": [[i, self.call_event_ids[i], self.call_ok[i], self.call_texts.get(i, ""),
                       len(self.calls[i])] for i in sorted(self.calls)],
                "e": [[i, self.env_event_ids[i], len(self.env[i])] for i in sorted(self.env)],
                "sl": None if self.started is None else len(self.started),
                "fl": None if self.finished is None else len(self.finished)}

    def blobs(self) -> list[bytes]:
        """The encoded events, in the order ``header`` lists their lengths."""
        out = [b for b in (self.started, self.finished) if b is not None]
        return out + [self.calls[i] for i in sorted(self.calls)] + [self.env[i] for i in sorted(self.env)]

    @classmethod
    def from_header(cls, header: dict[str, Any], take: Any) -> AttemptBuffer:
        """Rebuild from ``header()`` and a ``take(n) -> bytes`` reader over the blobs that follow it."""
        buf = cls(rollout_id=header["r"], attempt_id=header["a"], started_id=header["s"],
                  finished_id=header["f"], attempt_number=header["an"], call_count=header["cc"],
                  event_count=header["ec"], finish_status=header["fs"], last_event_us=int(header["le"]))
        if header["sl"] is not None:
            buf.started = take(header["sl"])
        if header["fl"] is not None:
            buf.finished = take(header["fl"])
        for i, eid, ok, text, size in header["c"]:
            buf.calls[i], buf.call_event_ids[i], buf.call_ok[i], buf.call_texts[i] = take(size), eid, ok, text
        for i, eid, size in header["e"]:
            buf.env[i], buf.env_event_ids[i] = take(size), eid
        return buf

    def to_bytes(self) -> bytes:
        return frame_attempts([self])

    @classmethod
    def from_bytes(cls, data: bytes) -> AttemptBuffer:
        attempts, _ = unframe_attempts(data)
        if len(attempts) != 1:
            raise InvalidEvent("state bytes do not hold exactly one attempt")
        return attempts[0]


# ---------------------------------------------------------------------------------------- framing
#
# magic(4) version(1) meta_len(u32) meta(orjson) n_attempts(u32), then per attempt:
#   header_len(u32) header(orjson: event ids, counts, call texts, blob lengths) blobs...
# Blobs are Avro single-object encoded events: self-describing and schema-evolution safe.


def frame_attempts(attempts: list[AttemptBuffer], meta: dict[str, Any] | None = None) -> bytes:
    meta_bytes = orjson.dumps(meta or {})
    parts = [_STATE_MAGIC, bytes([_STATE_VERSION]), struct.pack("<I", len(meta_bytes)), meta_bytes,
             struct.pack("<I", len(attempts))]
    for buf in attempts:
        header = orjson.dumps(buf.header())
        parts += [struct.pack("<I", len(header)), header, *buf.blobs()]
    return b"".join(parts)


def unframe_attempts(data: bytes) -> tuple[list[AttemptBuffer], dict[str, Any]]:
    view = memoryview(data)
    if bytes(view[:4]) != _STATE_MAGIC:
        raise InvalidEvent("not assembler state (bad magic)")
    if len(view) < 5 or view[4] != _STATE_VERSION:
        raise InvalidEvent(f"assembler state version is not {_STATE_VERSION}")
    pos = 5

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(view):
            raise InvalidEvent("assembler state is truncated")
        chunk = bytes(view[pos:pos + n])
        pos += n
        return chunk

    def take_u32() -> int:
        return int(struct.unpack("<I", take(4))[0])

    meta = orjson.loads(take(take_u32()))
    attempts = [AttemptBuffer.from_header(orjson.loads(take(take_u32())), take) for _ in range(take_u32())]
    if pos != len(view):
        raise InvalidEvent(f"{len(view) - pos} trailing bytes after assembler state")
    return attempts, meta
