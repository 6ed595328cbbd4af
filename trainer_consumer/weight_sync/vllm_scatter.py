"""Element deltas scattered into a running vLLM's parameters, inside its workers.

vLLM mixes this class into its worker when the server is started with ``--worker-extension-cls
trainer_consumer.weight_sync.vllm_scatter.ScatterExtension`` (``deploy/vllm/serve.sh`` does, with the repository
on the worker's ``PYTHONPATH``); ``POST /collective_rpc {"method": NAME, "kwargs": {...}}`` then runs NAME in
every worker (``vllm/v1/worker/worker_base.py`` injects the class; only string arguments pass over HTTP). The
weight sync (``syncer.WeightSync``, transfer ``scatter``) calls:

* ``tokentrail_scatter_prepare(weights_path)`` after every full load of a checkpoint directory: reads it and
  keeps what ``engine_weights.EngineWeights`` needs (the tensor digests, and on a CPU build the unpacked twins of
  the weights its kernels packed away);
* ``tokentrail_scatter(version_dir)``: reads only the version's element delta (``elements/``, checked against
  its sha256) and writes its values in place, checked against the published digests;
* ``tokentrail_reload_check()``, before the first update of a server: whether an in-place reload gives the model
  the weights it loads (not so for a MoE model on vLLM 0.32's CPU build: its experts are prepacked once, at the
  first load, and a reload writes plain values into the prepacked buffers).

Both answer a JSON object. Any failure raises, which vLLM answers with HTTP 500: the sync then loads the full
checkpoint. One worker per model only (tensor and pipeline parallel size 1): a shard's rows are not mapped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from models.element_delta import DeltaMismatch

EXTENSION = "trainer_consumer.weight_sync.vllm_scatter.ScatterExtension"
PREPARE = "tokentrail_scatter_prepare"
SCATTER = "tokentrail_scatter"
RELOAD_CHECK = "tokentrail_reload_check"


class ScatterExtension:
    """Methods vLLM adds to its worker class (``self`` is the worker: ``model_runner``, ``vllm_config``)."""

    def tokentrail_reload_check(self) -> dict[str, Any]:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        prepacked = []
        for name, module in self.model_runner.get_model().named_modules():  # type: ignore[attr-defined]
            kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if isinstance(experts, CPUUnquantizedExperts) and not getattr(experts, "_use_zentorch", False):
                prepacked.append(name)
        if not prepacked:
            return {"in_place": True, "reason": ""}
        return {"in_place": False, "reason": (
            f"vLLM's CPU MoE kernel prepacks the experts of {len(prepacked)} layers (e.g. {prepacked[0]}) once, at the "
            "first load; an in-place reload would leave them wrong (vLLM 0.32): restart the server on the version")}

    def tokentrail_scatter_prepare(self, weights_path: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        from trainer_consumer.weight_sync.engine_weights import EngineWeights

        started = time.perf_counter()
        self._tokentrail_weights = None  # a failed prepare leaves nothing to scatter into
        parallel = self.vllm_config.parallel_config  # type: ignore[attr-defined]
        if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
            raise NotImplementedError("element scatter maps whole tensors: tensor and pipeline parallel size 1 only")
        if self.vllm_config.model_config.quantization is not None:  # type: ignore[attr-defined]
            raise NotImplementedError("element scatter writes unquantized weights only")
        checkpoint = {}
        for path in sorted(Path(weights_path).glob("*.safetensors")):
            checkpoint.update(load_file(str(path)))
        if not checkpoint:
            raise FileNotFoundError(f"{weights_path} holds no safetensors")
        weights = EngineWeights(self.model_runner.get_model(), checkpoint)  # type: ignore[attr-defined]
        self._tokentrail_weights = weights
        return {"tensors": len(weights.digests), "digest": weights.digest, "twin_bytes": weights.twin_bytes,
                "dtype": str(weights.dtype).removeprefix("torch."), "prepare_s": time.perf_counter() - started}

    def tokentrail_scatter(self, version_dir: str) -> dict[str, Any]:
        from models.policy_delta import load_element_delta, read_element_delta

        weights = getattr(self, "_tokentrail_weights", None)
        if weights is None:
            raise DeltaMismatch("no prepared weights to scatter into (tokentrail_scatter_prepare after a full load)")
        started = time.perf_counter()
        info = read_element_delta(Path(version_dir))
        delta = load_element_delta(Path(version_dir))
        read_s = time.perf_counter() - started
        result = weights.apply(delta)  # refused: still the base; failed after writing: refuses until prepared
        assert info is not None
        return {**result, "bytes_read": info.nbytes, "read_s": read_s, "digest": weights.digest}
