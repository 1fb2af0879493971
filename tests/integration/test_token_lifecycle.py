"""Token lifecycle through the real `ductor-streams token …` CLI and two real server replicas
on one PostgreSQL (docs/http-api.md, tokens): a revoked or expired token answers 401 on every
replica within 2 seconds, while the per-process cache keeps serving the others."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from application.tokens import token_hash, token_id
from tests.conftest import SERVER_ENV, Tokens, api_client
from tests.support.server import ServerProcess

CLI = str(Path(sys.executable).parent / "ductor-streams")
# The probe reads a run nobody created: an accepted token gets 404 (not 401).
ACCEPTED = 404
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def token_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    env["DUCTOR_STREAMS_DATABASE_URL"] = database_url
    return subprocess.run(
        [CLI, "token", *args], capture_output=True, text=True, env=env, timeout=60
    )


def create(database_url: str, tenant: str = "default", *extra: str) -> str:
    done = token_cli(database_url, "create", "--tenant", tenant, "--scope", "streams:read", *extra)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert done.stdout == token + "\n" and token.startswith("dst_")
    return token


def revoke(database_url: str, token_or_id: str) -> subprocess.CompletedProcess[str]:
    return token_cli(database_url, "revoke", token_or_id)


async def status(server: ServerProcess, token: str) -> int:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        answer = await client.get(
            "/api/workflow-streams/runs/run-tokens/streams",
            headers={"Authorization": f"Bearer {token}"},
        )
    return answer.status_code


async def until_refused(servers: list[ServerProcess], token: str, within: float) -> float:
    """Poll until every server answers 401 for `token`; how long that took (fails past
    `within`)."""
    started = time.monotonic()
    pending = list(servers)
    while pending:
        pending = [s for s in pending if await status(s, token) != 401]
        elapsed = time.monotonic() - started
        assert elapsed < within or not pending, f"still accepted after {elapsed:.2f} s"
        if pending:
            await asyncio.sleep(0.05)
    return time.monotonic() - started


def tid(token: str) -> str:
    return token_id(token_hash(token))


def list_lines(database_url: str, *args: str) -> list[list[str]]:
    done = token_cli(database_url, "list", *args)
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines()]


async def test_a_revoked_token_answers_401_on_both_replicas_within_2_seconds(
    server: ServerProcess, server_b: ServerProcess, database_url: str
) -> None:
    doomed, kept = create(database_url), create(database_url)
    for replica in (server, server_b):
        for token in (doomed, kept, doomed):  # looked up, then served from the cache
            assert await status(replica, token) == ACCEPTED
    done = revoke(database_url, doomed)
    assert done.returncode == 0, done.stderr
    assert tid(doomed) in done.stderr
    # The cache would trust the token for its 10 s TTL: only the notification ends it sooner.
    await until_refused([server, server_b], doomed, within=2.0)
    for replica in (server, server_b):
        assert await status(replica, kept) == ACCEPTED
        assert await status(replica, doomed) == 401


async def test_an_expiring_token_works_then_answers_401_once_it_expires(
    server: ServerProcess, server_b: ServerProcess, tokens: Tokens
) -> None:
    # Issued in-process, so no CLI start-up eats into its lifetime.
    issued = time.monotonic()
    token = await tokens.create(principal="expiring", expires_in_seconds=2)
    for replica in (server, server_b):
        assert await status(replica, token) == ACCEPTED  # and now cached on both
        assert await status(replica, token) == ACCEPTED
    await asyncio.sleep(max(0.0, 2 - (time.monotonic() - issued)))
    # Expired: the cached entry ends at the expiry (without it, the 10 s TTL would keep it).
    await until_refused([server, server_b], token, within=1.0)


def test_token_list_shows_ids_tenants_principals_scopes_and_times_but_never_a_token(
    database_url: str,
) -> None:
    mine, theirs = "tl-" + secrets.token_hex(4), "tl-" + secrets.token_hex(4)
    before = datetime.now(UTC).replace(microsecond=0)
    plain = create(database_url, mine, "--principal", "build bot", "--scope", "streams:write")
    expiring = create(database_url, mine, "--expires-in", "3600")
    other = create(database_url, theirs)
    assert revoke(database_url, tid(plain)).returncode == 0

    lines = list_lines(database_url, "--tenant", mine)
    assert [line[0] for line in lines] == [tid(plain), tid(expiring)]  # by creation
    for line in lines:
        assert len(line) == 8, line
    first, second = lines
    assert first[1:4] == [mine, "build bot", "streams:read,streams:write"]
    assert second[1:4] == [mine, "cli", "streams:read"]
    for line in lines:
        assert RFC3339_UTC.match(line[4]), line
        created = datetime.fromisoformat(line[4])
        assert before <= created <= datetime.now(UTC)
    assert first[5] == "-" and RFC3339_UTC.match(first[6]) and first[7] == "revoked"
    assert second[6] == "-" and second[7] == "active"
    expires = datetime.fromisoformat(second[5]) - datetime.fromisoformat(second[4])
    assert abs(expires - timedelta(hours=1)) <= timedelta(seconds=2)

    every = token_cli(database_url, "list")
    assert every.returncode == 0
    every_ids = [line.split("\t")[0] for line in every.stdout.splitlines()]
    assert {tid(plain), tid(expiring), tid(other)} <= set(every_ids)
    for token in (plain, expiring, other):
        for output in (every.stdout, token_cli(database_url, "list", "--tenant", mine).stdout):
            assert token not in output
            assert token_hash(token).hex() not in output
    assert list_lines(database_url, "--tenant", "tl-nobody-" + secrets.token_hex(4)) == []

    bad = token_cli(database_url, "list", "--tenant", "not a tenant!")
    assert bad.returncode == 2 and "tenant" in bad.stderr and bad.stdout == ""


async def test_revoke_by_id_or_by_token_twice_is_fine_and_unknown_is_an_error(
    server: ServerProcess, database_url: str
) -> None:
    by_id, by_token = create(database_url), create(database_url)
    assert revoke(database_url, tid(by_id)).returncode == 0
    assert revoke(database_url, by_token).returncode == 0
    again = revoke(database_url, by_token)
    assert again.returncode == 0, again.stderr
    assert await status(server, by_id) == 401
    assert await status(server, by_token) == 401

    for unknown in ("tok_0123456789abcdef", "dst_never-issued"):
        done = revoke(database_url, unknown)
        assert done.returncode == 1
        assert "no token is known" in done.stderr and done.stdout == ""


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "soon", "315360001"])
def test_create_refuses_a_bad_expires_in_as_a_usage_error(database_url: str, value: str) -> None:
    done = token_cli(
        database_url,
        "create",
        "--tenant",
        "default",
        "--scope",
        "streams:read",
        "--expires-in",
        value,
    )
    assert done.returncode == 2
    assert "--expires-in" in done.stderr and "whole number of seconds from 1 to" in done.stderr
    assert done.stdout == ""


def test_a_revoked_bootstrap_token_stays_revoked_across_a_restart(
    database_url: str, tmp_path: Path
) -> None:
    bootstrap = "dst_bootstrap_" + secrets.token_hex(8)
    env = {**SERVER_ENV, "DUCTOR_STREAMS_BOOTSTRAP_TOKEN": bootstrap}
    replica = ServerProcess(database_url=database_url, data_dir=tmp_path, env=env).start()
    try:
        assert asyncio.run(status(replica, bootstrap)) == ACCEPTED
        assert revoke(database_url, bootstrap).returncode == 0
        replica.stop()
        replica.start()
        assert asyncio.run(status(replica, bootstrap)) == 401
        assert "BOOTSTRAP_TOKEN was revoked and stays revoked" in replica.log()
    finally:
        replica.stop()


async def reconnects(server: ServerProcess) -> float:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("ductor_streams_wake_bus_reconnects_total "):
            return float(line.split()[-1])
    return 0.0


async def test_a_revocation_missed_by_the_bus_is_forgotten_when_it_reconnects(
    server: ServerProcess, server_b: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    token = await tokens.create(principal="missed")
    for replica in (server, server_b):
        assert await status(replica, token) == ACCEPTED
    # Revoked without the notification (as if it were lost): the cache keeps serving it...
    await pool.execute("UPDATE api_tokens SET revoked_at = now() WHERE token_id = $1", tid(token))
    for replica in (server, server_b):
        assert await status(replica, token) == ACCEPTED
    # ...until the bus reconnects, which forgets every remembered token.
    before = [await reconnects(replica) for replica in (server, server_b)]
    await pool.execute(
        """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
           WHERE application_name = 'ductor-streams-listen' AND datname = current_database()"""
    )
    async with asyncio.timeout(10):
        for replica, count in zip((server, server_b), before, strict=True):
            while await reconnects(replica) <= count:
                await asyncio.sleep(0.05)
    for replica in (server, server_b):
        assert await status(replica, token) == 401


@pytest.fixture
def patient_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server whose protocol long-polls wait 30 s (the shared one's wait 1 s)."""
    env = {**SERVER_ENV, "DUCTOR_STREAMS_LONG_POLL_SECONDS": "30"}
    process = ServerProcess(database_url=database_url, data_dir=tmp_path, env=env).start()
    yield process
    process.stop()


