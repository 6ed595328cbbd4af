"""A call whose record is too large for Kafka: the harness is answered, the record is kept whole in the
quarantine folder, a stand-in says so on the calls topic, and the calls after it flow (issue 17)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import orjson

from models.reference.task import LOOKUP_TOOL, task_messages
from producers.sdk import Rollout
from schemas.codec import get_codec
from testkit.gateway import running_embedded_gateway
from tokentrail.settings import Settings

from .helpers import prompts_of, read_records

MODEL = "tokentrail-tiny"
LIMIT = 20_000  # Kafka's record limit for this gateway's publisher


def test_an_oversized_call_record_is_quarantined_and_the_next_calls_flow(
        kafka_bootstrap: str, tokentrail_settings: Settings, text_side, topics: dict[str, str],
        tmp_path: Path) -> None:
    settings = tokentrail_settings.model_copy(update={
        "kafka": tokentrail_settings.kafka.model_copy(update={"max_message_bytes": LIMIT})})
    # Within the model's context, but its record (request body + prompt ids + response) is over LIMIT.
    long_note = " ".join(f"note{i}" for i in range(800))
    big = [*task_messages("owl")[:-1], {"role": "user", "content": long_note}, task_messages("owl")[-1]]
    spool = tmp_path / "spool"
    with (running_embedded_gateway(settings, spool_dir=spool, topics=topics, text=text_side) as gw,
          Rollout(gw.url, task_input={"key": "owl"}) as rollout):
        client = openai.OpenAI(base_url=rollout.openai_base_url, api_key=rollout.api_key, max_retries=0)
        answered = client.chat.completions.create(model=MODEL, messages=big, max_tokens=8, seed=1)
        small = task_messages("fox")
        first = client.chat.completions.create(model=MODEL, messages=small, tools=[LOOKUP_TOOL], max_tokens=8,
                                               seed=2)
        follow = [*small, {"role": "assistant", "content": first.choices[0].message.content or ""},
                  {"role": "user", "content": "again"}]
        client.chat.completions.create(model=MODEL, messages=follow, tools=[LOOKUP_TOOL], max_tokens=8, seed=3)
        health = httpx.get(f"{gw.url}/health").json()
        metrics = httpx.get(f"{gw.url}/metrics").text
    assert answered.choices[0].message is not None  # the harness got its answer
    assert health["sink"]["spool_depth"] == 0 and health["sink"]["quarantined"] == 1
    assert f'tokentrail_gateway_quarantined_records_total{{topic="{topics["calls_topic"]}"}} 1.0' in metrics

    records = read_records(tokentrail_settings, topics["calls_topic"], 3)
    calls = sorted((r for _, r in records), key=lambda r: r["call_index"])
    stand_in, after, last = calls
    assert stand_in["status"] == "ERROR" and stand_in["error"]["type"] == "record_quarantined"
    assert stand_in["prompt"]["length"] == 0 and stand_in["output_ids"] == b""
    kept = orjson.loads(stand_in["request_json"])["quarantined"]
    assert kept["status"] == "OK" and kept["bytes"] > LIMIT
    name, whole = get_codec().decode(Path(kept["path"]).read_bytes())
    assert name == "CallRecord" and whole["call_id"] == stand_in["call_id"] and whole["status"] == "OK"
    assert whole["prompt"]["length"] > 1000 and "note799" in whole["request_json"]
    assert after["status"] == last["status"] == "OK"
    # Nothing delta-encodes on the quarantined call: every prompt rebuilds from what Kafka holds.
    assert all(c["prompt"]["base_call_id"] != stand_in["call_id"] for c in calls)
    assert [len(p) for p in prompts_of(calls)][1:] == [after["prompt"]["length"], last["prompt"]["length"]]
