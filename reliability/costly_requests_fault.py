"""Fault (o): requests built for the most gateway CPU per byte, against ``tokentrail gateway`` as a process
(issue 29; the requests and the measurement: costly_requests.py). Passed: each is refused in its protocol, and
the small calls made beside it keep their p99 within 2x of theirs beside a plain request of the same size
(and alone), and the gateway is still up. Lost and duplicated are not counted here (0): no record is at stake,
the costly requests are refused before they get an index."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from reliability.costly_requests import costly_anthropic, costly_request_against, costly_responses
from reliability.faults import free_port
from reliability.results import FaultResult
from schemas.kafka.config import admin_config
from testkit.kafka_read import create_topics, delete_topics
from tokentrail.runtime.process import settings_env
from tokentrail.settings import REPO_ROOT, Settings

NAME = "o. costly Responses and Anthropic requests (CPU per byte)"
ITEMS = 16_000  # tools, and as many call items / tool_use blocks: ~1.8 and ~2.7 MB


def costly_requests_fault(settings: Settings, workdir: Path, progress: Callable[[str], None]) -> FaultResult:
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    topics = [f"reliability-{tag}.calls", f"reliability-{tag}.env"]
    create_topics(admin_config(settings.kafka), topics)
    gw = settings.gateway.model_copy(update={"port": free_port(), "spool_dir": workdir / "spool"})
    log = workdir / "gateway.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tokentrail.cli", "gateway", "--log-level", "warning",
                                 "--calls-topic", topics[0], "--env-topic", topics[1]], cwd=REPO_ROOT,
                                env=settings_env(settings.model_copy(update={"gateway": gw})),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{gw.port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                return FaultResult(NAME, "the gateway did not start", 0, 0, False, log.read_text()[-2000:])
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        model = settings.model.name
        outcomes = [costly_request_against(url, model, "responses", costly_responses(model, ITEMS)),
                    costly_request_against(url, model, "anthropic", costly_anthropic(model, ITEMS))]
        for outcome in outcomes:
            progress(f"fault o: {outcome.line()}")
        passed = all(o.ok for o in outcomes) and proc.poll() is None
        return FaultResult(NAME, "; ".join(o.line() for o in outcomes), 0, 0, passed,
                           "" if passed else log.read_text()[-2000:], seconds=time.monotonic() - began)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        delete_topics(admin_config(settings.kafka), topics)
