"""The residue scan of a real topic: every partition read to its end, canaries found in values, headers and
aborted transactions, nothing in AES-GCM ciphertext or across two token arrays."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.codec import get_codec
from schemas.kafka.config import producer_config
from schemas.kafka.residue import TopicSelection, scan_topics
from schemas.residue import Matcher, Needles, Tally, record_decoder
from tests.residue_data import CANARY, RUN, call_record, encode
from tokentrail.settings import Settings

NewTopic = Callable[..., str]


def _produce(settings: Settings, topic: str, records: list[tuple[int, bytes, bytes | None, list]]) -> list[str]:
    """(partition, key, value, headers) each; returns ``topic[partition]@offset`` of each, in order."""
    producer = Producer(producer_config(settings.kafka))
    where: dict[int, str] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        where[int(msg.key().split(b"#")[1])] = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"

    for i, (partition, key, value, headers) in enumerate(records):
        producer.produce(topic, key=key + b"#%d" % i, value=value, partition=partition, headers=headers,
                         on_delivery=delivered)
    assert producer.flush(60) == 0
    return [where[i] for i in range(len(records))]


def _aborted(settings: Settings, topic: str, value: bytes) -> None:
    """A record written in a transaction that is then aborted: it stays in the log, readable uncommitted."""
    producer = Producer(producer_config(settings.kafka, **{"transactional.id": f"residue-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, key=b"aborted", value=value, partition=2)
    producer.flush(60)
    producer.abort_transaction(60)


def test_every_partition_is_scanned_and_only_readable_content_is_reported(
        new_topic: NewTopic, kafka_bootstrap: str, tokentrail_settings: Settings) -> None:
    topic = new_topic(partitions=3)
    plain = encode(call_record([5, 6], [7], request_json=json.dumps({"content": f"hello {CANARY}"})))
    key, nonce = AESGCM.generate_key(bit_length=256), os.urandom(12)
    sealed = nonce + AESGCM(key).encrypt(nonce, encode(call_record([1, *RUN], [2], json.dumps([CANARY]))), None)
    clean = encode(call_record([5, 6, 7], [8]))
    where = _produce(tokentrail_settings, topic, [
        (0, b"rollout-a", plain, []),  # the canary in a request body
        (1, b"rollout-b", clean, [("note", CANARY.encode())]),  # ... in a header only
        (1, b"rollout-c", encode(call_record([3, *RUN, 3], [4])), []),  # the token run in packed prompt ids
        (2, b"rollout-d", sealed, []),  # both, encrypted: not readable
        (2, b"rollout-e", encode(call_record([3, *RUN[:2]], [*RUN[2:], 4])), []),  # the run across two arrays
        (0, b"rollout-f", None, []),  # a tombstone
    ])
    _aborted(tokentrail_settings, topic, plain)

    tally = Tally()
    lines: list[str] = []
    matcher = Matcher(Needles((CANARY,), (RUN,)), record_decoder(get_codec()))
    scan_topics(tokentrail_settings.kafka, matcher, tally, selection=TopicSelection(names=(topic,)),
                timeout_s=120, progress=lines.append)

    assert tally.complete, tally.incomplete
    assert tally.scanned["partitions"] == 3
    assert tally.scanned["kafka_records"] == 7  # six, and the aborted one (the transaction markers are not records)
    found = {loc.where: loc for loc in tally.locations}
    aborted = next(w for w in found if w.startswith(f"{topic}[2]@"))
    assert set(found) == {where[0], where[1], where[2], aborted}
    assert {h.needle for h in found[where[0]].hits} == {"canary[0]"}
    assert {h.field for h in found[where[1]].hits} == {"header:note"}
    assert {h.needle for h in found[where[2]].hits} == {"tokens[0]"}
    assert any("3 partitions" in line for line in lines)


def test_topics_are_selected_by_name_pattern() -> None:
    available = ["tokentrail.calls", "tokentrail-processors-assembler-changelog", "run7.tokentrail.samples",
                 "other.topic", "__consumer_offsets"]
    assert TopicSelection().select(available) == [
        "run7.tokentrail.samples", "tokentrail-processors-assembler-changelog", "tokentrail.calls"]
    assert TopicSelection(names=("other.topic", "gone")).select(available) == ["other.topic"]
