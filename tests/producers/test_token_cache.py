"""The prefix token cache: every id it returns equals full tokenization, on the real template (whose
history rewrite drops earlier reasoning) and on adversarial texts; where a cut could be wrong it is
refused (tokens spanning the cut, position-dependent pre-tokenizers, stripping added tokens)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers

from models.reference.task import LOOKUP_TOOL, lookup_call, task_messages
from producers.rendering import ChatRenderer
from producers.token_cache import PrefixTokenCache, ascii_twin

from .trained import train_bpe

TOOLS = [LOOKUP_TOOL]
PIECES = ["<|im_start|>", "<|im_end|>", "<|im_", "end|>", "<tool_call>", "</tool_call>", "<think>",
          "</think>", "<", "|", ">", " ", "  ", "\n", "\n\n", "hello", " world", "fox", "é", "日本", "🙂",
          "'s", "123", "<|endoftext|>", "tool", "assistant\n", "user\n", "\t"]


def _full(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def _conversation() -> list[list[dict[str, Any]]]:
    """The message lists a harness sends on successive calls of a multi-turn tool task: each call adds
    turns; assistant turns carry reasoning, which the template keeps only for the last assistant turn
    (so earlier calls' text is rewritten, not just extended)."""
    history = [*task_messages("fox")]
    calls = [list(history)]
    history += [{**lookup_call("fox"), "reasoning_content": "I should look it up."},
                {"role": "tool", "tool_call_id": "call_0", "content": "red"}]
    calls.append(list(history))
    history += [{"role": "assistant", "content": "red", "reasoning_content": "The tool said red."},
                {"role": "user", "content": 'And "owl"? Take your time, think it through.'}]
    calls.append(list(history))
    history += [{**lookup_call("owl", "call_1"), "reasoning_content": "Another lookup."},
                {"role": "tool", "tool_call_id": "call_1", "content": "blue " * 200}]
    calls.append(list(history))
    return calls


def test_real_template_multi_turn_is_token_exact(renderer: ChatRenderer) -> None:
    cache = PrefixTokenCache(renderer.tokenizer.backend_tokenizer, ["<|im_start|>", "<|im_end|>", "<think>"])
    assert cache.cuts_enabled
    texts = [renderer.render_text(messages, TOOLS) for messages in _conversation()]
    # The template rewrites history: call 2 does not extend call 1 (call 1's reasoning is dropped).
    assert not texts[2].startswith(texts[1])
    for text in texts:
        assert cache.encode(text).tolist() == renderer.encode(text)
        assert cache.encode(text).tolist() == renderer.encode(text)  # the identical text again
    stats = cache.stats()
    assert stats.prefix_hits == len(texts) - 1 and stats.exact_hits == len(texts) and stats.misses == 1
    assert stats.tokens_reused > stats.tokens_encoded


def test_renderer_cached_path_equals_apply_chat_template(renderer: ChatRenderer) -> None:
    for messages in _conversation():
        for _ in range(2):
            assert renderer.render_cached(messages, TOOLS).tolist() == renderer.render(messages, TOOLS)
            assert renderer.encode_cached(renderer.render_text(messages, TOOLS)) == renderer.render(messages, TOOLS)
    # Rollouts of a group share the task prompt: a new rollout reuses it, then its text diverges.
    other = [*task_messages("fox"), {**lookup_call("cow"), "reasoning_content": "cow?"},
             {"role": "tool", "tool_call_id": "call_0", "content": "pink"}]
    before = renderer.token_cache.stats().prefix_hits
    assert renderer.render_cached(other, TOOLS).tolist() == renderer.render(other, TOOLS)
    assert renderer.token_cache.stats().prefix_hits == before + 1


def test_random_texts_are_token_exact(renderer: ChatRenderer) -> None:
    tokenizer = renderer.tokenizer.backend_tokenizer
    cache = PrefixTokenCache(tokenizer, ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>",
                                         "</think>"], max_bytes=400_000)
    rng = random.Random(7)
    texts: list[str] = []
    for _ in range(1500):
        if texts and rng.random() < 0.7:  # a continuation or a rewrite of an earlier text
            base = rng.choice(texts)
            cut = len(base) if rng.random() < 0.5 else rng.randrange(len(base) + 1)
            text = base[:cut] + "".join(rng.choice(PIECES) for _ in range(rng.randrange(12)))
        else:
            text = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 40)))
        texts.append(text)
        assert cache.encode(text).tolist() == _full(tokenizer, text), repr(text)
    stats = cache.stats()
    assert stats.prefix_hits > 500 and stats.bytes_held <= 400_000


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=30), st.lists(st.sampled_from(PIECES), max_size=30),
       st.integers(min_value=0, max_value=400))
