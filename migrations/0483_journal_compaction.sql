-- Migration 483: snapshots bound the journal. A `stream_snapshot` event carries the whole state,
-- so every journal row of the stream below it can go. The write that journals a snapshot also
-- upserts the stream's compaction job here (one row per stream, `through_version` = its latest
-- snapshot); workers claim due rows with FOR UPDATE SKIP LOCKED and a lease, like
-- retention_jobs, and delete the journal below `through_version` in bounded batches.
CREATE TABLE journal_compaction_jobs (
    tenant          text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    through_version bigint NOT NULL,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,
    lease_until     timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    PRIMARY KEY (tenant, run_id, stream_id)
);
CREATE INDEX journal_compaction_jobs_due ON journal_compaction_jobs (next_attempt_at);

-- The journal a reader gets starts at the latest snapshot: found without reading the others.
CREATE INDEX stream_events_snapshots ON stream_events (tenant, run_id, stream_id, version)
    WHERE type = 'stream_snapshot';
