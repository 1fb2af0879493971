"""`ductor-streams token …` with runs and with --server, as a real process: `create --run`
restricts a token on the database path (bootstrap, no server needed); `--server` mints, lists
(every page) and revokes through a running server's token routes with the caller's own token."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx

from tests.conftest import BOOTSTRAP_TOKEN, Tokens
from tests.integration.test_token_lifecycle import create, tid, token_cli
from tests.support.server import ServerProcess

CLI = str(Path(sys.executable).parent / "ductor-streams")


def server_cli(server: ServerProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    env |= {"DUCTOR_STREAMS_URL": server.base_url, "DUCTOR_STREAMS_TOKEN": token}
    return subprocess.run(
        [CLI, "token", *args, "--server"], capture_output=True, text=True, env=env, timeout=60
    )


async def test_create_with_runs_restricts_the_token(
    database_url: str, server: ServerProcess, run_id: str
) -> None:
    token = create(database_url, "default", "--run", run_id, "--run", run_id + "-b")
    listed = token_cli(database_url, "list", "--tenant", "default")
    line = next(
        line.split("\t") for line in listed.stdout.splitlines() if line.startswith(tid(token))
    )
    assert line[8] == f"{run_id},{run_id}-b"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        headers = {"Authorization": f"Bearer {token}"}
        mine = await client.get(f"/api/workflow-streams/runs/{run_id}/streams", headers=headers)
        other = await client.get(f"/api/workflow-streams/runs/{run_id}-c/streams", headers=headers)
    assert mine.status_code == other.status_code == 404  # no stream yet / not its run
    assert (
        token_cli(
            database_url,
            "create",
            "--tenant",
            "default",
            "--scope",
            "streams:read",
            "--run",
            "bad/run",
        ).returncode
        == 2
    )


def test_mint_list_and_revoke_through_the_server(server: ServerProcess, run_id: str) -> None:
    minted = server_cli(
        server,
        BOOTSTRAP_TOKEN,
        "create",
        "--scope",
        "streams:read",
        "--expires-in",
        "600",
        "--run",
        run_id,
        "--principal",
        "viewer",
    )
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    assert minted.stdout == token + "\n" and token.startswith("dst_")
    listed = server_cli(server, BOOTSTRAP_TOKEN, "list")
    assert listed.returncode == 0, listed.stderr
    line = next(
        line.split("\t") for line in listed.stdout.splitlines() if line.startswith(tid(token))
    )
    assert line[1:4] == ["default", "viewer", "streams:read"] and line[7:] == ["active", run_id]
    assert token not in listed.stdout
    # The minted token is read-only and restricted: it cannot mint.
    refused = server_cli(server, token, "create", "--scope", "streams:read", "--expires-in", "60")
    assert (refused.returncode == 1 and "403" in refused.stderr) or "forbidden" in refused.stderr
    # Without --expires-in, nothing is asked of the server.
    assert server_cli(server, BOOTSTRAP_TOKEN, "create", "--scope", "streams:read").returncode == 2
    revoked = server_cli(server, BOOTSTRAP_TOKEN, "revoke", token)
    assert revoked.returncode == 0, revoked.stderr
    assert tid(token) in revoked.stderr
    again = server_cli(server, BOOTSTRAP_TOKEN, "list")
    line = next(
        line.split("\t") for line in again.stdout.splitlines() if line.startswith(tid(token))
    )
    assert line[7] == "revoked"


async def test_list_through_the_server_prints_every_token_past_one_page(
    server: ServerProcess, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """More tokens than a page holds (the command reads 1,000 a page): each printed once, by
    creation, as the server orders them."""
    tenant = "cli-pages-" + secrets.token_hex(4)
    admin = await tokens.create(tenant=tenant, principal="admin")
    await asyncio.gather(*(tokens.create(tenant=tenant, principal=f"p{i}") for i in range(1_050)))
    ordered = await pool.fetch(
        "SELECT token_id FROM api_tokens WHERE tenant = $1 ORDER BY created_at, token_id", tenant
    )
    listed = await asyncio.to_thread(server_cli, server, admin, "list")
    assert listed.returncode == 0, listed.stderr
    lines = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [line[0] for line in lines] == [row[0] for row in ordered]
    assert len(lines) == 1_051 and {line[1] for line in lines} == {tenant}
