"""The object-store contract on S3, over real HTTP on loopback, on two S3 implementations.

- `moto`: moto's S3 server in a thread of this process (MinIO in a container instead, when a
  Docker engine answers and testcontainers' MinIO module is installed).
- `seaweedfs`: a real SeaweedFS store (`weed server`, see tests/support/seaweedfs.py), so
  multipart uploads, checksums, ranges and listing behave as a real store's do.

Every test runs on both; every call goes through aioboto3, HTTP and an S3 API implementation,
not a mock of the client."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import BotoCoreError

from adapters.objects.s3 import LEGACY_UPLOADS, PART_SIZE, UPLOADS, S3ObjectStore
from domain.errors import ObjectTooLarge
from tests.support.object_store_contract import (
    MiB,
    ObjectStoreContract,
    chunks_of,
    evidence,
    namespace,
    read,
)
from tests.support.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedFS

REGION = "us-east-1"


class S3Endpoint:
    def __init__(self, kind: str, url: str, access_key: str, secret_key: str) -> None:
        self.kind = kind  # "moto", "minio" or "seaweedfs"
        self.url = url
        self.session = aioboto3.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=REGION
        )


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _minio() -> Iterator[S3Endpoint]:
    from testcontainers.minio import MinioContainer

    with MinioContainer() as minio:
        config = minio.get_config()
        yield S3Endpoint(
            "minio", f"http://{config['endpoint']}", config["access_key"], config["secret_key"]
        )


@contextlib.contextmanager
def _moto() -> Iterator[S3Endpoint]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Endpoint("moto", f"http://{host}:{port}", "testing", "testing")
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["moto", "seaweedfs"])
def s3_endpoint(request: pytest.FixtureRequest) -> Iterator[S3Endpoint]:
    if request.param == "seaweedfs":
        store: SeaweedFS = request.getfixturevalue("seaweedfs")
        yield S3Endpoint("seaweedfs", store.endpoint_url, ACCESS_KEY, SECRET_KEY)
        return
    minio_available = False
    if _docker_answers():
        with contextlib.suppress(ImportError):
            import testcontainers.minio  # noqa: F401  (needs the `minio` package)

            minio_available = True
    with _minio() if minio_available else _moto() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
async def s3_client(s3_endpoint: S3Endpoint) -> AsyncIterator:
    """A client of the test's own, to look at the bucket behind the store's back."""
    async with s3_endpoint.session.client("s3", endpoint_url=s3_endpoint.url) as client:
        yield client


@pytest.fixture(scope="module")
async def bucket(s3_client) -> str:
    name = "objects-" + secrets.token_hex(4)
    await s3_client.create_bucket(Bucket=name)
    return name


async def pending_uploads(s3_client, bucket: str, prefix: str = UPLOADS) -> list[dict]:
    answer = await s3_client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
    return answer.get("Uploads", [])


async def temporary_objects(s3_client, bucket: str, prefix: str = UPLOADS) -> list[dict]:
    answer = await s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return answer.get("Contents", [])


def temporary_key(prefix: str = UPLOADS) -> str:
    """Named as the store names its own: start time, random."""
    return f"{prefix}{int(time.time())}-{secrets.token_hex(12)}"


async def abandon_upload(s3_client, bucket: str, key: str) -> None:
    """What a process killed mid-put leaves: an upload with a part, never completed nor aborted.
    The part carries the SHA-256 the upload was started with, as the store's own parts do (a
    strict store such as SeaweedFS refuses a part with another algorithm's checksum)."""
    started = await s3_client.create_multipart_upload(
        Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256"
    )
    await s3_client.upload_part(
        Bucket=bucket,
        Key=key,
        UploadId=started["UploadId"],
        PartNumber=1,
        Body=b"x" * 1024,
        ChecksumAlgorithm="SHA256",
    )


