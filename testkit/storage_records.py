"""Consistent synthetic event chains (calls -> rollouts -> group -> scores -> rewards -> credits -> samples
-> trainer step), for the sink's tests and benchmark without a model or the processors.

Multi-turn: each prompt is the previous prompt ‖ output ‖ a tool result, delta-encoded on the
previous call exactly as the gateway does. Sample weights are 1/sampled_tokens per loss token, so
every rollout's weight is 1.0, as its credit says.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import orjson

from schemas.builders import make_call
from schemas.ids import content_hash, env_event_id, event_id
from schemas.prompt_delta import encode_prompt
from schemas.tokens import pack_floats, pack_int32
from testkit.samples import SequenceSpec, sample_record

Record = dict
Event = tuple[str, Record]

VOCAB = 32_000
BASE_TIME_US = 1_760_000_000_000_000
REWARD_CONFIG = {"kind": "group_normalized", "metric": "correct", "version": 1}
CREDIT_CONFIG = {"kind": "rollout", "weight": "per_rollout_mean", "version": 1}
SAMPLE_CONFIG = {"kind": "split_per_call", "version": 1}
PACK_CONFIG = {"kind": "packed", "version": 1}


@dataclass
class GroupSpec:
    group_index: int = 0
    rollouts: int = 4
    turns: int = 3
    prompt_tokens: int = 64
    turn_tokens: int = 24  # tool result appended before each later call
    output_tokens: int = 32
    policy_version: int = 1
    seed: int = 0
    pack: bool = False  # also emit PACKED samples (two rollouts per sequence) under another config
    trainer_step: bool = True
    # Value distributions (storage benchmarks): "uniform" ids over the vocabulary and logprobs uniform in
    # (-1, 0]; "zipf" ids and "model" logprobs look like a real tokenizer and sampler (see below).
    ids: str = "uniform"  # uniform | zipf
    logprobs: str = "uniform"  # uniform | model
    # Harness request/response bodies: "tiny" placeholders, or "chat": what the gateway records for an
    # OpenAI chat harness (the whole conversation so far as text, tool definitions, parameters).
    bodies: str = "tiny"  # tiny | chat
    tools: int = 8  # tool definitions in every "chat" request
    # "shared": the rollouts of the group answer one task, so their first prompts are identical (GRPO);
    # "distinct": every rollout starts from a prompt of its own (the storage worst case).
    task_prompt: str = "shared"  # shared | distinct


@dataclass
class GroupEvents:
    events: list[Event] = field(default_factory=list)
    rollout_ids: list[str] = field(default_factory=list)
    group_id: str = ""
    call_ids: list[str] = field(default_factory=list)
    sample_ids: list[str] = field(default_factory=list)

    def of(self, name: str) -> list[Record]:
        return [rec for n, rec in self.events if n == name]


def _zipf_cdf(exponent: float = 1.0) -> np.ndarray:
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-exponent)
    return cdf / cdf[-1]


_ZIPF_CDF = _zipf_cdf()


def _ids(rng: np.random.Generator, n: int, dist: str) -> np.ndarray:
    """Token ids. "zipf": id = frequency rank, Zipf(1) over the vocabulary, as BPE merges (and so ids)
    roughly follow corpus frequency; entropy ~11 bits against ~15 for uniform ids."""
    if dist == "uniform":
        return rng.integers(0, VOCAB, n, dtype=np.uint32)
    if dist == "zipf":
        return np.searchsorted(_ZIPF_CDF, rng.random(n)).astype(np.uint32)
    raise ValueError(f"unknown id distribution {dist!r}")


def _logprobs(rng: np.random.Generator, n: int, dist: str) -> np.ndarray:
    """Logprobs of the sampled tokens. "model": most tokens near-certain, a tail to about -25 (mean
    ~0.4 nats), computed as a float32 log-softmax does (logit - logsumexp, both ~10-30), so values
    lie on the float32 grid of numbers of that size and a near-certain token often gets exactly 0."""
    if dist == "uniform":
        return -rng.random(n, dtype=np.float32)
    if dist == "model":
        scale = rng.choice(np.array([0.005, 0.5, 3.0]), n, p=[0.65, 0.25, 0.10])
        nll = np.minimum(rng.exponential(scale), 25.0)
        logit = rng.uniform(8.0, 30.0, n).astype(np.float32)
        lse = (logit.astype(np.float64) + nll).astype(np.float32)
        return logit - lse
    raise ValueError(f"unknown logprob distribution {dist!r}")


# "chat" bodies: each token id stands for a fixed piece of text (2-5 letters after a space), so a
# body's text follows its prompt's tokens, as a real tokenizer's would.
@functools.cache
def _token_texts() -> np.ndarray:
    letters = np.random.default_rng(1).integers(97, 123, (VOCAB, 5))
    return np.array([" " + bytes(row[: 2 + i % 4].tolist()).decode() for i, row in enumerate(letters)], dtype=object)


def _text(ids: np.ndarray) -> str:
    return "".join(_token_texts()[ids])


def _tools(count: int) -> list[dict]:
    rng = np.random.default_rng(2)
    return [
        {"type": "function", "function": {
            "name": f"tool_{k}", "description": _text(rng.integers(0, VOCAB, 120)),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
                           "required": ["path"]}}}
        for k in range(count)
    ]


def _chat_request(messages: list[dict], tools: list[dict]) -> str:
    """A call's request as the gateway records it (records.request_json: sorted keys)."""
    body = {"max_tokens": 256, "messages": messages, "model": "tokentrail-tiny", "temperature": 1.0,
            "tools": tools}
    doc = {"body": body, "headers": {"user-agent": "synthetic-harness/1.0"}, "method": "POST",
           "path": "/v1/chat/completions", "query": ""}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()


