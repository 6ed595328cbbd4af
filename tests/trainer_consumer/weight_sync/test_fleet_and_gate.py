"""The pure parts of the weight sync: the fleet's versions and the gate between calls and updates."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from trainer_consumer.weight_sync.fleet import ServerState, ServerStatus, initial_view, judge, parse_label
from trainer_consumer.weight_sync.gate import VersionGate


def test_labels_map_to_versions() -> None:
    assert parse_label("default") == 0  # vLLM's label for the weights it started with: the base model
    assert parse_label("12") == 12
    assert parse_label("incomplete-3") is None


def test_only_servers_at_the_target_are_routable() -> None:
    view = initial_view(["http://a", "http://b", "http://c"], target=0)
    assert view.routable() == []
    view = view.with_server(judge("http://a", 3, 3)).with_server(judge("http://b", 2, 3))
    view = view.with_server(ServerState("http://c", None, ServerStatus.FAILED, "reload failed"))
    assert view.routable() == ["http://a"]
    assert view.behind() == ["http://b", "http://c"]
    moved = view.retarget(2)
    assert moved.routable() == ["http://b"]  # a failed server stays failed until it is updated
    assert moved.servers["http://c"].status is ServerStatus.FAILED


async def until(fact: Callable[[], bool], steps: int = 10_000) -> None:
    """Let the other tasks run until ``fact`` holds (a count of loop turns, not a time: a wait on a fact)."""
    for _ in range(steps):
        if fact():
            return
        await asyncio.sleep(0)
    raise AssertionError("the fact never held")


def test_gate_drains_running_calls_and_holds_new_ones_until_reopened() -> None:
    async def scenario() -> list[str]:
        gate = VersionGate(1)
        events: list[str] = []
        release_first = asyncio.Event()

        async def call(name: str, hold: asyncio.Event | None = None) -> None:
            async with gate.lease() as version:
                events.append(f"{name} start v{version}")
                if hold is not None:
                    await hold.wait()
                events.append(f"{name} end v{version}")

        first = asyncio.create_task(call("a", release_first))
        await until(lambda: gate.running == 1)
        closing = asyncio.create_task(gate.close())
        await until(lambda: not gate.is_open)  # the update has closed the gate, and so had its chance to end
        assert not closing.done()  # a call is running: the update waits for it (not merely slow)
        second = asyncio.create_task(call("b"))
        await until(lambda: gate.held == 1)  # the new call is parked at the closed gate
        release_first.set()
        await closing
        events.append("updated")
        assert not second.done() and gate.held == 1  # held while the gate is closed: only reopen frees it
        await gate.reopen(2)
        await asyncio.gather(first, second)
        return events

    assert asyncio.run(scenario()) == ["a start v1", "a end v1", "updated", "b start v2", "b end v2"]
