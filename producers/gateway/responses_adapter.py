"""OpenAI Responses <-> the internal chat form.

Requests: ``instructions`` becomes the system message; input items become chat messages. A run of
assistant-side items (reasoning, an assistant message, function and custom tool calls) is one assistant
turn, in the order this adapter writes them (reasoning, message, calls), so a response sent back as input
renders as the turn the gateway recorded. ``function_call_output`` / ``custom_tool_call_output`` items
become tool messages; ``additional_tools`` items add their tools to ``tools``. Namespace, custom and
hosted tools: responses_tools. The gateway keeps no responses, so ``previous_response_id`` /
``conversation`` are refused: send the full input. What the request asks that the gateway does not apply
(reasoning options, encrypted reasoning, ``include``, ``prompt_cache_key``, ``text.verbosity``, ``parallel_tool_calls:
false``, omitted hosted tools, unenforced tool grammars) is listed in the call record's ``ignored_by_upstream``.

Responses: output items reasoning (with its text, when the parser found some), message (output_text)
and function_call / custom_tool_call (namespaced as declared). Streams are named SSE events with a running
``sequence_number``: response.created, response.in_progress, output_item.added/done,
content_part.added/done, output_text / reasoning_text delta and done, function_call_arguments
(custom_tool_call_input) delta and done, then response.completed (response.incomplete when
``max_output_tokens`` cut the output).
"""

from __future__ import annotations

from typing import Any

from producers.gateway.chat import CallOutcome, InternalCall, Message, SamplingSpec, resolve_max_tokens
from producers.gateway.errors import GatewayError, bad_request
from producers.gateway.models_responses import (
    AdditionalToolsItem,
    CustomToolCallItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherContent,
    OtherItem,
    ReasoningItem,
    ResponsesRequest,
)
from producers.gateway.responses_tools import (
    TOOL_CALL_PREFIX,
    ToolSet,
    call_item,
    call_name,
    custom_call_of,
    function_call_of,
    tool_set,
)
from producers.gateway.sse import named_event
from schemas.tokens import TokenIds

PROTOCOL = "openai.responses"
ADAPTER_VERSION = "openai-responses/1"
__all__ = ["ADAPTER_VERSION", "PROTOCOL", "TOOL_CALL_PREFIX", "ResponseStream", "conversation", "response_body",
           "to_internal"]

# Rank of assistant-side items within one turn, in the order the adapter writes them.
_CALLS = 2
_RANK = {ReasoningItem: 0, MessageItem: 1, FunctionCallItem: _CALLS, CustomToolCallItem: _CALLS}


# ------------------------------------------------------------------------------------------- requests

def _text(content: list[Any], where: str) -> str:
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, OtherContent):
            raise bad_request(f"content part type {part.type!r} is not supported by this model (text only)",
                              param=f"{where}.{i}.type")
        texts.append(part.text)
    return "".join(texts)


def _refuse_stored_state(req: ResponsesRequest) -> None:
    for param, value in (("previous_response_id", req.previous_response_id), ("conversation", req.conversation)):
        if value:
            raise bad_request(f"{param} is not supported: this gateway stores no responses (store is ignored); "
                              "send the full conversation in input", param=param, code="unsupported_parameter")


def _add_to_turn(turn: Message, item: Any, where: str, tools: ToolSet) -> None:
    if isinstance(item, ReasoningItem):
        # Only the reasoning text can be rendered; summaries and encrypted content are not the model's text.
        text = "".join(p.text for p in item.content or [] if p.type == "reasoning_text")
        if text:
            turn["reasoning_content"] = text
    elif isinstance(item, MessageItem):
        turn["content"] = _text(item.content, f"{where}.content")
    else:
        name = call_name(item.name, item.namespace, tools)
        function = (custom_call_of(name, item.input) if isinstance(item, CustomToolCallItem)
                    else function_call_of(name, item.arguments))
        turn.setdefault("tool_calls", []).append({"id": item.call_id, "type": "function", "function": function})


def conversation(req: ResponsesRequest, tools: ToolSet | None = None) -> list[Message]:
    tools = request_tools(req) if tools is None else tools
    messages: list[Message] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if not req.input:
        raise bad_request("input must not be empty", param="input")
    turn: Message | None = None
    last_rank = -1
    for i, item in enumerate(req.input):
        where = f"input.{i}"
        if isinstance(item, OtherItem):
            raise bad_request(f"input item type {item.type!r} is not supported; supported are message, "
                              "function_call, function_call_output, custom_tool_call, custom_tool_call_output, "
                              "reasoning and additional_tools", param=f"{where}.type")
        if isinstance(item, AdditionalToolsItem):
            continue  # its tools join the request's tools (_declared_tools); it is no turn
        if isinstance(item, FunctionCallOutputItem):
            turn = None
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": _text(item.output, f"{where}.output")})
        elif isinstance(item, MessageItem) and item.role != "assistant":
            turn = None
            role = "user" if item.role == "user" else "system"
            messages.append({"role": role, "content": _text(item.content, f"{where}.content")})
        else:
            rank = _RANK[type(item)]
            # A new turn starts where the order reasoning < message < calls restarts (calls may repeat).
            if turn is None or rank < last_rank or (rank == last_rank and rank != _CALLS):
                turn = {"role": "assistant", "content": ""}
                messages.append(turn)
            _add_to_turn(turn, item, where, tools)
            last_rank = rank
    return messages


