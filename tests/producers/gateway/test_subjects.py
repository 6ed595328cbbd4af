"""Subjects (issue 31 item 1): every record the gateway writes names whose content it carries: an organic
session's key, the ``subject`` given when a rollout is created, or none (synthetic traffic); the assembler
carries it onto the rollout. What is stored is the name's keyed pseudonym (schemas/subject_names.py): a
reader of the records learns no user id, only the tenant part before the first ``/``."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import httpx
import openai

from processors.assembler import RolloutAssembly
from schemas.sealing import CONTENT_FIELDS
from schemas.subject_names import SubjectNames
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

    names = SubjectNames(tokentrail_settings.forget.master())
    user, organic = names.stored("tenant-7/user-42"), names.stored("organic-user-9")
    assert user.startswith("tenant-7/subj:") and organic.startswith("subj:") and given["subject"] == user
    feedback = read_records(tokentrail_settings, FEEDBACK_TOPIC, 3, where={"source": source})
    assert sorted(str(r["subject"]) for _, r in feedback) == sorted(["None", organic, user])
    for rid, subject in ((given["rollout_id"], user), (synthetic["rollout_id"], None),
                         (ended["rollout_id"], organic)):
        env = read_records(tokentrail_settings, topics["env_topic"], 3 if subject != organic else 2,
                           where={"rollout_id": rid})
        calls = read_records(tokentrail_settings, topics["calls_topic"], 1, where={"rollout_id": rid})
        assert {r["subject"] for _, r in [*env, *calls]} == {subject}, rid
        # No raw id in what is stored outside the sealed content (read here opened: the content has them).
        for name, record in [*env, *calls]:
            facts = {k: v for k, v in record.items() if k not in CONTENT_FIELDS[name] and k != "sealed"}
            assert "user-42" not in str(facts) and "organic-user-9" not in str(facts), (name, facts)
        assembly = RolloutAssembly(rid)
        (rollout,) = [out for name, rec in [*env, *calls] for out in assembly.accept(name, rec).rollouts]
        assert rollout["status"] == "COMPLETE" and rollout["subject"] == subject
