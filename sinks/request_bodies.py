"""Calls' request bodies in the calls table: written as deltas on an earlier body, read back whole.

Writing (``RequestBodyDeltas``): a call whose prompt extends a base call's prompt ‖ output usually
repeats that call's request body too, so its body is stored as a ``TextDelta`` on the base call's
body, when the writer still holds that body in memory and it came from the same Kafka partition
(calls are keyed by rollout, so an attempt's calls arrive in order on one partition, and a base read
before a call is stored no later than the call: in an earlier committed batch or in the same insert).
Otherwise the body is stored in full. Either way the row keeps the full body's length and sha256.
The base call's answer, repeated in the delta, is cut out of it as copies of the base's response
body (``cut_copies``), when the writer holds that response too.

Reading (``rebuild_request_bodies``): delta rows are rebuilt through their chains of bases, each step
checked against length and sha256.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sinks.rows import Row
from sinks.text_delta import (
    RecentTexts,
    TextDelta,
    TextDeltaError,
    apply_delta,
    cut_copies,
    encode_delta,
    paste_copies,
)

# Bodies kept in memory to serve as bases: enough for every live attempt of a busy partition set.
DEFAULT_MEMO_CHARS = 64_000_000
# A delta names its base call (an id of ~40 characters) and two lengths: worth it only well above that.
MIN_SAVED_CHARS = 256
# A copy of the base's response is three integers: for strings of this length and more.
MIN_COPY_CHARS = 64

# Where a body is a delta (NULL / 0 for a whole body), and what checks a rebuilt body.
DELTA_COLUMNS = ("request_base_call_id", "request_shared_prefix", "request_shared_suffix", "request_copies")
CHECK_COLUMNS = ("request_length", "request_sha256")
REQUEST_COLUMNS = ("call_id", "request_json", *DELTA_COLUMNS, *CHECK_COLUMNS, "response_json")


def _memo_key(row: Row, call_id: str) -> str:
    return f"{row.get('src_topic', '')}\x00{row.get('src_partition', '')}\x00{call_id}"


class RequestBodyDeltas:
    """Turns call rows' full request bodies into deltas where a base body is at hand (stateful)."""

    def __init__(self, max_chars: int = DEFAULT_MEMO_CHARS) -> None:
        self.recent = RecentTexts(max_chars)
        self.responses = RecentTexts(max_chars // 4)  # answers are short next to whole conversations
        self.deltas = 0
        self.full = 0

    def encode(self, row: Row) -> Row:
        """Rewrite ``row`` (a calls row with its full body) in place; returns it."""
        text: str = row["request_json"]
        base_id = row.get("prompt_base_call_id")
        base = self.recent.get(_memo_key(row, base_id)) if base_id and base_id != row["call_id"] else None
        if base is not None:
            delta = encode_delta(text, base)
            if len(text) - len(delta.middle) >= MIN_SAVED_CHARS:
                middle, copies = delta.middle, []
                base_response = self.responses.get(_memo_key(row, base_id))
                if base_response is not None:
                    middle, copies = cut_copies(delta.middle, base_response, MIN_COPY_CHARS)
                row.update(
                    request_json=middle,
                    request_base_call_id=base_id,
                    request_shared_prefix=delta.prefix,
                    request_shared_suffix=delta.suffix,
                    request_copies=copies,
                )
                self.deltas += 1
            else:
                self.full += 1
        else:
            self.full += 1
        self.recent.put(_memo_key(row, row["call_id"]), text)
        if "response_json" in row:
            self.responses.put(_memo_key(row, row["call_id"]), row["response_json"])
        return row


def is_request_delta(row: Row) -> bool:
    return bool(row.get("request_base_call_id"))


FetchRows = Callable[[set[str]], Iterable[Row]]


def rebuild_request_bodies(rows: list[Row], fetch: FetchRows) -> None:
    """Replace every delta body in ``rows`` by the full body, in place.

    ``fetch(call_ids)`` returns calls rows (at least ``REQUEST_COLUMNS``) for bases not among ``rows``.
    Raises TextDeltaError naming the call when a base is missing or a rebuilt body does not verify.
    """
    if not any(is_request_delta(r) for r in rows):
        return
    stored: dict[str, Row | None] = {r["call_id"]: r for r in rows}
    wanted = {r["request_base_call_id"] for r in rows if is_request_delta(r)} - stored.keys()
    for row in rows:  # copies read the base's response body: fetch bases whose rows came without it
        base = stored.get(row["request_base_call_id"]) if row.get("request_copies") else None
        if base is not None and "response_json" not in base:
            wanted.add(base["call_id"])
    while wanted:
        got = list(fetch(wanted))
        for row in got:
            stored[row["call_id"]] = row
        for missing in wanted - {r["call_id"] for r in got}:
            stored[missing] = None
        wanted = {r["request_base_call_id"] for r in got if is_request_delta(r)} - stored.keys()

    full: dict[str, str] = {}

    def body(call_id: str) -> str:
        chain: list[Row] = []  # walk down to a full body (or one already rebuilt), then rebuild upwards
        current: str | None = call_id
        while current is not None and current not in full:
            row = stored.get(current)
            if row is None:
                raise TextDeltaError(f"call {chain[-1]['call_id']}: request base call {current} is not stored")
            if any(r is row for r in chain):
                raise TextDeltaError(f"call {call_id}: request delta chain loops at {current}")
            chain.append(row)
            current = row["request_base_call_id"] if is_request_delta(row) else None
        for row in reversed(chain):
            if not is_request_delta(row):
                full[row["call_id"]] = row["request_json"]
                continue
            try:
                middle = row["request_json"]
                if row.get("request_copies"):
                    base_row = stored[row["request_base_call_id"]]
                    assert base_row is not None  # its body was rebuilt just before
                    middle = paste_copies(middle, row["request_copies"], base_row["response_json"])
                delta = TextDelta(row["request_shared_prefix"], row["request_shared_suffix"], middle)
                full[row["call_id"]] = apply_delta(
                    full[row["request_base_call_id"]], delta, row["request_length"], row["request_sha256"]
                )
            except TextDeltaError as exc:
                raise TextDeltaError(f"call {row['call_id']}: request body: {exc}") from None
        return full[call_id]

    for row in rows:
        if is_request_delta(row):
            text = body(row["call_id"])
            row.update(request_json=text, request_base_call_id=None, request_shared_prefix=0, request_shared_suffix=0)
            if "request_copies" in row:
                row["request_copies"] = []
