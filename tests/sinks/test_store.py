"""Migrations, inserts and queries of every table through chDB, dashboards' SQL, and the clickhouse CLI."""

from __future__ import annotations

import json
import struct

import pytest
from clickhouse_connect.driver.client import Client

from schemas.codec import get_codec
from schemas.examples import example_record
from schemas.tokens import pack_mask
from sinks import dashboards
from sinks.client import ClickHouseConfigError, connect, parse_dsn
from sinks.ddl import CALL_STORED_TOKEN_COLUMNS, MIGRATIONS, TABLE_NAMES, VIEWS, migrate, runner, schema_sql
from sinks.ddl.drift_views import DRIFT_VIEWS
from sinks.freshness import VIEWS as FRESHNESS_VIEWS
from sinks.rows import TABLE_OF, to_row
from sinks.sample_refs import REF_COLUMNS
from sinks.store import (
    CallTokenCache,
    insert_rows,
    load_records,
    load_rollouts,
    select_rows,
    table_counts,
    write_records,
)
from testkit.storage_records import GroupSpec, synthetic_group
from tests.sinks.conftest import database_name
from tokentrail.cli import main as cli_main
from tokentrail.settings import REPO_ROOT


def example(name: str) -> dict:
    record = example_record(get_codec().store.schema(name).raw)
    if name == "Sample":
        record["loss_mask"] = pack_mask([0, 1, 1, 1])
        record["segments"][0].update(sample_start=0, call_start=0, length=4)
    if "sealed" in record:  # ClickHouse keeps content opened, never the envelope
        record["sealed"] = None
    return record


def _definitions(client: Client, db: str) -> dict[str, str]:
    rows = client.query("SELECT name, create_table_query FROM system.tables WHERE database = {db:String}",
                        parameters={"db": db}).result_rows
    return {name: ddl.replace(f"{db}.", "DB.") for name, ddl in rows}


def test_migrate_is_idempotent_and_creates_everything(chdb_dsn: str, ch: Client,
                                                       request: pytest.FixtureRequest) -> None:
    client = connect(dsn=chdb_dsn, database=database_name(request.node.name), create_database=True)
    try:
        assert migrate(client) == [m.id for m in MIGRATIONS]
        assert migrate(client) == []  # applied migrations are recorded
        names = {r[0] for r in client.query("SHOW TABLES").result_rows}
        assert set(TABLE_NAMES) | set(VIEWS) | {"schema_migrations"} <= names
        applied = [r[0] for r in client.query("SELECT id FROM schema_migrations FINAL ORDER BY id").result_rows]
        assert applied == [m.id for m in MIGRATIONS]
        engines = dict(client.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase()")
                       .result_rows)
        assert all(engines[t] == "ReplacingMergeTree" for t in TABLE_NAMES)
        # The ``ch`` fixture's database (a copy of a template migrated once per session) is what migrate
        # makes: the same tables and views, each with the same definition, and the same migrations applied.
        assert _definitions(ch, ch.database) == _definitions(client, client.database)
        assert migrate(ch) == []
    finally:
        client.command(f"DROP DATABASE IF EXISTS {client.database}")


@pytest.mark.parametrize("name", sorted(set(TABLE_OF) - {"CompletedRollout"}))
def test_every_table_round_trips_its_records(ch: Client, name: str) -> None:
    record = example(name)
    table = TABLE_OF[name]
    write_records(ch, [(name, record), (name, record)])  # a re-delivery
    assert table_counts(ch)[table] == 1  # FINAL collapses it
    assert load_records(ch, table) == [record]


def test_rollouts_round_trip_through_the_calls_table(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=3, turns=4))
    write_records(ch, g.events)
    rollouts = load_rollouts(ch)
    assert sorted(rollouts, key=lambda r: r["event_id"]) == sorted(
        g.of("CompletedRollout"), key=lambda r: r["event_id"]
    )
    stored = ch.query("SELECT sum(prompt_stored_tokens), sum(prompt_length) FROM calls FINAL").result_rows[0]
    assert stored[0] < stored[1]  # later prompts are deltas


