"""Join an attempt's start, calls, environment events and finish into a CompletedRollout.

Events arrive in any order and may be re-delivered; duplicates (same event id) are idempotent.
The finish states how many calls and environment events the attempt has, so completeness is
provable: start + calls ``0..call_count-1`` + env events ``0..event_count-1`` + finish. An attempt
that does not complete before its timeout is emitted INCOMPLETE, listing what is missing; it is
stored, never scored.

State is kept per rollout (``RolloutAssembly``: every attempt of one rollout, since all of a
rollout's events share its Kafka key and partition) and serializes to compact bytes for a faust
table with changelog recovery. Buffered events are kept Avro-encoded; calls are kept without their
request/response bodies (the text the verifiers need is extracted once, on arrival).

Which attempt counts for a rollout (``counted``): an attempt counts when
  1. it is COMPLETE,
  2. its finish status is not ABORTED (an aborted attempt is expected to be retried),
  3. no attempt of the same rollout has been counted before it, and
  4. no attempt with a higher ``attempt_number`` had started when it completed (a retry supersedes
     the attempt it retries).
So a rollout has at most one counted attempt; the decision depends only on the order of the
rollout's events in its partition, so replays decide the same way. Only counted rollouts are grouped.

Events for an attempt that has already been emitted (complete or expired) are reported as late and
change nothing: the emitted rollout is immutable. Re-deliveries of an emitted attempt's events are
indistinguishable from late ones and are reported the same way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

from processors.call_tokens import CallTokens, rebuild_calls
from processors.errors import CallTokensError, ConflictingEvent, InvalidEvent, RolloutTooLarge
from processors.parse_failures import recorded_parse_failures
from processors.prefix import prefix_links
from processors.response_text import response_text
from schemas.codec import Codec, get_codec
from schemas.ids import event_id
from schemas.prompt_delta import MIN_SHARED_PREFIX, common_prefix_len
from schemas.sealing import is_forgotten
from schemas.tokens import IdArray

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


def _call_done_us(call: Record) -> int:
    timings = call["timings"]
    return int(timings["received_at_us"]) + round(float(timings.get("total_ms") or 0.0) * 1000)


def _event_time_us(name: str, record: Record) -> int:
    return _call_done_us(record) if name == "CallRecord" else int(record["created_at_us"])


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


def _check_identity(name: str, record: Record, rollout_id: str, attempt_id: str | None) -> None:
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
        _check_identity(name, record, self.rollout_id, self.attempt_id)
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
        absent_calls = [i for i in range(self.call_count) if i not in self.call_event_ids]
        if absent_calls:
            out.append(f"calls {_ranges(absent_calls)} of {self.call_count}")
        extra_calls = sorted(i for i in self.call_event_ids if i >= self.call_count)
        if extra_calls:
            out.append(f"unexpected calls {_ranges(extra_calls)} beyond call_count {self.call_count}")
        absent_env = [i for i in range(self.event_count) if i not in self.env_event_ids]
        if absent_env:
            out.append(f"env events {_ranges(absent_env)} of {self.event_count}")
        extra_env = sorted(i for i in self.env_event_ids if i >= self.event_count)
        if extra_env:
            out.append(f"unexpected env events {_ranges(extra_env)} beyond event_count {self.event_count}")
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
        return _frame([self])

    @classmethod
    def from_bytes(cls, data: bytes) -> AttemptBuffer:
        attempts, _ = _unframe(data)
        if len(attempts) != 1:
            raise InvalidEvent("state bytes do not hold exactly one attempt")
        return attempts[0]


# ---------------------------------------------------------------------------------------- building


def _rollout_prompt(call: Record, tokens: CallTokens, prev: CallTokens | None) -> Record:
    """The prompt as embedded in the rollout: a delta on the previous call where it extends it."""
    recorded = call["prompt"]
    if prev is None:
        if recorded.get("ids") is not None:
            return recorded
        return {"length": len(tokens.prompt), "sha256": recorded["sha256"], "ids": tokens.prompt.tobytes(),
                "base_call_id": None, "base_prefix_len": 0, "new_ids": None}
    if recorded.get("ids") is None and recorded.get("base_call_id") == prev.call_id:
        return recorded  # already a verified delta on the previous call
    shared = _shared_with(prev, tokens.prompt)
    if shared < MIN_SHARED_PREFIX:
        if recorded.get("ids") is not None:
            return recorded
        return {"length": len(tokens.prompt), "sha256": recorded["sha256"], "ids": tokens.prompt.tobytes(),
                "base_call_id": None, "base_prefix_len": 0, "new_ids": None}
    return {"length": len(tokens.prompt), "sha256": recorded["sha256"], "ids": None,
            "base_call_id": prev.call_id, "base_prefix_len": shared,
            "new_ids": tokens.prompt[shared:].tobytes()}


def _shared_with(prev: CallTokens, prompt: IdArray) -> int:
    shared = common_prefix_len(prev.prompt, prompt)
    if shared == len(prev.prompt):
        shared += common_prefix_len(prev.output, prompt[shared:])
    return shared


def _rollout_call(call: Record, prompt: Record) -> Record:
    versions = call["versions"]
    return {"call_id": call["call_id"], "call_index": int(call["call_index"]), "status": call["status"],
            "policy_version": int(versions["policy_version"]), "prompt": prompt,
            "output_ids": call["output_ids"], "output_logprobs": call["output_logprobs"],
            "logprob_kind": call["logprob_kind"], "finish_reason": call.get("finish_reason", ""),
            "tokenizer_fingerprint": versions["tokenizer_fingerprint"],
            "chat_template_fingerprint": versions["chat_template_fingerprint"],
            "scripted": bool(call.get("scripted", False)),
            "version_spans": [dict(span) for span in call.get("version_spans") or []],
            # The gateway's parse outcome, so the credit's parse_failures policy can act on it.
            "parse_failures": recorded_parse_failures(call)}


def rollout_event_id(rollout_id: str, attempt_id: str, status: str, present_ids: list[str]) -> str:
    if status == "COMPLETE":
        return event_id("rollout", rollout_id, attempt_id, status)
    return event_id("rollout", rollout_id, attempt_id, status, present_ids)


def build_rollout(buf: AttemptBuffer, *, counted: bool, missing: list[str] | None = None) -> Record:
    """The CompletedRollout for this buffer: COMPLETE when nothing is missing, else INCOMPLETE.

    A call whose prompt cannot be rebuilt exactly (delta base missing, hash mismatch) makes the
    rollout INCOMPLETE, naming the call and the reason; ``check_call_tokens`` gives the typed errors.
    """
    codec = _codec()
    missing = list(buf.missing() if missing is None else missing)
    started = codec.decode(buf.started, expect="AttemptStarted")[1] if buf.started else None
    finished = codec.decode(buf.finished, expect="AttemptFinished")[1] if buf.finished else None
    calls = [codec.decode(buf.calls[i], expect="CallRecord")[1] for i in sorted(buf.calls)]
    envs = [codec.decode(buf.env[i], expect="EnvStep")[1] for i in sorted(buf.env)]

    gone = [r["event_id"] for r in (started, *calls, *envs, finished) if r is not None and is_forgotten(r)]
    if gone:  # sealed under a key that was destroyed: this attempt can never be verified, scored or trained
        missing.append(f"forgotten: the content of {len(gone)} record(s) was erased (its subject was forgotten)")
    tokens, errors = rebuild_calls(calls)
    for err in errors:
        # A delta on a call that is itself missing is a consequence, not a second fault.
        absent_base = missing and "DeltaBaseMissing" in err.reason
        missing.append(f"{'unverified' if absent_base else 'invalid'} {err}")
    status = "INCOMPLETE" if missing else "COMPLETE"

    rollout_calls: list[Record] = []
    prev: CallTokens | None = None
    prev_index = -2
    for call, tok in zip(calls, tokens, strict=True):
        if tok is None:
            rollout_calls.append(_rollout_call(call, call["prompt"]))  # kept as recorded, not verified
            prev = None
            continue
        adjacent = prev if prev is not None and prev_index == tok.call_index - 1 else None
        rollout_calls.append(_rollout_call(call, _rollout_prompt(call, tok, adjacent)))
        prev, prev_index = tok, tok.call_index

    links = []
    run: list[CallTokens] = []
    for tok in [*tokens, None]:  # links between adjacent, reconstructed calls only
        if tok is not None and run and run[-1].call_index == tok.call_index - 1:
            run.append(tok)
            continue
        if len(run) > 1:
            links.extend(prefix_links([t.call_index for t in run], [t.prompt for t in run],
                                      [t.output for t in run]))
        run = [tok] if tok is not None else []

    ok_calls = [i for i in sorted(buf.calls) if buf.call_ok.get(i)]
    times = [_call_done_us(c) for c in calls] + [int(e["created_at_us"]) for e in envs]
    times += [int(r["created_at_us"]) for r in (started, finished) if r is not None]
    present = buf.present_event_ids()
    rollout = {
        "event_id": rollout_event_id(buf.rollout_id, buf.attempt_id, status, present),
        "rollout_id": buf.rollout_id, "attempt_id": buf.attempt_id, "status": status,
        "missing": missing, "counted": bool(counted and status == "COMPLETE"),
        "attempt_number": int(started["attempt_number"]) if started else 0,
        "group_id": started.get("group_id") if started else None,
        "group_key": dict(started.get("group_key") or {}) if started else {},
        "expected_group_size": started.get("expected_group_size") if started else None,
        "task_input_json": started["task_input_json"] if started else "",
        "metadata_json": started.get("metadata_json", "{}") if started else "{}",
        "finish_status": finished["status"] if finished else None,
        "final_artifacts_json": finished.get("final_artifacts_json", "{}") if finished else "{}",
        "final_output_text": _output_text(buf, calls, ok_calls[-1]) if ok_calls else "",
        "calls": rollout_calls,
        "env_events": [{"event_id": e["event_id"], "event_index": int(e["event_index"]), "kind": e["kind"],
                        "call_id": e.get("call_id"), "name": e.get("name"), "payload_json": e["payload_json"]}
                       for e in envs],
        "prefix_links": links,
        # Every version that sampled a token, those of calls that span a weight update included.
        "policy_versions": sorted({int(c["versions"]["policy_version"]) for c in calls}
                                  | {int(span["version"]) for c in calls for span in c.get("version_spans") or []}),
        "call_ids": [c["call_id"] for c in calls],
        "env_event_ids": [e["event_id"] for e in envs],
        "created_at_us": max(times) if times else 0,
        "subject": attempt_subject(started, calls, envs, finished),
        "sealed": None,
    }
    return rollout


def _output_text(buf: AttemptBuffer, calls: list[Record], index: int) -> str:
    """The call's output text: kept in the buffer, or (a subject's call) inside its sealed slim record."""
    call = next((c for c in calls if int(c["call_index"]) == index), None)
    if call is not None and call.get("subject"):
        return str(call.get("response_json") or "")
    return buf.call_texts.get(index, "")


def attempt_subject(started: Record | None, calls: list[Record], envs: list[Record],
                    finished: Record | None) -> str | None:
    """Whose content the attempt is: the subject its records name (the gateway gives every record of an
    attempt the same one); None when none names one (synthetic traffic, records written before subjects)."""
    for record in (started, *calls, *envs, finished):
        if record is not None and record.get("subject"):
            return str(record["subject"])
    return None


def try_complete(buf: AttemptBuffer, *, counted: bool = True) -> Record | None:
    """The COMPLETE rollout when every piece is present, else None.

    A complete attempt whose call tokens cannot be rebuilt yields an INCOMPLETE rollout naming the
    invalid call (it can never become complete). ``counted`` is the caller's decision (see the
    module docstring; ``RolloutAssembly`` makes it).
    """
    if not buf.is_complete():
        return None
    return build_rollout(buf, counted=counted, missing=[])


def expire(buf: AttemptBuffer, reason: str) -> Record:
    """An INCOMPLETE rollout listing what is missing and why the attempt was given up."""
    return build_rollout(buf, counted=False, missing=[f"expired: {reason}", *buf.missing()])


def check_call_tokens(buf: AttemptBuffer) -> list[CallTokensError]:
    """Typed errors for every buffered call whose prompt cannot be rebuilt (for dead-lettering)."""
    codec = _codec()
    calls = [codec.decode(buf.calls[i], expect="CallRecord")[1] for i in sorted(buf.calls)]
    return rebuild_calls(calls)[1]


# ---------------------------------------------------------------------------------------- one rollout


@dataclass
class Accepted:
    """What one event did to a rollout's state."""

    rollouts: list[Record] = field(default_factory=list)  # emitted now (COMPLETE or INCOMPLETE)
    duplicate: bool = False
    late: bool = False  # the event's attempt was already emitted; nothing changed


