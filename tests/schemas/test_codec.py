"""Round trips of every schema, framing, typed decode errors, and schema compatibility on fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro
import numpy as np
import pytest

from schemas.codec import (
    SINGLE_OBJECT_MAGIC,
    Codec,
    CorruptRecord,
    SchemaMismatch,
    SchemaStore,
    TruncatedPayload,
    UnknownFingerprint,
    get_codec,
)
from schemas.examples import example_record
from schemas.fixtures import FIXTURE_DIR, fixture_path
from schemas.kafka.registry_framing import kafka_codec
from schemas.tokens import unpack_floats, unpack_ids

CODEC = get_codec()
SCHEMA_NAMES = sorted(CODEC.store.current)
EXPECTED_EVENTS = {
    "CallRecord", "AttemptStarted", "EnvStep", "AttemptFinished", "CompletedRollout", "RolloutGroup",
    "Score", "Reward", "Credit", "Sample", "TrainerStep", "DeadLetter",
    "Feedback", "ReleaseDecision",
}


def test_every_event_of_the_design_has_a_schema() -> None:
    assert set(SCHEMA_NAMES) >= EXPECTED_EVENTS


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_round_trip_every_schema(name: str) -> None:
    record = example_record(CODEC.store.schema(name).raw)
    data = CODEC.encode(name, record)
    assert data[:2] == SINGLE_OBJECT_MAGIC
    assert data[2:10] == CODEC.store.schema(name).fingerprint
    decoded_name, decoded = CODEC.decode(data, expect=name)
    assert decoded_name == name
    assert decoded == record


def test_single_object_header_is_the_avro_spec_fingerprint() -> None:
    # CRC-64-AVRO of the parsing canonical form, little-endian, as the Avro spec's single-object encoding.
    entry = CODEC.store.schema("Score")
    canonical = fastavro.schema.to_parsing_canonical_form(entry.raw)
    assert entry.fingerprint.hex() == fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")


def test_token_fields_are_packed_bytes_with_zero_copy_views(call_record_factory) -> None:
    record = call_record_factory(prompt_len=131_072, output_len=1024)
    _name, decoded = CODEC.decode(CODEC.encode("CallRecord", record))
    ids = unpack_ids(decoded["prompt"]["ids"])
    assert ids.shape == (131_072,)
    assert ids.base is not None  # a view over the decoded bytes, not a copy
    np.testing.assert_array_equal(ids, unpack_ids(record["prompt"]["ids"]))
    np.testing.assert_array_equal(unpack_floats(decoded["output_logprobs"]),
                                  unpack_floats(record["output_logprobs"]))


def test_decode_errors_name_topic_partition_offset() -> None:
    good = CODEC.encode("Score", example_record(CODEC.store.schema("Score").raw))
    where = {"topic": "tokentrail.scores", "partition": 3, "offset": 42}
    cases = [
        (b"", TruncatedPayload),
        (good[:6], TruncatedPayload),
        (good[:-3], TruncatedPayload),
        (b"\xc3\x01" + b"\xff" * 8 + good[10:], UnknownFingerprint),
        (b"garbage!" + good, CorruptRecord),
        (good + b"\x00\x01", CorruptRecord),
    ]
    for data, error in cases:
        with pytest.raises(error) as info:
            CODEC.decode(data, **where)
        assert info.value.topic == "tokentrail.scores"
        assert (info.value.partition, info.value.offset) == (3, 42)
        assert "tokentrail.scores[3]@42" in str(info.value)
    with pytest.raises(SchemaMismatch):
        CODEC.decode(good, expect="CallRecord", **where)


def test_corrupt_body_never_decodes_silently() -> None:
    record = example_record(CODEC.store.schema("Reward").raw)
    data = bytearray(CODEC.encode("Reward", record))
    data[11] = 0xFF  # the first string's length byte: now claims a huge negative/positive length
    with pytest.raises((CorruptRecord, TruncatedPayload)):
        CODEC.decode(bytes(data))


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_current_schema_has_a_committed_fixture(name: str) -> None:
    entry = CODEC.store.schema(name)
    assert fixture_path(name, entry.fingerprint).exists(), (
        f"no fixture for the current {name} schema: copy the previous .avsc to schemas/history/ "
        "and run `tokentrail schemas fixtures`")


FIXTURES = sorted(FIXTURE_DIR.glob("*.bin"))


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_every_committed_fixture_still_decodes(path: Path) -> None:
    """A breaking schema change (a field without a default, a changed type) fails here."""
    name = path.name.split("-")[0]
    decoded_name, record = CODEC.decode(path.read_bytes(), expect=name)
    assert decoded_name == name
    fastavro.validation.validate(record, CODEC.store.schema(name).parsed, raise_errors=True)


def test_a_breaking_change_is_caught(tmp_path: Path) -> None:
    """Adding a field without a default cannot read old data: prove the check bites."""
    raw = json.loads(json.dumps(CODEC.store.schema("Score").raw))
    old = tmp_path / "old"
    new = tmp_path / "new"
    (old / "history").mkdir(parents=True)
    (new / "history").mkdir(parents=True)
    (old / "score.avsc").write_text(json.dumps(raw))
    data = Codec(SchemaStore(old)).encode("Score", example_record(raw))
    raw["fields"].append({"name": "added_without_default", "type": "string"})
    (new / "score.avsc").write_text(json.dumps(raw))
    (new / "history" / "score.v1.avsc").write_text((old / "score.avsc").read_text())
    with pytest.raises(CorruptRecord):
        Codec(SchemaStore(new)).decode(data)
    raw["fields"][-1]["default"] = "filled"
    (new / "score.avsc").write_text(json.dumps(raw))
    _, record = Codec(SchemaStore(new)).decode(data)
    assert record["added_without_default"] == "filled"


def test_confluent_wire_format_with_mock_registry() -> None:
    codec = kafka_codec("mock://tokentrail-tests")
    record = example_record(codec.store.schema("Credit").raw)
    data = codec.encode("Credit", record)
    assert data[0] == 0 and len(data) > 5
    assert codec.decode(data) == ("Credit", record)
