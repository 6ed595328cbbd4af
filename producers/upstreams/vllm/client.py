"""``VLLMUpstream``: a vLLM fleet as an Upstream: exact token ids in, token ids + rollout logprobs out.

The client puts the parts of this package together: which server (fleet.py), what to send (bodies.py),
what the answer says (answers.py), which weights sampled it (labels.py), what an error means (errors.py)
and how new weights get in (weights.py).

Which distribution the logprobs come from is a server setting, ``--logprobs-mode``: the default
``raw_logprobs`` is the model's distribution before temperature/top-k/top-p ("RAW");
``processed_logprobs`` is the one actually sampled from ("PROCESSED"). Tell the upstream which one
the fleet runs with; it is recorded with every call.

With ``token_endpoint="generate"`` token-in goes to vLLM's ``POST /inference/v1/generate`` (the server
needs ``--enable-scale-out``) instead of ``/v1/completions``: the same ids in and out, and, the reason to
use it, ``weight_versions``: which weight label (``POST /update_weight_version``) sampled which output
tokens. The result's ``policy_version`` is then the version vLLM says sampled the first output token, and
the spans go into ``extra["weight_versions"]`` (recorded with the call's engine details): exact whatever
process pushes the weights. Where they name more than that one version (an update landed mid-call), they
also go typed into ``version_spans`` (the record's ``version_spans``: per-token staleness). The
completions answer carries no version at all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from producers.upstreams.base import (
    ChatGenerateRequest,
    GenerateRequest,
    GenerateResult,
    LogprobKind,
    TokenChunk,
    UpstreamError,
    WholeOrStreamed,
)
from producers.upstreams.json_ids import load_with_ids
from producers.upstreams.vllm import bodies
from producers.upstreams.vllm.answers import (
    ChatPassthrough,
    PassthroughChoice,
    Streamed,
    answer_root,
    chat_logprobs,
    check_prompt,
    first_choice,
    generate_logprobs,
    ids_of,
    sampled_logprobs,
    sse_json,
)
from producers.upstreams.vllm.bodies import CHAT_PATH, TOKEN_PATHS, TokenEndpoint
from producers.upstreams.vllm.errors import ServerLost, bad_answer, error_from_response
from producers.upstreams.vllm.fleet import Fleet, OpenStream, server_list
from producers.upstreams.vllm.labels import parse_spans, policy_spans, spans_text, spans_version
from producers.upstreams.vllm.weights import push_weights
from schemas.version_spans import PolicySpan

if TYPE_CHECKING:
    from producers.gateway.settings import GatewaySettings

LOGPROB_KINDS: dict[str, LogprobKind] = {"raw_logprobs": "RAW", "processed_logprobs": "PROCESSED"}
ReadLogprobs = Callable[[dict[str, Any] | None, list[int], str], list[float]]


def settings_options(gateway: GatewaySettings) -> dict[str, Any]:
    """A client's options from the gateway settings section (``vllm_model``, ``vllm_logprobs_mode``,
    ``vllm_api_key``); the servers are ``gateway.upstream``."""
    return {"model": gateway.vllm_model or None, "logprobs_mode": gateway.vllm_logprobs_mode,
            "api_key": gateway.vllm_api_key or None}


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
        if logprobs_mode not in LOGPROB_KINDS:
            raise ValueError(
                f"logprobs_mode {logprobs_mode!r} is not supported: call records need logprobs "
                f"({' or '.join(LOGPROB_KINDS)}), not logits"
            )
        self.logprob_kind: LogprobKind = LOGPROB_KINDS[logprobs_mode]
        if token_endpoint not in TOKEN_PATHS:
            raise ValueError(f"token_endpoint {token_endpoint!r}: one of {', '.join(TOKEN_PATHS)}")
        self.token_endpoint: TokenEndpoint = token_endpoint
        self._fleet = Fleet(servers, api_key=api_key, timeout_s=timeout_s)
        self._model = model
        self._policy_version = policy_version
        self._engines: dict[str, str] = {}
        # The context the gateway fits prompts and output budgets into (it refuses a prompt that leaves no
        # room before sending it): given, or learnt from /v1/models on the first call.
        self.max_model_len: int | None = max_model_len

    @classmethod
    def from_settings(cls, gateway: GatewaySettings, **kwargs: Any) -> VLLMUpstream:
        """Servers from ``gateway.upstream`` (comma-separated base URLs)."""
        return cls(gateway.upstream, **{**settings_options(gateway), **kwargs})

    # ------------------------------------------------------------------ routing and metadata

    @property
    def servers(self) -> list[str]:
        """The servers calls are routed to: every call's rendezvous order (and failover) is over this list.
        The weight sync narrows it to the servers at the current version (``GateHooks`` in
        tokentrail/runtime/weight_sync.py), so a server that is down, failed its update or restarted on the
        base weights takes no call until it is current again. The fleet's own list, not a copy: a copy
        left routing over every server, and a restarted server served calls on the base weights."""
        return self._fleet.servers

    @servers.setter
    def servers(self, servers: Sequence[str]) -> None:
        routed = server_list(servers)
        if not routed:
            raise ValueError("a vLLM fleet routes to at least one server")
        self._fleet.servers = routed

    def servers_for(self, rollout_id: str) -> list[str]:
        """Servers in the order this rollout tries them (the first one unless it is down)."""
        return self._fleet.order(rollout_id)

    def server_for(self, rollout_id: str) -> str:
        return self.servers_for(rollout_id)[0]

    async def models(self, server: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served models (``id``, ``root``, ``max_model_len``, ...)."""
        body = await self._fleet.get_json(server or self.servers[0], "/v1/models")
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
            body = await self._fleet.get_json(server, "/version")
            self._engines[server] = f"vllm/{body.get('version', 'unknown')}"
        return self._engines[server]

    async def policy_version(self) -> int:
        return self._policy_version

    def set_policy_version(self, version: int) -> None:
        """Record that the fleet now serves ``version`` (after weights were pushed some other way)."""
        self._policy_version = version

    async def close(self) -> None:
        await self._fleet.close()

    def _check_context(self, prompt_len: int) -> None:
        """Refuse, before sending, a prompt the model's context cannot hold with at least one output token
        (the gateway normally refuses it earlier, once it knows the context)."""
        if self.max_model_len is not None and prompt_len + 1 > self.max_model_len:
            raise UpstreamError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has {prompt_len}, "
                "which leaves no room for output (context_length_exceeded)", 400, "invalid_request_error")

    # ------------------------------------------------------------------ token-in generation

    async def token_body(self, request: GenerateRequest, stream: bool) -> tuple[dict[str, Any], bytes]:
        """The token-in request for this upstream's endpoint, and its prompt ids as the JSON sent (serialized
        once: the same text is compared with what the engine says it ran)."""
        if request.forced_ids is not None:
            raise UpstreamError("scripted outputs need the embedded engine: vLLM samples every token", 400,
                                "invalid_request_error")
        model = await self.model()
        self._check_context(len(request.prompt_ids))
        sent = bodies.ids_json(request.prompt_ids)
        return bodies.TOKEN_BODIES[self.token_endpoint](model, request, sent, stream), sent

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        body, sent = await self.token_body(request, stream=False)
        began = time.perf_counter()
        server, response = await self._fleet.post(request.rollout_id or request.request_id,
                                                 TOKEN_PATHS[self.token_endpoint], body)
        total_ms = (time.perf_counter() - began) * 1000
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, server)
        # The echoed prompt ids stay bytes (compared with what was sent), not thousands of Python ints.
        versioned = self.token_endpoint == "generate"
        parsed, prompt_ids, prompt_json = load_with_ids(response.content, "prompt_token_ids",
                                                        answer_root if versioned else first_choice)
        choices = parsed.get("choices") or []
        if not choices:
            raise bad_answer(server, "answered without choices")
        choice = choices[0]
        output_ids = list(choice.get("token_ids") or [])
        policy_version = self._policy_version
        version_spans: tuple[PolicySpan, ...] = ()
        extra: dict[str, object] = {"stop_reason": choice.get("stop_reason")}
        if versioned:
            logprobs = generate_logprobs(choice.get("logprobs"), output_ids, server)
            spans = parse_spans(choice.get("weight_versions"), len(output_ids), server)
            policy_version = spans_version(spans, policy_version)
            version_spans = policy_spans(spans, policy_version)
            extra.update(vllm_id=parsed.get("request_id"), weight_versions=spans_text(spans))
        else:
            logprobs = sampled_logprobs(choice.get("logprobs"), output_ids, server)
            extra.update(vllm_id=parsed.get("id"), system_fingerprint=parsed.get("system_fingerprint"))
        if prompt_json is None or prompt_json != sent:  # not cut out, or not byte-equal: checked as ids
            check_prompt(request, sent, prompt_ids if prompt_json is None else ids_of(prompt_json, server), server)
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
        body, sent = await self.token_body(request, stream=True)
        versioned = self.token_endpoint == "generate"
        read_logprobs = generate_logprobs if versioned else sampled_logprobs
        policy_version = self._policy_version
        route_key = request.rollout_id or request.request_id
        lost: list[str] = []
        while True:
            got = Streamed()
            server = ""
            try:
                server, stream = await self._fleet.open_stream(route_key, TOKEN_PATHS[self.token_endpoint], body,
                                                              lost)
                async for chunk_ids, chunk_logprobs in _stream_tokens(stream, server, got, read_logprobs):
                    yield TokenChunk(chunk_ids, chunk_logprobs)
                break
            except ServerLost as exc:
                if got.output_ids:  # the caller has tokens of this answer: it cannot move to another server
                    raise
                lost.append(exc.server)
                self._fleet.lost(exc.server, exc, lost, route_key)
        check_prompt(request, sent, got.prompt_ids, server)
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

    # ------------------------------------------------------------------ chat: vLLM renders the conversation

    async def chat_body(self, request: ChatGenerateRequest, stream: bool = True) -> dict[str, Any]:
        """The ``/v1/chat/completions`` request of the gateway's pass-through mode."""
        return bodies.chat_body(await self.model(), request, stream)

    def generate_chat_stream(self, request: ChatGenerateRequest) -> WholeOrStreamed:
        """Pass-through generation: vLLM renders the conversation with its own chat template; the prompt
        ids it ran come with the first chunk (and the result), the sampled ids and logprobs per chunk. With
        ``prefer_whole``, one non-streamed request whose result carries everything."""
        return WholeOrStreamed(lambda: self._chat_streamed(request), lambda: self._chat_whole(request))

    async def _chat_whole(self, request: ChatGenerateRequest) -> GenerateResult:
        body = await self.chat_body(request, stream=False)
        began = time.perf_counter()
        server, response = await self._fleet.post(request.rollout_id or request.request_id, CHAT_PATH, body)
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, server)
        parsed = orjson.loads(response.content)
        prompt = parsed.get("prompt_token_ids")
        if prompt is None:
            raise bad_answer(server, "returned no prompt_token_ids; it must support return_token_ids")
        choice = next((c for c in parsed.get("choices") or [] if c.get("index", 0) == 0), None)
        if choice is None:
            raise bad_answer(server, "answered without choices")
        ids = list(choice.get("token_ids") or [])
        return GenerateResult(
            prompt_ids=prompt, output_ids=ids, output_logprobs=chat_logprobs(choice.get("logprobs"), ids, server),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            logprob_kind=self.logprob_kind, policy_version=self._policy_version, engine=await self.engine(server),
            upstream=server, total_ms=(time.perf_counter() - began) * 1000,
            extra={"vllm_id": parsed.get("id"), "stop_reason": choice.get("stop_reason"),
                   "system_fingerprint": parsed.get("system_fingerprint")},
        )

    async def _chat_streamed(self, request: ChatGenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        body = await self.chat_body(request)
        policy_version = self._policy_version
        got = Streamed()
        server, stream = await self._fleet.open_stream(request.rollout_id or request.request_id, CHAT_PATH, body)
        async with stream as response:
            async for chunk in sse_json(response, server):
                got.saw(chunk)
                announce = None
                if got.prompt_ids is None and chunk.get("prompt_token_ids") is not None:
                    got.prompt_ids = announce = list(chunk["prompt_token_ids"])
                ids: list[int] = []
                chunk_logprobs: list[float] = []
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) == 0:
                        ids = list(choice.get("token_ids") or [])
                        chunk_logprobs = got.add(ids, chat_logprobs(choice.get("logprobs"), ids, server), choice)
                if ids or announce is not None:
                    yield TokenChunk(ids, chunk_logprobs, prompt_ids=announce)
        if got.prompt_ids is None:
            raise bad_answer(server, "streamed no prompt_token_ids; it must support return_token_ids")
        finish = "length" if got.finish_reason_or_raise(server) == "length" else "stop"
        yield got.result(server, finish, self.logprob_kind, policy_version, await self.engine(server))

    async def chat_passthrough(self, body: dict[str, Any], rollout_id: str = "") -> ChatPassthrough:
        """Forward a chat request as is, asking vLLM for token ids and sampled-token logprobs.

        For the gateway's pass-through mode (vLLM renders the conversation). ``prompt_token_ids``
        is vLLM's top-level field, each choice's ids its ``token_ids``.
        """
        request = bodies.passthrough_body(body, await self.model(), stream=False)
        server, response = await self._fleet.post(rollout_id, CHAT_PATH, request)
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, server)
        parsed = orjson.loads(response.content)
        prompt = parsed.get("prompt_token_ids")
        if prompt is None:
            raise bad_answer(server, "returned no prompt_token_ids")
        choices = []
        for choice in parsed.get("choices") or []:
            ids = list(choice.get("token_ids") or [])
            choices.append(PassthroughChoice(
                int(choice.get("index", 0)), ids, chat_logprobs(choice.get("logprobs"), ids, server),
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
        request = bodies.passthrough_body(body, await self.model(), stream=True)
        server, stream = await self._fleet.open_stream(rollout_id, CHAT_PATH, request)
        prompt: list[int] | None = None
        by_index: dict[int, PassthroughChoice] = {}
        chunks: list[dict[str, Any]] = []
        async with stream as response:
            async for chunk in sse_json(response, server):
                chunks.append(chunk)
                if chunk.get("prompt_token_ids") is not None:
                    prompt = list(chunk["prompt_token_ids"])
                for choice in chunk.get("choices") or []:
                    index = int(choice.get("index", 0))
                    acc = by_index.setdefault(index, PassthroughChoice(index, [], [], None))
                    ids = list(choice.get("token_ids") or [])
                    acc.token_ids.extend(ids)
                    acc.logprobs.extend(chat_logprobs(choice.get("logprobs"), ids, server))
                    if choice.get("finish_reason") is not None:
                        acc.finish_reason = choice["finish_reason"]
                yield chunk
        if prompt is None:
            raise bad_answer(server, "streamed no prompt_token_ids")
        final = {"streamed": True, "id": chunks[0].get("id") if chunks else None}
        yield ChatPassthrough(
            final, prompt, [by_index[i] for i in sorted(by_index)], server, await self.engine(server), chunks
        )

    # ------------------------------------------------------------------ weight updates

    async def update_weights(self, version: int, *, lora_name: str | None = None, lora_path: str | None = None,
                             weights_path: str | None = None, pause_mode: str = "wait") -> None:
        """Make every server serve policy ``version`` (producers/upstreams/vllm/weights.py says how), then
        record that version on new calls."""
        await push_weights(self._fleet, version, lora_name=lora_name, lora_path=lora_path, weights_path=weights_path,
                           pause_mode=pause_mode)
        if lora_name:
            self._model = lora_name
        self._policy_version = version


async def _stream_tokens(stream: OpenStream, server: str, got: Streamed, read_logprobs: ReadLogprobs,
                         ) -> AsyncIterator[tuple[list[int], list[float]]]:
    """Choice 0's new ids and logprobs of a token-in stream, chunk by chunk, as they arrive; ``got``
    collects the rest."""
    async with stream as response:
        async for chunk in sse_json(response, server):
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
