"""Definitions: defaults from the deployment, validation of what types cannot say."""

from __future__ import annotations

import msgspec
import pytest

from domain import errors
from domain.definition import DefinitionRequest, resolve_definition


def resolve(body: bytes, region: str = "eu", egress: str = "eu-edge"):
    request = msgspec.json.decode(body, type=DefinitionRequest)
    return resolve_definition(request, region=region, egress_region=egress)


def test_only_direction_is_required_and_the_rest_takes_the_deployment_defaults() -> None:
    d = resolve(b'{"direction": "output"}')
    assert d.stream_id.startswith("s-")
    assert d.content_class == "application_data"
    assert d.limits.max_unread_items == 10_000 and d.limits.unread_policy == "reject"
    assert d.placement.metadata_home == "eu" and d.placement.object_regions == ("eu",)
    assert d.placement.client_egress_regions == ("eu-edge",) and d.placement.log_region == "eu"
    assert d.authorization.readers == ("*",)


def test_raw_model_reasoning_is_refused_with_its_own_error() -> None:
    with pytest.raises(errors.ContentClassForbidden):
        resolve(b'{"direction": "output", "content_class": "model_reasoning_raw"}')


@pytest.mark.parametrize(
    "body",
    [
        b'{"direction": "output", "content_class": "poetry"}',
        b'{"direction": "output", "stream_id": "-bad"}',
        b'{"direction": "output", "redaction": {"json_pointers": ["no-slash"]}}',
        b'{"direction": "output", "redaction": {"json_pointers": ["/a~2b"]}}',
        b'{"direction": "output", "redaction": {"json_pointers": ["/a~"]}}',
        b'{"direction": "output", "placement": {"object_regions": []}}',
    ],
)
def test_invalid_definitions_are_refused(body: bytes) -> None:
    with pytest.raises(errors.InvalidInput):
        resolve(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"direction": "sideways"}',
        b'{"direction": "output", "limits": {"max_unread_items": 0}}',
        b'{"direction": "output", "limits": {"unread_policy": "maybe"}}',
        b'{"direction": "output", "surprise": 1}',
        b'{"stream_id": "x"}',
    ],
)
def test_types_and_unknown_fields_are_checked_by_decoding(body: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        resolve(body)


@pytest.mark.parametrize(
    "at", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-00:01"]
)
def test_an_expiry_beyond_the_calendar_in_utc_is_invalid_input(at: str) -> None:
    body = msgspec.json.encode({"direction": "output", "expiry": {"expires_at": at}})
    with pytest.raises(errors.InvalidInput):
        resolve(body)


@pytest.mark.parametrize("field", ["metadata_replicas", "object_regions", "client_egress_regions"])
def test_a_placement_list_names_at_most_64_regions(field: str) -> None:
    """A stream's definition is read whole by each of its requests and listings: unbounded
    placement lists made definitions of 8 MB (120,000 regions)."""
    regions = [f"r{n}" for n in range(65)]
    body = msgspec.json.encode({"direction": "output", "placement": {field: regions}})
    with pytest.raises(msgspec.ValidationError, match="length <= 64"):
        resolve(body)
    body = msgspec.json.encode({"direction": "output", "placement": {field: regions[:64]}})
    assert len(getattr(resolve(body).placement, field)) == 64


def test_a_stored_pointer_made_before_the_escape_check_still_redacts_appends() -> None:
    """A definition made before `~` had to be followed by 0 or 1 keeps taking appends: the
    check refuses such a pointer in a definition being made, not in one stored."""
    import msgspec

    from domain.definition import Redaction
    from domain.records import RecordInput, prepare_records

    record = RecordInput(data=msgspec.Raw(b'{"a~2b": "secret", "c": 1}'))
    [prepared] = prepare_records([record], Redaction(json_pointers=("/a~2b",)))
    assert b"secret" not in prepared.payload and b"[REDACTED]" in prepared.payload
