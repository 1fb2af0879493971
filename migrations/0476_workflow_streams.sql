-- Migration 476: stream records, append receipts, consumers, object intents, input delivery,
-- deletion outboxes and gap evidence, with the stream rows, their journal and API tokens.
-- Every table keys on (tenant, run_id) first so the schema can be distributed by run.

CREATE TABLE api_tokens (
    token_hash   bytea PRIMARY KEY,            -- SHA-256 of the token; the token itself is never stored
    tenant       text NOT NULL,
    principal    text NOT NULL,
    scopes       text[] NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per stream: the immutable definition, the snapshot of the aggregate's state, and the
-- columns readers need without decoding it. Appends, acks, close and legal hold lock this row.
CREATE TABLE streams (
    tenant       text NOT NULL,
    run_id       text NOT NULL,
    stream_id    text NOT NULL,
    definition   bytea NOT NULL,
    created_at   timestamptz NOT NULL,
    version      bigint NOT NULL,
    head         bigint NOT NULL DEFAULT 0,
    earliest     bigint NOT NULL DEFAULT 1,
    closed       boolean NOT NULL DEFAULT false,
    legal_hold   boolean NOT NULL DEFAULT false,
    state        bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, stream_id)
);

-- The journal: every event the aggregate emitted, in version order. Replaying it rebuilds `state`.
CREATE TABLE stream_events (
    tenant       text NOT NULL,
    run_id       text NOT NULL,
    stream_id    text NOT NULL,
    version      bigint NOT NULL,
    type         text NOT NULL,
    payload      bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, stream_id, version)
);

-- Stream records. `end_offset` is the cumulative byte count through this record, so unread bytes
-- after any acknowledgement is one subtraction.
CREATE TABLE stream_records (
    tenant       text NOT NULL,
    run_id       text NOT NULL,
    stream_id    text NOT NULL,
    sequence     bigint NOT NULL,
    appended_at  timestamptz NOT NULL,
    kind         smallint NOT NULL,            -- 0 JSON, 1 bytes, 2 object reference
    content_type text NOT NULL,
    size         integer NOT NULL,
    end_offset   bigint NOT NULL,
    payload      bytea NOT NULL,
    PRIMARY KEY (tenant, run_id, stream_id, sequence)
);

-- Append receipts: an idempotency key's request fingerprint and the answer it got.
CREATE TABLE append_receipts (
    tenant          text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    idempotency_key text NOT NULL,
    fingerprint     bytea NOT NULL,
    answer          bytea NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, run_id, stream_id, idempotency_key)
);

-- Consumers and their acknowledgements (also held in the stream's snapshot, which credit uses).
CREATE TABLE stream_consumers (
    tenant         text NOT NULL,
    run_id         text NOT NULL,
    stream_id      text NOT NULL,
    consumer_id    text NOT NULL,
    principal      text NOT NULL,
    acked_sequence bigint NOT NULL,
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant, run_id, stream_id, consumer_id)
);

-- Large-object intents: prepared -> uploaded -> committed, or aborted / expired.
CREATE TABLE object_intents (
    tenant          text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    object_id       text NOT NULL,
    idempotency_key text NOT NULL,
    state           text NOT NULL,
    size            bigint NOT NULL,
    sha256          bytea NOT NULL,
    content_type    text NOT NULL,
    schema          bytea,
    storage_region  text NOT NULL,
    storage_key     text NOT NULL,
    receipt         bytea NOT NULL,            -- the authorization receipt: principal, scopes, when
    expires_at      timestamptz NOT NULL,
    sequence        bigint,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (tenant, run_id, stream_id, object_id),
    UNIQUE (tenant, run_id, stream_id, idempotency_key)
);

-- Worker queues share one lease shape: claimed_by, lease_until, attempts, next_attempt_at,
-- last_error, so a killed worker's claims are taken over when its lease runs out.
CREATE TABLE input_deliveries (
    tenant          text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    sequence        bigint NOT NULL,
    delivered_at    timestamptz,
    claimed_by      text,
    lease_until     timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    PRIMARY KEY (tenant, run_id, stream_id, sequence)
);
CREATE INDEX input_deliveries_pending ON input_deliveries (next_attempt_at) WHERE delivered_at IS NULL;

CREATE TABLE deletion_outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant          text NOT NULL,
    run_id          text NOT NULL,
    stream_id       text NOT NULL,
    storage_region  text NOT NULL,
    storage_key     text NOT NULL,
    reason          text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    done_at         timestamptz,
    claimed_by      text,
    lease_until     timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text
);
CREATE INDEX deletion_outbox_pending ON deletion_outbox (next_attempt_at) WHERE done_at IS NULL;

-- Gap evidence: a live delivery that skipped sequences, and when the gap was repaired from here.
CREATE TABLE gap_evidence (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant        text NOT NULL,
    run_id        text NOT NULL,
    stream_id     text NOT NULL,
    expected      bigint NOT NULL,
    seen          bigint NOT NULL,
    detected_by   text NOT NULL,
    repaired_at   timestamptz NOT NULL DEFAULT now()
);
