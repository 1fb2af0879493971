-- The runs a subscription's creator was restricted to (Subscription.creator_runs; NULL: not
-- restricted), in a column of its own rather than in the state document: written once, when
-- the subscription is made, and never rewritten by a process that does not know the field
-- (one of an earlier version, during a rolling upgrade, re-encodes the state without it).
-- Subscriptions made before this field existed have NULL: they act unrestricted until made
-- again.
ALTER TABLE ds_subscriptions ADD COLUMN creator_runs text[];
