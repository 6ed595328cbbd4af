"""One model call end to end: render -> index -> upstream -> parse -> record -> deliver.

The harness's response is built from the same outcome that goes into the record, and it is released
only after the publisher has the record (Kafka ack or fsynced spool). Failed upstream calls are recorded
too (status ERROR), so an attempt's call indices have no holes. For a streamed call the recorded
response is the equivalent non-streamed body. Timings: ``queue_ms`` is the upstream's queue wait;
``first_token_ms`` and ``total_ms`` run from the end of the request body (``received_at_us``: its start).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import orjson

from producers.gateway import records
from producers.gateway.attempt_state import DeliveredCall, SampledOutput
from producers.gateway.chat import CallOutcome, InternalCall, ToolCallOut, tool_call_id
from producers.gateway.context import GatewayContext
from producers.gateway.errors import GatewayError, bad_request, internal_error
from producers.gateway.generation import Generated, PromptSink, run_generation
from producers.gateway.identity import CallIdentity
from producers.gateway.ports import Rendered, TextSide
from producers.gateway.prompt_bound import StructureLimit, min_prompt_tokens, min_prompt_tokens_raw, structure_error
from producers.gateway.release_routed import session_key
from producers.rendered_prompt import RenderError
from producers.template_variables import check_template_kwargs
from producers.upstreams.base import (
    ChatGenerateRequest,
    ChatUpstream,
    GenerateRequest,
    GenerateResult,
    Sampling,
    TokenChunk,
    Upstream,
    UpstreamError,
)
from schemas.call_errors import CLIENT_DISCONNECTED
from schemas.ids import call_id as make_call_id
from schemas.prompt_delta import encode_prompt
from schemas.tokens import IDS_DTYPE, NO_IDS

log = logging.getLogger("tokentrail.gateway")

GATEWAY_VERSION = "0.1"
# How a chat call's prompt ids are made: spliced from earlier sampled ids where the history repeats
# them, the template's text re-tokenized, or rendered by the upstream itself (pass-through).
PREFIX_MODES = ("splice", "retokenize", "upstream")
# Recorded as the chat template of a pass-through call whose upstream does not say which it used.
UPSTREAM_TEMPLATE = "upstream"


@dataclass
class PreparedCall:
    identity: CallIdentity
    call: InternalCall
    rendered: Rendered
    call_index: int
    call_id: str
    received_at_us: int
    started: float  # perf_counter when the request's body had arrived (received_at_us: when it began to)
    request_json: str
    adapter_version: str
    tool_call_prefix: str
    # Pass-through: the upstream renders the conversation; ``rendered`` holds its prompt once it ran.
    passthrough: bool = False
    # Scripted: the ids the engine emits instead of sampling (the attempt's next scripted completion).
    forced_ids: tuple[int, ...] | None = None
    # The release traffic label the request carried (x-tokentrail-traffic-label): a pinned label's version.
    traffic_label: str | None = None
    # A tenant's call: its call id with its tenant's tag (session_refs.SessionRefs.call_ref), which the
    # response ids carry so that any gateway process tells whose call a feedback names.
    response_ref: str | None = None

    @property
    def shown_id(self) -> str:
        return self.response_ref or self.call_id


ResponseBuilder = Callable[[CallOutcome], dict[str, Any]]
ErrorBody = Callable[[GatewayError], dict[str, Any]]
TextListener = Callable[[str], Awaitable[None]]


class CallService:
    def __init__(self, ctx: GatewayContext, upstream: Upstream, text: TextSide, *, model_name: str,
                 model_aliases: dict[str, str] | None = None, prefix_mode: str = "splice") -> None:
        if prefix_mode not in PREFIX_MODES:
            raise ValueError(f"prefix_mode must be one of {', '.join(PREFIX_MODES)}, not {prefix_mode!r}")
        if prefix_mode == "upstream" and not hasattr(upstream, "generate_chat_stream"):
            raise ValueError(f"prefix_mode 'upstream' needs an upstream that renders chats itself; "
                             f"{getattr(upstream, 'name', upstream)!r} does not")
        self.ctx, self.upstream, self.text = ctx, upstream, text
        self.model_name = model_name
        self.model_aliases = dict(model_aliases or {})
        self.prefix_mode = prefix_mode

    # -- before a call gets its index: everything that can be refused as bad input -----------------

    def check_model(self, requested: str) -> str:
        if requested == self.model_name:
            return requested
        target = self.model_aliases.get(requested) or self.model_aliases.get("*")
        if target == self.model_name:
            return requested
        raise GatewayError(404, f"the model {requested!r} does not exist on this gateway; it serves "
                           f"{self.model_name!r}", "not_found", param="model", code="model_not_found")

    def render(self, identity: CallIdentity, call: InternalCall, *, for_count: bool = False) -> Rendered:
        if call.messages is not None and self.prefix_mode == "upstream" and not for_count:
            try:  # refused as in the other modes, not left to the upstream
                check_template_kwargs(call.template_kwargs)
            except RenderError as exc:
                raise _template_error(exc) from None
            return Rendered(NO_IDS)  # the upstream renders it
        if call.prompt_ids is not None:
            bad = [i for i in call.prompt_ids if i < 0 or i >= self.text.vocab_size]
            if bad:
                raise bad_request(f"prompt token id {bad[0]} is outside the vocabulary "
                                  f"(0..{self.text.vocab_size - 1})", param="prompt", code="invalid_token_id")
            return Rendered(list(call.prompt_ids))
        if call.prompt_text is not None:
            return Rendered(self.text.encode_text(call.prompt_text))
        assert call.messages is not None
        # Pass-through counts tokens as the pinned template renders (nothing is asked of the upstream).
        mode = "retokenize" if self.prefix_mode == "upstream" else self.prefix_mode
        try:
            return self.text.render_chat(call.messages, call.tools, prefix_mode=mode,
                                         prior=identity.state.prior_calls(),
                                         template_kwargs=call.template_kwargs or None)
        except (ValueError, TypeError, KeyError) as exc:
            raise _template_error(exc) from None

    def prepare(self, identity: CallIdentity, call: InternalCall, *, received_at_us: int, started: float,
                request_json: str, adapter_version: str, tool_call_prefix: str,
                traffic_label: str | None = None) -> PreparedCall:
        """Render and assign the call its index. From here on the call is recorded whatever happens."""
        if not (self.prefix_mode == "upstream" and call.messages is not None):
            self._fit_structure(min_prompt_tokens(call))  # before rendering: refused cheaply when it cannot fit at all
        cpu_before = time.thread_time()  # rendering runs on this thread: its CPU is the render's
        try:
            rendered = self.render(identity, call)
        finally:
            self.ctx.metrics.render_seconds.observe(time.thread_time() - cpu_before)
        passthrough = self.prefix_mode == "upstream" and call.messages is not None
        if passthrough and not call.messages:  # refused here, as rendering it here would be
            raise bad_request("the conversation has no messages", param="messages", code="empty_prompt")
        if not len(rendered.prompt_ids) and not passthrough:
            raise bad_request("the prompt renders to no tokens", code="empty_prompt")
        if not passthrough:  # a pass-through prompt's length is known only to the upstream
            self._fit_output(call, len(rendered.prompt_ids))
        if identity.state.script and passthrough:
            raise bad_request("a scripted rollout needs the gateway to render prompts (prefix_mode splice or "
                              "retokenize)", code="script_unsupported")
        index = identity.state.begin_call()
        forced = None
        if identity.state.script:  # taken with the index, so the n-th call gets the n-th completion
            scripted = identity.state.script.popleft()
            # Text is tokenized; ids (a sampler's split) are emitted as given. Ends in the stop the script names
            # (gpt-oss: <|call|>), else EOS.
            ids = self.text.encode_text(scripted) if isinstance(scripted, str) else list(scripted)
            forced = (*ids,) if ids and ids[-1] in self.text.stop_token_ids else (*ids, self.text.stop_token_ids[0])
        return PreparedCall(identity, call, rendered, index,
                            make_call_id(identity.rollout_id, identity.attempt_id, index), received_at_us,
                            started, request_json, adapter_version, tool_call_prefix, passthrough, forced,
                            traffic_label)

    def structure_limit(self) -> StructureLimit | None:
        """What a request body's structure is measured against before validation; None: nothing (the upstream
        renders, or the context is not known)."""
        context = getattr(self.upstream, "max_model_len", None)
        if self.prefix_mode == "upstream" or not context:
            return None
        return StructureLimit(int(context), getattr(self.text, "max_token_bytes", 0))

    def check_structure(self, body: dict[str, Any]) -> None:
        """Refuse a request body whose structure alone is longer than the context, before validating it."""
        limit = self.structure_limit()
        if limit is not None:
            self._fit_structure(min_prompt_tokens_raw(body, limit.max_token_bytes))

    def _fit_structure(self, floor: int) -> None:
        """Refuse a conversation whose structure alone is longer than the context (prompt_bound.py)."""
        context = getattr(self.upstream, "max_model_len", None)
        error = structure_error(floor, int(context)) if context else None
        if error is not None:
            raise error

    def _fit_output(self, call: InternalCall, prompt_len: int) -> None:
        """Cut the output budget to what the model's context leaves after the prompt; refuse (in the
        caller's protocol, before the call gets an index) only when it leaves nothing."""
        context = getattr(self.upstream, "max_model_len", None)
        if not context:
            return
        room = int(context) - prompt_len
        if room < 1:
            raise GatewayError(400, f"This model's maximum context length is {context} tokens; the prompt has "
                               f"{prompt_len}, which leaves no room for output", "invalid_request",
                               param="messages" if call.messages is not None else "prompt",
                               code="context_length_exceeded")
        call.sampling.max_tokens = min(call.sampling.max_tokens, room)

    # -- the call --------------------------------------------------------------------------------

    async def run(self, prep: PreparedCall, respond: ResponseBuilder, error_body: ErrorBody,
                  on_text: TextListener | None = None, abort: asyncio.Event | None = None,
                  on_prompt: PromptSink | None = None) -> tuple[CallOutcome, dict[str, Any]]:
        """Generate, record, deliver; returns the outcome and the response body that went into the
        record, or raises GatewayError (after recording the failure). ``on_prompt`` hears a
        pass-through call's prompt ids as soon as the upstream reports them."""
        state = prep.identity.state
        try:
            return await self._run(prep, respond, error_body, on_text, abort, on_prompt)
        finally:
            state.end_call()

    def _generation(self, prep: PreparedCall) -> AsyncIterator[TokenChunk | GenerateResult]:
        s = prep.call.sampling
        sampling = Sampling(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens,
                            seed=s.seed, stop_token_ids=tuple(self.text.stop_token_ids))
        key = session_key(prep.identity.rollout_id, prep.identity.session_id)  # a release routes by it
        if prep.passthrough:
            assert prep.call.messages is not None
            chat = ChatGenerateRequest(messages=prep.call.messages, tools=prep.call.tools, sampling=sampling,
                                       request_id=prep.call_id, rollout_id=prep.identity.rollout_id,
                                       template_kwargs=dict(prep.call.template_kwargs), session_key=key,
                                       traffic_label=prep.traffic_label)
            return cast(ChatUpstream, self.upstream).generate_chat_stream(chat)
        return self.upstream.generate_stream(GenerateRequest(
            prompt_ids=prep.rendered.prompt_ids, sampling=sampling, request_id=prep.call_id,
            rollout_id=prep.identity.rollout_id, forced_ids=prep.forced_ids, session_key=key,
            traffic_label=prep.traffic_label))

    async def _run(self, prep: PreparedCall, respond: ResponseBuilder,
                   error_body: ErrorBody, on_text: TextListener | None,
                   abort: asyncio.Event | None, on_prompt: PromptSink | None) -> tuple[CallOutcome, dict[str, Any]]:
        s = prep.call.sampling
        partial = Generated()  # what arrived before a failure is recorded with it
        try:
            generated = await run_generation(self._generation(prep), decode=self.text.decode, stop=s.stop,
                                             on_text=on_text, on_prompt=on_prompt, abort=abort,
                                             began=prep.started, out=partial)
        except UpstreamError as exc:
            error = _upstream_error(exc)
            await self._record_failure(_ran(prep, partial), error, error_body(error), partial)
            raise error from exc
        except Exception as exc:  # a bug or a crash upstream: still recorded, then a 500
            error = internal_error(f"while generating call {prep.call_id}", log, exc)
            await self._record_failure(_ran(prep, partial), error, error_body(error), partial)
            raise error from exc

        prep = _ran(prep, generated)
        outcome = self._outcome(prep, generated)
        if generated.aborted:
            error = GatewayError(499, "the client closed the connection before the response was complete",
                                 "internal", code=CLIENT_DISCONNECTED)
            await self._record_failure(prep, error, error_body(error), generated, finish_reason="abort")
            raise error
        response = respond(outcome)
        meta = await self._meta(generated)
        record = self._record(prep, generated, meta, error=None, response=response,
                              finish_reason=outcome.finish_reason, parse_errors=outcome.parse_errors)
        if await self.ctx.deliver(self.ctx.calls_topic, prep.identity.rollout_id, "CallRecord", record):
            delivered = _delivered(prep, generated)
            sampled = None
            if prep.call.messages is not None:  # chat calls can be spliced into later chat prompts
                sampled = SampledOutput(prep.call_id, prep.call_index, delivered.output_ids,
                                        _assistant_message(outcome))
            prep.identity.state.remember(delivered, sampled)
        self._observe(prep, generated, "OK")
        return outcome, response

    def _outcome(self, prep: PreparedCall, generated: Generated) -> CallOutcome:
        if prep.call.messages is None:  # a text completion: no parsing
            content, reasoning, calls, errors = generated.text, None, [], ()
        else:
            parsed = self.text.parse(generated.text, prep.call.template_kwargs or None)
            content, reasoning, errors = parsed.content, parsed.reasoning, parsed.errors
            calls = [ToolCallOut(tool_call_id(prep.tool_call_prefix, prep.call_id, i), c.name, c.arguments)
                     for i, c in enumerate(parsed.tool_calls)]
        finish = generated.finish_reason if generated.finish_reason in ("stop", "length") else "stop"
        return CallOutcome(call_id=prep.call_id, call_index=prep.call_index, model=prep.call.model,
                           created=prep.received_at_us // 1_000_000, prompt_ids=prep.rendered.prompt_ids,
                           output_ids=generated.output_ids, output_logprobs=generated.output_logprobs,
                           text=generated.text, content=content, reasoning=reasoning, tool_calls=calls,
                           finish_reason=finish, stop_string=generated.stop_string, parse_errors=tuple(errors),
                           response_ref=prep.response_ref)

    async def _meta(self, generated: Generated) -> dict[str, Any]:
        res = generated.result
        if res is not None:
            # The engine's own details (e.g. the seed it drew) make a call replayable.
            details = {k: v for k, v in res.extra.items() if isinstance(v, str | int | float | bool)}
            return {"policy_version": res.policy_version, "engine": res.engine, "upstream": res.upstream,
                    "logprob_kind": res.logprob_kind, "details": details,
                    "chat_template_fingerprint": res.chat_template_fingerprint,
                    "version_spans": res.version_spans, "release": res.release}
        # Cut short by the gateway (stop string, abort, failure): no final result from the upstream.
        policy, engine = -1, self.upstream.name
        try:  # the record must be written even if these fail
            policy = await self.upstream.policy_version()
            engine_info = getattr(self.upstream, "engine", engine)
            engine = str(await engine_info() if callable(engine_info) else engine_info)
        except Exception as exc:
            log.warning("upstream metadata unavailable for a cut call: %s", exc)
        return {"policy_version": policy, "engine": engine, "upstream": self.upstream.name,
                "logprob_kind": str(getattr(self.upstream, "logprob_kind", "RAW"))}

    def _record(self, prep: PreparedCall, generated: Generated, meta: dict[str, Any],
                error: GatewayError | None, response: dict[str, Any], finish_reason: str,
                parse_errors: tuple[str, ...] = ()) -> dict[str, Any]:
        state, s = prep.identity.state, prep.call.sampling
        prompt = prep.rendered.array()
        base_id, base_seq = state.best_base(prompt)
        template = self.text.chat_template_fingerprint
        if prep.passthrough:  # rendered upstream: its template, where it says which, else marked unknown
            template = meta.get("chat_template_fingerprint") or UPSTREAM_TEMPLATE
        versions = records.Versions(
            model=self.model_name, policy_version=int(meta["policy_version"]),
            tokenizer_fingerprint=self.text.tokenizer_fingerprint,
            chat_template_fingerprint=template,
            adapter_version=f"{prep.adapter_version} gateway/{GATEWAY_VERSION}",
            parser_version=self.text.parser_version, engine=meta["engine"], upstream=meta["upstream"])
        extra: dict[str, Any] = {"stop_token_ids": list(self.text.stop_token_ids)}
        if s.requested_max_tokens is not None and s.requested_max_tokens != s.max_tokens:
            extra["requested_max_tokens"] = s.requested_max_tokens  # max_tokens is what was served
        if s.ignored:
            extra["ignored_by_upstream"] = s.ignored
        if meta.get("details"):
            extra["engine_details"] = meta["details"]
        if parse_errors:  # the output's tool-call markup did not parse: answered as content
            extra["parse_errors"] = list(parse_errors)
        return records.call_record(
            call_id=prep.call_id, rollout_id=prep.identity.rollout_id, attempt_id=prep.identity.attempt_id,
            call_index=prep.call_index, session_id=prep.identity.session_id, protocol=prep.call.protocol,
            streamed=prep.call.stream,
            error=None if error is None else {"type": error.code or error.kind, "message": error.message,
                                              "status_code": error.status},
            prompt=encode_prompt(prompt, base_id, base_seq),
            output_ids=np.asarray(generated.output_ids, dtype=IDS_DTYPE),  # packed without a range scan
            output_logprobs=generated.output_logprobs, logprob_kind=meta["logprob_kind"],
            finish_reason=finish_reason, versions=versions,
            sampling=records.sampling_record(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                             max_tokens=s.max_tokens, seed=s.seed, stop=s.stop, extra=extra),
            prefix_mode=self.prefix_mode if prep.call.messages is not None else "tokens",
            spliced_outputs=prep.rendered.spliced_outputs, prefix_breaks=prep.rendered.prefix_breaks,
            received_at_us=prep.received_at_us, queue_ms=generated.queue_ms,
            first_token_ms=generated.first_token_ms,
            total_ms=(time.perf_counter() - prep.started) * 1000,
            request=prep.request_json, response=orjson.dumps(response).decode(),
            scripted=prep.forced_ids is not None, version_spans=meta.get("version_spans", ()),
            release=meta.get("release"), subject=state.subject)

    async def _record_failure(self, prep: PreparedCall, error: GatewayError, body: dict[str, Any],
                              generated: Generated, finish_reason: str = "error") -> None:
        meta = await self._meta(generated)
        record = self._record(prep, generated, meta, error=error, response=body, finish_reason=finish_reason)
        # A failed call keeps nothing: the harness never saw its output, so no later prompt builds on it.
        await self.ctx.deliver(self.ctx.calls_topic, prep.identity.rollout_id, "CallRecord", record)
        self._observe(prep, generated, "ERROR")

    def _observe(self, prep: PreparedCall, generated: Generated, status: str) -> None:
        m = self.ctx.metrics
        m.calls.labels(prep.call.protocol, status).inc()
        m.prompt_tokens.inc(len(prep.rendered.prompt_ids))
        m.output_tokens.inc(len(generated.output_ids))
        m.call_seconds.labels(prep.call.protocol, str(prep.call.stream).lower()).observe(
            time.perf_counter() - prep.started)
        if generated.first_token_ms:
            m.first_token_seconds.observe(generated.first_token_ms / 1000)

    # -- count_tokens ----------------------------------------------------------------------------

    def count_tokens(self, identity: CallIdentity, call: InternalCall) -> int:
        return len(self.render(identity, call, for_count=True).prompt_ids)


