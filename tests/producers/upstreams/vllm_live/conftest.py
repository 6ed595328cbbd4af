"""Live vLLM fixtures: the real vLLM (CPU build) serving our tiny model, and the real gateway on it.

The session installs vLLM into .venv-vllm if it is not there yet (deploy/vllm/install.sh, 1.5-2.5 minutes
on a fresh machine; CI runs `make setup-vllm` first), builds the reference model (shared with the other
test areas), and starts one vLLM server for all live tests.

Server choices, recorded here because the assertions depend on them:
* ``--logprobs-mode processed_logprobs``: the logprob of each sampled token under the distribution it
  was actually drawn from (temperature, top-k, top-p applied), which is what importance ratios need; the
  calls use non-trivial temperature/top-k/top-p so that this differs from the raw distribution.
* ``serve.sh --quick-start``: no torch.compile warm-up (--enforce-eager, about 100 s less on 2 cores)
  and the model worker inside the engine-core process (one spawned process fewer, ~40 s of imports).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from models.reference.build import build_model
from producers.gateway.text_side import ModelTextSide
from testkit.gateway import RunningGateway, free_port, running_gateway
from tokentrail.settings import Settings

from .vllm_server import MIN_HEAD_DIM, VLLMServer, install_vllm, start_vllm

LOGPROBS_MODE = "processed_logprobs"
SERVE_OPTIONS = ["--quick-start"]
# The weight-update endpoints (/pause, /collective_rpc, /update_weight_version, ...) for the weight sync
# tests; the other tests do not notice them.
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
# /inference/v1/generate (token-in with per-token weight_versions spans) for the engine-versions tests and
# the demo on this server; the other tests do not notice it either.
VLLM_ARGS = ["--enable-scale-out"]

# Seconds each stage took in this session, printed at the end of the run.
TIMINGS: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.write_line(
            "vllm_live timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in TIMINGS.items())
        )


@pytest.fixture(scope="session")
def live_model_dir(tokentrail_settings: Settings) -> Path:
    started = time.monotonic()
    model_dir = build_model(tokentrail_settings.model.dir)
    TIMINGS["model build"] = time.monotonic() - started
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head_dim < MIN_HEAD_DIM:
        pytest.fail(f"the reference model has head_dim {head_dim}; vLLM's CPU attention needs >= {MIN_HEAD_DIM}")
    return model_dir


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    TIMINGS["vllm install"] = install_vllm()


@pytest.fixture(scope="session")
def vllm_server(vllm_installed: None, live_model_dir: Path, tokentrail_settings: Settings) -> Iterator[VLLMServer]:
    server = start_vllm(live_model_dir, free_port(), model_name=tokentrail_settings.model.name,
                        logprobs_mode=LOGPROBS_MODE, serve_options=SERVE_OPTIONS, vllm_args=VLLM_ARGS, env=SERVER_ENV)
    TIMINGS["vllm server start"] = server.startup_s
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def live_text_side(live_model_dir: Path) -> ModelTextSide:
    return ModelTextSide.from_dir(live_model_dir)


@pytest.fixture(scope="session")
def live_reference_model(live_model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(live_model_dir), dtype=torch.float32).eval()


@pytest.fixture
def live_topics(kafka_bootstrap: str, new_topic: Callable[..., str]) -> dict[str, str]:
    return {"calls_topic": new_topic(partitions=2), "env_topic": new_topic(partitions=2)}


GatewayFactory = Callable[..., AbstractContextManager[RunningGateway]]


@pytest.fixture
def vllm_gateway(vllm_server: VLLMServer, live_text_side: ModelTextSide, live_topics: dict[str, str],
                 tokentrail_settings: Settings, tmp_path: Path) -> GatewayFactory:
    """``with vllm_gateway(prefix_mode="splice") as gw:`` the real gateway app on the vLLM upstream,
    recording to this test's Kafka topics."""
    from dataclasses import replace

    from producers.delivery import CallPublisher
    from producers.gateway.app import create_app
    from producers.gateway.options import GatewayOptions
    from producers.upstreams.vllm import VLLMUpstream
    from schemas.kafka.config import producer_config

    @contextmanager
    def start(**options: Any) -> Iterator[RunningGateway]:
        settings = tokentrail_settings
        gateway_options = replace(GatewayOptions.from_settings(settings), **options)
        upstream = VLLMUpstream([vllm_server.url], model=vllm_server.model_name,
                                logprobs_mode=vllm_server.logprobs_mode)
        sink = CallPublisher(producer_config(settings.kafka), tmp_path / "spool", settings.gateway.delivery_timeout_s)
        app = create_app(settings, upstream, sink, live_text_side, options=gateway_options,
                         topics=live_topics, close_upstream=True)
        with running_gateway(app) as gw:
            yield gw

    return start
