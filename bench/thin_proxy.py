"""The thinnest useful proxy, as a floor for the gateway's figures: it forwards every request's bytes to
one upstream with httpx and relays the answer's bytes (streamed or not), parsing nothing.

    python -m bench.thin_proxy --port P --upstream http://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
FORWARDED = (b"content-type", b"authorization")


class ThinProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        self.client = httpx.AsyncClient(timeout=600, limits=limits)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await self.client.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k in FORWARDED]
        request = self.client.build_request(scope["method"], self.upstream + scope["path"], content=b"".join(parts),
                                            headers=headers)
        response = await self.client.send(request, stream=True)
        try:
            kept = [(k.encode(), v.encode()) for k, v in response.headers.items() if k.lower() == "content-type"]
            await send({"type": "http.response.start", "status": response.status_code, "headers": kept})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.thin_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL of the server behind it")
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(ThinProxy(args.upstream), host="127.0.0.1", port=args.port, log_level="warning",
                access_log=False, timeout_keep_alive=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
