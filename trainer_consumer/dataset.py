"""Batches of samples from the samples topic: a Kafka consumer group with manual commits.

The Kafka half is thin: it polls records, decodes them with the codec (token arrays stay zero-copy
views), hands them to the pure ``BatchBuilder`` (filters, counts, batch cutting) and commits the
offsets of a batch only when told to, after the training step. Undecodable records are sent to
the dead-letter topic with their reason and counted like filtered samples.

``SampleBatchDataset`` wraps the stream as a torch ``IterableDataset`` of ``Batch`` objects (use it
with ``batch_size=None`` and ``num_workers=0``: commits must come from the consuming process).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, TopicPartition
from torch.utils.data import IterableDataset

from schemas.codec import Codec, DecodeError, get_codec
from schemas.sealing import is_forgotten
from trainer_consumer.batching import Batch, BatchBuilder
from trainer_consumer.sample_view import TrainSample, sample_from_record

Position = tuple[str, int, int]  # (topic, partition, offset)
DeadLetterFn = Callable[[Message, DecodeError], None]

DECODE_ERROR = "decode_error"
# A sample whose subject was forgotten (its key is gone, or went while it waited for its step).
FORGOTTEN = "forgotten"


def commit_offsets(positions: list[Position]) -> list[TopicPartition]:
    """Per partition, the offset after the highest consumed one (Kafka's "next to read")."""
    highest: dict[tuple[str, int], int] = {}
    for topic, partition, offset in positions:
        key = (topic, partition)
        if offset > highest.get(key, -1):
            highest[key] = offset
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(highest.items())]


