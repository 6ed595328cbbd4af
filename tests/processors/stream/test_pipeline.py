"""The faust app on the real broker: a worker subprocess turns produced calls and env events into
exactly the rollouts, groups, scores, rewards, credits and samples the pure core computes."""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka.admin import AdminClient

from processors.stream.topics import record_key
from schemas.builders import make_env, make_started
from schemas.ids import call_id
from schemas.kafka.config import admin_config

from .stream_rig import Collected, StreamRig, comparable, group_events, interleave

ANSWERS = ["The answer is 4", "The answer is 5", "4", "no idea"]


class AllCollected:
    """Every expected output id collected; ``missing`` names what is not (for the time-out message)."""

    def __init__(self, expected: dict[str, dict[str, dict]]) -> None:
        self.expected = expected

    def __call__(self, got: Collected) -> bool:
        return all(set(self.expected[name]) <= got.ids(name) for name in self.expected)

    def missing(self, got: Collected) -> dict[str, list[str]]:
        return {name: sorted(set(records) - got.ids(name))[:8] for name, records in self.expected.items()
                if set(records) - got.ids(name)}


def has_all(expected: dict[str, dict[str, dict]]) -> AllCollected:
    return AllCollected(expected)


def assert_outputs_equal(got: Collected, expected: dict[str, dict[str, dict]]) -> None:
    for name, records in expected.items():
        assert got.ids(name) == set(records), name
        for record in got.records[name]:  # duplicates included: each must equal its expected event
            assert comparable(name, record) == comparable(name, records[record["event_id"]]), name


def test_worker_emits_exactly_what_the_core_derives_and_a_second_app_the_same_ids(
        make_stream_rig: Callable[..., StreamRig]) -> None:
    rig = make_stream_rig()
    events = interleave(group_events("ga", ANSWERS, seed=1) + group_events("gb", ANSWERS[:3], seed=2)
                        + group_events("gc", ["4", "4"], seed=3), seed=7)
    expected = rig.expected(events)
    assert len(expected["RolloutGroup"]) == 3 and len(expected["Sample"]) == 21  # (4 + 3) x 3 calls
    rig.produce(events)
    rig.start_worker()
    got = rig.collect(has_all(expected), timeout_s=90)
    got = rig.settle(quiet_s=2.0)
    assert_outputs_equal(got, expected)
    assert not got.records["DeadLetter"]
    for name in expected:  # one worker, no crash: every event exactly once
        assert set(got.counts(name).values()) <= {1}, name
        assert got.keys[name] == [record_key(name, r).encode() for r in got.records[name]], name
    # Group "gc" (both answers right) has no variance: filtered, no credit, no samples.
    assert {g for r in got.records["Sample"] for g in r["group_ids"]} == {"ga", "gb"}

    # The same input through a second app (fresh state, own consumer group): identical event ids.
    rig.start_worker(app_id=f"{rig.settings.processors.app_id}-again")
    twice = rig.collect(lambda c: all(set(c.counts(n).values()) == {2} for n in expected if expected[n]),
                        timeout_s=90)
    rig.settle(quiet_s=2.0)
    assert_outputs_equal(twice, expected)
    assert all(set(twice.counts(n).values()) == {2} for n in expected if expected[n])
    assert rig.stop_all() == [0, 0]  # SIGTERM: both stop cleanly


def test_timers_expire_attempts_close_partial_groups_and_record_late_rollouts(
        make_stream_rig: Callable[..., StreamRig]) -> None:
    rig = make_stream_rig(attempt_timeout_s=2.0, group_window_s=3.0, group_grace_s=1.0)
    t0 = 1_700_000_000_000_000
    partial = [ev for ev in group_events("gp", ["4", "5", "4"], seed=4, t0_us=t0)
               if not (ev[0] == "AttemptFinished" and ev[1]["rollout_id"] == "gp-r2")]  # never finishes
    first = group_events("gl", ["4"], seed=5, expected=3, t0_us=t0)
    late = group_events("gl-late", ["5"], seed=6, expected=3, t0_us=t0 + 10_000_000)
    late = [(n, _regroup(r, "gl")) for n, r in late]  # created after gl's window: a LATE record
    expected = rig.expected(partial + first + late, timers=True)
    statuses = sorted(g["status"] for g in expected["RolloutGroup"].values())
    assert statuses == ["LATE", "PARTIAL", "PARTIAL"]
    assert sorted(r["status"] for r in expected["CompletedRollout"].values()).count("INCOMPLETE") == 1

    rig.produce(partial + first)
    rig.start_worker()
    rig.collect(lambda c: any(r["rollout_id"] == "gl-r0" for r in c.records["CompletedRollout"]))
    rig.produce(late)  # gl is open (its window not yet passed in stream time): gl-late-r0 is LATE
    got = rig.collect(has_all(expected), timeout_s=60)
    got = rig.settle(quiet_s=2.0)
    assert_outputs_equal(got, expected)
    incomplete = next(r for r in got.records["CompletedRollout"] if r["status"] == "INCOMPLETE")
    assert incomplete["rollout_id"] == "gp-r2" and "finish" in incomplete["missing"]
    assert incomplete["missing"][0].startswith("expired: no event for 2s")


def _regroup(record: dict, group: str) -> dict:
    if "group_id" in record:
        return dict(record, group_id=group)
    return record


