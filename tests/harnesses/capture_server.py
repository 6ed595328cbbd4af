"""A stand-in model server that records every request a harness sends and answers it minimally.

Used to see what real agent harnesses (Claude Code, Codex CLI, Pi, OpenClaw) send, before and apart
from the gateway: each request (method, path, query, headers with key values redacted, JSON body) is
appended as one JSON line to the capture file, and answered with a short, protocol-valid reply:

- Anthropic ``POST /v1/messages`` (Claude Code adds ``?beta=true``): a streamed SSE message
  (message_start, content_block_start, ping, content_block_delta text_delta, content_block_stop,
  message_delta with stop_reason end_turn, message_stop), or one JSON message when not streamed;
  ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``.
- OpenAI Responses ``POST /v1/responses`` (Codex): the streamed events Codex's parser reads
  (codex-rs/codex-api/src/sse/responses.rs: response.created, response.output_item.added,
  response.output_text.delta, response.output_item.done, response.completed with usage), with the
  other events of the public stream in between; or one JSON response when not streamed.
- OpenAI chat completions ``POST /v1/chat/completions`` (Pi, OpenClaw): streamed
  chat.completion.chunk events and ``data: [DONE]`` (a usage chunk when stream_options asks), or
  one chat.completion.
- ``GET /v1/models`` (and ``/models``): a list with ``capture-model`` and the model names seen so far.
- Anything else: recorded, answered 404 with an error body.

Each JSONL record also has ``reply``: the status and what was sent back (the Anthropic content blocks,
the Responses output items, the chat message), so a harness's next request can be compared with it.
Replies are text by default; ``reply_for`` may answer a call with a ``ToolCall`` (function or freeform
tool, in the protocol's streamed form) or a ``Refusal`` (an HTTP error in the protocol's error shape);
``reasoning`` adds a thinking block / reasoning item (with a signature / encrypted_content) to every reply
whose request asks for reasoning. Request bodies sent gzip or zstd compressed are decoded. Token counts
in the replies are estimates (characters / 4); nothing here tokenizes.

Run: ``python -m tests.harnesses.capture_server --out calls.jsonl [--port 0] [--reply TEXT]``; it
prints ``listening on http://127.0.0.1:PORT`` once it accepts connections. In Python:
``with CaptureServer(path) as server: server.base_url``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

REDACTED = "<redacted>"
# Header names whose values are credentials. Any header whose name contains one of these words too.
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "cookie", "proxy-authorization"})
SECRET_WORDS = ("key", "token", "secret", "auth")
DEFAULT_REPLY = "hi"


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    """The headers with every credential's value replaced by ``<redacted>`` (scheme kept: ``Bearer <redacted>``)."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower in SECRET_HEADERS or any(word in lower for word in SECRET_WORDS):
            scheme = value.split(" ", 1)[0] if " " in value else ""
            out[name] = f"{scheme} {REDACTED}" if scheme.lower() in ("bearer", "basic") else REDACTED
        else:
            out[name] = value
    return out


