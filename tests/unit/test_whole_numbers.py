"""JSON has one number type: `2.0` where an integer is expected is the integer 2 (as JSON Schema
and so the OpenAPI document say), while `2.5` or `"2"` stay refused."""

from __future__ import annotations

import pytest

from domain.definition import DefinitionRequest
from domain.errors import InvalidInput
from domain.objects import ObjectRequest
from entrypoints.edge.checks import check_scope
from entrypoints.http.body import decode_json
from entrypoints.http.schemas import AckBody, AppendBody


def test_a_whole_float_is_an_integer() -> None:
    assert decode_json(b'{"sequence": 141.0}', AckBody).sequence == 141
    definition = decode_json(
        b'{"direction": "output", "retention": {"max_records": 77539.0}}', DefinitionRequest
    )
    assert definition.retention.max_records == 77539
    prepare = decode_json(
        b'{"idempotency_key": "k", "size": 3.0, "sha256": "' + b"0" * 64 + b'"}', ObjectRequest
    )
    assert prepare.size == 3 and isinstance(prepare.size, int)


@pytest.mark.parametrize(
    "body",
    [
        b'{"sequence": 141.5}',
        b'{"sequence": "141"}',
        b'{"sequence": 1e300}',
        b'{"sequence": -1.0}',
        # Whole as floats, not as written: an ack of 4.99…9 (twenty nines) acknowledged 5.
        b'{"sequence": 4.99999999999999999999}',
        b'{"sequence": 9007199254740993.0}',
    ],
)
def test_other_numbers_and_strings_are_still_refused(body: bytes) -> None:
    with pytest.raises(InvalidInput):
        decode_json(body, AckBody)


def test_a_record_body_is_untouched_by_it() -> None:
    with pytest.raises(InvalidInput):
        decode_json(b'{"records": [{"data": {"a": 2.0}, "data_base64": 2.0}]}', AppendBody)


@pytest.mark.parametrize(
    ("query", "refused"),
    [
        (b"cursor=4.99999999999999999999", True),  # read as 5.0: record 5 was skipped
        (b"cursor=9007199254740993.0", True),
        (b"limit=1.00000000000000000001", True),
        (b"limit=1.5", False),  # the framework refuses it, with the parameter's bounds
        (b"cursor=4.0&limit=1e2", False),  # whole as written: the framework takes them
        (b"cursor=abc", False),  # no number: the framework says what it must be
        (b"prefix=r1.5", False),  # not an integer parameter
        # Digits alone are read exactly: judged by their range, whatever else the query holds
        # (a point or an `e` elsewhere once had them held to 2^53).
        (b"cursor=9223372036854775806&wait=0.2", False),
        (b"cursor=9223372036854775806&x=e", False),
    ],
)
def test_an_integer_query_parameter_is_whole_as_written(query: bytes, refused: bool) -> None:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/api/workflow-streams/runs/r/streams/s/records",
        "raw_path": b"/api/workflow-streams/runs/r/streams/s/records",
        "query_string": query,
        "headers": [],
    }
    if refused:
        with pytest.raises(InvalidInput) as raised:
            check_scope(scope)
        assert raised.value.extra["field"] in ("cursor", "limit")
    else:
        check_scope(scope)
    # The Durable Streams surface's `cursor` is the protocol's: a decimal of any length.
    protocol = {**scope, "raw_path": b"/api/durable-streams/v1/stream/r/s"}
    protocol["path"] = protocol["raw_path"].decode()
    check_scope({**protocol, "query_string": b"offset=now&live=long-poll&cursor=" + b"9" * 30})