class TestS3ObjectStore(ObjectStoreContract):
    @pytest.fixture
    async def store(self, s3_endpoint: S3Endpoint, bucket: str) -> AsyncIterator[S3ObjectStore]:
        async with S3ObjectStore(
            bucket, endpoint_url=s3_endpoint.url, region_name=REGION, session=s3_endpoint.session
        ) as store:
            yield store

    async def test_a_long_body_is_streamed_as_a_multipart_upload(
        self, store: S3ObjectStore, s3_client, bucket: str
    ) -> None:
        key = namespace() + "/obj-streamed"
        body = os.urandom(20 * MiB)
        parts_seen_midway: list[int] = []

        async def watched() -> AsyncIterator[bytes]:
            sent = 0
            async for chunk in chunks_of(body):
                if sent == 12 * MiB:  # the body is not all sent yet: parts must be on the server
                    [upload] = await pending_uploads(s3_client, bucket)
                    parts = await s3_client.list_parts(
                        Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    parts_seen_midway.extend(p["Size"] for p in parts.get("Parts", []))
                sent += len(chunk)
                yield chunk

        assert await store.put(key, watched(), max_size=32 * MiB) == evidence(body)
        assert parts_seen_midway == [PART_SIZE]  # one 8 MiB part uploaded before the body ended
        assert await store.stat(key) == evidence(body)
        assert hashlib.sha256(await read(store, key)).digest() == evidence(body).sha256
        assert await pending_uploads(s3_client, bucket) == []
        assert await temporary_objects(s3_client, bucket) == []

    async def test_an_oversized_multipart_upload_is_aborted(
        self, store: S3ObjectStore, s3_client, bucket: str
    ) -> None:
        key = namespace() + "/obj-aborted"
        with pytest.raises(ObjectTooLarge):
            await store.put(key, chunks_of(os.urandom(20 * MiB)), max_size=17 * MiB)
        assert await store.stat(key) is None
        assert await pending_uploads(s3_client, bucket) == []
        assert await temporary_objects(s3_client, bucket) == []

    @pytest.mark.parametrize("size", [3 * MiB, 12 * MiB], ids=["single-put", "multipart"])
    async def test_every_body_carries_our_sha256_and_the_stores_own(
        self, store: S3ObjectStore, s3_endpoint: S3Endpoint, s3_client, bucket: str, size: int
    ) -> None:
        key = namespace() + "/obj-evidence"
        body = os.urandom(size)
        await store.put(key, chunks_of(body), max_size=32 * MiB)
        head = await s3_client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        digest = hashlib.sha256(body)
        assert head["Metadata"]["sha256"] == digest.hexdigest()
        if s3_endpoint.kind == "seaweedfs" and size > PART_SIZE:
            # SeaweedFS's CopyObject keeps the source's checksum rather than computing the full
            # SHA-256 that ChecksumAlgorithm asks for (AWS and moto compute it). So the store's
            # own evidence for a multipart body is its composite checksum: the SHA-256 of the
            # SHA-256s of exactly the parts we sent, each of which it checked on upload. It is
            # not the body's digest, so stat must not take it for one: it falls back to our
            # x-amz-meta-sha256, written in the same request as the copy.
            parts = [body[at : at + PART_SIZE] for at in range(0, size, PART_SIZE)]
            composite = hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts))
            expected = base64.b64encode(composite.digest()).decode() + f"-{len(parts)}"
            assert head["ChecksumSHA256"] == expected
            assert head["ChecksumType"] == "COMPOSITE"
            assert head["ETag"].endswith(f'-{len(parts)}"')
        else:
            assert head["ChecksumSHA256"] == base64.b64encode(digest.digest()).decode()
            assert head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
            assert "-" not in head["ETag"]  # so stat takes the checksum as the store's evidence
        assert await store.stat(key) == evidence(body)

    async def test_stat_prefers_the_stores_checksum_to_the_claimed_metadata(
        self, store: S3ObjectStore, s3_client, bucket: str
    ) -> None:
        key = namespace() + "/obj-claimed"
        body = b"what is really stored"
        await s3_client.put_object(
            Bucket=bucket,
            Key=key,
            Body=body,
            ChecksumAlgorithm="SHA256",
            Metadata={"sha256": hashlib.sha256(b"a different claim").hexdigest()},
        )
        assert await store.stat(key) == evidence(body)

    async def test_stat_reads_the_body_when_the_store_attests_nothing(
        self, store: S3ObjectStore, s3_client, bucket: str
    ) -> None:
        key = namespace() + "/obj-bare"
        body = os.urandom(3 * MiB)
        # A composite multipart checksum is no full-object SHA-256, and there is no metadata.
        upload = await s3_client.create_multipart_upload(
            Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256"
        )
        part = await s3_client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=1,
            Body=body,
            ChecksumAlgorithm="SHA256",
        )
        parts = [{"PartNumber": 1, "ETag": part["ETag"], "ChecksumSHA256": part["ChecksumSHA256"]}]
        await s3_client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
        )
        head = await s3_client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        full = base64.b64encode(evidence(body).sha256).decode()
        assert head["ChecksumSHA256"] != full and "sha256" not in head["Metadata"]
        assert await store.stat(key) == evidence(body)

    async def test_a_span_is_one_ranged_get_object(self, store: S3ObjectStore) -> None:
        key = namespace() + "/obj-ranged"
        body = os.urandom(12 * MiB)
        await store.put(key, chunks_of(body), max_size=32 * MiB)
        ranges: list[bytes | None] = []

        def record(request, **_) -> None:
            ranges.append(request.headers.get("Range"))  # botocore sends header values as bytes

        events = store._client.meta.events
        events.register("before-send.s3.GetObject", record)
        try:
            tail = b"".join([c async for c in store.get(key, offset=11 * MiB, length=MiB)])
            rest = b"".join([c async for c in store.get(key, offset=5)])
            whole = await read(store, key)
        finally:
            events.unregister("before-send.s3.GetObject", record)
        assert (tail, rest, whole) == (body[11 * MiB :], body[5:], body)
        assert ranges == [f"bytes={11 * MiB}-{12 * MiB - 1}".encode(), b"bytes=5-", None]

    async def test_a_multipart_upload_started_and_never_completed_is_aborted(
        self, store: S3ObjectStore, s3_client, bucket: str
    ) -> None:
        key = temporary_key()
        await abandon_upload(s3_client, bucket, key)
        assert [u["Key"] for u in await pending_uploads(s3_client, bucket)] == [key]
        assert await store.sweep_incomplete(timedelta(hours=1)) == 0  # young: kept
        assert [u["Key"] for u in await pending_uploads(s3_client, bucket)] == [key]
        assert await store.sweep_incomplete(timedelta(0)) == 1
        assert await pending_uploads(s3_client, bucket) == []

    async def test_a_temporary_object_left_between_complete_and_copy_is_removed(
        self, store: S3ObjectStore, s3_client, bucket: str
    ) -> None:
        key = temporary_key()
        await s3_client.put_object(Bucket=bucket, Key=key, Body=b"completed, never copied")
        assert await store.sweep_incomplete(timedelta(hours=1)) == 0
        assert [o["Key"] for o in await temporary_objects(s3_client, bucket)] == [key]
        assert await store.sweep_incomplete(timedelta(0)) == 1
        assert await temporary_objects(s3_client, bucket) == []

    async def test_leftovers_under_the_old_temporary_prefix_are_swept_where_listed(
        self, store: S3ObjectStore, s3_client, bucket: str, s3_endpoint: S3Endpoint
    ) -> None:
        # Earlier versions put their temporary keys under `.uploads/`, where SeaweedFS keeps its
        # own multipart-upload state: it lists the uploads there, but hides the objects.
        upload, leftover = temporary_key(LEGACY_UPLOADS), temporary_key(LEGACY_UPLOADS)
        await abandon_upload(s3_client, bucket, upload)
        await s3_client.put_object(Bucket=bucket, Key=leftover, Body=b"completed, never copied")
        try:
            listed = [o["Key"] for o in await temporary_objects(s3_client, bucket, LEGACY_UPLOADS)]
            assert listed == ([] if s3_endpoint.kind == "seaweedfs" else [leftover])
            assert leftover not in [k async for k in store.keys("")]
            assert await store.sweep_incomplete(timedelta(hours=1)) == 0
            assert await store.sweep_incomplete(timedelta(0)) == 1 + len(listed)
            assert await pending_uploads(s3_client, bucket, LEGACY_UPLOADS) == []
            assert await temporary_objects(s3_client, bucket, LEGACY_UPLOADS) == []
        finally:
            await s3_client.delete_object(Bucket=bucket, Key=leftover)  # absent is fine

    async def test_the_temporary_prefix_is_listed_by_the_store_and_kept_out_of_keys(
        self, store: S3ObjectStore, s3_client, bucket: str
    ) -> None:
        key = temporary_key()
        await s3_client.put_object(Bucket=bucket, Key=key, Body=b"completed, never copied")
        try:
            assert [o["Key"] for o in await temporary_objects(s3_client, bucket)] == [key]
            assert [u["Key"] for u in await pending_uploads(s3_client, bucket)] == []
            assert key not in [k async for k in store.keys("")]
        finally:
            await s3_client.delete_object(Bucket=bucket, Key=key)


