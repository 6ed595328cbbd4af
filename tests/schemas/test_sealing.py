"""Sealing subjects' content (schemas/sealing.py, issue 31 item 2): the content fields of every record type
are encrypted into the envelope and blanked, everything else stays readable; opening restores the record
exactly; a destroyed key leaves it blanked and sealed; an envelope moved or tampered with is refused."""

from __future__ import annotations

import copy

import pytest

from schemas.builders import make_call
from schemas.codec import Codec, CorruptRecord, get_codec
from schemas.examples import example_record
from schemas.sealing import CONTENT_FIELDS, MemoryKeyring, Sealer, content_places, is_forgotten, unwrap_key, wrap_key
from schemas.tokens import unpack_ids


def _example(name: str) -> dict:
    """The example record with a canary in every content field."""
    record = example_record(get_codec().store.schema(name).raw)
    record.update(subject="tenant-a/user-1", sealed=None)
    for holder, field in content_places(name, record):
        holder[field] = "CANARY-77" if isinstance(holder[field], str) else b"CANARY-77-BYTES!"
    return record


@pytest.mark.parametrize("name", sorted(CONTENT_FIELDS))
def test_every_content_record_round_trips_sealed(name: str) -> None:
    keyring = MemoryKeyring()
    codec = Codec(sealer=Sealer(keyring))
    record = _example(name)
    original = copy.deepcopy(record)
    data = codec.encode(name, record)
    assert record == original  # the caller's record is left as it was
    assert b"CANARY-77" not in data  # no content in the clear
    _, opened = codec.decode(data, expect=name)
    assert opened == original
    _, without_key = Codec().decode(data, expect=name)  # a reader with no sealer sees blanks
    assert is_forgotten(without_key) and without_key["subject"] == "tenant-a/user-1"
    keyring.destroy("tenant-a/user-1")
    _, forgotten = codec.decode(data, expect=name)
    assert is_forgotten(forgotten) and forgotten != original


def test_facts_stay_readable_and_token_arrays_keep_their_length() -> None:
    keyring = MemoryKeyring()
    call = make_call("r1", "a1", 0, [5, 6, 7, 8], [9, 10, 11], subject="u1", request_json='{"secret": "canary-x"}')
    sealed = Sealer(keyring).seal("CallRecord", call)
    assert sealed["prompt"]["sha256"] == call["prompt"]["sha256"] and sealed["prompt"]["length"] == 4
    assert sealed["output_logprobs"] == call["output_logprobs"]
    assert list(unpack_ids(sealed["output_ids"])) == [0, 0, 0]
    assert sealed["request_json"] == "" and sealed["sealed"] is not None
    assert list(unpack_ids(call["output_ids"])) == [9, 10, 11]  # not mutated
    # No subject: nothing sealed, nothing copied.
    plain = make_call("r1", "a1", 1, [5], [6])
    assert Sealer(keyring).seal("CallRecord", plain) is plain


def test_a_moved_or_tampered_envelope_is_refused() -> None:
    codec = Codec(sealer=Sealer(MemoryKeyring()))
    a = make_call("r1", "a1", 0, [1, 2], [3], subject="u1")
    b = make_call("r1", "a1", 1, [1, 2], [3], subject="u1")
    sealed_a = codec.decode(codec.encode("CallRecord", a), expect="CallRecord")
    assert sealed_a[1]["sealed"] is None
    raw_a = Sealer(codec.sealer.keyring).seal("CallRecord", a)  # type: ignore[union-attr]
    moved = dict(Sealer(codec.sealer.keyring).seal("CallRecord", b), sealed=raw_a["sealed"])  # type: ignore[union-attr]
    with pytest.raises(CorruptRecord, match="does not open"):
        codec.decode(Codec().encode("CallRecord", moved), expect="CallRecord")


def test_master_key_wrapping() -> None:
    master, other = bytes(range(32)), bytes(32)
    wrapped = wrap_key(master, "u1#1", b"k" * 32)
    assert unwrap_key(master, "u1#1", wrapped) == b"k" * 32
    with pytest.raises(ValueError):
        unwrap_key(other, "u1#1", wrapped)
    with pytest.raises(ValueError):
        unwrap_key(master, "u2#1", wrapped)  # bound to its key id
