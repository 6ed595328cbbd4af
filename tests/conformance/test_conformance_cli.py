"""``tokentrail conformance``, short form (CI): Pi, unchanged, through a gateway serving the real Llama 3 family,
its three calls judged by renderers (prompt ids) and vLLM's llama3_json parser (outputs); the matrix line and
the JSON figures. The full matrix (four harnesses x four families, and the corpus) is in the README."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_pi_on_llama3_is_token_exact_and_vllm_parses_what_the_gateway_parsed(
        kafka_admin: AdminClient, family_dir: Callable[[str], Path]) -> None:
    family_dir("llama3")  # built where the command looks (settings model.families_dir)
    stem = f"conformance-{uuid.uuid4().hex[:8]}"
    topics = [f"{stem}.calls", f"{stem}.env"]
    for future in kafka_admin.create_topics([NewTopic(t, 1, replication_factor=-1) for t in topics],
                                            operation_timeout=30).values():
        future.result()
    try:
        done = subprocess.run([sys.executable, "-m", "tokentrail.cli", "conformance", "--families", "llama3",
                               "--harnesses", "pi", "--no-corpus", "--calls-topic", topics[0],
                               "--env-topic", topics[1], "--timeout-s", "300"],
                              capture_output=True, text=True, timeout=900, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        for future in kafka_admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert figures["families"] == ["llama3"] and figures["harnesses"] == ["pi"]
    assert figures["cells"] == figures["cells_passed"] == 1
    assert figures["calls"] == 3 and figures["token_exact_fraction"] == 1.0
    assert figures["vllm_parses_compared"] == 3 and figures["vllm_parse_mismatches"] == 0
    assert figures["render_mismatches"] == 0 and figures["render_format_variants"] == 0  # variants: gpt-oss only
    assert any(line.startswith("pi") and "llama3" in line and " yes " in line for line in done.stdout.splitlines())
