"""``max_tokens`` as users of a gateway in front of a smaller model expect (issue 18): a harness asks for
what its vendor's model allows (Claude Code 64000, Pi 16384) and is served with min(requested, context left
after the prompt, the gateway's cap); the record keeps both numbers; only a prompt that leaves no room at
all is refused, in the caller's protocol, and the next call is served."""

from __future__ import annotations

import anthropic
import openai
import orjson
import pytest

from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import read_records

MODEL = "tokentrail-tiny"
USER = [{"role": "user", "content": "What is the value of fox?"}]


def test_oversized_max_tokens_are_served_with_what_fits_and_recorded(
        start_gateway, topics: dict[str, str], tokentrail_settings: Settings) -> None:
    with start_gateway(max_tokens_limit=32) as gw, Rollout(gw.url) as rollout:
        claude = anthropic.Anthropic(base_url=rollout.anthropic_base_url, api_key=rollout.api_key, max_retries=0)
        with claude.messages.stream(model=MODEL, max_tokens=64000, messages=USER) as stream:  # Claude Code's
            reply = stream.get_final_message()  # main call (the SDK streams a budget this large)
        pi = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0)
        for _ in pi.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=16384, stream=True):
            pass
        pi.chat.completions.create(model=MODEL, messages=USER, max_tokens=8)  # under the cap: as asked
        # Within 5 tokens of the context (8192): the output budget is what is left, not the cap.
        near_full = pi.completions.create(model=MODEL, prompt=[5] * 8187, max_tokens=1000)
        with pytest.raises(anthropic.BadRequestError, match="no room for output") as refused:
            claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x " * 9000}])
        assert refused.value.body["error"]["type"] == "invalid_request_error"
        after = claude.messages.create(model=MODEL, max_tokens=3, messages=USER)
    assert reply.usage.output_tokens <= 32 and after.usage.output_tokens <= 3
    assert near_full.usage.completion_tokens <= 5
    calls = sorted((r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 5)),
                   key=lambda r: r["call_index"])
    served = [(c["sampling"]["max_tokens"], orjson.loads(c["sampling"]["extra_json"]).get("requested_max_tokens"))
              for c in calls]
    assert served == [(32, 64000), (32, 16384), (8, None), (5, 1000), (3, None)]
    assert all(c["status"] == "OK" for c in calls)
