"""Webhook delivery across a PostgreSQL restart: the wakes are in PostgreSQL, so a restart
while deliveries are pending and failing loses none, and every stream ends acknowledged at its
tail (a PostgreSQL of the module's own, as the outage tests do)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest

from tests.integration.test_webhook_delivery import (  # noqa: F401  # the module's fixture
    Deployment,
    deployment,
    wait_for,
)
from tests.support.postgres import create_test_database
from tests.support.restartable_postgres import RestartablePostgres, restartable_postgres

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[RestartablePostgres]:
    with restartable_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def own_database(own_postgres: RestartablePostgres) -> str:
    url, _ = asyncio.run(create_test_database(own_postgres.url))
    return url


def test_a_postgres_restart_loses_no_wake(
    deployment: Deployment,  # noqa: F811
    own_postgres: RestartablePostgres,
) -> None:
    run = "pgr-" + secrets.token_hex(3)
    sub = deployment.subscribe(deployment.receiver.url(run, fail=3, done=1), f"{run}/*")
    paths = [f"{run}/s{i}" for i in range(3)]
    for path in paths:
        deployment.write(path, {"n": 1})
    wait_for(lambda: deployment.receiver.entries(run))  # failing: the wake is being retried
    own_postgres.restart()
    for path in paths:
        wait_for(lambda path=path: _appended(deployment, path), 30)
    tails = {path: deployment.tail(path) for path in paths}
    wait_for(
        lambda: (
            {s["path"]: s["acked_offset"] for s in deployment.subscription(sub["id"])["streams"]}
            == tails
        ),
        60,
    )


def _appended(at: Deployment, path: str) -> bool:
    try:
        at.write(path, {"n": 2}, create=False)
    except Exception:  # PostgreSQL is still coming back
        return False
    return True
