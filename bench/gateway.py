"""Gateway cost on the real path: the gateway in front of a vLLM-speaking server over HTTP, side by side
with LiteLLM and a thin pass-through proxy in front of the same server, with the same requests.

Processes of their own, all on this machine:

* **upstream** (``bench/fake_vllm.py``): an instant server speaking vLLM 0.32's exact wire format (chat with
  ``return_token_ids``, completions with token-id prompts, streamed and not, logprobs). It answers at
  once, so what a front adds over calling it directly is the front's own cost. Calling it directly is
  the baseline (**direct**).
* **gateway**: the real tokentrail gateway (``producers.gateway.wiring.build_app``, the vLLM upstream client
  of ``producers/upstreams/vllm/``) in ``--prefix-mode`` (default ``splice``): it renders and tokenizes
  the conversation, sends the ids to the upstream, records the call (Avro) and answers only after the
  record is acknowledged by the local Kafka broker (acks=all, with its spool).
* **thin**: ``bench/thin_proxy.py``, httpx relaying bytes and parsing nothing (a floor for any proxy).
* **litellm**: LiteLLM's proxy (one worker) from ``.venv-litellm`` (``make setup-bench-litellm``), the
  upstream as a ``hosted_vllm`` model. Without it its figures are null and a line says how to install it.
* **sealed**: the same gateway with forgetting on (issue 31): every rollout has a subject, so every record's
  content is sealed under that subject's AES-GCM data key (keys on a topic of the run). ``sealing_cpu_ratio``
  is its CPU per call over the plain gateway's, both measured in the same rotation (target: <= 1.10).
* **in-process** (secondary line, ``--inprocess-calls``): the gateway with an in-process upstream that
  answers at once (the figure this bench used to report; it cannot see the HTTP client path).

Workloads (``--workload``; chat requests with a first user message of about ``--prompt-tokens`` tokens):

* ``agent`` (default): what agent harnesses send. Every rollout is a conversation of ``--turns`` calls;
  call k repeats the whole history (earlier answers and tool results of about ``--turn-tokens`` tokens)
  and adds one turn. Every conversation differs from its first word on. ``--group-size G`` makes G
  consecutive conversations share their task message, as the rollouts of a GRPO group do.
* ``distinct``: every call a single-turn conversation of its own (the gateway's worst case).
* ``same``: every call the same single-turn conversation (best case).

After the main workload, ``--extra-calls`` calls each of the ``distinct`` and the streamed (``stream: true``)
agent workloads are measured at concurrency 1 (``distinct_*`` and ``stream_*`` figures).

At concurrency 1 the targets are called in turn for each request (rotating which goes first), so all
see the same machine state; ``added_*`` is a target minus direct. ``*cpu_ms_per_call`` is a process's CPU
(all threads and child processes, from /proc) per call at concurrency 1. ``*calls_per_s_c64``: the
throughput with 64 calls in flight, one target after the other. ``rss_growth_fraction``: the gateway's RSS
after its concurrency-64 calls over its RSS after the first tenth of them, minus one (``rss_mib_*``
checkpoints at every tenth). The client is a minimal keep-alive HTTP/1.1 client (bench/http_client.py).

Parts: bench/gateway_workload.py (what is sent, the run's topics), bench/gateway_targets.py (the servers it
starts), bench/gateway_measure.py (the phases), bench/gateway_figures.py (the figures and the table),
bench/gateway_serve.py (the gateway process), bench/gateway_memory.py (``--memory``); this module runs them.

    python -m bench.gateway [--calls N] [--c64-calls N] [--workload agent|distinct|same] [--targets ...]
                            [--prefix-mode splice|retokenize|upstream] [--upstream http|inprocess] ...
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.common import emit
from bench.gateway_figures import comparison_figures, delivery_figures, secondary_figures, summary_table
from bench.gateway_measure import measure
from bench.gateway_memory import run_memory
from bench.gateway_serve import serve
from bench.gateway_targets import Servers, start_servers
from bench.gateway_workload import Workloads, bench_topics, calls_of, make_workloads, output_ids_of, text_side
from bench.http_client import RawClient
from bench.processes import stop

ALL_TARGETS = ("gateway", "sealed", "thin", "litellm")


def gateway_calls(servers: Servers, work: Workloads) -> int:
    """Calls the gateways took, each of which must have put its record on the calls topic."""
    calls = calls_of(work.warmup, work.timed, work.c64, *work.extras.values()) if servers.get("gateway") else 0
    calls += calls_of(work.warmup, work.timed, work.c64, *work.extras.values()) if servers.get("sealed") else 0
    calls += calls_of(work.warmup, work.inprocess) if servers.get("inprocess") else 0
    return calls + (calls_of(work.warmup, work.c64) if servers.get("multi") else 0)


def records_on_kafka(kafka: Any, admin: Any, topic: str, group: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    from schemas.kafka.config import consumer_config

    consumer = Consumer(consumer_config(kafka, group))
    try:
        partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions)
    finally:
        consumer.close()


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The comparison: make the workloads, start the servers, measure, check delivery, compute the figures."""
    from tokentrail.settings import get_settings

    settings = get_settings()
    print(f"Kafka at {settings.kafka.bootstrap_servers} ...", flush=True)
    tag = uuid.uuid4().hex[:8]
    calls_topic, env_topic = f"bench.gateway.calls.{tag}", f"bench.gateway.env.{tag}"
    args.keys_topic = f"bench.gateway.keys.{tag}"  # the sealed gateway's key store makes it (compacted)
    text = text_side()
    output_ids = output_ids_of(text, args.output_tokens)
    work = make_workloads(args, text, text.decode(output_ids))
    longest = max(len(b) for c in work.timed for b in c)
    print(f"workload {args.workload}: first prompt {work.prompt_tokens} tokens (largest body {longest} bytes of "
          f"JSON); output {args.output_tokens} tokens; gateway prefix mode {args.prefix_mode}, upstream "
          f"{args.upstream}", flush=True)
    with bench_topics(settings.kafka, calls_topic, env_topic) as admin:
        servers = Servers(Path(tempfile.mkdtemp(prefix="bench-gateway-")))
        raw = RawClient()
        try:
            start_servers(args, servers, text, output_ids, calls_topic, env_topic)
            measured = await measure(args, servers, work, raw.post)
        finally:
            await raw.close()
            stop(servers.procs)
            for future in admin.delete_topics([args.keys_topic], operation_timeout=30).values():
                try:
                    future.result(timeout=60)
                except Exception:  # not made (no sealed target): nothing to delete
                    pass
        on_kafka = records_on_kafka(settings.kafka, admin, calls_topic, f"bench-{tag}")
    figures = comparison_figures(args, work, measured)
    return figures | secondary_figures(args, figures, measured, work) | delivery_figures(
        args, measured, servers, on_kafka, gateway_calls(servers, work))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway",
        description="Latency, CPU, throughput and memory the gateway adds in front of a vLLM-speaking server over "
                    "HTTP (durable Kafka delivery of every call record included), side by side with LiteLLM and a "
                    "thin pass-through proxy.")
    parser.add_argument("--calls", type=int, default=400, help="timed calls per target at concurrency 1")
    parser.add_argument("--c64-calls", type=int, default=3000, help="calls per target at concurrency 64")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls per target first")
    parser.add_argument("--extra-calls", type=int, default=100,
                        help="calls of each extra workload (distinct, streamed) at concurrency 1; 0: none")
    parser.add_argument("--inprocess-calls", type=int, default=100,
                        help="calls through a second gateway with an in-process upstream (secondary line); 0: none")
    parser.add_argument("--targets", default=",".join(ALL_TARGETS),
                        help="comma-separated fronts to measure beside direct: gateway, thin, litellm")
    parser.add_argument("--prompt-tokens", type=int, default=4096, help="rendered prompt length")
    parser.add_argument("--output-tokens", type=int, default=16, help="sampled tokens per call")
    parser.add_argument("--max-model-len", type=int, default=32768, help="the upstream model's context")
    parser.add_argument("--workload", choices=["agent", "distinct", "same"], default="agent",
                        help="agent: multi-turn conversations, each call extending the previous one (default); "
                        "distinct: a new single-turn conversation per call; same: one conversation for all")
    parser.add_argument("--turns", type=int, default=8, help="calls per conversation in the agent workload")
    parser.add_argument("--group-size", type=int, default=1,
                        help="agent workload: conversations per group sharing their task prompt")
    parser.add_argument("--turn-tokens", type=int, default=128,
                        help="words of tool result added per turn in the agent workload")
    parser.add_argument("--prefix-mode", choices=["splice", "retokenize", "upstream"], default="splice",
                        help="the gateway's prefix mode (default splice; upstream: pass-through, the upstream "
                        "renders)")
    parser.add_argument("--upstream", choices=["http", "inprocess"], default="http",
                        help="http: the gateway talks to the fake vLLM over HTTP (the real path, default); "
                        "inprocess: the gateway's upstream answers in its own process")
    parser.add_argument("--processes", type=int, default=1,
                        help="also measure, at concurrency 64, the gateway as this many processes behind one port "
                        "(rollout-sticky, producers/gateway/peers.py); 1: not measured")
    parser.add_argument("--memory", action="store_true",
                        help="instead of the comparison: the gateway's RSS after --memory-checkpoint and after "
                        "--memory-calls distinct requests on the real path (rollouts started and finished)")
    parser.add_argument("--memory-calls", type=int, default=50_000, help="calls in the memory run")
    parser.add_argument("--memory-checkpoint", type=int, default=5_000,
                        help="calls after which the memory run's reference RSS is read")
    parser.add_argument("--memory-prompt-tokens", type=int, default=64, help="first message of the memory run")
    parser.add_argument("--memory-turn-words", type=int, default=16, help="words of each later turn there")
    parser.add_argument("--memory-concurrency", type=int, default=32, help="conversations in flight there")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                        help="memory run: trace the gateway's allocations (FRAMES deep) and print what grew at "
                        "each checkpoint (slow; for finding what grows)")
    parser.add_argument("--no-fast-ascii", action="store_true",
                        help="tokenize with the tokenizer itself, not the exact ASCII fast path (for comparison)")
    # Internal: run a gateway (the benchmark starts it as a subprocess).
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream-url", help=argparse.SUPPRESS)
    parser.add_argument("--spool-dir", help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--peer-ports", help=argparse.SUPPRESS)
    parser.add_argument("--calls-topic", help=argparse.SUPPRESS)
    parser.add_argument("--env-topic", help=argparse.SUPPRESS)
    parser.add_argument("--seal-keys-topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)
    if args.memory:
        figures = asyncio.run(run_memory(args))
        print(f"\nRSS {figures['rss_mib_at_checkpoint']:,.0f} MiB after {figures['memory_checkpoint_calls']:,} "
              f"calls, {figures['rss_mib_at_end']:,.0f} MiB after {figures['memory_calls']:,}: growth "
              f"{figures['rss_growth_fraction']:+.1%}\n")
        emit(figures)
        return 0
    figures = asyncio.run(run_bench(args))
    if figures["records_on_kafka"] < figures["gateway_calls"]:
        print(f"WARNING: only {figures['records_on_kafka']} of {figures['gateway_calls']} call records "
              "are on Kafka", file=sys.stderr)
    summary_table(figures)
    emit(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
