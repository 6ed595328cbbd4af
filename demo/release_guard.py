"""The release guard in the main ``tokentrail demo`` (demo/run.py), armed but idle.

The main demo trains online and publishes a new policy version every step; the engine follows the newest.
The guard is wired in as it is in production (deploy/): the release controller runs as a service, the gateway
follows the release decisions and the trainer runs with ``--follow-releases``. Until someone starts a release
none of that changes what is served (a track with no decision serves the engine's default, the newest
version), so the demo's result is the same; a person who runs ``tokentrail release start --candidate N``
while the demo runs sees the controller compare, ramp, promote or roll back, and the trainer resume after a
rollback. ``tokentrail demo --release`` shows the guard deciding.
"""

from __future__ import annotations

import re
from pathlib import Path

from demo.services import Service

# What the gateway needs to follow the release decisions (producers/gateway/settings.py).
FOLLOW_RELEASES_ENV = {"TOKENTRAIL_GATEWAY__FOLLOW_RELEASES": "true"}
TRAINER_ARGS = ("--follow-releases",)

# The controller's progress line (processors/stream/release_controller.py, ``_progress``).
_PROGRESS = re.compile(r"controller: (\d+) calls, (\d+) rewards, (\d+) decisions folded")


def controller_service(logs: Path) -> Service:
    return Service("release-controller", ["release", "control", "--progress-every", "60"],
                   logs / "release-controller.log")


def guard_summary(log_path: Path) -> dict[str, int]:
    """The controller's last counts (it prints them when it stops): calls and rewards it followed, and the
    decisions it folded. Empty when it printed none (it did not run)."""
    if not log_path.exists():
        return {}
    found = _PROGRESS.findall(log_path.read_text(errors="replace"))
    if not found:
        return {}
    calls, rewards, decisions = (int(x) for x in found[-1])
    return {"release_controller_calls": calls, "release_controller_rewards": rewards, "release_decisions": decisions}


def guard_line(summary: dict[str, int]) -> str:
    if not summary:
        return "release guard: the controller printed no counts (see its log)"
    return (f"release guard: the controller followed {summary['release_controller_calls']} calls and "
            f"{summary['release_controller_rewards']} rewards, {summary['release_decisions']} release decisions "
            "(none is started here; `tokentrail release start --candidate N` while the demo runs starts one)")
