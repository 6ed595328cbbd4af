"""Organic-session rollouts for the baseline tests: calls with a session id and a harness request whose first
user message decides the cluster, rollout ids as the gateway derives them for a session key."""

from __future__ import annotations

import numpy as np

from producers.gateway.records import request_json
from schemas.feedback import FeedbackValue, build_feedback
from testkit.stages import AttemptSpec, attempt_events, growing_turns

Event = tuple[str, dict]
T0_US = 1_700_000_000_000_000  # a multiple of every window size the tests use
S = 1_000_000


def organic_rollout(name: str, message: str, at_us: int, seed: int, calls: int = 2) -> list[Event]:
    """One organic session's rollout: ``session-<name>``; its calls carry the session id and an OpenAI chat
    request whose first user message is ``message``."""
    rng = np.random.default_rng(seed)
    turns = growing_turns(rng, calls, 16, 4, 6, vocab=900, texts=[f"reply {i}" for i in range(calls)])
    events = attempt_events(AttemptSpec(f"session-{name}", "a1", turns, task_input={}, t0_us=at_us))
    for kind, record in events:
        if kind == "CallRecord":
            record["session_id"] = f"sess-{name}"
            # Recorded as the gateway records a request: an envelope around the body.
            record["request_json"] = request_json("POST", "/v1/chat/completions", "", {}, {"model": "m", "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": message}]})
    return events


def thumbs(name: str, up: bool, at_us: int) -> dict:
    """A thumbs-up or -down on the session (how production feedback names an organic rollout)."""
    return build_feedback(source="test-ui", target_kind="SESSION", target_id=f"sess-{name}", kind="BINARY",
                          value=FeedbackValue(binary=up), event_time_us=at_us, created_at_us=at_us + 5,
                          source_feedback_id=f"fb-{name}")
