"""Requests built for the most gateway CPU per byte (issue 29, fault (o)), and what they do to other calls.

A Responses request declaring many tools and sending as many call items naming tools nobody declared cost a
scan of every tool per item (quadratic: 1.7 MB took 8.3 s of CPU on the event loop, every other call on the
worker waiting). The Anthropic counterpart declares many tools and sends as many tool_use / tool_result
blocks. Each is sent while a client makes small chat calls in turn, and so is a plain request of the same size
(one long user message, refused for its length too): the small calls' p99 beside the costly request must
stay within 2x of their p99 beside the plain one (and alone; a floor of 50 ms absorbs scheduling noise).
The plain request is the yardstick: any request of N bytes costs the loop a parse, so what this fault
catches is cost out of proportion to the bytes, which is what an attacker would pick."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

FLOOR_S = 0.05


def costly_responses(model: str, n: int) -> dict[str, Any]:
    """``n`` tools and ``n`` function-call items for undeclared names (the shape that was quadratic)."""
    tools: list[dict[str, Any]] = [{"type": "function", "name": f"t{i}"} for i in range(n)]
    tools.append({"type": "namespace", "name": "functions", "tools": [{"type": "function", "name": "shell"}]})
    calls = [{"type": "function_call", "call_id": f"c{i}", "name": f"u{i}", "arguments": "{}"} for i in range(n)]
    return {"model": model, "max_output_tokens": 2, "tools": tools,
            "input": [{"type": "message", "role": "user", "content": "hi"}, *calls]}


def costly_anthropic(model: str, n: int) -> dict[str, Any]:
    tools = [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(n)]
    uses = [{"type": "tool_use", "id": f"c{i}", "name": f"u{i}", "input": {}} for i in range(n)]
    results = [{"type": "tool_result", "tool_use_id": f"c{i}", "content": "x"} for i in range(n)]
    return {"model": model, "max_tokens": 2, "tools": tools,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": uses},
                         {"role": "user", "content": results}]}


@dataclass
class CostlyOutcome:
    kind: str
    request_bytes: int
    status: int
    answered_s: float  # until the gateway answered the costly request
    alone_p99_s: float  # small calls' p99 with nothing else running
    plain_p99_s: float  # their p99 beside a plain request of the same size
    during_p99_s: float  # their p99 while the costly request was being served
    during_calls: int

    @property
    def ratio(self) -> float:
        return self.during_p99_s / max(self.plain_p99_s, self.alone_p99_s, FLOOR_S)

    @property
    def ok(self) -> bool:
        return self.status in (400, 413) and self.ratio <= 2.0

    def line(self) -> str:
        return (f"{self.kind}: {self.request_bytes / 1e6:.1f} MB answered {self.status} in {self.answered_s:.2f} s; "
                f"small calls' p99 {self.alone_p99_s * 1000:.0f} ms alone, {self.plain_p99_s * 1000:.0f} ms beside "
                f"a plain request of that size, {self.during_p99_s * 1000:.0f} ms beside this one "
                f"({self.during_calls} calls, {self.ratio:.2f}x)")


def _p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] if len(latencies) > 1 else latencies[0]


def _small_call(client: httpx.Client, url: str, model: str, n: int) -> float:
    began = time.perf_counter()
    response = client.post(f"{url}/v1/chat/completions", json={
        "model": model, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": f"hi {n}"}]})
    response.raise_for_status()
    return time.perf_counter() - began


def _beside(client: httpx.Client, url: str, model: str, path: str, raw: bytes, rounds: int
            ) -> tuple[list[float], int, float]:
    """Small calls in turn while ``raw`` is posted to ``path`` ``rounds`` times; (latencies, last status,
    seconds per answer)."""
    answer: dict[str, Any] = {}

    def post() -> None:
        began = time.perf_counter()
        with httpx.Client(timeout=300) as own:
            for _ in range(rounds):
                response = own.post(f"{url}{path}", content=raw, headers={"content-type": "application/json",
                                                                          "anthropic-version": "2023-06-01"})
        answer.update(status=response.status_code, seconds=(time.perf_counter() - began) / rounds)

    thread = threading.Thread(target=post)
    thread.start()
    during: list[float] = []
    while thread.is_alive() or len(during) < 5:
        during.append(_small_call(client, url, model, len(during)))
    thread.join()
    return during, answer["status"], answer["seconds"]


def plain_body(kind: str, model: str, size: int) -> dict[str, Any]:
    """One user message of about ``size`` bytes, in the protocol of ``kind``."""
    text = "word " * (size // 5)
    if kind == "responses":
        return {"model": model, "max_output_tokens": 2, "input": text}
    return {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}


def costly_request_against(url: str, model: str, kind: str, body: dict[str, Any], *, alone_calls: int = 20,
                           rounds: int = 3) -> CostlyOutcome:
    """Small calls alone, beside a plain request of the same size, then beside the costly one."""
    import orjson

    raw = orjson.dumps(body)
    path = "/v1/responses" if kind == "responses" else "/v1/messages"
    with httpx.Client(timeout=300) as client:
        for n in range(3):
            _small_call(client, url, model, n)  # warm
        alone = [_small_call(client, url, model, n) for n in range(alone_calls)]
        plain, _, _ = _beside(client, url, model, path, orjson.dumps(plain_body(kind, model, len(raw))), rounds)
        during, status, seconds = _beside(client, url, model, path, raw, rounds)
    return CostlyOutcome(kind, len(raw), status, seconds, _p99(alone), _p99(plain), _p99(during), len(during))
