"""Request bodies are decoded strictly by msgspec: wrong types and unknown fields are refused,
never coerced."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from litestar import Request
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from domain.errors import InvalidInput

T = TypeVar("T")

_decoders: dict[type, msgspec.json.Decoder] = {}


DRAIN_LIMIT = 64 * 1024 * 1024


async def decode_body(request: Request, type_: type[T]) -> T:
    try:
        body = await request.body()
    except RequestEntityTooLarge:
        await drain(request)
        raise
    return decode_json(body, type_)


async def drain(request: Request) -> None:
    """Read and discard what the client is still sending (up to a bound), chunk by chunk, so a
    client that writes its whole body before reading gets the 413 instead of a reset."""
    discarded = 0
    while discarded < DRAIN_LIMIT:
        message = await request.receive()
        if message["type"] != "http.request":
            return
        discarded += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def decode_json(body: bytes, type_: type[T]) -> T:
    if not body.strip():
        raise InvalidInput("a JSON request body is required")
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as error:
        raise InvalidInput(f"the request body is not valid: {error}") from None
    except msgspec.DecodeError as error:
        raise InvalidInput(f"the request body is not valid JSON: {error}") from None
