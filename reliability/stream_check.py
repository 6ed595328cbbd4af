"""Run the topic cases of the corpus through a real faust worker and the real ClickHouse sink.

A good workload (a group of rollouts the pure core turns into samples) is produced alongside the bad
records, so each run also shows that the worker carries on past bad input and loses nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from reliability.bad_inputs.topic_cases import TopicCase, TopicMessage, topic_cases
from reliability.pipeline import Collected, Pipeline, compare, core_outputs, group_events
from reliability.results import CaseResult
from reliability.sink_runner import query_sink, run_sink_until_idle
from tokentrail.settings import Settings

Progress = Callable[[str], None]


def _case_messages(pipeline: Pipeline, cases: list[TopicCase]) -> dict[str, list[TopicMessage]]:
    return {case.id: case.build(pipeline.codec) for case in cases}


def _satisfied(case: TopicCase, msgs: list[TopicMessage], pipeline: Pipeline, got: Collected) -> str | None:
    """None when the worker did what the case expects, else what is missing or wrong."""
    if case.expect_incomplete is not None:
        rid = msgs[0].key.decode()
        rollouts = [r for r in got.records["CompletedRollout"] if r["rollout_id"] == rid]
        if not rollouts:
            return f"no rollout for {rid}"
        r = rollouts[-1]
        if r["status"] != "INCOMPLETE" or r["counted"]:
            return f"rollout {rid} is {r['status']} (counted={r['counted']}), expected INCOMPLETE"
        if not any(case.expect_incomplete in m for m in r["missing"]):
            return f"rollout {rid} missing={r['missing']} does not name {case.expect_incomplete}"
        return None
    assert case.dead_letter is not None
    stage, error_type, reason = case.dead_letter
    bad = case.bad(msgs)
    topic = pipeline.topic(bad.topic)
    letters = [d for d in got.records["DeadLetter"] if d["source_topic"] == topic and d["value"] == bad.value]
    if not letters:
        return f"no dead letter for the bad record on {topic}"
    d = letters[0]
    if (d["stage"], d["error_type"]) != (stage, error_type) or d["key"] != bad.key:
        return f"dead letter {d['stage']}/{d['error_type']} key {d['key']!r}, expected {stage}/{error_type}"
    if reason not in d["reason"]:
        return f"dead-letter reason does not mention {reason!r}: {d['reason'][:200]}"
    return None


def run_topic_corpus(settings: Settings, workdir: Path, progress: Progress = lambda _: None,
                     cases: list[TopicCase] | None = None, *, with_sink: bool = True,
                     timeout_s: float = 150.0) -> tuple[list[CaseResult], int]:
    """(one result per case, good outputs lost). Uses a private pipeline, deleted afterwards."""
    cases = cases if cases is not None else topic_cases()
    pipeline = Pipeline.create(settings, workdir / "topic-corpus")
    try:
        good = group_events("corpus-good", seed=11)
        expected = core_outputs(good, pipeline.settings)
        messages = _case_messages(pipeline, cases)
        pipeline.produce(good[: len(good) // 2])
        for msgs in messages.values():
            for m in msgs:
                pipeline.produce_raw(pipeline.topic(m.topic), m.key, m.value)
        pipeline.flush()
        pipeline.produce(good[len(good) // 2:])
        progress(f"bad inputs: {sum(map(len, messages.values()))} topic records for {len(cases)} cases "
                 f"+ {len(good)} good events produced; starting a worker")
        began = time.monotonic()
        pipeline.start_worker()

        def all_seen(got: Collected) -> bool:
            good_done = all(set(expected[n]) <= got.ids(n) for n in expected if n != "DeadLetter")
            return good_done and all(_satisfied(c, messages[c.id], pipeline, got) is None for c in cases)

        pipeline.collect(all_seen, timeout_s=timeout_s)
        got = pipeline.settle(quiet_s=2.0)
        progress(f"bad inputs: worker done in {time.monotonic() - began:.0f}s "
                 f"({len(got.records['DeadLetter'])} dead letters)")
        results = []
        for case in cases:
            problem = _satisfied(case, messages[case.id], pipeline, got)
            results.append(CaseResult(case.id, "topic", case.klass, case.what, problem is None,
                                      problem or ""))
        lost = compare(got, expected, [n for n in expected if n != "DeadLetter"]).lost
        alive = all(p.poll() is None for p in pipeline.workers)
        if not alive:
            results.append(CaseResult("topic.worker_alive", "topic", "worker survives", "worker still running",
                                      False, pipeline.log_tail()))
        if with_sink:
            results += _sink_cases(pipeline, cases, messages, workdir, progress)
        return results, lost
    finally:
        pipeline.close()


def _sink_cases(pipeline: Pipeline, cases: list[TopicCase], messages: dict[str, list[TopicMessage]],
                workdir: Path, progress: Progress) -> list[CaseResult]:
    dsn = f"chdb://{workdir / 'topic-corpus' / 'chdb'}"
    log = workdir / "topic-corpus" / "sink.log"
    began = time.monotonic()
    run_sink_until_idle(pipeline.settings, pipeline.topics.prefix, dsn, f"{pipeline.settings.processors.app_id}-sink",
                        log, idle_s=4.0)
    stored = query_sink(pipeline.settings, dsn)
    progress(f"bad inputs: sink done in {time.monotonic() - began:.0f}s "
             f"({len(stored['dead_letters'])} dead letters stored)")
    results = []
    for case in cases:
        if case.sink is None:
            continue
        bad = case.bad(messages[case.id])
        topic = pipeline.topic(bad.topic)
        found = [d for d in stored["dead_letters"] if d["stage"] == "sink" and d["source_topic"] == topic
                 and d["key"] == bad.key.decode()]
        if not found:
            problem = f"the sink stored no dead letter for the bad record on {topic}"
        elif found[0]["error_type"] != case.sink:
            problem = f"sink dead letter {found[0]['error_type']}, expected {case.sink}"
        else:
            problem = None
        results.append(CaseResult(case.id + ".sink", "sink", case.klass, f"{case.what} (read by the sink)",
                                  problem is None, problem or ""))
    worker_letters = {d["key"] for d in stored["dead_letters"] if d["stage"] != "sink"}
    wanted = {c.bad(messages[c.id]).key.decode() for c in cases if c.dead_letter}
    missing = wanted - worker_letters
    results.append(CaseResult("sink.stores_worker_dead_letters", "sink", "dead letters stored",
                              "every worker dead letter is a row in ClickHouse", not missing,
                              f"missing keys {sorted(missing)}" if missing else ""))
    return results
