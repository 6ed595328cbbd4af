"""Identical full prompts (a group's task prompt) stored once: which rows share, exact reads, broken references."""

from __future__ import annotations

import numpy as np
import pytest
from clickhouse_connect.driver.client import Client

from schemas.prompt_delta import full_prompt
from sinks.ddl import packed_read_sql
from sinks.rows import to_row
from sinks.sample_refs import SampleRefs
from sinks.shared_prompts import MIN_SHARED_BYTES, WINDOW_US, SharedPromptError, SharedPrompts
from sinks.store import CallTokenCache, insert_grouped, load_records, select_rows, write_records
from testkit.storage_records import GroupSpec, synthetic_group

T0 = 1_800_000_000 * 1_000_000  # a received_at in microseconds, at the start of a 15-minute window


def _row(call_id: str, ids: np.ndarray, received_at_us: int = T0, base: str | None = None) -> dict:
    prompt = full_prompt(ids)
    return {
        "call_id": call_id,
        "received_at_us": received_at_us,
        "prompt_length": prompt["length"],
        "prompt_sha256": prompt["sha256"],
        "prompt_ids": prompt["ids"],
        "prompt_base_call_id": base,
        "prompt_shared_call_id": None,
    }


TASK = np.arange(1000, 1000 + MIN_SHARED_BYTES // 4, dtype=np.uint32)


def test_rows_of_one_insert_name_the_smallest_call_id_with_their_prompt() -> None:
    rows = [_row("c", TASK), _row("a", TASK), _row("b", TASK), _row("d", TASK + 1)]
    shared = SharedPrompts()
    shared.assign(rows)
    by_id = {r["call_id"]: r for r in rows}
    assert by_id["a"]["prompt_shared_call_id"] is None and len(by_id["a"]["prompt_ids"]) == len(TASK) * 4
    for later in ("b", "c"):
        assert by_id[later]["prompt_shared_call_id"] == "a" and by_id[later]["prompt_ids"] == b""
    assert by_id["d"]["prompt_shared_call_id"] is None  # another prompt
    assert shared.shared == 2


def test_deltas_tiny_prompts_and_other_windows_stay_whole() -> None:
    rows = [
        _row("a", TASK),
        _row("b", TASK, base="a"),  # the record's own delta: not a full prompt
        _row("c", TASK, received_at_us=T0 + WINDOW_US),  # another 15-minute window: maybe another day
    ]
    tiny = [_row("x", TASK[:8]), _row("y", TASK[:8])]
    SharedPrompts().assign(rows + tiny)
    assert [r["prompt_shared_call_id"] for r in rows + tiny] == [None] * 5


def test_only_prompts_of_a_successful_insert_are_named_later() -> None:
    shared = SharedPrompts()
    shared.assign([_row("m", TASK)])
    shared.insert_failed()
    later = _row("z", TASK)
    shared.assign([later])
    assert later["prompt_shared_call_id"] is None  # "m" may never have been stored
    shared.stored_ok()
    again, smaller = _row("zz", TASK), _row("b", TASK)
    shared.assign([again, smaller])
    # "b" sorts before the stored "z": it stays whole (no reference may point up) and becomes the target.
    assert smaller["prompt_shared_call_id"] is None and again["prompt_shared_call_id"] == "b"


def test_the_memo_is_bounded() -> None:
    shared = SharedPrompts(max_prompts=2)
    for i in range(3):
        shared.assign([_row(f"a{i}", TASK + i)])
        shared.stored_ok()
    assert len(shared.stored) == 2
    first_again = _row("b0", TASK)
    shared.assign([first_again])
    assert first_again["prompt_shared_call_id"] is None  # forgotten: stored whole, still exact


def _group(**kw: object) -> list[dict]:
    spec = GroupSpec(rollouts=4, turns=3, prompt_tokens=600, **kw)  # type: ignore[arg-type]
    return synthetic_group(spec).of("CallRecord")


def test_a_groups_task_prompt_is_stored_once_and_read_back_exactly(ch: Client) -> None:
    calls = _group(bodies="chat", tools=2)
    firsts = [c for c in calls if c["call_index"] == 0]
    assert len({c["prompt"]["sha256"] for c in firsts}) == 1 and all(c["prompt"]["ids"] for c in firsts)
    write_records(ch, [("CallRecord", c) for c in calls])
    stored = ch.query(
        "SELECT call_id, length(prompt_ids_arr), prompt_shared_call_id, request_base_call_id, length(request_json) "
        "FROM calls FINAL WHERE call_index = 0 ORDER BY call_id"
    ).result_rows
    assert [n for _, n, _, _, _ in stored] == [600, 0, 0, 0]
    assert [ref for _, _, ref, _, _ in stored] == [None, *[stored[0][0]] * 3]
    # Their request bodies (the same task and tools) are deltas on the first one's: nothing in between.
    assert [(body_ref, chars) for _, _, _, body_ref, chars in stored[1:]] == [(stored[0][0], 0)] * 3
    # Every reader sees the records as they were on Kafka: whole prompts, no delta base.
    assert load_records(ch, "calls", order_by="event_id") == sorted(calls, key=lambda c: c["event_id"])
    cache = CallTokenCache(ch)
    for c in calls:
        assert cache.prompt(c["call_id"]).tobytes() == _full_ids(calls, c)
    # A narrow read naming the ids gets them whole too, without the columns the rebuild added.
    ids_only = f"call_id, {packed_read_sql('prompt_ids')} AS prompt_ids"
    narrow = select_rows(ch, "calls", "call_index = 0", columns=ids_only)
    assert {r["prompt_ids"] for r in narrow} == {firsts[0]["prompt"]["ids"]}
    assert set(narrow[0]) == {"call_id", "prompt_ids"}


def _full_ids(calls: list[dict], call: dict) -> bytes:
    """The call's full prompt bytes from the records alone (later prompts extend prompt ‖ output)."""
    if call["prompt"]["ids"] is not None:
        return call["prompt"]["ids"]
    base = next(c for c in calls if c["call_id"] == call["prompt"]["base_call_id"])
    seq = _full_ids(calls, base) + base["output_ids"]
    return seq[: 4 * call["prompt"]["base_prefix_len"]] + call["prompt"]["new_ids"]


def test_distinct_task_prompts_share_nothing(ch: Client) -> None:
    write_records(ch, [("CallRecord", c) for c in _group(task_prompt="distinct")])
    assert ch.query("SELECT countIf(prompt_shared_call_id IS NOT NULL) FROM calls").result_rows[0][0] == 0


def test_a_reference_across_inserts_and_a_broken_one(ch: Client) -> None:
    calls = _group()
    firsts = sorted((c for c in calls if c["call_index"] == 0), key=lambda c: c["call_id"])
    shared = SharedPrompts()
    insert_grouped(ch, {"calls": [to_row("CallRecord", firsts[0])[1]]}, SampleRefs(), shared)
    second = to_row("CallRecord", firsts[1])[1]
    insert_grouped(ch, {"calls": [second]}, SampleRefs(), shared)
    assert second["prompt_shared_call_id"] == firsts[0]["call_id"]
    assert load_records(ch, "calls", order_by="call_id") == firsts[:2]
    # A row naming a call that is not stored (a corrupt or hand-edited table) fails loudly, by name.
    orphan = to_row("CallRecord", firsts[2])[1]
    orphan.update(prompt_ids=b"", prompt_shared_call_id="no-such-call")
    insert_grouped(ch, {"calls": [orphan]}, SampleRefs(), SharedPrompts(max_prompts=0))
    with pytest.raises(SharedPromptError, match=f"call {firsts[2]['call_id']}: shared prompt call no-such-call"):
        load_records(ch, "calls")
    # So does a target whose ids are not the row's prompt.
    ch.command(f"ALTER TABLE calls DELETE WHERE call_id = '{firsts[2]['call_id']}' SETTINGS mutations_sync = 2")
    wrong = to_row("CallRecord", firsts[2])[1]
    wrong.update(prompt_ids=b"", prompt_shared_call_id=firsts[0]["call_id"], prompt_length=5)
    insert_grouped(ch, {"calls": [wrong]}, SampleRefs(), SharedPrompts(max_prompts=0))
    with pytest.raises(SharedPromptError, match="does not match its sha256"):
        load_records(ch, "calls")


def test_a_second_sink_names_the_prompt_the_first_stored_and_never_a_corrupt_one(ch: Client) -> None:
    firsts = sorted((c for c in _group() if c["call_index"] == 0), key=lambda c: c["call_id"])
    # Another writer stored a corrupt copy first: the right sha256 and length, other ids.
    corrupt = to_row("CallRecord", firsts[0])[1]
    ids = bytearray(corrupt["prompt_ids"])
    ids[:4] = (123).to_bytes(4, "little")
    corrupt["prompt_ids"] = bytes(ids)
    insert_grouped(ch, {"calls": [corrupt]}, SampleRefs(), SharedPrompts(max_prompts=0))
    # Sink A stores rollouts 1 and 2 (2 naming 1); sink B, with nothing in memory, stores 3 and finds 1.
    sink_a, sink_b = SharedPrompts(), SharedPrompts()
    insert_grouped(ch, {"calls": [to_row("CallRecord", c)[1] for c in firsts[1:3]]}, SampleRefs(), sink_a)
    late = to_row("CallRecord", firsts[3])[1]
    insert_grouped(ch, {"calls": [late]}, SampleRefs(), sink_b)
    assert late["prompt_shared_call_id"] == firsts[1]["call_id"]
    refs = dict(ch.query("SELECT call_id, prompt_shared_call_id FROM calls").result_rows)
    assert refs == {
        firsts[0]["call_id"]: None,
        firsts[1]["call_id"]: None,
        firsts[2]["call_id"]: firsts[1]["call_id"],
        firsts[3]["call_id"]: firsts[1]["call_id"],
    }
    stored = {r["call_id"]: r for r in load_records(ch, "calls", "call_id != {c:String}", {"c": firsts[0]["call_id"]})}
    assert [stored[c["call_id"]] for c in firsts[1:]] == firsts[1:]


def test_a_row_names_only_a_call_of_its_own_subject() -> None:
    rows = [_row("a", TASK) | {"subject": "t/alice"}, _row("b", TASK) | {"subject": "t/bob"},
            _row("c", TASK) | {"subject": "t/bob"}, _row("d", TASK) | {"subject": None}, _row("e", TASK)]
    SharedPrompts().assign(rows)
    assert [r["prompt_shared_call_id"] for r in rows] == [None, None, "b", None, "d"]


def test_forgetting_a_subject_leaves_every_other_subjects_prompt_readable(ch: Client) -> None:
    """The same task prompt in two users' sessions (the forgetting demo's audit once failed on it: bob's call
    named alice's prompt, which her forget blanked)."""
    from sinks.forget import blank_subject

    firsts = sorted((c for c in _group() if c["call_index"] == 0), key=lambda c: c["call_id"])
    alice = [dict(c, subject="t/alice") for c in firsts[:2]]
    bob = [dict(c, subject="t/bob") for c in firsts[2:]]
    insert_grouped(ch, {"calls": [to_row("CallRecord", c)[1] for c in alice[:1] + bob[:1]]}, SampleRefs(),
                   SharedPrompts())
    # Another sink, with nothing in memory, stores the rest: it finds each subject's own stored copy.
    insert_grouped(ch, {"calls": [to_row("CallRecord", c)[1] for c in alice[1:] + bob[1:]]}, SampleRefs(),
                   SharedPrompts())
    refs = dict(ch.query("SELECT call_id, prompt_shared_call_id FROM calls").result_rows)
    assert refs == {alice[0]["call_id"]: None, alice[1]["call_id"]: alice[0]["call_id"],
                    bob[0]["call_id"]: None, bob[1]["call_id"]: bob[0]["call_id"]}
    assert blank_subject(ch, "t/alice")["calls"] == 2
    kept = load_records(ch, "calls", "subject = {s:String}", {"s": "t/bob"}, order_by="call_id")
    assert [c["prompt"] for c in kept] == [c["prompt"] for c in bob]
