from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .fake_vllm_server import FakeVLLM, load_fixtures


@pytest.fixture(scope="session")
def vllm_fixtures() -> dict[str, dict[str, Any]]:
    return load_fixtures()


@pytest.fixture
def fake_vllm(vllm_fixtures: dict[str, dict[str, Any]]) -> Iterator[FakeVLLM]:
    server = FakeVLLM(vllm_fixtures).start()
    yield server
    server.stop()


@pytest.fixture
def fake_vllm_fleet(vllm_fixtures: dict[str, dict[str, Any]]) -> Iterator[list[FakeVLLM]]:
    servers = [FakeVLLM(vllm_fixtures, name=f"fake-vllm-{i}").start() for i in range(3)]
    yield servers
    for server in servers:
        server.stop()
