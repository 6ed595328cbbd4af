"""The ``weight_sync`` settings section (``TOKENTRAIL_WEIGHT_SYNC__*``), read by the weight sync."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class WeightSyncSettings(BaseModel):
    # The gateway runs the sync for its own vLLM servers (`tokentrail gateway` with a vLLM upstream) and
    # records on each call the version it leased; the servers must run with VLLM_SERVER_DEV_MODE=1.
    in_gateway: bool = False
    # Token-in calls go to vLLM's /inference/v1/generate (servers started with --enable-scale-out), which
    # reports the weight label that sampled each output token; each call then records vLLM's version,
    # checked against the gate's lease. Off: /v1/completions, and the call records the lease.
    engine_versions: bool = False
    # vLLM base URLs (without /v1), comma-separated; empty: take the gateway's upstream list.
    servers: str = ""
    # How often the policy store's `latest` is read, and lagging servers retried.
    interval_s: float = 0.5
    # "keep" (in-flight updates): running requests are frozen across the update and go on under the new
    # weights, so an update never waits for the longest call; their tokens carry vLLM's per-token versions
    # (version_spans), which needs engine_versions; without it the gateway's gate falls back to "wait".
    # "wait": running requests finish on the old weights first (a sync then takes as long as the longest
    # running call); never "abort" (it fails calls).
    pause_mode: Literal["wait", "keep"] = "keep"
    # "delta": a version published with a delta against the version a server holds is loaded from the delta
    # (only the changed weight groups; models/policy_delta.py), anything else from the full checkpoint;
    # "full": always the full checkpoint. "elements": only the elements that changed in `engine_dtype`
    # (models/element_delta.py), applied to the sync's in-memory copy of the weights the servers hold, checked
    # against the published checksums and loaded as the changed groups; anything else from the full checkpoint.
    # The trainer must publish with a delta in the same dtype (trainer.publish_delta, trainer.engine_dtype).
    # "scatter" (the default): only the elements that changed, read by the servers' workers and written into
    # their parameters in place (servers started with deploy/vllm/serve.sh, which loads the worker extension
    # trainer_consumer.weight_sync.vllm_scatter); when no scatter is possible (a server without the extension, a
    # version without an element delta: trainer.publish_delta off) what "delta" does, after a failed scatter the
    # full checkpoint. The servers tokentrail starts carry the extension.
    transfer: Literal["scatter", "elements", "delta", "full"] = "scatter"
    # The dtype the servers serve (vLLM's --dtype): what element deltas are computed and checked in. The
    # reference model's engines serve float32 (deploy/vllm/serve.sh); a 7B/8B model is served in bfloat16.
    engine_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # Per request to vLLM; a reload of a large model from disk takes a while.
    timeout_s: float = 300.0
    # Several versions on vLLM at once (docs/release-vllm.md): with in_gateway, gateway.follow_releases and a
    # vLLM upstream, the gateway gives each policy version its release serves servers of its own and loads them
    # through this sync's admin path; the sync keeps only the servers the release does not hold on the newest.
    # Needs --enable-scale-out (each call's version is vLLM's report) and VLLM_SERVER_DEV_MODE=1.
    release_servers: bool = False

    def sync_options(self) -> dict[str, Any]:
        """What these settings decide of a ``WeightSync`` (its keyword arguments): the transfer, the dtype its
        element deltas are checked in, the per-request time-out. Every sync the shell builds (the gateway's, the
        standalone ``tokentrail weight-sync``, the release router's) takes them from here, so none moves weights
        another way than the settings say. The pause mode is each caller's: it depends on what records versions."""
        import torch

        return {"transfer": self.transfer, "engine_dtype": getattr(torch, self.engine_dtype),
                "timeout_s": self.timeout_s}
