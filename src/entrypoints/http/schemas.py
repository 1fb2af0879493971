"""HTTP request bodies (responses are the application's views)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from domain.definition import MAX_BATCH_RECORDS, MAX_INLINE_RECORD_BYTES, MAX_SEQUENCE
from domain.records import RecordInput
from domain.text import DOCUMENTED_MEDIA_TYPE, DOCUMENTED_TEXT

Sequence = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQUENCE)]


# What prepare_records checks, documented (extra_json_schema) and left for it to answer.
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
Record = Annotated[
    RecordInput,
    msgspec.Meta(
        extra_json_schema={
            "oneOf": [
                {"required": ["data"], "not": {"required": ["data_base64"]}},
                {"required": ["data_base64"], "not": {"required": ["data"]}},
            ],
            "properties": {
                "data_base64": {
                    "pattern": _BASE64,
                    "maxLength": (MAX_INLINE_RECORD_BYTES + 2) // 3 * 4,
                },
                # Left out or empty: the kind's default.
                "content_type": {"anyOf": [{"const": ""}, DOCUMENTED_MEDIA_TYPE.extra_json_schema]},
            },
        }
    ),
]


class AppendBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    records: Annotated[
        list[Record],
        msgspec.Meta(extra_json_schema={"minItems": 1, "maxItems": MAX_BATCH_RECORDS}),
    ]


class AckBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sequence: Sequence


class LegalHoldBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    enabled: bool
    reason: Annotated[str, msgspec.Meta(max_length=1000), DOCUMENTED_TEXT] | None = None
