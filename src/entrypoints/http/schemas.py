"""HTTP request bodies (responses are the application's views)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from domain.definition import MAX_SEQUENCE
from domain.records import RecordInput

Sequence = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQUENCE)]


class AppendBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    records: list[RecordInput]


class AckBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sequence: Sequence


class LegalHoldBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    enabled: bool
    reason: Annotated[str, msgspec.Meta(max_length=1000)] | None = None
