"""Trainer input throughput against the cost of a training step.

Collation: encoded Sample records (synthetic, or read from the samples topic with ``--topic``)
are decoded with the codec, checked and collated (padded and packed); tokens per second counts
every token of every sample. Training: one optimizer step of the trainer's learner on the demo
model (built and cached under settings.model.dir) over a batch of samples of that model's vocab.

    python -m bench.trainer [--records 400] [--topic] [--step-samples 8]

Last line: one JSON object with collate_tokens_per_s and train_step_s (and the detail figures).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from bench.common import best_time, emit
from schemas.codec import get_codec
from testkit.samples import random_sample_records
from trainer_consumer.batching import FilterConfig, filter_reason
from trainer_consumer.collate import collate
from trainer_consumer.sample_view import sample_from_record


def encoded_synthetic(records: int, seed: int = 0) -> list[bytes]:
    """Agentic-looking samples: long prompts, shorter outputs, a quarter packing 4 sequences."""
    rng = np.random.default_rng(seed)
    codec = get_codec()
    single = random_sample_records(records - records // 4, rng, 151_936, (512, 4096), (64, 1024))
    packed = random_sample_records(records // 4, rng, 151_936, (128, 1024), (32, 256), pack=4)
    return [codec.encode("Sample", r) for r in single + packed]


def encoded_from_topic(limit: int, timeout_s: float = 10.0) -> list[bytes]:
    """Up to ``limit`` records from the samples topic, read by a throwaway group (nothing committed)."""
    from confluent_kafka import Consumer

    from schemas import topics
    from schemas.kafka import config as kafka_config
    from tokentrail.settings import get_settings

    conf = kafka_config.consumer_config(get_settings().kafka, f"bench-trainer-{time.time_ns()}")
    conf.update({"enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer = Consumer(conf)
    consumer.subscribe([topics.SAMPLES_TOPIC])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < limit and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=limit - len(out), timeout=1.0):
                if msg.error() is None and msg.value():
                    out.append(msg.value())
    finally:
        consumer.close()
    return out


def decode_and_collate(blobs: list[bytes], layout: str, batch_size: int) -> int:
    codec = get_codec()
    filters = FilterConfig(max_staleness=1 << 30).build()
    samples = []
    tokens = 0
    for blob in blobs:
        _, rec = codec.decode(blob, expect="Sample")
        sample = sample_from_record(rec)
        if filter_reason(sample, 0, filters) is None:
            samples.append(sample)
        if len(samples) == batch_size:
            tokens += collate(samples, layout).num_tokens  # type: ignore[arg-type]
            samples = []
    if samples:
        tokens += collate(samples, layout).num_tokens  # type: ignore[arg-type]
    return tokens


def train_step_seconds(step_samples: int, seq_len: int, repeat: int, threads: int = 0) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from models.reference.build import build_model
    from testkit.samples import random_sequence, sample_record
    from tokentrail.settings import get_settings
    from trainer_consumer.learner import Learner, LearnerConfig

    if threads:
        torch.set_num_threads(threads)
    model_dir = build_model(get_settings().model.dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng = np.random.default_rng(1)
    vocab = model.config.vocab_size
    samples = [
        sample_from_record(sample_record([random_sequence(rng, vocab, seq_len // 2, seq_len // 2, f"r{i}")]))
        for i in range(step_samples)
    ]
    learner = Learner(model, LearnerConfig(micro_batch_tokens=None))
    learner.step(samples)  # warm-up: allocator, optimizer state
    seconds = best_time(lambda: learner.step(samples), repeat=repeat)
    tokens = step_samples * seq_len
    return {"train_step_s": seconds, "train_step_tokens": tokens, "train_tokens_per_s": tokens / seconds,
            "model_parameters": sum(p.numel() for p in model.parameters()),
            "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400, help="synthetic Sample records to collate")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per collated batch")
    parser.add_argument("--topic", action="store_true", help="read the records from the samples topic")
    parser.add_argument("--step-samples", type=int, default=8, help="samples in the timed training step")
    parser.add_argument("--step-seq-len", type=int, default=256, help="tokens per training-step sample")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the training step (0: torch's default); on a shared "
                             "2-core host one thread is several times faster than two")
    args = parser.parse_args(argv)

    source = "topic" if args.topic else "synthetic"
    blobs = encoded_from_topic(args.records) if args.topic else encoded_synthetic(args.records)
    if not blobs:
        parser.error("no Sample records to collate (is the samples topic empty?)")
    print(f"collating {len(blobs)} {source} Sample records ({sum(map(len, blobs)) / 1e6:.1f} MB encoded)")
    figures: dict[str, object] = {"records": len(blobs), "source": source}
    tokens = decode_and_collate(blobs, "padded", args.batch_size)
    figures["tokens"] = tokens
    for layout in ("padded", "packed"):
        seconds = best_time(lambda layout=layout: decode_and_collate(blobs, layout, args.batch_size),
                            repeat=args.repeat)
        figures[f"collate_{layout}_tokens_per_s"] = tokens / seconds
    figures["collate_tokens_per_s"] = min(figures["collate_padded_tokens_per_s"],  # type: ignore[type-var]
                                          figures["collate_packed_tokens_per_s"])
    print(f"training step: {args.step_samples} samples x {args.step_seq_len} tokens on the demo model")
    figures.update(train_step_seconds(args.step_samples, args.step_seq_len, args.repeat, args.threads))
    # How much of a step the input pipeline would cost if it ran inline (it is far below 1).
    collate_s = figures["train_step_tokens"] / figures["collate_tokens_per_s"]  # type: ignore[operator]
    figures["collate_fraction_of_step"] = collate_s / figures["train_step_s"]  # type: ignore[operator]
    emit(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
