"""The one internal form every protocol adapter converts to, and the outcome they convert back from.

Conversations are OpenAI-style messages and tools (what chat templates expect): roles system, user,
assistant (``content``, ``reasoning_content``, ``tool_calls``) and tool (``tool_call_id``, ``content``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from producers.gateway.errors import bad_request
from schemas.ids import event_id
from schemas.tokens import TokenIds

Message = dict[str, Any]
Tool = dict[str, Any]


@dataclass
class SamplingSpec:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # What the harness asked for (None: nothing); ``max_tokens`` is what it gets: at most the gateway's
    # cap, and at most what the model's context leaves after the prompt (set when the prompt is known).
    requested_max_tokens: int | None = None
    # Fields the harness sent that the upstream does not apply; kept for the record only.
    ignored: dict[str, Any] = field(default_factory=dict)


@dataclass
class InternalCall:
    protocol: str  # openai.chat | openai.completions | anthropic.messages
    model: str
    stream: bool
    sampling: SamplingSpec
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_text: str | None = None  # completions: a text prompt, tokenized as is
    prompt_ids: list[int] | None = None  # completions: a token-id prompt, used as is


@dataclass(frozen=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass
class CallOutcome:
    """One finished call, in protocol-neutral terms."""

    call_id: str
    call_index: int
    model: str
    created: int  # unix seconds
    prompt_ids: TokenIds
    output_ids: list[int]
    output_logprobs: list[float]
    text: str  # the whole visible output text (after a stop string cut)
    content: str
    reasoning: str | None
    tool_calls: list[ToolCallOut]
    finish_reason: str  # "stop" | "length"
    stop_string: str | None = None
    # Why the output's tool-call markup did not parse (it is then answered as content); on the record.
    parse_errors: tuple[str, ...] = ()
    # A tenant's call is answered under its call ref (session_refs.SessionRefs.call_ref), else its call id.
    response_ref: str | None = None

    @property
    def shown_id(self) -> str:
        """What the response's ids carry after their prefix (``chatcmpl-``, ``msg_``, ``resp_``...)."""
        return self.response_ref or self.call_id

    @property
    def usage(self) -> tuple[int, int]:
        return len(self.prompt_ids), len(self.output_ids)


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None,
                  strict: bool | None = None, defer_loading: bool | None = None) -> Tool:
    """A declared function in the chat form, as vLLM hands it to a chat template whichever protocol declared
    it (``ChatCompletionToolsParam.model_dump()``: vLLM's /v1/chat/completions, /v1/responses and
    /v1/messages all build that model): ``name``, ``description``, ``parameters``, then ``strict`` and
    ``defer_loading`` where the client set them (Pi, Codex: ``"strict": false``; Claude Code: ``"defer_loading":
    true`` on its deferred tools). Templates that print the whole function print them too (Qwen3-Coder's extra
    keys, Qwen3's ``tojson``), so keeping them is what makes the gateway's prompt vLLM's for the same request.
    Key order is vLLM's: templates serialise tools as they are. (An absent description
    or parameters is left out; vLLM passes ``None``, which a template prints as ``None``/``null``.)"""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    if strict is not None:
        function["strict"] = strict
    if defer_loading is not None:
        function["defer_loading"] = defer_loading
    return {"type": "function", "function": function}


def tool_call_id(prefix: str, call_id: str, index: int) -> str:
    """Deterministic tool-call ids, so a re-built response is identical."""
    return f"{prefix}{event_id('tool_call', call_id, index)[:24]}"


def resolve_max_tokens(requested: int | None, limit: int) -> int:
    """The output budget before the prompt is known: the request's, cut to the gateway's cap.

    Harnesses ask for what their vendor's model allows (Claude Code 64000 and more, Pi 16384); a gateway
    in front of a smaller model serves them with what it has, as users expect, and the record keeps both
    numbers. ``CallService.prepare`` cuts it further to the context the prompt leaves."""
    return limit if requested is None else min(requested, limit)


def stop_list(stop: str | list[str] | None, param: str = "stop", max_items: int = 16) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else list(stop)
    if len(items) > max_items:
        raise bad_request(f"at most {max_items} stop sequences are supported", param=param)
    if any(not s for s in items):
        raise bad_request("stop sequences must be non-empty strings", param=param)
    return items
