"""Exactly once from the TrainerStep events: twice, lost, re-emitted events and filtered-by-count samples."""

from __future__ import annotations

from trainer_consumer.step_audit import exactly_once


def _step(event_id: str, ids: list[str], ranks: int = 2, filtered: str = "{}", stale: list[str] | None = None,
          sample_ranks: list[int] | None = None) -> dict:
    return {"event_id": event_id, "sample_ids": ids, "ranks": ranks, "filtered_json": filtered,
            "stale_dropped_ids": stale or [], "sample_ranks": sample_ranks if sample_ranks is not None
            else [i % ranks for i in range(len(ids))]}


def test_every_sample_once_with_a_reemitted_event_and_named_or_counted_filters() -> None:
    events = [_step("e1", ["a", "b"]), _step("e1", ["a", "b"]),  # re-emitted after a restart: one event
              _step("e2", ["c"], filtered='{"stale":1,"zero_weight":1,"duplicate":2,"decode_error:X":1}',
                    stale=["d"]),
              _step("e3", [], filtered='{"zero_weight":1}')]
    audit = exactly_once(events, ["a", "b", "c", "d", "z1", "z2"])
    assert audit.ok and audit.samples_trained == 3 and audit.steps == 2 and audit.ranks == (2,)
    assert audit.lost == ["z1", "z2"] and audit.filtered_unnamed == 2 and audit.samples_lost == 0
    assert audit.rank_samples == {0: 2, 1: 1}
    assert audit.figures()["samples_trained_twice"] == 0


def test_a_sample_in_two_steps_and_an_unaccounted_one_fail() -> None:
    audit = exactly_once([_step("e1", ["a", "b"]), _step("e2", ["b", "c"], ranks=1)], ["a", "b", "c", "d"])
    assert not audit.ok
    assert audit.trained_twice == ["b"] and audit.samples_lost == 1 and audit.lost == ["d"]
    assert audit.ranks == (1, 2)
    assert audit.figures() | {"rank_samples": None} == {
        "steps": 2, "ranks": 2, "samples_trained": 3, "samples_trained_twice": 1, "samples_lost": 1,
        "samples_filtered_by_count": 0, "rank_samples": None}
