"""Pydantic models of the Anthropic Messages requests the gateway accepts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Open):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(_Open):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Open):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | OtherBlock] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Open):
    type: Literal["redacted_thinking"]
    data: str


class OtherBlock(_Open):
    """Images, documents, server tool blocks...: refused later with a clear message."""

    type: str


_KNOWN = {"text", "tool_use", "tool_result", "thinking", "redacted_thinking"}


def _block_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _KNOWN else "other"


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")] | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_tag),
]


class Message(_Open):
    # "system" inside messages: Claude Code's per-turn context (its per-turn-control beta), after a user turn.
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class ToolDef(_Open):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # Rendered where the client set them, as vLLM's /v1/messages passes them on (chat.function_tool).
    strict: bool | None = None
    defer_loading: bool | None = None
    type: str | None = None  # absent or "custom" for client tools; server tools are refused
    cache_control: dict[str, Any] | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _tool_needs_a_name(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs the name of the tool')
        return self


class CountTokensRequest(_Open):
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None  # recorded with the request; the template decides on reasoning


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None
