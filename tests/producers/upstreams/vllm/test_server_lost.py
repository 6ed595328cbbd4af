"""A vLLM server lost in the middle of a request (killed: its connection breaks before the answer is
complete): the client tries the rollout's next server when the caller has received nothing of the
answer yet, and fails with a clean 502 ``upstream_unavailable`` when it has (a stream already passed
tokens on) or when no server is left. The lost server is a socket that takes the request and closes;
the next one replays a real vLLM 0.32 answer."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from producers.upstreams.base import GenerateRequest, GenerateResult, Sampling, TokenChunk, UpstreamError
from producers.upstreams.vllm import VLLMUpstream, rendezvous_order

from .fake_vllm_server import FakeVLLM

Fixtures = dict[str, dict[str, Any]]


class VanishingServer:
    """Reads a request, sends ``reply`` (the start of an answer), then closes: a server killed mid-answer."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                received = b""
                while b"\r\n\r\n" not in received:
                    received += conn.recv(65536)
                self.requests += received.startswith(b"POST")  # the model list (GET) is not a generation
                conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()


def sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def sse_event(payload: str) -> bytes:
    data = f"data: {payload}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@pytest.fixture
def recorded_request(vllm_fixtures: Fixtures) -> GenerateRequest:
    body = vllm_fixtures["d_completions_token_ids"]["request"]["body"]
    return GenerateRequest(prompt_ids=list(body["prompt"]), request_id="req-lost", rollout_id="",
                           sampling=Sampling(temperature=body["temperature"], max_tokens=body["max_tokens"],
                                             seed=body["seed"]))


@pytest.fixture
def vanishing() -> Iterator[list[VanishingServer]]:
    made: list[VanishingServer] = []
    yield made
    for server in made:
        server.close()


def first_on(lost: str, servers: list[str]) -> str:
    """A rollout id whose first server is ``lost``."""
    return next(f"r{i}" for i in range(200) if rendezvous_order(f"r{i}", servers)[0] == lost)


def run(servers: list[str], request: GenerateRequest, stream: bool) -> tuple[list[TokenChunk], GenerateResult]:
    async def go() -> tuple[list[TokenChunk], GenerateResult]:
        upstream = VLLMUpstream(servers, model="tiny")
        try:
            if not stream:
                return [], await upstream.generate(request)
            chunks: list[TokenChunk] = []
            async for item in upstream.generate_stream(request):
                if isinstance(item, TokenChunk):
                    chunks.append(item)
                else:
                    return chunks, item
            raise AssertionError("no result")
        finally:
            await upstream.close()

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [False, True])
def test_a_server_lost_before_the_caller_saw_anything_is_routed_around(
    fake_vllm: FakeVLLM, recorded_request: GenerateRequest, vanishing: list[VanishingServer], stream: bool,
) -> None:
    # whole: a promised body that never comes; stream: the stream's head, then nothing
    lost = VanishingServer(sse_head() if stream else
                           b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 900\r\n\r\n{")
    vanishing.append(lost)
    servers = [lost.url, fake_vllm.url]
    request = GenerateRequest(**{**recorded_request.__dict__, "rollout_id": first_on(lost.url, servers)})
    chunks, result = run(servers, request, stream)
    assert lost.requests == 1  # it was tried first ...
    assert result.upstream == fake_vllm.url  # ... and the answer came from the next server
    assert len(result.output_ids) == request.sampling.max_tokens
    assert [i for c in chunks for i in c.ids] == (result.output_ids if stream else [])


def test_a_stream_lost_after_tokens_reached_the_caller_fails_cleanly(
    fake_vllm: FakeVLLM, vllm_fixtures: Fixtures, recorded_request: GenerateRequest,
    vanishing: list[VanishingServer],
) -> None:
    first_event = vllm_fixtures["d_completions_token_ids_stream"]["response"]["events"][0].removeprefix("data: ")
    assert json.loads(first_event)["choices"][0]["token_ids"]  # it carries a token
    lost = VanishingServer(sse_head() + sse_event(first_event))
    vanishing.append(lost)
    servers = [lost.url, fake_vllm.url]
    request = GenerateRequest(**{**recorded_request.__dict__, "rollout_id": first_on(lost.url, servers)})
    with pytest.raises(UpstreamError) as caught:
        run(servers, request, stream=True)
    assert (caught.value.status_code, caught.value.error_type) == (502, "upstream_unavailable")
    assert "stream broke" in str(caught.value)
    assert fake_vllm.paths().count("/v1/completions") == 0  # not sampled again elsewhere


def test_a_lost_server_with_no_other_to_try_is_a_502(
    recorded_request: GenerateRequest, vanishing: list[VanishingServer],
) -> None:
    lost = VanishingServer(sse_head())
    vanishing.append(lost)
    for stream in (False, True):
        with pytest.raises(UpstreamError) as caught:
            run([lost.url], recorded_request, stream)
        assert (caught.value.status_code, caught.value.error_type) == (502, "upstream_unavailable")
