"""The report's feedback section on chDB: coverage per feedback config, delay per kind, and how many
feedback events were admitted, late, unmatched or are pending."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from sinks.feedback_report import feedback_summary
from sinks.report import build_report
from sinks.store import write_records

from .feedback_scenario import CFG, feedback_scenario


def test_feedback_summary_counts_what_the_join_stored(ch: Client) -> None:
    scenario = feedback_scenario()
    write_records(ch, scenario.events)
    summary = feedback_summary(ch)
    assert (summary.rollouts, summary.feedback) == (4, 5)
    # Four rollouts rewarded under the config; two have feedback (r0 the thumb, r1 the rating).
    assert summary.coverage == [(CFG.id, 4, 2, 2)]
    assert summary.outcomes == {"admitted": 2, "late (after_close)": 1, "unmatched": 1, "invalid": 1}
    delays = {d.kind: d for d in summary.delays}
    assert set(delays) == {"BINARY", "RATING", "OUTCOME"}
    assert delays["OUTCOME"].median_after_close_s == 30.0  # the late outcome, 30 s after the close
    assert delays["BINARY"].count == 2 and delays["RATING"].count == 2 and delays["RATING"].median_arrival_lag_s == 1e-6


def test_report_has_the_feedback_section_and_five_passing_checks(ch: Client) -> None:
    scenario = feedback_scenario()
    # Without its late record, the late feedback is silently dropped: the audit fails on it.
    write_records(ch, scenario.without(scenario.letters["late"]))
    html = build_report(ch)
    assert "<h2>Feedback</h2>" in html and "Delay per kind" in html and "unmatched" in html
    assert html.count('class="pass"') == 4 and html.count('class="fail"') == 1
    assert scenario.feedback["late"]["event_id"] in html
    # Feedback rewards have a table of their own by policy version (two rollouts with a value, version 1)
    # and stay out of the verifiers' reward plot.
    section = html[html.index("Feedback reward against policy version"):]
    assert f"<td>{CFG.id}</td><td>1</td>" in section and "<td>2</td></tr>" in section
