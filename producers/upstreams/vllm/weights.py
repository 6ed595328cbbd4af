"""Pushing new weights into the running servers of a vLLM fleet over their admin endpoints.

What vLLM (0.32) offers for pushing new weights into a running server:

* **LoRA adapters** (``--enable-lora``, environment ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``):
  ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}`` loads an adapter
  from a directory the server can read; with ``load_inplace: true`` an adapter of the same
  name is replaced. Requests select it with ``model: <lora_name>``.
  ``POST /v1/unload_lora_adapter {"lora_name"}`` removes one. Implemented here: pass
  ``lora_name`` and ``lora_path``.
* **Full weights from a checkpoint directory** (environment ``VLLM_SERVER_DEV_MODE=1``, which
  mounts the development and RL routers): ``POST /pause?mode=wait`` (``abort`` and ``keep``
  also exist) stops scheduling; ``POST /collective_rpc {"method": "reload_weights",
  "kwargs": {"weights_path": DIR}}`` makes every worker reload in place (the model runner's
  ``reload_weights``; collective_rpc passes string arguments only); ``POST
  /update_weight_version {"new_version": "7"}`` labels the engine (``GET /weight_info``
  reads it back); ``POST /resume``. Implemented here: pass ``weights_path``.
* **Trainer-pushed tensors** (same dev mode): ``/init_weight_transfer_engine`` (NCCL or IPC
  backend), then per update ``/start_weight_update``, ``/update_weights {"update_info"}``
  (the trainer sends the tensors over the transfer engine), ``/finish_weight_update
  {"weight_version"}``. Needs a trainer process on the same GPUs/cluster, so it is not
  driven from the gateway.
* **Sleep mode** (``--enable-sleep-mode``): ``POST /sleep?level=1|2`` offloads or discards
  weights and frees the KV cache (so a colocated trainer can use the GPU); ``POST /wake_up``
  (optionally ``?tags=weights`` then ``?tags=kv_cache``), ``GET /is_sleeping``. Combined with
  a reload or a transfer, this is the colocated RL loop.

Cached prefixes computed by the old weights must not serve the new ones: the reload path
here calls ``POST /reset_prefix_cache`` (dev mode) while the server is paused.
"""

from __future__ import annotations

from producers.upstreams.vllm.fleet import Fleet


async def push_weights(fleet: Fleet, version: int, *, lora_name: str | None = None, lora_path: str | None = None,
                       weights_path: str | None = None, pause_mode: str = "wait") -> None:
    """Make every server of ``fleet`` serve policy ``version``: a LoRA adapter (``lora_name`` and
    ``lora_path``) or full weights reloaded from ``weights_path`` and labelled ``version``."""
    if (lora_path is None) == (weights_path is None):
        raise ValueError("give exactly one of lora_path (with lora_name) or weights_path")
    if lora_path is not None and not lora_name:
        raise ValueError("a LoRA update needs lora_name")
    for server in fleet.servers:
        if lora_path is not None:
            await fleet.admin(server, "/v1/load_lora_adapter",
                              {"lora_name": lora_name, "lora_path": lora_path, "load_inplace": True})
            continue
        await fleet.admin(server, f"/pause?mode={pause_mode}", None)
        try:
            await fleet.admin(server, "/collective_rpc",
                              {"method": "reload_weights", "kwargs": {"weights_path": weights_path}})
            await fleet.admin(server, "/reset_prefix_cache", None)
            await fleet.admin(server, "/update_weight_version", {"new_version": str(version)})
        finally:
            await fleet.admin(server, "/resume", None)
