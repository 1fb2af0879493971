-- How many tokens each tenant holds, for its limit on minting more (DUCTOR_STREAMS_MAX_TOKENS_PER_TENANT):
-- every row of `api_tokens`, revoked and expired ones too, until the workers forget it. Kept as
-- 0505's stream counts are, by triggers, one row per tenant and backend (two transactions never
-- wait for each other here), folded by the storage cleanup into backend 0's row. Counting the
-- rows at each check instead read a million index entries in 77-250 ms, once a second per
-- process while the tenant mints.
CREATE TABLE tenant_token_counts (
    tenant  text NOT NULL,
    backend integer NOT NULL,
    tokens  bigint NOT NULL,
    PRIMARY KEY (tenant, backend)
);

CREATE FUNCTION count_tokens_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_token_counts (tenant, backend, tokens)
    SELECT tenant, pg_backend_pid(), count(*) FROM inserted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET tokens = tenant_token_counts.tokens + excluded.tokens;
    RETURN NULL;
END
$$;

CREATE FUNCTION count_tokens_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_token_counts (tenant, backend, tokens)
    SELECT tenant, pg_backend_pid(), -count(*) FROM deleted GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET tokens = tenant_token_counts.tokens + excluded.tokens;
    RETURN NULL;
END
$$;

-- A token stored again under its hash for another tenant (`ON CONFLICT ... DO UPDATE`) moves
-- from one count to the other.
CREATE FUNCTION count_tokens_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_token_counts (tenant, backend, tokens)
    SELECT tenant, pg_backend_pid(), sum(n) FROM (
        SELECT tenant, -1 AS n FROM old_rows
        UNION ALL
        SELECT tenant, 1 AS n FROM new_rows
    ) AS moved
    GROUP BY tenant HAVING sum(n) <> 0 ORDER BY tenant
    ON CONFLICT (tenant, backend)
    DO UPDATE SET tokens = tenant_token_counts.tokens + excluded.tokens;
    RETURN NULL;
END
$$;

-- The tokens already there are counted in the same transaction as the triggers are made
-- (CREATE TRIGGER locks out every write to the table until it commits). A token stored again
-- under its hash (ON CONFLICT ... DO UPDATE: the bootstrap token at each start) is an update,
-- not counted twice; a revocation too.
CREATE TRIGGER api_tokens_counted_in AFTER INSERT ON api_tokens
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION count_tokens_inserted();
CREATE TRIGGER api_tokens_counted_out AFTER DELETE ON api_tokens
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION count_tokens_deleted();
CREATE TRIGGER api_tokens_counted_moved AFTER UPDATE ON api_tokens
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION count_tokens_moved();

INSERT INTO tenant_token_counts (tenant, backend, tokens)
SELECT tenant, 0, count(*) FROM api_tokens GROUP BY tenant;
