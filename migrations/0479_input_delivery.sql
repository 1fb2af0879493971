-- Input streams: the workflow wait service's events (the embedded default adapter), and the
-- index the dispatcher uses to find each stream's lowest undelivered record.
CREATE TABLE workflow_wait_events (
    event_id     text PRIMARY KEY,               -- wds:<tenant>:<runID>:<streamID>:<sequence>
    tenant       text NOT NULL,
    run_id       text NOT NULL,
    stream_id    text NOT NULL,
    sequence     bigint NOT NULL,
    payload      jsonb NOT NULL,
    accepted_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_wait_events_run ON workflow_wait_events (tenant, run_id, stream_id, sequence);

CREATE INDEX input_deliveries_undelivered ON input_deliveries (tenant, run_id, stream_id, sequence)
    WHERE delivered_at IS NULL;
