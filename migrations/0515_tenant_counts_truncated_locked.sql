-- 0513's TRUNCATE triggers emptied the streams' and the tokens' counts with a DELETE that sees
-- the rows committed when it starts. The storage cleanup's fold writes those tables without
-- touching `streams` or `api_tokens`, so a fold that moved an ended backend's row into a new
-- row of backend 0 and committed while the DELETE ran left that new row behind: a tenant with
-- no stream counted one (a review's). The trigger now takes the count table whole first
-- (EXCLUSIVE: it waits for a fold under way, and no fold or writer changes it until the
-- TRUNCATE commits; the table's writers wait for the TRUNCATE's own lock anyway).
CREATE OR REPLACE FUNCTION count_streams_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE tenant_stream_counts IN EXCLUSIVE MODE;
    DELETE FROM tenant_stream_counts;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION count_tokens_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE tenant_token_counts IN EXCLUSIVE MODE;
    DELETE FROM tenant_token_counts;
    RETURN NULL;
END
$$;
