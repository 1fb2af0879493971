-- Migration 492: a token may be restricted to some of its tenant's runs (NULL: every run). A
-- run-restricted token sees every other run as not found, exactly as another tenant's.
ALTER TABLE api_tokens ADD COLUMN runs text[] NULL;
