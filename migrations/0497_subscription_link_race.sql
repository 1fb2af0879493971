-- A stream created while a glob subscription is being created could be linked by neither: the
-- stream's trigger ran before the subscription was committed (and saw none), and the
-- subscription's backfill ran before the stream was committed (and saw none). Both now take one
-- advisory lock of the tenant's: a stream's creation shared, a glob subscription's creation
-- exclusive, before they look for each other. The subscription's backfill then waits for
-- creations under way, and a creation that comes after it waits for it to commit, then sees it
-- (the trigger's query takes its snapshot after the lock).
CREATE OR REPLACE FUNCTION ds_link_new_stream() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('ds-links:' || NEW.tenant, 0));
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
