"""Pydantic models of the OpenAI Responses requests the gateway accepts (types checked, unknown fields kept).

Item, content-part and tool types outside the supported set parse as ``Other*`` models, so the adapter
can refuse them with a message that names the type rather than a pydantic union error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def _tagger(known: set[str], default: str | None = None) -> Any:
    """A discriminator: the value's ``type`` if it is one of ``known``, else ``"other"``."""

    def tag(value: Any) -> str:
        kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return kind if kind in known else "other"

    return tag


# -------------------------------------------------------------------------------------- content parts

class TextContent(_Open):
    # input_text in user/system turns, output_text in assistant turns sent back; both are plain text.
    type: Literal["input_text", "output_text"]
    text: str


class OtherContent(_Open):
    """Images, files, audio, refusals: refused by the adapter with a clear message."""

    type: str


def _content_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "text" if kind in ("input_text", "output_text") else "other"


ContentPart = Annotated[Annotated[TextContent, Tag("text")] | Annotated[OtherContent, Tag("other")],
                        Discriminator(_content_tag)]


def _text_as_parts(value: Any) -> Any:
    # A plain string is one text part. Parsing it as such (rather than as a ``str | list`` union) makes
    # a malformed list report its own problem instead of "should be a valid string".
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


Content = Annotated[list[ContentPart], BeforeValidator(_text_as_parts)]


# --------------------------------------------------------------------------------------------- tools

class FunctionTool(_Open):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class CustomTool(_Open):
    """A freeform tool: the model writes one string (``format`` text, or a lark/regex grammar)."""

    type: Literal["custom"]
    name: str = Field(min_length=1)
    description: str | None = None
    format: dict[str, Any] | None = None


class OtherTool(_Open):
    """Hosted tools (web_search, file_search, computer_use, mcp, ...) and unknown types: the adapter
    omits web_search with a record of it and refuses the rest."""

    type: str


NestedTool = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[CustomTool, Tag("custom")]
                       | Annotated[OtherTool, Tag("other")], Discriminator(_tagger({"function", "custom"}))]


class NamespaceTool(_Open):
    """A named group of function/custom tools (Codex's ``multi_agent_v1``, ``functions``, ...)."""

    type: Literal["namespace"]
    name: str = Field(min_length=1)
    description: str | None = None
    tools: list[NestedTool]


ToolDef = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[CustomTool, Tag("custom")]
                    | Annotated[NamespaceTool, Tag("namespace")] | Annotated[OtherTool, Tag("other")],
                    Discriminator(_tagger({"function", "custom", "namespace"}))]


# ---------------------------------------------------------------------------------------- input items

class MessageItem(_Open):
    type: Literal["message"] = "message"  # the "easy" message form omits it
    role: Literal["user", "assistant", "system", "developer"]
    content: Content


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    namespace: str | None = None  # a call of a function inside a namespace tool


class CustomToolCallItem(_Open):
    """A call of a custom (freeform) tool: one string of input, no JSON arguments."""

    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str
    id: str | None = None
    namespace: str | None = None


class FunctionCallOutputItem(_Open):
    # custom_tool_call_output has the same shape (Codex sends its output as a list of input_text parts).
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: Content


class ReasoningPart(_Open):
    type: str  # reasoning_text (content) or summary_text (summary)
    text: str


class ReasoningItem(_Open):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningPart] = Field(default_factory=list)
    content: list[ReasoningPart] | None = None
    encrypted_content: str | None = None


class AdditionalToolsItem(_Open):
    """Tools declared inside ``input`` (Codex's default models send all their tools this way): they join
    the request's ``tools``, in order, after them."""

    type: Literal["additional_tools"]
    tools: list[ToolDef]
    id: str | None = None
    role: str | None = None


class OtherItem(_Open):
    """Item types that need server-side tools or state (item_reference, web_search_call, ...)."""

    type: str


_ITEM_TYPES = {"message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
               "reasoning", "additional_tools"}


def _item_tag(value: Any) -> str:
    tag = _tagger(_ITEM_TYPES, default="message")(value)
    return "function_call_output" if tag == "custom_tool_call_output" else tag


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                      | Annotated[ReasoningItem, Tag("reasoning")]
                      | Annotated[AdditionalToolsItem, Tag("additional_tools")] | Annotated[OtherItem, Tag("other")],
                      Discriminator(_item_tag)]


# ------------------------------------------------------------------------------------------- request

def _input_as_items(value: Any) -> Any:
    # A string input is one user message (as OpenAI defines it); see _text_as_parts for why.
    return [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value


class ResponsesRequest(_Open):
    model: str = Field(min_length=1)
    input: Annotated[list[InputItem], BeforeValidator(_input_as_items)]
    instructions: str | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None  # not in OpenAI's API; honoured like the chat route's (vLLM style)
    stream: bool = False
    metadata: dict[str, str] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
