-- A stream just created has no records, so every link to it starts at 0. A link row may already
-- be there when it is created: one that named it by ID before it existed (at 0), or one that a
-- subscription's decision, made while the stream's previous incarnation was being erased, wrote
-- back after the erasure removed it, with that incarnation's cursor. Kept, such a cursor would
-- pass over the new stream's first records: they would never wake the subscription.
-- The subscriptions it touches (those with a link to it, those whose glob matches it) are held
-- first (FOR KEY SHARE, in their ID's order), then their links, the order a subscription's
-- decision takes them in (its row FOR UPDATE, then its links), so the two never deadlock; and a
-- subscription being deleted meanwhile is waited for, then not linked (its link's foreign key
-- failed the creation with a 500).
CREATE OR REPLACE FUNCTION ds_link_new_stream() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('ds-links:' || NEW.tenant, 0));
    PERFORM 1 FROM ds_subscriptions s
    WHERE s.tenant = NEW.tenant
      AND (s.subscription_id IN (
               SELECT l.subscription_id FROM ds_subscription_links l
               WHERE l.tenant = NEW.tenant AND l.run_id = NEW.run_id
                 AND l.stream_id = NEW.stream_id)
           OR (s.pattern_regex IS NOT NULL
               AND ((CASE WHEN NEW.run_id = 'default' THEN NEW.stream_id
                          ELSE NEW.run_id || '/' || NEW.stream_id END) ~ s.pattern_regex
                    OR (NEW.run_id || '/' || NEW.stream_id) ~ s.pattern_regex)))
    ORDER BY s.subscription_id
    FOR KEY SHARE OF s;
    UPDATE ds_subscription_links SET acked = 0
    WHERE tenant = NEW.tenant AND run_id = NEW.run_id AND stream_id = NEW.stream_id
      AND acked <> 0;
    INSERT INTO ds_subscription_links (tenant, subscription_id, run_id, stream_id, explicit, glob, acked)
    SELECT s.tenant, s.subscription_id, NEW.run_id, NEW.stream_id, false, true, 0
    FROM ds_subscriptions s
    WHERE s.tenant = NEW.tenant AND s.pattern_regex IS NOT NULL
      AND ((CASE WHEN NEW.run_id = 'default' THEN NEW.stream_id
                 ELSE NEW.run_id || '/' || NEW.stream_id END) ~ s.pattern_regex
           OR (NEW.run_id || '/' || NEW.stream_id) ~ s.pattern_regex)
    FOR KEY SHARE OF s
    ON CONFLICT (tenant, subscription_id, run_id, stream_id) DO UPDATE SET glob = true;
    RETURN NULL;
END $$;

-- A stream erased is unlinked the same way round: the subscriptions with a link to it are held
-- first (FOR KEY SHARE, in their ID's order), then their links deleted. Deleting the links
-- first deadlocked a run's deletion (several streams, their links one after the other) with a
-- subscription's decision (its row FOR UPDATE, then its links).
CREATE OR REPLACE FUNCTION ds_unlink_erased_stream() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM ds_subscriptions s
    WHERE s.tenant = OLD.tenant
      AND s.subscription_id IN (
          SELECT l.subscription_id FROM ds_subscription_links l
          WHERE l.tenant = OLD.tenant AND l.run_id = OLD.run_id AND l.stream_id = OLD.stream_id)
    ORDER BY s.subscription_id
    FOR KEY SHARE OF s;
    DELETE FROM ds_subscription_links
    WHERE tenant = OLD.tenant AND run_id = OLD.run_id AND stream_id = OLD.stream_id;
    RETURN NULL;
END $$;
