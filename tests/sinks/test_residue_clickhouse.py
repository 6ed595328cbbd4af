"""The residue scan of real chDB tables, written as the sink writes them."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from clickhouse_connect.driver.client import Client
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.codec import get_codec
from schemas.examples import example_record
from schemas.residue import Tally
from sinks.residue import content_columns, scan_clickhouse
from sinks.store import write_records
from tests.residue_data import CANARY, RUN, call_record, matcher


def _call(i: int, prompt: list[int], output: list[int], body: str = "{}") -> dict[str, Any]:
    record = call_record(prompt, output, body)
    record.update(event_id=f"ev-{i}", call_id=f"call-{i}")
    return record


def test_every_table_and_content_column_is_scanned_and_only_readable_rows_are_reported(ch: Client) -> None:
    key, nonce = AESGCM.generate_key(bit_length=256), os.urandom(12)
    sealed = nonce + AESGCM(key).encrypt(nonce, json.dumps({"content": CANARY, "ids": RUN}).encode(), None)
    feedback = example_record(get_codec().store.schema("Feedback").raw)
    feedback.update(event_id="fb-1", text=f"that answer leaked {CANARY}")
    write_records(ch, [
        ("CallRecord", _call(0, [5, 6], [7], json.dumps({"messages": [{"content": CANARY}]}))),
        ("CallRecord", _call(1, [5, *RUN, 6], [7])),  # prompt ids: an Array(UInt32) column
        ("CallRecord", _call(2, [5, *RUN[:2]], [*RUN[2:], 7])),  # the run split across prompt and output
        ("CallRecord", _call(3, [5], [7], json.dumps({"sealed": base64.b64encode(sealed).decode()}))),
        ("Feedback", feedback),
    ])
    tally = Tally()
    lines: list[str] = []
    scan_clickhouse(ch, matcher(), tally, progress=lines.append)

    db = ch.database
    found = {loc.where: {h.needle for h in loc.hits} for loc in tally.locations}
    assert found == {f"{db}.calls event_id=ev-0": {"canary[0]"}, f"{db}.calls event_id=ev-1": {"tokens[0]"},
                     f"{db}.feedback event_id=fb-1": {"canary[0]"}}
    engines = ch.query("SELECT engine FROM system.tables WHERE database = {d:String}", parameters={"d": db}).result_rows
    views = sum(1 for (engine,) in engines if engine.endswith("View"))
    assert views > 0
    assert tally.scanned["clickhouse_tables"] == len(engines) - views
    assert tally.scanned["clickhouse_views_skipped"] == views
    assert {"request_json", "prompt_ids_arr", "output_ids_arr"} <= set(content_columns(ch, db, "calls"))
    assert any(line.endswith("calls 4 rows") for line in lines)