def test_any_continuation_is_token_exact(renderer: ChatRenderer, head: list[str], tail: list[str], cut: int) -> None:
    tokenizer = renderer.tokenizer.backend_tokenizer
    cache = PrefixTokenCache(tokenizer, ["<|im_start|>", "<|im_end|>", "<tool_call>", "</think>"])
    first = "".join(head)
    second = first[: min(cut, len(first))] + "".join(tail)
    assert cache.encode(first).tolist() == _full(tokenizer, first)
    assert cache.encode(second).tolist() == _full(tokenizer, second)


# ------------------------------------------------------------------ tokenizers where a naive cut is wrong
def _naive(tokenizer: Tokenizer, prefix: str, rest: str) -> list[int]:
    return _full(tokenizer, prefix) + _full(tokenizer, rest)


def test_an_added_token_spanning_the_cut_is_not_reused() -> None:
    # "<a>" is the anchor; "x<a>b" is another added token that, once complete, wins the match.
    tokenizer = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False),
                       [AddedToken("<a>", normalized=False), AddedToken("x<a>b", normalized=False)],
                       decoders.ByteLevel())
    cache = PrefixTokenCache(tokenizer, ["<a>"])
    assert cache.cuts_enabled
    first, second = "hello x<a>", "hello x<a>b world"
    assert _naive(tokenizer, first, "b world") != _full(tokenizer, second)  # a blind cut would be wrong
    assert cache.encode(first).tolist() == _full(tokenizer, first)
    assert cache.encode(second).tolist() == _full(tokenizer, second)
    assert cache.stats().prefix_hits == 0
    third = "hello x<a> the fox"  # no spanning token: the cut is taken
    assert cache.encode(third).tolist() == _full(tokenizer, third)
    assert cache.stats().prefix_hits == 1


def test_prefix_space_per_piece_is_token_exact() -> None:
    # ByteLevel adds its prefix space to every piece between added tokens, so cuts stay exact.
    tokenizer = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=True), [AddedToken("<a>", normalized=False)],
                       decoders.ByteLevel())
    cache = PrefixTokenCache(tokenizer, ["<a>"])
    assert cache.cuts_enabled
    for first, second in [("fox<a>", "fox<a>red"), ("the <a> owl<a>", "the <a> owl<a>  blue <a>x")]:
        assert cache.encode(first).tolist() == _full(tokenizer, first)
        assert cache.encode(second).tolist() == _full(tokenizer, second)
    assert cache.stats().prefix_hits == 2


def test_position_dependent_pre_tokenizer_disables_cuts() -> None:
    # Metaspace with prepend_scheme="first" prefixes only the piece at offset 0: a cut would be wrong.
    tokenizer = train_bpe(pre_tokenizers.Metaspace(prepend_scheme="first"), [AddedToken("<a>", normalized=False)],
                       decoders.Metaspace(prepend_scheme="first"))
    cache = _refuses_cuts(tokenizer, "fox is<a>", "red owl")
    assert cache.encode("fox is<a>red owl").tolist() == _full(tokenizer, "fox is<a>red owl")
    assert cache.stats().prefix_hits == 0 and cache.stats().exact_hits == 1  # identical text still reused


