"""Where each API surface lives, for the edge to tell them apart before any router runs."""

NATIVE_PREFIX = "/api/workflow-streams"
DURABLE_STREAMS_PREFIX = "/api/durable-streams"
STREAM_PATH = "/v1/stream"

# The protocol's subscriptions (`…/__ds/subscriptions/{id}/…`), as the raw path spells them.
SUBSCRIPTION_PATHS = (DURABLE_STREAMS_PREFIX + STREAM_PATH + "/__ds/subscriptions/").encode()


def subscription_parts(raw: bytes) -> tuple[bytes, bytes] | None:
    """A raw subscription path's ID and what follows it (`streams/{path}` for a link), as
    sent (percent-encoded); None for any other path. (An ID holds no `/`.)"""
    if not raw.startswith(SUBSCRIPTION_PATHS):
        return None
    subscription_id, _, rest = raw[len(SUBSCRIPTION_PATHS) :].partition(b"/")
    return subscription_id, rest
