"""The whole bad-input corpus: HTTP cases on a real gateway, security cases on a second gateway that
requires keys, topic cases on a real worker and sink, configuration and verifier cases; plus the two
global checks (gateway still healthy, accepted calls all on Kafka)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from reliability.bad_inputs.limits import CORPUS_MAX_BODY_BYTES, CORPUS_MAX_RECORD_BYTES, CORPUS_MAX_TOKENS
from reliability.config_check import run_config_corpus
from reliability.http_check import run_http_corpus
from reliability.results import Summary
from reliability.security_check import run_security_corpus
from reliability.stream_check import run_topic_corpus
from schemas.kafka.config import admin_config
from testkit.kafka_read import count_event_ids, create_topics, delete_topics, lost_and_duplicated
from tokentrail.settings import Settings

Progress = Callable[[str], None]


def run_gateway_corpus(settings: Settings, workdir: Path, summary: Summary, progress: Progress) -> None:
    from testkit.gateway import running_embedded_gateway

    config = admin_config(settings.kafka)
    tag = uuid.uuid4().hex[:8]
    calls, env = f"reliability-{tag}.tokentrail.calls", f"reliability-{tag}.tokentrail.env"
    create_topics(config, [calls, env])
    try:
        began = time.monotonic()
        small_records = settings.model_copy(update={
            "kafka": settings.kafka.model_copy(update={"max_message_bytes": CORPUS_MAX_RECORD_BYTES})})
        with running_embedded_gateway(small_records, spool_dir=workdir / f"spool-{tag}",
                                      topics={"calls_topic": calls, "env_topic": env},
                                      max_tokens_limit=CORPUS_MAX_TOKENS,
                                      max_body_bytes=CORPUS_MAX_BODY_BYTES) as gw:
            progress(f"bad inputs: gateway up in {time.monotonic() - began:.0f}s at {gw.url}")
            results, accepted, healthy = run_http_corpus(gw.url, settings.model.name, progress)
        summary.cases += results
        summary.health_ok = summary.health_ok and healthy
        expected = set(accepted.call_ids) | set(accepted.env_event_ids)
        counts = count_event_ids(settings.kafka.client_config(), [calls, env], expected)
        lost, duplicated = lost_and_duplicated(counts, expected)
        summary.accepted_checked += len(expected)
        summary.accepted_lost += lost + duplicated
    finally:
        delete_topics(config, [calls, env])


def run_corpus(settings: Settings, workdir: Path, progress: Progress = lambda _: None, *,
               with_sink: bool = True) -> Summary:
    workdir.mkdir(parents=True, exist_ok=True)
    summary = Summary()
    summary.cases += run_config_corpus()
    progress(f"bad inputs: {len(summary.cases)} configuration and verifier cases done")
    run_gateway_corpus(settings, workdir, summary, progress)
    security = run_security_corpus(settings, workdir, progress)
    summary.cases += security
    progress(f"bad inputs: {len(security)} security cases done")
    topic_results, lost = run_topic_corpus(settings, workdir, progress, with_sink=with_sink)
    summary.cases += topic_results
    summary.accepted_lost += lost  # good pipeline outputs produced alongside the bad records
    return summary
