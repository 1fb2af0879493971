"""Large objects through the HTTP API on PostgreSQL, with real workers, on each object store.

Every test runs twice: on the session's server, which keeps bodies in files, and on one that
keeps them in S3 (`OBJECT_STORE=s3` on a real SeaweedFS store, tests/support/seaweedfs.py)."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import os
from collections.abc import Iterator
from datetime import datetime, timedelta

import asyncpg
import boto3
import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, api_client, on_each_object_store
from tests.support.server import ServerProcess, WorkerProcess

BODY = os.urandom(3 * 1024 * 1024 + 17)  # several chunks, not a round number


@pytest.fixture(scope="module", params=["filesystem", "s3"])
def server(request: pytest.FixtureRequest, server: ServerProcess) -> ServerProcess:
    return on_each_object_store(request, server)


def prepare_body(body: bytes = BODY, key: str = "k1", **extra) -> dict:
    return {
        "idempotency_key": key,
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": "application/octet-stream",
        **extra,
    }


async def new_stream(api: httpx.AsyncClient, run_id: str, **definition) -> str:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "o", "direction": "output", **definition}
    )
    assert created.status_code == 201, created.text
    return f"/runs/{run_id}/streams/o"


async def test_the_whole_lifecycle_over_http(api: httpx.AsyncClient, run_id: str) -> None:
    path = await new_stream(api, run_id)
    prepared = await api.post(f"{path}/objects", json=prepare_body())
    assert prepared.status_code == 201, prepared.text
    intent = prepared.json()
    assert intent["state"] == "prepared" and intent["upload"]["method"] == "PUT"
    assert intent["upload"]["url"].endswith(f"/objects/{intent['object_id']}/body")
    again = await api.post(f"{path}/objects", json=prepare_body())
    assert again.status_code == 200 and again.json()["object_id"] == intent["object_id"]
    other = await api.post(f"{path}/objects", json=prepare_body(body=b"x"))
    assert other.status_code == 422 and other.json()["code"] == "idempotency-key-reused"

    body_path = f"{path}/objects/{intent['object_id']}"
    early = await api.post(f"{body_path}/commit")
    assert early.status_code == 409 and early.json()["code"] == "object-state-conflict"
    uploaded = await api.put(f"{body_path}/body", content=BODY)
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["state"] == "uploaded"
    not_yet = await api.get(f"{body_path}/body")
    assert not_yet.status_code == 409

    committed = await api.post(f"{body_path}/commit")
    assert committed.status_code == 201, committed.text
    sequence = committed.json()["sequence"]
    repeated = await api.post(f"{body_path}/commit")
    assert repeated.status_code == 200 and repeated.json()["sequence"] == sequence
    assert (await api.post(f"{body_path}/abort")).status_code == 409

    page = (await api.get(f"{path}/records")).json()
    [record] = page["records"]
    assert record["sequence"] == sequence and record["size"] == len(BODY)
    assert record["object"]["object_id"] == intent["object_id"]
    assert record["object"]["sha256"] == hashlib.sha256(BODY).hexdigest()

    download = await api.get(f"{body_path}/body")
    assert download.status_code == 200
    assert download.content == BODY
    assert download.headers["content-length"] == str(len(BODY))
    digest = base64.b64encode(hashlib.sha256(BODY).digest()).decode()
    assert download.headers["repr-digest"] == f"sha-256=:{digest}:"


async def test_expires_at_is_the_upload_deadline_and_null_once_committed_or_aborted(
    api: httpx.AsyncClient, run_id: str
) -> None:
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body(expires_in_seconds=120))).json()
    deadline = datetime.fromisoformat(intent["expires_at"])
    assert deadline - datetime.fromisoformat(intent["created_at"]) == timedelta(seconds=120)
    body_path = f"{path}/objects/{intent['object_id']}"
    uploaded = (await api.put(f"{body_path}/body", content=BODY)).json()
    assert datetime.fromisoformat(uploaded["expires_at"]) == deadline  # commit is due by then
    assert (await api.post(f"{body_path}/commit")).status_code == 201
    committed = (await api.get(body_path)).json()
    assert committed["state"] == "committed" and committed["expires_at"] is None
    other = (await api.post(f"{path}/objects", json=prepare_body(key="k2"))).json()
    aborted = (await api.post(f"{path}/objects/{other['object_id']}/abort")).json()
    assert aborted["state"] == "aborted" and aborted["expires_at"] is None


async def test_a_mismatched_upload_is_422_and_the_intent_stays_prepared(
    api: httpx.AsyncClient, run_id: str
) -> None:
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    tampered = BODY[:-1] + bytes([BODY[-1] ^ 1])
    bad = await api.put(f"{body_path}/body", content=tampered)
    assert bad.status_code == 422 and bad.json()["code"] == "digest-mismatch"
    assert bad.json()["expected"] == hashlib.sha256(BODY).hexdigest()
    assert bad.json()["received"] == hashlib.sha256(tampered).hexdigest()
    short = await api.put(f"{body_path}/body", content=BODY[:-5])
    assert short.status_code == 422 and short.json()["code"] == "size-mismatch"
    assert (short.json()["expected"], short.json()["received"]) == (len(BODY), len(BODY) - 5)
    long = await api.put(f"{body_path}/body", content=BODY + b"extra")
    assert long.status_code == 422 and long.json()["code"] == "size-mismatch"
    assert (await api.get(body_path)).json()["state"] == "prepared"
    assert (await api.put(f"{body_path}/body", content=BODY)).status_code == 200


async def paused(body: bytes, go_on: asyncio.Event, sent: asyncio.Event | None = None):
    """`body` as an upload's content: its first half, then the rest once `go_on` is set.
    `sent` is set once the first half is written (the client asks for what follows)."""
    half = len(body) // 2
    yield body[:half]
    if sent is not None:
        sent.set()
    await go_on.wait()
    yield body[half:]


async def upload_paused(
    api: httpx.AsyncClient, body_path: str, body: bytes
) -> tuple[asyncio.Task[httpx.Response], asyncio.Event]:
    """An upload of `body` under way, its first half in (its intent found prepared), the rest
    sent once the event is set."""
    go_on, sent = asyncio.Event(), asyncio.Event()
    upload = asyncio.create_task(
        api.put(
            f"{body_path}/body",
            content=paused(body, go_on, sent),
            headers={"Content-Length": str(len(body))},
        )
    )
    # Its first half written (under load that may take a while), then a moment for the server
    # to take it in.
    async with asyncio.timeout(20):
        await sent.wait()
    await asyncio.sleep(0.3)
    return upload, go_on


async def test_a_bad_upload_racing_a_good_one_never_touches_the_committed_body(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """Two uploads of one intent: the good one lands and is committed while a tampered one
    still streams in. The tampered one is refused, and the committed body stays whole: a body
    that is not the prepared one is never written at the intent's key."""
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    bad, go_on = await upload_paused(api, body_path, BODY[:-1] + bytes([BODY[-1] ^ 1]))
    assert (await api.put(f"{body_path}/body", content=BODY)).status_code == 200
    committed = await api.post(f"{body_path}/commit")
    assert committed.status_code == 201, committed.text
    go_on.set()
    refused = await bad
    assert refused.status_code == 422 and refused.json()["code"] == "digest-mismatch"
    download = await api.get(f"{body_path}/body")
    assert download.status_code == 200 and download.content == BODY
    assert len(stored_files(server, run_id)) == 1


