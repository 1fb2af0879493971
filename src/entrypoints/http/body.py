"""Request bodies are decoded strictly by msgspec: wrong types and unknown fields are refused,
never coerced."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from litestar import Request

from domain.errors import InvalidInput

T = TypeVar("T")

_decoders: dict[type, msgspec.json.Decoder] = {}


async def decode_body(request: Request, type_: type[T]) -> T:
    return decode_json(await request.body(), type_)


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
