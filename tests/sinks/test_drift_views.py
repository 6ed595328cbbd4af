"""Template drift in production (issue 28, item 6) on chDB: calls of two harnesses on two families, with prefix
breaks (a family format's named causes and the renderer's own) and an output that did not parse; the views name
the harness, family and renderer version, count breaks by cause and parse failures, and the panels run."""

from __future__ import annotations

from typing import Any

import orjson
from clickhouse_connect.driver.client import Client

from schemas.builders import make_call
from sinks import dashboards
from sinks.store import write_records

PI_SYSTEM = "You are an expert coding assistant operating inside pi, a coding agent harness."


def _request(user_agent: str, system: str) -> str:
    return orjson.dumps({"method": "POST", "path": "/v1/chat/completions", "query": "",
                         "headers": {"user-agent": user_agent}, "body": {"messages": [
                             {"role": "system", "content": system}, {"role": "user", "content": "hi"}]}}).decode()


def _call(rollout: str, index: int, family_parser: str, request: str, *, breaks: list[str] = (),  # type: ignore[assignment]
          parse_errors: list[str] = (), spliced: int = 0) -> tuple[str, dict[str, Any]]:  # type: ignore[assignment]
    call = make_call(rollout, "a1", index, [1, 2, 3 + index], [7, 8], request_json=request, spliced_outputs=spliced,
                     versions={"model": "m", "policy_version": 0, "tokenizer_fingerprint": "tok",
                               "chat_template_fingerprint": "tpl-" + family_parser.split(":")[0],
                               "adapter_version": "a", "parser_version": family_parser, "engine": "embedded/0.1",
                               "upstream": "embedded"})
    call["prefix_breaks"] = list(breaks)
    call["sampling"]["extra_json"] = orjson.dumps({"stop_token_ids": [2], **(
        {"parse_errors": list(parse_errors)} if parse_errors else {})}).decode()
    return "CallRecord", call


def _rows(ch: Client, sql: str) -> list[dict[str, Any]]:
    result = ch.query(sql)
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def test_drift_views_count_breaks_by_cause_and_parse_failures_per_harness_and_family(ch: Client) -> None:
    qwen, gptoss = "qwen3: renderers==0.1.12 qwen3", "gpt-oss: openai-harmony==0.0.8"
    claude = _request("claude-cli/2.1.328 (external, sdk-cli)", "You are Claude Code.")
    pi = _request("OpenAI/JS 6.26.0", PI_SYSTEM)
    write_records(ch, [
        _call("r-claude", 0, qwen, claude),
        _call("r-claude", 1, qwen, claude, spliced=1),
        _call("r-claude", 2, qwen, claude, breaks=[
            "call 1, message 3: the template renders other messages differently when these change; no splice",
            "qwen3 format: reasoning_dropped, tool_arguments_reserialized"]),
        _call("r-pi", 0, gptoss, pi),
        _call("r-pi", 1, gptoss, pi, parse_errors=["tool call 0: invalid_json: '{\"cmd\": '"],
              breaks=["gpt-oss format: reasoning_dropped"]),
        _call("r-other", 0, "hermes-think/1", _request("curl/8.5", "plain")),
    ])

    harness = {r["rollout_id"]: r["harness"] for r in _rows(ch, "SELECT * FROM v_attempt_harness")}
    assert harness == {"r-claude": "claude-code", "r-pi": "pi", "r-other": "curl/8.5"}

    causes = _rows(ch, "SELECT harness, family, cause, count() AS n FROM v_prefix_break_causes "
                       "GROUP BY harness, family, cause ORDER BY harness, family, cause")
    assert [(r["harness"], r["family"], r["cause"], r["n"]) for r in causes] == [
        ("claude-code", "qwen3", "reasoning_dropped", 1),
        ("claude-code", "qwen3", "the template renders other messages differently when these change", 1),
        ("claude-code", "qwen3", "tool_arguments_reserialized", 1),
        ("pi", "gpt-oss", "reasoning_dropped", 1)]

    drift = {(r["harness"], r["family"]): r for r in _rows(ch, "SELECT * FROM v_family_drift")}
    assert set(drift) == {("claude-code", "qwen3"), ("pi", "gpt-oss"), ("curl/8.5", "reference")}
    q = drift[("claude-code", "qwen3")]
    assert (q["calls"], q["spliced_calls"], q["calls_with_breaks"], q["breaks"], q["parse_failures"]) == \
        (3, 1, 1, 2, 0)
    assert q["template_fingerprint"] == "tpl-qwen3" and q["parser_version"] == qwen
    g = drift[("pi", "gpt-oss")]
    assert (g["calls"], g["calls_with_breaks"], g["parse_failures"]) == (2, 1, 1)

    failed = _rows(ch, "SELECT call_id, parse_error_texts FROM v_call_conformance WHERE parse_errors > 0")
    assert len(failed) == 1 and "invalid_json" in failed[0]["parse_error_texts"][0]

    for panel in dashboards.PANELS:
        if panel.title.startswith("Template drift"):
            rows = ch.query(dashboards.expand_macros(panel.sql, interval_s=10**9)).result_rows
            assert rows, panel.title  # every drift panel shows the calls above
