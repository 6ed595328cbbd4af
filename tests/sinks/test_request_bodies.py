"""Request bodies stored as deltas on earlier calls' bodies: exact rebuilds, checks, and what is saved;
long delta chains (bodies and prompts) read back in a fixed number of queries."""

from __future__ import annotations

import random

import orjson
import pytest
from clickhouse_connect.driver.client import Client

from schemas.ids import ids_digest
from sinks.request_bodies import MIN_SAVED_CHARS, REQUEST_COLUMNS, RequestBodyDeltas, rebuild_request_bodies
from sinks.rows import to_row
from sinks.store import CallTokenCache, load_records, select_rows, write_records
from sinks.text_delta import (
    RecentTexts,
    TextDelta,
    TextDeltaError,
    apply_delta,
    cut_copies,
    encode_delta,
    paste_copies,
    text_digest,
)
from testkit.storage_records import GroupSpec, synthetic_group


def _rebuilt(text: str, base: str) -> str:
    return apply_delta(base, encode_delta(text, base), len(text), text_digest(text))


@pytest.mark.parametrize(
    ("text", "base"),
    [
        ("", ""),
        ("abc", ""),
        ("", "abc"),
        ("same", "same"),
        ("aaaa", "aaa"),  # prefix and suffix could overlap: they must not
        ("aaa", "aaaa"),
        ('{"m":[1,2,3],"t":"x"}', '{"m":[1,2],"t":"x"}'),
        ("héllo wörld ✓ 𝄞 end", "héllo ✓ 𝄞 end"),  # code points, not bytes
    ],
)
def test_delta_rebuilds_the_text_exactly(text: str, base: str) -> None:
    delta = encode_delta(text, base)
    assert delta.prefix + delta.suffix <= min(len(text), len(base))
    assert _rebuilt(text, base) == text


def test_delta_rebuilds_random_edits() -> None:
    rng = random.Random(5)
    for _ in range(300):
        base = "".join(rng.choice("ab{}\"é") for _ in range(rng.randrange(0, 40)))
        cut = rng.randrange(0, len(base) + 1)
        text = base[:cut] + "".join(rng.choice("abx") for _ in range(rng.randrange(0, 6))) + base[cut:]
        assert _rebuilt(text, base) == text
        assert _rebuilt(base, text) == base


def test_a_delta_keeps_only_what_differs() -> None:
    base = '{"messages":[' + "m" * 5000 + '],"tools":[' + "t" * 3000 + "]}"
    text = base.replace("],", ',"new turn"],', 1)
    delta = encode_delta(text, base)
    assert delta.middle == ',"new turn"'
    assert delta.prefix + delta.suffix == len(base)


def test_rebuild_checks_length_sha256_and_ranges() -> None:
    text, base = "abcXdef", "abcdef"
    delta = encode_delta(text, base)
    with pytest.raises(TextDeltaError, match="sha256"):
        apply_delta(base, delta, len(text), text_digest("abcYdef"))
    with pytest.raises(TextDeltaError, match="characters"):
        apply_delta(base, delta, len(text) + 1, text_digest(text))
    with pytest.raises(TextDeltaError, match="base"):
        apply_delta("ab", TextDelta(5, 0, ""), 5, text_digest("abcde"))


def _answer(content: str) -> str:
    return orjson.dumps({"choices": [{"message": {"content": content, "role": "assistant"}}]}).decode()


@pytest.mark.parametrize(
    "content",
    ["plain words " * 10, 'quotes " and \\ backslashes\n and\ttabs ' * 4, "unicode é ✓ 𝄞 " * 8],
)
def test_the_base_answer_is_cut_out_and_pasted_back(content: str) -> None:
    reference = _answer(content)
    middle = orjson.dumps([{"content": content, "role": "assistant"}, {"content": "tool result", "role": "tool"}])
    text = "," + middle.decode()[1:-1]
    stored, copies = cut_copies(text, reference, 64)
    assert len(copies) == 1 and orjson.dumps(content).decode()[1:-1] not in stored
    assert paste_copies(stored, copies, reference) == text


