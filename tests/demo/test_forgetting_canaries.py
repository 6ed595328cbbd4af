"""The forgetting demo plants each user's canary in the user's first session only (demo/forgetting.py): a note
in every session changed the task enough that the policy's reward barely rose."""

from __future__ import annotations

from demo.forgetting import CanaryNotes, canary_message, make_canary


def test_a_canary_is_planted_in_the_first_session_of_its_user_only() -> None:
    canaries = {"demo-user-0": make_canary("demo-user-0"), "demo-user-1": make_canary("demo-user-1")}
    notes = CanaryNotes(canaries)
    assert notes.note("demo-user-0") == canary_message(canaries["demo-user-0"])
    assert notes.note("demo-user-0") is None and notes.note("demo-user-0") is None
    assert notes.note("demo-user-1") == canary_message(canaries["demo-user-1"])  # each user has its own first
    assert notes.note("demo-user-2") is None  # a user without a canary (the plain demo: none at all)
    assert CanaryNotes(canaries, sessions=2).note("demo-user-0") is not None
