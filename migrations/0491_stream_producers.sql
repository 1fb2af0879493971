-- Migration 491: idempotent producers (Durable Streams `Producer-Id`) in rows of their own.
-- They were a map in the stream's state snapshot, which every append decodes and writes again:
-- a stream that 1,000 producers had written to carried some 60 KB of them through every append
-- (measured with bench/producers.py: p50 3.3 ms with none, 7.2 ms with 1,000). An append now
-- reads only the rows of the producers its request names, and writes only those. The journal is
-- unchanged: the events still carry each claim, and a journaled snapshot still carries every
-- producer, so replay rebuilds the same state.
CREATE TABLE stream_producers (
    tenant      text NOT NULL,
    run_id      text NOT NULL,
    stream_id   text NOT NULL,
    producer_id text NOT NULL,
    epoch       bigint NOT NULL,
    last_seq    bigint NOT NULL,
    updated_at  timestamptz NOT NULL,  -- its last accepted write: the least recent is forgotten first
    PRIMARY KEY (tenant, run_id, stream_id, producer_id),
    FOREIGN KEY (tenant, run_id, stream_id) REFERENCES streams ON DELETE CASCADE
);

-- Which producer to forget when a new one passes the bound: the least recent, found by index.
CREATE INDEX stream_producers_least_recent
    ON stream_producers (tenant, run_id, stream_id, updated_at);

-- Out of the snapshots, into the rows.
INSERT INTO stream_producers
    (tenant, run_id, stream_id, producer_id, epoch, last_seq, updated_at)
SELECT s.tenant, s.run_id, s.stream_id, p.key, (p.value ->> 'epoch')::bigint,
       (p.value ->> 'last_seq')::bigint, (p.value ->> 'updated_at')::timestamptz
FROM streams s,
     jsonb_each(convert_from(s.state, 'UTF8')::jsonb -> 'producers') AS p
WHERE convert_from(s.state, 'UTF8')::jsonb ? 'producers';

UPDATE streams
SET state = convert_to((convert_from(state, 'UTF8')::jsonb - 'producers')::text, 'UTF8')
WHERE convert_from(state, 'UTF8')::jsonb ? 'producers';
