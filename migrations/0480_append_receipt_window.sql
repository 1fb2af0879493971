-- Migration 480: the workers remove append receipts older than the idempotency window in
-- batches; this index lets each batch find the oldest receipts without scanning the table.
CREATE INDEX append_receipts_created_at ON append_receipts (created_at);
