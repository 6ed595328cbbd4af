"""The values of the feedback join's two internal topics: small JSON messages, one ``type`` each.

  tokentrail.feedback-by-target   key "call:<call id>" | "session:<session id>"
      index     a call of a rollout: the id feedback may name belongs to ``rollout_id`` (from tokentrail.calls)
      feedback  a feedback naming that id, with where it sits on tokentrail.feedback
  tokentrail.feedback-by-rollout  key rollout id
      rollout   a completed rollout as the join needs it (``RolloutRef``)
      feedback  a feedback resolved to this rollout (``via``: what it named: call, session or rollout)

Feedback rides along whole (it is plain data), with its place on tokentrail.feedback, so a late or
unmatched record can point at it. Its content (text, details) rides sealed under its subject's key, as it is
on tokentrail.feedback (``for_the_join``): these topics and the join's and resolver's changelogs keep it,
and a forget must reach those copies too. Pure: no Kafka here.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson

from processors.errors import InvalidEvent
from processors.feedback.join import RolloutRef, ref_from_data, ref_to_data, target_key
from processors.stream.state_budget import StateOverflow
from schemas.codec import Codec

Record = dict[str, Any]


@dataclass(frozen=True)
class Source:
    """Where a feedback event sits on tokentrail.feedback (its dead letters point there)."""

    topic: str
    partition: int
    offset: int

    def to_data(self) -> list[Any]:
        return [self.topic, self.partition, self.offset]

    @classmethod
    def of(cls, data: list[Any]) -> Source:
        return cls(str(data[0]), int(data[1]), int(data[2]))


def target_message_key(feedback: Record) -> str | None:
    """The by-target key of a feedback that names a call (response) or session; None for a rollout id
    (no lookup needed) or for a target that names nothing."""
    key = target_key(feedback)
    return None if key is None or key[0] == "rollout" else f"{key[0]}:{key[1]}"


def index_messages(call: Record) -> list[tuple[str, bytes]]:
    """A call record's ids feedback may name, each with its rollout id."""
    body = {"type": "index", "rollout_id": call["rollout_id"], "event_us": int(call["timings"]["received_at_us"])}
    keys = [f"call:{call['event_id']}"] + ([f"session:{call['session_id']}"] if call.get("session_id") else [])
    return [(key, orjson.dumps(body)) for key in keys]


def for_the_join(codec: Codec, feedback: Record) -> Record:
    """The feedback as the join's topics and tables carry it: a feedback of a subject with its content sealed
    (nothing readable of it once the subject is forgotten), the envelope as base64 text so it stays JSON."""
    sealer = codec.sealer
    if sealer is not None:
        feedback = sealer.seal("Feedback", feedback)  # as it was on tokentrail.feedback; no subject: as is
    sealed = feedback.get("sealed")
    if isinstance(sealed, bytes):
        feedback = dict(feedback, sealed=base64.b64encode(sealed).decode("ascii"))
    return feedback


def as_record(feedback: Record) -> Record:
    """A feedback the join carries, as the Feedback record the codec writes (its envelope as bytes again)."""
    sealed = feedback.get("sealed")
    return dict(feedback, sealed=base64.b64decode(sealed)) if isinstance(sealed, str) else feedback


def feedback_message(feedback: Record, source: Source, via: str = "rollout") -> bytes:
    """``feedback`` as ``for_the_join`` gives it."""
    return orjson.dumps({"type": "feedback", "feedback": feedback, "source": source.to_data(), "via": via})


def rollout_message(ref: RolloutRef) -> bytes:
    return orjson.dumps({"type": "rollout", "ref": ref_to_data(ref)})


def read_message(value: bytes, topic: str) -> Record:
    """A decoded internal message; InvalidEvent (dead-lettered) for anything else."""
    try:
        message = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent(f"not a feedback-join message on {topic}: {exc}") from exc
    if not isinstance(message, dict) or message.get("type") not in ("index", "feedback", "rollout"):
        raise InvalidEvent(f"not a feedback-join message on {topic}: {str(message)[:200]}")
    if message["type"] == "rollout":
        message["ref"] = ref_from_data(message["ref"])
    elif message["type"] == "feedback":
        message["source"] = Source.of(message["source"])
    return message


def overflow_of(incoming: Record, exc: StateOverflow) -> StateOverflow:
    """``exc`` naming the feedback refused (its dead letter is found by the feedback's id), if it was one."""
    if incoming.get("type") == "feedback":
        return StateOverflow(f"feedback {incoming['feedback']['event_id']}: {exc}")
    return exc
