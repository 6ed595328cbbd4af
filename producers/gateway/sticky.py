"""Which of several gateway processes owns a rollout: pure functions, no I/O.

An attempt's state (call counters, kept prompts and outputs for splicing and deltas) lives in the process
that started it (attempts.py), so every request about a rollout must reach that process. Ownership is a
stable hash of the rollout id over the processes; a process that starts a rollout without an id given
mints one that it owns itself, so the rollout's later requests find it by hash alone.

What names a rollout in a request: the model routes' path prefix ``/rollouts/{rid}/attempts/{aid}/...``,
the environment API's ``/v1/rollouts/{rid}/...`` and the ``X-Rollout-Id`` header. A request that names
none (unattributed calls, /health, /v1/models) is served by whichever process received it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable

ROLLOUT_HEADER = b"x-rollout-id"
# Set on a request one process passes to another, which then serves it whatever it hashes to.
FORWARDED_HEADER = b"x-tokentrail-forwarded"
START_PATH = "/v1/rollouts"


def owner_of(rollout_id: str, processes: int) -> int:
    """The process (0 .. processes-1) that owns ``rollout_id``; the same in every process and run."""
    digest = hashlib.blake2b(rollout_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % processes


def rollout_in_path(path: str) -> str | None:
    """The rollout id a route's path names, if any."""
    if path.startswith("/rollouts/"):
        rest = path[len("/rollouts/"):]
    elif path.startswith(START_PATH + "/"):
        rest = path[len(START_PATH) + 1:]
    else:
        return None
    rollout_id = rest.split("/", 1)[0]
    return rollout_id or None


def rollout_of(path: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The rollout a request names by its path or its ``X-Rollout-Id`` header (path first)."""
    found = rollout_in_path(path)
    if found is not None:
        return found
    for name, value in headers:
        if name.lower() == ROLLOUT_HEADER and value:
            return value.decode("latin-1")
    return None


def mint_owned_rollout_id(process: int, processes: int) -> str:
    """A fresh rollout id that ``owner_of`` gives to ``process`` (about ``processes`` draws)."""
    while True:
        rollout_id = uuid.uuid4().hex
        if owner_of(rollout_id, processes) == process:
            return rollout_id
