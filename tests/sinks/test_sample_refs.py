"""Samples' token columns stored by reference to their calls (migration 0006): written only where the
writer proves them equal, read back whole and hash-checked, a damaged reference named by its sample."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable

import pytest
from clickhouse_connect.driver.client import Client

from schemas.codec import get_codec
from schemas.tokens import pack_ids, unpack_ids
from sinks.audit import run_audit
from sinks.rows import RowError, from_row, to_row
from sinks.sample_refs import SampleRefError, SampleRefs
from sinks.sink import SinkOptions, run_sink
from sinks.store import load_records, select_rows, write_records
from testkit.storage_records import Event, GroupSpec, synthetic_group
from tokentrail.settings import Settings

from .pipeline_data import pipeline_events, sample_config
from .test_sink import key_of, make_topics, produce


def stored(ch: Client) -> dict[str, tuple[bool, bool, bool, int]]:
    """Per sample: (ids referenced, logprobs referenced, ids column empty, tokens)."""
    rows = ch.query(
        "SELECT event_id, notEmpty(input_ref_call_ids), logprobs_sha256 != '', input_ids = '', tokens "
        "FROM samples FINAL"
    ).result_rows
    return {r[0]: (bool(r[1]), bool(r[2]), bool(r[3]), int(r[4])) for r in rows}


def samples_of(events: list[Event]) -> list[dict]:
    return sorted((r for n, r in events if n == "Sample"), key=lambda s: s["event_id"])


def corrupt_sample(events: list[Event], kind: str = "CALL") -> tuple[list[Event], dict]:
    """The events with one sample whose first sampled token is not what its call sampled."""
    sample = copy.deepcopy(next(r for n, r in events if n == "Sample" and r["kind"] == kind))
    out_seg = next(s for s in sample["segments"] if s["source"] == "OUTPUT")
    ids = unpack_ids(sample["input_ids"]).copy()
    ids[out_seg["sample_start"]] += 1
    sample["input_ids"] = pack_ids(ids)
    swapped = [(n, sample if n == "Sample" and r["event_id"] == sample["event_id"] else r) for n, r in events]
    return swapped, sample


@pytest.mark.parametrize(("merge", "pack"), [(False, False), (True, False), (True, True)])
def test_every_layout_is_stored_by_reference_and_read_back_identical(ch: Client, merge: bool, pack: bool) -> None:
    events, _group, _members = pipeline_events(11, sample_config(merge, pack))
    write_records(ch, events)
    samples = samples_of(events)
    tokens = {s["event_id"]: len(s["input_ids"]) // 4 for s in samples}
    assert stored(ch) == {sid: (True, True, True, n) for sid, n in tokens.items()}
    assert load_records(ch, "samples", order_by="event_id") == samples
    # A column list naming a token column gets what its rebuild needs, and only what it asked for.
    rows = select_rows(ch, "samples", columns="event_id, rollout_logprobs", order_by="event_id")
    assert rows == [{"event_id": s["event_id"], "rollout_logprobs": s["rollout_logprobs"]} for s in samples]
    assert all(r.passed for r in run_audit(ch))


def test_what_the_writer_cannot_prove_is_stored_whole_and_the_audit_still_catches_it(ch: Client) -> None:
    groups = [synthetic_group(GroupSpec(group_index=i, pack=True)) for i in range(2)]
    events, bad = corrupt_sample([e for g in groups for e in g.events])
    early = groups[1].of("Sample")  # written before any of their calls is stored: nothing to reference
    write_records(ch, [("Sample", s) for s in early])
    write_records(ch, [e for e in events if not (e[0] == "Sample" and e[1] in early)])
    layout = stored(ch)
    assert layout[bad["event_id"]][0] is False and layout[bad["event_id"]][2] is False  # ids whole
    assert layout[bad["event_id"]][1] is True  # its logprobs still match the call
    assert all(layout[s["event_id"]][:3] == (False, False, False) for s in early)
    assert sum(v[0] for v in layout.values()) == len(layout) - len(early) - 1
    assert load_records(ch, "samples", order_by="event_id") == samples_of(events)
    token = next(r for r in run_audit(ch) if r.key == "token_traceability")
    assert token.failing_ids() == [bad["event_id"]]
    assert "token ids differ from the call's sampled ids" in token.failures[0].reason


def test_a_call_whose_prompt_cannot_be_rebuilt_is_never_referenced(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=2, turns=3))
    base = g.call_ids[0]  # the first call of the first rollout: the base of its second call's prompt
    events = [(n, r) for n, r in g.events if not (n == "CallRecord" and r["call_id"] == base)]
    write_records(ch, events)
    first_rollout = g.rollout_ids[0]
    layout = stored(ch)
    for s in g.of("Sample"):
        referenced = layout[s["event_id"]][0]
        assert referenced == (s["rollout_ids"][0] != first_rollout and s["kind"] == "CALL"), s["segments"][0]
    assert load_records(ch, "samples", order_by="event_id") == samples_of(events)


def test_a_damaged_reference_fails_the_read_and_the_audit_naming_the_sample(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=2, turns=3, pack=True))
    write_records(ch, g.events)
    target, other = [s for s in g.of("Sample") if s["kind"] == "CALL"][:2]
    other_call = other["segments"][0]["call_id"]
    ch.command(
        "ALTER TABLE samples UPDATE input_ref_call_ids = [{c:String}] WHERE event_id = {e:String} "
        "SETTINGS mutations_sync = 2",
        parameters={"c": other_call, "e": target["event_id"]},
    )
    with pytest.raises(SampleRefError, match=f"sample {target['event_id']}: rebuilt input_ids"):
        load_records(ch, "samples")
    token = next(r for r in run_audit(ch) if r.key == "token_traceability")
    assert token.failing_ids() == [target["event_id"]]
    assert "stored by reference cannot be rebuilt" in token.failures[0].reason

    ch.command(
        "ALTER TABLE samples UPDATE input_ref_call_ids = ['no-such-call'] WHERE event_id = {e:String} "
        "SETTINGS mutations_sync = 2",
        parameters={"e": target["event_id"]},
    )
    with pytest.raises(SampleRefError, match=f"sample {target['event_id']}: referenced call no-such-call"):
        load_records(ch, "samples")

    ch.command(
        "ALTER TABLE samples UPDATE logprobs_sha256 = repeat('0', 64) WHERE event_id = {e:String} "
        "SETTINGS mutations_sync = 2",
        parameters={"e": other["event_id"]},
    )
    with pytest.raises(SampleRefError, match=f"sample {other['event_id']}: rebuilt rollout_logprobs"):
        select_rows(ch, "samples", "event_id = {e:String}", {"e": other["event_id"]})
    # A row read without rebuilding never becomes a record with empty tokens.
    (raw,) = select_rows(ch, "samples", "event_id = {e:String}", {"e": other["event_id"]}, rebuild=False)
    with pytest.raises(RowError, match="stored by reference"):
        from_row("samples", raw)


def test_encoding_is_pure_and_repeatable() -> None:
    g = synthetic_group(GroupSpec(rollouts=1, turns=2, pack=True))
    refs = SampleRefs()
    sample = next(r for r in g.of("Sample") if r["kind"] == "PACKED")
    _, row = to_row("Sample", sample)
    assert refs.unknown_calls(dict(row)) == set(g.call_ids)
    assert refs.encode(dict(row)) == row  # no calls known: unchanged
    for call in g.of("CallRecord"):
        refs.note_call(to_row("CallRecord", call)[1])
    once = refs.encode(dict(row))
    assert once["input_ids"] == b"" and once["rollout_logprobs"] == b""
    assert once["input_ref_call_ids"] == g.call_ids  # one per packed sequence, in order
    assert refs.encode(dict(once)) == once and refs.unknown_calls(once) == set()
    assert SampleRefs(max_calls=0).encode(dict(row)) == row


def test_the_sink_references_calls_stored_before_the_samples_arrive(
    kafka_bootstrap: str, tokentrail_settings: Settings, new_topic: Callable[..., str], ch: Client
) -> None:
    """Calls stored by one sink run, samples by a later one (a fresh memo): looked up in ClickHouse."""
    topic_map, topic_of, dead_topic = make_topics(new_topic)
    codec = get_codec()
    groups = [synthetic_group(GroupSpec(group_index=i, pack=True, bodies="chat", tools=1)) for i in range(2)]
    events, bad = corrupt_sample([e for g in groups for e in g.events])
    group_id = f"test-sample-refs-{uuid.uuid4().hex[:8]}"

    def sink_run(batch: list[Event]) -> None:
        produce(tokentrail_settings, [(topic_of[n], key_of(n, r), codec.encode(n, r)) for n, r in batch])
        run_sink(
            ch,
            tokentrail_settings.kafka,
            SinkOptions(group_id=group_id, idle_s=3.0, batch_rows=40, progress_every_s=0),
            topic_map=topic_map,
            dead_letter_topic=dead_topic,
            log=lambda _line: None,
        )

    sink_run([e for e in events if e[0] != "Sample"])
    sink_run([e for e in events if e[0] == "Sample"])
    layout = stored(ch)
    assert {sid for sid, v in layout.items() if not v[0]} == {bad["event_id"]}
    assert all(v[1] for v in layout.values())
    assert load_records(ch, "samples", order_by="event_id") == samples_of(events)
    token = next(r for r in run_audit(ch) if r.key == "token_traceability")
    assert token.failing_ids() == [bad["event_id"]]