async def test_a_revoked_token_ends_its_open_followers_and_long_polls_on_both_surfaces(
    patient_server: ServerProcess, database_url: str
) -> None:
    """Open SSE connections and waiting long-polls of a revoked token end within the 2 s a
    revocation takes (README), and never deliver a record appended after it."""
    server = patient_server
    run, stream = "rv-" + secrets.token_hex(4), "s"
    reader = create(database_url)  # streams:read in tenant default, like the bootstrap token
    native = f"/api/workflow-streams/runs/{run}/streams/{stream}"
    protocol = f"/api/durable-streams/v1/stream/{run}/{stream}"
    auth = {"Authorization": f"Bearer {reader}"}
    async with (
        api_client(server) as api,
        httpx.AsyncClient(base_url=server.base_url, headers=auth, timeout=30) as client,
    ):
        created = await api.post(
            f"/runs/{run}/streams", json={"stream_id": stream, "direction": "output"}
        )
        assert created.status_code == 201, created.text
        appended = await api.post(
            f"/runs/{run}/streams/{stream}/records", json={"records": [{"data": {"n": 1}}]}
        )
        assert appended.status_code == 201, appended.text

        async def follow(url: str, seen: list[str], first: asyncio.Event) -> None:
            async with client.stream("GET", url) as answer:
                assert answer.status_code == 200
                async for line in answer.aiter_lines():
                    seen.append(line)
                    if '"n":1' in line:
                        first.set()

        native_seen: list[str] = []
        protocol_seen: list[str] = []
        native_first, protocol_first = asyncio.Event(), asyncio.Event()
        followers = [
            asyncio.create_task(follow(native + "/subscribe?cursor=0", native_seen, native_first)),
            asyncio.create_task(
                follow(protocol + "?offset=-1&live=sse", protocol_seen, protocol_first)
            ),
        ]
        async with asyncio.timeout(10):
            await native_first.wait()
            await protocol_first.wait()
        long_polls = [
            asyncio.create_task(client.get(native + "/records?cursor=1&wait=30")),
            asyncio.create_task(
                client.get(protocol + f"?offset={'0' * 16}_{1:016d}&live=long-poll")
            ),
        ]
        await asyncio.sleep(0.3)  # both are waiting now
        assert not any(t.done() for t in [*followers, *long_polls])

        revoked = time.monotonic()
        done = revoke(database_url, reader)
        assert done.returncode == 0, done.stderr
        # Once new requests are refused, the revocation has reached the server...
        await until_refused([server], reader, within=2.0)
        # ...so what is appended now must reach none of the revoked token's connections.
        appended = await api.post(
            f"/runs/{run}/streams/{stream}/records", json={"records": [{"data": {"n": 2}}]}
        )
        assert appended.status_code == 201, appended.text
        async with asyncio.timeout(2.0 + 3.0 - (time.monotonic() - revoked)):
            await asyncio.gather(*followers)
            polled = await asyncio.gather(*long_polls)
        assert [answer.status_code for answer in polled] == [401, 401]
        assert "event: revoked" in native_seen, native_seen
        for seen in (native_seen, protocol_seen):
            assert not any('"n":2' in line for line in seen), seen
