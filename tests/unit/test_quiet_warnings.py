"""An outage's 503s are logged at most once a second per backing service, the rest told in one
line at the end of that second."""

from __future__ import annotations

import asyncio

import pytest

from entrypoints.edge.problems import QuietWarnings


def test_one_warning_a_second_per_service_the_requests_between_counted_in_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    quiet = QuietWarnings(1.0, clock=lambda: now[0])
    caplog.set_level("WARNING", logger="ductor_streams.http")
    for _ in range(500):
        quiet.warn("the database", "Unanswered", "GET", "/a")
    quiet.warn("the object store", "ClientError", "PUT", "/b")  # another service: its own
    now[0] += 0.5
    quiet.warn("the database", "Unanswered", "GET", "/a")
    now[0] += 0.6
    quiet.warn("the database", "Unanswered", "POST", "/c")
    now[0] += 5.0
    quiet.warn("the database", "Unanswered", "GET", "/d")
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "the database is unavailable (Unanswered) on GET /a",
        "the object store is unavailable (ClientError) on PUT /b",
        "the database was unavailable for 500 more requests in the last 1 s",
        "the database is unavailable (Unanswered) on POST /c",
        "the database is unavailable (Unanswered) on GET /d",
    ]


async def test_the_requests_held_back_are_told_at_the_end_of_their_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet = QuietWarnings(0.05)
    caplog.set_level("WARNING", logger="ductor_streams.http")
    for _ in range(30):
        quiet.warn("the database", "Unanswered", "GET", "/a")
    await asyncio.sleep(0.1)  # no later warning: the count is told all the same, in time
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "the database is unavailable (Unanswered) on GET /a",
        "the database was unavailable for 29 more requests in the last 0.05 s",
    ]
