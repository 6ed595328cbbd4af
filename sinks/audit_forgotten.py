"""The audit after a forget (issue 31 item 3): what belonged to a forgotten subject is reported as
"forgotten by request <id>", never as a failure, and the counts still add up (checked = verified +
forgotten + failed). The facts the checks use (ids, lengths, hashes, weights) stay, so the checks still run;
only the content comparison of a forgotten subject's tokens means nothing any more (both sides are blank)."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from sinks.audit_result import CheckResult, Failure

SQL_FORGOTTEN = "SELECT subject, argMax(request_id, created_at_us) FROM forgotten FINAL GROUP BY subject"
# Which ids each check reports, per table: the events of forgotten subjects.
CHECK_IDS = {"token_traceability": ("samples", "event_id", "Sample"),
             "rollout_traceability": ("rollouts", "event_id", "CompletedRollout"),
             "packing_preserves_weight": ("samples", "event_id", "Sample")}


def forgotten_requests(client: Client) -> dict[str, str]:
    """subject -> the request that forgot it (the latest, when asked more than once)."""
    return {str(s): str(r) for s, r in client.query(SQL_FORGOTTEN).result_rows}


def forgotten_ids(client: Client, table: str, id_column: str, requests: dict[str, str]) -> dict[str, str]:
    """event id -> forget request id, for the rows of ``table`` whose subject was forgotten."""
    if not requests:
        return {}
    rows = client.query(f"SELECT DISTINCT {id_column}, subject FROM {table} FINAL "
                        "WHERE subject IN {subjects:Array(String)}",
                        parameters={"subjects": sorted(requests)}).result_rows
    return {str(i): requests[str(s)] for i, s in rows}


def mark_forgotten(result: CheckResult, ids: dict[str, str], kind: str) -> None:
    """Move the check's findings on forgotten events out of its failures, into its forgotten list."""
    if not ids:
        return
    kept: list[Failure] = []
    for failure in result.failures:
        if failure.id in ids:
            result.failed_count -= 1
        else:
            kept.append(failure)
    result.failures = kept
    result.forgotten = [{"id": i, "kind": kind, "request_id": r} for i, r in sorted(ids.items())]
    by_request: dict[str, int] = {}
    for request in ids.values():
        by_request[request] = by_request.get(request, 0) + 1
    for request, n in sorted(by_request.items()):
        result.notes.append(f"{n} {kind} forgotten by request {request} (content erased; facts kept)")


def apply_forgotten(client: Client, results: list[CheckResult]) -> None:
    requests = forgotten_requests(client)
    if not requests:
        return
    for result in results:
        where = CHECK_IDS.get(result.key)
        if where is not None:
            table, column, kind = where
            mark_forgotten(result, forgotten_ids(client, table, column, requests), kind)