class SampleStream:
    """Polls the samples topic into batches; ``commit(batch)`` after the batch's step."""

    def __init__(self, consumer_conf: dict[str, Any], topic: str, builder: BatchBuilder[Position],
                 current_version: Callable[[], int], dead_letter: DeadLetterFn | None = None,
                 codec: Codec | None = None, start_after: list[list[Any]] | None = None) -> None:
        self.topic = topic
        self.builder = builder
        self.current_version = current_version
        self.dead_letter = dead_letter
        self.codec = codec or get_codec()
        self.consumer = Consumer(consumer_conf)
        self._backlog: deque[Message] = deque()
        self._opened_at: dict[str, int] = {}  # sample id -> when its subject's content was opened (unix us)
        # Offsets already consumed by the weights we start from (see ``checkpoint``): a crash
        # between publishing a policy and committing its batch must not train that batch twice.
        self._start_after = {(t, int(p)): int(o) for t, p, o in (start_after or [])}
        self._frontier: dict[tuple[str, int], int] = dict(self._start_after)
        # True while the consumer holds the assignment of a completed rebalance (see ``next_batch``).
        self._assigned = False
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = True  # also when the assignment is empty: the group has settled
        if not self._start_after:
            return  # the client assigns at the committed offsets
        committed = consumer.committed(partitions, timeout=30)
        ahead = []
        for tp in committed:
            start = self._start_after.get((tp.topic, tp.partition))
            if start is not None and tp.offset < start:  # also when nothing is committed (negative)
                tp.offset = start
                ahead.append(TopicPartition(tp.topic, tp.partition, start))
        consumer.assign(committed)
        if ahead:
            consumer.commit(offsets=ahead, asynchronous=False)

    def checkpoint(self, batch: Batch[Position]) -> list[list[Any]]:
        """JSON-able next offsets once ``batch`` is committed (every partition this stream has
        committed, advanced by the batch), stored with the policy its step publishes."""
        frontier = dict(self._frontier)
        for tp in commit_offsets(batch.positions):
            key = (tp.topic, tp.partition)
            frontier[key] = max(frontier.get(key, 0), tp.offset)
        return [[t, p, o] for (t, p), o in sorted(frontier.items())]

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Uncommitted records of a lost partition will be read again by its new owner: forget them.
        self._assigned = False  # a rebalance is under way until the next assignment
        lost = {(tp.topic, tp.partition) for tp in partitions}
        self.builder.retain(lambda pos: (pos[0], pos[1]) not in lost)
        self._backlog = deque(m for m in self._backlog if (m.topic(), m.partition()) not in lost)

    def _take_message(self, msg: Message) -> None:
        position: Position = (msg.topic(), msg.partition(), msg.offset())
        try:
            _, record = self.codec.decode(msg.value(), expect="Sample", topic=position[0],
                                          partition=position[1], offset=position[2])
        except DecodeError as exc:
            if self.dead_letter is not None:
                self.dead_letter(msg, exc)
            self.builder.reject(f"{DECODE_ERROR}:{type(exc).__name__}", position)
            return
        if is_forgotten(record):  # its subject's key is gone: never trained, counted in filtered_json
            self.builder.reject(FORGOTTEN, position)
            return
        sample = sample_from_record(record)
        if sample.subject:
            self._opened_at[sample.sample_id] = time.time_ns() // 1000
        self.builder.add(sample, position, self.current_version())

    def _drop_forgotten(self) -> None:
        """Right before a batch goes to a step: re-read the key store and drop the samples whose subject was
        forgotten after they were opened, so no sample of a forgotten subject trains after its forget."""
        keyring = getattr(self.codec.sealer, "keyring", None)
        destroyed_at = getattr(keyring, "destroyed_at", None)
        if not self._opened_at or destroyed_at is None:
            return
        keyring.refresh()

        def forgotten(sample: TrainSample) -> bool:
            at = destroyed_at.get(sample.subject) if sample.subject else None
            # Opened before its key went; or made from content older than the forget (a stage that held the
            # content in memory may have sealed it again under the subject's next key).
            return at is not None and (at >= self._opened_at.get(sample.sample_id, 0) or sample.created_at_us < at)

        self.builder.drop_kept(forgotten, FORGOTTEN)

    def _take(self) -> Batch[Position]:
        self._drop_forgotten()
        batch = self.builder.take()
        for sample in batch.samples:
            self._opened_at.pop(sample.sample_id, None)
        return batch

    def next_batch(self, idle_timeout_s: float, flush_partial: bool) -> Batch[Position] | None:
        """A full batch as soon as there is one. When no record arrives for ``idle_timeout_s``:
        the partial batch if ``flush_partial`` (and anything is pending), else None (pending
        records stay for the next call).

        Idle time counts only while the consumer holds its assignment: waiting for a rebalance to
        complete is not an idle topic. After a restart the group may hold a dead member until its
        session expires (a process killed without leaving the group); a consumer that stopped as
        idle meanwhile would stop having read nothing. The broker completes every rebalance within
        the rebalance time-out (``max.poll.interval.ms``), so the wait is bounded."""
        last_arrival = time.monotonic()
        while True:
            while self._backlog and not self.builder.full():
                self._take_message(self._backlog.popleft())
            if self.builder.full():
                return self._take()
            remaining = last_arrival + idle_timeout_s - time.monotonic()
            if remaining <= 0:
                break
            messages = self.consumer.consume(num_messages=max(1, self.builder.batch_size),
                                             timeout=min(remaining, 0.5))
            for msg in messages:
                err = msg.error()
                if err is None:
                    self._backlog.append(msg)
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
            if messages or not self._assigned:
                last_arrival = time.monotonic()
        if flush_partial and self.builder.has_pending():
            return self._take()
        return None

    def commit(self, batch: Batch[Position]) -> list[TopicPartition]:
        """Synchronously commits every record the batch accounts for (trained, filtered, dead)."""
        offsets = commit_offsets(batch.positions)
        if not offsets:
            return []
        committed = self.consumer.commit(offsets=offsets, asynchronous=False) or []
        failed = [tp for tp in committed if tp.error is not None]
        if failed:
            raise KafkaException(failed[0].error)
        for tp in offsets:
            key = (tp.topic, tp.partition)
            self._frontier[key] = max(self._frontier.get(key, 0), tp.offset)
        return offsets

    def committed(self) -> dict[int, int]:
        """The group's committed offset per partition of the topic (partitions never committed are
        left out)."""
        meta = self.consumer.list_topics(self.topic, timeout=10).topics[self.topic]
        parts = [TopicPartition(self.topic, p) for p in sorted(meta.partitions)]
        return {tp.partition: tp.offset for tp in self.consumer.committed(parts, timeout=10)
                if tp.offset != OFFSET_INVALID}

    def close(self) -> None:
        self.consumer.close()


class SampleBatchDataset(IterableDataset):
    """Iterates ``Batch`` objects from a ``SampleStream``; stops after ``idle_timeout_s`` without
    records when ``until_idle``. Commit each batch with ``dataset.stream.commit(batch)`` after its step."""

    def __init__(self, stream: SampleStream, idle_timeout_s: float = 5.0, until_idle: bool = False) -> None:
        self.stream = stream
        self.idle_timeout_s = idle_timeout_s
        self.until_idle = until_idle

    def __iter__(self) -> Iterator[Batch[Position]]:
        while True:
            batch = self.stream.next_batch(self.idle_timeout_s, flush_partial=self.until_idle)
            if batch is not None:
                yield batch
            elif self.until_idle:
                return
