"""The storage cleanup settings: a day's age for rows and uploads, a sweep every five minutes,
only positive values, and the sweeps they wire."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoints.config import InvalidSetting, Settings
from entrypoints.container import upload_sweep_name

NAMES = (
    "DUCTOR_STREAMS_CLEANUP_AGE_SECONDS",
    "DUCTOR_STREAMS_UPLOAD_ABANDONED_SECONDS",
    "DUCTOR_STREAMS_CLEANUP_INTERVAL_SECONDS",
)


def test_the_defaults_and_set_values() -> None:
    default = Settings.from_env({})
    assert (
        default.cleanup_age_seconds,
        default.upload_abandoned_seconds,
        default.cleanup_interval_seconds,
    ) == (86400, 86400, 300)
    given = Settings.from_env(dict(zip(NAMES, ("1", "2.5", "0.2"), strict=True)))
    assert (
        given.cleanup_age_seconds,
        given.upload_abandoned_seconds,
        given.cleanup_interval_seconds,
    ) == (1, 2.5, 0.2)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_value_that_is_not_positive_stops_the_process_naming_it(name: str, value: str) -> None:
    with pytest.raises(InvalidSetting, match=name):
        Settings.from_env({name: value})


def test_the_upload_sweep_is_one_per_directory_or_bucket() -> None:
    here = upload_sweep_name(Settings(data_dir=Path("/srv/a")))
    assert here != upload_sweep_name(Settings(data_dir=Path("/srv/b")))
    bucket = Settings(object_store="s3", s3_bucket="bodies", data_dir=Path("/srv/a"))
    assert upload_sweep_name(bucket) == upload_sweep_name(
        Settings(object_store="s3", s3_bucket="bodies", data_dir=Path("/srv/b"))
    )
    assert upload_sweep_name(bucket) != here
