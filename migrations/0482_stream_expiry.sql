-- Migration 482: stream expiry. The last read or write of each stream with an expiry, kept
-- apart from the stream row so that a read never writes (or locks) it: the servers flush the
-- accesses they saw in batches, and the expiry sweep finds due streams through `due_at`.
CREATE TABLE stream_access (
    tenant          text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    last_access_at  timestamptz NOT NULL,  -- creation, then the latest access recorded
    idle_seconds    bigint,                -- the definition's expiry: one of these two is set
    expires_at      timestamptz,
    due_at          timestamptz NOT NULL,  -- expires_at, or last_access_at + idle_seconds
    PRIMARY KEY (tenant, run_id, stream_id),
    FOREIGN KEY (tenant, run_id, stream_id) REFERENCES streams ON DELETE CASCADE
);

CREATE INDEX stream_access_due_at ON stream_access (due_at);
