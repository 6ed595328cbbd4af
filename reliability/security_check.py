"""Run the security cases of the corpus on a gateway that requires keys, then check what reached Kafka.

Two attempts of different rollouts stay open: "live", whose own key the cases use, and "victim", which
no case may touch. Afterwards every record on the private calls and env topics is read back: the victim
has only its AttemptStarted, no key or secret appears in any record's bytes, and each accepted call of a
redaction case stores its credentials as "[redacted]".
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson

from reliability.bad_inputs.limits import CORPUS_MAX_BODY_BYTES, CORPUS_MAX_TOKENS
from reliability.bad_inputs.security_cases import (
    BODY_SECRET,
    HEADER_SECRET,
    SECURITY_ADMIN_KEY,
    SecurityCase,
    security_cases,
)
from reliability.http_check import judge
from reliability.results import CaseResult
from schemas.ids import call_id
from schemas.kafka.config import admin_config
from testkit.kafka_read import create_topics, delete_topics, read_records
from tokentrail.settings import Settings

Progress = Callable[[str], None]
REDACTED = "[redacted]"
AREA = "security"


@dataclass
class Keys:
    """The two open attempts and their keys; fills a case's placeholders."""

    live: dict[str, Any]
    victim: dict[str, Any]

    def fill(self, text: str) -> str:
        for name, started in (("live", self.live), ("victim", self.victim)):
            text = (text.replace(f"{{{name}_rollout}}", started["rollout_id"])
                    .replace(f"{{{name}}}", f"{started['rollout_id']}/attempts/{started['attempt_id']}"))
        return text.replace("{live_key}", self.live["api_key"]).replace("{admin_key}", SECURITY_ADMIN_KEY)

    def secrets(self) -> list[str]:
        return [self.live["api_key"], self.victim["api_key"], SECURITY_ADMIN_KEY, HEADER_SECRET, BODY_SECRET]


@dataclass
class Pending:
    """A case answered as expected whose outcome also depends on what reached Kafka."""

    case: SecurityCase
    detail: str
    gap: str | None
    call_id: str | None = None  # redaction cases: the accepted call's record
    problems: list[str] = field(default_factory=list)


