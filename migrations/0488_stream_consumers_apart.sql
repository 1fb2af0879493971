-- Migration 488: a stream's consumers beside its snapshot, and who holds credit.
-- `streams.consumers` holds the stream's consumers (JSON, by consumer ID), which the `state`
-- snapshot no longer carries: the state is rewritten by every group commit and was O(consumers),
-- so a stream with 5,000 consumers rewrote 220 KB per append. The column is written only when a
-- consumer changes; NULL means none yet (a state written before this migration still carries its
-- consumers itself, and the next write moves them here).
-- `stream_consumers` (the listing's keyset page) gains `holds_credit`: consumers created by a
-- principal that may only read track their position and hold no writer back; those stored
-- before the rule existed held credit, and still do.
ALTER TABLE streams ADD COLUMN consumers bytea;
ALTER TABLE stream_consumers ADD COLUMN holds_credit boolean NOT NULL DEFAULT true;
