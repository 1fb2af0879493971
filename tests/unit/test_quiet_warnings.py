"""An outage's 503s are logged at most once a second per backing service, the rest counted."""

from __future__ import annotations

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
        "the database is unavailable (Unanswered) on POST /c, and was for 500 other requests "
        "since the last warning",
        "the database is unavailable (Unanswered) on GET /d",
    ]
