"""``tokentrail demo --release --upstream vllm``: the release demo served by vLLM, a server per policy version.

Two dev-mode vLLM servers (``demo/vllm.py``'s ``DemoVLLM``, started side by side), and the gateway's
settings for several versions on vLLM (docs/release-vllm.md): the versioned fleet with the weight sync in the
gateway (``weight_sync.release_servers``), each call's version read from vLLM's own report. The release demo
(``demo/release.py``) calls ``vllm_fleet`` around its run and adds ``evidence`` to its summary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from demo.vllm import DemoVLLM, version_evidence

SERVERS = 2  # serving + candidate, each on its own server


@contextlib.contextmanager
def vllm_fleet(model_dir: Path, model_name: str, logs: Path) -> Iterator[dict[str, str]]:
    """Start the servers; yields the gateway's environment; stops them at the end."""
    servers = [DemoVLLM(model_dir, model_name, logs / f"vllm-{i}.log") for i in range(SERVERS)]
    try:
        with ThreadPoolExecutor(SERVERS) as pool:
            started = list(pool.map(lambda s: s.start(), servers))
        print(f"  {SERVERS} vLLM servers ready in {max(started):.0f} s: {', '.join(s.url for s in servers)}",
              flush=True)
        env = servers[0].gateway_env()
        env["TOKENTRAIL_GATEWAY__UPSTREAM"] = ",".join(s.url for s in servers)
        env["TOKENTRAIL_WEIGHT_SYNC__RELEASE_SERVERS"] = "true"
        yield env
    finally:
        for server in servers:
            server.stop()


def evidence(calls: list[dict[str, Any]]) -> dict[str, object]:
    """Each stored call's recorded version against vLLM's report (``weight_versions`` in its engine details)."""
    return version_evidence(("OK" if call.get("error") is None else "ERROR", int(call["versions"]["policy_version"]),
                             call["sampling"]["extra_json"],
                             call.get("version_spans", ()))
                            for call in calls)
