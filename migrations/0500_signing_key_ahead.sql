-- A webhook signing key may be published before it signs (`webhook-key rotate --publish-ahead`):
-- it is in the JWKS from its creation and signs from `sign_after` (null: at once). The keys it
-- replaces keep signing until then and stay published ten minutes more.
ALTER TABLE ds_signing_keys ADD COLUMN sign_after timestamptz;
