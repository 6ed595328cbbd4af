"""Sticky routing: a session key and the release's current state give the policy version to serve.

In the contract because the gateway routes by it and producers/ may not import processors/.
Each session key hashes (sha256, salted with the release id) to a point ``u`` in [0, 1); the session is
served the candidate when ``u < fraction``. Properties, tested in tests/processors/release/test_routing.py
and tests/schemas/test_release_routing.py:

- Deterministic: every gateway replica, and a restarted one, routes a session the same way; no table of
  assignments is kept.
- Sticky while the ramp goes up: a session on the candidate at fraction ``f`` is on it at every
  ``f' >= f`` (``u < f <= f'``), and a session on serving at ``f'`` was on serving at every ``f <= f'``.
  So each session moves at most once during a release, from serving to the candidate, never back,
  until the release ends (a rollback moves the candidate's sessions back to serving; a promotion moves
  everyone to the candidate).
- Proportional: the share of sessions on the candidate is ``fraction`` (up to sampling noise).
- Independent cohorts: the salt makes each release pick its own sessions, so the same users are not
  the first to see every candidate.
- Pinned labels (evaluation traffic) always get their pinned version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

_SCALE = float(1 << 64)


def session_point(release_id: str, session_key: str) -> float:
    """The session's point in [0, 1): the first 64 bits of sha256(release id, session key)."""
    digest = hashlib.sha256(f"{release_id}\x00{session_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def route(
    session_key: str,
    *,
    release_id: str,
    serving_version: int,
    candidate_version: int | None,
    candidate_fraction: float,
    pinned: Mapping[str, int] | None = None,
    label: str | None = None,
) -> int:
    """The policy version that serves ``session_key`` (``label``: its traffic label, if it has one)."""
    if pinned and label is not None and label in pinned:
        return pinned[label]
    if candidate_version is None or candidate_fraction <= 0.0:
        return serving_version
    if candidate_fraction >= 1.0:
        return candidate_version
    return candidate_version if session_point(release_id, session_key) < candidate_fraction else serving_version
