"""Settings come from DUCTOR_STREAMS_* variables, each declared once and checked by msgspec; a bad
value stops a command with one line naming the variable. The commands document their options."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoints.config import PREFIX, InvalidSetting, Settings
from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]


def from_env(**values: str) -> Settings:
    return Settings.from_env({PREFIX + name: value for name, value in values.items()})


def test_every_setting_keeps_its_name_and_default() -> None:
    settings = from_env()
    assert settings == Settings()
    assert settings.worker_lease_seconds == 6  # a dead worker's claims are taken over sooner
    assert (settings.host, settings.port, settings.header_read_timeout_seconds) == (
        "127.0.0.1",
        8080,
        30,
    )
    given = from_env(
        DATABASE_URL="postgresql://db/x",
        DATA_DIR="/srv/ds",
        REGION="eu",
        POOL_MIN_SIZE="1",
        POOL_MAX_SIZE="5",
        RUN_WORKERS="1",
        LOG_LEVEL="debug",
        OBJECT_STORE="s3",
        WAIT_SERVICE="http",
        HEAD_CHECK_SECONDS="0.5",
        HEADER_READ_TIMEOUT_SECONDS="2.5",
        PORT="9000",
        MAX_SUBSCRIPTIONS_PER_PRINCIPAL="7",
    )
    assert given.database_url == "postgresql://db/x" and given.data_dir == Path("/srv/ds")
    assert (given.pool_min_size, given.pool_max_size, given.run_workers) == (1, 5, True)
    assert (given.log_level, given.object_store, given.wait_service) == ("DEBUG", "s3", "http")
    assert (given.head_check_seconds, given.header_read_timeout_seconds, given.port) == (
        0.5,
        2.5,
        9000,
    )
    assert given.max_subscriptions_per_principal == 7


def test_a_database_statement_is_bounded_by_default_and_the_bound_is_configurable() -> None:
    assert from_env().statement_timeout_seconds == 10
    assert from_env(STATEMENT_TIMEOUT_SECONDS="2.5").statement_timeout_seconds == 2.5


def test_the_region_is_the_default_egress_and_object_region() -> None:
    settings = from_env(REGION="eu")
    assert (settings.egress_region, settings.object_regions) == ("eu", ("eu",))
    other = from_env(REGION="eu", EGRESS_REGION="eu-clients", OBJECT_REGIONS="eu, us ,")
    assert (other.egress_region, other.object_regions) == ("eu-clients", ("eu", "us"))


def test_an_empty_value_counts_as_unset() -> None:
    assert from_env(PORT="", REGION="") == Settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORT", "abc"),
        ("PORT", "70000"),
        ("POOL_MAX_SIZE", "-1"),
        ("WORKER_LEASE_SECONDS", "0"),
        ("HEADER_READ_TIMEOUT_SECONDS", "soon"),
        ("LOG_LEVEL", "loud"),
        ("OBJECT_STORE", "ftp"),
        ("RUN_WORKERS", "maybe"),
        ("STATEMENT_TIMEOUT_SECONDS", "0"),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(InvalidSetting) as refused:
        from_env(**{name: value})
    assert str(refused.value).startswith(f"{PREFIX}{name}=")


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("PORT", "abc", "expected a whole number"),
        ("HEADER_READ_TIMEOUT_SECONDS", "soon", "expected a number"),
        ("RUN_WORKERS", "maybe", "expected true or false"),
    ],
)
def test_a_bad_value_says_what_text_it_takes(name: str, value: str, reason: str) -> None:
    """Not the decoder's types ("Expected `int`, got `str`"): a setting is text."""
    with pytest.raises(InvalidSetting) as refused:
        from_env(**{name: value})
    assert str(refused.value) == f"{PREFIX}{name}={value!r}: {reason}"


def test_a_pool_smaller_than_its_minimum_is_refused() -> None:
    with pytest.raises(InvalidSetting, match="POOL_MIN_SIZE"):
        from_env(POOL_MIN_SIZE="30", POOL_MAX_SIZE="20")


