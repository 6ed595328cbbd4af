"""kill -9 of a worker mid-stream, restarts, more kills: the deduplicated outputs equal a clean run's."""

from __future__ import annotations

import time
from collections.abc import Callable

from .stream_rig import StreamRig, group_events, interleave
from .test_pipeline import ANSWERS, assert_outputs_equal, has_all


def batch(tag: str, groups: int, seed: int) -> list:
    events = []
    for g in range(groups):
        events += group_events(f"{tag}-g{g}", ANSWERS, calls=4, env=3, seed=seed * 100 + g)
    return interleave(events, seed=seed)


def test_kill_9_mid_stream_and_restart_loses_nothing_and_duplicates_only_identical_events(
        make_stream_rig: Callable[..., StreamRig]) -> None:
    rig = make_stream_rig()
    batches = [batch(f"b{i}", 6, seed=i) for i in range(3)]
    expected = rig.expected([ev for b in batches for ev in b])
    total_rollouts = len(expected["CompletedRollout"])
    seen_at_kill = []

    rig.produce(batches[0])
    worker = rig.start_worker()
    rig.collect(lambda c: len(c.records["CompletedRollout"]) >= 4, timeout_s=60)
    rig.kill(worker)  # mid-stream: rollouts of the first batch are still being assembled and grouped
    seen_at_kill.append(len(rig.collected.ids("CompletedRollout")))

    rig.produce(batches[1])
    worker = rig.start_worker()
    before = len(rig.collected.records["Sample"])
    rig.collect(lambda c: len(c.records["Sample"]) >= before + 10, timeout_s=90)
    time.sleep(0.2)
    rig.kill(worker)
    seen_at_kill.append(len(rig.collected.ids("CompletedRollout")))

    rig.produce(batches[2])
    rig.start_worker()
    got = rig.collect(has_all(expected), timeout_s=120)
    got = rig.settle()
    assert_outputs_equal(got, {n: r for n, r in expected.items() if n != "DeadLetter"})
    assert not got.records["DeadLetter"]
    assert all(0 < seen < total_rollouts for seen in seen_at_kill), seen_at_kill
    print("\n".join(line for line in rig.log_path.read_text().splitlines() if "progress" in line or "Ready" in line))
    print(f"rollouts seen at the kills: {seen_at_kill} of {total_rollouts}; duplicates received: "
          f"{ {n: len(got.records[n]) - len(got.ids(n)) for n in expected} }")
