-- Migration 487: stream forks. A fork reads its source's records up to `through` without
-- copying them; this link is the reference that keeps the source (row and records) from being
-- erased while the fork exists. A delete (or expiry) of a source with links soft-deletes it
-- (`soft_deleted`: every direct operation answers 410, its ID cannot be created again); the
-- transaction that erases its last fork erases it too, up the chain. The foreign key to the
-- source is the last line of defence: erasing a source some fork still links to fails.
CREATE TABLE stream_forks (
    tenant            text NOT NULL,
    run_id            text NOT NULL,         -- the fork
    stream_id         text NOT NULL,
    source_run_id     text NOT NULL,         -- its source, in the same tenant
    source_stream_id  text NOT NULL,
    source_created_at timestamptz NOT NULL,  -- which incarnation of the source
    through           bigint NOT NULL,       -- the last inherited sequence
    PRIMARY KEY (tenant, run_id, stream_id),
    FOREIGN KEY (tenant, run_id, stream_id) REFERENCES streams ON DELETE CASCADE,
    FOREIGN KEY (tenant, source_run_id, source_stream_id) REFERENCES streams
);

CREATE INDEX stream_forks_source ON stream_forks (tenant, source_run_id, source_stream_id);

-- Read by every page (a soft-deleted stream answers 410 to direct reads); set once, by the
-- transaction that journals its StreamSoftDeleted.
ALTER TABLE streams ADD COLUMN soft_deleted boolean NOT NULL DEFAULT false;
