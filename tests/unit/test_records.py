"""Preparing an append body: compact JSON, base64, redaction, the inline size limit."""

from __future__ import annotations

import base64

import msgspec
import pytest

from domain import errors
from domain.definition import MAX_INLINE_RECORD_BYTES, Redaction
from domain.records import REDACTED, RecordInput, RecordKind, fingerprint, prepare_records


def inputs(body: bytes) -> list[RecordInput]:
    return msgspec.json.decode(body, type=list[RecordInput])


def test_json_data_is_stored_compact_and_its_size_is_the_compact_length() -> None:
    [r] = prepare_records(inputs(b'[{"data": { "a" : [1, 2] }}]'), Redaction())
    assert r.payload == b'{"a":[1,2]}' and r.size == 11
    assert r.kind == RecordKind.JSON and r.content_type == "application/json"


def test_base64_data_is_stored_as_its_decoded_bytes() -> None:
    encoded = base64.b64encode(b"\x00\x01\x02").decode()
    [r] = prepare_records([RecordInput(data_base64=encoded, content_type="x/y")], Redaction())
    assert (r.payload, r.size, r.kind, r.content_type) == (b"\x00\x01\x02", 3, 1, "x/y")


@pytest.mark.parametrize(
    "body",
    [b'[{"data": 1, "data_base64": "AA=="}]', b"[{}]", b'[{"data_base64": "not base64!"}]'],
)
def test_a_record_needs_exactly_one_valid_payload(body: bytes) -> None:
    with pytest.raises(errors.InvalidInput):
        prepare_records(inputs(body), Redaction())


def test_a_record_at_the_inline_limit_is_accepted_and_one_byte_more_is_refused() -> None:
    at_limit = b"x" * MAX_INLINE_RECORD_BYTES
    ok = RecordInput(data_base64=base64.b64encode(at_limit).decode())
    over = RecordInput(data_base64=base64.b64encode(at_limit + b"x").decode())
    assert prepare_records([ok], Redaction())[0].size == MAX_INLINE_RECORD_BYTES
    with pytest.raises(errors.RecordTooLarge):
        prepare_records([ok, over], Redaction())


def test_redaction_replaces_each_pointed_value_before_anything_is_stored() -> None:
    body = b'[{"data": {"user": {"ssn": "123", "name": "a/b"}, "list": [0, 1], "k~": 2}}]'
    pointers = ("/user/ssn", "/list/1", "/k~0", "/missing/x", "/list/9")
    [r] = prepare_records(inputs(body), Redaction(json_pointers=pointers))
    stored = msgspec.json.decode(r.payload)
    assert stored == {
        "user": {"ssn": REDACTED, "name": "a/b"},
        "list": [0, REDACTED],
        "k~": REDACTED,
    }
    assert b"123" not in r.payload


def test_the_empty_pointer_redacts_the_whole_document() -> None:
    [r] = prepare_records(inputs(b'[{"data": {"secret": 1}}]'), Redaction(json_pointers=("",)))
    assert msgspec.json.decode(r.payload) == REDACTED


def test_the_fingerprint_is_the_same_for_the_same_records_in_other_whitespace() -> None:
    a = prepare_records(inputs(b'[{"data": {"a": 1}}]'), Redaction())
    b = prepare_records(inputs(b'[{"data":{"a" :1}}]'), Redaction())
    c = prepare_records(inputs(b'[{"data":{"a" :2}}]'), Redaction())
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)


@pytest.mark.parametrize(
    "content_type", [" ", "\t\n", "x/" + "y" * 254, "text", " text/plain", "text/plain\r\n"]
)
@pytest.mark.parametrize("body", [{"data": 1}, {"data_base64": "AA=="}])
def test_a_content_type_must_be_a_media_type_of_at_most_255_characters(body, content_type) -> None:
    ok = RecordInput(data=msgspec.Raw(b"1"))
    [bad] = inputs(msgspec.json.encode([{**body, "content_type": content_type}]))
    with pytest.raises(errors.InvalidInput, match=r"records\[1\]\.content_type"):
        prepare_records([ok, bad], Redaction())


def test_content_types_are_kept_as_given() -> None:
    given = ["text/plain; charset=UTF-8", 'text/x;a="b c"', "x/" + "y" * 253]
    records = [RecordInput(data=msgspec.Raw(b"1"), content_type=c) for c in given]
    assert [r.content_type for r in prepare_records(records, Redaction())] == given


def test_an_empty_content_type_means_the_default() -> None:
    body = b'[{"data": 1, "content_type": ""}, {"data_base64": "AA==", "content_type": ""}]'
    records = prepare_records(inputs(body), Redaction())
    assert [r.content_type for r in records] == ["application/json", "application/octet-stream"]
