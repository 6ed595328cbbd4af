"""One worker of a gateway run as several processes (supervisor.py starts them, peers.py routes between them).

What differs from a single gateway process, and why:

- its spool is ``<gateway.spool_dir>/worker-<index>``: a spool is one process's write-ahead log;
- the attempts' key secret stays in ``<gateway.spool_dir>`` itself, shared by every worker (and by a single
  process run on the same directory), so any worker derives the same key for an attempt (keys.py);
- at start it rebuilds from Kafka only the rollouts it owns (recovery.py ``owns``): another worker's
  attempt, rebuilt here too, would be swept, ended or given stand-ins for its calls in flight by a process
  that does not serve it;
- it listens on the public port beside its peers (``SO_REUSEPORT``) and on a loopback port of its own,
  where the peers pass it the requests it owns.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from producers.gateway.peers import StickyRouter, shared_socket
from producers.gateway.session_refs import SessionRefs
from producers.gateway.settings import GatewayStackSettings
from producers.gateway.sticky import RoutingPolicy, owner_of

PEER_HOST = "127.0.0.1"


def worker_spool(spool_dir: Path, index: int) -> Path:
    return spool_dir / f"worker-{index}"


def routing_policy(settings: GatewayStackSettings) -> RoutingPolicy:
    """What decides a request's session, from the same settings the app reads."""
    g = settings.gateway
    return RoutingPolicy(g.organic_sessions, tuple(g.session_key_sources), g.admin_key,
                         SessionRefs(g.session_ref_key.get_secret_value()))


def build_worker_app(settings: GatewayStackSettings, index: int, peer_ports: list[int], *,
                     topics: dict[str, str] | None = None, **build_kwargs: Any) -> StickyRouter:
    """Worker ``index`` of ``len(peer_ports)``: the standard app (wiring.build_app) behind its router."""
    from producers.gateway.options import GatewayOptions
    from producers.gateway.wiring import build_app, make_recovery_source

    processes = len(peer_ports)
    base_spool = settings.gateway.spool_dir
    gateway = settings.gateway.model_copy(update={"spool_dir": worker_spool(base_spool, index)})
    own = settings.model_copy(update={"gateway": gateway})  # type: ignore[attr-defined]
    options = dataclasses.replace(GatewayOptions.from_settings(own), key_secret_dir=base_spool)
    recovery = make_recovery_source(own, topics)
    if recovery is not None:
        recovery = dataclasses.replace(recovery, owns=lambda rollout_id: owner_of(rollout_id, processes) == index)
    app = build_app(own, options=options, recovery=recovery, topics=topics, **build_kwargs)
    app.state.gateway.body_checks.warm()  # its processes start now, not on the first large body
    peers = [f"http://{PEER_HOST}:{port}" for port in peer_ports]
    return StickyRouter(app, index, peers, routing_policy(settings), settings.gateway.max_body_bytes)


def serve_worker(router: StickyRouter, host: str, port: int, *, log_level: str = "info") -> None:
    """Serve ``router`` on the shared public port and on its own peer port until SIGTERM/SIGINT."""
    import uvicorn

    own_port = int(router.peer_urls[router.process].rsplit(":", 1)[1])
    sockets = [shared_socket(host, port), shared_socket(PEER_HOST, own_port)]
    # Harness clients keep connections open between turns; a short server keep-alive races their reuse.
    config = uvicorn.Config(router, log_level=log_level.lower(), timeout_keep_alive=120)
    uvicorn.Server(config).run(sockets=sockets)
