"""The demo's vLLM server (``tokentrail demo --upstream vllm``): deploy/vllm/serve.sh from .venv-vllm on the
reference model, in dev mode (the weight sync's endpoints), with the logprobs the trainer's importance
ratios need (processed: the distribution actually sampled from), and with ``--enable-scale-out`` so that
token-in calls go to ``/inference/v1/generate``, whose answers say which weights sampled every token.

And the demo's evidence that every call recorded the version vLLM served it with: ``version_evidence``
reads the stored calls back (ClickHouse) and compares each call's recorded ``policy_version`` with vLLM's
own report kept in its engine details (``weight_versions`` spans) and with the gate's lease."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import httpx

from producers.upstreams.vllm import label_version, spans_from_text
from sinks.client import connect
from sinks.settings import ClickHouseSettings
from tokentrail.settings import REPO_ROOT

SERVE = REPO_ROOT / "deploy" / "vllm" / "serve.sh"
LOGPROBS_MODE = "processed_logprobs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DemoVLLM:
    def __init__(self, model_dir: Path, name: str, log_path: Path, url: str | None = None) -> None:
        """``url``: a server that is already running (started as ``start`` would start it), used as is."""
        self.model_dir, self.name, self.log_path = model_dir, name, log_path
        self.url = (url or f"http://127.0.0.1:{free_port()}").rstrip("/")
        self.external = url is not None
        self.process: subprocess.Popen[bytes] | None = None

    def gateway_env(self) -> dict[str, str]:
        """What the gateway service needs to serve from this server and keep it on the trainer's versions,
        each call's version read from vLLM's own report."""
        return {"TOKENTRAIL_GATEWAY__UPSTREAM": self.url, "TOKENTRAIL_GATEWAY__VLLM_MODEL": self.name,
                "TOKENTRAIL_GATEWAY__VLLM_LOGPROBS_MODE": LOGPROBS_MODE, "TOKENTRAIL_WEIGHT_SYNC__IN_GATEWAY": "true",
                "TOKENTRAIL_WEIGHT_SYNC__ENGINE_VERSIONS": "true"}

    def start(self, timeout_s: float = 900.0) -> float:
        """Start the server and wait for /health; returns the seconds it took (2-4 minutes on 2 cores).
        An external server is only checked: it must answer /health and serve /inference/v1/generate."""
        if self.external:
            began = time.monotonic()
            if httpx.get(f"{self.url}/health", timeout=10.0).status_code != 200:
                raise RuntimeError(f"the vLLM server at {self.url} is not healthy")
            return time.monotonic() - began
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        port = self.url.rsplit(":", 1)[1]
        command = ["bash", str(SERVE), "--model", str(self.model_dir), "--name", self.name, "--port", port,
                   "--logprobs-mode", LOGPROBS_MODE, "--quick-start", "--", "--enable-scale-out"]
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
        """SIGTERM to its process group (API server, engine core), then SIGKILL; an external server is
        left running."""
        if self.process is None or self.process.poll() is not None:
            return
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait(timeout=30)


RecordedSpan = Mapping[str, int] | Sequence[int]  # ClickHouse gives named tuples as mappings
StoredCall = tuple[str, int, str] | tuple[str, int, str, Sequence[RecordedSpan]]


def _span_tuple(span: RecordedSpan) -> tuple[int, int, int]:
    if isinstance(span, Mapping):
        return int(span["version"]), int(span["start"]), int(span["end"])
    version, start, end = span
    return int(version), int(start), int(end)


def version_evidence(calls: Iterable[StoredCall]) -> dict[str, object]:
    """Compare, call by call, the version each call recorded with the one vLLM says sampled its tokens.

    ``calls``: (status, recorded policy_version, sampling extra JSON[, recorded version_spans]) of every
    stored call. vLLM's report is the ``weight_versions`` spans in the engine details; the gate's lease is
    ``gate_version`` beside them. A one-version call mismatches when vLLM names another version than it
    recorded, or its lease differs; a call an update landed in (several versions) must record its first
    version and, in ``version_spans``, exactly vLLM's spans. Failed calls (status ERROR) sampled nothing
    and are only counted.
    """
    calls_n = failed = checked = unreported = mismatched = spanning = 0
    served: set[int] = set()
    first_mismatches: list[str] = []
    for status, recorded, extra_json, *rest in calls:
        calls_n += 1
        if status != "OK":
            failed += 1
            continue
        details = (json.loads(extra_json or "{}") or {}).get("engine_details") or {}
        reported = details.get("weight_versions")
        if not isinstance(reported, str):
            unreported += 1
            continue
        checked += 1
        spans = spans_from_text(reported)
        versions = [label_version(s.version) for s in spans]
        served.update(v for v in versions if v is not None)
        if len(set(versions)) > 1:
            spanning += 1
            recorded_spans = [_span_tuple(span) for span in (rest[0] if rest else ())]
            wrong = recorded != versions[0] or recorded_spans != [
                (v, s.start, s.end) for v, s in zip(versions, spans, strict=True)]
        else:
            wrong = any(v != recorded for v in versions) or details.get("gate_version", recorded) != recorded
        if wrong:
            mismatched += 1
            if len(first_mismatches) < 5:
                first_mismatches.append(f"recorded {recorded}, vLLM {reported}, gate {details.get('gate_version')}")
    return {"calls": calls_n, "failed_requests": failed, "calls_checked_against_vllm": checked,
            "calls_without_vllm_version": unreported, "version_mismatches": mismatched,
            "calls_spanning_versions": spanning, "versions_served_by_vllm": len(served),
            "newest_version_served_by_vllm": max(served, default=0), "first_mismatches": first_mismatches}


def stored_version_evidence(clickhouse: ClickHouseSettings) -> dict[str, object]:
    """``version_evidence`` over every call in ClickHouse (run it after the sink has caught up; embedded,
    this process then holds the chDB directory)."""
    client = connect(clickhouse)
    try:
        rows = client.query("SELECT status, policy_version, sampling_extra_json, version_spans "
                            "FROM calls FINAL").result_rows
    finally:
        client.close()
    return version_evidence((str(r[0]), int(r[1]), str(r[2]), r[3]) for r in rows)
