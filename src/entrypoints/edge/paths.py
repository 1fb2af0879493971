"""Where each API surface lives, for the edge to tell them apart before any router runs."""

NATIVE_PREFIX = "/api/workflow-streams"
DURABLE_STREAMS_PREFIX = "/api/durable-streams"
STREAM_PATH = "/v1/stream"