def test_copies_take_every_long_string_once_and_leave_short_ones() -> None:
    reference = orjson.dumps({"a": "x" * 80, "b": "y" * 100, "c": "short"}).decode()
    text = "[" + "y" * 100 + "|" + "x" * 80 + "|" + "x" * 80 + "|short]"
    stored, copies = cut_copies(text, reference, 64)
    assert stored == "[||" + "x" * 80 + "|short]" and len(copies) == 2  # each string is copied once
    assert paste_copies(stored, copies, reference) == text
    assert cut_copies("nothing in common", reference, 64) == ("nothing in common", [])
    with pytest.raises(TextDeltaError, match="out of range"):
        paste_copies(stored, [(0, len(reference) - 2, 5)], reference)
    with pytest.raises(TextDeltaError, match="out of range"):
        paste_copies(stored, [(len(stored) + 1, 0, 1)], reference)


def test_recent_texts_stay_within_their_bound() -> None:
    recent = RecentTexts(max_chars=10)
    recent.put("a", "12345")
    recent.put("b", "12345")
    assert recent.get("a") == "12345"  # now most recent
    recent.put("c", "123")
    assert recent.get("b") is None and recent.get("a") == "12345" and recent.chars <= 10
    recent.put("huge", "x" * 11)
    assert recent.get("huge") is None


def _call_rows(bodies: str = "chat") -> tuple[list[dict], list[dict]]:
    calls = synthetic_group(GroupSpec(rollouts=2, turns=4, bodies=bodies, tools=3)).of("CallRecord")
    return calls, [to_row("CallRecord", c)[1] for c in calls]


def test_later_calls_store_only_their_new_turn() -> None:
    calls, rows = _call_rows()
    deltas = RequestBodyDeltas()
    for row in rows:
        deltas.encode(row)
    assert deltas.deltas == 6 and deltas.full == 2  # each rollout's first call has no base
    for call, row in zip(calls, rows, strict=True):
        if call["call_index"] == 0:
            assert row["request_base_call_id"] is None and row["request_json"] == call["request_json"]
        else:
            assert row["request_base_call_id"] == call["prompt"]["base_call_id"]
            assert len(row["request_json"]) < len(call["request_json"]) // 3
            # The base call's answer, repeated in this body, is stored once: in the base's response.
            base = next(c for c in calls if c["call_id"] == row["request_base_call_id"])
            answer = orjson.loads(base["response_json"])["choices"][0]["message"]["content"]
            assert row["request_copies"] and orjson.dumps(answer).decode()[1:-1] not in row["request_json"]
        assert row["request_sha256"] == text_digest(call["request_json"])
    stored = {r["call_id"]: dict(r) for r in rows}
    rebuild_request_bodies(rows, lambda ids: [stored[i] for i in ids if i in stored])
    assert [r["request_json"] for r in rows] == [c["request_json"] for c in calls]


def test_bases_come_only_from_the_same_partition() -> None:
    _, rows = _call_rows()
    deltas = RequestBodyDeltas()
    for i, row in enumerate(rows):
        row.update(src_topic="calls", src_partition=i % 2)  # every call on another partition than its base
        deltas.encode(row)
    assert deltas.deltas == 0 and all(r["request_base_call_id"] is None for r in rows)


def test_small_savings_are_stored_whole() -> None:
    _, rows = _call_rows(bodies="tiny")  # identical 15-character bodies: a delta would cost more
    deltas = RequestBodyDeltas()
    for row in rows:
        deltas.encode(row)
    assert deltas.deltas == 0 and len(rows[0]["request_json"]) < MIN_SAVED_CHARS


