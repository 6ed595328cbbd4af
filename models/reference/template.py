"""The reference model's chat template (ChatML with Hermes tool calls and Qwen3-style reasoning) and its
tokens: the special tokens, the tool-call and reasoning markers, EOS and PAD."""

from __future__ import annotations

import functools
import json
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
# Hermes tool-call and reasoning markers: single added tokens, not special (as in Qwen2.5/Qwen3), so
# they survive skip_special_tokens when text is decoded.
MARKER_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# ChatML. Only {{- -}} / {%- -%} tags, so template whitespace never reaches the output; every emitted
# character comes from a string literal or a message. Reasoning is rendered for the last assistant
# message only: earlier reasoning is dropped, which breaks the token prefix between turns on purpose.
# ``enable_thinking=False`` (a request's chat_template_kwargs) opens an empty reasoning block after the
# generation prompt, as Qwen3's template does.
CHAT_TEMPLATE = r"""
{%- macro text_of(content) -%}
  {%- if content is none or content is undefined -%}
  {%- elif content is string -%}{{- content -}}
  {%- else -%}
    {%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_assistant=-1) -%}
{%- for message in messages -%}
  {%- if message.role == 'assistant' -%}{%- set ns.last_assistant = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- if tools or has_system -%}
  {{- '<|im_start|>system\n' -}}
  {%- if has_system -%}{{- text_of(messages[0].content) -}}{%- endif -%}
  {%- if tools -%}
    {%- if has_system -%}{{- '\n\n' -}}{%- endif -%}
    {{- '# Tools\n<tools>\n' -}}
    {%- for tool in tools -%}{{- tool | tojson -}}{{- '\n' -}}{%- endfor -%}
    {{- '</tools>' -}}
  {%- endif -%}
  {{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and message.role == 'system' -%}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- set reasoning = '' -%}
    {%- if message.reasoning_content is defined and message.reasoning_content -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif message.reasoning is defined and message.reasoning -%}
      {%- set reasoning = message.reasoning -%}
    {%- endif -%}
    {%- if loop.index0 == ns.last_assistant and reasoning -%}
      {{- '<think>\n' ~ reasoning ~ '\n</think>\n\n' -}}
    {%- endif -%}
    {%- set text = text_of(message.content) -%}
    {{- text -}}
    {%- if message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {%- if text or not loop.first -%}{{- '\n' -}}{%- endif -%}
        {{- '<tool_call>\n{"name": ' ~ (fn.name | tojson) ~ ', "arguments": ' -}}
        {%- if fn.arguments is string -%}{{- fn.arguments -}}
        {%- elif fn.arguments is defined and fn.arguments is not none -%}{{- fn.arguments | tojson -}}
        {%- else -%}{{- '{}' -}}
        {%- endif -%}
        {{- '}\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>tool\n' ~ text_of(message.content) ~ '<|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' ~ message.role ~ '\n' ~ text_of(message.content) ~ '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
""".strip()


def render_template(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """Render the template outside transformers (the tokenizer does not exist yet while its training
    corpus is made); the filters match transformers' chat-template environment."""
    return _compiled_template().render(messages=messages, tools=tools, add_generation_prompt=False)


@functools.cache
def _compiled_template() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    return env.from_string(CHAT_TEMPLATE)


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    return {t: int(tokenizer.convert_tokens_to_ids(t)) for t in SPECIAL_TOKENS + MARKER_TOKENS}
