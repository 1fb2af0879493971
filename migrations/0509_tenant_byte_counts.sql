-- How many bytes each tenant holds, for its limit (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT): what its
-- streams' definitions count, what its records count (each its size and 128 bytes for its row; an object's record its object's size
-- and its reference) and what its open object intents pledge (their bodies are being uploaded,
-- or wait for a commit: what their records will count). Kept as
-- 0505's stream counts are, one row per tenant and backend, so that two transactions never
-- wait for each other here; but not by triggers: a statement-level trigger's transition table
-- would hold a copy of every row written or deleted, payloads and all, and every append's write
-- statement would pay for it. The statements that insert or delete records, and that open or
-- end intents, add their own change instead (adapters/postgres/tenant_counts.py,
-- `COUNT_BYTES`): the write statement, a large group's COPY, a prune, an intent's prepare and
-- end (a commit, an abort, an expiry), and an erasure. The storage cleanup folds the rows of
-- backends that have ended into the tenant's row of backend 0.
CREATE TABLE tenant_byte_counts (
    tenant  text NOT NULL,
    backend integer NOT NULL,
    bytes   bigint NOT NULL,
    PRIMARY KEY (tenant, backend)
);

-- What an open intent counts: its `pledge`, set as it is prepared (what its record will count
-- once committed: its size, its reference and its row). Intents open before this migration
-- pledge their size and a row (their reference is not known here: each counts that much less).
ALTER TABLE object_intents ADD COLUMN pledge bigint;

-- A stream counts its definition (its schema among it: up to 64 KiB each, and a million streams
-- a tenant) and a row, added and taken away by the triggers that count the streams (0505),
-- whatever path creates or erases them: their transition tables hold the rows already.
CREATE OR REPLACE FUNCTION count_streams_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_stream_counts (tenant, backend, streams)
    SELECT tenant, pg_backend_pid(), count(*) FROM inserted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET streams = tenant_stream_counts.streams + excluded.streams;
    INSERT INTO tenant_byte_counts (tenant, backend, bytes)
    SELECT tenant, pg_backend_pid(), sum(octet_length(definition) + 128) FROM inserted
    GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION count_streams_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_stream_counts (tenant, backend, streams)
    SELECT tenant, pg_backend_pid(), -count(*) FROM deleted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET streams = tenant_stream_counts.streams + excluded.streams;
    INSERT INTO tenant_byte_counts (tenant, backend, bytes)
    SELECT tenant, pg_backend_pid(), -sum(octet_length(definition) + 128) FROM deleted
    GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes;
    RETURN NULL;
END
$$;

-- The streams, records and open intents already there. Records and intents are counted while
-- none is written: a write waits for these locks until the migration commits, so none is
-- counted twice or missed. Streams are not locked (an append holds its stream's row, writes its
-- records, then its row: holding `streams` while waiting for `stream_records` would deadlock
-- with it); a stream that a process of an earlier version creates meanwhile is not counted
-- (as nothing such a process writes is), until `ductor-streams tenants --recount`. A record
-- counts its size, its row (128 bytes) and, for an object's, its reference (domain/records.py,
-- `held_bytes`); a stream its definition and a row (domain/stream.py, `definition_bytes`).
LOCK TABLE stream_records, object_intents IN SHARE MODE;
UPDATE object_intents SET pledge = size + 128 WHERE state IN ('prepared', 'uploaded');
INSERT INTO tenant_byte_counts (tenant, backend, bytes)
SELECT tenant, 0, sum(size) FROM (
    SELECT tenant, size + CASE WHEN kind = 2 THEN octet_length(payload) ELSE 0 END + 128 AS size
    FROM stream_records
    UNION ALL
    SELECT tenant, pledge AS size FROM object_intents WHERE state IN ('prepared', 'uploaded')
    UNION ALL
    SELECT tenant, octet_length(definition) + 128 AS size FROM streams
) AS held
GROUP BY tenant;
