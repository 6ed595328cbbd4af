"""Weight sync: the trainer's published policy versions, pushed into a fleet of vLLM servers.

``syncer.WeightSync`` follows the policy store and updates every server as a unit through vLLM's
own endpoints (``vllm_admin.VLLMAdmin``); ``fleet.FleetView`` says which server serves which version
and which may take calls; ``gate.VersionGate`` lets a router in the same process hold calls during an
update so each call's recorded version is the one that sampled it. See docs/weight-sync.md.

The names below are loaded on first use: ``tokentrail.settings`` reads this package's ``settings``
module, and importing the syncer (which needs torch, through ``models.policy_delta``) there would make
every command, ``tokentrail kafka status`` included, pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer_consumer.weight_sync.fleet import FleetView, ServerState, ServerStatus
    from trainer_consumer.weight_sync.gate import VersionGate
    from trainer_consumer.weight_sync.syncer import NoHooks, SyncHooks, SyncReport, WeightSync
    from trainer_consumer.weight_sync.vllm_admin import AdminError, VLLMAdmin

# name -> the module of this package that defines it
_EXPORTS = {
    "FleetView": "fleet", "ServerState": "fleet", "ServerStatus": "fleet",
    "VersionGate": "gate",
    "NoHooks": "syncer", "SyncHooks": "syncer", "SyncReport": "syncer", "WeightSync": "syncer",
    "AdminError": "vllm_admin", "VLLMAdmin": "vllm_admin",
}

__all__ = ["AdminError", "FleetView", "NoHooks", "ServerState", "ServerStatus", "SyncHooks", "SyncReport",
           "VLLMAdmin", "VersionGate", "WeightSync"]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