def request_tools(req: ResponsesRequest) -> ToolSet:
    """The request's tools: ``tools``, then those of ``additional_tools`` input items, in order."""
    declared = [(tool, f"tools.{i}") for i, tool in enumerate(req.tools or [])]
    for i, item in enumerate(req.input):
        if isinstance(item, AdditionalToolsItem):
            declared += [(tool, f"input.{i}.tools.{j}") for j, tool in enumerate(item.tools)]
    return tool_set(declared)


def _tools(req: ResponsesRequest, tools: ToolSet) -> list[dict[str, Any]] | None:
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") not in ("function", "custom"):
            raise bad_request(f"tool_choice type {choice.get('type')!r} is not supported; use none, auto, "
                              "required, a function or a custom tool", param="tool_choice")
        named = choice.get("name")
        if named not in tools.targets and named not in tools.by_bare_name:
            raise bad_request(f"tool_choice names tool {named!r}, which is not among the tools", param="tool_choice")
    if not tools.functions or choice == "none":
        return None
    return tools.functions


def _ignored(req: ResponsesRequest, tools: ToolSet) -> dict[str, Any]:
    """What the request asks that this gateway does not apply, for the call record."""
    encrypted = sum(1 for item in req.input if isinstance(item, ReasoningItem) and item.encrypted_content)
    verbosity = (req.text or {}).get("verbosity")
    extra = req.model_extra or {}
    return {k: v for k, v in (
        ("reasoning", req.reasoning),
        ("include", extra.get("include")),
        ("encrypted_reasoning_items", encrypted),  # not rendered: the gateway cannot read them
        ("prompt_cache_key", extra.get("prompt_cache_key")),
        ("text.verbosity", verbosity),
        ("omitted_hosted_tools", tools.omitted),
        ("unenforced_tool_formats", tools.unenforced_formats),
    ) if v} | ({"parallel_tool_calls": False} if req.parallel_tool_calls is False else {})  # the parser may
    # return several calls all the same


def to_internal(req: ResponsesRequest, max_tokens_limit: int) -> InternalCall:
    _refuse_stored_state(req)
    text_format = (req.text or {}).get("format") or {}
    if text_format.get("type", "text") != "text":
        raise bad_request(f"text.format type {text_format.get('type')!r} is not supported: this gateway "
                          "cannot constrain the output; use text", param="text.format.type")
    sampling = SamplingSpec(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        max_tokens=resolve_max_tokens(req.max_output_tokens, max_tokens_limit),
        requested_max_tokens=req.max_output_tokens,
        seed=req.seed,
    )
    tools = request_tools(req)
    sampling.ignored = _ignored(req, tools)
    return InternalCall(protocol=PROTOCOL, model=req.model, stream=req.stream, sampling=sampling,
                        messages=conversation(req, tools), tools=_tools(req, tools))


# ------------------------------------------------------------------------------------------ responses

def _incomplete(outcome: CallOutcome) -> bool:
    return outcome.finish_reason == "length"


def _usage(outcome: CallOutcome) -> dict[str, Any]:
    prompt, output = outcome.usage
    # The gateway does not split reasoning tokens out, nor cache: the details are zeros, not estimates.
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output}


def _echo_tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    return [t.model_dump(exclude_none=True) for t in req.tools or []]


def reasoning_item(call_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": f"rs_{call_id}", "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def message_item(call_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": f"msg_{call_id}", "type": "message", "role": "assistant", "status": status,
            "content": [_output_text(text)]}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_items(outcome: CallOutcome, req: ResponsesRequest) -> list[dict[str, Any]]:
    targets = request_tools(req).targets
    return [call_item(call, targets) for call in outcome.tool_calls]


def output_items(outcome: CallOutcome, req: ResponsesRequest) -> list[dict[str, Any]]:
    status = "incomplete" if _incomplete(outcome) else "completed"
    items: list[dict[str, Any]] = []
    if outcome.reasoning:
        items.append(reasoning_item(outcome.shown_id, outcome.reasoning, status))
    if outcome.content or not outcome.tool_calls:
        items.append(message_item(outcome.shown_id, outcome.content, status))
    return items + function_call_items(outcome, req)


def _skeleton(req: ResponsesRequest, call_id: str, created: int) -> dict[str, Any]:
    """A Response object without output, status or usage: what every event's response repeats."""
    return {"id": f"resp_{call_id}", "object": "response", "created_at": created, "model": req.model,
            "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {}, "output": [],
            "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            "previous_response_id": None, "reasoning": req.reasoning, "store": False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": {"type": "text"}}, "tool_choice": req.tool_choice or "auto",
            "tools": _echo_tools(req), "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": "disabled",
            "usage": None}


