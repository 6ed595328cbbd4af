"""A gateway restart does not break the harnesses it serves: the new process rebuilds its open attempts
from Kafka (recovery.py) and the harness's next call, with the same minted key and base URL, is accepted
with the right index; the rollout still completes. Records still in the spool at restart count too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from processors.assembler import RolloutAssembly
from producers.gateway.attempts import AttemptRegistry, Tombstone
from producers.gateway.errors import GatewayError
from producers.gateway.recovery import AttemptFold
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from schemas.builders import make_call, make_finished, make_started
from schemas.codec import get_codec
from schemas.ids import call_id
from schemas.prompt_delta import full_prompt
from schemas.tokens import pack_ids
from testkit.gateway import RunningGateway, embedded_gateway_app, running_gateway
from tokentrail.settings import Settings

from .helpers import is_token_prefix, output_of, prompts_of, read_records

MODEL = "tokentrail-tiny"
# Clean scripted outputs for the calls before the restart, so the history re-renders to their exact ids.
SCRIPT = ["Let me look at the file first.", "The file says hello."]


@contextmanager
def _gateway(settings: Settings, topics: dict[str, str], spool: Path, text: ModelTextSide,
             port: int = 0) -> Iterator[RunningGateway]:
    app = embedded_gateway_app(settings, spool_dir=spool, topics=topics, text=text)
    with running_gateway(app, port=port) as gw:
        yield gw


def _port(gw: RunningGateway) -> int:
    return int(gw.url.rsplit(":", 1)[1])


def _converse(client: openai.OpenAI, messages: list[dict[str, Any]], turns: int) -> None:
    for n in range(turns):
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": f"go on ({n})"}]


def _check_complete(settings: Settings, topics: dict[str, str], rollout_id: str) -> list[dict[str, Any]]:
    """The attempt's three calls and its start and finish are on Kafka and assemble COMPLETE."""
    calls = sorted((r for _, r in read_records(settings, topics["calls_topic"], 3, where={"rollout_id": rollout_id})),
                   key=lambda r: r["call_index"])
    env = read_records(settings, topics["env_topic"], 2, where={"rollout_id": rollout_id})
    assert [c["call_index"] for c in calls] == [0, 1, 2]
    assert [c["status"] for c in calls] == ["OK"] * 3
    assert {name for name, _ in env} == {"AttemptStarted", "AttemptFinished"}
    finished = next(r for name, r in env if name == "AttemptFinished")
    assert finished["call_count"] == 3
    state = RolloutAssembly(rollout_id)
    emitted = [r for name, rec in [*env, *(("CallRecord", c) for c in calls)] for r in state.accept(name, rec).rollouts]
    (completed,) = emitted
    assert completed["status"] == "COMPLETE" and len(completed["calls"]) == 3
    return calls


