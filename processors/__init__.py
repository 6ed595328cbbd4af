"""The pure, deterministic stage core: assembly, prefix checks, grouping, verifiers, rewards, credit,
samples. Nothing in here knows about Kafka, faust, HTTP or ClickHouse; the adapters call
``processors.assembler``, ``processors.grouper`` and ``processors.pipeline``.
"""
