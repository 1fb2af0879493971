-- One retention job per stream that pins a retention policy. Workers claim due rows with
-- FOR UPDATE SKIP LOCKED and a lease, so a killed worker's claim is taken over when it expires.
CREATE TABLE retention_jobs (
    tenant          text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,
    lease_until     timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    PRIMARY KEY (tenant, run_id, stream_id)
);
CREATE INDEX retention_jobs_due ON retention_jobs (next_attempt_at);
