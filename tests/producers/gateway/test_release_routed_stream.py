"""A release-routed call keeps the whole-answer path: a client that does not stream costs one whole
upstream answer, not a stream of per-token events, also when the release decides its version; a stream's final
result carries the release arm the call was routed on; the arm follows the traffic (serving, candidate, pinned)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from producers.gateway.release_routed import _RoutedStream, assignment
from producers.upstreams.base import GenerateResult, ReleaseAssignment, TokenChunk, WholeOrStreamed
from schemas.release_traffic import Traffic


def _run(prefer_whole: bool) -> tuple[list[str], list[object]]:
    made: list[str] = []

    def upstream(request: object) -> WholeOrStreamed:
        async def streamed() -> AsyncIterator[object]:
            made.append(f"streamed {request}")
            yield "token"
            yield "result"

        async def whole() -> object:
            made.append(f"whole {request}")
            return "result"

        return WholeOrStreamed(streamed, whole)

    async def route() -> tuple[str, None]:
        await asyncio.sleep(0)  # routing may wait for the release plan
        return "routed-request", None

    async def consume() -> list[object]:
        stream = _RoutedStream(route, upstream)
        if prefer_whole:
            stream.prefer_whole()
        items = [item async for item in stream]
        await stream.aclose()
        return items

    return made, asyncio.run(consume())


def test_prefer_whole_reaches_the_routed_upstream_request() -> None:
    made, items = _run(prefer_whole=True)
    assert made == ["whole routed-request"] and items == ["result"]


def test_without_it_the_routed_request_streams() -> None:
    made, items = _run(prefer_whole=False)
    assert made == ["streamed routed-request"] and items == ["token", "result"]


def test_a_streams_final_result_carries_the_release_it_was_routed_on() -> None:
    release = ReleaseAssignment("rel-1", 2, "candidate")
    final = GenerateResult(prompt_ids=np.array([1, 2], dtype=np.uint32), output_ids=[3], output_logprobs=[-0.5],
                           finish_reason="stop", logprob_kind="RAW", policy_version=7, engine="test", upstream="test")

    async def streamed() -> AsyncIterator[object]:
        yield TokenChunk([3], [-0.5])
        yield final

    async def route() -> tuple[str, ReleaseAssignment]:
        return "routed-request", release

    async def consume() -> list[object]:
        return [item async for item in _RoutedStream(route, lambda _request: streamed())]

    chunk, result = asyncio.run(consume())
    assert isinstance(chunk, TokenChunk) and isinstance(result, GenerateResult)
    assert result.release == release and result.policy_version == 7 and final.release is None


def test_the_arm_follows_the_traffic() -> None:
    ramping = Traffic("m", serving_version=1, candidate_version=2, candidate_fraction=0.5, release_id="rel",
                      pinned={"eval": 1, "canary-suite": 2}, sequence=3)
    arms = {s: assignment(ramping, f"s{s}") for s in range(200)}
    assert {(v, a.arm) for v, a in arms.values()} == {(1, "serving"), (2, "candidate")}
    assert all(a.release_id == "rel" and a.decision_sequence == 2 and a.pin_label is None for _, a in arms.values())
    # A pinned label is the pinned arm whatever its version (serving's included) and whatever the hash says.
    assert {assignment(ramping, f"s{s}", "eval") for s in range(20)} == {(1, ReleaseAssignment("rel", 2, "pinned",
                                                                                                 "eval"))}
    assert assignment(ramping, "s0", "canary-suite")[1].arm == "pinned"
    assert assignment(ramping, "s0", "unknown-label")[1].arm in ("serving", "candidate")
    promoted = Traffic("m", serving_version=2, release_id="rel", sequence=4)
    assert assignment(promoted, "s0") == (2, ReleaseAssignment("rel", 3, "serving"))
