"""The audit on the real processors core's output (assembler -> grouper -> process_group), under
split, merged and packed sample configurations, and replayed configurations side by side."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from processors.pipeline import StageConfigs, rederive
from schemas.tokens import pack_floats, unpack_floats
from sinks.audit import run_audit
from sinks.replay import replay
from sinks.store import load_records, load_rollouts, write_records
from tokentrail.cli import main as cli_main

from .pipeline_data import CONFIGS, pipeline_events, sample_config


@pytest.mark.parametrize(("merge", "pack"), [(False, False), (True, False), (True, True)])
def test_audit_passes_on_pipeline_output(ch: Client, merge: bool, pack: bool) -> None:
    events, _group, _members = pipeline_events(1, sample_config(merge, pack))
    write_records(ch, events)
    results = run_audit(ch)
    assert all(r.passed for r in results), {r.key: r.failures[:3] for r in results if not r.passed}
    kinds = {s["kind"] for n, s in events if n == "Sample"}
    assert kinds == ({"PACKED"} if pack else {"MERGED"} if merge else {"CALL"})
    # The design's four checks each looked at something; this pipeline has no feedback, so the fifth
    # (feedback accounting) passes having nothing to account for.
    checked = {r.key: r.checked for r in results}
    assert checked.pop("feedback_accounting") == 0
    assert len(checked) == 4 and all(n > 0 for n in checked.values()), checked


def test_stored_rollouts_and_scores_rederive_identically(ch: Client) -> None:
    """What replay needs: rollouts and scores read back from ClickHouse give the same derivations."""
    events, group, members = pipeline_events(2, CONFIGS.sample)
    write_records(ch, events)
    stored_rollouts = {r["event_id"]: r for r in load_rollouts(ch)}
    assert all(stored_rollouts[m["event_id"]] == m for m in members)
    stored_scores = load_records(ch, "scores")
    (stored_group,) = load_records(ch, "groups")
    assert stored_group == group
    again = rederive(
        stored_group,
        [stored_rollouts[e] for e in group["rollout_event_ids"]],
        stored_scores,
        CONFIGS.reward,
        CONFIGS.credit,
        sample_config(True, True),
    )
    write_records(ch, again.events())  # a second sample configuration next to the first
    assert len({s["sample_config_id"] for s in load_records(ch, "samples")}) == 2
    assert all(r.passed for r in run_audit(ch))


def test_pipeline_output_with_a_reweighted_packed_sample_fails(ch: Client) -> None:
    events, _group, _members = pipeline_events(3, sample_config(True, True))
    samples = [r for n, r in events if n == "Sample"]
    target = copy.deepcopy(samples[0])
    weights = unpack_floats(target["weights"]).copy()
    weights *= 1.5
    target["weights"] = pack_floats(weights)
    events = [(n, target if (n == "Sample" and r["event_id"] == target["event_id"]) else r) for n, r in events]
    write_records(ch, events)
    (packing,) = run_audit(ch, only=["packing_preserves_weight"])
    assert not packing.passed
    credits = {
        r["event_id"]
        for n, r in events
        if n == "Credit" and r["rollout_id"] in target["rollout_ids"] and r["rollout_weight"] > 0
    }
    assert set(packing.failing_ids()) == credits


def test_replay_under_the_running_configs_reproduces_the_stored_events(ch: Client) -> None:
    events, _group, _members = pipeline_events(4, CONFIGS.sample)
    write_records(ch, events)
    result = replay(ch, CONFIGS)
    assert result.groups == 1 and not result.skipped
    stored = {(n, r["event_id"]): r for n, r in events if n in ("Reward", "Credit", "Sample")}
    assert {(n, r["event_id"]): r for n, r in result.events} == stored


def test_replay_cli_adds_new_config_events_and_keeps_the_old(
    ch: Client, chdb_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, _group, _members = pipeline_events(5, CONFIGS.sample)
    write_records(ch, events)
    sample_yaml = tmp_path / "sample.yaml"
    sample_yaml.write_text("version: 1\nname: merged-packed\nmerge: true\npack: {enabled: true, max_tokens: 4096}\n")
    reward_yaml = tmp_path / "reward.yaml"
    reward_yaml.write_text(Path("deploy/config/reward.yaml").read_text().replace("method: grpo", "method: rloo"))
    args = ["replay", "--dsn", chdb_dsn, "--database", ch.database, "--to", "clickhouse"]
    assert cli_main([*args, "--dry-run", "--sample", str(sample_yaml)]) == 0
    assert "dry run" in capsys.readouterr().out
    assert len(load_records(ch, "samples")) == len([1 for n, _ in events if n == "Sample"])
    assert cli_main([*args, "--sample", str(sample_yaml), "--reward", str(reward_yaml)]) == 0
    out = capsys.readouterr().out
    assert "1 groups re-derived" in out and "inserted into ClickHouse" in out
    reward_configs = {r["reward_config_id"] for r in load_records(ch, "rewards")}
    assert reward_configs == {
        CONFIGS.reward.id,
        StageConfigs.load(reward_yaml, CONFIGS.credit, CONFIGS.sample).reward.id,
    }
    assert {s["kind"] for s in load_records(ch, "samples")} == {"CALL", "PACKED"}
    before = {t: ch.query(f"SELECT count() FROM {t} FINAL").result_rows[0][0] for t in ("rewards", "samples")}
    assert cli_main([*args, "--sample", str(sample_yaml), "--reward", str(reward_yaml)]) == 0  # idempotent
    capsys.readouterr()
    assert {t: ch.query(f"SELECT count() FROM {t} FINAL").result_rows[0][0] for t in before} == before
    assert all(r.passed for r in run_audit(ch))
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmerge: maybe-not\n")
    assert cli_main([*args, "--sample", str(bad)]) == 2
    assert "configuration" in capsys.readouterr().err
