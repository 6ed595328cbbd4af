"""Rebuild the attempt registry from Kafka when a gateway starts, so a restart or a rolling deploy does not
break the harnesses it serves (event-sourced, as the rest of the system is).

The pure core, ``AttemptFold``, folds ``AttemptStarted`` / ``EnvStep`` / ``AttemptFinished`` events and
``CallRecord``s into what the registry needs (``attempts.RestoredAttempt``): which attempts are open, their
next call and event index, the outputs later prompts splice and the last prompts calls delta-encode on.
It is order-independent and idempotent (a record seen twice, e.g. re-sent from a spool, changes nothing).
Each attempt's API key is derived from its ids (keys.py), so nothing secret is read from Kafka.

The shell, ``recover``, runs before the gateway serves: it checks that a broker answers (else it gives up at
once, so a gateway starting while Kafka is away still serves from its spool), waits for the spool to drain
(records spooled by the previous process, on this spool, count, and the only place they are is the spool),
then reads the environment topic from ``now - lookback`` to its end, then the calls topic, keeping only
the records of attempts still open (filtered by the record key, the rollout id, before decoding). If the
spool does not drain or Kafka cannot be read within the time allowed, nothing is restored: calls on
earlier attempts get a 404 rather than an index that could collide with one already issued.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from producers.gateway.attempt_state import RECENT_CALLS, DeliveredCall, SampledOutput
from producers.gateway.attempts import UNATTRIBUTED, AttemptRegistry, RestoredAttempt, Tombstone
from schemas.ids import call_id as make_call_id
from schemas.prompt_delta import PromptReconstructionError, full_prompt, reconstruct_prompt
from schemas.tokens import NO_IDS, IdArray, pack_floats, pack_ids, unpack_ids

log = logging.getLogger("tokentrail.gateway.recovery")

# Calls of an attempt are read from its start's time minus this, for clocks that disagree a little.
CLOCK_SLACK_S = 300.0
ENV_SCHEMAS = ("AttemptStarted", "EnvStep", "AttemptFinished")
# A broker that does not answer this fast at start-up is taken as away: nothing is restored.
PROBE_TIMEOUT_S = 5.0
Progress = Callable[[str], None]


# ------------------------------------------------------------------------------------ the pure fold


@dataclass
class _CallSeen:
    call_id: str
    call_index: int
    ok: bool
    chat: bool  # a chat call's output may be spliced into later chat prompts
    prompt: dict[str, Any]
    output_ids: bytes


@dataclass
class _AttemptSeen:
    rollout_id: str
    attempt_id: str
    attempt_number: int | None = None  # None until its AttemptStarted is seen
    start: dict[str, Any] = field(default_factory=dict)
    started_at_us: int = 0
    calls_upto: int = -1
    events_upto: int = -1
    finished: Tombstone | None = None
    calls: dict[int, _CallSeen] = field(default_factory=dict)
    template: dict[str, Any] | None = None  # a call of the attempt, its bulk left out (for stand-ins)
    last_activity_us: int = 0


class AttemptFold:
    """Events and call records in, attempts to restore out. Pure: no Kafka, no clock."""

    def __init__(self) -> None:
        self._attempts: dict[tuple[str, str], _AttemptSeen] = {}

    def _attempt(self, record: dict[str, Any]) -> _AttemptSeen:
        key = (record["rollout_id"], record["attempt_id"])
        seen = self._attempts.get(key)
        if seen is None:
            seen = self._attempts[key] = _AttemptSeen(*key)
        return seen

    def add(self, schema_name: str, record: dict[str, Any]) -> None:
        if record.get("rollout_id") == UNATTRIBUTED:
            return
        seen = self._attempt(record)
        seen.last_activity_us = max(seen.last_activity_us, _activity_us(schema_name, record))
        if schema_name == "AttemptStarted":
            seen.attempt_number = int(record["attempt_number"])
            seen.started_at_us = int(record["created_at_us"])
            seen.start = {"task_input": _json(record.get("task_input_json")), "group_id": record.get("group_id"),
                          "group_key": dict(record.get("group_key") or {}),
                          "expected_group_size": record.get("expected_group_size"),
                          "metadata": _json(record.get("metadata_json")) or {}, "subject": record.get("subject")}
        elif schema_name == "EnvStep":
            seen.events_upto = max(seen.events_upto, int(record["event_index"]))
        elif schema_name == "AttemptFinished":
            seen.finished = Tombstone(int(record["call_count"]), int(record["event_count"]), str(record["status"]))
            seen.calls.clear()  # a finished attempt needs no splicing
        elif schema_name == "CallRecord":
            index = int(record["call_index"])
            seen.calls_upto = max(seen.calls_upto, index)
            if seen.finished is None:
                seen.calls[index] = _CallSeen(record["call_id"], index, record["status"] == "OK",
                                              record.get("prefix_mode") != "tokens", record["prompt"],
                                              bytes(record["output_ids"]))
                if seen.template is None:
                    seen.template = {k: v for k, v in record.items() if k not in _BULK}

    def add_all(self, records: Iterable[tuple[str, dict[str, Any]]]) -> AttemptFold:
        for name, record in records:
            self.add(name, record)
        return self

    def open_rollouts(self) -> set[str]:
        """Rollout ids with a started, unfinished attempt: the keys whose call records are wanted."""
        return {s.rollout_id for s in self._attempts.values() if s.attempt_number is not None and not s.finished}

    def earliest_open_start_us(self) -> int | None:
        starts = [s.started_at_us for s in self._attempts.values() if s.attempt_number is not None and not s.finished]
        return min(starts) if starts else None

    def lost_calls(self) -> list[dict[str, Any]]:
        """Stand-in records for the indices an open attempt issued that never reached Kafka: a gateway
        that died with calls in flight recorded a later one but not this one. Each says so (status ERROR,
        no tokens) under the call id the lost call would have had, so the attempt has no hole and can
        still complete (as for quarantined records; nothing trains on it)."""
        out = []
        for seen in self._attempts.values():
            if seen.attempt_number is None or seen.finished is not None or seen.template is None:
                continue
            out += [lost_call(seen.template, index) for index in range(seen.calls_upto + 1)
                    if index not in seen.calls]
        return out

    def result(self) -> list[RestoredAttempt]:
        """Every attempt whose start was seen (others began before the look-back: not restorable)."""
        out = []
        for seen in self._attempts.values():
            if seen.attempt_number is None:
                continue
            if seen.finished is not None:
                out.append(RestoredAttempt(seen.rollout_id, seen.attempt_id, seen.attempt_number, seen.start,
                                           seen.finished.call_count, seen.finished.event_count, seen.finished))
                continue
            outputs = tuple(SampledOutput(c.call_id, c.call_index, unpack_ids(c.output_ids), None)
                            for c in sorted(seen.calls.values(), key=lambda c: c.call_index) if c.ok and c.chat)
            out.append(RestoredAttempt(seen.rollout_id, seen.attempt_id, seen.attempt_number, seen.start,
                                       seen.calls_upto + 1, seen.events_upto + 1, None,
                                       _recent_prompts(seen.calls), outputs, seen.last_activity_us))
        return out


def _recent_prompts(calls: dict[int, _CallSeen]) -> tuple[DeliveredCall, ...]:
    """The last successful calls with their whole prompts (delta bases), rebuilt and hash-checked; a
    prompt that cannot be rebuilt is left out (the next call is then stored whole, not wrongly)."""
    by_id = {c.call_id: c for c in calls.values()}
    prompts: dict[str, IdArray] = {}

    def prompt_of(call: _CallSeen, depth: int = 0) -> IdArray:
        if call.call_id not in prompts:
            if depth > len(calls):
                raise PromptReconstructionError("delta bases form a cycle")

            def base(call_id: str) -> tuple[IdArray, IdArray] | None:
                found = by_id.get(call_id)
                return None if found is None else (prompt_of(found, depth + 1), unpack_ids(found.output_ids))

            prompts[call.call_id] = reconstruct_prompt(call.prompt, base)
        return prompts[call.call_id]

    kept = []
    for call in sorted((c for c in calls.values() if c.ok), key=lambda c: c.call_index)[-RECENT_CALLS:]:
        try:
            kept.append(DeliveredCall(call.call_id, call.call_index, prompt_of(call), unpack_ids(call.output_ids)))
        except PromptReconstructionError as exc:
            log.warning("call %s: prompt not rebuilt (%s); not kept as a delta base", call.call_id, exc)
    return tuple(kept)


def _activity_us(schema_name: str, record: dict[str, Any]) -> int:
    """When the gateway saw this record's call or event (wall clock, microseconds; 0 if not said)."""
    if schema_name == "CallRecord":
        return int((record.get("timings") or {}).get("received_at_us") or 0)
    return int(record.get("created_at_us") or 0)


