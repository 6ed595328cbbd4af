"""``tokentrail weight-sync``: keep a vLLM fleet on the trainer's latest published policy version.

The sync itself is ``trainer_consumer.weight_sync.WeightSync``; the gateway's in-process composition with it
is ``tokentrail.runtime.weight_sync.gate_upstream``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.policy_store import PolicyStore
from tokentrail.errors import CliError
from trainer_consumer.weight_sync import FleetView, WeightSync

if TYPE_CHECKING:
    from tokentrail.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "weight-sync", help="keep vLLM servers on the trainer's latest published policy version",
        description="Follow the policy store (trainer.checkpoint_dir) and bring every vLLM server to each "
                    "newly published version as a unit: pause, load what changed (settings "
                    "weight_sync.transfer: scatter, elements, delta or full), reset the prefix cache, label the "
                    "version (GET /weight_info), resume. Servers must run with VLLM_SERVER_DEV_MODE=1. Prints one "
                    "line per update (with how the weights came) and per failing server.")
    p.add_argument("--servers", default=None,
                   help="comma-separated vLLM base URLs (default: settings weight_sync.servers, else "
                        "gateway.upstream)")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="policy store (default: settings trainer.checkpoint_dir)")
    p.add_argument("--base-dir", type=Path, default=None,
                   help="the model the servers start from, served as version 0 (default: settings model.dir)")
    p.add_argument("--interval", type=float, default=None, metavar="S",
                   help="seconds between looks at the store (default: settings weight_sync.interval_s)")
    p.add_argument("--once", action="store_true", help="one look: sync if needed, print the fleet, exit")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tokentrail.settings import get_settings

    settings = get_settings()
    section = settings.weight_sync
    servers = [s for s in (args.servers or section.servers or settings.gateway.upstream).split(",") if s.strip()]
    if not servers or not all(s.startswith("http") for s in servers):
        raise CliError(f"no vLLM server URLs to sync ({servers}); pass --servers http://HOST:PORT,...")
    store = PolicyStore(args.checkpoint_dir or settings.trainer.checkpoint_dir)
    interval = args.interval if args.interval is not None else section.interval_s
    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:7.1f} s] {line}", flush=True)

    sync = fleet_sync(settings, servers, store, args.base_dir or settings.model.dir, log)
    return asyncio.run(_follow(sync, interval, args.once, log))


def fleet_sync(settings: Settings, servers: list[str], store: PolicyStore, base_dir: Path,
               log: Callable[[str], None]) -> WeightSync:
    """The standalone sync of ``servers``: the settings' transfer (``WeightSyncSettings.sync_options``, as in the
    gateway), in-flight updates only where the gateways record vLLM's own spans."""
    section = settings.weight_sync
    pause_mode: Any = section.pause_mode if section.engine_versions else "wait"
    return WeightSync(servers, store, pause_mode=pause_mode, log=log, base_dir=base_dir, **section.sync_options())


async def _follow(sync: WeightSync, interval_s: float, once: bool, log: Callable[[str], None]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        view = await sync.check()
        log(f"fleet: {_describe(view)}; store latest: {sync.store.latest_version()}")
        if once:
            await sync.tick()
            log(f"fleet: {_describe(sync.view)}")
            return 0 if not sync.view.behind() else 1
        await sync.follow(stop, interval_s)
        return 0
    finally:
        await sync.close()


def _describe(view: FleetView) -> str:
    return ", ".join(f"{url} v{s.version} {s.status.value}" for url, s in view.servers.items())


