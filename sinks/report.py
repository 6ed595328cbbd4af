"""`tokentrail report`: one self-contained HTML file (plots embedded as base64 PNG) for people without
Grafana: reward against policy version, groups, incomplete rollouts, prefix merges, staleness,
throughput, feedback (coverage, delay per kind, late and unmatched), and the audit checks.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
from clickhouse_connect.driver.client import Client
from matplotlib.ticker import MaxNLocator

from sinks.audit import run_audit
from sinks.audit_result import CheckResult
from sinks.feedback_report import FeedbackSummary, feedback_summary
from sinks.feedback_store import IS_FEEDBACK_REWARD
from sinks.release_report import release_section
from sinks.store import table_counts

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
h1{margin-bottom:0}.sub{color:#666;margin-top:.2em}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:90%}th{background:#f3f3f3}
.pass{color:#176b1f;font-weight:bold}.fail{color:#b00020;font-weight:bold}img{max-width:100%}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1em}.empty{color:#888;font-style:italic}"""


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    if not rows:
        return '<p class="empty">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return str(value)


def _q(client: Client, sql: str) -> list[tuple[Any, ...]]:
    return client.query(sql).result_rows


# Beyond this many versions, per-version means (a few rollouts each) are noise: show the trend instead.
MANY_VERSIONS = 30


def rolling_reward(rows: Sequence[tuple[int, float, int]], window: int) -> list[float]:
    """Rollout-weighted mean of (version, mean reward, rollouts) over the last ``window`` versions."""
    out = []
    for i in range(len(rows)):
        part = rows[max(0, i - window + 1): i + 1]
        n = sum(r[2] for r in part)
        out.append(sum(r[1] * r[2] for r in part) / n if n else float("nan"))
    return out


# Feedback rewards (issue 21) are plotted apart from the verifiers' rewards: they measure something else.
FEEDBACK_CONFIGS = f"SELECT DISTINCT reward_config_id FROM rewards WHERE {IS_FEEDBACK_REWARD}"


def _feedback_reward_by_version(client: Client) -> str:
    rows = _q(client, "SELECT reward_config_id, policy_version, avg(reward), count() FROM v_reward_by_policy "
                      f"WHERE NOT filtered AND reward_config_id IN ({FEEDBACK_CONFIGS}) "
                      "GROUP BY reward_config_id, policy_version ORDER BY reward_config_id, policy_version")
    return _table(["feedback config", "policy version", "mean feedback reward", "rollouts"], rows)


