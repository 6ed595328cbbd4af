"""Events whose body finishes arriving after the attempt's finish (issue 29, finding 10): refused with 409
``attempt_finished``, not given indices beyond the ``event_count`` the AttemptFinished states. Events before
the finish, and another rollout's events after, reach Kafka."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx

from producers.sdk import Rollout

from .conftest import GatewayFactory
from .helpers import read_records


def test_events_whose_body_ends_after_the_finish_are_refused(start_gateway: GatewayFactory, topics: dict[str, str],
                                                             tokentrail_settings) -> None:
    with start_gateway() as gw:
        rollout = Rollout(gw.url, task_input={})
        rollout.start()
        rollout.event("STEP", {"n": 0})  # before: index 0
        body = json.dumps({"kind": "STEP", "payload": {"n": 1}}).encode()
        first_sent, finished = threading.Event(), threading.Event()

        def trickled() -> Iterator[bytes]:
            yield body[:5]
            first_sent.set()
            finished.wait(30)
            yield body[5:]

        answer: list[httpx.Response] = []
        poster = threading.Thread(target=lambda: answer.append(httpx.post(
            f"{gw.url}/v1/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt_id}/events", content=trickled(),
            headers={"authorization": f"Bearer {rollout.api_key}", "content-type": "application/json"},
            timeout=60)))
        poster.start()
        assert first_sent.wait(30)
        time.sleep(0.5)  # the handler has checked the attempt and waits for the rest of the body
        done = rollout.finish()
        finished.set()
        poster.join(60)
        assert done["event_count"] == 1
        late = answer[0]
        assert late.status_code == 409 and late.json()["error"]["code"] == "attempt_finished", late.text
        with Rollout(gw.url, task_input={}) as after:
            assert after.event("STEP", {"n": 2})["event_index"] == 0
    steps = read_records(tokentrail_settings, topics["env_topic"], 1,
                         where={"rollout_id": rollout.rollout_id, "kind": "STEP"})
    assert [r["event_index"] for _, r in steps] == [0]
    read_records(tokentrail_settings, topics["env_topic"], 1, where={"rollout_id": after.rollout_id, "kind": "STEP"})
