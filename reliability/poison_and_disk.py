"""Faults (j) and (k): one bad record, and a full disk, must never stop a gateway's delivery (issue 17).

* (j) poison record: a chat request of about 5 MB (under the gateway's 8 MiB body limit, the request
  issue 17 found), then a call whose record is over the broker's message limit, between good rollouts.
  The 5 MB request must be refused up front (its prompt is far over the model's context, so no record
  is made); the other record must be quarantined (kept whole in the spool's quarantine folder, a
  stand-in call record on Kafka). The good calls after each reach Kafka at once: the spool is empty
  again. The private broker's limit is the corpus's 24 KiB: a record the embedded model accepts stays
  far under the 16 MiB default, so only a lowered limit reaches the quarantine path.
* (k) disk-full spool: the gateway's spool lives on a size-limited tmpfs mounted by this scenario
  (needs root). With the broker stopped, rollouts are spooled; the disk is then filled, and calls made
  while it is full may be refused (never acknowledged and then lost); space comes back, the broker
  returns, the spool drains and the gateway takes calls as before.

Both run on one private broker (own ports and data dir; the shared one is never touched) and one
gateway process. Lost: an acknowledged record that is not on Kafka; duplicated: extra copies of one.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from reliability.bad_inputs.limits import CORPUS_MAX_RECORD_BYTES, LONG_FOR_THE_RECORD
from reliability.faults import Driver, GatewayProcess, Progress, free_port
from reliability.results import FaultResult
from reliability.side_by_side import start_gateway_beside
from schemas.ids import call_id
from testkit.kafka_read import create_topics, lost_and_duplicated, read_records
from tokentrail import kafka_local
from tokentrail.settings import KafkaSettings, Settings

POISON_NAME = "j. poison record: ~5 MB chat request, record over Kafka's limit"
DISK_NAME = "k. disk-full spool (size-limited tmpfs), broker down"
TOPICS = ["tokentrail.calls", "tokentrail.env"]
WHILE_FULL = 3  # rollouts tried while the disk is full


@dataclass(frozen=True)
class PoisonDiskSizes:
    rollouts_around: int  # good rollouts before and after the poison record, and after the full disk
    calls_per_rollout: int
    poison_bytes: int  # the poison request's message content
    disk_mb: int  # the tmpfs holding the spool (and its quarantine folder)


QUICK = PoisonDiskSizes(rollouts_around=2, calls_per_rollout=2, poison_bytes=5_000_000, disk_mb=64)
FULL = PoisonDiskSizes(rollouts_around=4, calls_per_rollout=3, poison_bytes=5_000_000, disk_mb=64)


# ------------------------------------------------------------------------------------ a small disk


def mount_tmpfs(mount: Path, size_mb: int) -> None:
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cannot mount a {size_mb} MiB tmpfs on {mount} (needs root): {done.stderr.strip()}")


def unmount(mount: Path) -> None:
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Write a filler file until the filesystem is full; delete it to give the space back."""
    filler = disk / f"filler-{uuid.uuid4().hex[:6]}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 20, 4096):  # big writes first, then the last partial pages
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


# ------------------------------------------------------------------------------------ helpers


def _sink(gateway: GatewayProcess) -> dict[str, Any]:
    return dict(gateway.health().get("sink", {}))


def poison_content(size: int) -> str:
    """Short distinct words: many tokens per byte, so the prompt ids outgrow the request itself."""
    words: list[str] = []
    total = i = 0
    while total < size:
        word = f"w{i % 9973} "
        words.append(word)
        total += len(word)
        i += 1
    return "".join(words)[:size]


def send_one_call(gateway: GatewayProcess, model: str, content: str, tag: str) -> tuple[int, str, dict[str, Any]]:
    """A rollout whose only call carries ``content``; (status, error code, the rollout's start info)."""
    with httpx.Client(base_url=gateway.url, timeout=600) as client:
        started = client.post("/v1/rollouts", json={"rollout_id": f"poison-{tag}", "task_input": {"answer": "4"}})
        started.raise_for_status()
        info = started.json()
        body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
        answer = client.post(f"{info['openai_base_url'].rstrip('/')}/chat/completions", json=body)
    code = ""
    try:
        code = str((answer.json().get("error") or {}).get("code") or "")
    except ValueError:
        pass
    return answer.status_code, code, info


