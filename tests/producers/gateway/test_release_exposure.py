"""Release details are the admin's and the release cannot be steered by callers (issue 29, finding 7), through
a real gateway following a real decisions topic: /health shows the plan (release id: the routing salt,
fraction, pins) only to the admin key; ``x-tokentrail-traffic-label`` is refused (403) from a caller not
allowed to pin and honoured for the admin key or the traffic label key; ``total_ms`` runs from the body's
end, so trickling a body does not make a version look slow. Good calls before and after reach Kafka."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from models.policy_store import PolicyStore
from processors.release.controller import initial_state, pin_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from processors.stream.release_controller import publish_decision
from producers.delivery import CallPublisher
from producers.gateway.identity import LABEL_KEY_HEADER, TRAFFIC_LABEL_HEADER
from producers.gateway.options import GatewayOptions
from producers.gateway.text_side import ModelTextSide
from producers.gateway.wiring import build_app
from producers.sdk import Rollout
from schemas.kafka.config import producer_config
from testkit.gateway import running_gateway
from tokentrail.settings import Settings

from .helpers import read_records

ADMIN, LABEL_KEY, LABEL = "admin-secret", "label-secret", "eval"
USER = [{"role": "user", "content": "hi"}]


def _health(url: str, key: str | None = None) -> dict:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{url}/health", headers=headers, timeout=10).json()


def _trickled(first: bytes, rest: bytes, pause_s: float) -> Iterator[bytes]:
    yield first
    time.sleep(pause_s)
    yield rest


def test_release_details_are_the_admins_and_labels_need_a_key(
        tokentrail_settings: Settings, kafka_bootstrap: str, new_topic: Callable[..., str],
        topics: dict[str, str], model_dir: Path, text_side: ModelTextSide, tmp_path: Path) -> None:
    decisions = new_topic(partitions=1)
    store = PolicyStore(tmp_path / "policies")
    weights = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()
    store.publish(0, weights)
    store.publish(1, weights)  # a candidate (the same weights: this test is about who sees and steers it)
    gateway = tokentrail_settings.gateway.model_copy(update={"follow_releases": True, "admin_key": ADMIN,
                                                             "traffic_label_key": LABEL_KEY})
    settings = tokentrail_settings.model_copy(update={"gateway": gateway})
    model = settings.model.name
    plan = load_plan({"ramp": [0.5]})
    state = initial_state(model, plan, serving_version=0)
    for decide in (lambda s: start_decision(s, 1, "test", plan=plan), lambda s: pin_decision(s, LABEL, 1, "test")):
        record, state = decision_record(state, decide(state), created_at_us=time.time_ns() // 1000)
        publish_decision(settings.kafka, decisions, record)
    options = GatewayOptions.from_settings(settings)
    publisher = CallPublisher(producer_config(settings.kafka), tmp_path / "spool", 5.0)
    app = build_app(settings, publisher=publisher, text=text_side, topics=topics, progress=lambda _: None,
                    policy_dir=store.root, release_topic=decisions, options=options)
    with running_gateway(app) as gw, Rollout(gw.url, admin_key=ADMIN) as rollout:
        deadline = time.monotonic() + 60
        while not _health(gw.url, ADMIN)["release"]["caught_up"] and time.monotonic() < deadline:
            time.sleep(0.2)
        admin_view = _health(gw.url, ADMIN)["release"]
        assert admin_view["traffic"]["release_id"] == state.release_id
        assert admin_view["traffic"]["pinned"] == {LABEL: 1} and admin_view["traffic"]["candidate_fraction"] == 0.5
        for key in (None, rollout.api_key, "wrong"):  # open /health: that it follows, nothing of the plan
            public = httpx.get(f"{gw.url}/health", timeout=10,
                               headers={"authorization": f"Bearer {key}"} if key else {})
            assert public.status_code == 200 and public.json()["release"] == {
                "model": model, "caught_up": True, "decisions_read": 2}
            assert state.release_id not in public.text and LABEL not in public.text

        client = rollout.openai_client(max_retries=0)
        assert client.chat.completions.create(model=model, messages=USER, max_tokens=2).choices  # before
        with pytest.raises(openai.PermissionDeniedError) as refused:
            client.chat.completions.create(model=model, messages=USER, max_tokens=2,
                                           extra_headers={TRAFFIC_LABEL_HEADER: LABEL})
        assert refused.value.code == "traffic_label_forbidden"
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(model=model, messages=USER, max_tokens=2,
                                           extra_headers={TRAFFIC_LABEL_HEADER: LABEL, LABEL_KEY_HEADER: "nope"})
        client.chat.completions.create(model=model, messages=USER, max_tokens=2,
                                       extra_headers={TRAFFIC_LABEL_HEADER: LABEL, LABEL_KEY_HEADER: LABEL_KEY})
        admin = openai.OpenAI(base_url=rollout.openai_base_url, api_key=ADMIN, max_retries=0)
        admin.chat.completions.create(model=model, messages=USER, max_tokens=2,
                                      extra_headers={TRAFFIC_LABEL_HEADER: LABEL})
        # A body trickled over 1.5 s: the call's total_ms is its serving time, not the upload's.
        body = httpx.Request("POST", "/", json={"model": model, "messages": USER, "max_tokens": 2}).content
        trickled = httpx.post(f"{rollout.openai_base_url}/chat/completions", timeout=60,
                              content=_trickled(body[:10], body[10:], 1.5),
                              headers={"authorization": f"Bearer {rollout.api_key}",
                                       "content-type": "application/json"})
        assert trickled.status_code == 200, trickled.text
        assert client.chat.completions.create(model=model, messages=USER, max_tokens=2).choices  # after
        calls = sorted((r for _, r in read_records(settings, topics["calls_topic"], 5,
                                                   where={"rollout_id": rollout.rollout_id})),
                       key=lambda r: r["call_index"])
    assert [c["status"] for c in calls] == ["OK"] * 5  # the refused calls took no index and left no record
    arms = [c["release"]["arm"] for c in calls]
    assert arms[1:3] == ["pinned", "pinned"] and arms[0] == arms[3] == arms[4] in ("serving", "candidate")
    assert calls[3]["timings"]["total_ms"] < 1000, calls[3]["timings"]
