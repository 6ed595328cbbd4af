"""TrainerStep v2 in ClickHouse (migration 0013): the engine/trainer mismatch, importance sampling and
staleness figures are stored, each stale-dropped sample is a row of v_stale_dropped, and the
dashboard's issue-19 panels compute their figures from them."""

from __future__ import annotations

from collections import Counter

from clickhouse_connect.driver.client import Client

from schemas.codec import get_codec
from sinks import dashboards
from sinks.store import write_records
from trainer_consumer.batching import Batch
from trainer_consumer.events import OffPolicySettings, trainer_step_record
from trainer_consumer.learner import StepResult
from trainer_consumer.losses import LossStats
from trainer_consumer.mismatch import MismatchStats


def _step(step: int, mismatch: MismatchStats, truncated: int, stale_ids: list[str], masked: int) -> dict:
    stats = LossStats(tokens=100, importance_tokens=100, importance_truncated=truncated)
    result = StepResult(stats=stats, grad_norm=1.0, samples=4, tokens=200, micro_batches=1, seconds=0.1,
                        mismatch=mismatch)
    batch: Batch[int] = Batch([], Counter({"stale": len(stale_ids)}), list(range(step * 10, step * 10 + 5)),
                              stale_dropped_ids=stale_ids, stale_masked_tokens=masked)
    record = trainer_step_record("run-off-policy", step, step - 1, step, batch, result,
                                 off_policy=OffPolicySettings("tis", max_staleness=2, stale_rule="mask"))
    codec = get_codec()
    return codec.decode(codec.encode("TrainerStep", record), expect="TrainerStep")[1]


def _panel(title: str) -> str:
    panel = next(p for p in dashboards.PANELS if p.title.startswith(title))
    return dashboards.expand_macros(panel.sql, interval_s=10**9)  # one bucket holds both steps


def test_off_policy_fields_are_stored_and_counted_on_the_dashboard(ch: Client) -> None:
    first = _step(1, MismatchStats(bound=0.2, tokens=100, abs_sum=5.0, max_abs=0.9, beyond=10), 4, ["s-a", "s-b"], 0)
    second = _step(2, MismatchStats(bound=0.2, tokens=300, abs_sum=3.0, max_abs=0.4, beyond=0), 2, ["s-c"], 7)
    write_records(ch, [("TrainerStep", first), ("TrainerStep", second)])

    stored = ch.query("SELECT step, mismatch_tokens, mismatch_mean_abs, mismatch_max_abs, mismatch_beyond_fraction, "
                      "importance_sampling, importance_truncated, max_staleness, stale_rule, stale_dropped_ids, "
                      "stale_masked_tokens FROM trainer_steps FINAL ORDER BY step").result_rows
    assert stored == [(1, 100, 0.05, 0.9, 0.1, "tis", 4, 2, "mask", ["s-a", "s-b"], 0),
                      (2, 300, 0.01, 0.4, 0.0, "tis", 2, 2, "mask", ["s-c"], 7)]
    dropped = ch.query("SELECT step, sample_id, trainer_version FROM v_stale_dropped ORDER BY sample_id").result_rows
    assert dropped == [(1, "s-a", 0), (1, "s-b", 0), (2, "s-c", 1)]

    (_, mean_abs, max_abs, beyond), = ch.query(_panel("Engine/trainer logprob mismatch")).result_rows
    assert abs(mean_abs - 8.0 / 400) < 1e-12 and max_abs == 0.9 and abs(beyond - 10 / 400) < 1e-12
    (_, mode, truncated), = ch.query(_panel("Importance sampling")).result_rows
    assert mode == "tis" and abs(truncated - 6 / 200) < 1e-12
    (_, samples_dropped, tokens_masked), = ch.query(_panel("Stale samples dropped")).result_rows
    assert (samples_dropped, tokens_masked) == (3, 7)
