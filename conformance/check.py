"""Judge the calls a gateway recorded for one family: render (renderers), parse (vLLM), drift (a plain re-render).

Input is what the record holds and what the gateway's own text side makes of it, one ``CallEvidence`` per
call in call order per rollout; output is a ``Tally`` per family (``judge.py`` says what each count means).
The vLLM parses come in one batch for all calls (``vllm_parsers.py``), so a run pays vLLM's import once.
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


def parse_jobs(evidence: Sequence[CallEvidence], formats: Mapping[str, FamilyFormat],
               tokenizer_dirs: Mapping[str, Path]) -> list[ParseJob]:
    return [ParseJob(e.key, formats[e.family], tokenizer_dirs[e.family], e.output_text,
                     ids=e.output_ids, tools=e.tools, prompt_ids=e.prompt_ids) for e in evidence]


def judge_calls(evidence: Sequence[CallEvidence], renderer: IndependentRenderer | None,
                vllm: Mapping[str, VllmParse]) -> tuple[Tally, list[bool | None]]:
    """The tally, and per call whether the independent renderer reproduced its prompt (None: no renderer)."""
    tally = Tally()
    reproduced: list[bool | None] = []
    for e in evidence:
        tally.calls += 1
        if renderer is None:
            tally.render_unjudged += 1
            reproduced.append(None)
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
