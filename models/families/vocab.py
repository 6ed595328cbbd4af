"""A family's real vocabulary as a standard ``tokenizer.json``.

The BPE ranks and special tokens come from ``quicktok-v1``'s bundled data (``quicktok/data/*.vocab`` and
``*.special``: a little-endian u32 count, then per entry a u16 byte length, the token's bytes and a u32
rank; specials are a u32 count, then u32 id, u16 length and the text). The ranks are written as a tiktoken
rank file (base64 token, rank: the format OpenAI publishes, whose sha256 names the vocabulary) and
converted by transformers' ``TikTokenConverter`` into a byte-level BPE ``tokenizer.json``, to which the
family's pre-tokenizer split pattern, normalizer, post-processor and special tokens are added as the
family's published tokenizer has them.

The conversion is checked, not trusted: ``check_against_quicktok`` encodes a sample with the built
tokenizer and with quicktok's own (independent, C) encoder and refuses the build on any difference.
"""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

from models.families.spec import FamilySpec


def quicktok_data_dir() -> Path:
    import quicktok

    return Path(quicktok.__file__).parent / "data"


def read_ranks(path: Path) -> dict[bytes, int]:
    """A quicktok ``.vocab`` file: token bytes -> rank."""
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    ranks: dict[bytes, int] = {}
    offset = 4
    while offset < len(data):
        (length,) = struct.unpack_from("<H", data, offset)
        offset += 2
        token = data[offset:offset + length]
        offset += length
        (ranks[token],) = struct.unpack_from("<I", data, offset)
        offset += 4
    if len(ranks) != count or sorted(ranks.values()) != list(range(count)):
        raise ValueError(f"{path}: expected {count} distinct ranks 0..{count - 1}")
    return ranks


def read_specials(path: Path) -> dict[str, int]:
    """A quicktok ``.special`` file: special token text -> id."""
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    specials: dict[str, int] = {}
    offset = 4
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, offset)
        offset += 6
        specials[data[offset:offset + length].decode("utf-8")] = token_id
        offset += length
    if offset != len(data):
        raise ValueError(f"{path}: {len(data) - offset} trailing bytes after {count} special tokens")
    return specials


def tiktoken_text(ranks: dict[bytes, int]) -> str:
    """The ranks as a tiktoken rank file (one ``base64 rank`` line each, in rank order)."""
    return "".join(f"{base64.b64encode(token).decode()} {rank}\n"
                   for token, rank in sorted(ranks.items(), key=lambda item: item[1]))


def build_tokenizer(spec: FamilySpec, rank_file: Path, specials: dict[str, int]) -> Any:
    """The family's tokenizer (a ``tokenizers.Tokenizer``) from its tiktoken rank file and specials."""
    from tokenizers import AddedToken, normalizers, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tokenizer = TikTokenConverter(vocab_file=str(rank_file), pattern=spec.split_pattern).converted()
    if spec.nfc:
        tokenizer.normalizer = normalizers.NFC()
    base = tokenizer.get_vocab_size()
    ordered = _renamed(_one_name_per_id(specials), spec.renamed_specials)
    if [i for _, i in ordered] != list(range(base, base + len(ordered))):
        raise ValueError(f"{spec.name}: special token ids are not contiguous after the {base} ranks")
    # One at a time, in id order: each gets the next id, so ids are the family's.
    for text, token_id in ordered:
        tokenizer.add_tokens([AddedToken(text, special=text not in spec.plain_added_tokens, normalized=False)])
        if tokenizer.token_to_id(text) != token_id:
            raise ValueError(f"{spec.name}: {text} got id {tokenizer.token_to_id(text)}, expected {token_id}")
    if spec.bos_token is not None:  # as the family's tokenizer: encode() with special tokens prepends BOS
        bos_id = specials[spec.bos_token]
        tokenizer.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{spec.bos_token}:0 $A:0",
                                          pair=f"{spec.bos_token}:0 $A:0 {spec.bos_token}:1 $B:1",
                                          special_tokens=[(spec.bos_token, bos_id)]),
        ])
    return tokenizer


def _one_name_per_id(specials: dict[str, int]) -> list[tuple[str, int]]:
    """(text, id) in id order, one text per id: where quicktok lists a reserved placeholder beside a named
    token for the same id (o200k_harmony's 200018: ``<|endofprompt|>``), the named one."""
    chosen: dict[int, str] = {}
    for text, token_id in specials.items():
        if token_id not in chosen or chosen[token_id].startswith("<|reserved_"):
            chosen[token_id] = text
    return sorted(((text, token_id) for token_id, text in chosen.items()), key=lambda item: item[1])


def _renamed(ordered: list[tuple[str, int]], renamed: dict[int, str]) -> list[tuple[str, int]]:
    if not renamed:
        return ordered
    out: list[tuple[str, int]] = []
    reserved = 0
    for text, token_id in ordered:
        if token_id in renamed:
            text = renamed[token_id]
        elif text.startswith("<|reserved_special_token_"):
            text = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
        out.append((text, token_id))
    return out


# Text that exercises the split pattern: contractions, digits, CJK, emoji, code, whitespace runs, marks.
CHECK_SAMPLE = (
    "Hello, world! I'm here; they'll see 12345 tokens.\n\n  def f(x):\n\treturn {\"a\": [1, 2.5e-3]}\r\n"
    "中文的句子，还有日本語のテキスト。 Ünïcödé ÀÉÎ naïve café — 🙂👍🏽 \u0301\u00e9\n"
    "   trailing spaces   \n\n\n$HOME/.config/x.json  --flag=value  a/b/c  ALLCAPS CamelCase mIxEd\n"
    "<tool call> not special text 0x1F 3.14159 ... !!! ??? \u200b\u2063 end"
)


def check_against_quicktok(spec: FamilySpec, tokenizer: Any, extra: str = "") -> int:
    """Encode ``CHECK_SAMPLE`` (+ ``extra``) with the built tokenizer and quicktok; the number of ids
    compared. Raises on the first difference (the conversion or the split pattern is wrong)."""
    import quicktok

    reference = quicktok.get_encoding(spec.quicktok_encoding)
    text = CHECK_SAMPLE + extra
    for line in [text, *text.splitlines(keepends=True)]:
        if spec.nfc:
            import unicodedata

            line = unicodedata.normalize("NFC", line)
        ours = tokenizer.encode(line, add_special_tokens=False).ids
        theirs = list(reference.encode(line))
        if ours != theirs:
            at = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                      min(len(ours), len(theirs)))
            raise ValueError(f"{spec.name}: tokenizer.json and quicktok differ at id {at} of {line!r}: "
                             f"{ours[at:at + 5]} vs {theirs[at:at + 5]}")
    return len(tokenizer.encode(text, add_special_tokens=False).ids)
