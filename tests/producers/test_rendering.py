"""The renderer's chat template kwargs on the built model: they reach the template, are memoized apart,
carry through splicing, and may not set the template's reserved inputs."""

from __future__ import annotations

import pytest

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.rendering import ChatRenderer

TOOLS = [LOOKUP_TOOL]


def test_template_kwargs_reach_the_template_and_its_memo(renderer: ChatRenderer) -> None:
    from producers.rendered_prompt import PriorCall, RenderError
    from producers.template_variables import template_variables

    messages = task_messages("fox")
    variables = renderer.template_variables
    assert variables is not None and "enable_thinking" in variables
    assert not variables & {"messages", "tools", "add_generation_prompt", "raise_exception"}
    plain = renderer.render_text(messages)
    off = renderer.render_text(messages, template_kwargs={"enable_thinking": False})
    assert off == plain + "<think>\n\n</think>\n\n"  # as Qwen3's template does
    assert renderer.render_text(messages) == plain  # memoized apart
    assert renderer.render_text(messages, template_kwargs={"enable_thinking": True, "other": 1}) == plain
    assert renderer.template_kwargs({"enable_thinking": False, "other": 1}) == {"enable_thinking": False}
    assert renderer.render(messages, template_kwargs={"enable_thinking": False}) == renderer.encode(off)
    first = renderer.render_spliced(messages, TOOLS, [], {"enable_thinking": False})
    later = [*messages, {"role": "assistant", "content": "red"}, {"role": "user", "content": "and?"}]
    spliced = renderer.render_spliced(later, TOOLS, [PriorCall(0, first.prompt_ids, renderer.encode("red"))],
                                      {"enable_thinking": False})
    assert renderer.decode(spliced.prompt_ids) == renderer.render_text(later, TOOLS,
                                                                       template_kwargs={"enable_thinking": False})
    for reserved in ({"messages": []}, {"add_generation_prompt": False}, {"tools": None}):
        with pytest.raises(RenderError, match="chat_template_kwargs may not set"):
            renderer.render_text(messages, template_kwargs=reserved)
    # Undeclared variables are the template's inputs; names it sets, and helpers it is given, are not.
    assert template_variables("{% set x = 1 %}{{ x }}{{ y }}{{ raise_exception('no') }}{{ messages }}") == {"y"}
    assert template_variables("{% generation %}{{ y }}{% endgeneration %}") is None  # unknown to plain Jinja
