"""The conformance matrix: harness x family cells from recorded calls and the judges' tallies (pure).

A cell is one harness's scripted task (``tokentrail harnesses check``'s) on one family's gateway, or the
corpus (row ``corpus``). Its figures:
* calls; token-exact calls: calls whose recorded prompt an independent renderer reproduces (its full render,
  or its bridge over the previous call's prompt ‖ output): ``renderers``' renderer of the family, or where it
  has none vLLM's chat render (``vllm_render.py``); for a family with neither (``--no-vllm``), calls
  whose prompt decodes to the gateway's own render of the request and, where nothing was spliced, is its
  tokenization (the harness check's rule);
* spliced fraction: adjacent pairs where prompt_i ‖ output_i is a token prefix of prompt_{i+1};
* named breaks: pairs that do not extend and that the gateway named (``prefix_breaks``) or the harness
  analysis names (compaction, stripped thinking, ...); an unnamed break fails the cell;
* render format variants: calls whose prompt differs from the judge's only in a header form the format leaves
  open (``conformance/harmony_forms.py``): the judges disagree among themselves there; such a call is not
  token-exact and not a render mismatch, and does not fail its cell;
* parse failures: outputs the gateway's parser could not parse (``ParsedText.errors``) plus outputs where
  vLLM's parser for the family extracts something else (``vllm_parse_mismatches``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.judge import Tally


@dataclass
class Cell:
    harness: str
    family: str
    calls: int = 0
    token_exact: int = 0
    pairs: int = 0
    spliced: int = 0
    named_breaks: list[str] = field(default_factory=list)
    unnamed_breaks: list[str] = field(default_factory=list)
    parse_failures: int = 0
    tally: Tally = field(default_factory=Tally)
    run_failure: str = ""

    @property
    def passed(self) -> bool:
        """Every call token-exact, or differing from the judge only in a header form the format leaves open
        (the judges disagree among themselves there: counted apart, never as token-exact)."""
        return (not self.run_failure and self.calls > 0
                and self.token_exact + self.tally.render_format_variants == self.calls
                and not self.unnamed_breaks and self.tally.vllm_parse_mismatches == 0
                and self.tally.render_mismatches == 0 and self.tally.vllm_render_mismatches == 0
                and self.tally.intended_mismatches == 0)

    def reasons(self) -> list[str]:
        out = [self.run_failure] if self.run_failure else []
        if self.calls and self.token_exact + self.tally.render_format_variants != self.calls:
            out.append(f"{self.calls - self.token_exact - self.tally.render_format_variants} calls not token-exact")
        out += [f"unnamed break {b}" for b in self.unnamed_breaks]
        out += self.tally.details
        return out

    def row(self) -> dict[str, Any]:
        return {"harness": self.harness, "family": self.family, "passed": self.passed, "calls": self.calls,
                "token_exact_calls": self.token_exact, "pairs": self.pairs, "spliced_pairs": self.spliced,
                "named_breaks": self.named_breaks, "parse_failures": self.parse_failures,
                **self.tally.summary(), "reasons": self.reasons()[:20]}


def extends(before: Sequence[int], prompt: Sequence[int]) -> bool:
    return len(before) <= len(prompt) and list(prompt[:len(before)]) == list(before)


def summary(cells: Sequence[Cell], families: Sequence[str], harnesses: Sequence[str]) -> dict[str, Any]:
    calls = sum(c.calls for c in cells)
    return {
        "families": list(families), "harnesses": list(harnesses), "cells": len(cells),
        "cells_passed": sum(c.passed for c in cells), "calls": calls,
        "token_exact_fraction": round(sum(c.token_exact for c in cells) / calls, 4) if calls else 0.0,
        "spliced_fraction": round(sum(c.spliced for c in cells) / max(1, sum(c.pairs for c in cells)), 4),
        "named_breaks": sum(len(c.named_breaks) for c in cells),
        "parse_failures": sum(c.parse_failures for c in cells),
        "vllm_parse_mismatches": sum(c.tally.vllm_parse_mismatches for c in cells),
        "vllm_parses_compared": sum(c.tally.parse_compared for c in cells),
        # Every render judge's: renderers' and vLLM's chat render's (the families it judges: formats.py)
        "render_mismatches": sum(c.tally.render_mismatches + c.tally.vllm_render_mismatches for c in cells),
        "render_mismatches_by_judge": {"renderers": sum(c.tally.render_mismatches for c in cells),
                                       "vllm": sum(c.tally.vllm_render_mismatches for c in cells)},
        "vllm_renders_compared": sum(c.tally.vllm_render_compared for c in cells),
        "render_format_variants": sum(c.tally.render_format_variants for c in cells),
        "render_unjudged": sum(c.tally.render_unjudged for c in cells),
        "retokenize_drift_tokens": sum(c.tally.retokenize_drift_tokens for c in cells),
        "retokenize_drift_by_family": {f: sum(c.tally.retokenize_drift_tokens for c in cells if c.family == f)
                                       for f in families},
        "break_lost_tokens": sum(c.tally.break_lost_tokens for c in cells),
    }


def table(cells: Sequence[Cell]) -> str:
    """The matrix as text: one line per cell, then each failing cell's reasons."""
    head = (f"{'harness':<9} {'family':<12} {'ok':<3} {'calls':>5} {'exact':>5} {'spliced':>7} {'breaks':>6} "
            f"{'parse':>5} {'render':>6} {'variant':>7} {'vllm':>4} {'drift':>6}")
    lines = [head]
    for c in cells:
        lines.append(f"{c.harness:<9} {c.family:<12} {'yes' if c.passed else 'NO':<3} {c.calls:>5} "
                     f"{c.token_exact:>5} {f'{c.spliced}/{c.pairs}':>7} {len(c.named_breaks):>6} "
                     f"{c.parse_failures:>5} {c.tally.render_mismatches + c.tally.vllm_render_mismatches:>6} "
                     f"{c.tally.render_format_variants:>7} "
                     f"{c.tally.vllm_parse_mismatches:>4} "
                     f"{c.tally.retokenize_drift_tokens:>6}")
    for c in cells:
        for reason in ([] if c.passed else c.reasons()[:8]):
            lines.append(f"  {c.harness}/{c.family}: {reason}")
    return "\n".join(lines)
