"""``tokentrail forget`` (tokentrail/forgetting.py, issue 31 item 3) on the real broker and chDB: the subject's
keys are tombstoned, its Forgotten event is on the topic (who asked, why, which keys; no content), its
ClickHouse content is blanked; ``--expire`` is retention; the command has --help."""

from __future__ import annotations

import pytest
from clickhouse_connect.driver.client import Client

from schemas.builders import make_call
from schemas.codec import Codec
from schemas.kafka.forget_log import read_forgotten
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.sealing import Sealer
from schemas.subject_names import SubjectNames
from sinks.store import load_records, write_records
from tests.sinks.conftest import ch, chdb_dsn, migrated_template  # noqa: F401  (the chDB fixtures)
from tokentrail.cli import build_parser
from tokentrail.forgetting import expire, forget
from tokentrail.settings import Settings


def test_forget_destroys_keys_records_the_request_and_blanks_clickhouse(
    tokentrail_settings: Settings, forget_settings: ForgetSettings, ch: Client, chdb_dsn: str,  # noqa: F811
) -> None:
    """Forgetting by the name reaches the records that carry its pseudonym (what the gateway writes) and an
    older record that carries the name itself (written before pseudonyms): both keys, both rows."""
    settings = tokentrail_settings.model_copy(update={"forget": forget_settings})
    stored = SubjectNames(forget_settings.master()).stored("t/u1")
    assert stored.startswith("t/subj:") and "u1" not in stored
    store = KafkaKeyStore(settings.kafka, forget_settings)
    try:
        calls = [make_call(f"r{n}", "a1", 0, [1, 2, 3], [4, 5], subject=subject, request_json='{"q": "secret-1"}')
                 for n, subject in enumerate((stored, "t/u1"))]
        data = [Codec(sealer=Sealer(store)).encode("CallRecord", call) for call in calls]
        write_records(ch, [("CallRecord", call) for call in calls])
        lines: list[str] = []
        summary = forget(settings, ["t/u1"], requested_by="dpo", reason="erasure", dsn=chdb_dsn,
                         database=ch.database, wait=False, progress=lines.append)
    finally:
        store.close()
    assert summary["keys_destroyed"] == 2 and summary["clickhouse_rows_blanked"]["calls"] == 2
    assert summary["stored_subjects"] == {"t/u1": [stored, "t/u1"]}
    assert any("destroying its keys" in line for line in lines)
    events = read_forgotten(settings.kafka, forget_settings)
    event, older = events[stored], events["t/u1"]
    assert event["request_id"] == summary["requests"][0] and event["requested_by"] == "dpo"
    assert event["reason"] == "erasure" and event["key_ids"][0].startswith(stored + "#")
    assert older["request_id"] == summary["requests"][1] and older["key_ids"][0].startswith("t/u1#")
    later = KafkaKeyStore(settings.kafka, forget_settings)
    try:
        for value in data:  # gone for a new process too
            assert Codec(sealer=Sealer(later)).decode(value)[1]["sealed"] is not None
    finally:
        later.close()
    assert [r["request_json"] for r in load_records(ch, "calls")] == ["", ""]
    assert expire(settings, dsn=chdb_dsn, database=ch.database, progress=lines.append)["keys_expired"] == []


def test_the_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser("forget").parse_args(["forget", "--help"])
    out = capsys.readouterr().out
    assert "--subject" in out and "--expire" in out and "--gateway" in out
