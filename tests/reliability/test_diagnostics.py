"""A failed scenario's detail names the error that started a worker crash, not only the cascade of
cancelled agents that ends the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.pipeline import worker_log_tail

pytestmark = pytest.mark.e2e

LOG = """\
[2026-12-02 00:11:40,001] [1] [INFO] [^Worker]: Ready
[2026-12-02 00:11:45,100] [1] [ERROR] [^--Consumer]: Committing raised exception: CommitFailedError('boom')
Traceback (most recent call last):
  File "x.py", line 1, in commit
kafka.errors.CommitFailedError: boom
[2026-12-02 00:11:46,788] [1] [ERROR] [^----Agent*: route]: Crashed reason=CancelledError()
Traceback (most recent call last):
asyncio.exceptions.CancelledError
""" + "".join(f"[2026-12-02 00:11:47,{i:03d}] [1] [INFO] [^Worker]: Stopping {i}\n" for i in range(80)) + \
    "[2026-12-02 00:11:47,795] [1] [CRITICAL] [^Worker]: We experienced a crash! Reraising original exception...\n"


def test_the_first_error_leads_even_when_the_tail_is_all_shutdown(tmp_path: Path) -> None:
    path = tmp_path / "worker.log"
    path.write_text(LOG)
    detail = worker_log_tail(path, 20)
    first, _, tail = detail.partition("last lines:")
    assert "CommitFailedError('boom')" in first and "kafka.errors.CommitFailedError: boom" in first
    assert "CancelledError" not in first  # the cascade is not a cause
    assert "CommitFailedError" not in tail and "We experienced a crash" in tail


def test_a_log_without_errors_is_just_its_tail(tmp_path: Path) -> None:
    path = tmp_path / "worker.log"
    path.write_text("".join(f"[t] [1] [INFO] line {i}\n" for i in range(50)))
    detail = worker_log_tail(path, 5)
    assert detail.splitlines() == [f"[t] [1] [INFO] line {i}" for i in range(45, 50)]


def test_a_differing_copy_is_named_with_the_fields_that_differ() -> None:
    from reliability.pipeline import Collected, compare

    want = {"r1": {"event_id": "r1", "reward": 1.0, "rollout_id": "a"},
            "r2": {"event_id": "r2", "reward": 0.0, "rollout_id": "b"}}
    got = Collected()
    got.add("Reward", b"a", want["r1"])
    got.add("Reward", b"a", {**want["r1"], "reward": 0.5})  # a re-emitted copy that differs
    got.add("Reward", b"b", want["r2"])
    got.add("Reward", b"c", {"event_id": "r3", "reward": 2.0, "rollout_id": "c"})
    result = compare(got, {"Reward": want}, ["Reward"])
    assert (result.lost, result.duplicated, result.redelivered) == (0, 2, 1)
    assert "first: r1" in result.detail and "'reward': ('0.5', '1.0')" in result.detail
    assert "rollout_id" not in result.detail.split("first: r1")[1].split(")")[0]  # only what differs
