"""vLLM's own parsers (and chat render) as the reference for ours: one subprocess in vLLM's environment per batch.

vLLM lives in another virtual environment (``.venv-vllm``: its torch and transformers pins are not ours), so
its parsers run there (``vllm_worker.py``) over a JSON batch; importing vLLM costs tens of seconds, so every
output of a run goes in one batch.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.formats import FamilyFormat
from conformance.vllm_render import RenderJob, VllmRender

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("vllm_worker.py")
DEFAULT_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@dataclass(frozen=True)
class ParseJob:
    key: str
    format: FamilyFormat
    tokenizer_dir: Path
    text: str
    ids: Sequence[int] | None = None
    tools: Sequence[dict[str, Any]] | None = None
    prompt_ids: Sequence[int] | None = None


@dataclass(frozen=True)
class VllmParse:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]]  # {"name", "arguments" (JSON text)}
    error: str | None


class VllmUnavailable(RuntimeError):
    pass


def vllm_python() -> Path:
    """vLLM's interpreter: ``TOKENTRAIL_VLLM_PYTHON`` or the repository's ``.venv-vllm``."""
    path = Path(os.environ.get("TOKENTRAIL_VLLM_PYTHON", DEFAULT_PYTHON))
    if not path.exists():
        raise VllmUnavailable(f"no vLLM interpreter at {path} (make setup-vllm, or set TOKENTRAIL_VLLM_PYTHON)")
    return path


def parse_with_vllm(jobs: Sequence[ParseJob], *, timeout_s: float = 600.0,
                    env: dict[str, str] | None = None) -> dict[str, VllmParse]:
    """key -> what vLLM's parser for the job's family extracts from its output."""
    return judge_with_vllm(jobs, (), timeout_s=timeout_s, env=env)[0]


def judge_with_vllm(jobs: Sequence[ParseJob], renders: Sequence[RenderJob], *, timeout_s: float = 600.0,
                    env: dict[str, str] | None = None) -> tuple[dict[str, VllmParse], dict[str, VllmRender]]:
    """(key -> vLLM's parse of the job's output, key -> vLLM's chat render of the render job's request)."""
    if not jobs and not renders:
        return {}, {}
    batch = {"jobs": [{"key": j.key, "tokenizer": str(j.tokenizer_dir), "tool_parser": j.format.vllm_tool_parser,
                       "reasoning_parser": j.format.vllm_reasoning_parser, "harmony": j.format.harmony,
                       "text": j.text, "ids": None if j.ids is None else [int(i) for i in j.ids],
                       "tools": list(j.tools or []) or None,
                       "prompt_ids": None if j.prompt_ids is None else [int(i) for i in j.prompt_ids]}
                      for j in jobs],
             "renders": [{"key": r.key, "model": str(r.model_dir), "tool_call_parser": r.tool_parser,
                          "messages": r.messages, "tools": list(r.tools or []) or None,
                          "prompt_ids": [int(i) for i in r.prompt_ids], "anthropic": r.anthropic} for r in renders]}
    run_env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    run_env.pop("PYTHONPATH", None)  # vLLM's environment, not ours
    done = subprocess.run([str(vllm_python()), str(WORKER)], input=json.dumps(batch), capture_output=True,
                          text=True, timeout=timeout_s, env=run_env, cwd=str(REPO))
    if done.returncode != 0:
        raise VllmUnavailable(f"vLLM's parser worker failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    parses = {r["key"]: VllmParse(r["reasoning"], r["content"], r["tool_calls"], r["error"]) for r in out["results"]}
    rendered = {r["key"]: VllmRender(r["prompt_ids"], r["text"], r["gateway_text"], r["error"])
                for r in out.get("renders", [])}
    return parses, rendered
