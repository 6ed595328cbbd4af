"""The echoed prompt ids are checked as bytes, without parsing them, only where that is provably the same as
parsing them: the cut-out array is used only where the answer holds the placeholder exactly where the ids
belong; anywhere else the answer is read whole. And the vLLM client still refuses a prompt it did not send."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from producers.upstreams.base import GenerateRequest, Sampling, UpstreamError
from producers.upstreams.json_ids import PLACEHOLDER, load_with_ids
from producers.upstreams.vllm import VLLMUpstream
from producers.upstreams.vllm.answers import answer_root, first_choice

from .test_http1 import Server

IDS = [1, 565, 201, 521, 0, 4_000_000_000]


def _completion(prompt_ids: Any, text: str = "ok", **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "token_ids": [7, 2], "finish_reason": "stop", "stop_reason": None,
              "logprobs": {"token_logprobs": [-0.5, -0.25], "tokens": ["token_id:7", "token_id:2"]},
              "prompt_token_ids": prompt_ids}
    return {"id": "cmpl-1", "object": "text_completion", "model": "tiny", "choices": [choice], **extra}


def test_the_ids_are_cut_out_unparsed_where_they_belong() -> None:
    content = orjson.dumps(_completion(IDS))
    answer, ids, raw = load_with_ids(content, "prompt_token_ids", first_choice)
    assert ids is None and raw == orjson.dumps(IDS)
    assert answer["choices"][0]["prompt_token_ids"] == PLACEHOLDER
    assert answer["choices"][0]["token_ids"] == [7, 2] and answer["id"] == "cmpl-1"  # the rest as parsed
    # The generate endpoint keeps them at the top level; spaces around the array are allowed.
    content = b'{"request_id": "r", "prompt_token_ids" :\n [1, 2,3] , "choices": []}'
    answer, ids, raw = load_with_ids(content, "prompt_token_ids", answer_root)
    assert ids is None and raw == b"[1, 2,3]" and answer["choices"] == []


@pytest.mark.parametrize(("content", "cut"), [
    # the name inside a string, before the real key: its quotes are escaped there, so the real key is cut
    (orjson.dumps(_completion(IDS, text='"prompt_token_ids": [9, 9]')), True),
    # a key of another object first (its value is not the one the check is about)
    (orjson.dumps({"kv": {"prompt_token_ids": [9, 9]}, **_completion(IDS)}), False),
    # a key whose name ends in the name, after an escaped quote
    (orjson.dumps({'x"prompt_token_ids': [9, 9], **_completion(IDS)}), False),
])
def test_what_is_read_is_what_parsing_the_whole_answer_reads(content: bytes, cut: bool) -> None:
    answer, ids, raw = load_with_ids(content, "prompt_token_ids", first_choice)
    whole = orjson.loads(content)
    assert (raw is not None) == cut
    if raw is not None:  # the placeholder stands exactly for the cut array, the rest is as parsed
        assert ids is None and orjson.loads(raw) == IDS
        answer["choices"][0]["prompt_token_ids"] = orjson.loads(raw)
    else:
        assert ids == IDS
    assert answer == whole


@pytest.mark.parametrize("value", [None, "ids", 3])
def test_no_array_to_cut_is_read_as_it_is(value: Any) -> None:
    content = orjson.dumps(_completion(value))
    answer, ids, raw = load_with_ids(content, "prompt_token_ids", first_choice)
    assert answer == orjson.loads(content) and ids == value and raw is None
    answer, ids, raw = load_with_ids(orjson.dumps({"choices": []}), "prompt_token_ids", first_choice)
    assert (ids, raw) == (None, None)


def _serve(prompt_json: bytes) -> Any:
    """A vLLM stand-in: its model list and version for GETs, a completion echoing ``prompt_json``."""
    async def handler(body: bytes, writer: asyncio.StreamWriter) -> bool:
        if body:
            answer = orjson.dumps(_completion(None)).replace(b'"prompt_token_ids":null',
                                                            b'"prompt_token_ids":' + prompt_json)
        else:
            answer = orjson.dumps({"data": [{"id": "tiny", "max_model_len": 4096}], "version": "0.32.0"})
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(answer), answer))
        await writer.drain()
        return True
    return handler


@pytest.mark.parametrize(("echo", "ran"), [
    (orjson.dumps(IDS), True),  # byte-equal: no parsing
    (b"[" + b", ".join(str(i).encode() for i in IDS) + b"]", True),  # other spacing: parsed and compared
    (orjson.dumps(IDS[::-1]), False),
    (orjson.dumps(IDS[:-1]), False),
])
def test_the_vllm_client_accepts_only_the_prompt_it_sent(echo: bytes, ran: bool) -> None:
    async def run() -> Any:
        async with Server(_serve(echo)) as server:
            upstream = VLLMUpstream(server.url, model="tiny")
            try:
                return await upstream.generate(GenerateRequest(prompt_ids=list(IDS), sampling=Sampling(max_tokens=2),
                                                               request_id="req-1"))
            finally:
                await upstream.close()

    if not ran:
        with pytest.raises(UpstreamError, match="differ from the"):
            asyncio.run(run())
        return
    result = asyncio.run(run())
    assert result.prompt_ids == IDS and result.output_ids == [7, 2] and result.output_logprobs == [-0.5, -0.25]
