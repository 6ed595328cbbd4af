"""The key store of record on the real broker (schemas/kafka/key_store.py): a key made by one process opens
in another; destroying it (tombstones on the compacted topic) stops it opening everywhere within the refresh
time; a new key is made for the subject's later content; keys wrapped by another master key never open."""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas.builders import make_call
from schemas.codec import Codec
from schemas.kafka.config import KafkaSettings, consumer_config
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer, is_forgotten
from tokentrail.settings import Settings


def _raw_values(kafka: KafkaSettings, topic: str) -> list[bytes | None]:
    consumer = Consumer(consumer_config(kafka, "t-raw", **{"enable.partition.eof": False}))
    try:
        tp = TopicPartition(topic, 0)
        _low, end = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out: list[bytes | None] = []
        deadline = time.monotonic() + 30
        while len(out) < end and time.monotonic() < deadline:
            out += [m.value() for m in consumer.consume(100, timeout=0.5) if m.error() is None]
        return out
    finally:
        consumer.close()


def test_keys_open_across_processes_and_stop_opening_once_destroyed(
    tokentrail_settings: Settings, forget_settings: ForgetSettings
) -> None:
    kafka = tokentrail_settings.kafka
    writer, reader = KafkaKeyStore(kafka, forget_settings), KafkaKeyStore(kafka, forget_settings)
    try:
        write, read = Codec(sealer=Sealer(writer)), Codec(sealer=Sealer(reader))
        call = make_call("r1", "a1", 0, [1, 2, 3], [4, 5], subject="user-1", request_json='{"q": "CANARY-9"}')
        data = write.encode("CallRecord", call)
        assert read.decode(data)[1]["request_json"] == '{"q": "CANARY-9"}'  # the reader caught up to the key
        (key_id,) = writer.key_ids("user-1")
        # The key is on the topic only wrapped: the data key's bytes never appear.
        assert all(writer._keys[key_id] not in (v or b"") for v in _raw_values(kafka, forget_settings.keys_topic))

        assert writer.destroy("user-1") == [key_id]
        assert is_forgotten(write.decode(data)[1])
        deadline = time.monotonic() + 10  # the reader re-reads the topic within refresh_s (0.2 s)
        while not is_forgotten(read.decode(data)[1]):
            assert time.monotonic() < deadline, "the destroyed key still opens in the other process"
            time.sleep(0.05)
        later = KafkaKeyStore(kafka, forget_settings)  # a process started after the forget
        assert is_forgotten(Codec(sealer=Sealer(later)).decode(data)[1])
        later.close()
        # The subject's later content gets a new key, which opens.
        again = write.encode("CallRecord", dict(call, call_id="c2", event_id="c2"))
        assert read.decode(again)[1]["request_json"] == '{"q": "CANARY-9"}'
        assert writer.key_ids("user-1") != [key_id]
    finally:
        writer.close()
        reader.close()

    other_master = ForgetSettings(**{**forget_settings.model_dump(), "master_key": "11" * 32})
    stranger = KafkaKeyStore(kafka, other_master)
    try:
        assert is_forgotten(Codec(sealer=Sealer(stranger)).decode(again)[1])
    finally:
        stranger.close()


def test_keys_past_their_retention_are_destroyed_and_replaced(
    tokentrail_settings: Settings, forget_settings: ForgetSettings
) -> None:
    clock = [1_000_000_000_000_000]
    settings = ForgetSettings(**{**forget_settings.model_dump(), "tenant_retention_days": {"t1": 1.0}})
    store = KafkaKeyStore(tokentrail_settings.kafka, settings, now_us=lambda: clock[0])
    try:
        codec = Codec(sealer=Sealer(store))
        short = codec.encode("CallRecord", make_call("r1", "a1", 0, [1], [2], subject="t1/u"))
        kept = codec.encode("CallRecord", make_call("r2", "a1", 0, [1], [2], subject="t2/u"))
        assert store.expire() == []
        clock[0] += 2 * 86_400_000_000  # two days later
        assert store.expire() == [f"t1/u#{1_000_000_000_000_000}"]
        assert is_forgotten(codec.decode(short)[1]) and not is_forgotten(codec.decode(kept)[1])
        # The tenant's new content gets a fresh key with its own retention.
        fresh = codec.encode("CallRecord", make_call("r3", "a1", 0, [1], [2], subject="t1/u"))
        assert not is_forgotten(codec.decode(fresh)[1])
    finally:
        store.close()


def test_a_forgotten_event_makes_its_keys_unreadable_before_the_next_refresh(
    tokentrail_settings: Settings, forget_settings: ForgetSettings
) -> None:
    """A reader that stored a Forgotten event must not open the subject's later records with a key it cached
    before the tombstone reached it (the sink calls ``forget_keys`` with the event's key ids)."""
    slow = ForgetSettings(**{**forget_settings.model_dump(), "refresh_s": 3600.0})  # no refresh in this test
    writer, reader = KafkaKeyStore(tokentrail_settings.kafka, forget_settings), \
        KafkaKeyStore(tokentrail_settings.kafka, slow)
    try:
        write, read = Codec(sealer=Sealer(writer)), Codec(sealer=Sealer(reader))
        data = write.encode("CallRecord", make_call("r1", "a1", 0, [1, 2, 3], [4, 5], subject="user-2"))
        assert not is_forgotten(read.decode(data)[1])  # the reader has the key cached
        gone = writer.destroy("user-2")
        assert not is_forgotten(read.decode(data)[1])  # stale: its refresh is an hour away
        read.sealer.forget_keys(gone)  # what the sink does on the Forgotten event
        assert is_forgotten(read.decode(data)[1])
    finally:
        writer.close()
        reader.close()
