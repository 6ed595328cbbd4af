"""``POST /v1/feedback`` through the real gateway and the real broker: bad feedback is a clear 4xx in the
OpenAI error shape and stores nothing; good feedback after it, on the response id a real ``openai`` SDK
call received, reaches Kafka as the Feedback event naming that call; so does feedback sent with the SDK call."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from producers.gateway.session_refs import DEV_SESSION_REF_KEY, SessionRefs
from producers.sdk import Rollout, RolloutError, send_feedback
from schemas.topics import FEEDBACK_TOPIC
from tokentrail.settings import Settings

from .helpers import read_records

ADMIN = "feedback-admin-key"
MODEL = "tokentrail-tiny"


def refused(gw_url: str, body: object, *, key: str | None = ADMIN, status: int = 400) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reply = httpx.post(f"{gw_url}/v1/feedback", json=body, headers=headers, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]  # the OpenAI shape
    return error


def test_bad_feedback_is_refused_and_good_feedback_reaches_kafka(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    source = f"test-{uuid.uuid4().hex[:8]}"  # this run's feedback, among earlier runs' on the topic
    with start_gateway(admin_key=ADMIN) as gw, Rollout(gw.url, admin_key=ADMIN) as rollout:
        reply = rollout.openai_client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert reply.id.startswith("chatcmpl-")

        thumbs_up = {"target": {"response_id": reply.id}, "kind": "binary", "binary": True, "source": source}
        assert refused(gw.url, thumbs_up, key=None, status=401)["type"] == "authentication_error"
        assert refused(gw.url, thumbs_up, key=rollout.api_key, status=401)["code"] == "invalid_api_key"
        assert "exactly one" in refused(gw.url, dict(thumbs_up, target={"response_id": reply.id,
                                                                         "session_id": "s"}))["message"]
        assert refused(gw.url, dict(thumbs_up, target={"response_id": "gen-123"}))["param"] == "target"
        assert refused(gw.url, dict(thumbs_up, kind="rating"))["param"] == "rating"
        assert "outside its scale" in refused(gw.url, {**thumbs_up, "kind": "rating", "binary": None,
                                                       "rating": 7, "rating_scale": [1, 5]})["message"]
        assert refused(gw.url, {**thumbs_up, "kind": "outcome", "binary": None,
                                "outcome": "edited"})["param"] == "edit_distance"
        assert refused(gw.url, dict(thumbs_up, binary="yes"))["param"] == "binary"
        assert refused(gw.url, dict(thumbs_up, kind="praise"))["param"] == "kind"
        assert refused(gw.url, dict(thumbs_up, event_time=time.time() + 3600))["param"] == "event_time"
        assert refused(gw.url, dict(thumbs_up, unknown_field=1))["param"] == "unknown_field"

        good = httpx.post(f"{gw.url}/v1/feedback", json=thumbs_up, headers={"Authorization": f"Bearer {ADMIN}"})
        assert good.status_code == 201, good.text
        with pytest.raises(RolloutError) as no_key:  # the SDK call raises with the gateway's answer
            send_feedback(gw.url, {"rollout_id": rollout.rollout_id}, "TEXT", text="nice")
        assert no_key.value.status == 401
        second = send_feedback(gw.url, {"rollout_id": rollout.rollout_id}, "OUTCOME", admin_key=ADMIN,
                               outcome="edited", edit_distance=0.25, source=source,
                               details={"lines_kept": 30, "reviewer": {"github_token": "ghp_secret"}},
                               id="review-1", event_time=time.time() - 5)

    [(_, call)] = read_records(tokentrail_settings, topics["calls_topic"], 1)
    stored = {r["event_id"]: r for _, r in read_records(tokentrail_settings, FEEDBACK_TOPIC, 2,
                                                         where={"source": source})}
    assert set(stored) == {good.json()["event_id"], second["event_id"]}  # the refused ones left nothing
    up = stored[good.json()["event_id"]]
    assert (up["target_kind"], up["target_id"], up["call_id"]) == ("RESPONSE", reply.id, call["call_id"])
    assert up["kind"] == "BINARY" and up["binary"] is True
    review = stored[second["event_id"]]
    assert (review["target_kind"], review["target_id"], review["call_id"]) == ("ROLLOUT", rollout.rollout_id, None)
    assert (review["outcome"], review["edit_distance"]) == ("EDITED", 0.25)
    # details are redacted as request bodies are (issue 29, finding 10): by the field's name
    assert review["details_json"] == '{"lines_kept":30,"reviewer":{"github_token":"[redacted]"}}'

    assert review["source_feedback_id"] == "review-1" and review["event_time_us"] < review["created_at_us"]


def test_session_feedback_names_the_keyed_ref_its_calls_record(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    """A harness session id may be a user id: calls record its keyed ref, and feedback naming the session (by
    the id, or by the ref read from the records) is published under that same ref, so the join still finds the
    session's calls while neither record carries the id (issue 29, finding 10)."""
    user, source = f"jane-{uuid.uuid4().hex[:6]}@example.com", f"test-{uuid.uuid4().hex[:8]}"
    ref = SessionRefs(DEV_SESSION_REF_KEY).ref(user)
    with start_gateway() as gw:
        client = openai.OpenAI(base_url=gw.openai_base_url, api_key="anything", default_headers={"X-Session-Id": user})
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        posted = [httpx.post(f"{gw.url}/v1/feedback", timeout=30, json={
            "target": {"session_id": target}, "kind": "binary", "binary": True, "source": source})
            for target in (user, ref)]
    assert [p.status_code for p in posted] == [201, 201], [p.text for p in posted]
    [(_, call)] = read_records(tokentrail_settings, topics["calls_topic"], 1, where={"session_id": ref})
    assert user not in call["attempt_id"] and ref.startswith("hmac:")
    stored = {r["event_id"]: r for _, r in read_records(tokentrail_settings, FEEDBACK_TOPIC, 2,
                                                         where={"source": source})}
    by_id, by_ref = (stored[p.json()["event_id"]] for p in posted)
    assert [(r["target_kind"], r["target_id"]) for r in (by_id, by_ref)] == [("SESSION", ref)] * 2
    assert "subj:" in by_id["subject"] and by_ref["subject"] is None  # a ref names nobody to forget
    # The request as sent is content (encrypted under its subject's key where it has one, docs/forgetting.md).
    assert not [r for r in (call, by_id, by_ref) if user in repr({k: v for k, v in r.items() if k != "request_json"})]