def odd_calls(tag: str) -> list[dict]:
    """Calls whose bytes are not plain token arrays: 7 output bytes, NaN and -0.0 logprobs, and a prompt
    with both full ids and a delta (the schema allows it); they must come back byte for byte."""
    odd = {**example("CallRecord"), "event_id": f"odd-{tag}", "call_id": f"odd-{tag}", "output_ids": b"\x01" * 7}
    nan = struct.pack("<4f", float("nan"), -0.0, -1e-30, 0.0)
    return [odd, {**example("CallRecord"), "event_id": f"nan-{tag}", "call_id": f"nan-{tag}", "output_logprobs": nan}]


def test_calls_store_token_arrays_and_give_back_the_exact_bytes(ch: Client) -> None:
    g = synthetic_group(GroupSpec(rollouts=2, turns=4))
    calls = [*g.of("CallRecord"), *odd_calls("new")]
    write_records(ch, [("CallRecord", c) for c in calls])
    assert load_records(ch, "calls", order_by="event_id") == sorted(calls, key=lambda c: c["event_id"])
    kinds = dict(ch.query(
        "SELECT name, default_kind FROM system.columns WHERE database = currentDatabase() AND table = 'calls' "
        "AND name IN ('prompt_ids', 'prompt_new_ids', 'output_ids', 'output_logprobs')").result_rows)
    assert set(kinds.values()) == {"EPHEMERAL"}  # the packed bytes are inputs only
    codec = ch.query("SELECT compression_codec FROM system.columns WHERE database = currentDatabase() "
                     "AND table = 'calls' AND name = 'prompt_new_ids_arr'").result_rows[0][0]
    assert "T64" in codec
    counts = dict(ch.query("SELECT call_id, output_tokens FROM calls FINAL").result_rows)
    assert counts["odd-new"] == 1 and counts["nan-new"] == 4 and counts[g.call_ids[0]] == 32


# Columns migration 0014 added (version spans, release arm): rows written before it have none.
AFTER_0014 = ("version_spans", "c_version_spans", "release_id", "release_decision_sequence", "release_arm",
              "release_pin_label", "subject", "c_parse_failures")  # c_parse_failures: from 0019 on