# ------------------------------------------------------------------------------------ the scenarios


def poison_and_disk(settings: Settings, workdir: Path, sizes: PoisonDiskSizes, progress: Progress) -> list[FaultResult]:
    workdir.mkdir(parents=True, exist_ok=True)
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", controller_port=free_port(),
                          data_dir=workdir / "kafka", heap="512m", partitions=2, lib_dir=settings.kafka.lib_dir,
                          max_message_bytes=CORPUS_MAX_RECORD_BYTES)
    disk = workdir / "disk"
    mount_tmpfs(disk, sizes.disk_mb)
    gw = settings.gateway.model_copy(update={"port": free_port(), "spool_dir": disk / "spool",
                                             "delivery_timeout_s": 1.0, "recover_on_start": False})
    private = settings.model_copy(update={"kafka": kafka, "gateway": gw})
    quiet: Progress = lambda _line: None  # noqa: E731
    gateway = GatewayProcess(private, workdir / "gateway.log")
    t0 = time.monotonic()
    try:
        def start_broker() -> None:
            kafka_local.start(wait_s=180, kafka=kafka, echo=quiet)
            create_topics(kafka.client_config(), TOPICS)

        start_gateway_beside(gateway, start_broker)
        progress(f"faults j/k: private broker on {kafka.bootstrap_servers}, a gateway whose spool is on a "
                 f"{sizes.disk_mb} MiB tmpfs ({time.monotonic() - t0:.0f}s)")
        results = [_poison(gateway, kafka, settings.model.name, sizes, progress)]
        results.append(_disk_full(gateway, kafka, disk, settings.model.name, sizes, progress))
        return results
    finally:
        gateway.stop()
        kafka_local.stop(timeout_s=60, kafka=kafka, echo=quiet)
        unmount(disk)


def _poison(gateway: GatewayProcess, kafka: KafkaSettings, model: str, sizes: PoisonDiskSizes,
            progress: Progress) -> FaultResult:
    """The 5 MB request, then a call that fits the model but whose record is over the broker's limit
    (lowered for this broker, as the corpus does: the embedded model's context keeps any record it
    accepts far under 16 MiB); good rollouts before, between and after."""
    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    good = [Driver(gateway.url, model, sizes.calls_per_rollout, f"i-{k}-{tag}") for k in range(3)]
    good[0].run_n(sizes.rollouts_around)
    big_status, big_code, big = send_one_call(gateway, model, poison_content(sizes.poison_bytes), f"big-{tag}")
    good[1].run_n(sizes.rollouts_around)
    over_status, _code, over = send_one_call(gateway, model, LONG_FOR_THE_RECORD, f"over-{tag}")
    good[2].run_n(sizes.rollouts_around)
    drained = gateway.wait_drained(60)
    sink = _sink(gateway)
    progress(f"fault j: {sizes.poison_bytes / 1e6:.0f} MB request answered {big_status} {big_code}; the record "
             f"over the limit answered {over_status}; quarantined {sink.get('quarantined')}, spool depth "
             f"{sink.get('spool_depth')}")
    acked = set().union(*(d.ids for d in good))
    over_call = call_id(over["rollout_id"], over["attempt_id"], 0)
    big_call = call_id(big["rollout_id"], big["attempt_id"], 0)
    expected = acked | {big["event_id"], over["event_id"], over_call}
    records = read_records(kafka.client_config(), TOPICS, expected, timeout_s=90)
    counts = _count(records)
    lost, dup = lost_and_duplicated(counts, expected)
    stand_in = [r for _, r in records if r.get("event_id") == over_call and "record_quarantined" in str(r.get("error"))]
    big_refused = 400 <= big_status < 500 and counts[big_call] == 0  # refused up front: nothing to block
    over_quarantined = over_status == 200 and len(stand_in) == 1 and int(sink.get("quarantined", 0)) >= 1
    errors = [e for d in good for e in d.errors]
    passed = (big_refused and over_quarantined and drained and not errors and lost == dup == 0
              and all(d.done == sizes.rollouts_around for d in good))
    notes = [f"the {sizes.poison_bytes / 1e6:.0f} MB request: "
             + (f"refused up front ({big_status} {big_code})" if big_refused else f"NOT refused ({big_status})"),
             f"the record over the {kafka.max_message_bytes // 1024} KiB limit: "
             + ("quarantined whole, a stand-in on Kafka" if over_quarantined else "NOT quarantined")]
    notes += (["spool not drained after them"] if not drained else []) + errors[:3]
    progress(f"fault j: lost {lost}, duplicated {dup}")
    return FaultResult(POISON_NAME, f"{sizes.poison_bytes / 1e6:.0f} MB request and a record over the "
                       f"broker's limit between {sum(d.done for d in good)} good rollouts ({len(acked)} records)",
                       lost, dup, passed, "; ".join(notes), seconds=time.monotonic() - t0)


