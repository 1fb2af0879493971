-- The runs of the streams a subscription names explicitly, read for a token restricted to runs:
-- a subscription that names another run's stream (linked by `POST .../streams` by a caller not
-- so restricted) is not there for it. At most 1,000 explicit links a subscription; its pattern's
-- links, which may be many more, are passed over.
CREATE INDEX ds_subscription_links_named ON ds_subscription_links (tenant, subscription_id, run_id)
    WHERE explicit;
