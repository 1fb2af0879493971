-- The links with records past their cursors, marked: a decision on a subscription reads its
-- marks (at most WAKE_STREAMS of them) rather than every link joined with its stream, a pass
-- that took 37 ms for 20,000 links and grew with them (docs/architecture.md, "Subscriptions").
--
-- A mark names a link and the head its stream had when it was marked (`head`: the link is
-- pending while its cursor is below it). It is written
--   * by every append's write statement, for the links of the streams it wrote past their
--     cursors (adapters/postgres/stream_writes.py), so a claim or a `done` right after an
--     append sees it;
--   * by a fork that starts with records, in its creating transaction;
--   * by a decision that links streams, once it has committed, for those past their cursors;
--   * by the wake scheduler, for the streams an announcement names (an append by a process of
--     an earlier version), and by its sweep for every link, as the belt to all of these.
-- A decision removes the marks of the links it read that are no longer pending, by a statement
-- that checks the mark's own `head` against the link's cursor, passing over a mark another
-- transaction holds (an append raising it). Every writer takes the marks in their key's order,
-- and a writer leaves a mark already at its head untouched. No foreign keys: a mark whose link,
-- stream or subscription is gone is removed by the sweep (a key-share lock taken for a foreign
-- key made a mark's writer and a link's deletion wait for each other).
-- A decision reads a subscription's marks after the last stream its last wake named, in the code
-- points' order (the domain's), whatever the database's collation: the second index keeps them
-- in that order. (The key columns keep the database's collation: declared `COLLATE "C"`, they
-- could not be compared with the links' and streams' keys through those tables' indexes, and
-- every look-up of a mark's link became a pass over every link.) The third finds a stream's
-- marks (a stream created again forgets them).
CREATE TABLE ds_subscription_pending (
    tenant          text NOT NULL,
    subscription_id text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    head            bigint NOT NULL,
    PRIMARY KEY (tenant, subscription_id, run_id, stream_id)
);
CREATE INDEX ds_subscription_pending_order
    ON ds_subscription_pending (tenant, subscription_id, run_id COLLATE "C", stream_id COLLATE "C");
CREATE INDEX ds_subscription_pending_stream ON ds_subscription_pending (tenant, run_id, stream_id);

INSERT INTO ds_subscription_pending (tenant, subscription_id, run_id, stream_id, head)
SELECT l.tenant, l.subscription_id, l.run_id, l.stream_id, t.head
FROM ds_subscription_links l
JOIN streams t ON (t.tenant, t.run_id, t.stream_id) = (l.tenant, l.run_id, l.stream_id)
WHERE t.head > l.acked;

-- A stream created starts every link to it at 0 (migration 0498), and now forgets every mark
-- of those links: a mark left by the stream's previous incarnation (erased, then created again
-- before the sweep forgot the mark) would name a head the new stream has not reached, and
-- keep its subscription due at every sweep with nothing to deliver. The marks are taken in
-- their key's order, as every writer of marks takes them.
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
    WITH held AS MATERIALIZED (
        SELECT subscription_id FROM ds_subscription_pending
        WHERE tenant = NEW.tenant AND run_id = NEW.run_id AND stream_id = NEW.stream_id
        ORDER BY tenant, subscription_id, run_id, stream_id
        FOR UPDATE
    )
    DELETE FROM ds_subscription_pending p USING held h
    WHERE p.tenant = NEW.tenant AND p.subscription_id = h.subscription_id
      AND p.run_id = NEW.run_id AND p.stream_id = NEW.stream_id;
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
