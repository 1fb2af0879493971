-- The wake outbox as a queue per tenant: a claim walks the tenants that have undelivered wakes
-- (an index probe each) and reads at most a few of each one's due rows in order, first attempts
-- and retries apart, instead of ranking every due row (docs/architecture.md, "Subscriptions").
-- The rows under lease, counted against each tenant's cap, are found by their lease.
CREATE INDEX ds_wake_deliveries_queue
    ON ds_wake_deliveries (tenant, kind, least(attempts, 1), next_attempt_at)
    WHERE delivered_at IS NULL;
CREATE INDEX ds_wake_deliveries_leased ON ds_wake_deliveries (lease_until)
    WHERE delivered_at IS NULL AND lease_until IS NOT NULL;
-- The claim no longer reads the backlog in due order.
DROP INDEX ds_wake_deliveries_due;