def _template_error(exc: Exception) -> GatewayError:
    return bad_request(f"the conversation cannot be rendered by the chat template: {exc}", param="messages",
                       code="template_error")


def _ran(prep: PreparedCall, generated: Generated) -> PreparedCall:
    """A pass-through call's prompt is what the upstream reported running (empty if it never did)."""
    if not prep.passthrough:
        return prep
    return replace(prep, rendered=Rendered(generated.prompt_ids if generated.prompt_ids is not None else NO_IDS))


def _delivered(prep: PreparedCall, generated: Generated) -> DeliveredCall:
    return DeliveredCall(prep.call_id, prep.call_index, prep.rendered.array(),
                         np.asarray(generated.output_ids, dtype=IDS_DTYPE), prep.rendered.text)


def _assistant_message(outcome: CallOutcome) -> dict[str, Any]:
    """The assistant turn as the harness was told it (internal chat form), for splicing later."""
    message: dict[str, Any] = {"role": "assistant", "content": outcome.content}
    if outcome.reasoning:
        message["reasoning_content"] = outcome.reasoning
    if outcome.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in outcome.tool_calls]
    return message


def _upstream_error(exc: UpstreamError) -> GatewayError:
    status = exc.status_code
    if 400 <= status < 500 and status != 429:
        kind = "not_found" if status == 404 else "invalid_request"
    elif status == 429:
        kind = "rate_limit"
    elif status == 503:
        kind = "overloaded"
    else:
        kind, status = "upstream", status if status >= 500 else 502
    return GatewayError(status, f"upstream error: {exc}", kind, code=exc.error_type)
