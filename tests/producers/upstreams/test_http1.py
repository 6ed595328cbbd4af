"""The lean HTTP/1.1 client against a real socket server: keep-alive reuse, chunked bodies read as they
come, an unread answer never reused, a kept connection the server closed retried once, and the errors
that decide whether another server may be tried."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from producers.upstreams.http1 import ConnectFailed, Http1Pool, Timeout

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # returns: keep the connection open


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return await reader.readexactly(length)


class Server:
    """A socket server that counts connections; ``handler`` answers each request."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections, self.url = handler, 0, ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            while (body := await _read_request(reader)) is not None:
                if not await self.handler(body, writer):
                    break
            writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


async def echo(body: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    return True


def test_keep_alive_connection_is_reused_and_bodies_come_back_whole() -> None:
    async def run() -> tuple[list[tuple[int, bytes]], int]:
        async with Server(echo) as server:
            pool = Http1Pool({"content-type": "application/json"})
            answers = [await pool.post(server.url + "/x", b"%d" % i * 5000) for i in range(3)]
            await pool.aclose()
            return answers, server.connections

    answers, connections = asyncio.run(run())
    assert answers == [(200, b"%d" % i * 5000) for i in range(3)]
    assert connections == 1


def test_chunked_body_arrives_piece_by_piece_and_an_unread_answer_is_not_reused() -> None:
    async def chunked(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def run() -> tuple[list[bytes], int]:
        async with Server(chunked) as server:
            pool = Http1Pool()
            response = await pool.request("POST", server.url + "/s", b"{}")
            pieces = [piece async for piece in response.chunks()]
            response.release()
            cut = await pool.request("POST", server.url + "/s", b"{}")  # reuses the first connection
            cut.release()  # not read to its end: closed, never handed to the next request
            status, body = await pool.post(server.url + "/s", b"{}")
            await pool.aclose()
            assert (status, body) == (200, b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n")
            return pieces, server.connections

    pieces, connections = asyncio.run(run())
    assert b"".join(pieces) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n" and len(pieces) >= 2
    assert connections == 2


def test_a_kept_connection_the_server_closed_is_retried_on_a_new_one() -> None:
    async def answer_once(body: bytes, writer: asyncio.StreamWriter) -> bool:
        await echo(body, writer)
        return False  # closes after each answer, without saying so

    async def run() -> tuple[list[tuple[int, bytes]], int]:
        async with Server(answer_once) as server:
            pool = Http1Pool()
            first = await pool.post(server.url + "/a", b"one")
            await asyncio.sleep(0.05)  # the close reaches the client: the kept connection is dead
            second = await pool.post(server.url + "/a", b"two")
            await pool.aclose()
            return [first, second], server.connections

    answers, connections = asyncio.run(run())
    assert answers == [(200, b"one"), (200, b"two")] and connections == 2


def test_connect_failure_and_deadline_are_told_apart() -> None:
    async def silent(body: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(5)
        return False

    async def run() -> None:
        async with Server(echo) as server:
            dead = server.url
        with pytest.raises(ConnectFailed):
            await Http1Pool().post(dead + "/x", b"")
        async with Server(silent) as server:
            with pytest.raises(Timeout):
                await Http1Pool(timeout_s=0.2).post(server.url + "/x", b"")

    asyncio.run(run())


def test_a_stream_read_to_its_last_event_then_drained_keeps_its_connection() -> None:
    async def stream(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)  # the body's end comes after the last event, in a packet of its own
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def run() -> int:
        async with Server(stream) as server:
            pool = Http1Pool()
            for _ in range(3):
                response = await pool.request("POST", server.url + "/s", b"{}")
                async for piece in response.chunks():
                    if b"[DONE]" in piece:
                        break  # a reader stops at the last event, as the SSE parser does
                await response.drain(5.0)
                response.release()
            await pool.aclose()
            return server.connections

    assert asyncio.run(run()) == 1
