"""Feedback and rollouts for the join's tests: a builder for each, and hypothesis strategies of whole
scenarios (rollouts, feedback naming them by every kind of id or naming nothing, ticks)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from processors.feedback.join import RolloutRef
from schemas.feedback import FeedbackValue, build_feedback

S = 1_000_000  # microseconds per second
T0 = 1_700_000_000 * S

Record = dict[str, Any]


def rollout(n: int, closed_s: float, *, calls: int = 2, session: str | None = None) -> RolloutRef:
    return RolloutRef(f"ev-r{n}", f"r{n}", "a1", T0 + round(closed_s * S),
                      tuple(f"c{n}-{i}" for i in range(calls)), (session,) if session else (), f"g{n}")


VALUES = {
    "BINARY": lambda i: FeedbackValue(binary=i % 2 == 0),
    "RATING": lambda i: FeedbackValue(rating=float(1 + i % 5), rating_min=1.0, rating_max=5.0),
    "OUTCOME": lambda i: (FeedbackValue(outcome="EDITED", edit_distance=(i % 4) / 4) if i % 3 == 0 else
                          FeedbackValue(outcome=("ACCEPTED", "REJECTED")[i % 2])),
    "TASK_OUTCOME": lambda i: FeedbackValue(task_success=i % 3 != 0, details={"ci_run": i}),
    "TEXT": lambda i: FeedbackValue(text=f"comment {i}"),
}


def feedback(target_kind: str, target_id: str, kind: str, at_s: float, *, n: int = 0,
             value: FeedbackValue | None = None, supersedes: str | None = None, source: str = "ui") -> Record:
    return build_feedback(source=source, target_kind=target_kind, target_id=target_id, kind=kind,
                          value=value if value is not None else VALUES[kind](n),
                          event_time_us=T0 + round(at_s * S), created_at_us=T0 + round(at_s * S) + 1,
                          source_feedback_id=f"fb-{n}", supersedes=supersedes)


Input = tuple[str, Any]  # ("rollout", RolloutRef) | ("feedback", Record) | ("tick", int)


@st.composite
def scenarios(draw: st.DrawFn) -> list[Input]:
    """Inputs in event-time order; the tests draw their arrival order separately."""
    n_rollouts = draw(st.integers(1, 4))
    refs = [rollout(i, draw(st.integers(0, 40)), calls=draw(st.integers(1, 3)),
                    session=draw(st.sampled_from([None, "s0", "s1"]))) for i in range(n_rollouts)]
    inputs: list[Input] = [("rollout", r) for r in refs]
    made: list[Record] = []
    for n in range(draw(st.integers(0, 10))):
        ref = draw(st.sampled_from(refs))
        how = draw(st.sampled_from(["RESPONSE", "CALL", "SESSION", "ROLLOUT", "unknown"]))
        if how == "RESPONSE":
            target = ("RESPONSE", draw(st.sampled_from(["chatcmpl-", "msg_", "resp_"])) + draw(
                st.sampled_from(ref.call_ids)))
        elif how == "CALL":
            target = ("CALL", draw(st.sampled_from(ref.call_ids)))
        elif how == "SESSION":
            target = ("SESSION", draw(st.sampled_from(["s0", "s1"])))
        elif how == "ROLLOUT":
            target = ("ROLLOUT", ref.rollout_id)
        else:
            target = ("CALL", f"nowhere-{n}")
        at = (ref.closed_at_us - T0) / S + draw(st.integers(-10, 30))
        revises = draw(st.sampled_from([None, *[f["event_id"] for f in made]]))
        made.append(feedback(*target, draw(st.sampled_from(list(VALUES))), at, n=n, supersedes=revises))
    inputs += [("feedback", f) for f in made]
    inputs += [("tick", T0 + draw(st.integers(0, 90)) * S) for _ in range(draw(st.integers(0, 3)))]
    return inputs


def event_time(item: Input) -> int:
    kind, value = item
    return value.closed_at_us if kind == "rollout" else value["event_time_us"] if kind == "feedback" else value