def _disk_full(gateway: GatewayProcess, kafka: KafkaSettings, disk: Path, model: str, sizes: PoisonDiskSizes,
               progress: Progress) -> FaultResult:
    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    quiet: Progress = lambda _line: None  # noqa: E731
    kafka_local.stop(timeout_s=60, kafka=kafka, echo=quiet)
    spooled = Driver(gateway.url, model, sizes.calls_per_rollout, f"j-spooled-{tag}")
    spooled.run_n(1)
    depth = int(_sink(gateway).get("spool_depth", 0))
    filler = fill(disk)
    while_full = Driver(gateway.url, model, sizes.calls_per_rollout, f"j-full-{tag}")
    # Several: the first may still fit in the slack of the spool file's last page; together they cannot.
    while_full.run_n(WHILE_FULL)
    alive_while_full = httpx.get(f"{gateway.url}/health", timeout=30).status_code == 200
    progress(f"fault k: broker down, {depth} records spooled, disk filled; {len(while_full.errors)} of {WHILE_FULL} "
             f"rollouts refused while full, /health {'200' if alive_while_full else 'NOT 200'}")
    filler.unlink()
    kafka_local.start(wait_s=180, kafka=kafka, echo=quiet)
    drained = gateway.wait_drained(120)
    after = Driver(gateway.url, model, sizes.calls_per_rollout, f"j-after-{tag}")
    after.run_n(sizes.rollouts_around)
    drained_after = gateway.wait_drained(60)
    expected = spooled.ids | while_full.ids | after.ids
    counts = _count(read_records(kafka.client_config(), TOPICS, expected, timeout_s=90))
    lost, dup = lost_and_duplicated(counts, expected)
    refused = len(while_full.errors)
    errors = spooled.errors + after.errors
    passed = (lost == dup == 0 and depth > 0 and refused > 0 and alive_while_full and drained and drained_after
              and not errors and after.done == sizes.rollouts_around)
    notes = [f"{refused} rollout(s) refused while the disk was full (never acknowledged)"]
    notes += [why for failed, why in ((depth == 0, "nothing was spooled with the broker down"),
                                      (refused == 0, "no call was refused: the disk never filled"),
                                      (not drained, "the spool did not drain once space and broker returned"),
                                      (not drained_after, "the spool did not drain after the later calls"))
              if failed]
    progress(f"fault k: lost {lost}, duplicated {dup}")
    return FaultResult(DISK_NAME, f"{spooled.done} rollout spooled ({depth} records), disk filled, "
                       f"{refused} of {WHILE_FULL} rollouts refused meanwhile, then {after.done} after space and "
                       f"broker returned ({len(expected)} records)", lost, dup, passed, "; ".join(notes + errors[:3]),
                       seconds=time.monotonic() - t0)


def _count(records: list[tuple[bytes, dict[str, Any]]]) -> Counter[str]:
    return Counter(record.get("event_id", "<undecodable>") for _, record in records)
