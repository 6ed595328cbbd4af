"""vLLM answers a failed ``/collective_rpc`` (a worker method that raised) with a 500 and then closes the connection
(uvicorn, after "Exception in ASGI application"), by which time the sync may have sent its next request on it. The
admin client sends worker calls on a connection of their own, so the next request never meets that close. Before
(2026-12-05): a MoE model's refused scatter prepare made the sync's ``/reset_prefix_cache`` fail with ReadError, and
every sync of the model failed. A real socket server here, closing as uvicorn did."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from trainer_consumer.weight_sync.vllm_admin import AdminError, VLLMAdmin


def _response(status: int, body: dict[str, object]) -> bytes:
    payload = json.dumps(body).encode()
    reason = b"OK" if status == 200 else b"Internal Server Error"
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (status, reason, len(payload))) + payload


async def _connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")),
                          0)
            await reader.readexactly(length)
            if lines[0].split()[1] == "/collective_rpc":
                writer.write(_response(500, {"error": {"message": "Call to collective_rpc method failed"}}))
                await writer.drain()
                # the app's exception is handled only now: whatever the client sent meanwhile dies with the connection
                try:
                    await asyncio.wait_for(reader.read(1), 2.0)
                except TimeoutError:
                    pass
                return
            writer.write(_response(200, {"success": True}))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


@pytest.mark.parametrize("calls", [1, 3])
def test_a_failed_worker_call_does_not_take_the_next_request_down_with_its_connection(calls: int) -> None:
    async def scenario() -> list[bool]:
        server = await asyncio.start_server(_connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient() as client:
                admin = VLLMAdmin(f"http://127.0.0.1:{port}", client, timeout_s=5.0)
                assert await admin.reset_prefix_cache()  # a pooled connection, kept alive
                answers = []
                for _ in range(calls):
                    with pytest.raises(AdminError) as refused:
                        await admin.worker_call("tokentrail_scatter_prepare", weights_path="/m")
                    assert refused.value.status == 500
                    answers.append(await admin.reset_prefix_cache())
                return answers
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(scenario()) == [True] * calls
