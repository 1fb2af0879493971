"""The Durable Streams conformance suite (npm @durable-streams/server-conformance-tests, run by
vitest from tests/conformance) against a real server process on real PostgreSQL, every request
with the Bearer token. It installs the npm packages first when needed (`npm ci`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.node import VitestReport, run_vitest
from tests.support.server import ServerProcess, WorkerProcess

# The server's long-poll timeout, passed to the suite too: it waits for a long poll that long
# (plus a second) instead of its default 20 s.
LONG_POLL_SECONDS = 3
SUBSCRIPTIONS = "Reserved subscription APIs"  # the suite's optional group, off unless asked
EXPECTED_PASSED = 338  # everything, the subscription group included, in 0.3.6

DS_SERVER_ENV = {
    **SERVER_ENV,
    "DUCTOR_STREAMS_CORS_ORIGINS": "https://example.com",
    "DUCTOR_STREAMS_LONG_POLL_SECONDS": str(LONG_POLL_SECONDS),
}
# The worker that delivers the subscription group's webhooks and wake events.
DS_WORKER_ENV = {**DS_SERVER_ENV, "DUCTOR_STREAMS_SUBSCRIPTION_POLL_SECONDS": "0.05"}


@pytest.fixture(scope="module")
def ds_server(
    own_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    data_dir = tmp_path_factory.mktemp("conformance")
    process = ServerProcess(database_url=own_database, data_dir=data_dir, env=DS_SERVER_ENV)
    worker = WorkerProcess(database_url=own_database, data_dir=data_dir, env=DS_WORKER_ENV)
    process.start()
    try:
        worker.start()
    except BaseException:
        process.stop()
        raise
    yield process
    worker.stop()
    process.stop()


def run_suite(
    base_url: str,
    token: str | None,
    long_poll_seconds: float,
    out: Path,
    subscriptions: bool = False,
) -> VitestReport:
    env = {
        "DS_BASE_URL": base_url,
        "DS_LONG_POLL_TIMEOUT_MS": str(int(long_poll_seconds * 1000)),
        "DS_SUBSCRIPTIONS": "1" if subscriptions else "0",
    }
    if token:
        env["DS_TOKEN"] = token
    return run_vitest(["conformance.test.mjs", "fetch-auth.test.mjs"], env, out)


def check(report: VitestReport) -> None:
    """The setup file's own tests pass; the suite: nothing failed, nothing skipped (the
    subscription group runs), and EXPECTED_PASSED passed."""
    suite = report.of("conformance.test.mjs")
    setup = report.of("fetch-auth.test.mjs")
    print(f"conformance suite ({report.seconds:.0f}s): {VitestReport.summary(suite)}")
    print(f"setup file's tests: {VitestReport.summary(setup)}")
    assert setup and all(r.status == "passed" for r in setup), VitestReport.summary(setup)
    counts = VitestReport.counts(suite)
    failed = [r.name for r in suite if r.status == "failed"]
    assert not failed, VitestReport.summary(suite)
    skipped = {r.name for r in suite if VitestReport.counts([r])["skipped"]}
    subscriptions = {r.name for r in suite if r.path[:1] == (SUBSCRIPTIONS,)}
    assert subscriptions, "the suite has no subscription group any more: revisit this test"
    assert all(r.status == "passed" for r in suite if r.name in subscriptions)
    assert not skipped, sorted(skipped)
    assert counts["passed"] == EXPECTED_PASSED, VitestReport.summary(suite)


@pytest.mark.timeout(1200)  # the suite runs for minutes (its TTL tests wait out real time)
def test_the_conformance_suite_passes_against_our_server(
    ds_server: ServerProcess, tmp_path: Path
) -> None:
    report = run_suite(
        ds_server.base_url + "/api/durable-streams",
        BOOTSTRAP_TOKEN,
        LONG_POLL_SECONDS,
        tmp_path / "conformance.json",
        subscriptions=True,
    )
    check(report)
