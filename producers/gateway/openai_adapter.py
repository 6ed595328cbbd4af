"""OpenAI Chat Completions and Completions <-> the internal chat form.

Requests become InternalCall objects; outcomes become response JSON or SSE chunks
(``chat.completion.chunk`` / ``text_completion`` frames, tool-call deltas, a usage chunk when
``stream_options.include_usage`` is set, then ``[DONE]``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from producers.gateway.chat import (
    CallOutcome,
    InternalCall,
    Message,
    SamplingSpec,
    Tool,
    function_tool,
    resolve_max_tokens,
    stop_list,
)
from producers.gateway.errors import GatewayError, bad_request
from producers.gateway.models_openai import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    TextPart,
    ToolDef,
    _SamplingFields,
)
from producers.gateway.sse import DONE, data_event
from schemas.tokens import TokenIds, int_list

CHAT_PROTOCOL = "openai.chat"
COMPLETIONS_PROTOCOL = "openai.completions"
ADAPTER_VERSION = "openai/1"
TOOL_CALL_PREFIX = "call_"

TokenText = Callable[[int], str]


# ------------------------------------------------------------------------------------------- requests

def _sampling(req: _SamplingFields, max_tokens: int | None, limit: int) -> SamplingSpec:
    if req.n is not None and req.n != 1:
        raise bad_request("only n=1 is supported (one sampled output per call record)", param="n")
    ignored = {k: v for k, v in (("presence_penalty", req.presence_penalty),
                                 ("frequency_penalty", req.frequency_penalty)) if v}
    return SamplingSpec(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),
        max_tokens=resolve_max_tokens(max_tokens, limit),
        requested_max_tokens=max_tokens,
        seed=req.seed,
        stop=stop_list(req.stop),
        ignored=ignored,
    )


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, part in enumerate(content):
        if not isinstance(part, TextPart):
            raise bad_request(f"content part type {part.type!r} is not supported by this model (text only)",
                              param=f"{where}.content.{i}.type")
        if part.text:
            parts.append(part.text)
    # Joined with newlines, empty parts skipped, as vLLM 0.32's chat render joins a message's text parts for a
    # string-content template (renderers/chat_utils.py): the same request, the same prompt as from vLLM.
    return "\n".join(parts)


def _message(msg: ChatMessage, index: int) -> Message:
    where = f"messages.{index}"
    role = "system" if msg.role == "developer" else msg.role
    out: Message = {"role": role, "content": _text_of(msg.content, where)}
    if role == "assistant":
        reasoning = msg.reasoning_content or msg.reasoning
        if reasoning:
            out["reasoning_content"] = reasoning
        if msg.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in msg.tool_calls]
    elif role == "tool":
        if not msg.tool_call_id:
            raise bad_request("a tool message needs tool_call_id", param=f"{where}.tool_call_id")
        out["tool_call_id"] = msg.tool_call_id
    if msg.name and role in ("user", "tool"):
        out["name"] = msg.name
    return out


def _tool(t: ToolDef) -> Tool:
    f = t.function
    tool = function_tool(f.name, f.description, f.parameters, f.strict,
                         f.defer_loading if f.defer_loading is not None else t.defer_loading)
    if t.defer_loading is not None:  # vLLM's ChatCompletionToolsParam keeps the tool-level field too
        tool["defer_loading"] = t.defer_loading
    return tool


def chat_to_internal(req: ChatCompletionRequest, max_tokens_limit: int) -> InternalCall:
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    tools = None
    if req.tools and req.tool_choice != "none":
        tools = [_tool(t) for t in req.tools]
    return InternalCall(
        protocol=CHAT_PROTOCOL, model=req.model, stream=req.stream,
        sampling=_sampling(req, requested, max_tokens_limit),
        messages=[_message(m, i) for i, m in enumerate(req.messages)], tools=tools,
        template_kwargs=dict(req.chat_template_kwargs or {}),
    )


def completion_to_internal(req: CompletionRequest, max_tokens_limit: int) -> InternalCall:
    if req.echo:
        raise bad_request("echo is not supported", param="echo")
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise bad_request("only one prompt per request is supported (one call record per call)",
                              param="prompt")
        prompt = prompt[0]
    call = InternalCall(protocol=COMPLETIONS_PROTOCOL, model=req.model, stream=req.stream,
                        sampling=_sampling(req, 16 if req.max_tokens is None else req.max_tokens,
                                           max_tokens_limit))
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt must not be empty", param="prompt")
        call.prompt_text = prompt
    else:
        if not prompt:
            raise bad_request("prompt must not be empty", param="prompt")
        call.prompt_ids = [int(i) for i in prompt]
    return call


# ------------------------------------------------------------------------------------------ responses

def _finish_reason(outcome: CallOutcome) -> str:
    if outcome.tool_calls and outcome.finish_reason == "stop":
        return "tool_calls"
    return outcome.finish_reason


def _usage(outcome: CallOutcome) -> dict[str, int]:
    prompt, completion = outcome.usage
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _tool_calls(outcome: CallOutcome, with_index: bool) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(outcome.tool_calls):
        item: dict[str, Any] = {"id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments}}
        if with_index:
            item = {"index": i, **item}
        calls.append(item)
    return calls


def chat_logprobs(ids: Sequence[int], logprobs: Sequence[float], token_text: TokenText) -> dict[str, Any]:
    content = []
    for token_id, lp in zip(ids, logprobs, strict=True):
        text = token_text(token_id)
        content.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8")),
                        "top_logprobs": []})
    return {"content": content}


def chat_response(outcome: CallOutcome, req: ChatCompletionRequest, token_text: TokenText,
                  fingerprint: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.content or None}
    if outcome.reasoning:
        message["reasoning_content"] = outcome.reasoning
    if outcome.tool_calls:
        message["tool_calls"] = _tool_calls(outcome, with_index=False)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": _finish_reason(outcome),
                              "logprobs": chat_logprobs(outcome.output_ids, outcome.output_logprobs,
                                                        token_text) if req.logprobs else None}
    body: dict[str, Any] = {"id": f"chatcmpl-{outcome.shown_id}", "object": "chat.completion",
                            "created": outcome.created, "model": outcome.model, "choices": [choice],
                            "usage": _usage(outcome), "system_fingerprint": fingerprint}
    if req.return_token_ids:
        body["prompt_token_ids"] = int_list(outcome.prompt_ids)
        choice["token_ids"] = list(outcome.output_ids)
    return body


def completion_logprobs(ids: Sequence[int], logprobs: Sequence[float], token_text: TokenText
                        ) -> dict[str, Any]:
    tokens = [token_text(i) for i in ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": [float(x) for x in logprobs], "top_logprobs": None,
            "text_offset": offsets}


def completion_response(outcome: CallOutcome, req: CompletionRequest, token_text: TokenText,
                        fingerprint: str) -> dict[str, Any]:
    logprobs = completion_logprobs(outcome.output_ids, outcome.output_logprobs, token_text) \
        if req.logprobs is not None else None
    choice: dict[str, Any] = {"index": 0, "text": outcome.text, "finish_reason": outcome.finish_reason,
                              "logprobs": logprobs}
    body: dict[str, Any] = {"id": f"cmpl-{outcome.shown_id}", "object": "text_completion",
                            "created": outcome.created, "model": outcome.model, "choices": [choice],
                            "usage": _usage(outcome), "system_fingerprint": fingerprint}
    if req.return_token_ids:
        body["prompt_token_ids"] = int_list(outcome.prompt_ids)
        choice["token_ids"] = list(outcome.output_ids)
    return body


# ------------------------------------------------------------------------------------------ streaming

class ChatStream:
    """SSE frames of one streamed chat completion."""

    def __init__(self, req: ChatCompletionRequest, call_id: str, model: str, created: int,
                 token_text: TokenText, fingerprint: str) -> None:
        self.req, self.token_text, self.fingerprint = req, token_text, fingerprint
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self._base = {"id": f"chatcmpl-{call_id}", "object": "chat.completion.chunk", "created": created,
                      "model": model, "system_fingerprint": fingerprint}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None, choice_extra: dict[str, Any] | None = None,
               **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
                  **(choice_extra or {})}
        payload: dict[str, Any] = {**self._base, "choices": [choice], **extra}
        if self.include_usage:
            payload["usage"] = None
        return data_event(payload)

    def start(self, prompt_ids: TokenIds) -> list[bytes]:
        extra = {"prompt_token_ids": int_list(prompt_ids)} if self.req.return_token_ids else {}
        return [self._chunk({"role": "assistant", "content": ""}, **extra)]

    def content(self, text: str) -> list[bytes]:
        return [self._chunk({"content": text})] if text else []

    def reasoning(self, text: str) -> list[bytes]:
        return [self._chunk({"reasoning_content": text})] if text else []

    def finish(self, outcome: CallOutcome) -> list[bytes]:
        frames = [self._chunk({"tool_calls": [call]}) for call in _tool_calls(outcome, with_index=True)]
        logprobs = chat_logprobs(outcome.output_ids, outcome.output_logprobs, self.token_text) \
            if self.req.logprobs else None
        ids = {"token_ids": list(outcome.output_ids)} if self.req.return_token_ids else None
        frames.append(self._chunk({}, _finish_reason(outcome), logprobs, ids))
        if self.include_usage:
            frames.append(data_event({**self._base, "choices": [], "usage": _usage(outcome)}))
        frames.append(DONE)
        return frames

    def error(self, exc: GatewayError) -> list[bytes]:
        return [data_event(exc.openai_body())]


class CompletionStream:
    """SSE frames of one streamed text completion."""

    def __init__(self, req: CompletionRequest, call_id: str, model: str, created: int,
                 token_text: TokenText, fingerprint: str) -> None:
        self.req, self.token_text = req, token_text
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self._base = {"id": f"cmpl-{call_id}", "object": "text_completion", "created": created,
                      "model": model, "system_fingerprint": fingerprint}

    def _chunk(self, text: str, finish_reason: str | None = None, **choice_extra: Any) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, **choice_extra}
        payload: dict[str, Any] = {**self._base, "choices": [choice]}
        if self.include_usage:
            payload["usage"] = None
        return data_event(payload)

    def start(self, prompt_ids: TokenIds) -> list[bytes]:
        return []

    def content(self, text: str) -> list[bytes]:
        return [self._chunk(text)] if text else []

    reasoning = content  # a text completion has no separate reasoning channel

    def finish(self, outcome: CallOutcome) -> list[bytes]:
        extra: dict[str, Any] = {}
        if self.req.logprobs is not None:
            extra["logprobs"] = completion_logprobs(outcome.output_ids, outcome.output_logprobs,
                                                    self.token_text)
        if self.req.return_token_ids:
            extra["token_ids"] = list(outcome.output_ids)
            extra["prompt_token_ids"] = int_list(outcome.prompt_ids)
        frames = [self._chunk("", outcome.finish_reason, **extra)]
        if self.include_usage:
            frames.append(data_event({**self._base, "choices": [], "usage": _usage(outcome)}))
        frames.append(DONE)
        return frames

    def error(self, exc: GatewayError) -> list[bytes]:
        return [data_event(exc.openai_body())]