def test_a_restarted_gateway_keeps_serving_a_session_and_its_rollout_completes(
    tokentrail_settings: Settings, topics: dict[str, str], text_side: ModelTextSide, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    with _gateway(tokentrail_settings, topics, spool, text_side) as first:
        port = _port(first)
        rollout = Rollout(first.url, task_input={"file": "hi.txt"}, script=SCRIPT)
        rollout.start()
        # The harness knows only the plain base URL and its minted key.
        client = openai.OpenAI(base_url=first.openai_base_url, api_key=rollout.api_key, max_retries=3)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What does hi.txt say?"}]
        _converse(client, messages, 2)
    # A new process on the same topics, address and spool (a restart or a rolling deploy).
    with _gateway(tokentrail_settings, topics, spool, text_side, port=port) as second:
        health = httpx.get(f"{second.url}/health").json()
        assert health["recovery"]["restored"] >= 1 and health["recovery"]["skipped"] == ""
        status = httpx.get(f"{second.url}/v1/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}",
                           headers={"Authorization": f"Bearer {rollout.api_key}"}).json()
        assert (status["finished"], status["calls"]) == (False, 2)
        _converse(client, messages, 1)  # the same client: same key, same base URL
        finished = rollout.finish("SUCCESS", {})
        rollout.close()
    assert finished["call_count"] == 3
    calls = _check_complete(tokentrail_settings, topics, rollout.rollout_id)
    # The call after the restart builds on the rebuilt state: a delta on call 1, its output spliced, and
    # prompt 1 ‖ output 1 is a token prefix of prompt 2, as without a restart.
    after = calls[2]
    assert after["prompt"]["base_call_id"] == call_id(rollout.rollout_id, rollout.attempt_id, 1)
    assert after["spliced_outputs"] >= 1
    prompts = prompts_of(calls)
    for k in (0, 1):
        assert is_token_prefix(np.concatenate([prompts[k], output_of(calls[k])[0]]), prompts[k + 1])


def test_records_still_in_the_spool_at_restart_count(
    tokentrail_settings: Settings, topics: dict[str, str], text_side: ModelTextSide, tmp_path: Path
) -> None:
    """The first gateway cannot reach Kafka: the start and two calls wait in its spool. The next process on
    that spool drains it before rebuilding, so it knows the attempt and gives the next call index 2."""
    spool = tmp_path / "spool"
    unreachable = tokentrail_settings.model_copy(update={
        "kafka": tokentrail_settings.kafka.model_copy(update={"bootstrap_servers": "127.0.0.1:9"}),
        "gateway": tokentrail_settings.gateway.model_copy(update={"delivery_timeout_s": 0.5})})
    with _gateway(unreachable, topics, spool, text_side) as first:
        port = _port(first)
        # With no broker answering, start-up gives up on recovery at once and serves from the spool.
        assert "no Kafka broker answered" in httpx.get(f"{first.url}/health").json()["recovery"]["skipped"]
        rollout = Rollout(first.url, task_input={"spooled": True})
        rollout.start()
        client = openai.OpenAI(base_url=first.openai_base_url, api_key=rollout.api_key, max_retries=3)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hi."}]
        _converse(client, messages, 2)
        assert httpx.get(f"{first.url}/health").json()["sink"]["spool_depth"] == 3
    with _gateway(tokentrail_settings, topics, spool, text_side, port=port) as second:
        health = httpx.get(f"{second.url}/health").json()
        assert health["sink"]["spool_depth"] == 0 and health["recovery"]["restored"] >= 1
        _converse(client, messages, 1)
        finished = rollout.finish("SUCCESS", {})
        rollout.close()
    assert finished["call_count"] == 3
    _check_complete(tokentrail_settings, topics, rollout.rollout_id)


def _call(rid: str, aid: str, index: int, status: str = "OK") -> dict[str, Any]:
    return {"rollout_id": rid, "attempt_id": aid, "call_id": call_id(rid, aid, index), "call_index": index,
            "status": status, "prefix_mode": "splice", "prompt": full_prompt(np.arange(20 + index)),
            "output_ids": pack_ids([7, 8, 9])}


def test_the_fold_is_order_independent_and_idempotent() -> None:
    started = {"rollout_id": "r", "attempt_id": "a", "attempt_number": 1, "created_at_us": 5,
               "task_input_json": '{"x":1}', "metadata_json": "{}", "group_id": None, "group_key": {},
               "expected_group_size": None}
    done = {"rollout_id": "f", "attempt_id": "b", "attempt_number": 1, "created_at_us": 5,
            "task_input_json": None, "metadata_json": "{}", "group_id": None, "group_key": {},
            "expected_group_size": None}
    records = [("AttemptStarted", started), ("CallRecord", _call("r", "a", 0)), ("CallRecord", _call("r", "a", 1)),
               ("CallRecord", _call("r", "a", 2, "ERROR")), ("EnvStep", {"rollout_id": "r", "attempt_id": "a",
                                                                         "event_index": 0}),
               ("AttemptStarted", done), ("AttemptFinished", {"rollout_id": "f", "attempt_id": "b", "status": "SUCCESS",
                                                              "call_count": 4, "event_count": 0}),
               ("CallRecord", _call("r", "orphan", 0))]  # its start is before the look-back: not restorable
    forward = AttemptFold().add_all(records).result()
    backward = AttemptFold().add_all(reversed(records + records)).result()  # reversed and delivered twice
    for result in (forward, backward):
        by_id = {a.attempt_id: a for a in result}
        assert set(by_id) == {"a", "b"}
        live = by_id["a"]
        assert (live.next_call_index, live.next_event_index, live.finished) == (3, 1, None)
        assert [o.call_index for o in live.outputs] == [0, 1], "a failed call's output is never spliced"
        assert [c.call_index for c in live.recent] == [0, 1] and live.start["task_input"] == {"x": 1}
        assert by_id["b"].finished == Tombstone(4, 0, "SUCCESS")


def test_a_call_lost_in_a_crash_gets_a_stand_in_and_the_attempt_can_still_complete() -> None:
    """A gateway killed with two calls in flight recorded call 2 but not call 1: the rebuilt state records a
    stand-in for call 1 (its id, status ERROR, no tokens), so the finish's count is met."""
    rid, aid = "r-lost", "a-lost"
    records = [("AttemptStarted", make_started(rid, aid)),
               ("CallRecord", make_call(rid, aid, 0, np.arange(30), [5, 6])),
               ("CallRecord", make_call(rid, aid, 2, np.arange(40), [7, 8]))]
    fold = AttemptFold().add_all(records)
    (stand_in,) = fold.lost_calls()
    assert (stand_in["call_id"], stand_in["call_index"], stand_in["status"]) == (call_id(rid, aid, 1), 1, "ERROR")
    assert stand_in["error"]["type"] == "lost_in_restart" and stand_in["output_ids"] == b""
    get_codec().encode("CallRecord", stand_in)  # a valid record of the contract
    (restored,) = fold.result()
    assert restored.next_call_index == 3
    state = RolloutAssembly(rid)
    events = [*records, ("CallRecord", stand_in), ("AttemptFinished", make_finished(rid, aid, 3, 0))]
    (rollout,) = [r for name, rec in events for r in state.accept(name, rec).rollouts]
    assert rollout["status"] == "COMPLETE" and len(rollout["calls"]) == 3
    assert AttemptFold().add_all([*records, ("CallRecord", stand_in)]).lost_calls() == []


def test_a_restart_does_not_revive_an_attempt_abandoned_before_it() -> None:
    now_us = int(time.time() * 1e6)
    abandoned = make_started("r-old", "a-old", created_at_us=now_us - 2 * 3600 * 10**6)
    recent = make_started("r-new", "a-new", created_at_us=now_us - 60 * 10**6)
    registry = AttemptRegistry(idle_ttl_s=3600, key_secret=b"k" * 32)
    assert registry.restore(AttemptFold().add_all([("AttemptStarted", abandoned),
                                                   ("AttemptStarted", recent)]).result()) == 1
    with pytest.raises(GatewayError) as expired:
        registry.get_active("r-old", "a-old")
    assert expired.value.status == 410 and expired.value.code == "attempt_expired"
    assert registry.by_api_key(registry.api_key_for("r-old", "a-old")) is None
    live = registry.get_active("r-new", "a-new")
    assert registry.by_api_key(live.api_key) == ("r-new", "a-new")
