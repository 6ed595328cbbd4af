"""Fault: one trainer rank killed -9 mid-step under ``torchrun --max-restarts``.

A 2-rank trainer (``torchrun -m trainer_consumer``, gloo) trains a small model on a fresh samples topic.
Once the TrainerStep of step ``kill_after_step`` is on the broker, rank 1 is killed with SIGKILL about
half a step later (so inside the next step: rank 1 only ever steps or waits for its next share, and the
wait is a few milliseconds). torchrun stops the group and restarts it; the ranks resume from the last
published policy and the committed offsets, and drain the topic. Then, from the TrainerStep events and
the sample ids each step recorded: no sample trained twice, none lost, every offset committed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from reliability.results import FaultResult
from schemas.codec import get_codec
from schemas.kafka import config as kafka_config
from testkit.samples import random_sample_records
from tokentrail.runtime.process import descendants
from trainer_consumer.rank_launch import torchrun_command, torchrun_env
from trainer_consumer.rank_options import options_to_json
from trainer_consumer.step_audit import exactly_once
from trainer_consumer.trainer import TrainOptions

VOCAB = 512


def _small_model(path: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # Big enough that a step (forward/backward) is most of a rank's time, so the kill lands inside one.
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=1024,
                         tie_word_embeddings=False, dtype="float32")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)




def _rank_pid(torchrun_pid: int, rank: int) -> int | None:
    for pid in descendants(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID=" in b"\0".join(env):
            return pid
    return None


def rank_kill_fault(settings: Any, work_dir: Path, progress: Callable[[str], None] = lambda _: None,
                    samples: int = 32, batch_size: int = 8, kill_after_step: int = 2, ranks: int = 2,
                    timeout_s: float = 600.0) -> FaultResult:
    started = time.monotonic()
    admin = AdminClient(kafka_config.admin_config(settings.kafka))
    stem = f"tokentrail.reliability.rank-kill.{uuid.uuid4().hex[:8]}"
    samples_topic, steps_topic, dead_topic = f"{stem}.samples", f"{stem}.steps", f"{stem}.dead"
    for future in admin.create_topics([NewTopic(samples_topic, 3, replication_factor=-1),
                                       NewTopic(steps_topic, 1, replication_factor=-1),
                                       NewTopic(dead_topic, 1, replication_factor=-1)]).values():
        future.result(timeout=60)
    proc: subprocess.Popen[bytes] | None = None
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        _small_model(work_dir / "model")
        import numpy as np

        records = random_sample_records(samples, np.random.default_rng(11), VOCAB, (128, 256), (64, 128))
        codec = get_codec()
        producer = Producer(kafka_config.producer_config(settings.kafka))
        for r in records:
            producer.produce(samples_topic, key=r["event_id"].encode(), value=codec.encode("Sample", r))
        if producer.flush(30):
            raise RuntimeError("samples not delivered")
        group_id = f"{stem}.trainer"
        options = TrainOptions(until_idle=True, idle_timeout_s=5.0, batch_size=batch_size, group_id=group_id,
                               run_id=group_id, model_dir=work_dir / "model", checkpoint_dir=work_dir / "policies",
                               samples_topic=samples_topic, steps_topic=steps_topic, dead_letter_topic=dead_topic,
                               torch_threads=1)
        (work_dir / "options.json").write_bytes(options_to_json(options))
        log = (work_dir / "torchrun.log").open("wb")
        proc = subprocess.Popen(torchrun_command(ranks, max_restarts=1), env=torchrun_env(work_dir / "options.json"),
                                stdout=log, stderr=subprocess.STDOUT)
        progress(f"rank kill: torchrun pid {proc.pid}, {ranks} ranks, {samples} samples in steps of {batch_size}")

        watcher = Consumer(kafka_config.consumer_config(settings.kafka, f"{stem}.watch"))
        watcher.assign([TopicPartition(steps_topic, 0, OFFSET_BEGINNING)])
        events: list[dict[str, Any]] = []
        killed = ""
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                for msg in watcher.consume(num_messages=50, timeout=0.05):
                    if msg.error() is None:
                        events.append(codec.decode(msg.value(), expect="TrainerStep")[1])
                if not killed and any(e["step"] >= kill_after_step and e["sample_ids"] for e in events):
                    step_s = max(e["created_at_us"] for e in events) - min(e["created_at_us"] for e in events)
                    step_s = step_s / 1e6 / max(1, len(events) - 1)
                    pid = _rank_pid(proc.pid, 1)
                    if pid is None:
                        raise RuntimeError("rank 1's process not found under torchrun")
                    time.sleep(step_s / 2)  # into the next step
                    os.kill(pid, signal.SIGKILL)
                    killed = f"rank 1 (pid {pid}) killed -9 {step_s / 2 * 1e3:.0f} ms after step {kill_after_step}"
                    progress(f"rank kill: {killed} (a step takes ~{step_s * 1e3:.0f} ms)")
            if proc.poll() is None:
                proc.kill()
                raise RuntimeError(f"torchrun still running after {timeout_s:.0f} s")
            time.sleep(1.0)
            for msg in watcher.consume(num_messages=500, timeout=2.0):
                if msg.error() is None:
                    events.append(codec.decode(msg.value(), expect="TrainerStep")[1])
            parts = [TopicPartition(samples_topic, p) for p in range(3)]
            reader = Consumer(kafka_config.consumer_config(settings.kafka, group_id))
            try:
                committed = {tp.partition: tp.offset for tp in reader.committed(parts, timeout=10)}
            finally:
                reader.close()
            ends = {p.partition: watcher.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        finally:
            watcher.close()
        text = (work_dir / "torchrun.log").read_text(errors="replace")
        restarts = text.count("rank 0: torchrun restart")
        audit = exactly_once(events, [r["event_id"] for r in records])
        all_committed = all(committed[p] == ends[p] or (ends[p] == 0 and committed[p] < 0) for p in ends)
        redelivered = len(events) - len({e["event_id"] for e in events})
        passed = (proc.returncode == 0 and bool(killed) and restarts >= 1 and audit.ok and all_committed
                  and audit.samples_trained == samples)
        detail = (f"{killed}; torchrun restarts {restarts}, exit {proc.returncode}; {audit.steps} steps on "
                  f"{max(audit.ranks, default=0)} ranks trained {audit.samples_trained}/{samples} samples "
                  f"(per rank {dict(audit.rank_samples)}), twice {len(audit.trained_twice)}, "
                  f"lost {audit.samples_lost}; "
                  f"offsets committed to the end: {all_committed}; re-emitted step events {redelivered}")
        if not passed:  # the log is in work_dir, which a caller may not keep: its tail goes with the result
            detail += "\n" + "\n".join(line for line in text.splitlines() if "Loading weights" not in line)[-3000:]
        progress(f"rank kill: {detail}")
        return FaultResult(name="rank", tried=f"kill -9 one of {ranks} trainer ranks mid-step under torchrun "
                                               "--max-restarts 1", lost=audit.samples_lost,
                           duplicated=len(audit.trained_twice), passed=passed, detail=detail,
                           redelivered=redelivered, seconds=time.monotonic() - started)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        for future in admin.delete_topics([samples_topic, steps_topic, dead_topic]).values():
            try:
                future.result(timeout=60)
            except Exception:  # cleanup only: a topic already gone is fine
                pass
