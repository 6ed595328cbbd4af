"""The limits of the gateway the corpus runs against, and inputs sized against them."""

# The gateway the corpus runs against is started with these limits (small, so "huge" stays cheap).
CORPUS_MAX_BODY_BYTES = 64 * 1024
CORPUS_MAX_TOKENS = 64
# Kafka's record limit for that gateway's publisher: a body under the body limit can still make a record
# over it (its prompt ids, as issue 17's 5 MB request did under the 16 MiB default).
CORPUS_MAX_RECORD_BYTES = 24 * 1024
HUGE = "x" * (CORPUS_MAX_BODY_BYTES + 16 * 1024)
# Under the body limit and within the model's context (about 5,000 tokens), but its call record (about
# 26 kB) is over CORPUS_MAX_RECORD_BYTES.
LONG_FOR_THE_RECORD = " ".join(f"w{i}" for i in range(1200))
