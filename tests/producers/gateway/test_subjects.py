"""Subjects (issue 31 item 1): every record the gateway writes names whose content it carries: an organic
session's key, the ``subject`` given when a rollout is created, or none (synthetic traffic); the assembler
carries it onto the rollout."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import httpx
import openai

from processors.assembler import RolloutAssembly
from schemas.topics import FEEDBACK_TOPIC
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"


def _one_call(base_url: str, **extra: object) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}],
                                   max_tokens=3, temperature=0, **extra)  # type: ignore[call-overload]


def test_records_name_their_subject_and_synthetic_ones_none(
    start_gateway, topics: dict[str, str], tokentrail_settings: Settings
) -> None:
    with start_gateway(organic_sessions=True) as gw:
        given = httpx.post(f"{gw.url}/v1/rollouts", json={"subject": "tenant-7/user-42"}, timeout=60).json()
        synthetic = httpx.post(f"{gw.url}/v1/rollouts", json={}, timeout=60).json()
        for rollout in (given, synthetic):
            _one_call(rollout["openai_base_url"])
            base = f"{gw.url}/v1/rollouts/{rollout['rollout_id']}/attempts/{rollout['attempt_id']}"
            assert httpx.post(f"{base}/events", json={"kind": "TOOL_RESULT", "payload": {"r": 1}},
                              timeout=60).status_code == 201
            assert httpx.post(f"{base}/finish", json={}, timeout=60).status_code == 200
        _one_call(gw.openai_base_url, user="organic-user-9")
        ended = httpx.post(f"{gw.url}/v1/sessions/{quote('organic-user-9', safe='')}/end", timeout=60).json()
        # Feedback is the subject's content too: the rollout's subject, the session's key, or none.
        source = f"test-{uuid.uuid4().hex[:8]}"
        for target in ({"rollout_id": given["rollout_id"]}, {"session_id": "organic-user-9"},
                       {"rollout_id": synthetic["rollout_id"]}):
            posted = httpx.post(f"{gw.url}/v1/feedback", json={"target": target, "kind": "TEXT", "text": "meh",
                                                               "source": source}, timeout=60)
            assert posted.status_code == 201, posted.text

    feedback = read_records(tokentrail_settings, FEEDBACK_TOPIC, 3, where={"source": source})
    assert sorted(str(r["subject"]) for _, r in feedback) == ["None", "organic-user-9", "tenant-7/user-42"]
    for rid, subject in ((given["rollout_id"], "tenant-7/user-42"), (synthetic["rollout_id"], None),
                         (ended["rollout_id"], "organic-user-9")):
        env = read_records(tokentrail_settings, topics["env_topic"], 3 if subject != "organic-user-9" else 2,
                           where={"rollout_id": rid})
        calls = read_records(tokentrail_settings, topics["calls_topic"], 1, where={"rollout_id": rid})
        assert {r["subject"] for _, r in [*env, *calls]} == {subject}, rid
        assembly = RolloutAssembly(rid)
        (rollout,) = [out for name, rec in [*env, *calls] for out in assembly.accept(name, rec).rollouts]
        assert rollout["status"] == "COMPLETE" and rollout["subject"] == subject
