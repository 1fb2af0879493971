-- A pull-wake subscription's wake stream (its run and stream IDs) in columns of their own, so
-- that linking a stream to a pull-wake asks one indexed question, "is any of these streams a
-- wake stream?", instead of reading every pull-wake's state under the tenant's census lock. A
-- link to a stream no wake is written to makes no ring of wakes, so such links no longer wait
-- for one another (docs/architecture.md, "Subscriptions").
-- Written when a pull-wake is made, and filled in by any later change of one made before this
-- (NULL until then: such a tenant's links take the census lock, as before).
ALTER TABLE ds_subscriptions ADD COLUMN wake_run text, ADD COLUMN wake_stream text;
CREATE INDEX ds_subscriptions_wake_streams ON ds_subscriptions (tenant, wake_run, wake_stream)
    WHERE kind = 'pull-wake';
