"""bench.gateway's figures from what was measured: the gateway beside direct, the thin proxy and LiteLLM and
the ratios between them, the secondary lines, whether every record reached Kafka, and the table a person
reads first."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench import litellm_proxy
from bench.gateway_measure import C1Result, Measured
from bench.gateway_targets import Servers
from bench.gateway_workload import CHAT, Workloads, calls_of
from bench.http_client import percentile


def count(before: dict[str, float], after: dict[str, float], histogram: str) -> int:
    return round(after[f"{histogram}_count"] - before[f"{histogram}_count"])


def mean_ms(before: dict[str, float], after: dict[str, float], histogram: str) -> float:
    calls = after[f"{histogram}_count"] - before[f"{histogram}_count"]
    return (after[f"{histogram}_sum"] - before[f"{histogram}_sum"]) / max(calls, 1) * 1000


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def c1_figures(result: C1Result, name: str, prefix: str) -> dict[str, Any]:
    """A target's concurrency-1 figures: added latency over direct, and its CPU per call."""
    if name not in result:
        return {f"{prefix}added_p50_ms_c1": None, f"{prefix}cpu_ms_per_call": None}
    lat, cpu = result[name]
    direct = result["direct"][0]
    return {f"{prefix}added_p50_ms_c1": (statistics.median(lat) - statistics.median(direct)) * 1000,
            f"{prefix}added_p99_ms_c1": (percentile(lat, 0.99) - percentile(direct, 0.99)) * 1000,
            f"{prefix}cpu_ms_per_call": cpu}


def comparison_figures(args: argparse.Namespace, work: Workloads, m: Measured) -> dict[str, Any]:
    """The gateway beside direct, the thin proxy and LiteLLM, and the ratios between them."""
    gw, thin, lite = (m.c64.get(n) for n in ("gateway", "thin", "litellm"))
    figures = {
        "path": "http" if args.upstream == "http" else "in-process",
        "prompt_tokens": work.prompt_tokens,
        "direct_p50_ms_c1": statistics.median(m.main["direct"][0]) * 1000,
        **c1_figures(m.main, "gateway", ""),
        "calls_per_s_c64": gw.calls_per_s if gw else None,
        "gateway_p50_ms_c64": gw.p50_ms if gw else None,
        "gateway_p99_ms_c64": gw.p99_ms if gw else None,
        "cpu_ms_per_call_c64": gw.cpu_ms_per_call if gw else None,
        **c1_figures(m.main, "litellm", "litellm_"),
        "litellm_calls_per_s_c64": lite.calls_per_s if lite else None,
        **c1_figures(m.main, "thin", "thin_"),
        "thin_calls_per_s_c64": thin.calls_per_s if thin else None,
        **c1_figures(m.main, "sealed", "sealed_"),
        "sealed_calls_per_s_c64": m.c64["sealed"].calls_per_s if "sealed" in m.c64 else None,
        "direct_cpu_ms_per_call": m.main["direct"][1],
        "direct_calls_per_s_c64": m.c64["direct"].calls_per_s,
    }
    return figures | {
        "cpu_vs_litellm": ratio(figures["cpu_ms_per_call"], figures["litellm_cpu_ms_per_call"]),
        "added_p50_vs_litellm": ratio(figures["added_p50_ms_c1"], figures["litellm_added_p50_ms_c1"]),
        "throughput_vs_litellm": ratio(figures["calls_per_s_c64"], figures["litellm_calls_per_s_c64"]),
        "throughput_vs_thin": ratio(figures["calls_per_s_c64"], figures["thin_calls_per_s_c64"]),
        "cpu_vs_thin": ratio(figures["cpu_ms_per_call"], figures["thin_cpu_ms_per_call"]),
        # Issue 31: what sealing subjects' content costs the gateway (target <= 1.10).
        "sealing_cpu_ratio": ratio(figures["sealed_cpu_ms_per_call"], figures["cpu_ms_per_call"]),
        "sealing_throughput_ratio": ratio(figures["sealed_calls_per_s_c64"], figures["calls_per_s_c64"]),
    }