def test_stripping_added_token_disables_cuts() -> None:
    # An rstrip token swallows the whitespace after it, which lies beyond the cut.
    tokenizer = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False),
                       [AddedToken("<a>", normalized=False, rstrip=True)], decoders.ByteLevel())
    _refuses_cuts(tokenizer, "fox<a>", "   red")


def _refuses_cuts(tokenizer: Tokenizer, first: str, rest: str) -> PrefixTokenCache:
    """A tokenizer where cutting after ``first`` would be wrong: the cache must not cut, and stay exact."""
    second = first + rest
    assert _naive(tokenizer, first, rest) != _full(tokenizer, second)
    cache = PrefixTokenCache(tokenizer, ["<a>"])
    assert not cache.cuts_enabled
    assert cache.encode(first).tolist() == _full(tokenizer, first)
    assert cache.encode(second).tolist() == _full(tokenizer, second)
    assert cache.stats().prefix_hits == 0
    return cache


def test_memory_is_bounded_and_superseded_turns_are_dropped(renderer: ChatRenderer) -> None:
    tokenizer = renderer.tokenizer.backend_tokenizer
    cache = PrefixTokenCache(tokenizer, ["<|im_start|>", "<|im_end|>"], max_bytes=60_000)
    text = ""
    for turn in range(40):  # one growing conversation: each turn replaces the one before
        text += f"<|im_start|>user\nturn {turn} " + "fox " * 20 + "<|im_end|>\n<|im_start|>assistant\n"
        assert cache.encode(text).tolist() == _full(tokenizer, text)
        text += "red<|im_end|>\n"
    stats = cache.stats()
    assert stats.bytes_held <= 60_000 and stats.entries <= 2
    assert stats.prefix_hits >= 30


def test_the_byte_budget_bounds_many_distinct_texts_and_counts_what_they_hold(renderer: ChatRenderer) -> None:
    # Distinct conversations, each its own entry: the cache keeps the most recent that fit in its bytes,
    # and what it counts covers the texts, ids and cuts it holds (tracemalloc sees no more than that).
    import tracemalloc

    tokenizer = renderer.tokenizer.backend_tokenizer
    cache = PrefixTokenCache(tokenizer, ["<|im_start|>", "<|im_end|>"], max_bytes=200_000)
    texts = [f"<|im_start|>user\ncase {n} " + "fox jumps " * 40 + "<|im_end|>\n<|im_start|>assistant\n"
             for n in range(300)]
    for text in texts[:20]:  # fills part of the budget before measuring
        cache.encode(text)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    counted = cache.stats().bytes_held
    for text in texts[20:40]:
        assert cache.encode(text).tolist() == _full(tokenizer, text)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown <= cache.stats().bytes_held - counted + 4096  # the count is not an undercount
    for text in texts[40:]:
        cache.encode(text)
    stats = cache.stats()
    assert 0 < stats.bytes_held <= 200_000 and 0 < stats.entries < 300
    assert cache.encode(texts[-1]).tolist() == _full(tokenizer, texts[-1]) and cache.stats().exact_hits == 1


