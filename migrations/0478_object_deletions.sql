-- A body is queued for deletion once, whatever queued it (abort, expiry, pruning); workers claim
-- these rows by id with the same lease columns as every job table.
CREATE UNIQUE INDEX deletion_outbox_body ON deletion_outbox (storage_region, storage_key);
CREATE INDEX object_intents_open_expiry ON object_intents (expires_at)
    WHERE state IN ('prepared', 'uploaded');
