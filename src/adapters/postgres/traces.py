"""Which span appended which sequences, told to every process while tracing is on.

A committing transaction that appended sends, before its wake notification, `NOTIFY
ductor_streams_traces, '<origin> <tenant>/<run>/<stream> <first> <last> <traceparent>'`; each
process's wake bus hears it and records it in `application.tracing.APPENDS`, so a follower or a
dispatcher in another process than the one that committed links its span to the append's trace.
A channel of its own, not a field of the wake notification: processes that do not trace never
hear it, and the wake's payload, which every running replica parses strictly, stays as it is.
`origin` names the sending process, which skips its own (it recorded the requests' spans
already, more precisely)."""

from __future__ import annotations

import secrets

from application import tracing
from domain.stream import StreamKey

TRACES_CHANNEL = "ductor_streams_traces"
ORIGIN = secrets.token_hex(6)  # this process


def trace_announcement(key: StreamKey, first: int, last: int, traceparent: str) -> str:
    return f"{ORIGIN} {key.tenant}/{key.run_id}/{key.stream_id} {first} {last} {traceparent}"


def heard_trace(payload: str) -> None:
    """Record an announcement of another process (a malformed one is ignored)."""
    parts = payload.split(" ")
    if len(parts) != 5 or parts[0] == ORIGIN or not (parts[2].isdigit() and parts[3].isdigit()):
        return
    path = parts[1].split("/")
    context = tracing.from_traceparent(parts[4])
    if len(path) != 3 or context is None:
        return
    tracing.APPENDS.appended(StreamKey(*path), int(parts[2]), int(parts[3]), context)
