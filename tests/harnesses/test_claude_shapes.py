"""What Claude Code really sends, against the real gateway on the harness model (issue 18, item 5): its
captured requests replayed with their headers (``anthropic-beta`` list, session header, ``?beta=true``).

- ``count_tokens`` on its first request answers the prompt length the gateway would run;
- a side call under another model name (a small model, thinking with a budget, metadata) is served by the
  mapped model and recorded with the name that was asked;
- its very large tools array (all 21 tools declared in full, 61 K characters) renders whole;
- an image is refused in Anthropic's error shape, and the attempt goes on: nothing accepted is lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from models.reference.harness_corpus import CAPTURED_DIR
from producers.gateway.anthropic_adapter import conversation
from producers.gateway.body import validate
from producers.gateway.models_anthropic import MessagesRequest
from producers.gateway.text_side import ModelTextSide
from producers.sdk import Rollout
from testkit.gateway import running_embedded_gateway
from tests.producers.gateway.helpers import prompts_of, read_records
from tokentrail.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

PASSED_HEADERS = ("anthropic-version", "anthropic-beta", "x-app", "user-agent", "x-claude-code-session-id",
                  "anthropic-dangerous-direct-browser-access")


def _captured(run: str, index: int) -> tuple[dict[str, str], dict[str, Any]]:
    line = json.loads((CAPTURED_DIR / f"{run}.jsonl").read_text().splitlines()[index])
    headers = {k: v for k, v in line["headers"].items() if k in PASSED_HEADERS}
    return headers, line["body"]


def _unary(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    # Not streamed and few output tokens: these calls check what is accepted and recorded, not sampling.
    return {**body, "stream": False, "max_tokens": 8, **changes}


def test_claude_code_request_shapes_are_served_counted_or_refused_clearly(
        kafka_bootstrap: str, tokentrail_settings: Settings, harness_model_dir: Path,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    topics = {"calls_topic": new_topic(partitions=1), "env_topic": new_topic(partitions=1)}
    served = tokentrail_settings.model.harness_name
    # The gateway's own wiring on the variant, as `tokentrail gateway` with TOKENTRAIL_MODEL__SPEC=harness etc.
    settings = tokentrail_settings.model_copy(update={"model": tokentrail_settings.model.model_copy(
        update={"spec": "harness", "dir": harness_model_dir, "name": served})})
    text = ModelTextSide.from_dir(harness_model_dir)
    headers, first = _captured("claude", 0)
    _, all_tools = _captured("claude-refuse", 3)
    side = {"model": "claude-haiku-4-5", "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "metadata": first["metadata"], "system": [{"type": "text", "text": "Summarize in five words.",
                                                       "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "A file hi.txt was written."}]}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with (running_embedded_gateway(settings, spool_dir=tmp_path / "spool", topics=topics,
                                   model_aliases={"*": served}) as gw,
          Rollout(gw.url, task_input={"harness": "claude"}) as rollout,
          httpx.Client(base_url=rollout.anthropic_base_url, timeout=600,
                       headers={**headers, "authorization": f"Bearer {rollout.api_key}"}) as http):
        counted = http.post("/v1/messages/count_tokens", params={"beta": "true"},
                            json={k: v for k, v in first.items() if k not in ("max_tokens", "stream")})
        assert counted.status_code == 200, counted.text
        messages, tools = conversation(validate(MessagesRequest, first))
        assert counted.json() == {"input_tokens": len(text.renderer.render(messages, tools))}

        answered = http.post("/v1/messages", params={"beta": "true"}, json=side)
        assert answered.status_code == 200, answered.text
        assert answered.json()["type"] == "message" and answered.json()["model"] == "claude-haiku-4-5"

        large = http.post("/v1/messages", params={"beta": "true"}, json=_unary(all_tools))
        assert large.status_code == 200, large.text

        pictured = _unary(first, messages=[{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                                                         image]}])
        refused = http.post("/v1/messages", params={"beta": "true"}, json=pictured)
        assert refused.status_code == 400
        assert refused.json() == {"type": "error", "error": {
            "type": "invalid_request_error",
            "message": "content block type 'image' is not supported by this model"}}

        after = http.post("/v1/messages", params={"beta": "true"}, json=_unary(first))  # the attempt goes on
        assert after.status_code == 200, after.text
        finished = rollout.finish("SUCCESS")
    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 3)),
                   key=lambda r: r["call_index"])
    assert finished["call_count"] == 3 and [c["status"] for c in calls] == ["OK"] * 3
    bodies = [json.loads(c["request_json"])["body"] for c in calls]
    # The side call: recorded with the name asked and its thinking budget; served by the mapped model.
    assert bodies[0]["model"] == "claude-haiku-4-5" and bodies[0]["thinking"]["budget_tokens"] == 1024
    assert bodies[0]["metadata"] == first["metadata"]
    assert len(bodies[1]["tools"]) == 21 and bodies[2]["tools"] == first["tools"]
    for prompt, body in zip(prompts_of(calls), bodies, strict=True):
        messages, tools = conversation(validate(MessagesRequest, body))
        assert text.renderer.decode(prompt.tolist()) == text.render_text(messages, tools)  # whole, untruncated
    assert calls[1]["prompt"]["length"] > calls[2]["prompt"]["length"] > 5_000
