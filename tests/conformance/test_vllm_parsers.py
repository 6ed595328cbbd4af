"""vLLM's own parsers (issue 28, item 4b's judge) in vLLM's environment: on every family's corpus outputs they
extract what the corpus scripted, and so does the gateway's parser of the family; a broken tool-call block is
answered as vLLM answers it; a Qwen3 output with no ``</think>`` is reasoning (vLLM's qwen3 parser starts in its
reasoning state) for both. In the same batch, vLLM's chat render (item 4a's judge for Qwen3-Coder, which
renderers has no renderer of) gives the gateway's prompt ids for every Qwen3-Coder corpus request, and for a body
as a harness sends it (``strict`` tools, Claude Code's billing header line: vLLM's request preparation) and for a
captured Claude Code request converted by vLLM's own /v1/messages conversion. One subprocess for all (vLLM's
import costs tens of seconds)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.corpus import CONVERSATIONS, adapted, requests
from conformance.formats import FORMATS
from conformance.judge import normal_parse, parse_difference
from conformance.vllm_parsers import ParseJob, judge_with_vllm
from conformance.vllm_render import RenderJob
from producers.gateway import anthropic_adapter, openai_adapter
from producers.gateway.body import validate
from producers.gateway.family_text_side import FamilyTextSide
from producers.gateway.models_anthropic import MessagesRequest
from producers.gateway.models_openai import ChatCompletionRequest
from tokentrail.commands.conformance_drive import intended

pytestmark = pytest.mark.slow

CAPTURED = Path(__file__).parents[1] / "harnesses" / "captured" / "claude-tool.jsonl"

BROKEN = {"qwen3": '<think>\nRun it.\n</think>\n\n'
                   '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>',
          "qwen3-coder": "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</tool_call>",
          # Qwen3 without a think block: all reasoning, up to a tool call (which ends reasoning implicitly)
          "qwen3/no-think answer": "The tests pass now.",
          "qwen3/no-think call": 'Run them.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n'
                                 "</tool_call>",
          "qwen3/unclosed think": "<think>\nStill thinking about"}


# An OpenAI chat body as Pi sends it (tools with "strict": false) whose system text starts with Claude Code's
# billing header line: vLLM renders the body as sent, the gateway its conversion (chat_to_internal); vLLM keeps
# `strict` (Qwen3-Coder's template prints it) and drops the header's line (chat_utils), and so must the gateway.
AS_SENT = {"model": "m", "messages": [
    {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1.328.593; cch=5e1f2;\nYou are Pi."},
    # text parts: vLLM's chat render joins them with a newline and skips empty ones, and so must the gateway
    {"role": "user", "content": [{"type": "text", "text": "Read a.txt"}, {"type": "text", "text": ""},
                                 {"type": "text", "text": "then stop."}]}],
    "tools": [{"type": "function", "function": {
        "name": "read", "description": "Read a file.", "strict": False,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]}


def _as_sent(family: str, model_dir: Path, text: FamilyTextSide) -> RenderJob:
    call = openai_adapter.chat_to_internal(validate(ChatCompletionRequest, AS_SENT), 100)
    assert call.messages is not None
    ids = text.render_chat(call.messages, call.tools, prefix_mode="retokenize", prior=[]).prompt_ids
    assert "<strict>False</strict>" in text.renderer.decode(ids) and "billing" not in text.renderer.decode(ids)
    return RenderJob(f"{family}/as-sent", model_dir, FORMATS[family].vllm_tool_parser, AS_SENT["messages"],
                     AS_SENT["tools"], [int(t) for t in ids])


def _claude_code(family: str, model_dir: Path, text: FamilyTextSide) -> RenderJob:
    """A captured Claude Code request (billing header block, deferred tools, several system and text blocks):
    vLLM converts the body with its own /v1/messages conversion, the gateway with its Anthropic adapter."""
    body = json.loads(CAPTURED.read_text().splitlines()[0])["body"]
    messages, tools = anthropic_adapter.conversation(validate(MessagesRequest, body))
    ids = text.render_chat(messages, tools, prefix_mode="retokenize", prior=[]).prompt_ids
    return RenderJob(f"{family}/claude-code", model_dir, FORMATS[family].vllm_tool_parser, [], None,
                     [int(t) for t in ids], anthropic=body)


def test_vllm_and_the_gateway_parse_every_family_output_as_scripted(family_dir: Callable[[str], Path]) -> None:
    jobs, expected, ours, sides = [], {}, {}, {}
    renders: list[RenderJob] = []
    for family, fmt in FORMATS.items():
        model_dir = family_dir(family)
        text = sides[family] = FamilyTextSide.from_dir(model_dir)
        for conv in CONVERSATIONS:
            conv = adapted(conv, fmt.can)
            if fmt.vllm_render:
                renders += [RenderJob(f"{family}/{conv.name}/{i}", model_dir, fmt.vllm_tool_parser, messages,
                                      list(conv.tools), [int(t) for t in text.render_chat(
                                          messages, list(conv.tools), prefix_mode="retokenize", prior=[]).prompt_ids])
                            for i, messages in enumerate(requests(conv))]
            for i, step in enumerate(conv.steps):
                key = f"{family}/{conv.name}/{i}"
                output = fmt.write(step.output)
                jobs.append(ParseJob(key, fmt, model_dir, output, tools=list(conv.tools)))
                expected[key] = intended(step.output)
                parsed = text.parse(output)
                ours[key] = normal_parse(parsed.reasoning, parsed.content,
                                         [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls])
        for name, output in BROKEN.items():
            if name.split("/")[0] == family:
                key = name if "/" in name else f"{family}/broken"
                jobs.append(ParseJob(key, fmt, model_dir, output, tools=list(conv.tools)))
    renders += [_as_sent("qwen3-coder", family_dir("qwen3-coder"), sides["qwen3-coder"]),
                _claude_code("qwen3-coder", family_dir("qwen3-coder"), sides["qwen3-coder"])]
    env = {"TIKTOKEN_ENCODINGS_BASE": str(family_dir("gpt-oss"))}
    theirs, rendered = judge_with_vllm(jobs, renders, env=env)
    # vLLM's render path (its render server's, for /v1/chat/completions) gives the gateway's ids, token for token
    assert len(renders) >= 15 and sorted(rendered) == sorted(r.key for r in renders)
    assert [k for k, r in rendered.items() if r.error or r.prompt_ids != list(next(
        j.prompt_ids for j in renders if j.key == k))] == []
    assert all(r.text == r.gateway_text for r in rendered.values())
    assert len(theirs) == len(jobs) and not [k for k, r in theirs.items() if r.error]
    wrong = {k: parse_difference(normal_parse(r.reasoning, r.content, r.tool_calls), expected[k])
             for k, r in theirs.items() if k in expected
             and normal_parse(r.reasoning, r.content, r.tool_calls) != expected[k]}
    assert wrong == {}
    # Including a Qwen3-Coder XML string parameter ending in a newline ("こんにちは、世界 🌏\n"): the template's
    # framing is one newline each side; renderers' XML parser strips more, the gateway takes the framing only.
    assert sorted(k for k in ours if ours[k] != expected[k]) == []
    assert any(str(arguments.get("content", "")).endswith("\n") for k in ours if k.startswith("qwen3-coder/tool_error")
               for _, arguments in ours[k]["tool_calls"])
    # Broken markup is answered as the family's reference parser answers it: vLLM's hermes (qwen3) gives the
    # text back as content with no call; its qwen3_xml keeps the call and drops the unterminated parameter.
    for name, text in BROKEN.items():
        family = name.split("/")[0]
        broken = theirs[name if "/" in name else f"{family}/broken"]
        parsed = sides[family].parse(text)
        assert normal_parse(parsed.reasoning, parsed.content,
                            [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls]) == \
            normal_parse(broken.reasoning, broken.content, broken.tool_calls), family
    assert theirs["qwen3/broken"].tool_calls == [] and "<tool_call>" in (theirs["qwen3/broken"].content or "")
    assert [c["name"] for c in theirs["qwen3-coder/broken"].tool_calls] == ["bash"]
    assert (theirs["qwen3/no-think answer"].reasoning or "").strip() == "The tests pass now."
    assert not (theirs["qwen3/no-think answer"].content or "").strip()
    assert [c["name"] for c in theirs["qwen3/no-think call"].tool_calls] == ["bash"]