def _plot_reward_by_version(client: Client) -> str:
    rows = _q(
        client,
        "SELECT policy_version, avg(raw_reward), stddevPop(raw_reward), avg(reward), count() "
        f"FROM v_reward_by_policy WHERE NOT filtered AND reward_config_id NOT IN ({FEEDBACK_CONFIGS}) "
        "GROUP BY policy_version ORDER BY policy_version",
    )
    if not rows:
        return '<p class="empty">no rewards of counted, complete rollouts yet</p>'
    versions = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if len(rows) > MANY_VERSIONS:
        window = max(5, len(rows) // 10)
        ax.scatter(versions, [r[1] for r in rows], s=8, alpha=0.3, label="raw reward, per version")
        trend = rolling_reward([(r[0], r[1], r[4]) for r in rows], window)
        ax.plot(versions, trend, linewidth=2.2, label=f"raw reward, mean of the last {window} versions")
        ax.plot(versions, [r[3] for r in rows], linewidth=0.8, alpha=0.5, label="reward after config")
    else:
        ax.errorbar(versions, [r[1] for r in rows], yerr=[r[2] for r in rows], marker="o", capsize=3,
                    label="raw reward (mean ± sd)")
        ax.plot(versions, [r[3] for r in rows], marker="s", linestyle="--", label="reward after config")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward")
    ax.set_title("Reward against policy version")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return _png(fig) + _table(["policy version", "mean raw reward", "sd", "mean reward", "rollouts"], rows)


def _plot_series(client: Client, sql: str, title: str, ylabel: str, labels: Sequence[str]) -> str:
    rows = _q(client, sql)
    if not rows:
        return f'<p class="empty">{html.escape(title)}: no data yet</p>'
    fig, ax = plt.subplots(figsize=(6, 3.2))
    times = [r[0] for r in rows]
    for i, label in enumerate(labels, start=1):
        ax.plot(times, [r[i] for r in rows], marker=".", label=label)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(labels) > 1:
        ax.legend()
    fig.autofmt_xdate()
    return _png(fig)


def _plot_staleness(client: Client) -> str:
    rows = _q(client, "SELECT staleness, count() FROM v_staleness GROUP BY staleness ORDER BY staleness")
    if not rows:
        return '<p class="empty">no trainer steps yet</p>'
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar([r[0] for r in rows], [r[1] for r in rows])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("policy versions behind the trainer")
    ax.set_ylabel("samples")
    ax.set_title("Staleness of trained samples")
    return _png(fig)


def _audit_section(results: list[CheckResult]) -> str:
    rows = []
    for r in results:
        verdict = '<span class="pass">PASS</span>' if r.passed else '<span class="fail">FAIL</span>'
        ids = ", ".join(r.failing_ids()[:10])
        rows.append(
            f"<tr><td>{html.escape(r.title)}</td><td>{verdict}</td><td>{r.checked}</td>"
            f"<td>{r.failed_count}</td><td>{html.escape(ids)}</td></tr>"
        )
    details = "".join(
        f"<li>{html.escape(r.key)}: {html.escape(f.kind)} <code>{html.escape(f.id)}</code>: "
        f"{html.escape(f.reason)}</li>"
        for r in results
        for f in r.failures[:20]
    )
    return (
        "<table><tr><th>check</th><th>result</th><th>checked</th><th>failed</th><th>failing ids</th></tr>"
        + "".join(rows)
        + "</table>"
        + (f"<ul>{details}</ul>" if details else "")
    )


def _feedback_section(summary: FeedbackSummary, by_version: str) -> str:
    if summary.empty:
        return '<p class="empty">no feedback stored</p>'
    coverage = _table(["feedback config", "rollouts rewarded", "with a value", "filtered (no feedback)",
                       "fraction with feedback"],
                      [(*row, round(row[2] / row[1], 3) if row[1] else "-") for row in summary.coverage])
    if summary.session_coverage is not None:  # organic session windows (issue 21)
        coverage += (f"<p>organic sessions: {summary.sessions}, with feedback {summary.sessions_with_feedback} "
                     f"({summary.session_coverage:.1%})</p>")

    def s(value: float | None) -> object:
        return "-" if value is None else round(value, 1)

    delays = _table(["kind", "feedback", "p10 s after close", "median s after close", "p90 s after close",
                     "max s after close", "median arrival lag s"],
                    [(d.kind, d.count, s(d.p10_after_close_s), s(d.median_after_close_s), s(d.p90_after_close_s),
                      s(d.max_after_close_s), d.median_arrival_lag_s) for d in summary.delays])
    outcomes = _table(["outcome", "feedback"], sorted(summary.outcomes.items()))
    return (f"<p>{summary.feedback} feedback events, {summary.rollouts} completed rollout attempts</p>"
            f"<h3>Coverage</h3>{coverage}<h3>Delay per kind</h3>{delays}"
            f"<h3>Admitted, late, unmatched, invalid</h3>{outcomes}"
            f"<h3>Feedback reward against policy version</h3>{by_version}")


def build_report(client: Client, title: str = "tokentrail report", audit: bool = True) -> str:
    counts = table_counts(client)
    groups = _q(
        client,
        "SELECT status, count(), avg(size), avg(fill) FROM v_group_completion GROUP BY status ORDER BY status",
    )
    incomplete = _q(
        client,
        "SELECT rollout_id, attempt_id, missing, finish_status FROM v_incomplete_rollouts ORDER BY time DESC LIMIT 20",
    )
    prefix = _q(client, "SELECT count(), avg(is_prefix) FROM v_prefix_links")[0]
    interval = "toStartOfInterval(time, INTERVAL 60 SECOND)"
    sections = [
        ("Reward against policy version", _plot_reward_by_version(client)),
        ("Groups", _table(["status", "groups", "mean size", "mean fill"], groups)),
        ("Incomplete rollouts (newest 20)", _table(["rollout", "attempt", "missing", "finish"], incomplete)),
        (
            "Prefix merges",
            f"<p>{prefix[0]} adjacent call pairs, {100 * (prefix[1] or 0):.1f}% token-level "
            "prefix (mergeable)</p>"
            + _plot_series(
                client,
                f"SELECT {interval} AS t, avg(is_prefix) FROM v_prefix_links GROUP BY t ORDER BY t",
                "Prefix-merge rate",
                "share of call pairs",
                ["prefix rate"],
            ),
        ),
        ("Feedback", _feedback_section(feedback_summary(client), _feedback_reward_by_version(client))),
        ("Release: versions in traffic, reward per version, decisions", release_section(client, _png, _table)),
        ("Staleness", _plot_staleness(client)),
        (
            "Throughput",
            _plot_series(
                client,
                f"SELECT {interval} AS t, sum(output_tokens) / 60, sum(prompt_length) / 60 "
                "FROM v_call_tokens GROUP BY t ORDER BY t",
                "Tokens per second (per minute bucket)",
                "tokens/s",
                ["sampled", "prompt"],
            ),
        ),
    ]
    if audit:
        sections.insert(0, ("Audit: the five checks", _audit_section(run_audit(client))))
    body = "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class='sub'>database {html.escape(client.database or '')}, generated {stamp}</p>"
        f"<h2>Stored events</h2>{_table(['table', 'events'], sorted(counts.items()))}{body}</body></html>"
    )


def write_report(client: Client, out: Path, audit: bool = True) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_report(client, audit=audit), encoding="utf-8")
    return out
