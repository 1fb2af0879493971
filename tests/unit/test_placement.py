"""Placement pins are enforced, not just stored."""

from __future__ import annotations

import msgspec
import pytest

from application.access import Caller
from application.placement import EgressRegionDenied, Misdirected
from domain.definition import DefinitionRequest
from domain.errors import InvalidInput
from domain.records import RecordInput
from entrypoints.config import Settings
from entrypoints.container import memory_container, start, stop

ALICE = Caller(
    tenant="acme",
    principal="alice",
    scopes=frozenset({"streams:read", "streams:write", "streams:admin"}),
)


@pytest.fixture
async def services():
    container = memory_container(Settings(region="eu", egress_region="eu-clients"))
    built = await start(container)
    yield built
    await stop(container)


def request(placement: dict) -> DefinitionRequest:
    return msgspec.convert(
        {"direction": "output", "stream_id": "s", "placement": placement}, DefinitionRequest
    )


async def test_a_stream_homed_elsewhere_is_misdirected(services) -> None:
    with pytest.raises(Misdirected) as refused:
        await services.create_stream(ALICE, "r", request({"metadata_home": "us"}))
    assert refused.value.extra["metadata_home"] == "us"
    with pytest.raises(InvalidInput):  # the run ID is checked before the placement
        await services.create_stream(ALICE, "bad run", request({"metadata_home": "us"}))


async def test_a_replica_region_serves_the_stream(services) -> None:
    placement = {"metadata_home": "us", "metadata_replicas": ["eu"]}
    document, created = await services.create_stream(ALICE, "r", request(placement))
    assert created and document.placement.metadata_home == "us"
    await services.get_stream(ALICE, "r", "s")


async def test_data_is_delivered_only_to_pinned_egress_regions(services) -> None:
    placement = {"client_egress_regions": ["us-clients"]}
    await services.create_stream(ALICE, "r", request(placement))
    record = RecordInput(data=msgspec.Raw(b"1"))
    await services.append_records(ALICE, "r", "s", [record])  # writing is not egress
    await services.get_stream(ALICE, "r", "s")  # nor is the definition
    with pytest.raises(EgressRegionDenied):
        await services.read_records(ALICE, "r", "s")
    with pytest.raises(EgressRegionDenied):
        await services.subscribe(ALICE, "r", "s", 0)
