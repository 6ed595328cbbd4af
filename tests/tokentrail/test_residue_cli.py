"""`tokentrail scan-residue` over all four stores at once: a real topic, a real spool, chDB and a report."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from confluent_kafka import Producer

from producers.delivery.spool import Spool
from schemas.kafka.config import producer_config
from schemas.residue import Tally
from sinks.store import write_records
from tests.residue_data import CANARY, ODD_CANARY, RUN, call_record, encode, matcher
from tests.sinks.conftest import ch, chdb_dsn, migrated_template  # noqa: F401 (fixtures: one migrated chDB database)
from tokentrail.cli import main
from tokentrail.residue_scan import default_reports, scan_files
from tokentrail.settings import Settings


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["scan-residue", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), out + err


def test_the_command_finds_a_canary_in_every_store_and_says_so_on_its_last_line(
        new_topic: Callable[..., str], kafka_bootstrap: str, tokentrail_settings: Settings, ch: Client,  # noqa: F811
        chdb_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    body = json.dumps({"content": f"remember {CANARY}"})
    topic = new_topic(partitions=2)
    producer = Producer(producer_config(tokentrail_settings.kafka))
    producer.produce(topic, key=b"r-1", value=encode(call_record([5], [6], body)), partition=1)
    producer.produce(topic, key=b"r-2", value=encode(call_record([5, 6], [7])), partition=0)
    assert producer.flush(60) == 0
    with Spool(tmp_path / "spool") as spool:
        spool.append("tokentrail.calls", b"r-3", encode(call_record([1, *RUN], [2])))
    record = call_record([5], [6], body)
    record.update(event_id="ev-cli", call_id="call-cli")
    write_records(ch, [("CallRecord", record)])
    report = tmp_path / "report.html"
    report.write_text(f"<p>{CANARY}</p>")
    where = ["--topic", topic, "--spool", str(tmp_path / "spool"), "--report", str(report), "--dsn", chdb_dsn,
             "--database", ch.database]

    code, summary, printed = _run(capsys, "--canary", CANARY, "--tokens", ",".join(map(str, RUN)), *where)
    assert code == 1
    assert summary["residual_readable"] == 4
    assert summary["by_store"] == {"clickhouse": 1, "kafka": 1, "report": 1, "spool": 1}
    assert summary["by_needle"] == {"canary[0]": 3, "tokens[0]": 1}
    assert summary["complete"] is True
    assert summary["scanned"]["kafka_records"] == 2
    assert f"readable: kafka {topic}[1]@0" in printed
    assert "kafka: 1 topics, 2 partitions" in printed  # progress

    code, summary, _ = _run(capsys, "--canary", "canary-never-planted", *where)
    assert (code, summary["residual_readable"], summary["complete"]) == (0, 0, True)


def test_a_token_run_too_short_to_mean_anything_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan-residue", "--tokens", "1,2", "--no-kafka", "--no-clickhouse", "--no-spool",
                 "--no-reports"]) == 2
    assert "fewer than 4" in capsys.readouterr().err


def test_reports_and_further_paths_are_searched_raw_with_the_escaped_canary(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text(f"<html><td>{html.escape(ODD_CANARY)}</td></html>", encoding="utf-8")
    (tmp_path / "clean.html").write_text("<html><td>nothing here</td></html>", encoding="utf-8")
    cache = tmp_path / "cache" / "deep"
    cache.mkdir(parents=True)
    (cache / "memo.bin").write_bytes(b"\x00" + json.dumps({"c": ODD_CANARY}).encode())
    tally = Tally()
    m = matcher(ODD_CANARY)
    scan_files((report, tmp_path / "clean.html", tmp_path / "missing.html"), "report", m, tally)
    scan_files((tmp_path / "cache",), "file", m, tally)
    assert [(loc.store, loc.where) for loc in tally.locations] == [("report", str(report)),
                                                                  ("file", str(cache / "memo.bin"))]
    assert (tally.scanned["report_files"], tally.scanned["file_files"]) == (2, 1)
    assert tally.skipped == [f"report {tmp_path / 'missing.html'} (does not exist)"]
    assert default_reports(tmp_path) == (tmp_path / "clean.html", report)
