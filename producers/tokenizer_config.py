"""Facts read from a tokenizer's configuration (its ``tokenizer.json`` as a dict) that the exact
tokenization shortcuts rely on: which normalizer steps run, whether post-processing adds ids, whether ids
decode piece by piece (``piecewise_decoding``) and for which texts decoding gives back what was encoded
(``round_trip_rule``)."""

from __future__ import annotations

from typing import Any

# Post-processors that add nothing when asked for no special tokens (all encoding here asks so).
PLAIN_POST_PROCESSORS = frozenset({"ByteLevel", "TemplateProcessing", "RobertaProcessing", "BertProcessing"})


def normalizer_steps(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The steps of a ``tokenizer.json`` normalizer (none, one, or a Sequence's)."""
    if node is None:
        return []
    return list(node.get("normalizers") or []) if node.get("type") == "Sequence" else [node]


def nfc_only(node: dict[str, Any] | None) -> bool:
    """Whether the normalizer is NFC and nothing else (it then leaves ASCII text unchanged)."""
    steps = normalizer_steps(node)
    return bool(steps) and all(step.get("type") == "NFC" for step in steps)


def leaves_ascii_alone(node: dict[str, Any] | None) -> bool:
    """Whether the normalizer leaves ASCII text unchanged by construction: none at all, or NFC alone."""
    return not normalizer_steps(node) or nfc_only(node)


def adds_nothing(node: dict[str, Any] | None) -> bool:
    """Whether the post-processor adds no ids when asked for no special tokens."""
    if node is None:
        return True
    if node.get("type") == "Sequence":
        return all(adds_nothing(child) for child in node.get("processors", []))
    return node.get("type") in PLAIN_POST_PROCESSORS


def piecewise_decoding(config: dict[str, Any]) -> bool:
    """Whether a tokenizer (its ``tokenizer.json`` as a dict) decodes ids piecewise: its decoder is
    byte-level alone, so every id stands for fixed bytes and ``decode`` is the (lossy) UTF-8 decoding
    of the ids' bytes joined. Then ids whose bytes are valid UTF-8 decode piece by piece:
    ``decode(a + b) == decode(a) + decode(b)``, and a decoded text without U+FFFD shows the bytes were
    valid (lossy decoding marks every invalid sequence with it). A spliced prompt made of such pieces,
    each known to decode to its part of the rendered text, decodes to the whole text: proven without
    decoding the earlier prompts again."""
    model = config.get("model") or {}
    return ((config.get("decoder") or {}).get("type") == "ByteLevel"
            and model.get("type") == "BPE" and not model.get("byte_fallback"))


# Pre-tokenizers that only cut text into pieces, keeping every character (unless told to remove some).
_SPLITTING_PRE_TOKENIZERS = {"Split", "Digits", "Punctuation"}


def round_trip_rule(config: dict[str, Any]) -> str | None:
    """For which texts ``decode(encode(text)) == text`` holds by construction, for a tokenizer (its
    ``tokenizer.json`` as a dict) that decodes piecewise: ``"any"``, ``"ascii"`` (an NFC normalizer
    leaves ASCII alone, other text maybe not), or None (not provable: decode and compare).

    Encoding splits out added tokens (each decodes to its own text: checked on the tokenizer itself,
    ``ChatRenderer._added_tokens_round_trip`` in producers/rendering.py); the rest is normalized (a no-op by
    the rule), cut into pieces keeping every character, mapped byte by byte to the 256 characters of the
    byte-level alphabet (every one in the vocabulary, so BPE never drops a byte or emits an unknown token)
    and merged by BPE,
    whose tokens' strings join to exactly those characters. Decoding maps the same characters back to the
    same bytes, so valid UTF-8 text comes back unchanged. Anything that adds, removes or rewrites
    characters on the way (a prefix space, stripping added tokens, subword markers, padding,
    truncation, a model id whose token is not the added token's text) makes the rule None."""
    from tokenizers.pre_tokenizers import ByteLevel

    model = config.get("model") or {}
    vocab: dict[str, int] = model.get("vocab") or {}
    if not piecewise_decoding(config) or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
            or config.get("truncation") or config.get("padding"):
        return None
    if not all(ch in vocab for ch in ByteLevel.alphabet()) or len(set(vocab.values())) != len(vocab):
        return None
    added = config.get("added_tokens") or []
    by_id = {int(t["id"]): t["content"] for t in added}
    if any(t.get("lstrip") or t.get("rstrip") for t in added) \
            or any(by_id[i] != token for token, i in vocab.items() if i in by_id):
        return None
    if not _keeps_characters(config.get("pre_tokenizer")) or not adds_nothing(config.get("post_processor")):
        return None
    return _normalized_texts(config.get("normalizer"))


def _keeps_characters(node: dict[str, Any] | None) -> bool:
    """A byte-level pre-tokenizer (exactly one ByteLevel, no prefix space) that only cuts text."""
    steps = (node or {}).get("pretokenizers", []) if (node or {}).get("type") == "Sequence" else [node]
    byte_level = [s for s in steps if s and s.get("type") == "ByteLevel"]
    return len(byte_level) == 1 and not byte_level[0].get("add_prefix_space") and all(
        s is not None and (s.get("type") == "ByteLevel" or (
            s.get("type") in _SPLITTING_PRE_TOKENIZERS and s.get("behavior") != "Removed"))
        for s in steps)


def _normalized_texts(node: dict[str, Any] | None) -> str | None:
    """Which texts the normalizer leaves unchanged: "any" (none), "ascii" (NFC alone), else None."""
    if not normalizer_steps(node):
        return "any"
    return "ascii" if nfc_only(node) else None
