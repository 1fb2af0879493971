"""The sans-IO core both clients share: what to send, how to read the answer, when to retry.

Nothing here does I/O. An operation is a *flow*: a generator that yields `Call`s and is sent
back each call's decoded result (or has the call's `StreamsError` thrown into it), and returns
the operation's result. `StreamsClient` (asyncio) and `SyncStreamsClient` (threads) are thin
drivers that run flows over an httpx client. One module per idea:

- `exchange`: the `Call`, the retry rules and `Exchange`, the one retry loop both drivers step;
- `wire`: the service's paths and ceilings, record encoding, the clients' `Settings`;
- `flows`: the operations on streams, runs, tokens, records and consumers;
- `subscriptions`: the wake subscriptions' operations and the webhook signing keys;
- `objects`: object uploads (`Upload`, `ObjectSource`, `put_object`) and the digest check;
- `follow`: the server-sent events decoder and `Follower`, the subscription state machine;
- `batching`: `Batcher`, the producer's batching rules.

This package re-exports what the clients and the producer use."""

from ductor_streams_client._core.batching import Batch, Batcher
from ductor_streams_client._core.exchange import (
    Call,
    Exchange,
    Flow,
    Retry,
    RetryPolicy,
    undecodable,
)
from ductor_streams_client._core.flows import (
    ack,
    append,
    append_encoded,
    close,
    create_stream,
    delete_consumer,
    delete_run,
    delete_stream,
    get_stream,
    list_consumers,
    list_runs,
    list_streams,
    list_tokens,
    mint_token,
    read,
    revoke_token,
    set_legal_hold,
    usage,
)
from ductor_streams_client._core.follow import Follower
from ductor_streams_client._core.objects import (
    BodyCheck,
    Upload,
    abort_object,
    get_object,
    get_object_body,
    list_open_objects,
    object_source,
    put_object,
)
from ductor_streams_client._core.subscriptions import (
    claim_subscription,
    delete_subscription,
    get_subscription,
    link_subscription_streams,
    put_subscription,
    release_subscription,
    stream_subscriptions,
    unlink_subscription_stream,
    wake_ack,
    webhook_jwks,
)
from ductor_streams_client._core.wire import (
    API_PREFIX,
    CHUNK,
    MAX_INLINE_RECORD_BYTES,
    Progress,
    Settings,
    encode_record,
    stored_size,
    stream_path,
)

__all__ = [
    "API_PREFIX",
    "CHUNK",
    "MAX_INLINE_RECORD_BYTES",
    "Batch",
    "Batcher",
    "BodyCheck",
    "Call",
    "Exchange",
    "Flow",
    "Follower",
    "Progress",
    "Retry",
    "RetryPolicy",
    "Settings",
    "Upload",
    "abort_object",
    "ack",
    "append",
    "append_encoded",
    "claim_subscription",
    "close",
    "create_stream",
    "delete_consumer",
    "delete_run",
    "delete_stream",
    "delete_subscription",
    "encode_record",
    "get_object",
    "get_object_body",
    "get_stream",
    "get_subscription",
    "link_subscription_streams",
    "list_consumers",
    "list_open_objects",
    "list_runs",
    "list_streams",
    "list_tokens",
    "mint_token",
    "object_source",
    "put_object",
    "put_subscription",
    "read",
    "release_subscription",
    "revoke_token",
    "set_legal_hold",
    "stored_size",
    "stream_path",
    "stream_subscriptions",
    "undecodable",
    "unlink_subscription_stream",
    "usage",
    "wake_ack",
    "webhook_jwks",
]
