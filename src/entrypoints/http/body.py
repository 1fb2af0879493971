"""The Litestar side of a JSON request body: read it, then decode it as every surface does
(entrypoints/edge/json_body.py: strictly, UTF-8, bounded depth, whole floats as integers)."""

from __future__ import annotations

from typing import TypeVar

from litestar import Request

from entrypoints.edge.json_body import MAX_JSON_DEPTH, decode_json, nests_deeper_than

__all__ = ["MAX_JSON_DEPTH", "decode_body", "decode_json", "nests_deeper_than"]

T = TypeVar("T")


async def decode_body(request: Request, type_: type[T]) -> T:
    return decode_json(await request.body(), type_)
