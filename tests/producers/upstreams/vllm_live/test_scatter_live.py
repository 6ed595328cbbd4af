"""Element deltas scattered into the real vLLM's parameters (CPU build, the session's server, which
deploy/vllm/serve.sh starts with the worker extension trainer_consumer.weight_sync.vllm_scatter): after the
scatter the server answers exactly as when it loads the full new checkpoint, and only the delta file moved.

The version changes a few percent of the elements of every tensor, so the scatter writes into each fused
parameter (q/k/v into qkv_proj, gate/up into gate_up_proj), the biases, the norms, the embedding and the
padded lm_head, and on this CPU build repacks every linear kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .scatter_check import scatter_then_full
from .vllm_server import VLLMServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_scattered_element_delta_serves_as_the_full_checkpoint(vllm_server: VLLMServer, live_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    check = scatter_then_full(vllm_server, live_model_dir, tmp_path)
    print(f"scatter: {check.delta_bytes} of {check.full_bytes} B, worker {check.worker}; scatter vs full load: max "
          f"logprob gap {check.gap:.2e}")
    # every fused part moved: each layer's qkv, o, gate_up and down, and lm_head repacked
    assert check.worker["repacked"] >= 4 * 2 + 1, check.worker
    assert check.delta_bytes < 0.15 * check.full_bytes
    assert check.gap <= 1e-5
    assert check.moved  # the scatter changed the model: other tokens, or the same ones with other logprobs