async def test_a_third_upload_of_one_intent_at_once_is_refused(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """Two uploads of one intent at once go through (a retry while the first still drips in);
    a third is refused, 429, before any of its body is stored: 200 at once held 81 times their
    tenant's limit on disk."""
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    uploads = [await upload_paused(api, body_path, BODY) for _ in range(2)]
    # Refused before any of its body is read, and its connection closed: a byte of it, so that
    # the client is not still writing a large body as the server closes (it read a reset).
    third = await api.put(f"{body_path}/body", content=b"b")
    # 429 with Retry-After (the intent is still prepared: a retry after one ends goes through)
    assert third.status_code == 429 and third.json()["code"] == "too-many-requests"
    assert third.headers["retry-after"] == "1" and "uploads under way" in third.json()["detail"]
    answers = []
    for upload, go_on in uploads:
        go_on.set()
        answers.append((await upload).status_code)
    assert answers[0] == 200 and answers[1] in (200, 409)  # (the twin finds it uploaded)
    assert (await api.get(body_path)).json()["state"] == "uploaded"
    # With none under way any more, an upload is taken again (and finds it uploaded).
    again = await api.put(f"{body_path}/body", content=BODY)
    assert again.status_code == 409 and "uploads under way" not in again.json()["detail"]


async def test_an_upload_racing_its_abort_leaves_no_body_behind(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """Aborted while its body streams in: the deletion queued for its key may run before the
    body lands, so the upload removes what it wrote when it finds the intent aborted."""
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    upload, go_on = await upload_paused(api, body_path, BODY)
    assert (await api.post(f"{body_path}/abort")).json()["state"] == "aborted"
    go_on.set()
    refused = await upload
    assert refused.status_code == 409 and refused.json()["code"] == "object-state-conflict"
    assert stored_files(server, run_id) == []


async def test_an_upload_racing_its_streams_deletion_and_recreation_leaves_no_body_behind(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """The stream is deleted and created again while the body streams in: the new stream has
    no such intent (409), and nothing will ever reference what the upload wrote: it is removed,
    as when the stream stays deleted (404), not left uncounted until the abandoned-upload sweep."""
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    upload, go_on = await upload_paused(api, body_path, BODY)
    assert (await api.delete(path)).status_code == 204
    await new_stream(api, run_id)
    go_on.set()
    refused = await upload
    assert refused.status_code in (404, 409), refused.text
    assert stored_files(server, run_id) == []


async def test_a_commit_under_the_block_policy_waits_for_credit_as_an_append_does(
    api: httpx.AsyncClient, run_id: str
) -> None:
    limits = {"max_unread_items": 1, "unread_policy": "block", "block_timeout_seconds": 10}
    path = await new_stream(api, run_id, limits=limits)
    first = await api.post(f"{path}/records", json={"records": [{"data": 1}]})
    assert first.status_code == 201, first.text
    body = b"a small body"
    intent = (await api.post(f"{path}/objects", json=prepare_body(body))).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    assert (await api.put(f"{body_path}/body", content=body)).status_code == 200
    committing = asyncio.create_task(api.post(f"{body_path}/commit"))
    await asyncio.sleep(0.7)
    assert not committing.done()  # no credit: it waits, not 429 at once
    acked = await api.post(f"{path}/consumers/reader/ack", json={"sequence": 1})
    assert acked.status_code == 200, acked.text
    committed = await asyncio.wait_for(committing, 15)
    assert committed.status_code == 201, committed.text
    assert committed.json()["sequence"] == 2
    # Appended when it got credit, not when it began to wait (0.7 s before the ack).
    page = (await api.get(f"{path}/records", params={"cursor": 0})).json()["records"]
    first_at, object_at = (datetime.fromisoformat(r["appended_at"]) for r in page)
    assert object_at - first_at >= timedelta(seconds=0.6), (first_at, object_at)


async def test_objects_over_32_mib_are_refused_at_prepare(
    api: httpx.AsyncClient, run_id: str
) -> None:
    path = await new_stream(api, run_id)
    fields = prepare_body()
    fields["size"] = 32 * 1024 * 1024 + 1
    refused = await api.post(f"{path}/objects", json=fields)
    # Over the cap the document states (`size` at most 32 MiB): the one answer for an object
    # too large, wherever it is found, and nothing prepared.
    assert refused.status_code == 413, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    problem = refused.json()
    assert problem["code"] == "object-too-large", problem
    assert problem["size"] == 32 * 1024 * 1024 + 1 and problem["limit"] == 32 * 1024 * 1024
    assert (await api.get(f"{path}/objects")).json()["objects"] == []


async def test_only_the_preparing_principal_may_touch_the_intent(
    api: httpx.AsyncClient, tokens, server: ServerProcess, run_id: str
) -> None:
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    async with api_client(server, await tokens.create(principal="mallory")) as mallory:
        assert (await mallory.put(f"{body_path}/body", content=BODY)).status_code == 403
        assert (await mallory.post(f"{body_path}/commit")).status_code == 403
        assert (await mallory.post(f"{body_path}/abort")).status_code == 403
        assert (await mallory.get(body_path)).status_code == 200  # readers may look


@pytest.mark.parametrize("committed", [False, True], ids=["prepared", "committed"])
async def test_another_principal_reusing_a_key_is_refused_and_learns_nothing(
    api: httpx.AsyncClient, tokens, server: ServerProcess, run_id: str, committed: bool
) -> None:
    path = await new_stream(api, run_id)
    body, key = b"alice's body", "shared-key"
    async with (
        api_client(server, await tokens.create(principal="alice")) as alice,
        api_client(server, await tokens.create(principal="bob")) as bob,
    ):
        prepared = await alice.post(f"{path}/objects", json=prepare_body(body, key))
        assert prepared.status_code == 201, prepared.text
        intent = prepared.json()
        if committed:
            body_path = f"{path}/objects/{intent['object_id']}"
            assert (await alice.put(f"{body_path}/body", content=body)).status_code == 200
            assert (await alice.post(f"{body_path}/commit")).status_code == 201
        for fields in (prepare_body(body, key), prepare_body(b"bob's", key)):
            refused = await bob.post(f"{path}/objects", json=fields)
            assert refused.status_code == 422, refused.text
            problem = refused.json()
            assert problem["code"] == "idempotency-key-reused"
            assert intent["object_id"] not in refused.text
            assert "upload" not in problem and "url" not in refused.text
        # Alice's own retry still gets her intent.
        again = await alice.post(f"{path}/objects", json=prepare_body(body, key))
        assert again.status_code == 200 and again.json()["object_id"] == intent["object_id"]


async def test_a_closed_stream_refuses_commit(api: httpx.AsyncClient, run_id: str) -> None:
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
    body_path = f"{path}/objects/{intent['object_id']}"
    assert (await api.put(f"{body_path}/body", content=BODY)).status_code == 200
    await api.post(f"{path}/close")
    refused = await api.post(f"{body_path}/commit")
    assert refused.status_code == 409 and refused.json()["code"] == "stream-closed"


def store_env(server: ServerProcess) -> dict[str, str]:
    """The object-store settings of `server` (none: the filesystem store under its data dir)."""
    names = ("DUCTOR_STREAMS_OBJECT_STORE", "DUCTOR_STREAMS_S3_", "AWS_")
    return {name: value for name, value in server.env.items() if name.startswith(names)}


@pytest.fixture(scope="module")
def object_worker(
    database_url: str, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    # The worker must see the same object store as the server (its files, or its S3 bucket).
    process = WorkerProcess(
        database_url=database_url,
        data_dir=server.data_dir,
        env={
            **store_env(server),
            "DUCTOR_STREAMS_WORKER_POLL_SECONDS": "0.1",
            "DUCTOR_STREAMS_SWEEP_INTERVAL_SECONDS": "0.2",
            "DUCTOR_STREAMS_PRUNE_INTERVAL_SECONDS": "0.2",
        },
    ).start()
    yield process
    process.stop()


@functools.cache
def _s3_client(endpoint_url: str, region: str, access_key: str, secret_key: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
    )


def stored_files(server: ServerProcess, run_id: str) -> list[str]:
    """The bodies stored for `run_id`: files under the data directory, or keys in the bucket."""
    env = server.env
    if env.get("DUCTOR_STREAMS_OBJECT_STORE") == "s3":
        s3 = _s3_client(
            env["DUCTOR_STREAMS_S3_ENDPOINT_URL"],
            env["DUCTOR_STREAMS_S3_REGION"],
            env["AWS_ACCESS_KEY_ID"],
            env["AWS_SECRET_ACCESS_KEY"],
        )
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=env["DUCTOR_STREAMS_S3_BUCKET"])
        return [
            item["Key"]
            for page in pages
            for item in page.get("Contents", ())
            if run_id in item["Key"]
        ]
    root = server.data_dir / "objects"
    return [str(p) for p in root.rglob("*") if p.is_file() and run_id in str(p)]


async def test_abort_and_expiry_remove_bodies_through_the_workers_but_not_under_hold(
    api: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: ServerProcess,
    object_worker: WorkerProcess,
    run_id: str,
) -> None:
    path = await new_stream(api, run_id)
    aborted = (await api.post(f"{path}/objects", json=prepare_body(key="a"))).json()
    expiring = (
        await api.post(f"{path}/objects", json=prepare_body(key="e", expires_in_seconds=1))
    ).json()
    for intent in (aborted, expiring):
        put = await api.put(f"{path}/objects/{intent['object_id']}/body", content=BODY)
        assert put.status_code == 200
    assert len(stored_files(server, run_id)) == 2
    await api.put(f"{path}/legal-hold", json={"enabled": True, "reason": "hold"})
    assert (await api.post(f"{path}/objects/{aborted['object_id']}/abort")).json()["state"] == (
        "aborted"
    )
    async with asyncio.timeout(10):
        while (await api.get(f"{path}/objects/{expiring['object_id']}")).json()[
            "state"
        ] != "expired":
            await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    assert len(stored_files(server, run_id)) == 2  # held: nothing deleted
    await api.put(f"{path}/legal-hold", json={"enabled": False})
    async with asyncio.timeout(45):
        while stored_files(server, run_id):
            await asyncio.sleep(0.2)
    # The worker removes a body, then records its outbox row as done: the row follows.
    pending = "SELECT count(*) FROM deletion_outbox WHERE run_id = $1 AND done_at IS NULL"
    async with asyncio.timeout(10):
        while await pool.fetchval(pending, run_id):
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_a_server_killed_between_upload_and_commit_commits_after_restart(
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    server: ServerProcess,
    run_id: str,
) -> None:
    data_dir = tmp_path_factory.mktemp("crashy")
    env = {**SERVER_ENV, **store_env(server)}  # the same kind of object store as `server`
    first = ServerProcess(database_url=database_url, data_dir=data_dir, env=env).start()
    async with api_client(first) as api:
        path = await new_stream(api, run_id)
        intent = (await api.post(f"{path}/objects", json=prepare_body())).json()
        body_path = f"{path}/objects/{intent['object_id']}"
        assert (await api.put(f"{body_path}/body", content=BODY)).status_code == 200
    first.kill()
    second = ServerProcess(database_url=database_url, data_dir=data_dir, env=env).start()
    try:
        async with api_client(second, BOOTSTRAP_TOKEN) as api:
            committed = await api.post(f"{body_path}/commit")
            assert committed.status_code == 201, committed.text
            assert (await api.get(f"{body_path}/body")).content == BODY
    finally:
        second.stop()


async def test_pruning_an_object_record_removes_its_body(
    api: httpx.AsyncClient,
    pool: asyncpg.Pool,
    server: ServerProcess,
    object_worker: WorkerProcess,
    run_id: str,
) -> None:
    path = await new_stream(api, run_id, retention={"max_records": 1})
    ids = []
    for key in ("first", "second"):
        intent = (await api.post(f"{path}/objects", json=prepare_body(key=key))).json()
        body_path = f"{path}/objects/{intent['object_id']}"
        assert (await api.put(f"{body_path}/body", content=BODY)).status_code == 200
        assert (await api.post(f"{body_path}/commit")).status_code == 201
        ids.append(intent["object_id"])
    async with asyncio.timeout(30):
        while len(stored_files(server, run_id)) != 1:
            await asyncio.sleep(0.2)
    [left] = stored_files(server, run_id)
    assert os.path.basename(left).startswith(ids[1] + ".")  # the key is unique to its intent
    assert (await api.get(f"{path}/objects/{ids[1]}/body")).content == BODY
    # The pruned record's object is gone with it: its intent too, so that no later prune reads
    # it again (nor queues its body again once its done deletion is forgotten).
    assert (await api.get(f"{path}/objects/{ids[0]}")).status_code == 404
    intents = "SELECT object_id FROM object_intents WHERE run_id = $1"
    assert [r[0] for r in await pool.fetch(intents, run_id)] == [ids[1]]
