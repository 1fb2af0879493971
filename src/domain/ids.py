"""Identifiers: run, stream and consumer IDs share one pattern."""

from __future__ import annotations

import re
import secrets

from domain.errors import InvalidInput

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_ID = re.compile(ID_PATTERN)


def check_id(kind: str, value: str) -> str:
    if not _ID.fullmatch(value):
        raise InvalidInput(
            f"{kind} {value[:140]!r} is not a valid ID: it must match {ID_PATTERN}",
            field=kind,
        )
    return value


def new_stream_id() -> str:
    return "s-" + secrets.token_hex(8)
