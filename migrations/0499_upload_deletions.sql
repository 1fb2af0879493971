-- An upload arms its body's deletion before its put (a deletion_outbox row of reason 'upload',
-- application/deletions.py). `uploads_under_way` counts the puts that armed it and have not
-- been seen to end; `upload_until` is when none of them can land any more (null once none is
-- under way). A deletion that takes the row over (an abort, expiry, pruning or erasure) runs at
-- once and, while a put may still land, once more at `upload_until`; a done row is kept until
-- then, so that a later deletion still finds it to take over.
ALTER TABLE deletion_outbox
    ADD COLUMN upload_until timestamptz,
    ADD COLUMN uploads_under_way integer NOT NULL DEFAULT 0;
