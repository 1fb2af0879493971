"""Object intents held to their stream's ceilings, end to end through a real server process on
each object store (docs/http-api.md "Objects"): a prepare pledges its declared size against the
stream's total ceiling, a stream has a bounded number of open intents, an intent lives at most a
day, an upload never stores more than its intent declared, and the stream document shows a
bounded page of open intents with the rest behind `GET …/objects`."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import httpx
import pytest

from ductor_streams_client import StreamsClient
from tests.conftest import BOOTSTRAP_TOKEN, on_each_object_store
from tests.support.server import ServerProcess

MIB = 1024 * 1024
OPEN_CAP = 32  # DUCTOR_STREAMS_MAX_OPEN_OBJECTS_PER_STREAM's default
DOCUMENT_PAGE = 20


@pytest.fixture(scope="module", params=["filesystem", "s3"])
def server(request: pytest.FixtureRequest, server: ServerProcess) -> ServerProcess:
    return on_each_object_store(request, server)


def prepare(key: str, size: int, body: bytes | None = None, **extra) -> dict:
    return {
        "idempotency_key": key,
        "size": size,
        "sha256": hashlib.sha256(body if body is not None else b"x" * size).hexdigest(),
        **extra,
    }


async def new_stream(api: httpx.AsyncClient, run_id: str, **limits) -> str:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "o", "direction": "output", "limits": limits},
    )
    assert created.status_code == 201, created.text
    return f"/runs/{run_id}/streams/o"


def stored(server: ServerProcess, run_id: str) -> list[str]:
    """Everything the store holds that belongs to `run_id` or to an upload in progress:
    files (temporary ones included) under the data directory, or in the bucket its objects,
    the temporary keys of multipart puts and the multipart uploads not completed."""
    env = server.env
    if env.get("DUCTOR_STREAMS_OBJECT_STORE") != "s3":
        root = server.data_dir / "objects"
        return sorted(str(p) for p in root.rglob("*") if p.is_file() and run_id in str(p))
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=env["DUCTOR_STREAMS_S3_ENDPOINT_URL"],
        region_name=env["DUCTOR_STREAMS_S3_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    bucket = env["DUCTOR_STREAMS_S3_BUCKET"]
    keys = [
        item["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for item in page.get("Contents", ())
        if run_id in item["Key"] or item["Key"].startswith(".ductor-streams-uploads/")
    ]
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return sorted(keys + [f"multipart:{u['Key']}" for u in uploads])


async def chunked(total: int, chunk: int = 256 * 1024) -> AsyncIterator[bytes]:
    """`total` bytes sent without a Content-Length (chunked transfer encoding)."""
    sent = 0
    while sent < total:
        piece = min(chunk, total - sent)
        sent += piece
        yield b"x" * piece


async def test_a_prepare_past_the_total_ceiling_is_quota_exhausted_counting_open_pledges(
    api: httpx.AsyncClient, run_id: str
) -> None:
    path = await new_stream(api, run_id, max_total_bytes=1000)
    huge = await api.post(f"{path}/objects", json=prepare("huge", 32 * MIB))
    assert huge.status_code == 409, huge.text
    problem = huge.json()
    assert problem["code"] == "quota-exhausted"
    assert problem["max_total_bytes"] == 1000 and problem["size"] == 32 * MIB

    first = await api.post(f"{path}/objects", json=prepare("first", 600))
    assert first.status_code == 201, first.text
    # 600 pledged by the open intent: 500 more would pass 1,000, though nothing is stored yet.
    second = await api.post(f"{path}/objects", json=prepare("second", 500))
    assert second.status_code == 409 and second.json()["code"] == "quota-exhausted"
    assert second.json()["pledged_bytes"] == 600 and second.json()["total_bytes"] == 0
    assert (await api.post(f"{path}/objects", json=prepare("fits", 400))).status_code == 201
    # The same request again is answered as it was, whatever is pledged since.
    assert (await api.post(f"{path}/objects", json=prepare("first", 600))).status_code == 200

    state = (await api.get(path)).json()["state"]
    assert state["open_objects_count"] == 2 and state["open_objects_bytes"] == 1000
    # An aborted intent pledges nothing any more.
    aborted = await api.post(f"{path}/objects/{first.json()['object_id']}/abort")
    assert aborted.status_code == 200, aborted.text
    assert (await api.post(f"{path}/objects", json=prepare("second", 500))).status_code == 201


async def test_a_prepare_counts_open_intents_against_the_total_records(
    api: httpx.AsyncClient, run_id: str
) -> None:
    path = await new_stream(api, run_id, max_total_items=2)
    appended = await api.post(f"{path}/records", json={"records": [{"data": 1}]})
    assert appended.status_code == 201, appended.text
    assert (await api.post(f"{path}/objects", json=prepare("a", 10))).status_code == 201
    refused = await api.post(f"{path}/objects", json=prepare("b", 10))
    assert refused.status_code == 409 and refused.json()["code"] == "quota-exhausted"


async def test_open_intents_per_stream_are_bounded_and_paged_outside_the_document(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    path = await new_stream(api, run_id)
    ids = []
    for n in range(OPEN_CAP):
        prepared = await api.post(f"{path}/objects", json=prepare(f"k{n}", 10 + n))
        assert prepared.status_code == 201, prepared.text
        ids.append(prepared.json()["object_id"])
    refused = await api.post(f"{path}/objects", json=prepare("one-more", 10))
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "too-many-open-objects"
    assert refused.json()["max_open_objects"] == OPEN_CAP
    assert refused.headers["content-type"].startswith("application/problem+json")

    # The document: the oldest page and the counts of all.
    state = (await api.get(path)).json()["state"]
    assert state["open_objects_count"] == OPEN_CAP
    assert state["open_objects_bytes"] == sum(10 + n for n in range(OPEN_CAP))
    assert [o["object_id"] for o in state["open_objects"]] == ids[:DOCUMENT_PAGE]
    listed = (await api.get(f"/runs/{run_id}/streams")).json()["streams"][0]["state"]
    assert len(listed["open_objects"]) == DOCUMENT_PAGE

    # Every open intent, page by page, in the document's order.
    seen, after = [], None
    while True:
        params = {"limit": 10} | ({"after": after} if after else {})
        page = await api.get(f"{path}/objects", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["objects"]) <= 10
        seen += [o["object_id"] for o in body["objects"]]
        after = body["next_after"]
        if after is None:
            break
    assert seen == ids
    # The client pages the same way, and reads the document's counts.
    async with StreamsClient(server.base_url, BOOTSTRAP_TOKEN) as client:
        first = await client.list_open_objects(run_id, "o", limit=30)
        rest = await client.list_open_objects(run_id, "o", after=first.next_after)
        assert [o.object_id for o in (*first.objects, *rest.objects)] == ids
        assert rest.next_after is None
        state = (await client.get_stream(run_id, "o")).state
        assert (state.open_objects_count, len(state.open_objects)) == (OPEN_CAP, DOCUMENT_PAGE)
    assert {"object_id", "state", "size", "content_type", "created_at", "expires_at"} <= set(
        (await api.get(f"{path}/objects")).json()["objects"][0]
    )

    # A committed (no longer open) `after` still says where the next page starts.
    body = b"x" * 10
    assert (await api.put(f"{path}/objects/{ids[0]}/body", content=body)).status_code == 200
    assert (await api.post(f"{path}/objects/{ids[0]}/commit")).status_code == 201
    rest = (await api.get(f"{path}/objects", params={"after": ids[0], "limit": 1})).json()
    assert [o["object_id"] for o in rest["objects"]] == [ids[1]] and rest["next_after"] == ids[1]
    # A place is free again.
    assert (await api.post(f"{path}/objects", json=prepare("one-more", 10))).status_code == 201

    for bad in ({"limit": 0}, {"limit": 1001}, {"after": "no such/id"}):
        answer = await api.get(f"{path}/objects", params=bad)
        assert answer.status_code == 400 and answer.json()["code"] == "invalid-input", answer.text
    unknown = await api.get(f"{path}/objects", params={"after": "obj-unknown"})
    assert unknown.status_code == 400 and unknown.json()["code"] == "cursor-unknown", unknown.text
    assert unknown.json()["field"] == "after"
    missing = await api.get(f"/runs/{run_id}/streams/nothing/objects")
    assert missing.status_code == 404


async def test_an_upload_passing_32_mib_is_object_too_large(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """An intent of the largest size: a body passing it passes the cap, which is 413
    object-too-large (a smaller intent's is 422 size-mismatch), and nothing of it is stored."""
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare("cap", 32 * MIB))).json()
    upload = f"{path}/objects/{intent['object_id']}/body"
    before = stored(server, run_id)
    streamed = await api.put(upload, content=chunked(32 * MIB + MIB))
    assert streamed.status_code == 413, streamed.text
    assert streamed.json()["code"] == "object-too-large"
    assert stored(server, run_id) == before
    assert (await api.get(upload.removesuffix("/body"))).json()["state"] == "prepared"


