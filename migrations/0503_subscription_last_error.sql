-- A failing subscription says why: the last failed attempt's error (a webhook's status or
-- connection error, a wake stream's refusal), set with `failing` and cleared with it. Shown to
-- those who configure subscriptions (docs/http-api.md, "Subscriptions").
ALTER TABLE ds_subscriptions ADD COLUMN last_error text;
