-- The default wait service's events (`workflow_wait_events`, DUCTOR_STREAMS_WAIT_SERVICE=postgres)
-- count in their tenant's bytes (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT): each its payload's size
-- and 128 for its row. An event is kept until its stream is erased or its engine (or an
-- operator) removes it, whatever retention prunes of the records: uncounted, a tenant at its
-- limit could append to an input stream that keeps one record, and the copies would grow
-- without bound.
--
-- Counted by triggers, as the streams are (0505): events leave this table by erasure, and by
-- whatever the engine or the operator deletes, and a trigger counts every way in and out, a
-- process of an earlier version's too. A statement-level trigger's transition table copies the
-- rows it passes, so an event keeps its size in a column of its own (`size`, the payload's text
-- as the wait service was given it), and the triggers sum that rather than rendering each
-- payload: an event of an earlier version has none, and counts its payload as stored
-- (jsonb's text).
ALTER TABLE workflow_wait_events ADD COLUMN size integer;

-- The events land after their records' decision: an append to an input stream is charged, as it
-- is decided, the most each of its records' events will hold (`application/input_delivery.py`,
-- `event_bytes`), pledged on its delivery row until the record is delivered (its event then
-- counts itself; the delivered row keeps the figure, counted no more) or the row goes with its
-- stream. The write statement adds the pledges,
-- delivery and deletion take them away (adapters/postgres/stream_writes.py, deliveries.py,
-- erasure.py). Kept in the rows, not in a process: charged for a second only, a tenant whose
-- events waited for a dispatcher stored 9.7 times its limit.
ALTER TABLE input_deliveries ADD COLUMN pledge integer;

CREATE FUNCTION count_wait_events_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_byte_counts (tenant, backend, bytes)
    SELECT tenant, pg_backend_pid(), sum(coalesce(size, octet_length(payload::text)) + 128)
    FROM inserted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes;
    RETURN NULL;
END
$$;

CREATE FUNCTION count_wait_events_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_byte_counts (tenant, backend, bytes)
    SELECT tenant, pg_backend_pid(), -sum(coalesce(size, octet_length(payload::text)) + 128)
    FROM deleted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes;
    RETURN NULL;
END
$$;

-- The events already there are counted in the same transaction as the triggers are made
-- (CREATE TRIGGER locks out every write to the table until it commits), so none is counted
-- twice or missed.
CREATE TRIGGER workflow_wait_events_counted_in AFTER INSERT ON workflow_wait_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION count_wait_events_inserted();
CREATE TRIGGER workflow_wait_events_counted_out AFTER DELETE ON workflow_wait_events
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION count_wait_events_deleted();

INSERT INTO tenant_byte_counts (tenant, backend, bytes)
SELECT tenant, 0, sum(octet_length(payload::text) + 128) FROM workflow_wait_events
GROUP BY tenant ORDER BY tenant
ON CONFLICT (tenant, backend) DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes;