def test_expiry_settings_and_a_grace_below_twice_the_flush_is_refused() -> None:
    defaults = from_env()
    assert (
        defaults.access_flush_seconds,
        defaults.expiry_grace_seconds,
        defaults.expiry_interval_seconds,
    ) == (1, 5, 5)
    given = from_env(
        ACCESS_FLUSH_SECONDS="0.5", EXPIRY_GRACE_SECONDS="1", EXPIRY_INTERVAL_SECONDS="0.2"
    )
    assert (given.access_flush_seconds, given.expiry_grace_seconds) == (0.5, 1)
    assert given.expiry_interval_seconds == 0.2
    with pytest.raises(InvalidSetting, match=r"EXPIRY_GRACE_SECONDS=3\.0 is below twice"):
        from_env(ACCESS_FLUSH_SECONDS="2", EXPIRY_GRACE_SECONDS="3")


def cli(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    env.update({PREFIX + name: value for name, value in settings.items()})
    # Nothing listens there: a command that did not check its settings fails on connecting.
    env.setdefault(PREFIX + "DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    return subprocess.run(
        [sys.executable, "-m", "entrypoints.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("command", "name", "value"),
    [
        (["migrate"], "POOL_MAX_SIZE", "-1"),
        (["worker"], "LOG_LEVEL", "loud"),
        (["serve"], "PORT", "abc"),
        (["token", "create", "--tenant", "t", "--scope", "streams:read"], "POOL_MAX_SIZE", "x"),
        (["token", "list"], "POOL_MAX_SIZE", "x"),
        (["token", "revoke", "tok_0123456789abcdef"], "LOG_LEVEL", "loud"),
    ],
)
def test_a_command_with_a_bad_setting_prints_one_line_and_fails(
    command: list[str], name: str, value: str
) -> None:
    done = cli(*command, **{name: value})
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{PREFIX}{name}" in lines[0], done.stderr


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == "ductor-streams 0.1.0"


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["serve"], ["127.0.0.1", "8080", "default: 1", "default: granian", "DUCTOR_STREAMS_PORT"]),
        (["token", "create"], ["default: cli", "--tenant", "--scope", "--expires-in"]),
        (["token", "list"], ["--tenant", "Never prints a token", "RFC 3339"]),
        (["token", "revoke"], ["TOKEN_OR_ID", "within 2 seconds", "exits 1"]),
        (["worker"], ["docs/configuration.md"]),
        (["migrate"], ["nothing to apply"]),
    ],
)
def test_each_command_documents_its_options_and_their_defaults(
    command: list[str], shown: list[str]
) -> None:
    done = cli(*command, "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for part in shown:
        assert part in text, (part, done.stdout)


@pytest.mark.parametrize("command", [["token", "list"], ["token", "revoke", "tok_0"]])
def test_a_token_command_without_its_database_says_so_in_one_line(command: list[str]) -> None:
    done = cli(*command)  # DATABASE_URL points where nothing listens
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the database" in lines[0], done.stderr


def server_commands() -> list[list[str]]:
    serve = ["serve", "--port", str(free_port()), "--no-workers"]
    return [serve, ["worker"], ["migrate"], ["token", "list"]]


@pytest.mark.parametrize(
    "url", ["notaurl", "postgresql://x@127.0.0.1:99999/db", "postgresql://x@[::1/db"]
)
def test_a_database_url_that_cannot_be_used_is_a_bad_setting_in_one_line(url: str) -> None:
    # asyncpg's ClientConfigurationError (notaurl), OverflowError (the port) and ValueError (the
    # host) came out of serve, worker and migrate as tracebacks (token list: "cannot reach").
    for command in server_commands():
        done = cli(*command, DATABASE_URL=url)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (command, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"ductor-streams: error: {PREFIX}DATABASE_URL"), line
        assert url not in line  # a database's URL may hold its password


def test_a_database_that_cannot_be_reached_is_said_in_one_line() -> None:
    # ConnectionRefusedError came out of serve, worker and migrate as a traceback; the token
    # commands always said this (above).
    for command in server_commands():
        done = cli(*command)  # DATABASE_URL points where nothing listens
        assert done.returncode == 1 and "Traceback" not in done.stderr, (command, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("ductor-streams: error: cannot reach the database: "), line


def test_only_a_postgresql_url_is_a_database_url() -> None:
    for url in ("postgresql://db/x", "postgres://u@db/x", "POSTGRESQL://db/x"):
        assert from_env(DATABASE_URL=url).database_url == url
    for url in ("notaurl", "mysql://db/x", "db:5432"):
        with pytest.raises(InvalidSetting, match=f"{PREFIX}DATABASE_URL: expected a postgresql"):
            from_env(DATABASE_URL=url)


def test_a_port_out_of_range_is_a_usage_error_not_a_traceback() -> None:
    done = cli("serve", "--port", "70000")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--port" in done.stderr and "70000" in done.stderr


def test_the_workflow_engine_wait_services_take_their_mapping_from_the_environment() -> None:
    dbos = from_env(
        WAIT_SERVICE="dbos",
        DBOS_SYSTEM_DATABASE_URL="postgresql://db/dbos",
        DBOS_WORKFLOW_ID="{tenant}-{run_id}",
    )
    assert (dbos.wait_service, dbos.dbos_workflow_id, dbos.dbos_topic) == (
        "dbos",
        "{tenant}-{run_id}",
        "{stream_id}",
    )
    restate = from_env(
        WAIT_SERVICE="restate",
        RESTATE_INGRESS_URL="http://127.0.0.1:8080",
        RESTATE_TARGET="Inbox/on_record",
    )
    assert (restate.restate_ingress_url, restate.restate_target, restate.restate_key) == (
        "http://127.0.0.1:8080",
        "Inbox/on_record",
        "{run_id}",
    )


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"WAIT_SERVICE": "dbos"}, "DUCTOR_STREAMS_DBOS_SYSTEM_DATABASE_URL"),
        (
            {"WAIT_SERVICE": "dbos", "DBOS_SYSTEM_DATABASE_URL": "sqlite:///x"},
            "DUCTOR_STREAMS_DBOS_SYSTEM_DATABASE_URL",
        ),
        (
            {
                "WAIT_SERVICE": "dbos",
                "DBOS_SYSTEM_DATABASE_URL": "postgresql://db/x",
                "DBOS_TOPIC": "{stream}",
            },
            "DUCTOR_STREAMS_DBOS_TOPIC='{stream}'",
        ),
        ({"WAIT_SERVICE": "restate", "RESTATE_TARGET": "A/b"}, "RESTATE_INGRESS_URL"),
        (
            {
                "WAIT_SERVICE": "restate",
                "RESTATE_INGRESS_URL": "127.0.0.1:8080",
                "RESTATE_TARGET": "A/b",
            },
            "DUCTOR_STREAMS_RESTATE_INGRESS_URL",
        ),
        (
            {
                "WAIT_SERVICE": "restate",
                "RESTATE_INGRESS_URL": "http://127.0.0.1:8080",
                "RESTATE_TARGET": "A/b/send",
            },
            "expected `Name/handler`",
        ),
        (
            {
                "WAIT_SERVICE": "restate",
                "RESTATE_INGRESS_URL": "http://127.0.0.1:8080",
                "RESTATE_TARGET": "A/b",
                "RESTATE_KEY": "{tenant.__class__}",
            },
            "DUCTOR_STREAMS_RESTATE_KEY='{tenant.__class__}'",
        ),
        (
            {
                "WAIT_SERVICE": "dbos",
                "DBOS_SYSTEM_DATABASE_URL": "postgresql://db/x",
                "DBOS_WORKFLOW_ID": "{run_id!r}",
            },
            "DUCTOR_STREAMS_DBOS_WORKFLOW_ID",
        ),
        (
            {
                "WAIT_SERVICE": "dbos",
                "DBOS_SYSTEM_DATABASE_URL": "postgresql://db/x",
                "DBOS_TOPIC": "{stream_id",
            },
            "DUCTOR_STREAMS_DBOS_TOPIC",
        ),
        ({"WAIT_SERVICE": "temporal"}, "expected one of postgres, http, dbos, restate"),
    ],
)
def test_a_wait_service_that_cannot_work_is_refused_naming_the_variable(
    values: dict[str, str], named: str
) -> None:
    with pytest.raises(InvalidSetting, match=re.escape(named)):
        from_env(**values)
