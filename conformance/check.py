"""Judge the calls a gateway recorded for one family: render (renderers; vLLM's chat render where the family's
format asks for it), parse (vLLM), drift (a plain re-render).

Input is what the record holds and what the gateway's own text side makes of it, one ``CallEvidence`` per
call in call order per rollout; output is a ``Tally`` per family (``judge.py`` says what each count means).
The vLLM parses and renders come in one batch for all calls (``vllm_parsers.py``), so a run pays vLLM's import
once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.formats import FamilyFormat
from conformance.judge import (
    IndependentRenderer,
    Tally,
    lost_tokens,
    normal_parse,
    parse_difference,
)
from conformance.vllm_parsers import ParseJob, VllmParse
from conformance.vllm_render import RenderJob, VllmRender, render_verdict

Message = dict[str, Any]


@dataclass(frozen=True)
class CallEvidence:
    key: str  # rollout/call index: names the call in every detail line
    family: str
    messages: list[Message]  # the request as the gateway understood it (internal chat form)
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]  # as recorded
    output_ids: list[int]  # as recorded (the stop token included where the engine sampled it)
    output_text: str  # the output decoded without its stop token
    gateway_parse: dict[str, Any]  # normal_parse of what the gateway's parser made of the output
    rerender_ids: list[int]  # the gateway's plain re-render of the same request (no splicing)
    previous: tuple[list[int], list[int]] | None = None  # the previous call's (prompt, output), same rollout
    intended: dict[str, Any] | None = None  # normal_parse of what the corpus scripted, where it did
    # The request as the harness sent it where it spoke OpenAI chat ((messages, tools) of the body): what vLLM's
    # chat render is given; else None (vLLM renders ``messages``, the gateway's conversion of the request)
    chat_request: tuple[list[Message], list[dict[str, Any]] | None] | None = None
    # The body as the harness sent it where it spoke Anthropic Messages: vLLM converts it as its /v1/messages does
    anthropic_request: dict[str, Any] | None = None


def parse_jobs(evidence: Sequence[CallEvidence], formats: Mapping[str, FamilyFormat],
               tokenizer_dirs: Mapping[str, Path]) -> list[ParseJob]:
    return [ParseJob(e.key, formats[e.family], tokenizer_dirs[e.family], e.output_text,
                     ids=e.output_ids, tools=e.tools, prompt_ids=e.prompt_ids) for e in evidence]


def render_jobs(evidence: Sequence[CallEvidence], formats: Mapping[str, FamilyFormat],
                tokenizer_dirs: Mapping[str, Path],
                renderers: Mapping[str, IndependentRenderer | None] | None = None) -> list[RenderJob]:
    """vLLM's chat render of every call of a family whose format asks for it (``FamilyFormat.vllm_render``), and
    of each call its family's ``renderers`` renderer refuses (Codex's two system messages on Llama 3), so that
    such a call is still judged by an implementation we did not write."""
    jobs = []
    for e in evidence:
        renderer = (renderers or {}).get(e.family)
        if formats[e.family].vllm_render or (renderer is not None and renderer.refusal(e.messages, e.tools)):
            messages, tools = e.chat_request or (e.messages, e.tools)
            jobs.append(RenderJob(e.key, tokenizer_dirs[e.family], formats[e.family].vllm_tool_parser, messages,
                                  tools, e.prompt_ids, anthropic=e.anthropic_request))
    return jobs


def judge_calls(evidence: Sequence[CallEvidence], renderer: IndependentRenderer | None,
                vllm: Mapping[str, VllmParse],
                vllm_renders: Mapping[str, VllmRender] | None = None) -> tuple[Tally, list[bool | None]]:
    """The tally, and per call whether an independent renderer reproduced its prompt (None: none judged it):
    ``renderers``' where the family has one and renders the request, else vLLM's chat render where it was
    asked for (``render_jobs``)."""
    tally = Tally()
    reproduced: list[bool | None] = []
    for e in evidence:
        tally.calls += 1
        by_vllm = _vllm_render(tally, e, (vllm_renders or {}).get(e.key))
        if renderer is None:
            tally.render_unjudged += by_vllm is None
            reproduced.append(by_vllm)
        else:
            verdict = renderer.judge(e.prompt_ids, e.messages, e.tools, e.previous)
            reproduced.append(None if verdict.how == "refused" else verdict.agrees)
            if verdict.how == "render":
                tally.render_agree_full += 1
            elif verdict.how == "bridge":
                tally.render_agree_bridge += 1
            elif verdict.how == "variant":
                tally.render_format_variants += 1
                tally.details.append(f"{e.family} {e.key}: judges disagree, {verdict.detail}")
            elif verdict.how == "refused" and by_vllm is not None:  # judged by vLLM's render instead
                reproduced[-1] = by_vllm
                tally.details.append(f"{e.family} {e.key}: judged by vLLM's render alone, {verdict.detail}")
            elif verdict.how == "refused":
                tally.render_unjudged += 1
                tally.details.append(f"{e.family} {e.key}: not judged, {verdict.detail}")
            else:
                tally.render_mismatches += 1
                tally.details.append(f"{e.family} {e.key}: render mismatch, {verdict.detail}")
        theirs = vllm.get(e.key)
        if theirs is not None:
            tally.parse_compared += 1
            reference = normal_parse(theirs.reasoning, theirs.content, theirs.tool_calls)
            if theirs.error or reference != e.gateway_parse:
                tally.vllm_parse_mismatches += 1
                why = theirs.error or parse_difference(e.gateway_parse, reference)
                tally.details.append(f"{e.family} {e.key}: vLLM parse differs, {why}")
        if e.intended is not None and e.intended != e.gateway_parse:
            tally.intended_mismatches += 1
            tally.details.append(f"{e.family} {e.key}: the gateway's parse is not what was scripted, "
                                 f"{parse_difference(e.gateway_parse, e.intended)}")
        if e.previous is not None:
            context = e.previous[0] + e.previous[1]
            if e.prompt_ids[:len(context)] == context:
                drift = lost_tokens(context, e.rerender_ids)
                tally.retokenize_drift_tokens += drift
                tally.calls_with_drift += drift > 0
            else:
                tally.break_lost_tokens += lost_tokens(context, e.prompt_ids)
    return tally, reproduced


def _vllm_render(tally: Tally, e: CallEvidence, theirs: VllmRender | None) -> bool | None:
    """Count vLLM's render verdict on the call; whether it reproduced the prompt (None: not judged)."""
    if theirs is None:
        return None
    verdict = render_verdict(e.prompt_ids, e.previous, theirs)
    if verdict.how == "refused":
        tally.details.append(f"{e.family} {e.key}: not judged by vLLM, {verdict.detail}")
        return None
    tally.vllm_render_compared += 1
    tally.vllm_render_agree_full += verdict.how == "render"
    tally.vllm_render_agree_bridge += verdict.how == "bridge"
    if not verdict.agrees:
        tally.vllm_render_mismatches += 1
        tally.details.append(f"{e.family} {e.key}: vLLM render mismatch, {verdict.detail}")
    return verdict.agrees