def test_calls_round_trip_through_chdb_with_delta_bodies(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=3, turns=5, bodies="chat", tools=4))
    write_records(ch, g.events)
    calls = sorted(g.of("CallRecord"), key=lambda c: c["event_id"])
    assert load_records(ch, "calls", order_by="event_id") == calls
    stored, whole = ch.query(
        "SELECT sum(length(request_json)), sum(request_length) FROM calls FINAL"
    ).result_rows[0]
    assert stored < whole / 2
    # One later call alone: its bases are fetched through the chain.
    last = max(calls, key=lambda c: c["call_index"])
    (row,) = select_rows(ch, "calls", "call_id = {c:String}", {"c": last["call_id"]})
    assert row["request_json"] == last["request_json"]


def test_bodies_read_without_their_bases_responses_fetch_them(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=1, turns=4, bodies="chat", tools=2))
    write_records(ch, g.events)
    columns = "call_id, request_json, " + ", ".join(c for c in REQUEST_COLUMNS if c not in ("call_id", "request_json",
                                                                                           "response_json"))
    rows = select_rows(ch, "calls", columns=columns, order_by="call_index")
    assert [r["request_json"] for r in rows] == [c["request_json"] for c in g.of("CallRecord")]
    assert all("response_json" not in r for r in rows)


@pytest.mark.parametrize(
    ("index", "corruption"),
    [
        (1, "request_json = concat(request_json, ' ')"),  # a stored middle
        (2, "request_copies = arrayMap(c -> (c.1, c.2 + 1, c.3), request_copies)"),  # a copy off by one
    ],
)
def test_a_corrupted_stored_body_is_named_when_read(ch: Client, index: int, corruption: str) -> None:
    g = synthetic_group(GroupSpec(rollouts=1, turns=3, bodies="chat", tools=2))
    write_records(ch, g.events)
    bad_call = g.call_ids[index]
    ch.command(
        f"ALTER TABLE calls UPDATE {corruption} WHERE call_id = {{c:String}} SETTINGS mutations_sync = 2",
        parameters={"c": bad_call},
    )
    with pytest.raises(TextDeltaError, match=bad_call):
        load_records(ch, "calls")


def test_a_late_call_of_a_long_rollout_is_read_alone(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=1, turns=400, prompt_tokens=64, turn_tokens=4, output_tokens=4,
                                  bodies="chat", tools=0, trainer_step=False))
    calls = g.of("CallRecord")
    write_records(ch, [("CallRecord", c) for c in calls])
    last = calls[-1]
    (row,) = select_rows(ch, "calls", "call_id = {c:String}", {"c": last["call_id"]})
    assert row["request_json"] == last["request_json"]
    chain = ch.query("SELECT countIf(request_base_call_id IS NOT NULL) FROM calls FINAL").result_rows[0][0]
    assert chain > 300  # a chain far deeper than Python's recursion limit allows for nested reads


class _CountingClient:
    """The real client, counting the queries made through it."""

    def __init__(self, client: Client) -> None:
        self.client, self.queries = client, 0

    def query(self, *args: object, **kwargs: object) -> object:
        self.queries += 1
        return self.client.query(*args, **kwargs)  # type: ignore[arg-type]


def test_a_late_calls_prompt_chain_is_fetched_in_two_queries(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=1, turns=200, prompt_tokens=64, turn_tokens=4, output_tokens=4,
                                  trainer_step=False))
    calls = g.of("CallRecord")
    write_records(ch, [("CallRecord", c) for c in calls])
    counting = _CountingClient(ch)
    cache = CallTokenCache(counting)  # type: ignore[arg-type]
    last = calls[-1]
    prompt = cache.prompt(last["call_id"])
    assert len(prompt) == last["prompt"]["length"] and ids_digest(prompt.tobytes()) == last["prompt"]["sha256"]
    assert counting.queries == 2  # the call, then its attempt's other calls: not one query per link


def test_without_a_memo_every_body_is_stored_whole() -> None:
    calls, rows = _call_rows()
    deltas = RequestBodyDeltas(max_chars=0)
    for row in rows:
        deltas.encode(row)
    assert deltas.deltas == 0 and [r["request_json"] for r in rows] == [c["request_json"] for c in calls]
