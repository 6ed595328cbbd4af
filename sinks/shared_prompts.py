"""Identical full prompts stored once in the calls table: the rollouts of a group share their task prompt.

The G rollouts of a GRPO group start from the same system prompt, tools and task, so their first
calls carry the same full prompt (4k+ tokens). The Kafka record of each call keeps its prompt whole;
storage need not. A calls row whose full prompt equals one already stored (same length and sha256)
names that call in ``prompt_shared_call_id`` and stores its own ``prompt_ids`` empty. Reading
(``rebuild_shared_prompts``) puts the ids back, checked against the row's length and sha256, so
every reader of the table sees the record as it was on Kafka.

Three rules make a reference always resolvable, whatever the sink's crashes, retries, rebalances or
replicas do:
- only a call already stored (an earlier committed insert, this sink's or one found in ClickHouse)
  or stored in the same insert is named;
- a row only names a call whose id sorts before its own, so references never form a cycle, even
  across the duplicate versions a ReplacingMergeTree may keep;
- only a call received in the same 15-minute window is named: both rows sit in one day partition,
  dropped together or not at all;
- only a call of the same subject (or both of none) is named: a forget blanks the subject's prompts, and
  must not leave another subject's row naming one of them.

Storage-only, like the request-body deltas: ``prompt_base_call_id`` (the record's own delta base) is
never touched, and a row's prompt still traces back to its own call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from schemas.ids import ids_digest
from sinks.request_bodies import MIN_SAVED_CHARS, is_request_delta
from sinks.rows import Row
from sinks.text_delta import RecentTexts, encode_delta

# Full prompts remembered as sharing targets (key and call id, ~250 bytes each).
DEFAULT_MEMO_PROMPTS = 100_000
# Request bodies of those targets kept as bases for the sharing rows' bodies (characters).
DEFAULT_MEMO_BODY_CHARS = 16_000_000
# 64 tokens: below that a reference (a call id of ~40 characters, ~20 bytes compressed) saves little
# against the ids it replaces (~2 bytes a token compressed).
MIN_SHARED_BYTES = 256

# Rows of one 15-minute UTC window fall on one local day in every time zone (offsets are multiples of
# 15 minutes), so they share a ``toDate(event_time)`` partition whatever the server's time zone.
WINDOW_US = 15 * 60 * 1_000_000

# (15-minute window of received_at, prompt sha256, prompt length, subject or ""). A row names only a call of
# its own subject: forgetting a subject blanks its prompts, and another subject's row that named one of them
# could no longer be rebuilt (issue 31).
Key = tuple[int, str, int, str]


class SharedPromptError(ValueError):
    """A row's shared prompt cannot be rebuilt exactly."""


# Full prompts other writers stored: for the keys asked, the smallest call id storing that prompt
# whole (its ids checked against the sha256 by the lookup), as found in ClickHouse.
StoredLookup = Callable[[list[Key]], dict[Key, str]]


def _key(row: Row) -> Key | None:
    """The sharing key of a row whose record carries its full prompt, checked against its sha256 (a
    corrupt record never becomes a target); None for deltas and tiny prompts."""
    ids = row.get("prompt_ids")
    if ids is None or row.get("prompt_base_call_id") or len(ids) < MIN_SHARED_BYTES:
        return None
    if len(ids) != 4 * row["prompt_length"] or ids_digest(ids) != row["prompt_sha256"]:
        return None
    return row["received_at_us"] // WINDOW_US, row["prompt_sha256"], row["prompt_length"], row.get("subject") or ""