def secondary_figures(args: argparse.Namespace, figures: dict[str, Any], m: Measured, work: Workloads
                       ) -> dict[str, Any]:
    """Several processes, memory, the extra workloads, the in-process line and the gateway's own timings."""
    out: dict[str, Any] = {}
    if "multi" in m.c64:
        several = m.c64["multi"]
        out |= {"processes": args.processes, "calls_per_s_c64_processes": several.calls_per_s,
                "cpu_ms_per_call_c64_processes": several.cpu_ms_per_call,
                "gateway_p50_ms_c64_processes": several.p50_ms,
                "processes_vs_one": ratio(several.calls_per_s, figures["calls_per_s_c64"]),
                "processes_vs_thin": ratio(several.calls_per_s, figures["thin_calls_per_s_c64"]),
                "rss_mib_end_processes": several.rss_mib[-1] if several.rss_mib else None}
    gw = m.c64.get("gateway")
    if gw and gw.rss_mib:
        out |= {"rss_growth_fraction": gw.rss_mib[-1] / gw.rss_mib[0] - 1,
                "rss_mib_first_tenth_c64": gw.rss_mib[0], "rss_mib_end": gw.rss_mib[-1]}
    else:
        out["rss_growth_fraction"] = None
    for name in ("thin", "litellm"):
        if name in m.c64 and m.c64[name].rss_mib:
            out[f"{name}_rss_mib_end"] = m.c64[name].rss_mib[-1]
    for label, result in m.extras.items():
        out |= c1_figures(result, "gateway", f"{label}_")
        out |= c1_figures(result, "litellm", f"{label}_litellm_")
        out |= c1_figures(result, "thin", f"{label}_thin_")
    if m.inprocess is not None:
        out |= c1_figures(m.inprocess, "inprocess", "inprocess_")
    if m.gateway_after:
        out |= {"render_cpu_ms_per_call": mean_ms(m.gateway_before, m.gateway_after,
                                                   "tokentrail_gateway_render_seconds"),
                "delivery_wait_ms_c1": mean_ms(m.gateway_before, m.gateway_after,
                                                "tokentrail_gateway_delivery_seconds"),
                # How many calls each mean is over (0: the figure measured nothing, whatever it reads); the
                # main phase's rollouts are started before their calls, and their starts are delivered too.
                "c1_calls": calls_of(work.timed), "c1_rollouts": len(work.timed),
                "render_calls": count(m.gateway_before, m.gateway_after, "tokentrail_gateway_render_seconds"),
                "delivery_calls": count(m.gateway_before, m.gateway_after, "tokentrail_gateway_delivery_seconds")}
    return out


def delivery_figures(args: argparse.Namespace, m: Measured, servers: Servers, on_kafka: int,
                      gateway_calls: int) -> dict[str, Any]:
    """Whether every call took the real path and its record reached Kafka, and how the run was set up."""
    return {
        # The real path: the gateway's token-in calls reached the upstream over HTTP.
        "upstream_completions_requests": m.upstream_counts.get("/v1/completions", 0),
        "upstream_chat_requests": m.upstream_counts.get(CHAT, 0),
        "records_on_kafka": on_kafka, "gateway_calls": gateway_calls, "workload": args.workload,
        "prefix_mode": args.prefix_mode, "fast_ascii_tokenize": not args.no_fast_ascii,
        "turns_per_conversation": args.turns if args.workload == "agent" else 1,
        "group_size": args.group_size if args.workload == "agent" else 1,
        "litellm_version": litellm_proxy.VERSION if servers.get("litellm") else None,
        "spool_depth_at_end": max((s.get("spool_depth", -1) for s in m.sinks.values()), default=-1),
        "delivery_errors": sum(s.get("delivery_errors", 0) for s in m.sinks.values()),
    }


def summary_table(f: dict[str, Any]) -> None:
    """The side-by-side table a person reads first."""
    def show(value: Any, fmt: str = ",.1f") -> str:
        return "n/a" if value is None else format(value, fmt)

    print(f"\n{'target':<10} {'added p50 ms c1':>16} {'CPU ms/call c1':>15} {'calls/s c64':>12}")
    for name, prefix in (("tokentrail", ""), ("sealed", "sealed_"), ("thin", "thin_"), ("litellm", "litellm_")):
        print(f"{name:<10} {show(f.get(prefix + 'added_p50_ms_c1')):>16} {show(f.get(prefix + 'cpu_ms_per_call')):>15} "
              f"{show(f.get(prefix + 'calls_per_s_c64')):>12}")
    print(f"tokentrail vs LiteLLM: CPU x{show(f.get('cpu_vs_litellm'), '.2f')}, added p50 "
          f"x{show(f.get('added_p50_vs_litellm'), '.2f')}, throughput x{show(f.get('throughput_vs_litellm'), '.2f')}; "
          f"vs thin: throughput x{show(f.get('throughput_vs_thin'), '.2f')}\n")
