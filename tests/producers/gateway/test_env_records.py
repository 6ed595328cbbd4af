"""The environment API takes nothing it cannot store: a record that cannot be built or encoded is refused
before any state changes, and a call still uploading when its attempt finishes is refused, not counted
past the finish (issue 17). Each bad request is followed by a good one that must still work."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
USER = [{"role": "user", "content": "hi"}]


def nested(depth: int) -> Any:
    """JSON nested deeper than the serializer goes (orjson parses it but cannot write it back)."""
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_finish_that_cannot_be_stored_leaves_the_attempt_open(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    with start_gateway() as gw, Rollout(gw.url) as rollout:
        base = f"{gw.url}/v1/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}"
        refused = httpx.post(f"{base}/finish", json={"status": "SUCCESS", "final_artifacts": nested(300)})
        assert refused.status_code == 400 and "cannot be stored" in refused.json()["error"]["message"]
        status = httpx.get(base).json()
        assert status["finished"] is False  # nothing changed: the attempt is still open
        finished = rollout.finish("SUCCESS", {"answer": "red"})
    assert (finished["call_count"], finished["event_count"]) == (0, 0)
    env = [r for _, r in read_records(tokentrail_settings, topics["env_topic"], 2)]
    assert [r["event_id"] for r in env if "status" in r] == [finished["event_id"]]


def test_an_event_batch_that_cannot_be_stored_takes_no_index(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    with start_gateway() as gw, Rollout(gw.url) as rollout:
        base = f"{gw.url}/v1/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}"
        batch = {"events": [{"kind": "STEP", "payload": 1}, {"kind": "STATE", "payload": nested(300)}]}
        refused = httpx.post(f"{base}/events", json=batch)
        assert refused.status_code == 400
        good = rollout.event("STEP", {"after": True})
        assert good["event_index"] == 0  # the refused batch took none
        finished = rollout.finish()
    assert finished["event_count"] == 1
    env = [r for _, r in read_records(tokentrail_settings, topics["env_topic"], 3)]  # start, step, finish
    steps = [r for r in env if "event_index" in r]
    assert len(steps) == 1 and orjson.loads(steps[0]["payload_json"]) == {"after": True}


def test_a_call_still_uploading_when_its_attempt_finishes_is_refused(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    body = orjson.dumps({"model": MODEL, "messages": USER, "max_tokens": 3})

    async def run(gateway_url: str) -> tuple[httpx.Response, dict[str, Any], httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as http:
            started = (await http.post(f"{gateway_url}/v1/rollouts", json={})).json()
            uploaded_half = asyncio.Event()

            async def slow_body() -> AsyncIterator[bytes]:
                yield body[:10]
                uploaded_half.set()
                await asyncio.sleep(1.0)  # the finish lands while the rest of the body is on its way
                yield body[10:]

            call = asyncio.create_task(http.post(
                f"{started['openai_base_url']}/chat/completions", content=slow_body(),
                headers={"Authorization": f"Bearer {started['api_key']}", "content-type": "application/json"}))
            await uploaded_half.wait()
            await asyncio.sleep(0.2)
            base = f"{gateway_url}/v1/rollouts/{started['rollout_id']}/attempts/{started['attempt_id']}"
            finished = (await http.post(f"{base}/finish", json={})).json()
            late = await call
            after = await http.post(f"{gateway_url}/v1/rollouts", json={})  # the gateway goes on
            return late, finished, after

    with start_gateway() as gw:
        late, finished, after = asyncio.run(run(gw.url))
    assert late.status_code == 409 and late.json()["error"]["code"] == "attempt_finished"
    assert finished["call_count"] == 0
    assert after.status_code == 201
    # What came after the refusal reached Kafka: the first attempt's start and finish, the next one's start;
    # and the refused call left no record.
    env = {r["event_id"] for _, r in read_records(tokentrail_settings, topics["env_topic"], 3)}
    assert {finished["event_id"], after.json()["event_id"]} <= env
    with pytest.raises(AssertionError, match="found 0"):
        read_records(tokentrail_settings, topics["calls_topic"], 1, timeout_s=5)
