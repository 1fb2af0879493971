-- A token minted over HTTP remembers the token that minted it (its `token_id`; NULL for tokens
-- an operator made, and for tokens a JWT minted: a JWT is never stored). Revoking a token
-- revokes every token minted from it, and theirs in turn: a leaked administrator's token could
-- otherwise mint long-lived children that outlast its revocation.
ALTER TABLE api_tokens ADD COLUMN minted_by text;
CREATE INDEX api_tokens_minted_by ON api_tokens (minted_by) WHERE minted_by IS NOT NULL;
