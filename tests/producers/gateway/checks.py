"""Checks every recorded call must pass: identity, token-exact prompt, decodable output, engine logprobs."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from producers.gateway.service import GATEWAY_VERSION
from producers.gateway.text_side import ModelTextSide
from schemas.ids import call_id
from schemas.tokens import IdArray

from .helpers import engine_logprobs, is_token_prefix, output_of, prompts_of


def check_calls(
    calls: list[dict[str, Any]],
    *,
    text_side: ModelTextSide,
    model: Any,
    rollout_id: str,
    attempt_id: str,
    conversations: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
    prefix_mode: str,
) -> list[IdArray]:
    """``conversations[i]`` is call i's request in the internal chat form (messages, tools).

    Returns the reconstructed prompt ids."""
    assert [c["call_index"] for c in calls] == list(range(len(calls)))
    prompts = prompts_of(calls)
    for i, (call, prompt) in enumerate(zip(calls, prompts, strict=True)):
        assert call["call_id"] == call["event_id"] == call_id(rollout_id, attempt_id, i)
        assert (call["rollout_id"], call["attempt_id"], call["status"]) == (rollout_id, attempt_id, "OK")
        assert call["prefix_mode"] == prefix_mode
        v = call["versions"]
        assert v["tokenizer_fingerprint"] == text_side.tokenizer_fingerprint
        assert v["chat_template_fingerprint"] == text_side.chat_template_fingerprint
        assert v["parser_version"] == text_side.parser_version and v["engine"].startswith("embedded/")
        assert v["adapter_version"].endswith(f" gateway/{GATEWAY_VERSION}") and v["upstream"].startswith("embedded:")
        assert v["policy_version"] == 0 and call["logprob_kind"] == "PROCESSED"  # the embedded engine's
        t = call["timings"]
        assert 0 <= t["queue_ms"] <= t["first_token_ms"] <= t["total_ms"] and t["received_at_us"] > 0

        # The prompt is exactly what the recorded tokenizer and template give for the request: the
        # template's text, encoded. Splicing may put an earlier call's exact ids where the text repeats
        # what that call ran and sampled; what follows them is still the text, encoded.
        messages, tools = conversations[i]
        renderer = text_side.renderer
        assert renderer.decode(prompt.tolist()) == text_side.render_text(messages, tools)
        if prefix_mode == "retokenize" or call["spliced_outputs"] == 0:
            assert prompt.tolist() == renderer.render(messages, tools)
        else:
            base = _longest_earlier_sequence(calls[:i], prompts[:i], prompt)
            if base is not None and call["spliced_outputs"] == 1:  # only that prefix was spliced
                rest = prompt[base:].tolist()
                assert rest == renderer.encode(renderer.decode(rest))

        # The sampled ids decode to what the harness was told, and carry the engine's logprobs.
        output_ids, logprobs = output_of(call)
        assert len(output_ids) == len(logprobs) > 0
        response = orjson.loads(call["response_json"])
        parsed = text_side.parse(text_side.decode(output_ids.tolist()))
        assert _returned_message(response) == _parsed_message(parsed)
        np.testing.assert_allclose(logprobs, engine_logprobs(model, call, prompt), atol=2e-3, rtol=0)
    for later in calls[1:]:
        if later["prompt"]["ids"] is None:  # delta-encoded: on an earlier call of the same attempt
            assert later["prompt"]["base_call_id"] in {c["call_id"] for c in calls[: later["call_index"]]}
    return prompts


def _longest_earlier_sequence(calls: list[dict[str, Any]], prompts: list[IdArray], prompt: IdArray) -> int | None:
    """The length of the longest earlier prompt ‖ output that is a token prefix of ``prompt``."""
    sequences = [sequence_of(c, p) for c, p in zip(calls, prompts, strict=True)]
    return max((len(s) for s in sequences if is_token_prefix(s, prompt)), default=None)


def sequence_of(call: dict[str, Any], prompt: IdArray) -> IdArray:
    return np.concatenate([prompt, output_of(call)[0]])


def prefix_holds(calls: list[dict[str, Any]], prompts: list[IdArray], i: int) -> bool:
    """Whether call i's prompt ‖ output is a token-level prefix of call i+1's prompt."""
    return is_token_prefix(sequence_of(calls[i], prompts[i]), prompts[i + 1])


def _parsed_message(parsed: Any) -> dict[str, Any]:
    return {
        "content": parsed.content or "",
        "reasoning": parsed.reasoning or "",
        "tool_calls": [(c.name, orjson.loads(c.arguments)) for c in parsed.tool_calls],
    }


def _returned_message(response: dict[str, Any]) -> dict[str, Any]:
    """Content, reasoning and tool calls of a recorded response in either protocol."""
    if response.get("type") == "message":  # Anthropic
        blocks = response["content"]
        return {
            "content": "".join(b["text"] for b in blocks if b["type"] == "text"),
            "reasoning": "".join(b["thinking"] for b in blocks if b["type"] == "thinking"),
            "tool_calls": [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"],
        }
    message = response["choices"][0]["message"]
    return {
        "content": message.get("content") or "",
        "reasoning": message.get("reasoning_content") or "",
        "tool_calls": [
            (c["function"]["name"], orjson.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []
        ],
    }
