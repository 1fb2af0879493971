"""The native append (`POST …/runs/{run_id}/streams/{stream_id}/records`), framework-free: the
one body of both ways it is served (`StreamsController.append_records` under Litestar, and
entrypoints/front.py). It decodes the body before the use case checks the caller's scope, and
answers through `JsonAnswer`."""

from __future__ import annotations

from collections.abc import Sequence

from application.access import Caller
from entrypoints.container import Services
from entrypoints.http.answers import JsonAnswer
from entrypoints.http.body import decode_json
from entrypoints.http.schemas import AppendBody

ROUTE = "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"
_REPLAYED = ((b"idempotent-replayed", b"true"),)


async def append(
    services: Services,
    caller: Caller,
    run_id: str,
    stream_id: str,
    body: bytes,
    idempotency_key: str | None,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> JsonAnswer:
    records = decode_json(body, AppendBody).records
    answer, replayed = await services.append_records(
        caller, run_id, stream_id, records, idempotency_key
    )
    if replayed:
        return JsonAnswer(answer, 200, (*_REPLAYED, *extra))
    return JsonAnswer(answer, 201, extra)
