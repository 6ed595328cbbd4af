"""Views to watch chat-template drift in production (issue 28, item 6): per (harness, family, renderer version),
prefix breaks by cause and outputs whose tool-call markup did not parse.

* harness: named from the attempt's first request stored in full (later ones are stored as deltas on it and
  share its headers): Claude Code and Codex by their user agent / originator, OpenClaw and Pi by their system
  prompts (both use OpenAI's JS SDK); any other client by its user agent.
* family: the model family the gateway's parser version names (``"qwen3: renderers==..."``); ``reference``
  for the project's own model and its hermes parser.
* renderer version: the chat template's fingerprint and the parser version, as recorded on every call.
* break cause: a family format's named causes (``"qwen3 format: reasoning_dropped, ..."``, one row each), or
  the renderer's own description without its call/message position and detail.
* parse failures: ``parse_errors`` in the call's sampling extras (the gateway answered the output as content).

Views only (no table, no column): ``sinks.ddl.views`` lists them; the migration runner creates them with
the other views on every migrate.
"""

from __future__ import annotations

_FAMILY = "if(match(parser_version, '^[a-z0-9.-]+: '), extract(parser_version, '^([a-z0-9.-]+): '), 'reference')"
_UA = "JSONExtractString(request_json, 'headers', 'user-agent')"
_HARNESS = (f"multiIf({_UA} LIKE 'claude-cli/%', 'claude-code', "
            f"{_UA} LIKE 'codex%' OR JSONExtractString(request_json, 'headers', 'originator') LIKE 'codex%', 'codex', "
            "positionCaseInsensitive(request_json, 'openclaw') > 0, 'openclaw', "
            "position(request_json, 'inside pi, a coding agent harness') > 0, 'pi', "
            f"{_UA} = '', 'unknown', {_UA})")
_CAUSES = ("if(match(brk, '^[a-z0-9.-]+ format: '), "
           "splitByString(', ', replaceRegexpOne(brk, '^[a-z0-9.-]+ format: ', '')), "
           "[trimBoth(replaceRegexpOne(replaceRegexpOne(brk, "
           "'^(call [0-9]+(, message [0-9]+)?|message [0-9]+|prompt): ', ''), '\\\\s*[(;].*$', ''))])")

DRIFT_VIEWS: dict[str, str] = {
    # One row per attempt: which harness sent it.
    "v_attempt_harness": f"""
        SELECT rollout_id, attempt_id, argMin({_HARNESS}, call_index) AS harness
        FROM {{db}}.calls FINAL
        WHERE request_base_call_id IS NULL
        GROUP BY rollout_id, attempt_id""",
    # One row per call: who sent it, which family and renderer answered, what broke and what did not parse.
    "v_call_conformance": f"""
        SELECT c.event_time AS time, c.call_id AS call_id, c.rollout_id AS rollout_id, c.call_index AS call_index,
               ifNull(h.harness, 'unknown') AS harness, {_FAMILY} AS family,
               c.chat_template_fingerprint AS template_fingerprint, c.parser_version AS parser_version,
               c.spliced_outputs AS spliced_outputs, length(c.prefix_breaks) AS prefix_breaks,
               JSONLength(c.sampling_extra_json, 'parse_errors') AS parse_errors,
               JSONExtractArrayRaw(c.sampling_extra_json, 'parse_errors') AS parse_error_texts
        FROM {{db}}.calls AS c FINAL
        LEFT JOIN {{db}}.v_attempt_harness AS h ON c.rollout_id = h.rollout_id AND c.attempt_id = h.attempt_id""",
    # One row per (call, named cause) of every prefix break the gateway recorded.
    "v_prefix_break_causes": f"""
        SELECT time, call_id, rollout_id, harness, family, template_fingerprint, parser_version, cause
        FROM (SELECT c.event_time AS time, c.call_id AS call_id, c.rollout_id AS rollout_id,
                     ifNull(h.harness, 'unknown') AS harness, {_FAMILY} AS family,
                     c.chat_template_fingerprint AS template_fingerprint, c.parser_version AS parser_version,
                     c.prefix_breaks AS breaks
              FROM {{db}}.calls AS c FINAL
              LEFT JOIN {{db}}.v_attempt_harness AS h
                  ON c.rollout_id = h.rollout_id AND c.attempt_id = h.attempt_id
              WHERE notEmpty(c.prefix_breaks))
        ARRAY JOIN arrayFlatten(arrayMap(brk -> {_CAUSES}, breaks)) AS cause""",
    # Per (harness, family, renderer version) and minute: calls, spliced calls, breaks, parse failures.
    "v_family_drift": """
        SELECT toStartOfMinute(c.time) AS time, c.harness AS harness, c.family AS family,
               c.template_fingerprint AS template_fingerprint, c.parser_version AS parser_version,
               count() AS calls, countIf(c.spliced_outputs > 0) AS spliced_calls,
               countIf(c.prefix_breaks > 0) AS calls_with_breaks, sum(c.prefix_breaks) AS breaks,
               countIf(c.parse_errors > 0) AS parse_failures
        FROM {db}.v_call_conformance AS c
        GROUP BY time, harness, family, template_fingerprint, parser_version""",
}
