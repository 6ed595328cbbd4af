"""Bad records on the stream processors' input topics and the dead letters (or INCOMPLETE rollouts) they must give."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from schemas.builders import make_call, make_env, make_finished, make_started
from schemas.codec import Codec
from testkit.stages import AttemptSpec, attempt_events, growing_turns

Record = dict[str, Any]


@dataclass(frozen=True)
class TopicMessage:
    topic: Literal["calls", "env", "rollouts"]
    key: bytes
    value: bytes


@dataclass(frozen=True)
class TopicCase:
    """``build(codec)`` gives the messages in order; ``bad_index`` picks the bad one.

    ``dead_letter``: (stage, error_type, reason substring) the worker must write for the bad message.
    ``expect_incomplete``: instead of a dead letter, the attempt's rollout is INCOMPLETE and its
    ``missing`` names this substring (prompt deltas that cannot be rebuilt are a rollout-level fault).
    ``sink``: error_type the ClickHouse sink must dead-letter the bad message with (None: it is a
    well-formed record the sink stores as a row).
    """

    id: str
    klass: str
    what: str
    build: Callable[[Codec], list[TopicMessage]]
    dead_letter: tuple[str, str, str] | None = None
    expect_incomplete: str | None = None
    sink: str | None = None
    bad_index: int = -1  # which of the built messages is the bad one

    def bad(self, messages: list[TopicMessage]) -> TopicMessage:
        return messages[self.bad_index]


T0_US = 1_800_000_000_000_000


def _rollout(tag: str) -> str:
    return f"bad-{tag}"


def _turns(n: int, seed: int) -> list[Any]:

    return growing_turns(np.random.default_rng(seed), n, 24, 6, 8, vocab=900)


def _call(rid: str, index: int, seed: int = 0, **changes: Any) -> Record:

    turns = _turns(index + 1, seed)
    record = make_call(rid, "a1", index, turns[index].prompt, turns[index].output,
                       received_at_us=T0_US + 1000 * (index + 1))
    record.update(changes)
    return record


def _started(rid: str, **changes: Any) -> Record:

    return {**make_started(rid, "a1", task_input={"answer": "4"}, created_at_us=T0_US), **changes}


def _calls(m: Record, codec: Codec, name: str = "CallRecord", key: str | None = None) -> TopicMessage:
    return TopicMessage("calls", (key or m["rollout_id"]).encode(), codec.encode(name, m))


def _env_msg(name: str, m: Record, codec: Codec, key: str | None = None) -> TopicMessage:
    return TopicMessage("env", (key or m["rollout_id"]).encode(), codec.encode(name, m))


def _delta_attempt(codec: Codec, rid: str, spoil: Callable[[Record], None]) -> list[TopicMessage]:
    """A complete two-call attempt whose second prompt is a delta on the first, spoiled by ``spoil``."""

    events = attempt_events(AttemptSpec(rid, "a1", _turns(2, 7), env_events=0, task_input={"answer": "4"},
                                        t0_us=T0_US))
    out = []
    for name, rec in events:
        if name == "CallRecord" and rec["call_index"] == 1:
            assert rec["prompt"]["base_call_id"], "the second call must be delta-encoded"
            rec = {**rec, "prompt": dict(rec["prompt"])}
            spoil(rec)
        out.append(_calls(rec, codec) if name == "CallRecord" else _env_msg(name, rec, codec))
    return out


def _missing_base(rec: Record) -> None:
    rec["prompt"]["base_call_id"] = "a-call-that-never-was"


def _wrong_hash(rec: Record) -> None:
    rec["prompt"]["sha256"] = "0" * 64


def _long_prefix(rec: Record) -> None:
    rec["prompt"]["base_prefix_len"] = 10_000


def _unknown_fp(body: bytes) -> bytes:
    return b"\xc3\x01" + b"\x13\x37" * 4 + body


def _score(rid: str) -> Record:
    return {"event_id": f"s-{rid}", "rollout_id": rid, "rollout_event_id": "e", "group_id": "g",
            "verifier_name": "v", "verifier_version": "1", "scope": "ROLLOUT", "status": "OK", "raw_json": "1",
            "error": None, "duration_ms": 0.0, "created_at_us": T0_US}


def topic_cases() -> list[TopicCase]:
    """Bad records for the stream processors (and the sink). Rollout ids are unique per case."""

    def r(tag: str) -> str:
        return _rollout(tag)

    def single(topic: Literal["calls", "env", "rollouts"], tag: str,
               value: Callable[[Codec], bytes]) -> Callable[[Codec], list[TopicMessage]]:
        return lambda codec: [TopicMessage(topic, r(tag).encode(), value(codec))]

    asm = "assembler"
    return [
        TopicCase("topic.calls.not_avro", "corrupt record", "plain text on the calls topic",
                  single("calls", "t1", lambda _c: b"this is not avro"), (asm, "CorruptRecord", "unknown framing"),
                  sink="CorruptRecord"),
        TopicCase("topic.env.not_avro", "corrupt record", "random bytes on the env topic",
                  single("env", "t2", lambda _c: bytes(range(7, 90))), (asm, "CorruptRecord", "unknown framing"),
                  sink="CorruptRecord"),
        TopicCase("topic.calls.trailing_bytes", "corrupt record", "a valid call followed by two extra bytes",
                  single("calls", "t3", lambda c: c.encode("CallRecord", _call(r("t3"), 0)) + b"!!"),
                  (asm, "CorruptRecord", "trailing bytes"), sink="CorruptRecord"),
        TopicCase("topic.calls.unknown_fingerprint", "unknown fingerprint", "a schema fingerprint nobody knows",
                  single("calls", "t4", lambda c: _unknown_fp(c.encode("CallRecord", _call(r("t4"), 0))[10:])),
                  (asm, "UnknownFingerprint", "fingerprint"), sink="UnknownFingerprint"),
        TopicCase("topic.env.unknown_fingerprint", "unknown fingerprint", "unknown fingerprint on the env topic",
                  single("env", "t5", lambda _c: _unknown_fp(b"\x00" * 12)), (asm, "UnknownFingerprint", "fingerprint"),
                  sink="UnknownFingerprint"),
        TopicCase("topic.calls.truncated_body", "truncated payload", "a call record cut after 40 bytes",
                  single("calls", "t6", lambda c: c.encode("CallRecord", _call(r("t6"), 0))[:40]),
                  (asm, "TruncatedPayload", "ends early"), sink="TruncatedPayload"),
        TopicCase("topic.calls.truncated_header", "truncated payload", "only 5 bytes of the 10-byte header",
                  single("calls", "t7", lambda _c: b"\xc3\x01abc"), (asm, "TruncatedPayload", "header"),
                  sink="TruncatedPayload"),
        TopicCase("topic.env.truncated_body", "truncated payload", "an AttemptStarted cut after 12 bytes",
                  single("env", "t8", lambda c: c.encode("AttemptStarted", _started(r("t8")))[:12]),
                  (asm, "TruncatedPayload", "ends early"), sink="TruncatedPayload"),
        TopicCase("topic.calls.score_record", "schema-incompatible record", "a Score on the calls topic",
                  single("calls", "t9", lambda c: c.encode("Score", _score(r("t9")))),
                  (asm, "SchemaMismatch", "expected CallRecord, got Score"), sink="SchemaMismatch"),
        TopicCase("topic.env.call_record", "schema-incompatible record", "a CallRecord on the env topic",
                  single("env", "t10", lambda c: c.encode("CallRecord", _call(r("t10"), 0))),
                  (asm, "SchemaMismatch", "got CallRecord"), sink="SchemaMismatch"),
        TopicCase("topic.calls.wrong_key", "schema-incompatible record", "a call keyed by another rollout",
                  lambda c: [_calls(_call(r("t11"), 0), c, key="someone-else")],
                  (asm, "InvalidEvent", "not its rollout id")),
        TopicCase("topic.calls.no_rollout_id", "schema-incompatible record", "a call with an empty rollout id",
                  lambda c: [TopicMessage("calls", r("t12").encode(),
                                          c.encode("CallRecord", _call(r("t12"), 0, rollout_id="")))],
                  (asm, "InvalidEvent", "has no rollout_id")),
        TopicCase("topic.calls.odd_output_bytes", "schema-incompatible record", "output_ids of 7 bytes",
                  lambda c: [_calls(_call(r("t13"), 0, output_ids=b"\x01" * 7), c)],
                  (asm, "InvalidEvent", "not a multiple of 4")),
        TopicCase("topic.calls.logprob_count", "schema-incompatible record", "fewer logprobs than output tokens",
                  lambda c: [_calls(_call(r("t14"), 0, output_logprobs=b"\x00" * 4), c)],
                  (asm, "InvalidEvent", "logprobs")),
        TopicCase("topic.calls.negative_index", "schema-incompatible record", "call_index -1",
                  lambda c: [_calls(_call(r("t15"), 0, call_index=-1), c)], (asm, "InvalidEvent", "negative")),
        TopicCase("topic.calls.conflicting", "duplicate slot", "a second, different call claiming call slot 0",
                  lambda c: [_env_msg("AttemptStarted", _started(r("t16")), c), _calls(_call(r("t16"), 0), c),
                             _calls(_call(r("t16"), 0, event_id="other-event-id"), c)],
                  (asm, "ConflictingEvent", "already held")),
        TopicCase("topic.env.finish_negative", "schema-incompatible record", "AttemptFinished with call_count -1",
                  lambda c: [_env_msg("AttemptFinished", make_finished(r("t17"), "a1", -1, 0), c)],
                  (asm, "InvalidEvent", "negative counts")),
        TopicCase("topic.env.step_negative", "schema-incompatible record", "EnvStep with event_index -1",
                  lambda c: [_env_msg("EnvStep", {**make_env(r("t18"), "a1", 0), "event_index": -1}, c)],
                  (asm, "InvalidEvent", "negative event_index")),
        TopicCase("topic.env.attempt_number_zero", "schema-incompatible record", "AttemptStarted attempt_number 0",
                  lambda c: [_env_msg("AttemptStarted", _started(r("t19"), attempt_number=0), c)],
                  (asm, "InvalidEvent", "attempt_number")),
        TopicCase("topic.rollouts.unknown_fingerprint", "unknown fingerprint", "junk on the rollouts topic",
                  single("rollouts", "t20", lambda _c: _unknown_fp(b"junk")), ("router", "UnknownFingerprint",
                                                                                "fingerprint"),
                  sink="UnknownFingerprint"),
        TopicCase("topic.rollouts.call_record", "schema-incompatible record", "a CallRecord on the rollouts topic",
                  single("rollouts", "t21", lambda c: c.encode("CallRecord", _call(r("t21"), 0))),
                  ("router", "SchemaMismatch", "expected CompletedRollout"), sink="SchemaMismatch"),
        TopicCase("topic.delta.missing_base", "delta with missing base", "a prompt delta on a call that never was",
                  lambda c: _delta_attempt(c, r("t22"), _missing_base), expect_incomplete="DeltaBaseMissing"),
        TopicCase("topic.delta.wrong_hash", "delta with wrong hash", "a prompt delta whose sha256 is wrong",
                  lambda c: _delta_attempt(c, r("t23"), _wrong_hash), expect_incomplete="DeltaHashMismatch"),
        TopicCase("topic.delta.prefix_too_long", "delta with wrong hash", "a delta whose sizes do not add up",
                  lambda c: _delta_attempt(c, r("t24"), _long_prefix), (asm, "InvalidEvent", "do not add up"),
                  bad_index=2),
    ]
