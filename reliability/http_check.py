"""Run the HTTP cases of the corpus against a running gateway and judge each answer, and its aftermath.

Before the bad inputs, a few good calls are made through the real ``openai`` and ``anthropic`` SDKs on
an attempt that stays open. After each bad input a good call follows on that attempt: it must be
answered, and the gateway's spool must be empty again (nothing stuck behind the bad one). ``AcceptedCalls``
names every call the attempt has at the end, good or refused by the upstream, so the caller can check
that each reached Kafka.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from reliability.bad_inputs.catalogue import http_cases
from reliability.bad_inputs.http_case import HttpCase, HttpExpect
from reliability.results import CaseResult
from schemas.ids import call_id

Progress = Callable[[str], None]


@dataclass
class Attempts:
    live_rollout: str
    live_attempt: str
    done_rollout: str
    done_attempt: str

    def fill(self, text: str) -> str:
        return (text.replace("{live_rollout}", self.live_rollout)
                .replace("{live}", f"{self.live_rollout}/attempts/{self.live_attempt}")
                .replace("{done}", f"{self.done_rollout}/attempts/{self.done_attempt}"))


@dataclass
class AcceptedCalls:
    call_ids: list[str]
    env_event_ids: list[str]


def _start(client: httpx.Client, rollout_id: str) -> dict[str, Any]:
    response = client.post("/v1/rollouts", json={"rollout_id": rollout_id, "task_input": {"answer": "4"}})
    response.raise_for_status()
    return response.json()


def prepare(client: httpx.Client, model: str, tag: str | None = None) -> tuple[Attempts, AcceptedCalls]:
    """An open attempt with good calls on it (both SDKs) and a finished attempt."""
    import anthropic
    import openai

    tag = tag or uuid.uuid4().hex[:8]
    live, done = _start(client, f"corpus-live-{tag}"), _start(client, f"corpus-done-{tag}")
    oa = openai.OpenAI(base_url=live["openai_base_url"], api_key="k", max_retries=0)
    an = anthropic.Anthropic(base_url=live["anthropic_base_url"], api_key="k", max_retries=0)
    user = [{"role": "user", "content": "What is 2 + 2?"}]
    oa.chat.completions.create(model=model, messages=user, max_tokens=3)  # type: ignore[arg-type]
    oa.chat.completions.create(model=model, messages=user, max_tokens=3, stream=True).close()  # type: ignore[arg-type]
    an.messages.create(model=model, max_tokens=3, messages=user)  # type: ignore[arg-type]
    oa.completions.create(model=model, prompt="2 + 2 =", max_tokens=2)
    done_base = f"/v1/rollouts/{done['rollout_id']}/attempts/{done['attempt_id']}"
    event = client.post(f"{done_base}/events", json={"kind": "STEP", "payload": {"n": 1}})
    event.raise_for_status()
    finished = client.post(f"{done_base}/finish", json={"status": "SUCCESS"})
    finished.raise_for_status()
    rid, aid = live["rollout_id"], live["attempt_id"]
    status = client.get(f"/v1/rollouts/{rid}/attempts/{aid}").json()
    calls = [call_id(rid, aid, i) for i in range(int(status["calls"]))]
    env_ids = [live["event_id"], done["event_id"], event.json()["events"][0]["event_id"],
               finished.json()["event_id"]]
    attempts = Attempts(rid, aid, done["rollout_id"], done["attempt_id"])
    return attempts, AcceptedCalls(calls, env_ids)


def judge(expect: HttpExpect, status: int, body: bytes) -> str | None:
    """None when the answer is what the case expects, else what differs."""
    if status != expect.status:
        return f"status {status}, expected {expect.status}: {body[:200]!r}"
    if status < 300:  # an accepted request: its body is the protocol's answer, not an error
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"error body is not JSON: {body[:200]!r}"
    if not isinstance(data, dict):
        return f"error body is not an object: {body[:200]!r}"
    if expect.shape == "anthropic":
        error = data.get("error")
        if data.get("type") != "error" or not isinstance(error, dict) or set(error) != {"type", "message"}:
            return f"not the Anthropic error shape: {data}"
        kind = error["type"]
    else:
        error = data.get("error")
        keys = {"message", "type", "param", "code"} if expect.shape == "openai" else {"message", "type", "code"}
        if set(data) != {"error"} or not isinstance(error, dict) or set(error) != keys:
            return f"not the {expect.shape} error shape: {data}"
        kind = error["type"]
        if expect.code is not None and error["code"] != expect.code:
            return f"code {error['code']!r}, expected {expect.code!r}: {error['message']}"
        if expect.param is not None and error.get("param") != expect.param:
            return f"param {error.get('param')!r}, expected {expect.param!r}: {error['message']}"
    message = error["message"]
    if not isinstance(message, str) or not message:
        return "empty error message"
    if expect.error_type is not None and kind != expect.error_type:
        return f"error type {kind!r}, expected {expect.error_type!r}"
    if expect.contains is not None and expect.contains not in message:
        return f"message does not mention {expect.contains!r}: {message}"
    return None


def send(client: httpx.Client, case: HttpCase, attempts: Attempts) -> httpx.Response:
    path = attempts.fill(case.path)
    headers = {k: attempts.fill(v) for k, v in case.headers.items()}
    if case.raw is not None:
        content = case.raw
        headers.setdefault("content-type", "application/json")
    elif case.body is not None:
        content = attempts.fill(orjson.dumps(case.body).decode()).encode()
        headers["content-type"] = "application/json"
    else:
        content = b""
    return client.request(case.method, path, content=content, headers=headers)


def aftermath(client: httpx.Client, attempts: Attempts, model: str) -> str | None:
    """A good call right after a bad input: None when it is answered and the spool is empty again."""
    path = f"/rollouts/{attempts.live_rollout}/attempts/{attempts.live_attempt}/v1/chat/completions"
    try:
        good = client.post(path, json={"model": model, "max_tokens": 1,
                                       "messages": [{"role": "user", "content": "What is 2 + 2?"}]})
        health = client.get("/health").json()
    except (httpx.HTTPError, ValueError) as exc:
        return f"the good call after it got no answer: {exc!r}"
    if good.status_code != 200:
        return f"the good call after it got {good.status_code}: {good.text[:200]}"
    depth = health.get("sink", {}).get("spool_depth")
    if depth != 0:
        return f"the spool holds {depth} records after it (something is stuck)"
    return None


def run_case(client: httpx.Client, case: HttpCase, attempts: Attempts, model: str) -> CaseResult:
    try:
        response = send(client, case, attempts)
    except httpx.HTTPError as exc:
        return CaseResult(case.id, case.area, case.klass, case.what, False, f"no answer: {exc!r}")
    problem = judge(case.expect, response.status_code, response.content)
    after = aftermath(client, attempts, model)
    if after is not None:
        return CaseResult(case.id, case.area, case.klass, case.what, False,
                          f"{problem}; {after}" if problem else after)
    if case.gap is None:
        return CaseResult(case.id, case.area, case.klass, case.what, problem is None, problem or "")
    # A documented gap: the right answer closes it; otherwise the gateway must still answer sanely.
    if problem is None:
        return CaseResult(case.id, case.area, case.klass, case.what, True, "gap closed")
    sane = response.status_code < 500
    return CaseResult(case.id, case.area, case.klass, case.what, sane,
                      f"known gap: {case.gap}; got {response.status_code}", gap=case.gap)


def run_http_corpus(base_url: str, model: str, progress: Progress = lambda _: None,
                    cases: list[HttpCase] | None = None) -> tuple[list[CaseResult], AcceptedCalls, bool]:
    """(results, every call of the open attempt (each must be on Kafka), whether /health answered 200 at the end)."""
    cases = cases if cases is not None else http_cases(model)
    with httpx.Client(base_url=base_url, timeout=120) as client:
        attempts, accepted = prepare(client, model)
        progress(f"bad inputs: {len(accepted.call_ids)} good calls accepted first; sending {len(cases)} "
                 "bad HTTP requests")
        results = []
        for i, case in enumerate(cases, 1):
            results.append(run_case(client, case, attempts, model))
            if i % 40 == 0:
                progress(f"bad inputs: {i}/{len(cases)} HTTP cases sent")
        health = client.get("/health")
        # Every call of the open attempt, the corpus's good calls and the bad ones that got an index alike.
        status = client.get(f"/v1/rollouts/{attempts.live_rollout}/attempts/{attempts.live_attempt}").json()
        accepted.call_ids = [call_id(attempts.live_rollout, attempts.live_attempt, i)
                             for i in range(int(status["calls"]))]
    return results, accepted, health.status_code == 200
