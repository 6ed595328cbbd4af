"""Anthropic Messages <-> the internal chat form.

Text is joined as vLLM 0.32's /v1/messages joins it (``AnthropicServingMessages.to_chat_completion_request``),
so a harness gets the prompt here that it gets from vLLM: system text blocks end to end (Claude Code starts
its later blocks with a newline; ``cache_control`` only matters to a cache), less Claude Code's
``x-anthropic-billing-header`` block, which vLLM drops (its per-request hash would otherwise be in every prompt:
``producers.families.messages``); the text blocks of a user or assistant turn, and of a tool result, with one
newline (vLLM keeps them as parts, which its chat render joins so); empty text blocks are skipped;
``tool_result`` blocks become tool messages, ``tool_use`` blocks tool calls, ``thinking`` blocks the
assistant's reasoning. Streams use the named events message_start, content_block_start/delta/stop
(text_delta, thinking_delta, signature_delta, input_json_delta), message_delta, message_stop, ping.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from producers.families.messages import is_billing_header
from producers.gateway.chat import (
    CallOutcome,
    InternalCall,
    Message,
    SamplingSpec,
    function_tool,
    resolve_max_tokens,
    stop_list,
)
from producers.gateway.errors import GatewayError, bad_request
from producers.gateway.models_anthropic import (
    CountTokensRequest,
    MessagesRequest,
    OtherBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from producers.gateway.sse import named_event
from schemas.ids import event_id
from schemas.tokens import TokenIds

PROTOCOL = "anthropic.messages"
ADAPTER_VERSION = "anthropic/1"
TOOL_CALL_PREFIX = "toolu_"
SYSTEM_JOINER = ""
TEXT_JOINER = "\n"


# ------------------------------------------------------------------------------------------- requests

def _system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system  # a billing line here loses its first line later, as in vLLM (families.messages)
    texts = [block.text for block in system if block.text and not is_billing_header(block.text)]
    return SYSTEM_JOINER.join(texts) if texts or not system else None  # the header alone: no system message


def _unsupported(block: OtherBlock, where: str) -> GatewayError:
    return bad_request(f"content block type {block.type!r} is not supported by this model",
                       param=f"{where}.type")


def _tool_result_text(block: ToolResultBlock, where: str) -> str:
    if block.content is None:
        return ""
    if isinstance(block.content, str):
        return block.content
    texts = []
    for i, part in enumerate(block.content):
        if not isinstance(part, TextBlock):
            raise _unsupported(part, f"{where}.content.{i}")
        texts.append(part.text)
    return TEXT_JOINER.join(texts)


def _user_messages(content: str | list[Any], where: str) -> list[Message]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[Message] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": TEXT_JOINER.join(texts)})
            texts.clear()

    for i, block in enumerate(content):
        here = f"{where}.content.{i}"
        if isinstance(block, TextBlock):
            if block.text:
                texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            flush()
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": _tool_result_text(block, here)})
        elif isinstance(block, OtherBlock):
            raise _unsupported(block, here)
        else:
            raise bad_request(f"a user message cannot carry a {block.type} block", param=f"{here}.type")
    flush()
    return out


def _assistant_message(content: str | list[Any], where: str) -> Message:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        here = f"{where}.content.{i}"
        if isinstance(block, TextBlock):
            if block.text:
                texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue  # opaque to us; nothing to render
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name,
                                       "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, OtherBlock):
            raise _unsupported(block, here)
        else:
            raise bad_request(f"an assistant message cannot carry a {block.type} block", param=f"{here}.type")
    message: Message = {"role": "assistant", "content": TEXT_JOINER.join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _system_message(content: str | list[Any], where: str) -> list[Message]:
    """A system message inside ``messages``: its text blocks, joined as the top-level system's are; none
    where Claude Code's billing header was all it said (vLLM's ``_extract_system_text``)."""
    if isinstance(content, str):
        return [] if is_billing_header(content) else [{"role": "system", "content": content}]
    texts = []
    for i, block in enumerate(content):
        if isinstance(block, OtherBlock):
            raise _unsupported(block, f"{where}.content.{i}")
        if not isinstance(block, TextBlock):
            raise bad_request(f"a system message cannot carry a {block.type} block",
                              param=f"{where}.content.{i}.type")
        if block.text and not is_billing_header(block.text):
            texts.append(block.text)
    return [{"role": "system", "content": SYSTEM_JOINER.join(texts)}] if texts else []


def conversation(req: CountTokensRequest) -> tuple[list[Message], list[dict[str, Any]] | None]:
    messages: list[Message] = []
    system = _system_text(req.system)
    if system is not None:
        messages.append({"role": "system", "content": system})
    for i, msg in enumerate(req.messages):
        where = f"messages.{i}"
        if msg.role == "user":
            messages.extend(_user_messages(msg.content, where))
        elif msg.role == "system":
            messages.extend(_system_message(msg.content, where))
        else:
            messages.append(_assistant_message(msg.content, where))
    tools = None
    if req.tools and not (req.tool_choice and req.tool_choice.type == "none"):
        tools = []
        for i, tool in enumerate(req.tools):
            if tool.type not in (None, "custom"):
                raise bad_request(f"server tool {tool.type!r} is not supported; only client tools are",
                                  param=f"tools.{i}.type")
            tools.append(function_tool(tool.name, tool.description or None,
                                       tool.input_schema or {"type": "object", "properties": {}}, tool.strict,
                                       tool.defer_loading))
    return messages, tools


def to_internal(req: MessagesRequest, max_tokens_limit: int) -> InternalCall:
    messages, tools = conversation(req)
    sampling = SamplingSpec(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or 0,
        max_tokens=resolve_max_tokens(req.max_tokens, max_tokens_limit),
        requested_max_tokens=req.max_tokens,
        stop=stop_list(req.stop_sequences, "stop_sequences"),
    )
    return InternalCall(protocol=PROTOCOL, model=req.model, stream=req.stream, sampling=sampling,
                        messages=messages, tools=tools)


# ------------------------------------------------------------------------------------------ responses

def _stop_reason(outcome: CallOutcome) -> str:
    if outcome.stop_string is not None:
        return "stop_sequence"
    if outcome.finish_reason == "length":
        return "max_tokens"
    return "tool_use" if outcome.tool_calls else "end_turn"


def thinking_signature(call_id: str) -> str:
    # Opaque to harnesses (they send it back unchanged); names the call whose output it was.
    return "tt1." + event_id("thinking", call_id)


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def _usage(outcome: CallOutcome) -> dict[str, Any]:
    prompt, output = outcome.usage
    return {"input_tokens": prompt, "output_tokens": output, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def content_blocks(outcome: CallOutcome) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if outcome.reasoning:
        blocks.append({"type": "thinking", "thinking": outcome.reasoning,
                       "signature": thinking_signature(outcome.shown_id)})
    if outcome.content or not outcome.tool_calls:
        blocks.append({"type": "text", "text": outcome.content})
    for call in outcome.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": _tool_input(call.arguments)})
    return blocks


def message_response(outcome: CallOutcome) -> dict[str, Any]:
    return {"id": f"msg_{outcome.shown_id}", "type": "message", "role": "assistant", "model": outcome.model,
            "content": content_blocks(outcome), "stop_reason": _stop_reason(outcome),
            "stop_sequence": outcome.stop_string, "usage": _usage(outcome)}


class MessageStream:
    """Named SSE events of one streamed message; text and thinking stream live, tool calls at the end."""

    def __init__(self, call_id: str, model: str) -> None:
        self.call_id, self.model = call_id, model
        self._index = -1
        self._open: str | None = None  # type of the open content block

    def start(self, prompt_ids: TokenIds) -> list[bytes]:
        message = {"id": f"msg_{self.call_id}", "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": len(prompt_ids), "output_tokens": 0,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        return [named_event("message_start", {"type": "message_start", "message": message}),
                named_event("ping", {"type": "ping"})]

    def _switch(self, kind: str, block: dict[str, Any], signature: str | None = None) -> list[bytes]:
        if self._open == kind:
            return []
        frames = self._close(signature)
        self._index += 1
        self._open = kind
        frames.append(named_event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                          "content_block": block}))
        return frames

    def _close(self, signature: str | None = None) -> list[bytes]:
        if self._open is None:
            return []
        frames = []
        if self._open == "thinking":
            frames.append(self._delta({"type": "signature_delta", "signature": signature or ""}))
        frames.append(named_event("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = None
        return frames

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return named_event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                   "delta": delta})

    def reasoning(self, text: str) -> list[bytes]:
        if not text:
            return []
        frames = self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        frames.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return frames

    def content(self, text: str) -> list[bytes]:
        if not text:
            return []
        frames = self._switch("text", {"type": "text", "text": ""}, thinking_signature(self.call_id))
        frames.append(self._delta({"type": "text_delta", "text": text}))
        return frames

    def finish(self, outcome: CallOutcome) -> list[bytes]:
        frames: list[bytes] = []
        if self._index < 0 and not outcome.tool_calls:  # an empty answer still has one text block
            frames += self._switch("text", {"type": "text", "text": ""})
        frames += self._close(thinking_signature(self.call_id))
        for call in outcome.tool_calls:
            self._index += 1
            frames.append(named_event("content_block_start", {
                "type": "content_block_start", "index": self._index,
                "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}))
            frames.append(self._delta({"type": "input_json_delta",
                                       "partial_json": orjson.dumps(_tool_input(call.arguments)).decode()}))
            frames.append(named_event("content_block_stop", {"type": "content_block_stop",
                                                             "index": self._index}))
        frames.append(named_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(outcome), "stop_sequence": outcome.stop_string},
            "usage": {"output_tokens": len(outcome.output_ids)}}))
        frames.append(named_event("message_stop", {"type": "message_stop"}))
        return frames

    def error(self, exc: GatewayError) -> list[bytes]:
        return [named_event("error", exc.anthropic_body())]

    @staticmethod
    def ping() -> bytes:
        return named_event("ping", {"type": "ping"})
