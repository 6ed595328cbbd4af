"""Forgetting in ClickHouse: blank a subject's content in every table that stores content (issue 31).

ClickHouse keeps content opened (the sink decodes with the process's sealer), so a forget must reach it
too: every row whose ``subject`` is the forgotten one gets its content columns blanked as the envelope
blanks them (strings empty, token arrays zero-filled to their length) by a synchronous mutation; ids,
lengths, hashes, versions, logprobs, scores, rewards and weights stay, so the audit still adds up. The
sink runs this on every ``Forgotten`` event it stores (so every ClickHouse behind any sink forgets), and
``tokentrail forget`` runs it directly. Rows of a forgotten subject that reach the sink later are stored
blank already: their content no longer opens.
"""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from sinks.ddl.tables import SUBJECT_CONTENT_COLUMNS

# Arrays of strings (one per env event of a rollout) are blanked item by item.
ARRAY_COLUMNS = frozenset({"e_payload_json"})
# Byte columns whose length is a fact (token counts): zero-filled, not emptied.
ZERO_FILLED = frozenset({"input_ids"})
# A sample stored by reference to its calls' tokens is stored whole again (zeros), no longer referencing.
SAMPLE_UNREFERENCE = ("input_ref_call_ids = []", "input_sha256 = ''")


def _blank(column: str) -> str:
    if column in ARRAY_COLUMNS:
        return f"{column} = arrayMap(x -> '', {column})"
    if column in ZERO_FILLED:
        return f"{column} = repeat(char(0), greatest(length({column}), input_length * 4))"
    if column in ("text",):  # Nullable: NULL stays NULL
        return f"{column} = if(isNull({column}), NULL, '')"
    return f"{column} = ''"


def _call_token_blanks() -> list[str]:
    """A forgotten call's prompt becomes a whole prompt of zeros of its length (no delta on a base, no
    prompt shared with another call), its hash the hash of those zeros (readers verify every prompt they
    rebuild; the original hash stays on the rollout row, where the audit finds it); its output zeros of its
    length. Logprobs are not content: kept."""
    zeros = "repeat(char(0), 4 * prompt_length)"
    return [
        "prompt_ids_arr = arrayWithConstant(prompt_length, toUInt32(0))", "prompt_ids_odd = ''",
        "prompt_ids_null = false", "prompt_new_ids_arr = []", "prompt_new_ids_odd = ''",
        "prompt_new_ids_null = true", "prompt_base_call_id = NULL", "prompt_base_prefix_len = 0",
        "prompt_shared_call_id = NULL", f"prompt_sha256 = lower(hex(SHA256({zeros})))",
        "output_ids_arr = arrayMap(x -> toUInt32(0), output_ids_arr)", "output_ids_odd = ''",
    ]


def blank_statements(database: str, where: str = "subject = {subject:String}") -> list[tuple[str, str]]:
    """(table, mutation) per content table for the rows ``where`` picks (default: one subject, a parameter)."""
    out = []
    for table, columns in SUBJECT_CONTENT_COLUMNS.items():
        sets = [_blank(c) for c in columns]
        if table == "samples":
            sets += SAMPLE_UNREFERENCE
        if table == "calls":
            # A blank body is whole: no delta on a base, no pasted copies, no hash of what was there.
            sets += [*_call_token_blanks(), "request_base_call_id = NULL", "request_shared_prefix = 0",
                     "request_shared_suffix = 0", "request_copies = []", "request_length = 0",
                     "request_sha256 = ''"]
        out.append((table, f"ALTER TABLE {database}.{table} UPDATE {', '.join(sets)} "
                           f"WHERE {where} SETTINGS mutations_sync = 2"))
    return out


def subject_row_counts(client: Client, subject: str) -> dict[str, int]:
    """Rows per content table that belong to ``subject``."""
    db = client.database
    return {table: int(client.query(f"SELECT count() FROM {db}.{table} WHERE subject = {{subject:String}}",
                                    parameters={"subject": subject}).result_rows[0][0])
            for table in SUBJECT_CONTENT_COLUMNS}


def blank_subject(client: Client, subject: str) -> dict[str, int]:
    """Blank the subject's content in every content table; rows touched per table (idempotent)."""
    counts = subject_row_counts(client, subject)
    for table, statement in blank_statements(client.database):
        if counts[table]:
            client.command(statement, parameters={"subject": subject})
    return counts


def retention_where(default_days: float | None, tenant_days: dict[str, float]) -> str | None:
    """The rows whose raw content is past its retention: rows of a subject (never the facts, never rows
    without a subject) older than their tenant's days (the part of the subject before its first '/'), else
    the default; None when nothing has a retention. Rows already blank are picked again (idempotent)."""
    if default_days is None and not tenant_days:
        return None
    tenant = "splitByChar('/', assumeNotNull(subject))[1]"
    cases = [f"{tenant} = '{t.replace(chr(39), '')}', {float(d)}" for t, d in sorted(tenant_days.items())]
    fallback = "-1" if default_days is None else str(float(default_days))
    days = f"multiIf({', '.join(cases)}, {fallback})" if cases else fallback
    return (f"subject IS NOT NULL AND {days} >= 0 AND "
            f"event_time < now64(6) - toIntervalSecond(toInt64({days} * 86400))")


def blank_expired(client: Client, default_days: float | None, tenant_days: dict[str, float]) -> int:
    """Retention of raw content in ClickHouse: blank the content of rows past their retention, as a forget
    blanks it (lengths kept). A sweep rather than column TTLs: a column TTL resets a value to its default,
    which would change the token arrays' lengths the audit counts. The number of mutations run."""
    where = retention_where(default_days, tenant_days)
    if where is None:
        return 0
    for _table, statement in blank_statements(client.database, where):
        client.command(statement)
    return len(SUBJECT_CONTENT_COLUMNS)


def versions_trained_on(client: Client, subject: str) -> list[int]:
    """The policy versions whose training steps used a sample of ``subject``: a forget does not unlearn them
    (docs/forgetting.md). Ids and versions are facts, so this answers before and after the forget alike."""
    rows = client.query(
        "SELECT DISTINCT policy_version_after FROM trainer_steps FINAL ARRAY JOIN sample_ids AS sid "
        "WHERE sid IN (SELECT event_id FROM samples FINAL WHERE subject = {s:String}) ORDER BY 1",
        parameters={"s": subject}).result_rows
    return [int(r[0]) for r in rows]
