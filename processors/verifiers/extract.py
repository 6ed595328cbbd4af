"""Pulling a final answer out of model text, and comparing answers (shared by the answer verifiers)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)

EXTRACTORS = ("auto", "boxed", "answer_tag", "answer_line", "last_line", "last_number", "full")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{") - 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def extract_answer(text: str, method: str = "auto") -> str | None:
    """The answer part of ``text``; auto tries boxed, <answer>, 'answer:' line, then the last line."""
    if method == "full":
        return text.strip()
    if method in ("auto", "boxed"):
        boxed = last_boxed(text)
        if boxed is not None or method == "boxed":
            return boxed
    if method in ("auto", "answer_tag"):
        tags = _ANSWER_TAG.findall(text)
        if tags or method == "answer_tag":
            return tags[-1].strip() if tags else None
    if method in ("auto", "answer_line"):
        lines = [m.group(1).strip() for m in _ANSWER_LINE.finditer(text)]
        if lines or method == "answer_line":
            return lines[-1] if lines else None
    if method == "last_number":
        numbers = _NUMBER.findall(text)
        return numbers[-1] if numbers else None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def normalize_text(value: str, case_sensitive: bool = False) -> str:
    value = " ".join(value.strip().split())
    value = value.strip("$").strip().rstrip(".").strip()
    return value if case_sensitive else value.casefold()


def parse_number(value: str) -> float | None:
    """A number written as 1,234 / -3.5 / 1e-3 / 3/4 / 50% (the percent sign is dropped)."""
    text = value.strip().strip("$").replace(" ", "").rstrip(".").rstrip("%")
    if not text:
        return None
    match = _NUMBER.fullmatch(text)
    if match is None:
        found = _NUMBER.findall(text)
        if len(found) != 1:
            return None
        text = found[0]
    text = text.replace(",", "").replace(" ", "")
    try:
        number = float(Fraction(text)) if "/" in text else float(text)
    except (ValueError, ZeroDivisionError):
        return None
    return number if math.isfinite(number) else None


def numbers_equal(a: float, b: float, rel_tol: float, abs_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
