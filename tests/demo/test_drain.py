"""When the demo stops waiting for the pipeline: every finished rollout seen and rewarded, every sample seen
accounted for by a trainer step (trained, dropped as stale, or counted by a filter)."""

from __future__ import annotations

import json

from demo.progress import ProgressTracker
from tokentrail.settings import get_settings


def _step(event_id: str, trained: list[str], dropped: tuple[str, ...] = (),
          filtered: dict[str, int] | None = None) -> dict:
    return {"event_id": event_id, "sample_ids": trained, "stale_dropped_ids": list(dropped),
            "filtered_json": json.dumps(filtered or {}), "ranks": 1, "sample_ranks": [0] * len(trained),
            "loss": 0.0, "policy_version_after": 1, "mismatch_tokens": 0, "mismatch_mean_abs": 0.0,
            "mismatch_beyond_fraction": 0.0, "mismatch_max_abs": 0.0, "importance_tokens": 0,
            "importance_truncated": 0, "importance_sampling": "none", "stale_masked_tokens": 0}


def test_drained_only_when_every_rollout_is_rewarded_and_every_sample_accounted_for() -> None:
    tracker = ProgressTracker(get_settings())  # not started: records are applied by hand
    try:
        assert not tracker.drained(rollouts_finished=3)  # nothing seen yet
        for n, status in enumerate(["COMPLETE", "COMPLETE", "INCOMPLETE"]):
            tracker._apply("CompletedRollout", {"event_id": f"r{n}", "rollout_id": f"ro{n}", "status": status,
                                                "policy_versions": [0]})
        assert not tracker.drained(rollouts_finished=3)  # no rewards yet
        tracker._apply("Reward", {"event_id": "w0", "rollout_id": "ro0", "raw_reward": 1.0})
        assert not tracker.drained(rollouts_finished=3)  # ro1 is not rewarded
        tracker._apply("Reward", {"event_id": "w1", "rollout_id": "ro1", "raw_reward": 0.0})
        assert tracker.drained(rollouts_finished=3)  # no samples, all rewarded (the incomplete one has none)
        assert not tracker.drained(rollouts_finished=4)  # the workload finished one the tracker has not seen
        for n in range(4):
            tracker._apply("Sample", {"event_id": f"s{n}"})
        assert not tracker.drained(rollouts_finished=3)
        tracker._apply("TrainerStep", _step("t0", ["s0", "s1"]))
        assert not tracker.drained(rollouts_finished=3)  # s2 and s3 untrained
        tracker._apply("TrainerStep", _step("t1", [], dropped=["s2"], filtered={"zero_weight": 1}))
        assert tracker.drained(rollouts_finished=3)  # s2 dropped as stale by name, s3 counted by a filter
    finally:
        tracker._consumer.close()
