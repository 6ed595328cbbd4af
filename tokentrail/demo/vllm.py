"""The demo's vLLM server (``tokentrail demo --upstream vllm``): deploy/vllm/serve.sh from .venv-vllm on the
reference model, in dev mode (the weight sync's endpoints), with the logprobs the trainer's importance
ratios need (processed: the distribution actually sampled from)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from tokentrail.settings import REPO_ROOT

SERVE = REPO_ROOT / "deploy" / "vllm" / "serve.sh"
LOGPROBS_MODE = "processed_logprobs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DemoVLLM:
    def __init__(self, model_dir: Path, name: str, log_path: Path) -> None:
        self.model_dir, self.name, self.log_path = model_dir, name, log_path
        self.url = f"http://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen[bytes] | None = None

    def gateway_env(self) -> dict[str, str]:
        """What the gateway service needs to serve from this server and keep it on the trainer's versions."""
        return {"TOKENTRAIL_GATEWAY__UPSTREAM": self.url, "TOKENTRAIL_GATEWAY__VLLM_MODEL": self.name,
                "TOKENTRAIL_GATEWAY__VLLM_LOGPROBS_MODE": LOGPROBS_MODE, "TOKENTRAIL_WEIGHT_SYNC__IN_GATEWAY": "true"}

    def start(self, timeout_s: float = 900.0) -> float:
        """Start the server and wait for /health; returns the seconds it took (2-4 minutes on 2 cores)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        port = self.url.rsplit(":", 1)[1]
        command = ["bash", str(SERVE), "--model", str(self.model_dir), "--name", self.name, "--port", port,
                   "--logprobs-mode", LOGPROBS_MODE, "--quick-start"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
        began = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode} while starting; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return time.monotonic() - began
            except httpx.HTTPError:
                pass
            if time.monotonic() - began > timeout_s:
                self.stop()
                raise TimeoutError(f"vLLM did not start within {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(2.0)

    def weight_label(self) -> str:
        return str(httpx.get(f"{self.url}/weight_info", timeout=10.0).json()["weight_version"])

    def stop(self) -> None:
        """SIGTERM to its process group (API server, engine core), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait(timeout=30)
