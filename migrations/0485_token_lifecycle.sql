-- Migration 485: a token's lifecycle. Each token gets a stable public id, derived from its hash
-- (so every existing row has one): `tok_` and the hex of the hash's first 8 bytes. The id is
-- what `token list` shows and `token revoke` accepts; it never reveals the token. A token may
-- expire (expires_at) and may be revoked (revoked_at); lookups refuse both, judged with now().
ALTER TABLE api_tokens
    ADD COLUMN token_id text NOT NULL
        GENERATED ALWAYS AS ('tok_' || encode(substring(token_hash FROM 1 FOR 8), 'hex')) STORED,
    ADD COLUMN expires_at timestamptz NULL,
    ADD COLUMN revoked_at timestamptz NULL;

CREATE UNIQUE INDEX api_tokens_token_id ON api_tokens (token_id);
-- `token list --tenant T`.
CREATE INDEX api_tokens_tenant ON api_tokens (tenant, created_at);
