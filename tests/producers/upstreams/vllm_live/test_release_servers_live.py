"""Two policy versions served at once on real vLLM, one server per version (docs/release-vllm.md).

The session's server and one more, the real gateway following a release on the real broker, the real
openai SDK: serving v1 and candidate v2 at 50%. Every version is loaded into its server through the weight
sync's admin path before that server takes the version's calls; sessions split between the versions as the
release's hash says and each keeps its version; every record's version is the one vLLM reports for the
tokens (``weight_versions``); after a rollback the candidate's sessions are served by v1 at their next call
and nothing more is recorded at v2.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file

from models.policy_store import PolicyStore
from processors.release.controller import ReleaseState, initial_state, manual_decision, start_decision
from processors.release.events import decision_record
from processors.release.plan import load_plan
from processors.stream.release_controller import publish_decision
from producers.delivery import CallPublisher
from producers.gateway.text_side import ModelTextSide
from producers.gateway.wiring import build_app
from producers.sdk import Rollout
from producers.upstreams.vllm import label_version, spans_from_text
from schemas.kafka.config import producer_config
from schemas.release_routing import route
from testkit.gateway import free_port, running_gateway
from tokentrail.runtime.vllm_versions import release_servers_upstream
from tokentrail.settings import Settings

from .conftest import LOGPROBS_MODE, SERVE_OPTIONS, SERVER_ENV, TIMINGS, VLLM_ARGS
from .records import read_calls
from .test_weight_sync_live import perturbed, restore_base
from .vllm_server import VLLMServer, start_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

SESSIONS = [f"vllm-release-{i:02d}" for i in range(8)]
PLAN = load_plan({"ramp": [0.5]})


@pytest.fixture
def second_vllm(vllm_installed: None, live_model_dir: Path, tokentrail_settings: Settings) -> Iterator[
        Callable[[], VLLMServer]]:
    """One more server like the session's, started in the background (it overlaps the session server's start
    when both start in this test); call the value to wait for it."""
    started: dict[str, Any] = {}

    def start() -> None:
        try:
            server = start_vllm(live_model_dir, free_port(), model_name=tokentrail_settings.model.name,
                                logprobs_mode=LOGPROBS_MODE, serve_options=SERVE_OPTIONS, vllm_args=VLLM_ARGS,
                                env=SERVER_ENV)
            started["server"] = server
            TIMINGS["second vllm server start"] = server.startup_s
        except Exception as exc:  # raised in the test by the waiter
            started["error"] = exc

    thread = threading.Thread(target=start, daemon=True)
    thread.start()

    def wait() -> VLLMServer:
        thread.join()
        if "error" in started:
            raise started["error"]
        return started["server"]

    try:
        yield wait
    finally:
        thread.join()
        if "server" in started:
            started["server"].stop()


def test_serving_and_candidate_on_their_own_servers_then_a_rollback(
    second_vllm: Callable[[], VLLMServer], vllm_server: VLLMServer, live_model_dir: Path,
    live_text_side: ModelTextSide, live_topics: dict[str, str], tokentrail_settings: Settings,
    new_topic: Callable[..., str], tmp_path: Path,
) -> None:
    other = second_vllm()
    began = time.monotonic()
    urls = [vllm_server.url, other.url]
    base = load_file(str(live_model_dir / "model.safetensors"))
    store = PolicyStore(tmp_path / "policies")
    store.publish(1, perturbed(base, seed=1), {"test": "serving"})
    store.publish(2, perturbed(base, seed=2), {"test": "candidate"})

    decisions = new_topic(partitions=1)
    gateway = tokentrail_settings.gateway.model_copy(update={
        "follow_releases": True, "upstream": ",".join(urls), "vllm_model": vllm_server.model_name,
        "vllm_logprobs_mode": vllm_server.logprobs_mode, "spool_dir": tmp_path / "spool"})
    weight_sync = tokentrail_settings.weight_sync.model_copy(update={"release_servers": True})
    settings = tokentrail_settings.model_copy(update={"gateway": gateway, "weight_sync": weight_sync})
    model = settings.model.name
    state: ReleaseState = initial_state(model, PLAN, serving_version=1)

    def decide(make: Callable[[ReleaseState], Any]) -> None:
        nonlocal state
        record, state = decision_record(state, make(state), created_at_us=time.time_ns() // 1000)
        publish_decision(settings.kafka, decisions, record)

    decide(lambda s: start_decision(s, 2, "test", plan=PLAN))  # candidate 2 on 50% before the gateway starts
    routed = {s: route(s, release_id=state.release_id, serving_version=1, candidate_version=2,
                       candidate_fraction=0.5) for s in SESSIONS}
    assert set(routed.values()) == {1, 2}  # both kinds of session are in the test

    upstream = release_servers_upstream(settings, store=store, base_dir=live_model_dir)
    publisher = CallPublisher(producer_config(settings.kafka), tmp_path / "spool", 5.0)
    app = build_app(settings, upstream=upstream, publisher=publisher, text=live_text_side, topics=live_topics,
                    progress=lambda _: None, release_topic=decisions)
    try:
        with running_gateway(app) as gw, contextlib.ExitStack() as stack:
            rollouts = {s: stack.enter_context(Rollout(gw.url, task_input={}, rollout_id=s)) for s in SESSIONS}
            clients = {s: r.openai_client(max_retries=0) for s, r in rollouts.items()}

            def call_all(turn: int) -> None:
                for s in SESSIONS:
                    clients[s].chat.completions.create(model=model, max_tokens=6, seed=turn, temperature=1.0,
                                                       messages=[{"role": "user", "content": f"turn {turn}"}])

            call_all(0)  # the first calls wait while each server is loaded with its version
            TIMINGS["release servers: both versions loaded, first calls done"] = time.monotonic() - began
            release = httpx.get(f"{gw.url}/health", timeout=10).json()["release"]
            assert release["resident_versions"] == [1, 2]
            assert {url: f["version"] for url, f in upstream.fleet().items()} == {urls[0]: 1, urls[1]: 2}
            labels = {httpx.get(f"{u}/weight_info", timeout=10).json()["weight_version"] for u in urls}
            assert labels == {"1", "2"}  # vLLM's own label on each server
            call_all(1)

            decide(lambda s: manual_decision(s, "rollback", "test"))
            deadline = time.monotonic() + 30
            while httpx.get(f"{gw.url}/health", timeout=10).json()["release"]["traffic"]["candidate_version"]:
                assert time.monotonic() < deadline, "the gateway did not follow the rollback"
                time.sleep(0.1)
            call_all(2)  # the candidate's sessions now on v1; its server is reloaded with v1 meanwhile
            deadline = time.monotonic() + 60
            while any(f["version"] != 1 or not f["held"] for f in upstream.fleet().values()):
                assert time.monotonic() < deadline, f"the candidate's server was not reloaded: {upstream.fleet()}"
                time.sleep(0.1)
            assert upstream.errors == [] and upstream.checks["mismatched"] == 0
            TIMINGS["release servers: rollback to v1 on both servers"] = time.monotonic() - began
        labels_after = {httpx.get(f"{u}/weight_info", timeout=10).json()["weight_version"] for u in urls}
    finally:
        restore_base(vllm_server, live_model_dir, store)

    served: dict[tuple[str, int], int] = {}
    for s in SESSIONS:
        for record in read_calls(settings, live_topics["calls_topic"], s, 3):
            assert record["error"] is None, record["error"]
            details = json.loads(record["sampling"]["extra_json"])["engine_details"]
            reported = {label_version(span.version) for span in spans_from_text(details["weight_versions"])}
            version = record["versions"]["policy_version"]
            assert reported == {version}, (s, record["call_index"], details)  # the record is vLLM's report
            served[(s, record["call_index"])] = version

    assert {s: served[(s, 0)] for s in SESSIONS} == routed  # split as the release's hash says
    assert {s: served[(s, 1)] for s in SESSIONS} == routed  # each session kept its version
    assert {served[(s, 2)] for s in SESSIONS} == {1}  # after the rollback nothing at v2
    assert labels_after == {"1"}  # the candidate's server now serves v1 too