_BULK = ("prompt", "output_ids", "output_logprobs", "request_json", "response_json")
LOST_REASON = ("the gateway stopped before this call was recorded (a crash with calls in flight); its caller "
               "got no answer and the index stays unused")


def lost_call(template: dict[str, Any], index: int) -> dict[str, Any]:
    """A CallRecord standing in for call ``index`` of ``template``'s attempt, which was never recorded."""
    cid = make_call_id(template["rollout_id"], template["attempt_id"], index)
    note = orjson.dumps({"lost": {"reason": LOST_REASON}}).decode()
    return {**template, "event_id": cid, "call_id": cid, "call_index": index, "status": "ERROR",
            "error": {"type": "lost_in_restart", "message": LOST_REASON, "status_code": 503},
            "prompt": full_prompt(NO_IDS), "output_ids": pack_ids(NO_IDS), "output_logprobs": pack_floats([]),
            "finish_reason": "error", "spliced_outputs": 0, "prefix_breaks": [], "scripted": False,
            "request_json": note, "response_json": note}


def _json(text: str | None) -> Any:
    return orjson.loads(text) if text else None


# ------------------------------------------------------------------------------------ the Kafka shell


class RecoveryTimeout(RuntimeError):
    pass


@dataclass(frozen=True)
class RecoveryReport:
    restored: int  # open attempts rebuilt
    finished: int  # finished attempts known again (their late calls get a 409)
    env_records: int
    call_records: int
    seconds: float
    skipped: str = ""  # why nothing was restored, when nothing was
    lost_calls: int = 0  # stand-ins recorded for calls a crash left unrecorded

    def as_dict(self) -> dict[str, Any]:
        return {"restored": self.restored, "finished": self.finished, "env_records": self.env_records,
                "call_records": self.call_records, "lost_calls": self.lost_calls,
                "seconds": round(self.seconds, 3), "skipped": self.skipped}


