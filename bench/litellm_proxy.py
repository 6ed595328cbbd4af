"""LiteLLM's proxy in front of a vLLM-speaking server, for side-by-side figures. LiteLLM is no dependency
of tokentrail: `make setup-bench-litellm` installs the pinned version (bench/litellm-requirements.txt)
into .venv-litellm, and the benchmarks run it from there when it is present."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from schemas.local_paths import REPO_ROOT

LITELLM = REPO_ROOT / ".venv-litellm" / "bin" / "litellm"
HEALTH_PATH = "/health/liveliness"
INSTALL_HINT = "LiteLLM is not installed: `make setup-bench-litellm` puts it into .venv-litellm"


def available() -> bool:
    return LITELLM.exists()


def config(upstream: str, model: str) -> str:
    """One model, served by the vLLM-compatible server at ``upstream`` (its base URL, without /v1)."""
    return (
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: hosted_vllm/{model}\n"
        f"      api_base: {upstream.rstrip('/')}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
    )


def start(port: int, upstream: str, model: str, workdir: Path) -> subprocess.Popen[bytes]:
    """One LiteLLM proxy process (one worker) on 127.0.0.1:``port``; nothing leaves the machine."""
    path = workdir / "litellm.yaml"
    path.write_text(config(upstream, model))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "LITELLM_LOG": "ERROR", "DISABLE_ADMIN_UI": "True",
           # Like the gateway it is compared with, no keys (loopback only): no auth check on either side.
           "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}
    return subprocess.Popen([str(LITELLM), "--config", str(path), "--host", "127.0.0.1", "--port", str(port),
                             "--num_workers", "1"], env=env, stdout=subprocess.DEVNULL, cwd=workdir)


def _pinned_version() -> str:
    for line in (REPO_ROOT / "bench" / "litellm-requirements.txt").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            return line.split("==", 1)[1].strip()
    return "unknown"


VERSION = _pinned_version()
