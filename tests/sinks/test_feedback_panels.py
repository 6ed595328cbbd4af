"""The dashboard's feedback panels (issue 21 block of sinks/dashboards.py) on chDB, over the stored feedback
scenario: coverage, delay per kind after the response named, late/unmatched/invalid counts, and the reward
by policy version from feedback alone."""

from __future__ import annotations

import math
from typing import Any

from clickhouse_connect.driver.client import Client

from sinks import dashboards
from sinks.store import write_records

from .feedback_scenario import feedback_scenario


def _panel(ch: Client, title: str) -> list[dict[str, Any]]:
    panel = next(p for p in dashboards.PANELS if p.title == title)
    result = ch.query(dashboards.expand_macros(panel.sql, interval_s=10**9))  # one bucket holds everything
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def test_feedback_panels_show_what_the_join_stored(ch: Client) -> None:
    scenario = feedback_scenario()
    write_records(ch, scenario.events)

    (coverage,) = _panel(ch, "Feedback coverage: rollouts and organic sessions with feedback")
    # Four rollouts rewarded by the join; r0 (the thumb) and r1 (the rating) have a value. No organic session.
    assert coverage["rollouts_with_feedback"] == 0.5 and coverage["sessions"] == 0
    assert math.isnan(coverage["sessions_with_feedback"])

    # Only the rating names a call; its delay is its event time after that call reached the gateway.
    (delay,) = _panel(ch, "Feedback delay per kind (s after the response it names)")
    rating = scenario.feedback["rating"]
    call = next(r for n, r in scenario.events if n == "CallRecord" and r["call_id"] == rating["call_id"])
    assert delay["kind"] == "RATING" and delay["feedback"] == 1
    expected = round((rating["event_time_us"] - call["timings"]["received_at_us"]) / 1e6, 1)
    assert delay["p50_s"] == delay["p10_s"] == delay["max_s"] == expected

    (letters,) = _panel(ch, "Late, unmatched and invalid feedback")
    assert (letters["late"], letters["unmatched"], letters["invalid"]) == (1, 1, 1)

    # Feedback alone: r0's thumb (1.0) and r1's rating (0.8; its late rejection is not used), version 1.
    (by_version,) = _panel(ch, "Reward from feedback alone, by policy version")
    assert by_version["policy_version"] == "1" and by_version["rollouts"] == 2
    assert math.isclose(by_version["mean_feedback_reward"], 0.9)
