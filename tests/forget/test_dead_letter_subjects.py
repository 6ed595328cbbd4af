"""A dead letter copies its input, content and all: when the input belongs to a subject, the letter names the
subject, so it is sealed under the subject's key on the topic and blanked with the subject in ClickHouse
(processors/dead_letters.py, processors/stream/outputs.py, processors/stream/feedback/letters.py, sinks/sink.py)."""

from __future__ import annotations

from collections import Counter

import orjson

from processors.dead_letters import dead_letter, subject_of
from processors.feedback.join import UnmatchedFeedback
from processors.stream.feedback.letters import FeedbackLetters
from processors.stream.feedback.messages import Source, feedback_message, for_the_join, read_message
from processors.stream.topics import StreamTopics
from schemas.builders import make_call
from schemas.codec import Codec
from schemas.examples import example_record
from schemas.sealing import MemoryKeyring, Sealer, is_forgotten
from sinks.sink import dead_letter_record


class _NoOpening(MemoryKeyring):
    """Reading a subject must not look up a key (a dead letter is written on the stage's hot path)."""

    def opening_key(self, key_id: str) -> bytes | None:
        raise AssertionError(f"key {key_id} looked up to read a subject")


def test_the_subject_of_an_input_is_read_without_opening_its_content() -> None:
    keyring = _NoOpening()
    codec = Codec(sealer=Sealer(keyring))
    sealed = codec.encode("CallRecord", make_call("r1", "a1", 0, [1, 2, 3], [4], subject="tenant/u1",
                                                  request_json='{"q": "CANARY-DL"}'))
    plain = codec.encode("CallRecord", make_call("r2", "a1", 0, [1, 2, 3], [4]))
    assert subject_of(codec, sealed) == "tenant/u1"
    assert subject_of(codec, plain) is None
    assert subject_of(codec, b"\xc3\x01not a record") is None  # undecodable: the letter has no subject
    assert subject_of(codec, None) is None


def test_a_letter_of_a_subjects_input_is_sealed_and_forgotten_with_it() -> None:
    keyring = MemoryKeyring()
    codec = Codec(sealer=Sealer(keyring))
    value = Codec().encode("CallRecord", make_call("r1", "a1", 0, [1, 2, 3], [4], subject="u1",
                                                   request_json='{"q": "CANARY-DL"}'))  # written in the clear
    letter = dead_letter(stage="assembler", source_topic="tokentrail.calls", partition=0, offset=7, key=b"r1",
                         value=value, error="bad", created_at_us=1, subject=subject_of(codec, value))
    data = codec.encode("DeadLetter", letter)
    assert b"CANARY-DL" not in data
    _, opened = codec.decode(data)
    assert opened["subject"] == "u1" and opened["value"] == value
    keyring.destroy("u1")
    _, gone = codec.decode(data)
    assert is_forgotten(gone) and b"CANARY-DL" not in gone["value"]


def test_feedback_letters_name_the_feedbacks_subject() -> None:
    keyring = MemoryKeyring()
    codec = Codec(sealer=Sealer(keyring))
    feedback = dict(example_record(codec.store.schema("Feedback").raw), event_id="fb-1", target_id="r-9",
                    subject="u2", text="CANARY-FEEDBACK", sealed=None)
    letters = FeedbackLetters(codec, StreamTopics("test-dl."), Counter())
    _topic, _key, data = letters.unmatched(UnmatchedFeedback("fb-1", "no such rollout"), feedback,
                                           Source("tokentrail.feedback", 0, 3))
    assert b"CANARY-FEEDBACK" not in data
    _, letter = codec.decode(data)
    assert letter["subject"] == "u2"
    assert codec.decode(letter["value"])[1]["text"] == "CANARY-FEEDBACK"


def test_the_sinks_letter_of_a_readable_message_names_its_subject() -> None:
    record = dead_letter_record("tokentrail.samples", 0, 5, b"k", b"v", "RowError", "bad sample", 1, subject="u3")
    assert record["subject"] == "u3"
    assert dead_letter_record("tokentrail.samples", 0, 6, b"k", b"??", "CorruptRecord", "x", 1)["subject"] is None


def test_the_feedback_joins_topics_and_tables_carry_feedback_sealed() -> None:
    """The join's internal messages and its and the resolver's changelogs hold the feedback as JSON: its text
    rides sealed, opens in the letters made from it, and is gone with the subject's key."""
    keyring = MemoryKeyring()
    codec = Codec(sealer=Sealer(keyring))
    feedback = dict(example_record(codec.store.schema("Feedback").raw), event_id="fb-2", target_id="r-7",
                    subject="u4", text="CANARY-JOIN", details_json='{"note": "CANARY-DETAIL"}', sealed=None)
    carried = for_the_join(codec, feedback)
    message = feedback_message(carried, Source("tokentrail.feedback", 0, 4))
    assert b"CANARY" not in message
    incoming = read_message(message, "tokentrail.feedback-by-rollout")
    assert b"CANARY" not in orjson.dumps(incoming["feedback"])  # what the join and resolver tables store
    letters = FeedbackLetters(codec, StreamTopics("test-dl."), Counter())
    _topic, _key, data = letters.unmatched(UnmatchedFeedback("fb-2", "no such rollout"), incoming["feedback"],
                                           incoming["source"])
    copy = codec.decode(codec.decode(data)[1]["value"])[1]
    assert copy["text"] == "CANARY-JOIN" and copy["details_json"] == '{"note": "CANARY-DETAIL"}'
    keyring.destroy("u4")
    letter = codec.decode(data)[1]  # the letter is the subject's too: nothing of it opens
    assert is_forgotten(letter) and letter["value"] == bytes(len(letter["value"]))
    plain = dict(feedback, subject=None, event_id="fb-3")  # no subject: carried as it is
    assert for_the_join(codec, plain)["text"] == "CANARY-JOIN"
