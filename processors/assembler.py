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

from dataclasses import dataclass, field

from processors.attempt_buffer import (
    AttemptBuffer,
    Record,
    call_done_us,
    check_identity,
    frame_attempts,
    unframe_attempts,
)
from processors.call_tokens import CallTokens, rebuild_calls
from processors.errors import CallTokensError, InvalidEvent
from processors.parse_failures import recorded_parse_failures
from processors.prefix import prefix_links
from schemas.codec import get_codec
from schemas.ids import event_id
from schemas.prompt_delta import MIN_SHARED_PREFIX, common_prefix_len
from schemas.sealing import is_forgotten
from schemas.tokens import IdArray

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
    codec = get_codec()
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
    times = [call_done_us(c) for c in calls] + [int(e["created_at_us"]) for e in envs]
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
    codec = get_codec()
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
        check_identity(name, record, self.rollout_id, None)
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
        return frame_attempts([self.attempts[a] for a in sorted(self.attempts)], meta)

    @classmethod
    def from_bytes(cls, data: bytes) -> RolloutAssembly:
        attempts, meta = unframe_attempts(data)
        state = cls(rollout_id=meta["rollout_id"], emitted=dict(meta["emitted"]),
                    max_attempt_number=int(meta["max_attempt_number"]),
                    counted_attempt_id=meta["counted_attempt_id"], last_event_us=int(meta["last_event_us"]))
        state.attempts = {b.attempt_id: b for b in attempts}
        return state



def new_state(rollout_id: str) -> RolloutAssembly:
    return RolloutAssembly(rollout_id=rollout_id)
