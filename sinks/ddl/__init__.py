"""ClickHouse tables and views for every tokentrail topic, and idempotent migrations.

Every table is immutable event storage: ReplacingMergeTree whose sorting key ends in the event id, so
a re-delivered event collapses into one row at merge time (read with FINAL). Inserts also carry a
deduplication token (see sinks/sink.py), so a retried batch is dropped on arrival.

Calls' token arrays arrive as the packed little-endian bytes of the Avro record and are stored as
typed arrays (migrations 0003/0004): ids as Array(UInt32) with T64 (keeps only the bits the vocabulary
needs) then ZSTD, logprobs as Array(Float32) with ZSTD. The bytes go into EPHEMERAL columns and the
server converts them (``reinterpret``), so Python never converts; reads turn the arrays back into the
exact bytes (``packed_read_sql``). A later call's prompt is only its delta (new tokens after a prefix
of an earlier call), never the full prompt again. Rollouts do not repeat their calls' tokens: they keep
each call's lengths and hashes and are rebuilt from the calls table (sinks/store.py), so storage grows
with the rollout once. The harness request bodies, which repeat the whole conversation on every call,
are kept the same way: a later call's body as the text between what it shares with an earlier call's
body at both ends (migration 0005, sinks/request_bodies.py). Samples repeat their calls' tokens too:
where the writer proves a sample's ids are its calls' prompt ‖ output and its logprobs its calls'
sampled logprobs, those columns are stored empty, with the calls named and the length and sha256 of
what they held (migration 0006, sinks/sample_refs.py); reads rebuild and check them. The rollouts of a
group share their first prompt (the task): a full prompt already stored by another call is stored
once, the later rows naming that call (migration 0007, sinks/shared_prompts.py). Other packed
bytes (a sample's mask, advantages and weights, or ids that differ from its calls; dead letters)

One job per module: ``tables.py`` (the tables), ``views.py`` (the helper views), ``packed.py`` (calls'
packed bytes <-> typed array columns), ``migrations.py`` (the append-only migrations) and ``runner.py``
(applying them, the DDL script, the read-only user).
"""

from sinks.ddl.migrations import MIGRATIONS, TRAINER_STEP_OFF_POLICY, TRAINER_STEP_RESUME, VERSION_SPAN_COLUMNS
from sinks.ddl.packed import CALL_PACKED, CALL_STORED_TOKEN_COLUMNS, packed_read_sql, star_columns
from sinks.ddl.runner import MIGRATIONS_TABLE, applied_migrations, migrate, readonly_user_sql, schema_sql
from sinks.ddl.tables import TABLE_NAMES, TABLES
from sinks.ddl.views import VIEWS, view_sql

__all__ = ["CALL_PACKED", "CALL_STORED_TOKEN_COLUMNS", "MIGRATIONS", "MIGRATIONS_TABLE", "TABLES", "TABLE_NAMES",
           "TRAINER_STEP_OFF_POLICY", "TRAINER_STEP_RESUME", "VERSION_SPAN_COLUMNS", "VIEWS", "applied_migrations",
           "migrate", "packed_read_sql", "readonly_user_sql", "schema_sql", "star_columns", "view_sql"]
