"""Weight sync: the trainer's published policy versions, pushed into a fleet of vLLM servers.

``syncer.WeightSync`` follows the policy store and updates every server as a unit through vLLM's
own endpoints (``vllm_admin.VLLMAdmin``); ``fleet.FleetView`` says which server serves which version
and which may take calls; ``gate.VersionGate`` lets a router in the same process hold calls during an
update so each call's recorded version is the one that sampled it. See docs/weight-sync.md.
"""

from trainer_consumer.weight_sync.fleet import FleetView, ServerState, ServerStatus
from trainer_consumer.weight_sync.gate import VersionGate
from trainer_consumer.weight_sync.syncer import NoHooks, SyncHooks, SyncReport, WeightSync
from trainer_consumer.weight_sync.vllm_admin import AdminError, VLLMAdmin

__all__ = ["AdminError", "FleetView", "NoHooks", "ServerState", "ServerStatus", "SyncHooks", "SyncReport",
           "VLLMAdmin", "VersionGate", "WeightSync"]