def _store_in_front_of(server: Any) -> S3ObjectStore:
    """A store of this adapter's on the S3 endpoint `server` (an asyncio server of a test's
    own, standing for a store that misbehaves), its bound 1 s."""
    port = server.sockets[0].getsockname()[1]
    return S3ObjectStore(
        "bucket",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        session=aioboto3.Session(aws_access_key_id="k", aws_secret_access_key="s"),
        timeout_seconds=1.0,
    )


async def test_a_put_to_a_store_that_answers_nothing_gives_up_within_its_bound() -> None:
    """A store that takes connections and answers nothing (stopped, or a partition past its
    load balancer): a put gives up within its bound, as reads do, so that the upload answers
    503. Before, a body of 1,000 bytes waited for as long as the store was silent."""
    import asyncio

    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing, close nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    store = _store_in_front_of(server)
    try:
        async with store:
            started = time.monotonic()
            with pytest.raises((TimeoutError, BotoCoreError)) as raised:  # (an outage's)
                async with asyncio.timeout(30):
                    await store.put(namespace() + "/o", chunks_of(b"x" * 1000), max_size=1000)
            assert 0.5 < time.monotonic() - started < 10, raised.value
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_a_put_draining_steadily_to_a_slow_store_completes() -> None:
    """A store that takes a body at 1 MiB/s (a slow link): a 3 MB put, bounded at 1 s plus its
    size at 256 KiB/s, completes. Its answer was read with the reads' timeout, which starts once
    the body is handed to the transport: it gave up half a bound later, while the body was
    still draining (a 1.5 MB upload at 512 KiB/s answered 503)."""
    import asyncio

    rate = 1024 * 1024  # bytes a second the store reads
    received: list[int] = []

    async def slow_store(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
        length = int({k.strip().lower(): v for k, v in fields.items()}[b"content-length"])
        if b"100-continue" in head.lower():
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        got = 0
        while got < length:
            piece = await reader.read(min(64 * 1024, length - got))
            if not piece:
                return
            got += len(piece)
            await asyncio.sleep(len(piece) / rate)
        received.append(got)
        writer.write(b'HTTP/1.1 200 OK\r\nETag: "x"\r\nContent-Length: 0\r\n\r\n')
        await writer.drain()

    server = await asyncio.start_server(slow_store, "127.0.0.1", 0, limit=1 << 20)
    store = _store_in_front_of(server)
    body = os.urandom(3_000_000)
    try:
        async with store:
            started = time.monotonic()
            stored = await store.put(namespace() + "/o", chunks_of(body), max_size=len(body))
            assert stored.size == len(body)
            assert time.monotonic() - started > 2  # (it did drain slowly)
        assert received == [len(body)]
    finally:
        server.close()
