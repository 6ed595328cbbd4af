"""`tokentrail trace SAMPLE_ID [POSITION]`: the provenance chain of a trained token, for a person.

trainer step <- sample <- call <- prompt <- rollout <- group <- score <- reward <- credit.
``trace_sample`` returns the chain as plain data (also printed as JSON); ``format_trace`` renders it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from schemas.prompt_delta import PromptReconstructionError
from schemas.tokens import unpack_floats, unpack_ids, unpack_int32, unpack_mask
from sinks.store import CallTokenCache, rows_by_ids, select_rows

CONTEXT_TOKENS = 8  # prompt ids shown before a traced token


class TraceError(LookupError):
    """The sample (or position) to trace does not exist."""


def trace_sample(client: Client, sample_id: str, position: int | None = None) -> dict[str, Any]:
    rows = select_rows(client, "samples", "event_id = {id:String}", {"id": sample_id})
    if not rows:
        raise TraceError(f"no sample with id {sample_id}")
    sample = rows[0]
    ids = unpack_ids(sample["input_ids"])
    mask = unpack_mask(sample["loss_mask"])
    out: dict[str, Any] = {
        "sample": {
            "id": sample_id,
            "kind": sample["kind"],
            "sample_config_id": sample["sample_config_id"],
            "tokens": len(ids),
            "loss_tokens": int(mask.sum()),
            "sequences": len(unpack_int32(sample["sequence_starts"])) or 1,
            "policy_versions": [sample["policy_version_first"], sample["policy_version_last"]],
            "weight_total": sample["weight_total"],
            "subject": sample.get("subject"),
            # The forget request that erased its content (issue 31); None: its content is there.
            "forgotten_by_request": _forget_request(client, sample.get("subject")),
        },
        "trainer_steps": [
            {
                "run_id": r["run_id"],
                "step": r["step"],
                "policy_version_before": r["policy_version_before"],
                "policy_version_after": r["policy_version_after"],
                "loss": r["loss"],
            }
            for r in select_rows(
                client,
                "trainer_steps",
                "has(sample_ids, {id:String})",
                {"id": sample_id},
                columns="run_id, step, policy_version_before, policy_version_after, loss",
                order_by="run_id, step",
            )
        ],
    }
    segments = [
        {
            k: sample[f"seg_{k}"][i]
            for k in (
                "rollout_id",
                "call_id",
                "call_index",
                "source",
                "sample_start",
                "call_start",
                "length",
                "weight",
            )
        }
        for i in range(len(sample["seg_call_id"]))
    ]
    cache = CallTokenCache(client)
    cache.fetch(s["call_id"] for s in segments)
    if position is not None:
        if not 0 <= position < len(ids):
            raise TraceError(f"position {position} is outside sample {sample_id} ({len(ids)} tokens)")
        seg = next((s for s in segments if s["sample_start"] <= position < s["sample_start"] + s["length"]), None)
        token: dict[str, Any] = {
            "position": position,
            "token_id": int(ids[position]),
            "in_loss": bool(mask[position]),
            "weight": float(unpack_floats(sample["weights"])[position]),
            "advantage": float(unpack_floats(sample["advantages"])[position]),
            "rollout_logprob": float(unpack_floats(sample["rollout_logprobs"])[position]),
        }
        if seg is None:
            token["segment"] = None
        else:
            offset = seg["call_start"] + position - seg["sample_start"]
            token["segment"] = seg
            token["call_offset"] = offset
            token.update(_token_in_call(cache, seg, offset, int(ids[position])))
        out["token"] = token
        call_ids = [seg["call_id"]] if seg else []
        rollout_ids = [seg["rollout_id"]] if seg else []
    else:
        out["segments"] = segments
        call_ids = list(dict.fromkeys(s["call_id"] for s in segments))
        rollout_ids = list(dict.fromkeys(s["rollout_id"] for s in segments)) or list(sample["rollout_ids"])
    out["calls"] = [_call_summary(client, cache, c) for c in call_ids]
    out["rollouts"] = [_rollout_summary(client, r) for r in rollout_ids]
    wanted = set(rollout_ids)
    out["scores"] = [
        _pick(r, "event_id", "rollout_id", "verifier_name", "verifier_version", "status", "raw_json")
        for r in rows_by_ids(client, "scores", sample["score_ids"])
        if r["rollout_id"] in wanted
    ]
    out["rewards"] = [
        _pick(r, "event_id", "rollout_id", "reward_config_id", "score_ids", "raw_reward", "reward", "filtered")
        for r in rows_by_ids(client, "rewards", sample["reward_ids"])
        if r["rollout_id"] in wanted
    ]
    out["credits"] = [
        _pick(
            r,
            "event_id",
            "rollout_id",
            "reward_id",
            "credit_config_id",
            "level",
            "rollout_advantage",
            "rollout_weight",
            "sampled_tokens",
        )
        for r in rows_by_ids(client, "credits", sample["credit_ids"])
        if r["rollout_id"] in wanted
    ]
    return out


def _token_in_call(cache: CallTokenCache, seg: dict[str, Any], offset: int, token_id: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not cache.has(seg["call_id"]):
        return {"problem": f"call {seg['call_id']} is not stored"}
    try:
        prompt = cache.prompt(seg["call_id"])
    except PromptReconstructionError as exc:
        return {"problem": str(exc)}
    if seg["source"] == "OUTPUT":
        output = cache.output_ids(seg["call_id"])
        out["call_token_id"] = int(output[offset]) if offset < len(output) else None
        out["conditioning_prefix_len"] = len(prompt) + offset
        before = np.concatenate([prompt, output[:offset]])[-CONTEXT_TOKENS:]
    else:
        out["call_token_id"] = int(prompt[offset]) if offset < len(prompt) else None
        out["conditioning_prefix_len"] = offset
        before = prompt[max(0, offset - CONTEXT_TOKENS) : offset]
    out["matches_call"] = out["call_token_id"] == token_id
    out["preceding_ids"] = [int(x) for x in before]
    return out


def _call_summary(client: Client, cache: CallTokenCache, call_id: str) -> dict[str, Any]:
    rows = select_rows(
        client,
        "calls",
        "call_id = {id:String}",
        {"id": call_id},
        columns="call_id, rollout_id, attempt_id, call_index, status, model, policy_version, protocol, "
        "tokenizer_fingerprint, chat_template_fingerprint, logprob_kind, finish_reason, "
        "prompt_length, prompt_sha256, prompt_base_call_id, prompt_base_prefix_len, "
        "output_tokens, prefix_mode, JSONLength(sampling_extra_json, 'parse_errors') AS parse_errors",
    )
    if not rows:
        return {"call_id": call_id, "problem": "not stored"}
    row = dict(rows[0])
    chain, current = [], row["prompt_base_call_id"]
    while current and current not in chain:
        chain.append(current)
        current = (cache.rows.get(current) or {}).get("prompt_base_call_id")
    row["prompt_delta_chain"] = chain
    try:
        cache.prompt(call_id)
        row["prompt_verified"] = True
    except (PromptReconstructionError, KeyError) as exc:
        row["prompt_verified"] = False
        row["prompt_problem"] = str(exc)
    return row


def _rollout_summary(client: Client, rollout_id: str) -> dict[str, Any]:
    rows = select_rows(
        client,
        "rollouts",
        "rollout_id = {id:String}",
        {"id": rollout_id},
        columns="event_id, rollout_id, attempt_id, attempt_number, status, counted, group_id, "
        "policy_versions, finish_status, length(call_ids) AS calls, "
        "length(env_event_ids) AS env_events, task_input_json, "
        # Calls whose output the family's parser could not parse (issue 28; 0 on rows stored before 0019).
        "arrayCount(x -> ifNull(x, 0) > 0, c_parse_failures) AS parse_failed_calls",
        order_by="attempt_number",
    )
    groups = select_rows(
        client,
        "groups",
        "has(rollout_ids, {id:String})",
        {"id": rollout_id},
        columns="group_id, status, expected_size, length(rollout_ids) AS size, group_key_json",
    )
    return {
        "rollout_id": rollout_id,
        "attempts": [dict(r) for r in rows],
        "groups": [dict(g) for g in groups],
    }


def _pick(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: (list(row[k]) if isinstance(row[k], tuple) else row[k]) for k in keys}


def _forget_request(client: Client, subject: str | None) -> str | None:
    if not subject:
        return None
    rows = client.query("SELECT argMax(request_id, created_at_us) FROM forgotten FINAL WHERE subject = {s:String} "
                        "HAVING count() > 0", parameters={"s": subject}).result_rows
    return str(rows[0][0]) if rows else None


def format_trace(trace: dict[str, Any]) -> str:
    s = trace["sample"]
    lines = [
        f"sample {s['id']}  ({s['kind']}, config {s['sample_config_id']}, {s['tokens']} tokens, "
        f"{s['loss_tokens']} in loss, policy v{s['policy_versions'][0]}..v{s['policy_versions'][1]})"
    ]
    if s.get("forgotten_by_request"):
        lines.append(f"  FORGOTTEN   its subject's content was erased by request {s['forgotten_by_request']}: "
                     "token ids and texts below are blanks; ids, lengths, weights and lineage are kept")
    for t in trace["trainer_steps"]:
        lines.append(
            f"  trained in  run {t['run_id']} step {t['step']} (policy v{t['policy_version_before']} -> "
            f"v{t['policy_version_after']}, loss {t['loss']:.4g})"
        )
    if not trace["trainer_steps"]:
        lines.append("  trained in  (no trainer step names this sample yet)")
    if "token" in trace:
        t = trace["token"]
        lines.append(
            f"  token       position {t['position']}: id {t['token_id']}, in loss: {t['in_loss']}, "
            f"weight {t['weight']:.4g}, advantage {t['advantage']:.4g}, "
            f"rollout logprob {t['rollout_logprob']:.4g}"
        )
        seg = t.get("segment")
        if seg is None:
            lines.append("              NOT COVERED by any segment: no call is known to have produced it")
        else:
            lines.append(
                f"              from call {seg['call_id']} (#{seg['call_index']}) {seg['source']} "
                f"offset {t['call_offset']}; call has id {t.get('call_token_id')} "
                f"-> {'match' if t.get('matches_call') else 'MISMATCH'}"
            )
            if "problem" in t:
                lines.append(f"              PROBLEM: {t['problem']}")
            else:
                lines.append(
                    f"              conditioned on {t['conditioning_prefix_len']} tokens, ending "
                    f"... {t['preceding_ids']}"
                )
    for seg in trace.get("segments", []):
        lines.append(
            f"  segment     sample[{seg['sample_start']}:{seg['sample_start'] + seg['length']}] <- call "
            f"{seg['call_id']} #{seg['call_index']} {seg['source']}[{seg['call_start']}:"
            f"{seg['call_start'] + seg['length']}] weight {seg['weight']:.4g}"
        )
    for c in trace["calls"]:
        if "problem" in c:
            lines.append(f"  call        {c['call_id']}: {c['problem']}")
            continue
        delta = (
            f"delta on {c['prompt_base_call_id']} (+{c['prompt_length'] - c['prompt_base_prefix_len']} new), "
            f"chain {' <- '.join(c['prompt_delta_chain'])}"
            if c["prompt_base_call_id"]
            else "stored in full"
        )
        lines.append(
            f"  call        {c['call_id']}: #{c['call_index']} {c['protocol']} {c['status']} "
            f"model {c['model']} "
            f"policy v{c['policy_version']}, {c['output_tokens']} sampled ({c['logprob_kind']} logprobs)"
        )
        if c.get("parse_errors"):  # its tokens trained only because the credit's parse_failures policy kept them
            lines.append(f"  PARSE FAILED {c['parse_errors']} parser error(s) on this call's output (answered as "
                         "content; the credit config's parse_failures policy decides whether it trains)")
        lines.append(
            f"  prompt      {c['prompt_length']} tokens sha256 {c['prompt_sha256'][:16]}..., {delta}; "
            f"{'verified' if c['prompt_verified'] else 'NOT VERIFIED: ' + c.get('prompt_problem', '')}"
        )
    for r in trace["rollouts"]:
        for a in r["attempts"]:
            lines.append(
                f"  rollout     {r['rollout_id']} attempt {a['attempt_id']} #{a['attempt_number']}: "
                f"{a['status']}{'' if a['counted'] else ' (not counted)'}, {a['calls']} calls, "
                f"{a['env_events']} env events, policy {list(a['policy_versions'])}, "
                f"finish {a['finish_status']}"
                + (f", {a['parse_failed_calls']} call(s) failed to parse" if a.get("parse_failed_calls") else "")
            )
        for g in r["groups"]:
            lines.append(
                f"  group       {g['group_id']}: {g['status']} {g['size']}/{g['expected_size']} "
                f"key {g['group_key_json']}"
            )
        if not r["groups"]:
            lines.append("  group       NONE contains this rollout")
    for sc in trace["scores"]:
        lines.append(
            f"  score       {sc['event_id']}: {sc['verifier_name']}@{sc['verifier_version']} {sc['status']} "
            f"raw {sc['raw_json']}"
        )
    for w in trace["rewards"]:
        lines.append(
            f"  reward      {w['event_id']}: config {w['reward_config_id']} raw {w['raw_reward']:.4g} -> "
            f"{w['reward']:.4g}{' (filtered)' if w['filtered'] else ''} from scores {w['score_ids']}"
        )
    for c in trace["credits"]:
        lines.append(
            f"  credit      {c['event_id']}: config {c['credit_config_id']} {c['level']} advantage "
            f"{c['rollout_advantage']:.4g}, rollout weight {c['rollout_weight']:.4g} over "
            f"{c['sampled_tokens']} tokens"
        )
    return "\n".join(lines)