class SharedPrompts:
    """Rewrites calls rows to reference an identical stored full prompt (stateful, bounded).

    A sharing row's request body, which then usually repeats the target's (same task, same tools), is
    stored as a delta on the target's body too (sinks/request_bodies.py reads it back): the target is
    a call with a full prompt, so its own body is never a delta, and the same three rules hold."""

    def __init__(self, max_prompts: int = DEFAULT_MEMO_PROMPTS, max_body_chars: int = DEFAULT_MEMO_BODY_CHARS) -> None:
        self.max_prompts = max_prompts
        self.stored: OrderedDict[Key, str] = OrderedDict()  # key -> smallest call id stored with it
        self.bodies = RecentTexts(max_body_chars)  # call id -> request body, of stored targets
        self._batch: dict[Key, Row] = {}
        self.shared = 0

    def assign(self, rows: Iterable[Row], lookup: StoredLookup | None = None) -> None:
        """Rewrite, in place, the rows of one insert whose full prompt is already stored or stored by a
        row of the same insert with a smaller call id. Call ``stored_ok()`` once the insert succeeded.

        ``lookup`` finds prompts stored by other writers (another sink, an earlier run) for keys this
        one has not seen stored."""
        if not self.max_prompts:
            return
        candidates = sorted(
            ((key, row) for row in rows if (key := _key(row)) is not None), key=lambda kr: kr[1]["call_id"]
        )
        unknown = sorted({key for key, _ in candidates if key not in self.stored})
        if lookup is not None and unknown:
            for key, call_id in lookup(unknown).items():
                self._remember(key, call_id)
        for key, row in candidates:
            in_batch = self._batch.get(key)
            target = min((t for t in (in_batch and in_batch["call_id"], self.stored.get(key)) if t), default=None)
            if target is not None and target < row["call_id"]:
                # Content equality is proven by the sha256 in the key and checked again on every read.
                row.update(prompt_ids=b"", prompt_shared_call_id=target)
                self.shared += 1
                base = in_batch.get("request_json") if in_batch and in_batch["call_id"] == target else None
                self._share_body(row, target, base if base is not None else self.bodies.get(target))
            elif target is None or row["call_id"] < target:
                self._batch[key] = row

    def _share_body(self, row: Row, target: str, base: str | None) -> None:
        if base is None or "request_json" not in row or is_request_delta(row):
            return
        delta = encode_delta(row["request_json"], base)
        if len(row["request_json"]) - len(delta.middle) >= MIN_SAVED_CHARS:
            row.update(
                request_json=delta.middle,
                request_base_call_id=target,
                request_shared_prefix=delta.prefix,
                request_shared_suffix=delta.suffix,
            )

    @contextmanager
    def storing(self, rows: Iterable[Row], lookup: StoredLookup | None = None) -> Iterator[None]:
        """``assign`` the rows of one insert, which the body performs: on success their prompts may be
        named later (``stored_ok``), on any failure they are forgotten (``insert_failed``)."""
        self.assign(rows, lookup)
        try:
            yield
        except BaseException:
            self.insert_failed()
            raise
        self.stored_ok()

    def stored_ok(self) -> None:
        """The insert of the rows passed to ``assign`` succeeded: their prompts may now be named."""
        for key, row in self._batch.items():
            if self._remember(key, row["call_id"]) and "request_json" in row:
                self.bodies.put(row["call_id"], row["request_json"])
        self._batch.clear()

    def _remember(self, key: Key, call_id: str) -> bool:
        """Note a stored call with this full prompt; True if it is now the key's target (the smallest)."""
        smallest = self.stored.get(key, call_id) >= call_id
        if smallest:
            self.stored[key] = call_id
        self.stored.move_to_end(key)
        while len(self.stored) > self.max_prompts:
            self.stored.popitem(last=False)
        return smallest

    def insert_failed(self) -> None:
        """The insert did not happen (or may not have): forget what it would have stored."""
        self._batch.clear()


def is_shared(row: Row) -> bool:
    return bool(row.get("prompt_shared_call_id"))


FetchPrompts = Callable[[set[str]], Iterable[Row]]


def rebuild_shared_prompts(rows: list[Row], fetch: FetchPrompts) -> None:
    """Put every shared row's prompt ids back, in place, and clear its reference.

    ``fetch(call_ids)`` returns rows with ``call_id``, ``prompt_ids`` and ``prompt_shared_call_id`` as
    stored. Raises SharedPromptError naming the call when a target is missing or its ids do not match
    the row's length and sha256.
    """
    if not any(is_shared(r) for r in rows):
        return
    stored: dict[str, Row] = {r["call_id"]: r for r in rows}
    wanted = {r["prompt_shared_call_id"] for r in rows if is_shared(r)} - stored.keys()
    while wanted:
        got = list(fetch(wanted))
        stored.update((r["call_id"], r) for r in got)
        wanted = {r["prompt_shared_call_id"] for r in got if is_shared(r)} - stored.keys()

    for row in rows:
        if not is_shared(row):
            continue
        target, seen = row["prompt_shared_call_id"], {row["call_id"]}
        while (found := stored.get(target)) is not None and is_shared(found):
            if target in seen:  # ids sort strictly down each link, so only a corrupt table loops
                raise SharedPromptError(f"call {row['call_id']}: shared prompt references loop at {target}")
            seen.add(target)
            target = found["prompt_shared_call_id"]
        ids = found.get("prompt_ids") if found is not None else None
        if not ids:
            raise SharedPromptError(f"call {row['call_id']}: shared prompt call {target} is not stored")
        if len(ids) != 4 * row["prompt_length"] or ids_digest(ids) != row["prompt_sha256"]:
            raise SharedPromptError(f"call {row['call_id']}: prompt of call {target} does not match its sha256")
        row.update(prompt_ids=ids, prompt_shared_call_id=None)
