"""DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS: a day by default, and only a positive window."""

from __future__ import annotations

import pytest

from entrypoints.config import InvalidSetting, Settings


def test_the_window_is_a_day_by_default_and_may_be_set() -> None:
    assert Settings.from_env({}).idempotency_window_seconds == 86400
    given = {"DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS": "1.5"}
    assert Settings.from_env(given).idempotency_window_seconds == 1.5


@pytest.mark.parametrize("value", ["0", "-5", "a day"])
def test_a_window_that_is_not_positive_stops_the_process_naming_it(value: str) -> None:
    with pytest.raises(InvalidSetting, match="DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS"):
        Settings.from_env({"DUCTOR_STREAMS_IDEMPOTENCY_WINDOW_SECONDS": value})
