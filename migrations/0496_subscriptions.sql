-- Durable Streams subscriptions (docs/durable-streams.md, "Subscriptions"): the subscription
-- (its configuration and wake state as one document, and the columns the scheduler selects on),
-- its stream links with their cursors, the outbox of wakes to deliver, and the keys that sign
-- webhooks and wake tokens.
CREATE TABLE ds_subscriptions (
    tenant          text NOT NULL,
    subscription_id text NOT NULL,
    kind            text NOT NULL,            -- webhook | pull-wake
    pattern_regex   text,                     -- the glob as a regular expression, for the link trigger
    state           bytea NOT NULL,           -- domain.subscriptions.Subscription without its links
    wake_active     boolean NOT NULL DEFAULT false,
    lease_until     timestamptz,              -- the wake's lease, once it has one
    failing         boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, subscription_id)
);
CREATE INDEX ds_subscriptions_globs ON ds_subscriptions (tenant) WHERE pattern_regex IS NOT NULL;
CREATE INDEX ds_subscriptions_leased ON ds_subscriptions (lease_until) WHERE lease_until IS NOT NULL;

CREATE TABLE ds_subscription_links (
    tenant          text NOT NULL,
    subscription_id text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    explicit        boolean NOT NULL,
    glob            boolean NOT NULL,
    acked           bigint NOT NULL,          -- last processed sequence, inclusive (0: none)
    PRIMARY KEY (tenant, subscription_id, run_id, stream_id),
    FOREIGN KEY (tenant, subscription_id) REFERENCES ds_subscriptions ON DELETE CASCADE
);
CREATE INDEX ds_subscription_links_stream ON ds_subscription_links (tenant, run_id, stream_id);

CREATE TABLE ds_wake_deliveries (
    tenant          text NOT NULL,
    subscription_id text NOT NULL,
    generation      bigint NOT NULL,
    wake_id         text NOT NULL,
    kind            text NOT NULL,            -- webhook | wake-event
    payload         bytea NOT NULL,
    url             text,
    wake_run        text,
    wake_stream     text,
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    claimed_by      text,
    lease_until     timestamptz,
    last_error      text,
    PRIMARY KEY (tenant, subscription_id, generation),
    FOREIGN KEY (tenant, subscription_id) REFERENCES ds_subscriptions ON DELETE CASCADE
);
CREATE INDEX ds_wake_deliveries_due ON ds_wake_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL;

-- Webhook signing keys (Ed25519) and the wake-token secret. The newest key signs; older ones
-- stay published in the JWKS until `retire_after`.
CREATE TABLE ds_signing_keys (
    kid          text PRIMARY KEY,
    private_key  bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    retire_after timestamptz
);
CREATE TABLE ds_secrets (
    name   text PRIMARY KEY,
    secret bytea NOT NULL
);

-- A stream created where a subscription's glob matches is linked in the creating transaction,
-- from its start, so its first records wake the subscription; a stream erased is unlinked.
CREATE FUNCTION ds_link_new_stream() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ds_subscription_links (tenant, subscription_id, run_id, stream_id, explicit, glob, acked)
    SELECT s.tenant, s.subscription_id, NEW.run_id, NEW.stream_id, false, true, 0
    FROM ds_subscriptions s
    WHERE s.tenant = NEW.tenant AND s.pattern_regex IS NOT NULL
      AND ((CASE WHEN NEW.run_id = 'default' THEN NEW.stream_id
                 ELSE NEW.run_id || '/' || NEW.stream_id END) ~ s.pattern_regex
           OR (NEW.run_id || '/' || NEW.stream_id) ~ s.pattern_regex)
    ON CONFLICT (tenant, subscription_id, run_id, stream_id) DO UPDATE SET glob = true;
    RETURN NULL;
END $$;
CREATE TRIGGER ds_link_new_stream AFTER INSERT ON streams
    FOR EACH ROW EXECUTE FUNCTION ds_link_new_stream();

CREATE FUNCTION ds_unlink_erased_stream() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM ds_subscription_links
    WHERE tenant = OLD.tenant AND run_id = OLD.run_id AND stream_id = OLD.stream_id;
    RETURN NULL;
END $$;
CREATE TRIGGER ds_unlink_erased_stream AFTER DELETE ON streams
    FOR EACH ROW EXECUTE FUNCTION ds_unlink_erased_stream();
