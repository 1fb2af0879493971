-- The default wait service's events (`workflow_wait_events`, DUCTOR_STREAMS_WAIT_SERVICE=postgres)
-- count in their tenant's bytes (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT): each its payload as stored
-- (jsonb's text: the input record and its key) and 128 for its row (adapters/postgres/
-- tenant_counts.py, `WAIT_EVENT_COUNT`). An event is kept as long as its stream, whatever
-- retention prunes of the records: uncounted, a tenant at its limit could append to an input
-- stream that keeps one record, and the copies would grow without bound. The wait service's
-- insert adds an event's bytes as it lands, and an erasure takes them away.
--
-- The events already there are counted here while none lands: an insert waits for this lock
-- until the migration commits, so none is counted twice or missed. A process of an earlier
-- version neither adds nor takes away an event's bytes, until `ductor-streams tenants
-- --recount` counts again.
LOCK TABLE workflow_wait_events IN SHARE MODE;
INSERT INTO tenant_byte_counts (tenant, backend, bytes)
SELECT tenant, 0, sum(octet_length(payload::text) + 128) FROM workflow_wait_events
GROUP BY tenant ORDER BY tenant
ON CONFLICT (tenant, backend) DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes;
