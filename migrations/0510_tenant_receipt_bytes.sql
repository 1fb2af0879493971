-- An idempotent append's receipt counts in its tenant's bytes (DUCTOR_STREAMS_MAX_BYTES_PER_TENANT)
-- for the day it is kept: its key's bytes and 416 for its row, its fingerprint and its answer
-- (domain/records.py, `receipt_bytes`). Uncounted, a tenant at its limit could append under a
-- new key each time to a stream that keeps nothing, and hold its append rate times a day of
-- receipts. The write statement adds a receipt's bytes as it writes it, the receipts' sweep and
-- an erasure take them away as they delete it (adapters/postgres/tenant_counts.py,
-- `RECEIPT_COUNT`).
--
-- The receipts already there are counted here while none is written or forgotten: a write waits
-- for this lock until the migration commits, so none is counted twice or missed. A process of an
-- earlier version neither adds nor takes away a receipt's bytes, until `ductor-streams tenants
-- --recount` counts again.
LOCK TABLE append_receipts IN SHARE MODE;
INSERT INTO tenant_byte_counts (tenant, backend, bytes)
SELECT tenant, 0, sum(octet_length(idempotency_key) + 416) FROM append_receipts
GROUP BY tenant ORDER BY tenant
ON CONFLICT (tenant, backend) DO UPDATE SET bytes = tenant_byte_counts.bytes + excluded.bytes;
