"""The gateway benchmark runs end to end on a few calls and prints the figures the gateway issue asks for."""

from __future__ import annotations

import json
import subprocess
import sys

from schemas.local_paths import REPO_ROOT

REQUIRED = ("added_p50_ms_c1", "added_p99_ms_c1", "cpu_ms_per_call", "calls_per_s_c64")


def test_bench_gateway_prints_its_figures_with_every_record_on_kafka(kafka_bootstrap: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.gateway", "--calls", "20", "--c64-calls", "64", "--warmup", "2",
         "--turns", "3"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    for key in (*REQUIRED, "render_cpu_ms_per_call", "delivery_wait_ms_c1"):
        assert figures[key] > 0, (key, figures)
    # Read from /proc in clock ticks (10 ms): a bare server's 20 calls may take less than one.
    assert figures["direct_cpu_ms_per_call"] >= 0
    # Durable delivery is part of what is measured: every call's record reached the topic.
    assert figures["records_on_kafka"] == figures["gateway_calls"] > 64
    assert figures["delivery_errors"] == 0 and figures["spool_depth_at_end"] == 0
    assert figures["workload"] == "agent" and figures["turns_per_conversation"] == 3