def response_body(outcome: CallOutcome, req: ResponsesRequest,
                  output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = _skeleton(req, outcome.shown_id, outcome.created)
    body["output"] = output_items(outcome, req) if output is None else output
    body["usage"] = _usage(outcome)
    if _incomplete(outcome):
        body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    else:
        body["status"], body["completed_at"] = "completed", outcome.created
    return body


# ------------------------------------------------------------------------------------------ streaming

class ResponseStream:
    """Named SSE events of one streamed response; reasoning and text stream live, function calls at the end.

    The final ``response.completed`` carries the items exactly as they were streamed."""

    def __init__(self, req: ResponsesRequest, call_id: str, created: int) -> None:
        self.req, self.call_id, self.created = req, call_id, created
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # finished output items
        self._open: str | None = None  # "reasoning" | "message": the item being streamed
        self._text = ""  # its text so far

    def _event(self, kind: str, **payload: Any) -> bytes:
        frame = named_event(kind, {"type": kind, **payload, "sequence_number": self._seq})
        self._seq += 1
        return frame

    def _response_event(self, kind: str, response: dict[str, Any]) -> bytes:
        return self._event(kind, response=response)

    def start(self, prompt_ids: TokenIds) -> list[bytes]:
        skeleton = _skeleton(self.req, self.call_id, self.created)
        return [self._response_event("response.created", skeleton),
                self._response_event("response.in_progress", skeleton)]

    # -- live items ------------------------------------------------------------------------------

    def _item(self, kind: str, status: str) -> dict[str, Any]:
        # As in the unstreamed body; a second item of the same kind (rare) gets a numbered id.
        same = sum(1 for i in self._items if i["type"] == kind)
        suffix = f"{self.call_id}_{same}" if same else self.call_id
        if kind == "reasoning":
            return reasoning_item(suffix, self._text, status)
        return message_item(suffix, self._text, status)

    def _switch(self, kind: str) -> list[bytes]:
        if self._open == kind:
            return []
        frames = self._close("completed")
        self._open, self._text = kind, ""
        added = self._item(kind, "in_progress")
        added["content"] = []
        index = len(self._items)
        part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else _output_text("")
        frames.append(self._event("response.output_item.added", output_index=index, item=added))
        frames.append(self._event("response.content_part.added", item_id=added["id"], output_index=index,
                                  content_index=0, part=part))
        return frames

    def _close(self, status: str) -> list[bytes]:
        if self._open is None:
            return []
        item = self._item(self._open, status)
        where = {"item_id": item["id"], "output_index": len(self._items)}
        part = item["content"][0]
        if self._open == "reasoning":
            frames = [self._event("response.reasoning_text.done", **where, content_index=0, text=self._text)]
        else:
            frames = [self._event("response.output_text.done", **where, content_index=0, text=self._text,
                                  logprobs=[])]
        frames.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        frames.append(self._event("response.output_item.done", output_index=len(self._items), item=item))
        self._items.append(item)
        self._open = None
        return frames

    def _delta(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        frames = self._switch(kind)
        self._text += text
        where = {"item_id": self._item(kind, "in_progress")["id"], "output_index": len(self._items),
                 "content_index": 0}
        if kind == "reasoning":
            frames.append(self._event("response.reasoning_text.delta", **where, delta=text))
        else:
            frames.append(self._event("response.output_text.delta", **where, delta=text, logprobs=[]))
        return frames

    def reasoning(self, text: str) -> list[bytes]:
        return self._delta("reasoning", text)

    def content(self, text: str) -> list[bytes]:
        return self._delta("message", text)

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, outcome: CallOutcome) -> list[bytes]:
        status = "incomplete" if _incomplete(outcome) else "completed"
        frames: list[bytes] = []
        if self._open != "message" and not any(i["type"] == "message" for i in self._items) \
                and not outcome.tool_calls:
            frames += self._switch("message")  # an empty answer still has one message item
        frames += self._close(status)
        for item in function_call_items(outcome, self.req):
            index = len(self._items)
            # function_call streams its arguments, custom_tool_call its input, each under its own event names
            field, kind = ("input", "custom_tool_call_input") if item["type"] == "custom_tool_call" \
                else ("arguments", "function_call_arguments")
            frames.append(self._event("response.output_item.added", output_index=index,
                                      item={**item, field: "", "status": "in_progress"}))
            frames.append(self._event(f"response.{kind}.delta", item_id=item["id"], output_index=index,
                                      delta=item[field]))
            frames.append(self._event(f"response.{kind}.done", item_id=item["id"], output_index=index,
                                      **{field: item[field]}))
            frames.append(self._event("response.output_item.done", output_index=index, item=item))
            self._items.append(item)
        body = response_body(outcome, self.req, output=self._items)
        frames.append(self._response_event(f"response.{body['status']}", body))
        return frames

    def error(self, exc: GatewayError) -> list[bytes]:
        error = exc.openai_body()["error"]
        failed = _skeleton(self.req, self.call_id, self.created)
        failed["status"] = "failed"
        failed["error"] = {"code": exc.code or error["type"], "message": exc.message}
        return [self._event("error", code=exc.code or error["type"], message=exc.message, param=exc.param),
                self._response_event("response.failed", failed)]
