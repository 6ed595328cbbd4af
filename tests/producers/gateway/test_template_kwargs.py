"""``chat_template_kwargs`` (vLLM's extension of the chat API) reach the chat template in every prefix mode:
the reference template, like Qwen3's, opens an empty reasoning block when ``enable_thinking`` is false.
Variables the template does not read are dropped; names the gateway sets itself are refused."""

from __future__ import annotations

import openai
import orjson
import pytest

from models.reference.task import task_messages
from producers.sdk import Rollout
from tokentrail.settings import Settings

from .helpers import prompts_of, read_records
from .test_openai_calls import MODEL

NO_THINKING = {"enable_thinking": False, "not_read_by_the_template": 1}
EMPTY_REASONING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.mark.parametrize("prefix_mode", ["splice", "retokenize", "upstream"])
def test_template_kwargs_change_the_prompt_as_the_template_says(
    start_gateway, topics: dict[str, str], text_side, tokentrail_settings: Settings, prefix_mode: str
) -> None:
    messages = task_messages("fox")
    with start_gateway(prefix_mode=prefix_mode) as gw, Rollout(gw.url, task_input={}) as rollout:
        client = rollout.openai_client()
        first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, seed=3,
                                               extra_body={"chat_template_kwargs": NO_THINKING})
        later = [*messages, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the owl?"}]
        client.chat.completions.create(model=MODEL, messages=later, max_tokens=8, seed=4,
                                       extra_body={"chat_template_kwargs": NO_THINKING})
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, seed=5)  # no kwargs
    calls = [r for _, r in read_records(tokentrail_settings, topics["calls_topic"], 3,
                                        where={"rollout_id": rollout.rollout_id})]
    prompts = prompts_of(calls)
    renderer = text_side.renderer
    for conversation, prompt in zip((messages, later), prompts, strict=False):
        text = renderer.decode(prompt.tolist())
        assert text.endswith(EMPTY_REASONING)
        assert text == renderer.render_text(conversation, template_kwargs={"enable_thinking": False})
    assert orjson.loads(calls[0]["request_json"])["body"]["chat_template_kwargs"] == NO_THINKING
    assert prompts[0].tolist() == renderer.render(messages, template_kwargs={"enable_thinking": False})
    assert prompts[2].tolist() == renderer.render(messages)  # the same conversation without them
    assert renderer.decode(prompts[2].tolist()).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("prefix_mode", ["splice", "upstream"])
def test_template_kwargs_the_gateway_sets_itself_are_refused(start_gateway, prefix_mode: str) -> None:
    with start_gateway(prefix_mode=prefix_mode) as gw, Rollout(gw.url, task_input={}) as rollout:
        client = rollout.openai_client()
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=task_messages("owl"), max_tokens=4,
                                           extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    error = refused.value.body
    assert isinstance(error, dict)
    assert "chat_template_kwargs may not set add_generation_prompt" in error["message"]
    assert error["code"] == "template_error" and error["param"] == "messages"