@dataclass(frozen=True)
class KafkaRecoverySource:
    """Where and how far back the attempts' events are read."""

    consumer_config: dict[str, Any]  # schemas.kafka.config.consumer_config (a group id is replaced)
    calls_topic: str
    env_topic: str
    lookback_s: float
    timeout_s: float
    # Several gateway processes (peers.py): each rebuilds only the rollouts it owns, so no other process
    # sweeps, ends or stands in for calls of an attempt it does not serve. None: every rollout.
    owns: Callable[[str], bool] | None = None

    def read(self, topic: str, since_ms: int, deadline: float,
             keys: set[bytes] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Records of ``topic`` from ``since_ms`` to the end it had when reading began; with ``keys`` only
        those records whose key is one of them are decoded."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        from schemas.codec import get_codec

        codec = get_codec()
        consumer = Consumer({**self.consumer_config, "group.id": f"tokentrail-gateway-recovery-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "enable.partition.eof": True})
        try:
            metadata = consumer.list_topics(topic, timeout=max(1.0, deadline - time.monotonic()))
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                return
            parts = [TopicPartition(topic, p, since_ms) for p in sorted(found.partitions)]
            starts = consumer.offsets_for_times(parts, timeout=max(1.0, deadline - time.monotonic()))
            ends: dict[int, int] = {}
            assign = []
            for tp in starts:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                         timeout=max(1.0, deadline - time.monotonic()))
                if tp.offset >= 0 and tp.offset < high:
                    ends[tp.partition] = high
                    assign.append(TopicPartition(topic, tp.partition, tp.offset))
            if not assign:
                return
            consumer.assign(assign)
            while ends:
                if time.monotonic() > deadline:
                    raise RecoveryTimeout(f"reading {topic} took longer than {self.timeout_s:g} s")
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        ends.pop(msg.partition(), None)
                    else:
                        log.warning("recovery: reading %s: %s", topic, msg.error())
                    continue
                partition, offset = msg.partition(), msg.offset()
                if offset + 1 >= ends.get(partition, 0):
                    ends.pop(partition, None)
                if keys is not None and msg.key() not in keys:
                    continue
                try:
                    yield codec.decode(msg.value(), topic=topic, partition=partition, offset=offset)
                except Exception as exc:  # one unreadable record must not stop a gateway from starting
                    log.warning("recovery: skipped an unreadable record of %s: %s", topic, exc)
        finally:
            consumer.close()

    def probe(self, timeout_s: float) -> None:
        """Raise unless a broker answers within ``timeout_s`` (a gateway starting while Kafka is away
        serves from its spool at once, as before, instead of waiting out the whole recovery time)."""
        from confluent_kafka import Consumer

        consumer = Consumer({**self.consumer_config, "group.id": f"tokentrail-gateway-probe-{uuid.uuid4().hex}"})
        try:
            consumer.list_topics(self.env_topic, timeout=timeout_s)
        finally:
            consumer.close()

    def fold(self, progress: Progress) -> tuple[list[RestoredAttempt], list[dict[str, Any]], int, int]:
        """Read both topics and fold them; blocking (run it in a thread). Raises RecoveryTimeout."""
        deadline = time.monotonic() + self.timeout_s
        since_ms = int((time.time() - self.lookback_s) * 1000)
        fold = AttemptFold()
        env = 0
        for name, record in self.read(self.env_topic, since_ms, deadline):
            if name in ENV_SCHEMAS and (self.owns is None or self.owns(record["rollout_id"])):
                fold.add(name, record)
                env += 1
        calls = 0
        open_rollouts = fold.open_rollouts()
        earliest = fold.earliest_open_start_us()
        progress(f"recovery: {env} environment events read, {len(open_rollouts)} rollouts with an open attempt")
        if open_rollouts and earliest is not None:
            calls_since = max(since_ms, int(earliest / 1000 - CLOCK_SLACK_S * 1000))
            keys = {rid.encode() for rid in open_rollouts}
            for name, record in self.read(self.calls_topic, calls_since, deadline, keys):
                if name == "CallRecord":
                    fold.add(name, record)
                    calls += 1
        return fold.result(), fold.lost_calls(), env, calls


Deliver = Callable[[dict[str, Any]], Awaitable[Any]]


async def recover(registry: AttemptRegistry, publisher: Any, source: KafkaRecoverySource,
                  progress: Progress = log.info, deliver_call: Deliver | None = None) -> RecoveryReport:
    """Drain the spool, read Kafka, record stand-ins for calls lost in a crash (``deliver_call``), restore
    the registry; never raises (a failure restores nothing)."""
    began = time.monotonic()

    def skipped(why: str) -> RecoveryReport:
        log.error("recovery: nothing restored: %s; calls on attempts started before this start get a 404", why)
        return RecoveryReport(0, 0, 0, 0, time.monotonic() - began, why)

    try:
        await asyncio.to_thread(source.probe, min(PROBE_TIMEOUT_S, source.timeout_s))
    except Exception as exc:
        return skipped(f"no Kafka broker answered ({exc})")
    wait_drained = getattr(publisher, "wait_drained", None)
    if wait_drained is not None and not await wait_drained(source.timeout_s):
        return skipped(f"the spool did not drain to Kafka within {source.timeout_s:g} s (records of the "
                       "attempts may wait there)")
    remaining = max(1.0, source.timeout_s - (time.monotonic() - began))
    bounded = KafkaRecoverySource(source.consumer_config, source.calls_topic, source.env_topic,
                                  source.lookback_s, remaining, source.owns)
    try:
        attempts, lost, env, calls = await asyncio.to_thread(bounded.fold, progress)
    except Exception as exc:
        return skipped(f"Kafka could not be read ({exc})")
    stood_in = 0
    for record in lost if deliver_call is not None else []:
        try:
            await deliver_call(record)
            stood_in += 1
        except Exception as exc:  # the attempt still serves; it cannot complete until this is recorded
            log.error("recovery: could not record the stand-in for lost call %s: %s", record["call_id"], exc)
    restored = registry.restore(attempts)
    report = RecoveryReport(restored, sum(a.finished is not None for a in attempts), env, calls,
                            time.monotonic() - began, lost_calls=stood_in)
    progress(f"recovery: {restored} open attempts restored ({report.finished} finished ones known, "
             f"{stood_in} lost calls recorded as such) from {env} environment events and {calls} call records "
             f"in {report.seconds:.1f}s")
    return report