def test_bad_records_become_dead_letters_and_the_worker_carries_on(
        make_stream_rig: Callable[..., StreamRig]) -> None:
    rig = make_stream_rig()
    codec, topics = rig.codec, rig.topics
    good = group_events("gd", ANSWERS[:2], seed=8)
    expected = rig.expected(good)
    r0_calls = [r for n, r in good if n == "CallRecord" and r["rollout_id"] == "gd-r0"]
    conflicting = dict(r0_calls[0], event_id="not-" + r0_calls[0]["event_id"])
    wrong_key = dict(r0_calls[1])
    score = {"event_id": "s", "rollout_id": "gd-r1", "rollout_event_id": "e", "group_id": "gd",
             "verifier_name": "v", "verifier_version": "1", "scope": "ROLLOUT", "status": "OK",
             "raw_json": "1", "error": None, "duration_ms": 0.0, "created_at_us": 1}
    truncated = codec.encode("CallRecord", r0_calls[1])[:40]
    bad = [(topics.calls, b"gd-r0", b"this is not avro", "CorruptRecord", "assembler"),
           (topics.env, b"gd-r1", codec.encode("Score", score), "SchemaMismatch", "assembler"),
           (topics.calls, b"gd-r0", truncated, "TruncatedPayload", "assembler"),
           (topics.calls, b"someone-else", codec.encode("CallRecord", wrong_key), "InvalidEvent", "assembler"),
           (topics.calls, b"gd-r0", codec.encode("CallRecord", conflicting), "ConflictingEvent", "assembler"),
           (topics.rollouts, b"gd-r0", b"\xc3\x01" + b"\x00" * 8 + b"junk", "UnknownFingerprint", "router")]
    # The conflicting call must reach gd-r0 while its attempt is still open: before the rest of it.
    head = [ev for ev in good if ev[1]["rollout_id"] == "gd-r0"][:2]  # its start and call 0
    rig.produce(head)
    for topic, key, value, _, _ in bad:
        rig.produce_raw(topic, key, value)
    rig.flush()
    rig.produce([ev for ev in good if ev not in head])
    rig.start_worker()
    got = rig.collect(lambda c: has_all(expected)(c) and len(c.records["DeadLetter"]) >= len(bad))
    got = rig.settle(quiet_s=2.0)
    assert_outputs_equal(got, {n: r for n, r in expected.items() if n != "DeadLetter"})
    assert got.undecodable == [bad[-1][2]]  # the junk put on the rollouts topic, nothing else
    letters = sorted(got.records["DeadLetter"], key=lambda d: (d["source_topic"], d["offset"]))
    assert len(letters) == len(bad)
    by_value = {d["value"]: d for d in letters}
    for topic, key, value, error_type, stage in bad:
        letter = by_value[value]
        assert (letter["source_topic"], letter["key"], letter["error_type"], letter["stage"]) == (
            topic, key, error_type, stage)
        assert letter["reason"]
    assert "not its rollout id" in by_value[codec.encode("CallRecord", wrong_key)]["reason"]
    assert call_id("gd-r0", "a1", 0) in by_value[codec.encode("CallRecord", conflicting)]["reason"]


def test_a_rollout_too_large_for_kafka_is_dead_lettered_and_the_partitions_keep_flowing(
        make_stream_rig: Callable[..., StreamRig]) -> None:
    """Two 120 kB environment events make a rollout state over Kafka's 200 kB record limit (issue 17: the
    worker failed to store it, crashed, restarted and failed again, forever). The second is dead-lettered,
    and the rollouts behind it on the same partitions come out as the core derives them."""
    rig = make_stream_rig(kafka_overrides={"max_message_bytes": 200_000})
    big = [("AttemptStarted", make_started("big-r", "a1")),
           ("EnvStep", make_env("big-r", "a1", 0, payload="x" * 120_000)),
           ("EnvStep", make_env("big-r", "a1", 1, payload="y" * 120_000))]
    good = group_events("gs", ANSWERS[:2], seed=9)
    expected = {n: r for n, r in rig.expected(good).items() if n != "DeadLetter"}
    rig.produce(big)
    rig.produce(good)
    rig.flush()
    worker = rig.start_worker()
    got = rig.collect(lambda c: has_all(expected)(c) and len(c.records["DeadLetter"]) >= 1)
    got = rig.settle(quiet_s=2.0)
    assert worker.poll() is None, rig.log_tail()  # never crashed
    assert_outputs_equal(got, expected)
    (letter,) = got.records["DeadLetter"]
    assert (letter["error_type"], letter["stage"], letter["key"]) == ("RolloutTooLarge", "assembler", b"big-r")
    assert "max_rollout_bytes" in letter["reason"]


def test_two_workers_with_one_app_id_share_the_partitions(make_stream_rig: Callable[..., StreamRig]) -> None:
    rig = make_stream_rig()
    events = interleave(group_events("gx", ANSWERS, seed=11) + group_events("gy", ANSWERS, seed=12)
                        + group_events("gz", ANSWERS[:3], seed=13), seed=3)
    expected = rig.expected(events)
    rig.start_worker()
    rig.start_worker()
    admin = AdminClient(admin_config(rig.settings.kafka))
    app_id = rig.settings.processors.app_id

    def members_with_inputs() -> list[set[int]]:
        group = admin.describe_consumer_groups([app_id])[app_id].result(timeout=30)
        return [{tp.partition for tp in m.assignment.topic_partitions if tp.topic == rig.topics.calls}
                for m in group.members]

    deadline = time.monotonic() + 60
    while sorted(map(len, members_with_inputs())) != [1, 1]:  # two partitions, one per worker
        assert time.monotonic() < deadline, f"assignment {members_with_inputs()}\n{rig.log_tail()}"
        time.sleep(0.5)
    rig.produce(events)
    got = rig.collect(has_all(expected), timeout_s=90)
    got = rig.settle(quiet_s=2.0)
    assert_outputs_equal(got, {n: r for n, r in expected.items() if n != "DeadLetter"})
    assert not got.records["DeadLetter"]
