"""Not part of the default suite (the name does not start with test_): the conformance harness
checked against the Durable Streams reference server (npm @durable-streams/server), in memory
and file-backed. Run it by naming the file:

    python3 dev.py test tests/integration/reference_conformance.py -s

The reference server 0.3.7 fails 6 of the suite's tests (3 sliding-TTL ones, the CORS preflight's
If-None-Match, 2 SSE control-event pairings) and sometimes a 7th (it answers 413 to a 10 MiB
append before reading the body, and the client may see the connection reset first); these
tests check that the harness counts what it ran and reports the failures by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_durable_streams_clients import (
    python_client_scenario,
    run_typescript_client,
)
from tests.integration.test_durable_streams_conformance import SUBSCRIPTIONS, run_suite
from tests.support.node import ReferenceServer, VitestReport

LONG_POLL_SECONDS = 2
KNOWN_FAILURES = {
    "TTL Expiration Behavior > should extend TTL on GET ?offset=now (sliding window)",
    "TTL Expiration Behavior > should extend TTL on close-only POST (sliding window)",
    "TTL Expiration Behavior > should extend TTL on producer close-only POST (sliding window)",
    "Caching and ETag > should allow If-None-Match in CORS preflight responses",
    "SSE Mode > JSON SSE catch-up pairs every data event with a control event",
    "SSE Mode > base64 SSE catch-up pairs every data event with a control event",
}
RACY = {"Chunking and Large Payloads > should handle large payload appropriately"}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("storage", ["memory", "file"])
def test_the_reference_server_fails_only_its_known_failures(storage: str, tmp_path: Path) -> None:
    server = ReferenceServer(
        data_dir=tmp_path / "data" if storage == "file" else None,
        long_poll_ms=LONG_POLL_SECONDS * 1000,
        log_path=tmp_path / "reference.log",
    ).start()
    try:
        # A token is sent (and ignored): the same setup file as against our server.
        report = run_suite(server.base_url, "unused", LONG_POLL_SECONDS, tmp_path / "report.json")
    finally:
        server.stop()
    suite = report.of("conformance.test.mjs")
    print(f"reference server ({storage}, {report.seconds:.0f}s): {VitestReport.summary(suite)}")
    failed = {r.name for r in suite if r.status == "failed"}
    assert KNOWN_FAILURES <= failed <= KNOWN_FAILURES | RACY, sorted(failed)
    skipped = {r.name for r in suite if VitestReport.counts([r])["skipped"]}
    assert skipped == {r.name for r in suite if r.path[:1] == (SUBSCRIPTIONS,)}
    assert VitestReport.counts(suite)["passed"] >= len(suite) - len(skipped) - len(failed)
    assert report.returncode != 0  # vitest itself reports the failures


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    server = ReferenceServer(long_poll_ms=LONG_POLL_SECONDS * 1000).start()
    yield server
    server.stop()


def test_the_typescript_client_check_passes_against_the_reference_server(
    reference: ReferenceServer,
) -> None:
    run_typescript_client(reference.base_url, "unused")


async def test_the_python_client_scenario_passes_against_the_reference_server(
    reference: ReferenceServer,
) -> None:
    steps = await python_client_scenario(reference.base_url, "unused")
    assert steps[-1] == "delete"
