-- Migration 484: leased maintenance sweeps, and the indexes the cleanup sweeps use.
-- One row per named sweep: the worker that claims it (FOR UPDATE SKIP LOCKED, with a lease it
-- renews while the sweep runs) is the only one across every replica running that sweep; when it
-- is done the row is due again `interval` later, and a killed worker's claim is taken over once
-- its lease runs out.
CREATE TABLE maintenance_sweeps (
    name            text PRIMARY KEY,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,
    lease_until     timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text
);

-- Delivered input rows, done outbox rows and gap evidence are removed once older than the
-- cleanup age, a bounded batch per statement; each batch finds the oldest rows by these.
CREATE INDEX input_deliveries_delivered_at ON input_deliveries (delivered_at)
    WHERE delivered_at IS NOT NULL;
CREATE INDEX deletion_outbox_done_at ON deletion_outbox (done_at) WHERE done_at IS NOT NULL;
CREATE INDEX gap_evidence_repaired_at ON gap_evidence (repaired_at);