def _admin(client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return client.request(method, path, headers={"authorization": f"Bearer {SECURITY_ADMIN_KEY}"}, **kwargs)


def _start(client: httpx.Client, rollout_id: str) -> dict[str, Any]:
    response = _admin(client, "POST", "/v1/rollouts", json={"rollout_id": rollout_id, "task_input": {"answer": "4"}})
    response.raise_for_status()
    return dict(response.json())


def _state(client: httpx.Client, started: dict[str, Any]) -> dict[str, Any]:
    """An attempt's status as its admin sees it (calls, events, finished)."""
    response = _admin(client, "GET", f"/v1/rollouts/{started['rollout_id']}/attempts/{started['attempt_id']}")
    response.raise_for_status()
    return dict(response.json())


def _chunks(data: bytes, size: int = 16 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def send(client: httpx.Client, case: SecurityCase, keys: Keys) -> httpx.Response:
    request = case.request
    headers = {k: keys.fill(v) for k, v in request.headers.items()}
    content: Any = b""
    if request.body is not None:
        content = keys.fill(orjson.dumps(request.body).decode()).encode()
        headers["content-type"] = "application/json"
    if case.chunked:
        content = _chunks(content)  # an iterator: httpx sends Transfer-Encoding: chunked, no Content-Length
    return client.request(request.method, keys.fill(request.path), content=content, headers=headers)


def run_case(client: httpx.Client, case: SecurityCase, keys: Keys) -> CaseResult | Pending:
    """The answer judged at once; a Pending when Kafka must be read before the case is decided."""
    before = _state(client, keys.victim) if case.untouched else None
    calls_before = int(_state(client, keys.live)["calls"]) if case.redacted else 0
    try:
        response = send(client, case, keys)
    except httpx.HTTPError as exc:
        return CaseResult(case.id, AREA, case.klass, case.what, False, f"no answer: {exc!r}")
    expect = case.request.expect
    if case.redacted:
        problem = None if response.status_code == expect.status else \
            f"status {response.status_code}, expected {expect.status}: {response.content[:200]!r}"
    else:
        problem = judge(expect, response.status_code, response.content)
    gap = None
    if problem is not None and case.gap_status is not None and response.status_code == case.gap_status:
        # The known wrong answer: still a refusal in the protocol's shape, never a success.
        shape_problem = judge(replace(expect, status=case.gap_status, code=None, param=None, error_type=None),
                              response.status_code, response.content)
        problem, gap = shape_problem, case.gap
    if problem is None and before is not None:
        after = _state(client, keys.victim)
        if after != before:
            problem = f"the other rollout's attempt changed: {before} -> {after}"
    if problem is not None:
        return CaseResult(case.id, AREA, case.klass, case.what, False, problem)
    detail = f"known gap: {case.gap}; got {response.status_code}" if gap else (
        "gap closed" if case.gap else "")
    pending = Pending(case, detail, gap)
    if case.redacted:
        pending.call_id = call_id(keys.live["rollout_id"], keys.live["attempt_id"], calls_before)
    return pending


def _at(document: dict[str, Any], dotted: str) -> Any:
    part, _, name = dotted.partition(".")
    return document.get(part, {}).get(name, "<absent>")


def check_records(pending: list[Pending], records: list[tuple[bytes, dict[str, Any]]], keys: Keys) -> None:
    """Attach to each pending case what the records on Kafka say against it."""
    victim = keys.victim["rollout_id"]
    on_victim = [r["event_id"] for _, r in records if r.get("rollout_id") == victim]
    leaks = [f"{r.get('event_id')} holds {secret[:12]}..." for raw, r in records
             for secret in keys.secrets() if secret.encode() in raw]
    by_id = {r["event_id"]: r for _, r in records}
    for item in pending:
        if item.case.untouched and on_victim != [keys.victim["event_id"]]:
            item.problems.append(f"records of the other rollout on Kafka: {on_victim}")
        if item.case.redacted:
            if leaks:
                item.problems.append(f"credentials on Kafka: {leaks[:3]}")
            record = by_id.get(item.call_id or "")
            if record is None:
                item.problems.append(f"accepted call {item.call_id} is not on Kafka")
                continue
            stored = orjson.loads(record["request_json"])
            for place in item.case.redacted:
                if _at(stored, place) != REDACTED:
                    item.problems.append(f"{place} stored as {_at(stored, place)!r}, not {REDACTED!r}")


def run_security_corpus(settings: Settings, workdir: Path, progress: Progress = lambda _: None,
                        cases: list[SecurityCase] | None = None) -> list[CaseResult]:
    from testkit.gateway import running_embedded_gateway

    cases = cases if cases is not None else security_cases(settings.model.name)
    config = admin_config(settings.kafka)
    tag = uuid.uuid4().hex[:8]
    calls, env = f"reliability-sec-{tag}.tokentrail.calls", f"reliability-sec-{tag}.tokentrail.env"
    create_topics(config, [calls, env])
    try:
        with running_embedded_gateway(settings, spool_dir=workdir / f"spool-sec-{tag}",
                                      topics={"calls_topic": calls, "env_topic": env},
                                      max_tokens_limit=CORPUS_MAX_TOKENS, max_body_bytes=CORPUS_MAX_BODY_BYTES,
                                      admin_key=SECURITY_ADMIN_KEY, require_auth=True) as gw, \
                httpx.Client(base_url=gw.url, timeout=120) as client:
            keys = Keys(_start(client, f"sec-live-{tag}"), _start(client, f"sec-victim-{tag}"))
            progress(f"bad inputs: sending {len(cases)} security requests to a gateway that requires keys")
            outcomes = [run_case(client, case, keys) for case in cases]
        pending = [o for o in outcomes if isinstance(o, Pending)]
        expected = {keys.victim["event_id"], *(p.call_id for p in pending if p.call_id)}
        check_records(pending, read_records(settings.kafka.client_config(), [calls, env], expected), keys)
    finally:
        delete_topics(config, [calls, env])
    results = []
    for outcome in outcomes:
        if isinstance(outcome, CaseResult):
            results.append(outcome)
            continue
        case, problems = outcome.case, outcome.problems
        results.append(CaseResult(case.id, AREA, case.klass, case.what, not problems,
                                  "; ".join(problems) or outcome.detail, gap=None if problems else outcome.gap))
    return results
