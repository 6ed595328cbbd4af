"""Answer match: compare the final answer in the model's output with the task's expected answer.

Modes: ``exact`` (normalized text), ``regex`` (the expected answer is a pattern the extracted answer
must fully match), ``numeric`` (parsed numbers within a tolerance), ``auto`` (numeric when the
expected answer is a number, else exact). The expected answer is read from the task input
(``answer_field``, a dotted path; a list means any of them); a task may override the mode with
``answer_mode``. The text checked is the rollout's ``final_output_text`` (the last successful call's
response) or, with ``source: "artifact:<path>"``, a value from the attempt's final artifacts.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from processors.jsonutil import get_path
from processors.verifiers.base import RolloutVerifier, RolloutView
from processors.verifiers.extract import extract_answer, normalize_text, numbers_equal, parse_number

Mode = Literal["auto", "exact", "regex", "numeric"]
Extractor = Literal["auto", "boxed", "answer_tag", "answer_line", "last_line", "last_number", "full"]


class AnswerMatchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Mode = "auto"
    answer_field: str = "answer"
    mode_field: str = "answer_mode"
    extract: Extractor = "auto"
    source: str = Field(default="final_output_text", pattern=r"^(final_output_text|artifact:.+)$")
    case_sensitive: bool = False
    rel_tol: float = Field(default=1e-6, ge=0)
    abs_tol: float = Field(default=1e-9, ge=0)


class AnswerMatch(RolloutVerifier):
    name: ClassVar[str] = "answer_match"
    version: ClassVar[str] = "1.0"
    Options = AnswerMatchOptions
    default_timeout_s: ClassVar[float] = 5.0

    def verify(self, view: RolloutView) -> dict[str, Any]:
        opts: AnswerMatchOptions = self.options  # type: ignore[assignment]
        expected = get_path(view.task_input, opts.answer_field, None)
        if expected is None:
            raise ValueError(f"task input has no expected answer at {opts.answer_field!r}")
        candidates = [str(e) for e in (expected if isinstance(expected, list) else [expected])]
        mode = str(view.task_input.get(opts.mode_field) or opts.mode)
        if mode not in ("auto", "exact", "regex", "numeric"):
            raise ValueError(f"task asks for unknown answer mode {mode!r}")
        if opts.source == "final_output_text":
            text = view.final_output_text
        else:
            found = get_path(view.final_artifacts, opts.source.split(":", 1)[1], None)
            text = "" if found is None else str(found)
        extracted = extract_answer(text, opts.extract)
        results = [self._match(mode, extracted, c) for c in candidates]
        correct = any(ok for ok, _ in results)
        used = next((m for ok, m in results if ok), results[0][1])
        return {"correct": correct, "score": 1.0 if correct else 0.0, "mode": used, "extracted": extracted,
                "expected": expected}

    def _match(self, mode: str, extracted: str | None, expected: str) -> tuple[bool, str]:
        opts: AnswerMatchOptions = self.options  # type: ignore[assignment]
        if mode == "auto":
            mode = "numeric" if parse_number(expected) is not None else "exact"
        if extracted is None:
            return False, mode
        if mode == "regex":
            flags = 0 if opts.case_sensitive else re.IGNORECASE
            return re.fullmatch(expected, extracted.strip(), flags) is not None, mode
        if mode == "numeric":
            got, want = parse_number(extracted), parse_number(expected)
            if got is None:  # "x = 42 apples": fall back to the last number in the answer
                last = extract_answer(extracted, "last_number")
                got = parse_number(last) if last is not None else None
            if want is None:
                raise ValueError(f"expected answer {expected!r} is not a number")
            return got is not None and numbers_equal(got, want, opts.rel_tol, opts.abs_tol), mode
        same = normalize_text(extracted, opts.case_sensitive) == normalize_text(expected, opts.case_sensitive)
        return same, mode
