"""Prometheus metrics of one gateway app (its own registry, so several apps can share a process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Rendering a prompt costs about a millisecond of CPU; finer buckets show where it goes.
RENDER_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter("tokentrail_gateway_calls", "Model calls recorded", ["protocol", "status"],
                             registry=r)
        self.refused = Counter("tokentrail_gateway_refused_requests", "Requests refused before a call",
                               ["protocol", "status_code"], registry=r)
        self.prompt_tokens = Counter("tokentrail_gateway_prompt_tokens", "Prompt tokens sent upstream",
                                     registry=r)
        self.output_tokens = Counter("tokentrail_gateway_output_tokens", "Tokens sampled", registry=r)
        self.call_seconds = Histogram("tokentrail_gateway_call_seconds", "Call latency, request to response",
                                      ["protocol", "streamed"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_token_seconds = Histogram("tokentrail_gateway_first_token_seconds",
                                             "Time to the first sampled token", buckets=LATENCY_BUCKETS,
                                             registry=r)
        self.render_seconds = Histogram("tokentrail_gateway_render_seconds",
                                        "CPU time to render and tokenize one prompt (chat template, "
                                        "splicing, tokenizer)", buckets=RENDER_BUCKETS, registry=r)
        self.delivery_seconds = Histogram("tokentrail_gateway_delivery_seconds",
                                          "Time for the publisher to acknowledge a record",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.delivery_errors = Counter("tokentrail_gateway_delivery_errors",
                                       "Records the publisher could neither send nor spool", ["topic"], registry=r)
        self.quarantined = Counter("tokentrail_gateway_quarantined_records",
                                   "Records too large for Kafka, kept in the quarantine folder", ["topic"],
                                   registry=r)
        self.env_events = Counter("tokentrail_gateway_env_events", "Environment events accepted", ["kind"],
                                  registry=r)
        self.spool_depth = Gauge("tokentrail_gateway_spool_depth", "Records waiting in the local spool",
                                 registry=r)
        self.active_attempts = Gauge("tokentrail_gateway_active_attempts", "Attempts started, not finished",
                                     registry=r)

    def watch_spool(self, depth: Callable[[], float]) -> None:
        self.spool_depth.set_function(depth)

    def watch_attempts(self, count: Callable[[], float]) -> None:
        self.active_attempts.set_function(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
