"""Runs in vLLM's own virtual environment: vLLM's tool and reasoning parsers over a JSON batch (stdin -> stdout).

Not imported by tokentrail (it imports only vLLM and the standard library); ``vllm_parsers.py`` starts it with
vLLM's Python. Each job names a tokenizer directory, the family's parser names as vLLM's command line takes
them (``--tool-call-parser``, ``--reasoning-parser``; harmony for gpt-oss), the request's tools and the model
output (text and token ids). The parser is the one vLLM's serving layer composes for a chat completion
(``ParserManager.get_parser``) and is called the way the non-streaming chat path calls it (``parse``).
Output: one JSON object, ``{"results": [{"key", "reasoning", "content", "tool_calls": [{"name",
"arguments"}], "error"}]}``, in the jobs' order. A batch may also carry ``renders``: vLLM's chat render of
requests (``vllm_render_worker.py``), answered as ``"renders"`` in the same object, so one run pays vLLM's
import once.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import Any


def _parse(job: dict[str, Any], tokenizers: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager
    from vllm.tokenizers import get_tokenizer

    path = job["tokenizer"]
    if path not in tokenizers:
        tokenizers[path] = get_tokenizer(path)
    tokenizer = tokenizers[path]
    parser_cls = ParserManager.get_parser(tool_parser_name=job["tool_parser"],
                                          reasoning_parser_name=job.get("reasoning_parser"), enable_auto_tools=True,
                                          is_harmony=bool(job.get("harmony")), tokenizer=tokenizer)
    tools = job.get("tools") or None
    request = ChatCompletionRequest(model="conformance", messages=[{"role": "user", "content": "-"}], tools=tools,
                                    tool_choice="auto" if tools else "none")
    parser = parser_cls(tokenizer, tools=request.tools)
    ids = job.get("ids")
    if ids is None:
        ids = tokenizer.encode(job["text"], add_special_tokens=False)
    if job.get("prompt_ids"):
        parser.set_prompt_token_ids(job["prompt_ids"])
    reasoning, content, calls = parser.parse(job["text"], request, enable_auto_tools=bool(tools),
                                             model_output_token_ids=ids)
    return {"reasoning": reasoning, "content": content,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []]}


def main() -> int:
    batch = json.load(sys.stdin)
    tokenizers: dict[str, Any] = {}
    results = []
    for job in batch.get("jobs", []):
        try:
            row = _parse(job, tokenizers)
            row["error"] = None
        except Exception as exc:  # one job's failure is that job's result, never the batch's
            row = {"reasoning": None, "content": None, "tool_calls": [],
                   "error": f"{type(exc).__name__}: {exc} | {traceback.format_exc(limit=3)[-600:]}"}
        results.append({"key": job.get("key"), **row})
    out: dict[str, Any] = {"results": results}
    if batch.get("renders"):
        from vllm_render_worker import render_batch  # this file's directory is first on the path

        out["renders"] = asyncio.run(render_batch(batch["renders"]))
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
