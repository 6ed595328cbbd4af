"""Facts read from a tokenizer's configuration (its ``tokenizer.json`` as a dict) that the exact
tokenization shortcuts rely on: which normalizer steps run, and whether post-processing adds ids."""

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