def _chat_response(index: int, text: str) -> str:
    return orjson.dumps({"choices": [{"finish_reason": "stop", "index": 0,
                                       "message": {"content": text, "role": "assistant"}}],
                         "id": f"chatcmpl-{index}", "object": "chat.completion"}).decode()


def _call_record(
    rid: str,
    aid: str,
    index: int,
    prompt: dict,
    output: np.ndarray,
    logprobs: np.ndarray,
    version: int,
    t_us: int,
    request_json: str = '{"messages":[]}',
    response_json: str = '{"choices":[]}',
) -> Record:
    return make_call(
        rid, aid, index, (), output, logprobs=logprobs, prompt_record=prompt, request_json=request_json,
        response_json=response_json, spliced_outputs=index,
        versions={"model": "tokentrail-tiny", "policy_version": version, "tokenizer_fingerprint": "tok:1",
                  "chat_template_fingerprint": "tpl:1", "adapter_version": "openai/1", "parser_version": "p/1",
                  "engine": "embedded/0.1", "upstream": "embedded"},
        timings={"received_at_us": t_us, "queue_ms": 0.1, "first_token_ms": 5.0, "total_ms": 20.0},
    )


def synthetic_group(spec: GroupSpec) -> GroupEvents:
    rng = np.random.default_rng(spec.seed * 100_003 + spec.group_index)
    out = GroupEvents()
    gid = event_id("synthetic-group", spec.seed, spec.group_index)
    out.group_id = gid
    t0 = BASE_TIME_US + spec.group_index * 60_000_000
    rollouts: list[dict] = []
    if spec.bodies not in ("tiny", "chat"):
        raise ValueError(f"unknown body kind {spec.bodies!r}")
    tools = _tools(spec.tools) if spec.bodies == "chat" else []
    if spec.task_prompt not in ("shared", "distinct"):
        raise ValueError(f"unknown task prompt kind {spec.task_prompt!r}")
    task_prompt = _ids(np.random.default_rng([spec.seed, spec.group_index, 7]), spec.prompt_tokens, spec.ids)
    for r in range(spec.rollouts):
        rid = event_id("synthetic-rollout", spec.seed, spec.group_index, r)
        aid = f"{rid}-a1"
        out.rollout_ids.append(rid)
        start = {
            "event_id": env_event_id(rid, aid, "start", 0),
            "rollout_id": rid,
            "attempt_id": aid,
            "group_id": gid,
            "group_key": {"task": f"task-{spec.group_index}"},
            "expected_group_size": spec.rollouts,
            "task_input_json": '{"question": "2+2"}',
            "metadata_json": "{}",
            "attempt_number": 1,
            "created_at_us": t0,
            "subject": None,
            "sealed": None,
        }
        out.events.append(("AttemptStarted", start))
        prompt_ids = _ids(rng, spec.prompt_tokens, spec.ids)  # drawn either way: later draws stay the same
        if spec.task_prompt == "shared":
            prompt_ids = task_prompt
        prev_id, prev_seq = None, None
        calls, envs, prompts, outputs = [], [], [], []
        messages = [{"content": _text(prompt_ids), "role": "user"}] if spec.bodies == "chat" else []
        for i in range(spec.turns):
            if i:
                tool = _ids(rng, spec.turn_tokens, spec.ids)
                prompt_ids = np.concatenate([prev_seq, tool])
                if messages:
                    messages.append({"content": _text(tool), "role": "tool", "tool_call_id": f"call_{i - 1}"})
            output = _ids(rng, spec.output_tokens, spec.ids)
            logprobs = _logprobs(rng, spec.output_tokens, spec.logprobs)
            prompt = encode_prompt(prompt_ids, prev_id, prev_seq)
            bodies = {}
            if messages:
                answer = _text(output)
                bodies = {"request_json": _chat_request(messages, tools), "response_json": _chat_response(i, answer)}
                messages.append({"content": answer, "role": "assistant"})
            call = _call_record(
                rid, aid, i, prompt, output, logprobs, spec.policy_version, t0 + 1000 * (i + 1), **bodies
            )
            out.events.append(("CallRecord", call))
            out.call_ids.append(call["call_id"])
            calls.append(call)
            prompts.append(prompt_ids)
            outputs.append(output)
            step = {
                "event_id": env_event_id(rid, aid, "TOOL_RESULT", i),
                "rollout_id": rid,
                "attempt_id": aid,
                "event_index": i,
                "kind": "TOOL_RESULT",
                "call_id": call["call_id"],
                "name": "calculator",
                "payload_json": '{"result": 4}',
                "created_at_us": t0 + 1000 * (i + 1) + 500,
                "subject": None,
                "sealed": None,
            }
            out.events.append(("EnvStep", step))
            envs.append(step)
            prev_id, prev_seq = call["call_id"], np.concatenate([prompt_ids, output])
        finish = {
            "event_id": env_event_id(rid, aid, "finish", 0),
            "rollout_id": rid,
            "attempt_id": aid,
            "status": "SUCCESS",
            "call_count": len(calls),
            "event_count": len(envs),
            "final_artifacts_json": '{"answer": "4"}',
            "created_at_us": t0 + 1000 * (spec.turns + 2),
            "subject": None,
            "sealed": None,
        }
        out.events.append(("AttemptFinished", finish))
        rollout = _rollout(start, finish, calls, envs, prompts, outputs)
        out.events.append(("CompletedRollout", rollout))
        rollouts.append({"record": rollout, "prompts": prompts, "outputs": outputs, "calls": calls})
    t_group = t0 + 1000 * (spec.turns + 3)
    group = {
        "event_id": event_id("group", gid, "FULL"),
        "group_id": gid,
        "group_key_json": orjson.dumps({"task": f"task-{spec.group_index}"}).decode(),
        "status": "FULL",
        "expected_size": spec.rollouts,
        "rollout_ids": list(out.rollout_ids),
        "rollout_event_ids": [r["record"]["event_id"] for r in rollouts],
        "created_at_us": t_group,
    }
    out.events.append(("RolloutGroup", group))
    reward_cfg, credit_cfg = content_hash(REWARD_CONFIG), content_hash(CREDIT_CONFIG)
    correct = [float(rng.random() < 0.5) for _ in rollouts]
    mean = float(np.mean(correct))
    std = float(np.std(correct)) or 1.0
    for r, info in enumerate(rollouts):
        rec = info["record"]
        rid = rec["rollout_id"]
        score = {
            "event_id": event_id("score", rec["event_id"], "answer_match", "1"),
            "rollout_id": rid,
            "rollout_event_id": rec["event_id"],
            "group_id": gid,
            "verifier_name": "answer_match",
            "verifier_version": "1",
            "scope": "ROLLOUT",
            "status": "OK",
            "raw_json": orjson.dumps({"correct": bool(correct[r])}).decode(),
            "error": None,
            "duration_ms": 0.5,
            "created_at_us": t_group + 10,
        }
        reward = {
            "event_id": event_id("reward", score["event_id"], reward_cfg),
            "rollout_id": rid,
            "group_id": gid,
            "reward_config_id": reward_cfg,
            "score_ids": [score["event_id"]],
            "raw_reward": correct[r],
            "reward": (correct[r] - mean) / std,
            "components_json": "{}",
            "filtered": False,
            "filter_reason": None,
            "created_at_us": t_group + 20,
        }
        sampled = sum(len(o) for o in info["outputs"])
        credit = {
            "event_id": event_id("credit", reward["event_id"], credit_cfg),
            "rollout_id": rid,
            "group_id": gid,
            "reward_id": reward["event_id"],
            "credit_config_id": credit_cfg,
            "level": "ROLLOUT",
            "rollout_advantage": reward["reward"],
            "call_ids": [c["call_id"] for c in info["calls"]],
            "call_advantages": pack_floats([reward["reward"]] * len(info["calls"])),
            "rollout_weight": 1.0,
            "sampled_tokens": sampled,
            "created_at_us": t_group + 30,
        }
        out.events += [("Score", score), ("Reward", reward), ("Credit", credit)]
        info.update(score=score, reward=reward, credit=credit)
    samples = [_call_sample(info, i, SAMPLE_CONFIG) for info in rollouts for i in range(len(info["calls"]))]
    if spec.pack:
        for j in range(0, len(rollouts), 2):
            parts = [
                _call_sample(info, i, PACK_CONFIG) for info in rollouts[j : j + 2] for i in range(len(info["calls"]))
            ]
            samples.append(pack_samples(parts, PACK_CONFIG))
    for s in samples:
        s["created_at_us"] = t_group + 40
        out.events.append(("Sample", s))
        out.sample_ids.append(s["event_id"])
    if spec.trainer_step:
        step = {
            "event_id": event_id("step", "synthetic-run", spec.group_index),
            "run_id": "synthetic-run",
            "step": spec.group_index,
            "policy_version_before": spec.policy_version,
            "policy_version_after": spec.policy_version + 1,
            "sample_ids": list(out.sample_ids),
            "tokens": sum(len(s["input_ids"]) // 4 for s in samples),
            "loss": 0.1,
            "mean_ratio": 1.0,
            "clip_fraction": 0.0,
            "mean_advantage": 0.0,
            "filtered_json": "{}",
            "created_at_us": t_group + 50,
        }
        out.events.append(("TrainerStep", step))
    return out


def _rollout(
    start: Record,
    finish: Record,
    calls: list[Record],
    envs: list[Record],
    prompts: list[np.ndarray],
    outputs: list[np.ndarray],
) -> Record:
    rid, aid = start["rollout_id"], start["attempt_id"]
    links = []
    for i in range(len(calls) - 1):
        expected = len(prompts[i]) + len(outputs[i])
        seq = np.concatenate([prompts[i], outputs[i]])
        nxt = prompts[i + 1]
        n = min(len(seq), len(nxt))
        diff = np.flatnonzero(seq[:n] != nxt[:n])
        shared = int(diff[0]) if diff.size else n
        links.append(
            {
                "from_call_index": i,
                "to_call_index": i + 1,
                "is_prefix": shared == expected,
                "common_prefix_len": shared,
                "expected_len": expected,
            }
        )
    rcalls = [
        {
            "call_id": c["call_id"],
            "call_index": c["call_index"],
            "status": c["status"],
            "policy_version": c["versions"]["policy_version"],
            "prompt": c["prompt"],
            "output_ids": c["output_ids"],
            "output_logprobs": c["output_logprobs"],
            "logprob_kind": c["logprob_kind"],
            "finish_reason": c["finish_reason"],
            "tokenizer_fingerprint": c["versions"]["tokenizer_fingerprint"],
            "chat_template_fingerprint": c["versions"]["chat_template_fingerprint"],
            "scripted": c["scripted"],
            "version_spans": c["version_spans"],
            "parse_failures": None,  # synthetic: no parser ran (as rollouts assembled before the field read)
        }
        for c in calls
    ]
    renvs = [{k: e[k] for k in ("event_id", "event_index", "kind", "call_id", "name", "payload_json")} for e in envs]
    return {
        "event_id": event_id("rollout", rid, aid),
        "rollout_id": rid,
        "attempt_id": aid,
        "status": "COMPLETE",
        "missing": [],
        "counted": True,
        "attempt_number": 1,
        "group_id": start["group_id"],
        "group_key": start["group_key"],
        "expected_group_size": start["expected_group_size"],
        "task_input_json": start["task_input_json"],
        "metadata_json": "{}",
        "finish_status": finish["status"],
        "final_artifacts_json": finish["final_artifacts_json"],
        "final_output_text": "4",
        "calls": rcalls,
        "env_events": renvs,
        "prefix_links": links,
        "policy_versions": sorted({c["policy_version"] for c in rcalls}),
        "call_ids": [c["call_id"] for c in calls],
        "env_event_ids": [start["event_id"]] + [e["event_id"] for e in envs] + [finish["event_id"]],
        "created_at_us": finish["created_at_us"],
        "subject": None,
        "sealed": None,
    }


def _call_sample(info: dict, i: int, config: dict) -> Record:
    call, prompt, output = info["calls"][i], info["prompts"][i], info["outputs"][i]
    credit, reward, score = info["credit"], info["reward"], info["score"]
    cfg = content_hash(config)
    sequence = SequenceSpec(rollout_id=call["rollout_id"], prompt_ids=prompt, output_ids=output,
                            output_logprobs=np.frombuffer(call["output_logprobs"], "<f4"),
                            advantage=float(np.float32(credit["rollout_advantage"])),
                            weight=float(np.float32(credit["rollout_weight"] / credit["sampled_tokens"])),
                            group_id=credit["group_id"], call_id=call["call_id"], call_index=i)
    return sample_record([sequence], call["versions"]["policy_version"], cfg, created_at_us=0,
                         event_id_=event_id("sample", cfg, call["call_id"]), score_ids=[score["event_id"]],
                         reward_ids=[reward["event_id"]], credit_ids=[credit["event_id"]],
                         version_spans=[])  # every loss token from policy_version_first


def pack_samples(parts: list[Record], config: dict) -> Record:
    """Concatenate samples into one PACKED sequence; weights and segments move with their tokens."""

    def cat(field: str) -> bytes:
        return b"".join(p[field] for p in parts)

    starts, segments, offset = [], [], 0
    for p in parts:
        starts.append(offset)
        for seg in p["segments"]:
            segments.append({**seg, "sample_start": seg["sample_start"] + offset})
        offset += len(p["input_ids"]) // 4

    def union(field: str) -> list[str]:
        return list(dict.fromkeys(x for p in parts for x in p[field]))

    return {
        "event_id": event_id("packed", content_hash(config), [p["event_id"] for p in parts]),
        "kind": "PACKED",
        "sample_config_id": content_hash(config),
        "rollout_ids": union("rollout_ids"),
        "group_ids": union("group_ids"),
        "score_ids": union("score_ids"),
        "reward_ids": union("reward_ids"),
        "credit_ids": union("credit_ids"),
        "policy_version_first": min(p["policy_version_first"] for p in parts),
        "policy_version_last": max(p["policy_version_last"] for p in parts),
        "input_ids": cat("input_ids"),
        "loss_mask": cat("loss_mask"),
        "rollout_logprobs": cat("rollout_logprobs"),
        "advantages": cat("advantages"),
        "weights": cat("weights"),
        "sequence_starts": pack_int32(starts),
        "segments": segments,
        "version_spans": [],  # every loss token from policy_version_first
        "created_at_us": 0,
        "subject": None,
        "sealed": None,
    }
