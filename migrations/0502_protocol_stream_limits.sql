-- Migration 502: a Durable Streams stream has no unread ceiling.
-- A stream created through the protocol (its definition has a content type) took the native
-- default limits, and the protocol has no way to acknowledge: with no consumer holding credit
-- every record counts as unread, so once it held 10,000 records or 64 MiB every append was 429
-- for good. Such streams are now created with the largest ceiling the native API allows; this
-- gives it to those created before whose ceiling is still the old default (a ceiling a caller
-- chose is kept). The same PUT of such a stream again then matches it as it would a new one.
-- Only the definition is changed; the journal keeps what the creation said.
UPDATE streams
SET definition = convert_to(
        jsonb_set(
            jsonb_set(convert_from(definition, 'UTF8')::jsonb,
                      '{limits,max_unread_items}', '9007199254740991'),
            '{limits,max_unread_bytes}', '9007199254740991'
        )::text,
        'UTF8'
    )
WHERE convert_from(definition, 'UTF8')::jsonb ->> 'content_type' IS NOT NULL
  AND convert_from(definition, 'UTF8')::jsonb -> 'limits' -> 'max_unread_items' = '10000'
  AND convert_from(definition, 'UTF8')::jsonb -> 'limits' -> 'max_unread_bytes' = '67108864';
