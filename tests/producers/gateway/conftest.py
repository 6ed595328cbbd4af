"""Gateway fixtures: a real uvicorn gateway on the embedded engine with the Kafka publisher writing to
topics of its own, the model's text side, and the model itself for recomputing logprobs (the built
reference model, ``model_dir``, is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from producers.gateway.text_side import ModelTextSide
from testkit.gateway import RunningGateway, running_embedded_gateway
from tokentrail.settings import Settings


@pytest.fixture(scope="session")
def text_side(model_dir: Path) -> ModelTextSide:
    return ModelTextSide.from_dir(model_dir)


@pytest.fixture(scope="session")
def reference_model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


GatewayFactory = Callable[..., AbstractContextManager[RunningGateway]]


@pytest.fixture
def topics(kafka_bootstrap: str, new_topic: Callable[..., str]) -> dict[str, str]:
    return {"calls_topic": new_topic(partitions=2), "env_topic": new_topic(partitions=2)}


@pytest.fixture
def start_gateway(
    kafka_bootstrap: str,
    tokentrail_settings: Settings,
    model_dir: Path,
    text_side: ModelTextSide,
    topics: dict[str, str],
    tmp_path: Path,
) -> GatewayFactory:
    """``with start_gateway(prefix_mode="retokenize") as gw:`` a gateway writing to this test's topics."""

    @contextmanager
    def start(**options: Any) -> Iterator[RunningGateway]:
        spool = tmp_path / f"spool-{len(list(tmp_path.glob('spool-*')))}"
        with running_embedded_gateway(
            tokentrail_settings, spool_dir=spool, topics=topics, text=text_side, **options
        ) as gw:
            yield gw

    return start
