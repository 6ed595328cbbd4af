"""The fleet's versions as plain data: which server serves which policy version, and which may serve.

Pure: no I/O. The syncer (``syncer.py``) produces a new ``FleetView`` after each step; whoever routes
calls (the gateway) asks it which servers are ``routable`` — only those known to serve the target
version — so a server that failed to update is never used silently with an old policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

# vLLM labels its weights "default" until someone sets a version: the weights it was started with,
# which for this project is the base model, policy version 0.
BASE_LABEL = "default"


class ServerStatus(StrEnum):
    CURRENT = "current"  # serves the fleet's target version
    STALE = "stale"  # reachable, serves another version (not updated yet, or restarted)
    FAILED = "failed"  # its last update failed; it keeps whatever it had, and takes no traffic
    UNREACHABLE = "unreachable"  # did not answer


@dataclass(frozen=True)
class ServerState:
    url: str
    version: int | None  # the version its weights are labelled with; None when unknown
    status: ServerStatus
    error: str = ""


@dataclass(frozen=True)
class FleetView:
    target: int  # the version every server should serve
    servers: Mapping[str, ServerState] = field(default_factory=dict)

    def routable(self) -> list[str]:
        """Servers that serve the target version, in the fleet's order."""
        return [url for url, s in self.servers.items() if s.status is ServerStatus.CURRENT]

    def behind(self) -> list[str]:
        """Servers that do not (or may not) serve the target version."""
        return [url for url, s in self.servers.items() if s.status is not ServerStatus.CURRENT]

    def versions(self) -> dict[str, int | None]:
        return {url: s.version for url, s in self.servers.items()}

    def with_server(self, state: ServerState) -> FleetView:
        return replace(self, servers={**self.servers, state.url: state})

    def retarget(self, target: int) -> FleetView:
        """The same servers judged against a new target version."""
        return FleetView(target, {url: judge(url, s.version, target) if s.status is not ServerStatus.FAILED
                                  else s for url, s in self.servers.items()})


def judge(url: str, version: int | None, target: int) -> ServerState:
    """A reachable server's state from the version it reports."""
    status = ServerStatus.CURRENT if version == target else ServerStatus.STALE
    return ServerState(url, version, status)


def parse_label(label: str) -> int | None:
    """vLLM's weight label (``GET /weight_info``) as a policy version; None for a foreign label."""
    if label == BASE_LABEL:
        return 0
    return int(label) if label.isdigit() else None


def initial_view(urls: Iterable[str], target: int) -> FleetView:
    return FleetView(target, {url: ServerState(url, None, ServerStatus.STALE) for url in urls})
