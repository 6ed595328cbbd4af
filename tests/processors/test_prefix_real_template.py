"""Prefix links and merging with a real byte-level BPE tokenizer and the project's real chat template.

The template (models.reference.template.CHAT_TEMPLATE) renders reasoning for the last assistant message
only, so a later turn drops earlier reasoning; re-rendering history from text can also re-segment
sampled ids. The assembler must flag exactly those breaks, and merged samples must stop there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from processors.assembler import RolloutAssembly
from processors.credit import CreditConfig, compute_credits
from processors.rewards import RewardConfig, compute_rewards
from processors.samples import SampleConfig, build_samples
from testkit.stages import AttemptSpec, Turn, attempt_events


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from models.reference.template import CHAT_TEMPLATE, MARKER_TOKENS, SPECIAL_TOKENS

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["The value of fox is red. Look up the key with the lookup tool.",
              '{"name": "lookup", "arguments": {"key": "fox"}}', "I should call the tool first.",
              "system user assistant tool answer"] * 40
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def _render(tokenizer: Any, messages: list[dict[str, Any]]) -> np.ndarray:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return np.array(tokenizer.encode(text, add_special_tokens=False), dtype=np.uint32)


def _sampled(tokenizer: Any, text: str) -> np.ndarray:
    """Ids as an engine samples them after the generation prompt: the text, then <|im_end|>."""
    ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return np.array(ids, dtype=np.uint32)


def _rollout(turns: list[Turn]) -> dict:
    state = RolloutAssembly("r1")
    out = []
    for name, rec in attempt_events(AttemptSpec("r1", "a1", turns, group_id="g")):
        out += state.accept(name, rec).rollouts
    (rollout,) = out
    return rollout


def test_real_template_prefix_holds_then_breaks_when_reasoning_is_dropped(tokenizer: Any) -> None:
    call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "fox"}}\n</tool_call>'
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Answer with one word."},
                                      {"role": "user", "content": 'What is "fox"?'}]
    turns = []
    # call 0: reasoning + tool call
    p0 = _render(tokenizer, messages)
    o0 = _sampled(tokenizer, "<think>\nI should call the tool first.\n</think>\n\n" + call)
    turns.append(Turn(p0, o0))
    messages += [{"role": "assistant", "content": "", "reasoning_content": "I should call the tool first.",
                  "tool_calls": [{"type": "function", "function": {"name": "lookup",
                                                                    "arguments": '{"key": "fox"}'}}]},
                 {"role": "tool", "content": "red"}]
    # call 1: the previous assistant message is still the last one: its reasoning is rendered
    p1 = _render(tokenizer, messages)
    o1 = _sampled(tokenizer, "<think>\nThe value is red.\n</think>\n\nred")
    turns.append(Turn(p1, o1))
    messages += [{"role": "assistant", "content": "red", "reasoning_content": "The value is red."},
                 {"role": "user", "content": "And again?"}]
    # call 2: now the first assistant message is not the last: its reasoning is dropped
    p2 = _render(tokenizer, messages)
    turns.append(Turn(p2, _sampled(tokenizer, "red")))

    rollout = _rollout(turns)
    links = rollout["prefix_links"]
    assert [link["is_prefix"] for link in links] == [True, False]
    # the break is where call 0's reasoning used to be: right after its "<|im_start|>assistant\n"
    assert links[1]["common_prefix_len"] == len(p0)

    group = {"event_id": "g-ev", "group_id": "g", "status": "FULL", "created_at_us": 1,
             "rollout_event_ids": [rollout["event_id"]]}
    scores = [{"event_id": "s", "rollout_id": "r1", "rollout_event_id": rollout["event_id"], "group_id": "g",
               "verifier_name": "v", "verifier_version": "1", "scope": "ROLLOUT", "status": "OK",
               "raw_json": "1.0", "error": None, "duration_ms": 0.0, "created_at_us": 1}]
    rcfg = RewardConfig(metrics=[{"name": "m", "verifier": "v"}], filters={"zero_variance": False},
                        normalize={"method": "none"})
    rewards = compute_rewards(group, [rollout], scores, rcfg)
    ccfg = CreditConfig()
    credits = compute_credits([rollout], rewards, ccfg)
    samples = build_samples(group, [rollout], rewards, credits, ccfg, SampleConfig(merge=True))
    assert [s["kind"] for s in samples] == ["MERGED", "CALL"]
    merged = samples[0]
    assert [(s["call_index"], s["source"]) for s in merged["segments"]] == [
        (0, "PROMPT"), (0, "OUTPUT"), (1, "PROMPT"), (1, "OUTPUT")]
    assert np.frombuffer(merged["input_ids"], np.uint32).tolist() == np.concatenate([p1, o1]).tolist()


def test_retokenized_output_breaks_the_prefix_even_though_the_text_matches(tokenizer: Any) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look up the key."}]
    p0 = _render(tokenizer, messages)
    merged_ids = tokenizer.encode("fox", add_special_tokens=False)
    byte_ids = [tokenizer.convert_tokens_to_ids(c) for c in "fox"]  # the same text, other segmentation
    assert len(merged_ids) == 1 and merged_ids != byte_ids
    o0 = np.array([*byte_ids, tokenizer.convert_tokens_to_ids("<|im_end|>")], dtype=np.uint32)
    assert tokenizer.decode(o0[:-1]) == "fox"
    messages += [{"role": "assistant", "content": "fox"}, {"role": "user", "content": "Again."}]
    p1 = _render(tokenizer, messages)  # history re-rendered from text
    rollout = _rollout([Turn(p0, o0), Turn(p1, _sampled(tokenizer, "fox"))])
    (link,) = rollout["prefix_links"]
    assert not link["is_prefix"] and link["common_prefix_len"] == len(p0)
