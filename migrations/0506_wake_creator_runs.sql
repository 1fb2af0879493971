-- The runs a subscription's creator was restricted to (a token minted with `runs`, a JWT's
-- `runs` claim), NULL for a creator who was not: a wake is delivered as its creator sees the
-- streams, and a fork whose source lies outside those runs is not there for it. The
-- subscription keeps them in its state document.
ALTER TABLE ds_wake_deliveries ADD COLUMN created_by_runs text[];
