"""Token-level prefix relation between adjacent calls, on template shapes that break naive merging."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from processors.prefix import common_prefix_len_concat, prefix_link, prefix_links
from testkit.stages import IM_END, IM_START, NEWLINE, ROLE_IDS, Message, render, sampled_output

ids = st.lists(st.integers(0, 5), max_size=12).map(lambda xs: np.array(xs, dtype=np.uint32))


@given(head=ids, tail=ids, other=ids)
def test_concat_prefix_equals_the_naive_definition(head: np.ndarray, tail: np.ndarray,
                                                   other: np.ndarray) -> None:
    joined = np.concatenate([head, tail])
    naive = 0
    while naive < min(len(joined), len(other)) and joined[naive] == other[naive]:
        naive += 1
    assert common_prefix_len_concat(head, tail, other) == naive


def _a(xs: list[int]) -> np.ndarray:
    return np.array(xs, dtype=np.uint32)


def _conversation(drop_past_reasoning: bool, *,
                  reasoning: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Three calls: user question, tool call, tool result, answer, then a follow-up user turn."""
    messages = [Message("system", [11, 12]), Message("user", [21, 22, 23])]
    prompts, outputs = [], []
    plan = [("assistant", [31, 32], [91, 92]), ("tool", [41, 42, 43], []), ("assistant", [51], [93]),
            ("user", [61, 62], []), ("assistant", [71], [94])]
    for role, content, thought in plan:
        if role != "assistant":
            messages.append(Message(role, content))
            continue
        prompts.append(_a(render(messages, drop_past_reasoning=drop_past_reasoning)))
        outputs.append(_a(sampled_output(content, thought if reasoning else None)))
        messages.append(Message("assistant", content, thought if reasoning else []))
    return prompts, outputs


def test_chatml_history_extends_each_prompt_exactly() -> None:
    prompts, outputs = _conversation(drop_past_reasoning=False)
    links = prefix_links([0, 1, 2], prompts, outputs)
    assert [link["is_prefix"] for link in links] == [True, True]
    # the template adds "\n" after <|im_end|>, the next message follows: still a prefix
    assert prompts[1][links[0]["expected_len"]] == NEWLINE


def test_template_dropping_earlier_reasoning_breaks_the_prefix_where_it_drops() -> None:
    prompts, outputs = _conversation(drop_past_reasoning=True)
    links = prefix_links([0, 1, 2], prompts, outputs)
    # within one user turn the reasoning is kept; after a new user message it is dropped
    assert links[0]["is_prefix"]
    assert not links[1]["is_prefix"]
    # the common prefix stops exactly where the dropped reasoning started (after "<|im_start|>assistant\n"
    # of the first assistant message)
    first_assistant = len(prompts[0]) - 3
    assert links[1]["common_prefix_len"] == first_assistant + 3
    assert links[1]["expected_len"] == len(prompts[1]) + len(outputs[1])


def test_control_tokens_inserted_at_a_boundary_break_the_prefix() -> None:
    # the model stopped on a plain EOS id (not <|im_end|>); the template closes the message with <|im_end|>
    eos = 151_643
    prompt0 = _a(render([Message("user", [21, 22])]))
    output0 = _a([31, 32, eos])
    prompt1 = _a(render([Message("user", [21, 22]), Message("assistant", [31, 32]), Message("user", [23])]))
    link = prefix_link(0, 1, prompt0, output0, prompt1)
    assert not link["is_prefix"]
    assert link["common_prefix_len"] == len(prompt0) + 2 and prompt1[len(prompt0) + 2] == IM_END


def test_retokenized_history_is_not_a_token_prefix_even_when_the_text_is() -> None:
    # "Alla" sampled as [2009, 64] but re-encoded from text as the single id [90633]
    prompt0 = _a([IM_START, ROLE_IDS["assistant"], NEWLINE])
    output0 = _a([2009, 64, IM_END])
    prompt1 = _a([IM_START, ROLE_IDS["assistant"], NEWLINE, 90633, IM_END, NEWLINE])
    link = prefix_link(0, 1, prompt0, output0, prompt1)
    assert not link["is_prefix"] and link["common_prefix_len"] == 3


def test_empty_outputs_and_prompts() -> None:
    empty = _a([])
    assert prefix_link(0, 1, empty, empty, _a([1]))["is_prefix"]
    assert prefix_link(0, 1, _a([1, 2]), empty, _a([1]))["common_prefix_len"] == 1
    assert not prefix_link(0, 1, _a([1, 2]), empty, _a([1]))["is_prefix"]


EOS = 151_643
turn_plans = st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()), min_size=2,
                      max_size=6)


@given(plan=turn_plans, drop=st.booleans())
def test_prefix_breaks_exactly_where_templates_drop_reasoning_or_insert_control_tokens(
        plan: list[tuple[bool, bool, bool, bool]], drop: bool) -> None:
    """Each turn: (a new user message first?, reasoning?, stopped on plain EOS?, a tool result after?)."""
    messages = [Message("system", [11]), Message("user", [21, 22])]
    prompts, outputs, expected = [], [], []
    visible_reasoning = False  # some reasoning of this user turn is rendered in the current context
    for i, (new_user, thinks, eos_stop, tool) in enumerate(plan):
        if new_user and i > 0:
            messages.append(Message("user", [23 + i]))
            breaks_reasoning = drop and visible_reasoning
            visible_reasoning = False
        else:
            breaks_reasoning = False
        if i > 0:
            expected.append(not (plan[i - 1][2] or breaks_reasoning))
        prompts.append(_a(render(messages, drop_past_reasoning=drop)))
        content, thought = [31 + i, 32], [91 + i] if thinks else []
        out = sampled_output(content, thought)
        outputs.append(_a([*out[:-1], EOS] if eos_stop else out))
        messages.append(Message("assistant", content, thought))
        visible_reasoning = visible_reasoning or thinks
        if tool:
            messages.append(Message("tool", [41 + i]))
    links = prefix_links(list(range(len(plan))), prompts, outputs)
    assert [link["is_prefix"] for link in links] == expected
    for link, p, o, nxt in zip(links, prompts, outputs, prompts[1:], strict=False):
        joined = np.concatenate([p, o])
        naive = 0
        while naive < min(len(joined), len(nxt)) and joined[naive] == nxt[naive]:
            naive += 1
        assert link["common_prefix_len"] == naive
