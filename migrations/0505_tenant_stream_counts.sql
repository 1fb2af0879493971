-- How many streams each tenant holds, for its limit (DUCTOR_STREAMS_MAX_STREAMS_PER_TENANT).
-- Every statement that inserts or deletes streams, whatever path it is on (a creation, a batch
-- of them, an erasure, a run's deletion, a cascade, the expiry sweep), adds its change by a
-- trigger. It adds it to a row of its own backend's (`backend`, pg_backend_pid()), so two
-- transactions never wait for each other here and never deadlock: a backend runs one
-- transaction at a time. A tenant's count is the sum of its rows. The storage cleanup folds the
-- rows of backends that have ended into the tenant's row of backend 0.
CREATE TABLE tenant_stream_counts (
    tenant  text NOT NULL,
    backend integer NOT NULL,
    streams bigint NOT NULL,
    PRIMARY KEY (tenant, backend)
);

CREATE FUNCTION count_streams_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_stream_counts (tenant, backend, streams)
    SELECT tenant, pg_backend_pid(), count(*) FROM inserted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET streams = tenant_stream_counts.streams + excluded.streams;
    RETURN NULL;
END
$$;

CREATE FUNCTION count_streams_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_stream_counts (tenant, backend, streams)
    SELECT tenant, pg_backend_pid(), -count(*) FROM deleted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET streams = tenant_stream_counts.streams + excluded.streams;
    RETURN NULL;
END
$$;

-- The streams already there are counted in the same transaction as the triggers are made
-- (CREATE TRIGGER locks out every write to the table until it commits).
CREATE TRIGGER streams_counted_in AFTER INSERT ON streams
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION count_streams_inserted();
CREATE TRIGGER streams_counted_out AFTER DELETE ON streams
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION count_streams_deleted();

INSERT INTO tenant_stream_counts (tenant, backend, streams)
SELECT tenant, 0, count(*) FROM streams GROUP BY tenant;
