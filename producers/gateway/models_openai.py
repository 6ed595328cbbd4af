"""Pydantic models of the OpenAI requests the gateway accepts (types checked, unknown fields kept)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"]
    text: str


class OtherPart(_Open):
    """Any non-text content part (images, audio, files): refused later with a clear message."""

    type: str


def _part_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "text" if kind == "text" else "other"


ContentPart = Annotated[Annotated[TextPart, Tag("text")] | Annotated[OtherPart, Tag("other")],
                        Discriminator(_part_tag)]


class FunctionCall(_Open):
    name: str
    arguments: str = ""


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # Reasoning sent back by harnesses that keep it (vLLM / DeepSeek style field names).
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(_Open):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolDef(_Open):
    type: Literal["function"]
    function: FunctionDef
    defer_loading: bool | None = None  # vLLM: also the function's, where that has none


class StreamOptions(_Open):
    include_usage: bool | None = None


class _SamplingFields(_Open):
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM extension; -1 or 0 disables
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    # vLLM extension: echo prompt and sampled token ids in the response.
    return_token_ids: bool | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ChatCompletionRequest:
        # As the OpenAI API does: forcing a function that is not among the tools is a 400, not a guess.
        if isinstance(self.tool_choice, dict):
            name = (self.tool_choice.get("function") or {}).get("name")
            known = {tool.function.name for tool in self.tools or []}
            if name not in known:
                raise ValueError(f"tool_choice names function {name!r}, which is not among the tools {sorted(known)}")
        return self


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool | None = None
    suffix: str | None = None
