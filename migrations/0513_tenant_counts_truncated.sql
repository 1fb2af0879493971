-- A TRUNCATE of a counted table (an operator emptying the default wait service's events, say)
-- fires no row or statement trigger of 0505, 0509-0512: the counts stayed as they were, and a
-- tenant whose events were emptied stayed refused until someone ran `tenants --recount`. Now a
-- TRUNCATE fires a trigger of its own on each of them:
--
-- - the streams' and the tokens' counts have one source each, so a TRUNCATE of `streams` or
--   `api_tokens` empties its count (every row of it is gone, and no writer of the table can run
--   until the TRUNCATE commits);
-- - the bytes have six sources: a TRUNCATE of one of them marks the bytes' recount as due
--   (`tenant_recounts_due`), and the storage cleanup's next fold of the counts runs it
--   (adapters/postgres/tenant_counts.py), within its period; the recount clears the mark in its
--   own transaction.
CREATE TABLE tenant_recounts_due (
    due         boolean PRIMARY KEY DEFAULT true CHECK (due),
    truncated   text NOT NULL,
    marked_at   timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION count_streams_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tenant_stream_counts;
    RETURN NULL;
END
$$;

CREATE FUNCTION count_tokens_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tenant_token_counts;
    RETURN NULL;
END
$$;

CREATE FUNCTION recount_bytes_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_recounts_due (truncated) VALUES (TG_TABLE_NAME)
    ON CONFLICT (due) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER streams_counted_truncated AFTER TRUNCATE ON streams
    FOR EACH STATEMENT EXECUTE FUNCTION count_streams_truncated();
CREATE TRIGGER api_tokens_counted_truncated AFTER TRUNCATE ON api_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION count_tokens_truncated();

CREATE TRIGGER streams_bytes_truncated AFTER TRUNCATE ON streams
    FOR EACH STATEMENT EXECUTE FUNCTION recount_bytes_due();
CREATE TRIGGER stream_records_bytes_truncated AFTER TRUNCATE ON stream_records
    FOR EACH STATEMENT EXECUTE FUNCTION recount_bytes_due();
CREATE TRIGGER object_intents_bytes_truncated AFTER TRUNCATE ON object_intents
    FOR EACH STATEMENT EXECUTE FUNCTION recount_bytes_due();
CREATE TRIGGER append_receipts_bytes_truncated AFTER TRUNCATE ON append_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION recount_bytes_due();
CREATE TRIGGER workflow_wait_events_bytes_truncated AFTER TRUNCATE ON workflow_wait_events
    FOR EACH STATEMENT EXECUTE FUNCTION recount_bytes_due();
CREATE TRIGGER input_deliveries_bytes_truncated AFTER TRUNCATE ON input_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION recount_bytes_due();
