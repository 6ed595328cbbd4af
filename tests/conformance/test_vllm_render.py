"""vLLM's render as a judge (conformance/vllm_render.py): its verdicts on a prompt, pure. A prompt agrees when it is
vLLM's ids, or where the gateway spliced the previous call's prompt ‖ output, when it is vLLM's text with the new
turn tokenized as vLLM tokenizes it; one changed token, a splice whose tail differs, or text that differs is a
mismatch; a request vLLM refuses is not judged. (vLLM itself on the Qwen3-Coder corpus: test_vllm_parsers.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from conformance.check import CallEvidence, judge_calls, render_jobs
from conformance.formats import FORMATS
from conformance.judge import RenderVerdict
from conformance.vllm_render import VllmRender, render_verdict

# previous prompt [1, 2], sampled output [3, 4]: vLLM re-tokenizes the output as [34]
PREVIOUS = ([1, 2], [3, 4])


def test_the_same_ids_agree_and_one_changed_token_does_not() -> None:
    assert render_verdict([1, 2, 5], None, VllmRender([1, 2, 5], "t", "t", None)).how == "render"
    verdict = render_verdict([1, 9, 5], None, VllmRender([1, 2, 5], "t", "u", None))
    assert not verdict.agrees and verdict.how == "mismatch" and "token 1 of 3/3" in verdict.detail


def test_a_spliced_prompt_agrees_on_text_and_on_the_new_turn_tokens() -> None:
    spliced = [1, 2, 3, 4, 7, 8]
    assert render_verdict(spliced, PREVIOUS, VllmRender([1, 2, 34, 7, 8], "t", "t", None)).how == "bridge"
    # the new turn tokenized otherwise, or different text, or no splice at all: mismatches
    assert render_verdict(spliced, PREVIOUS, VllmRender([1, 2, 34, 78], "t", "t", None)).how == "mismatch"
    assert render_verdict(spliced, PREVIOUS, VllmRender([1, 2, 34, 7, 8], "t", "u", None)).how == "mismatch"
    assert render_verdict([1, 2, 3, 5, 7, 8], PREVIOUS, VllmRender([1, 2, 34, 7, 8], "t", "t", None)).how == "mismatch"


def test_a_request_vllm_refuses_is_not_judged() -> None:
    verdict = render_verdict([1], None, VllmRender(None, None, None, "ValueError: no"))
    assert verdict.how == "refused" and not verdict.agrees and "ValueError" in verdict.detail


def _evidence(key: str, prompt: list[int], previous: tuple[list[int], list[int]] | None = None) -> CallEvidence:
    return CallEvidence(key=key, family="qwen3-coder", messages=[], tools=None, prompt_ids=prompt, output_ids=[3, 4],
                        output_text="", gateway_parse={}, rerender_ids=prompt, previous=previous)


def test_where_renderers_has_no_renderer_vllms_render_decides_token_exactness_and_counts() -> None:
    calls = [_evidence("r/0", [1, 2]), _evidence("r/1", [1, 2, 3, 4, 7, 8], PREVIOUS), _evidence("r/2", [1, 9]),
             _evidence("r/3", [5])]
    renders = {"r/0": VllmRender([1, 2], "a", "a", None), "r/1": VllmRender([1, 2, 34, 7, 8], "b", "b", None),
               "r/2": VllmRender([1, 2], "a", "c", None)}  # r/3: not rendered (--no-vllm, or another family)
    tally, reproduced = judge_calls(calls, None, {}, renders)
    assert reproduced == [True, True, False, None]
    assert (tally.vllm_render_compared, tally.vllm_render_agree_full, tally.vllm_render_agree_bridge,
            tally.vllm_render_mismatches, tally.render_unjudged) == (3, 1, 1, 1, 1)
    assert [d for d in tally.details if "vLLM render mismatch" in d] and tally.render_mismatches == 0


class _RefusingRenderer:
    """renderers' Llama 3 on Codex's request (two system messages): it will not render, so it cannot judge."""

    def refusal(self, messages: object, tools: object) -> str:
        return "tools_in_user_message=True requires the first non-system message to be 'user'"

    def judge(self, *args: object) -> RenderVerdict:
        return RenderVerdict(False, "refused", f"renderers' llama-3 refuses the request: {self.refusal(*args[1:3])}")


def test_a_call_renderers_refuses_goes_to_vllms_render_and_is_judged_there() -> None:
    calls = [dataclasses.replace(_evidence(f"c/{i}", [1, 2]), family="llama3") for i in range(2)]
    jobs = render_jobs(calls, FORMATS, {"llama3": Path("/m")}, {"llama3": _RefusingRenderer()})
    assert [j.key for j in jobs] == ["c/0", "c/1"]  # llama3 asks for no vLLM render of its own
    assert render_jobs(calls, FORMATS, {"llama3": Path("/m")}) == []
    renders = {"c/0": VllmRender([1, 2], "a", "a", None), "c/1": VllmRender([1, 3], "a", "b", None)}
    tally, reproduced = judge_calls(calls, _RefusingRenderer(), {}, renders)
    assert reproduced == [True, False] and tally.render_unjudged == 0
    assert (tally.vllm_render_compared, tally.vllm_render_mismatches) == (2, 1)
    # without vLLM's render (--no-vllm) the call stays unjudged, as before
    tally, reproduced = judge_calls(calls[:1], _RefusingRenderer(), {}, {})
    assert reproduced == [None] and tally.render_unjudged == 1
