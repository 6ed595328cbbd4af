"""Assembler: joining start, calls, env events and finish in any order into a CompletedRollout."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.assembler import RolloutAssembly, check_call_tokens, expire, try_complete
from processors.attempt_buffer import AttemptBuffer
from processors.call_tokens import rollout_call_tokens
from processors.errors import CallTokensError, ConflictingEvent, InvalidEvent, RolloutTooLarge
from schemas.builders import chat_response, make_call, make_env, make_finished, make_started
from schemas.codec import get_codec
from schemas.ids import call_id
from schemas.prompt_delta import encode_prompt, full_prompt
from schemas.tokens import unpack_ids
from testkit.stages import AttemptSpec, Turn, attempt_events, growing_turns


def _spec(n_calls: int = 4, env: int = 2, seed: int = 0, **kw: object) -> AttemptSpec:
    rng = np.random.default_rng(seed)
    turns = growing_turns(rng, n_calls, 40, 12, 20, vocab=5000,
                          texts=[f"step {i}" for i in range(n_calls - 1)] + ["The answer is 42"])
    return AttemptSpec("r1", "a1", turns, env_events=env, task_input={"answer": "42"},
                       **kw)  # type: ignore[arg-type]


def _feed(state: RolloutAssembly, events: list[tuple[str, dict]]) -> list[dict]:
    out = []
    for name, rec in events:
        out += state.accept(name, rec).rollouts
    return out


def test_complete_attempt_in_order() -> None:
    spec = _spec()
    events = attempt_events(spec)
    (rollout,) = _feed(RolloutAssembly("r1"), events)
    assert rollout["status"] == "COMPLETE" and rollout["missing"] == [] and rollout["counted"]
    assert rollout["call_ids"] == [call_id("r1", "a1", i) for i in range(4)]
    assert [e["event_index"] for e in rollout["env_events"]] == [0, 1]
    assert rollout["final_output_text"] == "The answer is 42"
    assert rollout["task_input_json"] == '{"answer":"42"}'
    # every later prompt is a delta on the previous call, and reconstructs to the exact ids
    assert rollout["calls"][0]["prompt"]["ids"] is not None
    for i in range(1, 4):
        assert rollout["calls"][i]["prompt"]["base_call_id"] == rollout["call_ids"][i - 1]
    for tok, turn in zip(rollout_call_tokens(rollout), spec.turns, strict=True):
        assert np.array_equal(tok.prompt, turn.prompt) and np.array_equal(tok.output, turn.output)
    assert [(link["from_call_index"], link["is_prefix"]) for link in rollout["prefix_links"]] == [
        (0, True), (1, True), (2, True)]
    link = rollout["prefix_links"][0]
    assert link["common_prefix_len"] == link["expected_len"] == 40 + 12
    times = [rec.get("created_at_us") or rec["timings"]["received_at_us"] + 5000 for _, rec in events]
    assert rollout["created_at_us"] == max(times)
    get_codec().encode("CompletedRollout", rollout)  # valid against the schema


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), dup_every=st.integers(1, 4))
def test_any_order_with_duplicates_and_state_round_trips_gives_the_same_rollout(seed: int,
                                                                                dup_every: int) -> None:
    events = attempt_events(_spec())
    (expected,) = _feed(RolloutAssembly("r1"), events)
    shuffled = events + events[::dup_every]  # re-deliveries
    random.Random(seed).shuffle(shuffled)
    state = RolloutAssembly("r1")
    emitted = []
    for name, rec in shuffled:
        result = state.accept(name, rec)
        emitted += result.rollouts
        state = RolloutAssembly.from_bytes(state.to_bytes())  # changelog recovery at every step
    assert emitted == [expected]


def test_duplicates_are_idempotent_and_conflicts_are_errors() -> None:
    state = RolloutAssembly("r1")
    call = make_call("r1", "a1", 0, [1, 2, 3], [4, 5])
    assert not state.accept("CallRecord", call).duplicate
    assert state.accept("CallRecord", call).duplicate
    forged = dict(call, event_id="someone-else", call_id="someone-else")
    with pytest.raises(ConflictingEvent, match="call 0"):
        state.accept("CallRecord", forged)
    env = make_env("r1", "a1", 0)
    state.accept("EnvStep", env)
    with pytest.raises(ConflictingEvent):
        state.accept("EnvStep", make_env("r1", "a1", 0, kind="STATE"))


def test_invalid_events_are_rejected_with_the_reason() -> None:
    state = RolloutAssembly("r1")
    bad_logprobs = make_call("r1", "a1", 0, [1, 2], [3, 4, 5], logprobs=[-0.1, -0.2])
    with pytest.raises(InvalidEvent, match="2 logprobs for 3 output ids"):
        state.accept("CallRecord", bad_logprobs)
    with pytest.raises(InvalidEvent, match="belongs to rollout"):
        state.accept("CallRecord", make_call("r2", "a1", 0, [1], [2]))
    short = make_call("r1", "a1", 1, [1, 2], [3])
    short["prompt"] = dict(short["prompt"], length=5)
    with pytest.raises(InvalidEvent, match="prompt ids hold 2 tokens"):
        state.accept("CallRecord", short)
    with pytest.raises(InvalidEvent, match="does not take"):
        state.accept("Score", dict(make_env("r1", "a1", 0)))
    assert state.attempts == {} and state.expire_due(10**18, 1) == []  # nothing half-kept


def test_missing_pieces_expire_as_incomplete_and_late_events_change_nothing() -> None:
    events = attempt_events(_spec())
    held_back = [e for e in events if e[0] == "CallRecord" and e[1]["call_index"] == 2]
    state = RolloutAssembly("r1")
    assert _feed(state, [e for e in events if e not in held_back]) == []
    last = max(b.last_event_us for b in state.attempts.values())
    assert state.expire_due(last + 59_000_000, 60_000_000) == []
    assert state.next_deadline_us(60_000_000) == last + 60_000_000
    (incomplete,) = state.expire_due(last + 60_000_000, 60_000_000)
    assert incomplete["status"] == "INCOMPLETE" and not incomplete["counted"]
    assert incomplete["missing"][:2] == ["expired: no event for 60s", "calls 2 of 4"]
    assert incomplete["missing"][2].startswith("unverified call 3")  # its prompt is a delta on call 2
    assert [c["call_index"] for c in incomplete["calls"]] == [0, 1, 3]
    # links only between adjacent calls that are present
    assert [(x["from_call_index"], x["to_call_index"]) for x in incomplete["prefix_links"]] == [(0, 1)]
    get_codec().encode("CompletedRollout", incomplete)
    late = state.accept(*held_back[0])
    assert late.late and late.rollouts == []
    assert state.can_forget(last + 61_000_000, 0)


def test_missing_start_and_finish_are_named() -> None:
    buf = AttemptBuffer("r1", "a1")
    buf.add("CallRecord", make_call("r1", "a1", 0, [1, 2], [3]))
    assert buf.missing() == ["start", "finish"]
    rollout = expire(buf, "stream ended")
    assert rollout["missing"] == ["expired: stream ended", "start", "finish"]
    assert rollout["attempt_number"] == 0 and rollout["finish_status"] is None


def test_calls_beyond_the_stated_count_keep_the_attempt_open() -> None:
    events = attempt_events(_spec(n_calls=2, env=0))
    extra = make_call("r1", "a1", 5, [9] * 4, [8])
    state = RolloutAssembly("r1")
    assert _feed(state, [("CallRecord", extra), *events]) == []
    (rollout,) = state.expire_due(10**18, 1)
    assert "unexpected calls 5 beyond call_count 2" in rollout["missing"]


def _two_call_attempt(second_prompt: dict) -> list[tuple[str, dict]]:
    first = make_call("r1", "a1", 0, list(range(20)), [100, 101])
    second = make_call("r1", "a1", 1, [*list(range(20)), 100, 101, 7], [102], prompt_record=second_prompt)
    return [("AttemptStarted", make_started("r1", "a1")), ("CallRecord", first), ("CallRecord", second),
            ("AttemptFinished", make_finished("r1", "a1", 2, 0))]


def test_delta_base_missing_makes_the_rollout_incomplete_with_a_typed_error() -> None:
    ids = np.array([*list(range(20)), 100, 101, 7], dtype=np.uint32)
    foreign = encode_prompt(ids, "call-of-another-attempt", np.array([*list(range(20)), 100, 101], np.uint32))
    events = _two_call_attempt(foreign)
    (rollout,) = _feed(RolloutAssembly("r1"), events)
    assert rollout["status"] == "INCOMPLETE" and not rollout["counted"]
    assert any("DeltaBaseMissing" in m and "call 1" in m for m in rollout["missing"])
    buf = AttemptBuffer("r1", "a1")
    for name, rec in events:
        buf.add(name, rec)
    (err,) = check_call_tokens(buf)
    assert isinstance(err, CallTokensError) and err.call_index == 1 and "DeltaBaseMissing" in err.reason


def test_delta_hash_mismatch_is_detected() -> None:
    base_call = call_id("r1", "a1", 0)
    ids = np.array([*list(range(20)), 100, 101, 7], dtype=np.uint32)
    delta = encode_prompt(ids, base_call, np.array([*list(range(20)), 100, 101], np.uint32))
    delta["new_ids"] = np.array([8], dtype=np.uint32).tobytes()  # one id changed after hashing
    (rollout,) = _feed(RolloutAssembly("r1"), _two_call_attempt(delta))
    assert rollout["status"] == "INCOMPLETE"
    assert any("DeltaHashMismatch" in m for m in rollout["missing"])


def test_recorded_full_prompts_and_deltas_on_older_calls_become_deltas_on_the_previous_call() -> None:
    rng = np.random.default_rng(3)
    turns = growing_turns(rng, 3, 30, 5, 5, vocab=900)
    events = attempt_events(AttemptSpec("r1", "a1", turns, delta=False))
    # call 2 recorded as a delta on call 0 (legal: an earlier call of the attempt)
    seq0 = np.concatenate([turns[0].prompt, turns[0].output])
    events[3] = ("CallRecord", make_call("r1", "a1", 2, turns[2].prompt, turns[2].output,
                                         base=(call_id("r1", "a1", 0), seq0)))
    assert events[1][1]["prompt"]["ids"] is not None
    (rollout,) = _feed(RolloutAssembly("r1"), events)
    assert rollout["status"] == "COMPLETE"
    assert [c["prompt"]["base_call_id"] for c in rollout["calls"]] == [None, *rollout["call_ids"][:2]]
    for tok, turn in zip(rollout_call_tokens(rollout), turns, strict=True):
        assert np.array_equal(tok.prompt, turn.prompt)


def test_failed_calls_are_kept_and_the_final_text_comes_from_the_last_successful_call() -> None:
    rng = np.random.default_rng(4)
    turns = growing_turns(rng, 3, 20, 4, 4, vocab=900, texts=["a", "final answer: 7", "ignored"])
    turns[2] = Turn(turns[2].prompt, np.zeros(0, np.uint32), status="ERROR")
    (rollout,) = _feed(RolloutAssembly("r1"), attempt_events(AttemptSpec("r1", "a1", turns)))
    assert rollout["status"] == "COMPLETE"
    assert [c["status"] for c in rollout["calls"]] == ["OK", "OK", "ERROR"]
    assert rollout["final_output_text"] == "final answer: 7"


def test_counted_attempt_rules() -> None:
    def attempt(aid: str, number: int, status: str = "SUCCESS") -> list[tuple[str, dict]]:
        rng = np.random.default_rng(number)
        turns = growing_turns(rng, 2, 20, 3, 3, vocab=900)
        return attempt_events(AttemptSpec("r1", aid, turns, attempt_number=number, finish_status=status))

    # an aborted attempt does not count; its retry does; a later one does not
    state = RolloutAssembly("r1")
    (a1,) = _feed(state, attempt("a1", 1, "ABORTED"))
    (a2,) = _feed(state, attempt("a2", 2))
    (a3,) = _feed(state, attempt("a3", 3))
    assert (a1["counted"], a2["counted"], a3["counted"]) == (False, True, False)
    # a retry that started before the first attempt completed supersedes it
    state = RolloutAssembly("r1")
    first, retry = attempt("a1", 1), attempt("a2", 2)
    _feed(state, first[:-1] + retry[:1])
    (old,) = _feed(state, first[-1:])
    (new,) = _feed(state, retry[1:])
    assert (old["counted"], new["counted"]) == (False, True)
    # survives state serialization
    state = RolloutAssembly.from_bytes(state.to_bytes())
    assert state.counted_attempt_id == "a2" and state.emitted == {"a1": "COMPLETE", "a2": "COMPLETE"}


def test_state_is_compact_and_bodies_are_dropped() -> None:
    rng = np.random.default_rng(5)
    turns = growing_turns(rng, 8, 500, 100, 200, vocab=5000)
    events = attempt_events(AttemptSpec("r1", "a1", turns))
    for _, rec in events:
        if "request_json" in rec:
            rec["request_json"] = "x" * 100_000  # a big harness request: not kept
    state = RolloutAssembly("r1")
    _feed(state, events[:-1])
    size = len(state.to_bytes())
    unique_tokens = len(turns[-1].prompt) + len(turns[-1].output)
    assert size < 4 * unique_tokens + 4 * sum(len(t.output) for t in turns) + 8 * 1024


def test_response_text_of_streamed_and_anthropic_responses() -> None:
    from processors.response_text import response_text

    chunks = [{"object": "chat.completion.chunk", "choices": [{"delta": {"content": "Hel"}}]},
              {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "lo"}}]}]
    import json

    assert response_text(json.dumps(chunks)) == "Hello"
    sse = "event: content_block_delta\ndata: " + json.dumps(
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}}) + "\n\ndata: [DONE]\n"
    assert response_text(sse) == "Hi"
    assert response_text(json.dumps({"type": "message", "role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "42"}]})) == "42"
    assert response_text(json.dumps({"output": [{"type": "message", "content": [
        {"type": "output_text", "text": "ok"}]}]})) == "ok"
    assert response_text(chat_response("plain")) == "plain"
    assert response_text("") == ""


def test_attempt_buffer_round_trip_and_try_complete() -> None:
    buf = AttemptBuffer("r1", "a1")
    for name, rec in attempt_events(_spec()):
        buf.add(name, rec)
    again = AttemptBuffer.from_bytes(buf.to_bytes())
    assert again.missing() == [] and again.call_texts == buf.call_texts
    assert try_complete(again) == try_complete(buf)
    assert unpack_ids(full_prompt([1, 2])["ids"]).tolist() == [1, 2]


def test_records_that_do_not_fit_the_schema_are_invalid_events() -> None:
    state = RolloutAssembly("r1")
    call = make_call("r1", "a1", 0, [1], [2])
    del call["versions"]
    with pytest.raises(InvalidEvent, match="does not fit its schema"):
        state.accept("CallRecord", call)
    assert state.attempts == {}
    no_prompt = make_call("r1", "a1", 0, [1], [2])
    del no_prompt["prompt"]
    with pytest.raises(InvalidEvent, match="malformed"):
        state.accept("CallRecord", no_prompt)


def test_an_event_past_the_rollout_byte_cap_is_refused_and_changes_nothing() -> None:
    """The state (and the rollout emitted from it) stays under the cap, so it always fits a Kafka record;
    the event that would pass it is refused (the stream dead-letters it) and the attempt expires INCOMPLETE."""
    cap = 40_000
    state = RolloutAssembly("r")
    state.accept("AttemptStarted", make_started("r", "a"), cap)
    state.accept("EnvStep", make_env("r", "a", 0, payload="x" * 25_000), cap)
    before = state.to_bytes()
    with pytest.raises(RolloutTooLarge, match="max_rollout_bytes"):
        state.accept("EnvStep", make_env("r", "a", 1, payload="y" * 25_000), cap)
    assert state.to_bytes() == before
    small = state.accept("EnvStep", make_env("r", "a", 2, payload="z"), cap)  # what fits still goes in
    assert not small.duplicate and sum(b.size_bytes for b in state.attempts.values()) <= cap
    (rollout,) = state.expire_due(10**18, 1)
    assert rollout["status"] == "INCOMPLETE"
    assert RolloutAssembly("r").accept("EnvStep", make_env("r", "a", 1, payload="y" * 25_000)).rollouts == []  # no cap


def test_an_attempt_with_forgotten_content_never_completes() -> None:
    """Issue 31: a record whose subject's key is gone decodes blank and still sealed; the attempt it belongs
    to is INCOMPLETE (never scored or trained), saying why."""
    events = attempt_events(_spec())
    events = [(n, dict(r, sealed=b"TTS1...") if n == "CallRecord" and r["call_index"] == 1 else r)
              for n, r in events]
    (rollout,) = _feed(RolloutAssembly("r1"), events)
    assert rollout["status"] == "INCOMPLETE" and not rollout["counted"]
    assert any(m.startswith("forgotten: the content of 1 record") for m in rollout["missing"])


def test_a_subjects_output_text_stays_sealed_in_the_assembly_state() -> None:
    """Issue 31: the assembler's state (kept in a changelog topic) holds a subject's output text only sealed;
    the rollout still gets its final output text."""
    from schemas.codec import install_sealer
    from schemas.sealing import MemoryKeyring, Sealer

    events = [(n, dict(r, subject="tenant/u1")) for n, r in attempt_events(_spec())]
    previous = install_sealer(Sealer(MemoryKeyring()))
    try:
        state = RolloutAssembly("r1")
        out = []
        for name, rec in events[:-1]:
            out += state.accept(name, rec).rollouts
        assert out == [] and b"The answer is 42" not in state.to_bytes()
        (rollout,) = state.accept(*events[-1]).rollouts
    finally:
        install_sealer(previous)
    assert rollout["status"] == "COMPLETE" and rollout["final_output_text"] == "The answer is 42"
    assert rollout["subject"] == "tenant/u1"