async def test_an_intent_lives_at_most_a_day(api: httpx.AsyncClient, run_id: str) -> None:
    path = await new_stream(api, run_id)
    day = await api.post(f"{path}/objects", json=prepare("day", 1, expires_in_seconds=86400))
    assert day.status_code == 201, day.text
    longer = await api.post(f"{path}/objects", json=prepare("week", 1, expires_in_seconds=86401))
    assert longer.status_code == 400 and longer.json()["code"] == "invalid-input", longer.text


@pytest.mark.parametrize("declared", [1000, 9 * MIB])  # 9 MiB: past one S3 part (multipart)
async def test_an_upload_longer_than_declared_is_refused_and_nothing_of_it_is_stored(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str, declared: int
) -> None:
    path = await new_stream(api, run_id)
    body = b"x" * declared
    intent = (await api.post(f"{path}/objects", json=prepare("k", declared, body))).json()
    upload = f"{path}/objects/{intent['object_id']}/body"
    before = stored(server, run_id)

    # Announced longer than declared: refused before any of it is read.
    announced = await api.put(upload, content=body + b"y" * 1000)
    assert announced.status_code == 422, announced.text
    assert announced.json()["code"] == "size-mismatch"
    assert announced.json()["expected"] == declared
    assert announced.headers.get("connection") == "close"  # its rest is not read
    assert stored(server, run_id) == before

    # Without a length: refused as soon as it passes the declared size.
    streamed = await api.put(upload, content=chunked(declared + 3 * MIB))
    assert streamed.status_code == 422, streamed.text
    assert streamed.json()["code"] == "size-mismatch"
    assert stored(server, run_id) == before

    assert (await api.get(upload.removesuffix("/body"))).json()["state"] == "prepared"
    assert (await api.put(upload, content=body)).status_code == 200
    assert len(stored(server, run_id)) == len(before) + 1
    assert (await api.post(upload.removesuffix("/body") + "/commit")).status_code == 201
    assert (await api.get(upload)).content == body
