-- `GET /tokens` reads a tenant's tokens a page at a time, by creation: those whose
-- (created_at, token_id) follows the `after` token's, in that order. This index answers it as
-- one range read in order, however many tokens the tenant has (and `token list`'s order too); it
-- replaces the one on (tenant, created_at), its prefix, which left ties to a sort.
CREATE INDEX api_tokens_tenant_created ON api_tokens (tenant, created_at, token_id);
DROP INDEX api_tokens_tenant;
