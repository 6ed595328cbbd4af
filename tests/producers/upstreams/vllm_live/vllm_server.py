"""Install (once), start and stop a real vLLM server (CPU build, deploy/vllm/) for the live tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from schemas.local_paths import REPO_ROOT

INSTALL_SCRIPT = REPO_ROOT / "deploy" / "vllm" / "install.sh"
SERVE_SCRIPT = REPO_ROOT / "deploy" / "vllm" / "serve.sh"
LOG_DIR = REPO_ROOT / "var" / "log"
# vLLM's CPU attention kernels support head_dim 32, 64, 80, 96, 112, 128, ... (16 fails at the first request).
MIN_HEAD_DIM = 32


class VLLMStartError(RuntimeError):
    pass


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def install_vllm(timeout_s: float = 1500.0) -> float:
    """Run deploy/vllm/install.sh (a no-op once installed); returns the seconds it took."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / "vllm-install.log"
    started = time.monotonic()
    with open(log, "w") as out:
        result = subprocess.run(["bash", str(INSTALL_SCRIPT)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise VLLMStartError(f"{INSTALL_SCRIPT} failed (exit {result.returncode}); {log} ends:\n{_tail(log)}")
    return time.monotonic() - started


@dataclass
class VLLMServer:
    url: str  # base URL without /v1
    model_name: str
    logprobs_mode: str
    process: subprocess.Popen[bytes]
    log: Path
    startup_s: float

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the whole process group (API server, engine core, worker), then SIGKILL."""
        if self.process.poll() is not None:
            return
        pgid = os.getpgid(self.process.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.process.wait(timeout=30)
        try:  # children that outlived the API server
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_vllm(model_dir: Path, port: int, *, model_name: str, logprobs_mode: str, serve_options: list[str],
               vllm_args: list[str], startup_timeout_s: float = 300.0,
               env: dict[str, str] | None = None) -> VLLMServer:
    """Start deploy/vllm/serve.sh in its own process group and wait for ``GET /health`` = 200;
    ``env`` adds environment variables (e.g. VLLM_SERVER_DEV_MODE)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"vllm-server-{port}.log"
    command = ["bash", str(SERVE_SCRIPT), "--model", str(model_dir), "--name", model_name, "--port", str(port),
               "--host", "127.0.0.1", "--logprobs-mode", logprobs_mode, *serve_options, "--", *vllm_args]
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env={**os.environ, **(env or {})})
    server = VLLMServer(f"http://127.0.0.1:{port}", model_name, logprobs_mode, process, log, 0.0)
    deadline = started + startup_timeout_s
    try:
        while True:
            if process.poll() is not None:
                raise VLLMStartError(f"vLLM exited with {process.returncode} while starting; {log} ends:\n"
                                     f"{_tail(log)}")
            try:
                if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise VLLMStartError(f"vLLM did not answer /health within {startup_timeout_s:.0f} s; {log} ends:\n"
                                     f"{_tail(log)}")
            time.sleep(1.0)
    except BaseException:
        server.stop(grace_s=10)
        raise
    server.startup_s = time.monotonic() - started
    return server