def _decode_body(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.lower().strip()
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "zstd":
        from backports import zstd  # backports.zstd ships in .venv; stdlib compression.zstd from 3.14

        return zstd.decompress(raw)
    return raw


def _estimate_tokens(body: Any) -> int:
    return max(1, len(json.dumps(body, ensure_ascii=False)) // 4)


def _sse(event: str | None, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _chunks(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


@dataclass(frozen=True)
class ToolCall:
    """A reply that calls one of the harness's tools instead of answering in text.

    ``arguments`` is a dict for a function tool (sent as JSON) or a string for a freeform (``custom``) tool."""

    name: str
    arguments: dict[str, Any] | str
    custom: bool = False

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Refusal:
    """A reply that refuses the call: HTTP ``status`` with the protocol's error body carrying ``message``."""

    status: int
    message: str
    kind: str = "invalid_request_error"


Reply = str | ToolCall | Refusal


def _refuse(refusal: Refusal, anthropic: bool) -> Response:
    if anthropic:
        body: dict[str, Any] = {"type": "error", "error": {"type": refusal.kind, "message": refusal.message}}
    else:
        body = {"error": {"type": refusal.kind, "message": refusal.message, "param": None, "code": None}}
    return JSONResponse(body, status_code=refusal.status)


def has_tool_results(body: dict[str, Any]) -> bool:
    """Whether a request already carries a tool's result (Anthropic tool_result, Responses *_output, chat tool)."""
    for message in body.get("messages") or []:
        if message.get("role") == "tool":
            return True
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return True
    items = body.get("input")
    return isinstance(items, list) and any(
        isinstance(i, dict) and str(i.get("type", "")).endswith("_call_output") for i in items)


class Recorder:
    """Appends one JSON line per request to ``path`` (thread-safe) and keeps them in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            record["seq"] = len(self.records)
            self.records.append(record)
            with self.path.open("a") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")


def build_app(recorder: Recorder, reply: str = DEFAULT_REPLY, model: str = "capture-model",
              reply_for: Callable[[dict[str, Any]], Reply] | None = None,
              reasoning: str | None = None) -> Starlette:
    """The capture app. ``reply_for(record)`` may choose the reply per request, a text or a ToolCall
    (default: the text ``reply``). With ``reasoning``, every reply starts with a reasoning part when the
    request asks for one: an Anthropic ``thinking`` block with a signature (its text left out when
    ``thinking.display`` is ``omitted``) when ``thinking`` is enabled or adaptive, and a Responses
    ``reasoning`` item (summary text and ``encrypted_content``) when the request has ``reasoning``."""
    models_seen: list[str] = [model]

    async def record(request: Request) -> dict[str, Any]:
        raw = await request.body()
        encoding = request.headers.get("content-encoding", "")
        entry: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": redact_headers(dict(request.headers)),
            "body_bytes": len(raw),
        }
        if encoding:
            entry["content_encoding"] = encoding
        try:
            raw = _decode_body(raw, encoding)
        except Exception as exc:
            entry["decode_error"] = repr(exc)
        if raw:
            try:
                entry["body"] = json.loads(raw)
            except ValueError:
                entry["body_text"] = raw.decode("utf-8", "replace")
        body = entry.get("body")
        if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"] not in models_seen:
            models_seen.append(body["model"])
        return entry

    def done(entry: dict[str, Any], answer: dict[str, Any]) -> None:
        """Store the request with what it was answered (``reply``: status and the content sent back)."""
        entry["reply"] = answer
        recorder.add(entry)

    def refused(entry: dict[str, Any], refusal: Refusal, anthropic: bool) -> Response:
        done(entry, {"status": refusal.status, "error": refusal.message})
        return _refuse(refusal, anthropic)

    def reply_to(entry: dict[str, Any]) -> Reply:
        return reply_for(entry) if reply_for else reply

    # ------------------------------------------------------------ Anthropic Messages

    async def messages(request: Request) -> Response:
        entry = await record(request)
        body = entry.get("body") or {}
        answer = reply_to(entry)
        if isinstance(answer, Refusal):
            return refused(entry, answer, anthropic=True)
        msg_id = f"msg_{uuid.uuid4().hex[:24]}"
        model_name = body.get("model", model)
        input_tokens = _estimate_tokens(body)
        blocks: list[dict[str, Any]] = []
        if reasoning is not None and (body.get("thinking") or {}).get("type") in ("enabled", "adaptive"):
            # display "omitted": the text is left out and only the signature is sent, as the API does.
            omitted = (body.get("thinking") or {}).get("display") == "omitted"
            blocks.append({"type": "thinking", "thinking": "" if omitted else reasoning,
                           "signature": f"capture-signature-{uuid.uuid4().hex[:12]}"})
        if isinstance(answer, ToolCall):
            blocks.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": answer.name,
                           "input": answer.arguments})
            stop_reason, output_tokens = "tool_use", max(1, len(answer.arguments_json()) // 4)
        else:
            blocks.append({"type": "text", "text": answer})
            stop_reason, output_tokens = "end_turn", max(1, len(answer) // 4)
        usage = {"input_tokens": input_tokens, "output_tokens": output_tokens,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        done(entry, {"status": 200, "stream": bool(body.get("stream")), "content": blocks, "stop_reason": stop_reason})
        if not body.get("stream"):
            return JSONResponse({"id": msg_id, "type": "message", "role": "assistant", "model": model_name,
                                 "content": blocks, "stop_reason": stop_reason,
                                 "stop_sequence": None, "usage": usage})

        def delta(index: int, **fields: Any) -> bytes:
            return _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": fields})

        async def events() -> AsyncIterator[bytes]:
            yield _sse("message_start", {"type": "message_start", "message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": model_name, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}})
            yield _sse("ping", {"type": "ping"})
            for index, block in enumerate(blocks):
                empty = {"tool_use": {"input": {}}, "text": {"text": ""},
                         "thinking": {"thinking": "", "signature": ""}}[block["type"]]
                yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {**block, **empty}})
                if block["type"] == "tool_use":
                    for piece in _chunks(json.dumps(block["input"]), 16):
                        yield delta(index, type="input_json_delta", partial_json=piece)
                elif block["type"] == "thinking":
                    if block["thinking"]:
                        for piece in _chunks(block["thinking"]):
                            yield delta(index, type="thinking_delta", thinking=piece)
                    yield delta(index, type="signature_delta", signature=block["signature"])
                else:
                    for piece in _chunks(block["text"]):
                        yield delta(index, type="text_delta", text=piece)
                yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
            yield _sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                         "usage": {"output_tokens": output_tokens}})
            yield _sse("message_stop", {"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "request-id": f"req_{uuid.uuid4().hex}"})

    async def count_tokens(request: Request) -> Response:
        entry = await record(request)
        count = _estimate_tokens(entry.get("body") or {})
        done(entry, {"status": 200, "input_tokens": count})
        return JSONResponse({"input_tokens": count})

    # ------------------------------------------------------------ OpenAI Responses

    async def responses(request: Request) -> Response:
        entry = await record(request)
        body = entry.get("body") or {}
        answer = reply_to(entry)
        if isinstance(answer, Refusal):
            return refused(entry, answer, anthropic=False)
        resp_id = f"resp_{uuid.uuid4().hex}"
        created = int(time.time())
        input_tokens = _estimate_tokens(body)
        items: list[dict[str, Any]] = []
        if reasoning is not None and body.get("reasoning") is not None:
            items.append({"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning",
                          "summary": [{"type": "summary_text", "text": reasoning}],
                          "encrypted_content": f"capture-encrypted-{uuid.uuid4().hex[:12]}"})
        if isinstance(answer, ToolCall):
            call_id = f"call_{uuid.uuid4().hex[:24]}"
            if answer.custom:
                items.append({"id": f"ctc_{uuid.uuid4().hex}", "type": "custom_tool_call", "status": "completed",
                              "call_id": call_id, "name": answer.name, "input": answer.arguments_json()})
            else:
                items.append({"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "completed",
                              "call_id": call_id, "name": answer.name, "arguments": answer.arguments_json()})
            output_tokens = max(1, len(answer.arguments_json()) // 4)
        else:
            items.append({"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "completed",
                          "role": "assistant",
                          "content": [{"type": "output_text", "text": answer, "annotations": [], "logprobs": []}]})
            output_tokens = max(1, len(answer) // 4)
        usage = {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": input_tokens + output_tokens}
        done(entry, {"status": 200, "stream": bool(body.get("stream")), "output": items})

        def response_obj(status: str, output: list[Any], with_usage: bool) -> dict[str, Any]:
            return {"id": resp_id, "object": "response", "created_at": created, "status": status,
                    "model": body.get("model", model), "output": output, "error": None,
                    "incomplete_details": None, "parallel_tool_calls": body.get("parallel_tool_calls", True),
                    "tool_choice": body.get("tool_choice", "auto"), "tools": [], "store": body.get("store", False),
                    "usage": usage if with_usage else None}

        if not body.get("stream"):
            return JSONResponse(response_obj("completed", items, True))

        async def events() -> AsyncIterator[bytes]:
            seq = iter(range(1_000_000))

            def ev(kind: str, **fields: Any) -> bytes:
                return _sse(kind, {"type": kind, "sequence_number": next(seq), **fields})

            yield ev("response.created", response=response_obj("in_progress", [], False))
            yield ev("response.in_progress", response=response_obj("in_progress", [], False))
            for n, item in enumerate(items):
                item_id, kind = item["id"], item["type"]
                at = {"item_id": item_id, "output_index": n}
                if kind == "message":
                    text = item["content"][0]["text"]
                    yield ev("response.output_item.added", output_index=n,
                             item={**item, "status": "in_progress", "content": []})
                    yield ev("response.content_part.added", **at, content_index=0,
                             part={"type": "output_text", "text": "", "annotations": []})
                    for piece in _chunks(text):
                        yield ev("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
                    yield ev("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
                    yield ev("response.content_part.done", **at, content_index=0,
                             part={"type": "output_text", "text": text, "annotations": []})
                elif kind == "reasoning":
                    text = item["summary"][0]["text"]
                    yield ev("response.output_item.added", output_index=n, item={**item, "summary": []})
                    yield ev("response.reasoning_summary_part.added", **at, summary_index=0,
                             part={"type": "summary_text", "text": ""})
                    for piece in _chunks(text):
                        yield ev("response.reasoning_summary_text.delta", **at, summary_index=0, delta=piece)
                    yield ev("response.reasoning_summary_text.done", **at, summary_index=0, text=text)
                    yield ev("response.reasoning_summary_part.done", **at, summary_index=0,
                             part={"type": "summary_text", "text": text})
                else:
                    field = "input" if kind == "custom_tool_call" else "arguments"
                    prefix = "response.custom_tool_call_input" if kind == "custom_tool_call" \
                        else "response.function_call_arguments"
                    yield ev("response.output_item.added", output_index=n,
                             item={**item, "status": "in_progress", field: ""})
                    for piece in _chunks(item[field], 16):
                        yield ev(f"{prefix}.delta", **at, delta=piece)
                    yield ev(f"{prefix}.done", **at, **{field: item[field]})
                yield ev("response.output_item.done", output_index=n, item=item)
            yield ev("response.completed", response=response_obj("completed", items, True))

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    # ------------------------------------------------------------ OpenAI chat completions

    async def chat_completions(request: Request) -> Response:
        entry = await record(request)
        body = entry.get("body") or {}
        answer = reply_to(entry)
        if isinstance(answer, Refusal):
            return refused(entry, answer, anthropic=False)
        chat_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        model_name = body.get("model", model)
        prompt_tokens = _estimate_tokens(body.get("messages", []))
        if isinstance(answer, ToolCall):
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": answer.name, "arguments": answer.arguments_json()}}
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish, completion_tokens = "tool_calls", max(1, len(answer.arguments_json()) // 4)
        else:
            message = {"role": "assistant", "content": answer}
            finish, completion_tokens = "stop", max(1, len(answer) // 4)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        done(entry, {"status": 200, "stream": bool(body.get("stream")), "message": message, "finish_reason": finish})
        if not body.get("stream"):
            return JSONResponse({"id": chat_id, "object": "chat.completion", "created": created, "model": model_name,
                                 "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                              "logprobs": None}],
                                 "usage": usage})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None) -> bytes:
            return _sse(None, {"id": chat_id, "object": "chat.completion.chunk", "created": created,
                               "model": model_name, "choices": [{"index": 0, "delta": delta,
                                                                 "finish_reason": finish_reason, "logprobs": None}]})

        async def events() -> AsyncIterator[bytes]:
            if "tool_calls" in message:
                call = message["tool_calls"][0]
                yield chunk({"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": call["id"], "type": "function",
                     "function": {"name": call["function"]["name"], "arguments": ""}}]}, None)
                for piece in _chunks(call["function"]["arguments"], 16):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, None)
            else:
                yield chunk({"role": "assistant", "content": ""}, None)
                for piece in _chunks(message["content"]):
                    yield chunk({"content": piece}, None)
            yield chunk({}, finish)
            if include_usage:
                yield _sse(None, {"id": chat_id, "object": "chat.completion.chunk", "created": created,
                                  "model": model_name, "choices": [], "usage": usage})
            yield _sse(None, "[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

    # ------------------------------------------------------------ models and the rest

    async def list_models(request: Request) -> Response:
        done(await record(request), {"status": 200, "models": list(models_seen)})
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "capture", "type": "model",
             "display_name": name, "created_at": "2026-01-01T00:00:00Z"} for name in models_seen],
            "has_more": False, "first_id": models_seen[0], "last_id": models_seen[-1]})

    async def other(request: Request) -> Response:
        done(await record(request), {"status": 404})
        return JSONResponse({"type": "error", "error": {"type": "not_found_error", "code": "not_found",
                                                        "message": f"capture server: no route {request.url.path}"}},
                            status_code=404)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    routes = []
    for prefix in ("/v1", ""):
        routes += [
            Route(f"{prefix}/messages", messages, methods=["POST"]),
            Route(f"{prefix}/messages/count_tokens", count_tokens, methods=["POST"]),
            Route(f"{prefix}/responses", responses, methods=["POST"]),
            Route(f"{prefix}/chat/completions", chat_completions, methods=["POST"]),
            Route(f"{prefix}/models", list_models, methods=["GET"]),
        ]
    routes.append(Route("/{rest:path}", other, methods=methods))
    return Starlette(routes=routes)


class CaptureServer:
    """The capture app served on 127.0.0.1 in a background thread: ``with CaptureServer(path) as s: s.base_url``."""

    def __init__(self, out: Path, port: int = 0, reply: str = DEFAULT_REPLY,
                 reply_for: Callable[[dict[str, Any]], Reply] | None = None, reasoning: str | None = None) -> None:
        self.recorder = Recorder(Path(out))
        self.app = build_app(self.recorder, reply=reply, reply_for=reply_for, reasoning=reasoning)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False))
        self._thread: threading.Thread | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.recorder.records

    def serve_forever(self) -> None:
        self.server.run(sockets=[self.sock])

    def __enter__(self) -> CaptureServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("capture server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self._thread:
            self._thread.join(timeout=10)
        self.sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the requests are appended to")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--reply", default=DEFAULT_REPLY, help="the text every call is answered with")
    args = parser.parse_args(argv)
    server = CaptureServer(args.out, port=args.port, reply=args.reply)
    with server:
        print(f"listening on {server.base_url}", flush=True)
        try:
            while server._thread and server._thread.is_alive():
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
