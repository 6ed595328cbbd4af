"""Forgetting end to end (issue 31) with the real broker, the real gateway (embedded engine), the real sink
into chDB and the trainer's sample stream: two users' rollouts go through the gateway with forgetting on,
one user is forgotten through the admin route, then nothing of hers is readable on any topic, in the
spool or in ClickHouse, none of her samples reaches a training step, the audit passes and says which
request forgot her, and the other user's content is all still there."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from confluent_kafka import Producer

from processors.assembler import RolloutAssembly
from processors.credit import CreditConfig, compute_credits
from processors.rewards import RewardConfig, compute_rewards
from processors.samples import SampleConfig, build_samples
from producers.gateway.text_side import ModelTextSide
from schemas.codec import get_codec
from schemas.kafka import config as kafka_config
from schemas.kafka.key_store import ForgetSettings, KafkaKeyStore
from schemas.kafka.residue import TopicSelection
from schemas.residue import Needles, canary_token_run
from schemas.subject_names import SubjectNames
from sinks.audit import run_audit
from sinks.sink import SinkOptions, run_sink
from sinks.store import load_records, write_records
from sinks.trace import trace_sample
from testkit.gateway import running_embedded_gateway
from testkit.kafka_read import first_records
from testkit.stages import constant_scores, full_group
from tests.sinks.conftest import ch, chdb_dsn, migrated_template  # noqa: F401  (the chDB fixtures)
from tokentrail.residue_scan import ScanTargets, scan_residue
from tokentrail.settings import Settings
from trainer_consumer.batching import BatchBuilder
from trainer_consumer.dataset import FORGOTTEN, SampleStream

pytestmark = pytest.mark.e2e

MODEL = "tokentrail-tiny"
REWARD = RewardConfig(metrics=[{"name": "m", "verifier": "v"}], normalize={"method": "none"},
                      filters={"zero_variance": False})


def _rollout_through_gateway(gw_url: str, subject: str, canary: str) -> str:
    started = httpx.post(f"{gw_url}/v1/rollouts", json={"subject": subject, "task_input": {"note": canary}},
                         timeout=60).json()
    client = openai.OpenAI(base_url=started["openai_base_url"], api_key="x", max_retries=0)
    messages = [{"role": "user", "content": f"My account code is {canary} please remember it."}]
    for _turn in range(2):
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                     {"role": "user", "content": f"Again: {canary}."}]
    base = f"{gw_url}/v1/rollouts/{started['rollout_id']}/attempts/{started['attempt_id']}"
    assert httpx.post(f"{base}/events", json={"kind": "TOOL_RESULT", "payload": {"echo": canary}},
                      timeout=60).status_code == 201
    assert httpx.post(f"{base}/finish", json={"final_artifacts": {"answer": canary}}, timeout=60).status_code == 200
    return str(started["rollout_id"])


def test_a_forgotten_user_is_unreadable_everywhere_and_never_trained(
    tokentrail_settings: Settings, forget_settings: ForgetSettings, sealing: KafkaKeyStore, new_topic,
    model_dir: Path, ch, tmp_path: Path,  # noqa: F811
) -> None:
    settings = tokentrail_settings.model_copy(update={"forget": forget_settings})
    kafka = settings.kafka
    topics = {"calls_topic": new_topic(2), "env_topic": new_topic(2)}
    samples_topic, dead_topic = new_topic(1), new_topic(1)
    text = ModelTextSide.from_dir(model_dir)
    canaries = {s: f"zq{s}{uuid.uuid4().hex[:10]}canary" for s in ("alice", "bob")}
    spool = tmp_path / "spool"
    names = SubjectNames(forget_settings.master())
    alice, bob = names.stored("tenant-1/alice"), names.stored("tenant-1/bob")

    with running_embedded_gateway(settings, spool_dir=spool, topics=topics, text=text) as gw:
        rollout_ids = {s: _rollout_through_gateway(gw.url, f"tenant-1/{s}", c) for s, c in canaries.items()}
        # The stages: the rollouts assembled from the records on Kafka (opened with the keys), then samples.
        records = first_records(kafka, topics["env_topic"], 6, timeout_s=60) + \
            first_records(kafka, topics["calls_topic"], 4, timeout_s=60)
        rollouts = []
        for rid in rollout_ids.values():
            assembly = RolloutAssembly(rid)
            rollouts += [out for name, rec in records if rec["rollout_id"] == rid
                         for out in assembly.accept(name, rec).rollouts]
        assert [r["status"] for r in rollouts] == ["COMPLETE", "COMPLETE"]
        group = full_group(rollouts)
        rewards = compute_rewards(group, rollouts, constant_scores(group, rollouts, [1.0, 0.0]), REWARD)
        credits = compute_credits(rollouts, rewards, CreditConfig())
        samples = build_samples(group, rollouts, rewards, credits, CreditConfig(), SampleConfig())
        # The stages' other events straight into ClickHouse (the sink's part is the topics below); in the
        # clear, as a sink stores what it opens, before the forget reaches the sink and blanks alice.
        scores = constant_scores(group, rollouts, [1.0, 0.0])
        write_records(ch, [("CompletedRollout", r) for r in rollouts] + [("RolloutGroup", group)]
                      + [("Score", r) for r in scores] + [("Reward", r) for r in rewards]
                      + [("Credit", r) for r in credits])
        producer = Producer(kafka_config.producer_config(kafka))
        for sample in samples:
            producer.produce(samples_topic, key=sample["rollout_ids"][0].encode(),
                             value=get_codec().encode("Sample", sample))
        assert producer.flush(30) == 0

        forgot = httpx.post(f"{gw.url}/v1/admin/forget", json={"subject": "tenant-1/alice", "requested_by": "dpo"},
                            timeout=60)
        assert forgot.status_code == 200, forgot.text
        request_id = forgot.json()["request_id"]
        # Forgotten by the name: the pseudonym its records carry (no user id on any record; no record under
        # the name itself, so no second event naming it).
        assert forgot.json()["subject"] == alice and forgot.json()["also_forgotten"] == []
        assert len(forgot.json()["key_ids"]) == 1 and forgot.json()["key_ids"][0].startswith(alice + "#")

    # The sink stores every topic (opening what it still may) and blanks alice on her Forgotten event. The
    # order that once broke the trace (CI): the Forgotten event stored first, alice's calls and samples in a
    # later batch, unreadable; they must be blanked like the rest, not kept with their content's hashes.
    forgotten_map = {forget_settings.forgotten_topic: ("Forgotten",)}
    content_map = {topics["calls_topic"]: ("CallRecord",),
                   topics["env_topic"]: ("AttemptStarted", "EnvStep", "AttemptFinished"),
                   samples_topic: ("Sample",)}
    for part in (forgotten_map, content_map):
        run_sink(ch, kafka, SinkOptions(group_id=f"t-sink-{uuid.uuid4().hex[:8]}", once=True, flush_interval_s=0.2),
                 topic_map=part, dead_letter_topic=dead_topic, log=lambda _line: None)

    # The trainer's stream: bob's samples only; alice's counted as forgotten.
    stream = SampleStream(kafka_config.consumer_config(kafka, f"t-train-{uuid.uuid4().hex[:8]}"), samples_topic,
                          BatchBuilder(batch_size=1000), current_version=lambda: 0)
    try:
        batch = stream.next_batch(idle_timeout_s=3.0, flush_partial=True)
    finally:
        stream.close()
    alice_samples = [s["event_id"] for s in samples if s["subject"] == alice]
    bob_samples = [s["event_id"] for s in samples if s["subject"] == bob]
    assert alice_samples and bob_samples and alice.startswith("tenant-1/subj:")
    assert not [r for _, r in records if r["subject"] not in (alice, bob)]  # every record: a pseudonym
    assert batch is not None and sorted(s.sample_id for s in batch.samples) == sorted(bob_samples)
    assert batch.filtered[FORGOTTEN] == len(alice_samples)

    # Nothing of alice is readable anywhere; bob's canary is (the scan can find what is there).
    targets = ScanTargets(topics=TopicSelection(names=(*topics.values(), samples_topic, dead_topic,
                                                       forget_settings.keys_topic, forget_settings.forgotten_topic)),
                          kafka_timeout_s=60, spool_dirs=(spool,), reports=())

    who = ("alice", "bob")  # needles [0]: alice's, [1]: bob's
    needles = Needles(tuple(canaries[w] for w in who),
                      tuple(canary_token_run(text.encode_text, canaries[w]) for w in who))
    tally = scan_residue(needles, targets, settings=settings, client=ch)
    assert tally.complete, tally.incomplete
    found = tally.by_needle()
    assert "canary[0]" not in found and "tokens[0]" not in found, tally.summary()  # nothing of alice
    assert found.get("canary[1]", 0) > 0 and found.get("tokens[1]", 0) > 0  # bob's is all there, so the scan sees

    results = {r.key: r for r in run_audit(ch)}
    assert all(r.passed for r in results.values()), {k: r.failures[:2] for k, r in results.items()}
    assert {f["request_id"] for f in results["token_traceability"].forgotten} == {request_id}
    assert trace_sample(ch, alice_samples[0])["sample"]["forgotten_by_request"] == request_id
    bob_calls = [c for c in load_records(ch, "calls") if c["subject"] == bob]
    assert len(bob_calls) == 2 and all(canaries["bob"] in c["request_json"] for c in bob_calls)
    assert np.all([c["request_json"] == "" for c in load_records(ch, "calls") if c["subject"] == alice])