# ------------------------------------------------------------------ the render memo
def test_render_memo_returns_what_the_template_renders(renderer: ChatRenderer) -> None:
    from producers.render_caches import RenderMemo

    for messages in _conversation():
        fresh = renderer.tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                                       add_generation_prompt=True)
        assert renderer.render_text(messages, TOOLS) == fresh
        assert renderer.render_text(messages, TOOLS) == fresh  # memoized
        assert renderer.render_text(messages, TOOLS, add_generation_prompt=False) != fresh
    memo = RenderMemo()
    messages = task_messages("fox")
    assert memo.key(messages, TOOLS, True) is not None
    # Values whose JSON would not tell them apart (a tuple renders unlike a list; NaN like None) are not keyed.
    assert memo.key([{"role": "user", "content": ("a", "b")}], None, True) is None
    assert memo.key([{"role": "user", "content": "x", "n": float("nan")}], None, True) is None
    # A key differs wherever the template could see a difference: order, int vs float, the generation prompt.
    a, b = {"role": "user", "content": "x", "k": 1}, {"role": "user", "k": 1, "content": "x"}
    assert memo.key([a], None, True) != memo.key([b], None, True)
    assert memo.key([{**a, "k": 1.0}], None, True) != memo.key([a], None, True)
    assert memo.key([a], None, True) != memo.key([a], None, False)
    # Keys are 16-byte digests, not the conversation's JSON, and differ between processes (keyed).
    assert len(memo.key(messages, TOOLS, True) or b"") == 16
    assert RenderMemo().key(messages, TOOLS, True) != memo.key(messages, TOOLS, True)
    small = RenderMemo(max_bytes=2_000)
    for n in range(100):
        small.put(f"k{n}".encode(), "t" * 300)
    assert small.get(b"k0") is None and small.get(b"k99") == "t" * 300
    assert 0 < small.memory()["bytes"] <= 2_000 and small.memory()["entries"] < 100


def test_a_fresh_text_is_cut_only_at_anchors_the_tokenizer_sees_whole() -> None:
    # New text is tokenized in pieces split after each anchor; "x<a>b" swallows the anchor inside it, so
    # no piece may end there, while the free-standing anchors are cut points for later texts.
    tokenizer = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False),
                       [AddedToken("<a>", normalized=False), AddedToken("x<a>b", normalized=False)],
                       decoders.ByteLevel())
    cache = PrefixTokenCache(tokenizer, ["<a>"])
    text = "the fox x<a>b is <a> red <a>and x<a>b"
    assert cache.encode(text).tolist() == _full(tokenizer, text)
    longer = text[: text.index("red <a>") + len("red <a>")] + "blue owl"  # shares up to the second anchor
    assert cache.encode(longer).tolist() == _full(tokenizer, longer)
    assert cache.stats().prefix_hits == 1 and cache.stats().tokens_reused > 0


# ------------------------------------------------------------------ ASCII text skips an NFC normalizer
ascii_pieces = [p for p in PIECES if p.isascii()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(ascii_pieces), min_size=1, max_size=30))
def test_ascii_text_gives_the_same_ids_without_the_nfc_normalizer(renderer: ChatRenderer, parts: list[str]) -> None:
    tokenizer = renderer.tokenizer.backend_tokenizer
    twin = ascii_twin(tokenizer)
    assert twin is not None and twin.normalizer is None
    text = "".join(parts)
    assert _full(twin, text) == _full(tokenizer, text)


def test_other_text_keeps_the_normalizer(renderer: ChatRenderer) -> None:
    tokenizer = renderer.tokenizer.backend_tokenizer
    cache = PrefixTokenCache(tokenizer, ["<|im_start|>", "<|im_end|>"])
    twin = ascii_twin(tokenizer)
    assert twin is not None
    for text in ["cafe\u0301 <|im_end|>", "<|im_start|>user\ncafe\u0301<|im_end|>\n<|im_start|>a\u0301"]:
        assert _full(twin, text) != _full(tokenizer, text)  # NFC composes the accent: the twin would be wrong
        assert cache.encode(text).tolist() == _full(tokenizer, text)


def test_only_an_nfc_normalizer_is_skipped(renderer: ChatRenderer) -> None:
    tokenizer = Tokenizer.from_str(renderer.tokenizer.backend_tokenizer.to_str())
    tokenizer.normalizer = normalizers.Lowercase()  # changes ASCII: skipping it would change ids
    assert ascii_twin(tokenizer) is None
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.NFKC()])
    assert ascii_twin(tokenizer) is None
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC()])
    assert ascii_twin(tokenizer) is not None
    cache = PrefixTokenCache(tokenizer, ["<|im_start|>", "<|im_end|>"])
    assert cache.encode("Hello <|im_end|> World").tolist() == _full(tokenizer, "Hello <|im_end|> World")
