"""What bench.gateway sends: the model's text side, the prompts and answers, the conversations of each
workload, and the benchmark's private Kafka topics (created for one run, deleted after it)."""

from __future__ import annotations

import argparse
import random
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

OUTPUT_TEXT = "The answer is forty-two, and here is why it holds in every case we tried."
MODEL = "bench"
CHAT = "/v1/chat/completions"


def text_side(fast_ascii: bool = True) -> Any:
    """The configured model's text side: the reference model, or a family's with settings ``model.family``
    and ``model.dir`` (``TOKENTRAIL_MODEL__FAMILY=qwen3 TOKENTRAIL_MODEL__DIR=...``: a 150K vocabulary)."""
    from producers.gateway.family_text_side import text_side_for
    from producers.gateway.wiring import build_configured_model, cache_budgets
    from tokentrail.settings import get_settings

    settings = get_settings()
    return text_side_for(build_configured_model(settings, progress=lambda _: None), fast_ascii=fast_ascii,
                         caches=cache_budgets(settings.gateway))


def output_ids_of(text: Any, count: int) -> list[int]:
    ids = text.encode_text(OUTPUT_TEXT)
    while len(ids) < count:
        ids += ids
    return ids[:count]


def prompt_of_tokens(text: Any, tokens: int) -> str:
    """A user message whose rendered chat prompt has about ``tokens`` tokens."""
    rng = random.Random(0)
    vocabulary = ["alpha", "river", "stone", "quietly", "compute", "seven", "orange", "because", "table",
                  "the", "of", "model", "gradient", "window", "north", "plain", "under", "vector"]
    words = [rng.choice(vocabulary) for _ in range(tokens)]
    for _ in range(4):
        content = " ".join(words)
        rendered = len(text.render_chat([{"role": "user", "content": content}], None,
                                        prefix_mode="retokenize", prior=[]).prompt_ids)
        if abs(rendered - tokens) <= 8:
            break
        words = (words * 2)[: max(1, int(len(words) * tokens / rendered))]
    return content


def words(rng: random.Random, count: int) -> str:
    vocabulary = ["result", "found", "line", "file", "error", "value", "returns", "match", "path", "ok",
                  "status", "count", "test", "passed", "module", "config", "key", "index"]
    return " ".join(rng.choice(vocabulary) for _ in range(count))


def conversations(workload: str, calls: int, turns: int, first: str, answer: str, turn_tokens: int,
                  max_tokens: int, seed: int, group_size: int = 1, stream: bool = False) -> list[list[bytes]]:
    """Request bodies, grouped by conversation (one rollout each), at least ``calls`` calls in all. In
    the agent workload, ``group_size`` consecutive conversations share their first message (a group).
    ``stream``: the requests ask for a streamed answer."""
    rng = random.Random(seed)

    def body(messages: list[dict[str, str]]) -> bytes:
        request: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 1.0}
        if stream:
            request["stream"] = True
        return orjson.dumps(request)

    if workload == "same":
        return [[body([{"role": "user", "content": first}])] for _ in range(calls)]
    if workload == "distinct":
        return [[body([{"role": "user", "content": f"case-{seed}-{n}-{uuid.uuid4().hex[:6]} {first}"}])]
                for n in range(calls)]
    out = []
    for n in range(-(-calls // turns)):
        if n % group_size == 0:
            task = f"task-{seed}-{n}-{uuid.uuid4().hex[:6]} {first}"
        messages = [{"role": "user", "content": task}]
        bodies = [body(messages)]
        for _ in range(turns - 1):
            messages = [*messages, {"role": "assistant", "content": answer},
                        {"role": "user", "content": words(rng, turn_tokens)}]
            bodies.append(body(messages))
        out.append(bodies)
    return out


def memory_conversations(count: int, turns: int, first: str, answer: str, turn_words: int, max_tokens: int,
                          seed: int) -> Iterator[list[bytes]]:
    """``count`` conversations of ``turns`` calls, made as they are needed (50k calls would hold hundreds
    of MB in the client): every one differs from its first word on, so every call is a distinct request."""
    rng = random.Random(seed)
    for n in range(count):
        messages = [{"role": "user", "content": f"memory-{seed}-{n}-{uuid.uuid4().hex[:8]} {first}"}]
        bodies = []
        for turn in range(turns):
            if turn:
                messages = [*messages, {"role": "assistant", "content": answer},
                            {"role": "user", "content": words(rng, turn_words)}]
            bodies.append(orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens,
                                        "temperature": 1.0}))
        yield bodies


@contextmanager
def bench_topics(kafka: Any, *names: str) -> Iterator[Any]:
    """The run's topics (6 partitions each) on the local broker (started if it does not answer), deleted
    after the run, best effort; yields the admin client."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.kafka.config import admin_config
    from tokentrail import kafka_local

    if not kafka_local.broker_answers(kafka):
        kafka_local.start(wait_s=120, kafka=kafka)
    admin = AdminClient(admin_config(kafka))
    for future in admin.create_topics([NewTopic(name, 6, replication_factor=-1) for name in names]).values():
        future.result(timeout=60)
    try:
        yield admin
    finally:
        for future in admin.delete_topics(list(names), operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception as exc:  # best effort: the figures matter more than the cleanup
                print(f"could not delete a bench topic: {exc}", file=sys.stderr)


@dataclass
class Workloads:
    """Every phase's request bodies, grouped by conversation, made before any server starts."""

    prompt_tokens: int
    warmup: list[list[bytes]]
    timed: list[list[bytes]]
    c64: list[list[bytes]]
    extras: dict[str, list[list[bytes]]]  # distinct, stream: measured at concurrency 1 after the main one
    inprocess: list[list[bytes]]


def make_workloads(args: argparse.Namespace, text: Any, answer: str) -> Workloads:
    content = prompt_of_tokens(text, args.prompt_tokens)
    prompt_len = len(text.render_chat([{"role": "user", "content": content}], None,
                                      prefix_mode="retokenize", prior=[]).prompt_ids)

    def phase(workload: str, calls: int, seed: int, stream: bool = False) -> list[list[bytes]]:
        turns = args.turns if workload == "agent" else 1
        return conversations(workload, calls, turns, content, answer, args.turn_tokens, args.output_tokens,
                             seed, args.group_size, stream)

    extras = {"distinct": phase("distinct", args.extra_calls, 4),
              "stream": phase("agent", args.extra_calls, 5, stream=True)} if args.extra_calls else {}
    return Workloads(prompt_len, phase(args.workload, args.warmup, 1), phase(args.workload, args.calls, 2),
                     phase(args.workload, args.c64_calls, 3), extras, phase(args.workload, args.inprocess_calls, 6))


def calls_of(*phases: list[list[bytes]]) -> int:
    return sum(len(conversation) for phase in phases for conversation in phase)