def test_migrating_calls_stored_as_packed_bytes(
    chdb_dsn: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A database made before 0003 (token bytes stored as String) keeps every call exactly."""
    client = connect(dsn=chdb_dsn, database=f"t_calls_v1_{abs(hash(request.node.name)) % 10**6}",
                     create_database=True)
    try:
        with monkeypatch.context() as m:
            m.setattr(runner, "MIGRATIONS", MIGRATIONS[:2])  # what migrate() applies
            # The views of that time: v_stale_dropped reads trainer_steps columns from 0013, the freshness
            # views the Kafka times from 0017, the drift views the request deltas from 0005.
            m.setattr(runner, "VIEWS", {k: v for k, v in VIEWS.items() if k != "v_stale_dropped"
                                        and k not in FRESHNESS_VIEWS and k not in DRIFT_VIEWS})
            assert migrate(client) == ["0001_tables", "0002_rollouts_final_output_text"]
        g = synthetic_group(GroupSpec(rollouts=2, turns=4, bodies="chat", tools=1))
        # Written before CallRecord.scripted, version_spans and release existed: read back with their defaults.
        old = [*g.events, *(("CallRecord", dict(c, scripted=False, version_spans=[], release=None, subject=None))
                            for c in odd_calls("old"))]
        for name, record in old:  # as the code before 0005-0008 wrote them: whole bodies, samples, prompts
            table, row = to_row(name, record)
            row = {k: v for k, v in row.items() if k not in ("scripted", "c_scripted")}  # from 0009 on
            row = {k: v for k, v in row.items() if k not in AFTER_0014}
            insert_rows(client, table, [{k: v for k, v in row.items() if (not k.startswith("request_")
                                         or k == "request_json") and k != "prompt_shared_call_id"}
                                        if table != "samples" else
                                        {k: v for k, v in row.items() if k not in REF_COLUMNS}])
        assert migrate(client) == [
            "0003_calls_token_arrays", "0004_calls_ephemeral_token_bytes", "0005_calls_request_body_deltas",
            "0006_samples_token_references", "0007_calls_shared_prompts", "0008_calls_request_response_copies",
            "0009_scripted_outputs", "0010_release_decisions", "0011_feedback", "0012_baselines",
            "0013_trainer_steps_off_policy", "0014_version_spans_and_release", "0015_trainer_steps_resume",
            "0016_trainer_steps_ranks", "0017_src_time", "0018_subjects", "0019_rollout_parse_failures",
        ]
        for statement in MIGRATIONS[3].statements(client.database):  # a repeated, interrupted migration
            client.command(statement)
        new = odd_calls("new") + synthetic_group(GroupSpec(group_index=1, turns=3, bodies="chat")).of("CallRecord")
        write_records(client, [("CallRecord", c) for c in new])
        calls = [rec for name, rec in old if name == "CallRecord"] + new
        assert load_records(client, "calls", order_by="event_id") == sorted(calls, key=lambda c: c["event_id"])
        assert sorted(load_rollouts(client), key=lambda r: r["event_id"]) == sorted(
            g.of("CompletedRollout"), key=lambda r: r["event_id"]
        )
        cache = CallTokenCache(client)
        last = g.of("CallRecord")[3]
        assert last["prompt"]["ids"] is None and len(cache.prompt(last["call_id"])) == last["prompt"]["length"]
        stored = client.query(
            "SELECT sum(prompt_stored_tokens), sum(prompt_length) FROM calls FINAL "
            "WHERE call_id IN {ids:Array(String)}",
            parameters={"ids": g.call_ids},
        ).result_rows[0]
        assert 0 < stored[0] < stored[1]
        columns = {r[0] for r in client.query(
            "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = 'calls' "
            "AND default_kind != 'EPHEMERAL'").result_rows}
        assert set(CALL_STORED_TOKEN_COLUMNS) <= columns and "prompt_ids" not in columns
        samples = sorted(g.of("Sample"), key=lambda s: s["event_id"])  # stored whole before 0006
        assert load_records(client, "samples", order_by="event_id") == samples
        assert client.query("SELECT sum(tokens) FROM samples FINAL").result_rows[0][0] == sum(
            len(s["input_ids"]) // 4 for s in samples
        )
    finally:
        client.command(f"DROP DATABASE IF EXISTS {client.database}")


def test_insert_dedup_token_drops_a_retried_batch(ch: Client) -> None:
    rows = [to_row("Score", example("Score"))[1]]
    insert_rows(ch, "scores", rows, dedup_token="scores:abc")
    insert_rows(ch, "scores", rows, dedup_token="scores:abc")
    assert ch.query("SELECT count() FROM scores").result_rows[0][0] == 1  # even without FINAL
    insert_rows(ch, "scores", rows, dedup_token="scores:other")
    assert ch.query("SELECT count() FROM scores").result_rows[0][0] == 2
    assert ch.query("SELECT count() FROM scores FINAL").result_rows[0][0] == 1


def test_edited_score_is_kept_next_to_the_original(ch: Client) -> None:
    score = example("Score")
    write_records(ch, [("Score", score), ("Score", {**score, "raw_json": '{"edited": true}'})])
    rows = select_rows(ch, "scores", columns="event_id, raw_json", order_by="raw_json")
    assert [r["raw_json"] for r in rows] == sorted([score["raw_json"], '{"edited": true}'])


def test_views_and_dashboard_panels_run(ch: Client) -> None:
    for i in range(2):
        write_records(ch, synthetic_group(GroupSpec(group_index=i, policy_version=i + 1, pack=True)).events)
    for view in VIEWS:
        ch.query(f"SELECT * FROM {view} LIMIT 5")
    assert ch.query("SELECT count(), min(staleness) FROM v_staleness").result_rows[0] == (2 * 14, 0)
    by_version = ch.query("SELECT policy_version, count() FROM v_reward_by_policy GROUP BY 1 ORDER BY 1").result_rows
    assert by_version == [(1, 4), (2, 4)]
    assert ch.query("SELECT avg(is_prefix) FROM v_prefix_links").result_rows[0][0] == 1.0
    # Read-only, as the dashboards' user is (readonly = 1, sinks.ddl readonly_user_sql): every panel's query
    # runs (one needing more than reads would raise here) and a write is refused. A query-level SETTINGS
    # clause, because chDB would keep a client-side setting on its embedded session.
    for panel in dashboards.PANELS:
        ch.query(dashboards.expand_macros(panel.sql) + "\nSETTINGS readonly = 1")
    with pytest.raises(Exception, match=r"(?i)readonly"):
        ch.command("INSERT INTO groups (event_id) SETTINGS readonly = 1 VALUES ('x')")


def test_committed_dashboard_matches_the_generator() -> None:
    committed = json.loads(dashboards.DASHBOARD_PATH.read_text())
    assert committed == dashboards.dashboard()
    targets = [t for p in committed["panels"] for t in p["targets"]]
    assert {t["datasource"]["type"] for t in targets} == {"grafana-clickhouse-datasource"}


def test_dsn_parsing_and_one_chdb_path_per_process(chdb_dsn: str) -> None:
    assert parse_dsn("chdb:///srv/ch").chdb_path == "/srv/ch"
    server = parse_dsn("https://u:p%40ss@ch.example:8443")
    assert (server.host, server.port, server.secure, server.password) == ("ch.example", 8443, True, "p@ss")
    with pytest.raises(ClickHouseConfigError, match="absolute"):
        parse_dsn("chdb://relative")
    with pytest.raises(ClickHouseConfigError, match="unsupported"):
        parse_dsn("mysql://x")
    with pytest.raises(ClickHouseConfigError, match="one path per process"):
        connect(dsn="chdb:///tmp/some-other-chdb-dir", database="x")
    with pytest.raises(ClickHouseConfigError, match="does not exist"):
        connect(dsn=chdb_dsn, database="never_created_db")


def test_clickhouse_cli(chdb_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--dsn", chdb_dsn, "--database", "cli_db"]
    assert cli_main(["clickhouse", "migrate", *args]) == 0
    assert "applied 0001_tables" in capsys.readouterr().out
    assert cli_main(["clickhouse", "migrate", *args]) == 0
    assert "nothing new" in capsys.readouterr().out
    assert cli_main(["clickhouse", "counts", *args]) == 0
    assert "calls" in capsys.readouterr().out
    # chDB has no users: refused with an explanation; --print shows the server SQL.
    assert cli_main(["clickhouse", "readonly-user", *args, "--password", "pw"]) == 2
    assert "chDB (embedded) has no users" in capsys.readouterr().err
    assert cli_main(["clickhouse", "readonly-user", *args, "--password", "pw", "--print"]) == 0
    out = capsys.readouterr().out
    assert "SETTINGS readonly = 1" in out and "GRANT SELECT ON cli_db.*" in out
    assert cli_main(["clickhouse", "ddl", "--database", "x"]) == 0
    ddl = capsys.readouterr().out
    assert ddl == schema_sql("x") and "CREATE TABLE IF NOT EXISTS x.calls" in ddl
    client = connect(dsn=chdb_dsn, database="cli_db")
    client.command("DROP DATABASE cli_db")


def test_committed_server_ddl_is_current() -> None:
    committed = (REPO_ROOT / "deploy" / "clickhouse" / "schema.sql").read_text()
    assert committed == schema_sql("tokentrail"), "run: tokentrail clickhouse ddl > deploy/clickhouse/schema.sql"