@dataclass
class RolloutAssembly:
    """All attempts of one rollout: open buffers, emitted attempts, and the counted-attempt ledger."""

    rollout_id: str
    attempts: dict[str, AttemptBuffer] = field(default_factory=dict)
    emitted: dict[str, str] = field(default_factory=dict)  # attempt id -> emitted status
    max_attempt_number: int = 0
    counted_attempt_id: str | None = None
    last_event_us: int = 0

    def accept(self, name: str, record: Record, max_bytes: int | None = None) -> Accepted:
        """Take one event; emits the rollout when its attempt becomes complete.

        ``max_bytes`` caps what the rollout's open attempts hold together: an event that would pass it
        raises RolloutTooLarge and changes nothing (the stream dead-letters it)."""
        _check_identity(name, record, self.rollout_id, None)
        attempt_id = record.get("attempt_id")
        if not attempt_id:
            raise InvalidEvent(f"{name} {record['event_id']} has no attempt_id")
        if attempt_id in self.emitted:
            return Accepted(late=True)
        buf = self.attempts.get(attempt_id) or AttemptBuffer(self.rollout_id, attempt_id)
        room = None if max_bytes is None else max_bytes - sum(b.size_bytes for b in self.attempts.values())
        if not buf.add(name, record, room):  # raises on invalid events before the buffer is kept
            return Accepted(duplicate=True)
        self.attempts[attempt_id] = buf
        self.last_event_us = max(self.last_event_us, buf.last_event_us)
        if name == "AttemptStarted":
            self.max_attempt_number = max(self.max_attempt_number, int(record.get("attempt_number", 1)))
        rollout = try_complete(buf, counted=self._counts(buf))
        if rollout is None:
            return Accepted()
        return Accepted(rollouts=[self._emit(buf, rollout)])

    def _counts(self, buf: AttemptBuffer) -> bool:
        return (self.counted_attempt_id is None and buf.finish_status != "ABORTED"
                and (buf.attempt_number or 0) >= self.max_attempt_number)

    def _emit(self, buf: AttemptBuffer, rollout: Record) -> Record:
        if rollout["counted"]:
            self.counted_attempt_id = buf.attempt_id
        self.emitted[buf.attempt_id] = rollout["status"]
        del self.attempts[buf.attempt_id]
        return rollout

    def expire_due(self, now_us: int, timeout_us: int) -> list[Record]:
        """INCOMPLETE rollouts for open attempts with no event for ``timeout_us`` before ``now_us``.

        ``now_us`` is passed in (stream time for deterministic replays, or wall time); the emitted
        records derive their timestamps from their events only.
        """
        out = []
        for attempt_id in sorted(self.attempts):
            buf = self.attempts[attempt_id]
            if now_us - buf.last_event_us >= timeout_us:
                out.append(self._emit(buf, expire(buf, f"no event for {timeout_us / 1e6:g}s")))
        return out

    def next_deadline_us(self, timeout_us: int) -> int | None:
        """When the earliest open attempt would expire; None when no attempt is open."""
        if not self.attempts:
            return None
        return min(b.last_event_us for b in self.attempts.values()) + timeout_us

    def can_forget(self, now_us: int, retention_us: int) -> bool:
        """True once no attempt is open and nothing happened for ``retention_us``: drop the state.

        After that, a very late event for an emitted attempt would open a fresh buffer and expire.
        """
        return not self.attempts and now_us - self.last_event_us >= retention_us

    # -- serialization

    def to_bytes(self) -> bytes:
        meta = {"rollout_id": self.rollout_id, "emitted": self.emitted,
                "max_attempt_number": self.max_attempt_number,
                "counted_attempt_id": self.counted_attempt_id, "last_event_us": self.last_event_us}
        return _frame([self.attempts[a] for a in sorted(self.attempts)], meta)

    @classmethod
    def from_bytes(cls, data: bytes) -> RolloutAssembly:
        attempts, meta = _unframe(data)
        state = cls(rollout_id=meta["rollout_id"], emitted=dict(meta["emitted"]),
                    max_attempt_number=int(meta["max_attempt_number"]),
                    counted_attempt_id=meta["counted_attempt_id"], last_event_us=int(meta["last_event_us"]))
        state.attempts = {b.attempt_id: b for b in attempts}
        return state


# ---------------------------------------------------------------------------------------- framing
#
# magic(4) version(1) meta_len(u32) meta(orjson) n_attempts(u32), then per attempt:
#   header_len(u32) header(orjson: event ids, counts, call texts, blob lengths) blobs...
# Blobs are Avro single-object encoded events: self-describing and schema-evolution safe.


def _frame(attempts: list[AttemptBuffer], meta: dict[str, Any] | None = None) -> bytes:
    meta_bytes = orjson.dumps(meta or {})
    parts = [_STATE_MAGIC, bytes([_STATE_VERSION]), struct.pack("<I", len(meta_bytes)), meta_bytes,
             struct.pack("<I", len(attempts))]
    for buf in attempts:
        header = orjson.dumps(buf.header())
        parts += [struct.pack("<I", len(header)), header, *buf.blobs()]
    return b"".join(parts)


def _unframe(data: bytes) -> tuple[list[AttemptBuffer], dict[str, Any]]:
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


def new_state(rollout_id: str) -> RolloutAssembly:
    return RolloutAssembly(rollout_id=rollout_id)
