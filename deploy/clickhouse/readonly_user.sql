-- Read-only ClickHouse user for dashboards (Grafana) and people browsing the audit tables.
-- Server mode only: chDB (the embedded default) has no users, roles or grants.
-- Prefer `tokentrail clickhouse readonly-user --password ...` (hashes the password for you);
-- this file is the same SQL for clickhouse-client. Replace the hash and, if you changed them,
-- the user and database names (settings clickhouse.readonly_user / clickhouse.database).
--   echo -n 'the-password' | sha256sum
CREATE USER IF NOT EXISTS tokentrail_dashboards
    IDENTIFIED WITH sha256_hash BY 'REPLACE_WITH_SHA256_HEX_OF_PASSWORD'
    SETTINGS readonly = 1;
GRANT SELECT ON tokentrail.* TO tokentrail_dashboards;
