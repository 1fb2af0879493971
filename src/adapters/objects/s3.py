"""Object bodies in an S3 bucket (AWS S3, MinIO, or any S3 API), streamed through aioboto3.

A put never holds more than one part (8 MiB) of the body. A body that fits in one part goes by a
single PutObject; a longer one by a multipart upload to a temporary key under
`.ductor-streams-uploads/` (see `UPLOADS`), then a server-side CopyObject onto the final key.
The copy is needed because S3 takes an object's metadata when the upload starts, before the
SHA-256 of the whole body is known; copying also keeps the final key atomic (a reader sees the
whole previous body or the whole new one, never a body without its digest), and an upload that
fails or passes `max_size` is aborted without ever touching the final key. What a crashed process
leaves behind there is collected by the workers (`sweep_incomplete`); buckets should also carry a
lifecycle rule that aborts incomplete multipart uploads (AbortIncompleteMultipartUpload) and
expires `.ductor-streams-uploads/` after a day, as a belt.

Evidence for `stat`, best first:
1. S3's own full-object SHA-256 (`ChecksumSHA256` without a part count). We send our digest as
   `ChecksumSHA256` with PutObject, and AWS rejects a body that does not match it; CopyObject
   with `ChecksumAlgorithm=SHA256` makes the store compute it over the copied object.
2. The `x-amz-meta-sha256` we write with every body, when the store keeps no full-object SHA-256
   (a composite multipart checksum is not one). This trusts that only this service writes the
   bucket: the metadata is written in the same atomic request as the body, so it describes that
   body unless someone else overwrites the object.
3. Otherwise, the digest is computed by reading the body (at most one object's size)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from adapters.objects.keys import RESERVED_MARK, check_span, key_segments, prefix_segments
from application.ports import StoredObject
from domain.errors import ObjectMissing, ObjectTooLarge

if TYPE_CHECKING:  # types-aiobotocore-s3, a test dependency: never imported at run time
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import HeadObjectOutputTypeDef

PART_SIZE = 8 * 1024 * 1024  # S3's minimum is 5 MiB for every part but the last
CHUNK_SIZE = 1024 * 1024
# The temporary keys of multipart puts. The leading mark keeps them apart from every body's key
# (no key segment may start with it); the service's name keeps them apart from the store's own
# internals: SeaweedFS keeps each bucket's multipart-upload state in a folder `.uploads` inside
# the bucket, so an object put under `.uploads/` there is hidden from ListObjects and is listed as
# a bogus multipart upload instead. Only this service writes under this prefix.
UPLOADS = RESERVED_MARK + "ductor-streams-uploads/"
# Where versions before that put their temporary keys: still swept, where the store shows them.
LEGACY_UPLOADS = RESERVED_MARK + "uploads/"
_TEMPORARY = (UPLOADS, LEGACY_UPLOADS)
_SHA256 = "sha256"  # stored as x-amz-meta-sha256 (hex)
_MISSING = {"404", "NoSuchKey", "NotFound"}

# A store that goes silent (a partition) holds one request to it for about this long by
# default: botocore's defaults (a minute to connect and a minute per read, retried up to five
# times) would hold it for minutes. A read that gets nothing for half of it gives up, the
# connection gets a quarter, and a request is tried twice (one retry: S3 stores answer a
# transient 500 or SlowDown now and then), so a silent store costs two halves.
TIMEOUT_SECONDS = 5.0
# A write (a body, or a part of one) to a store that answers nothing escaped those bounds: a
# hostile tester stopped the store (its connections open, nothing answered) and an upload of
# 1,000 bytes had no answer in 100 s, while reads and commits answered 503 within 5 s. So each
# write is bounded as a whole: TIMEOUT_SECONDS, plus its size at this rate. Its answer is read
# by a client of its own, whose read timeout starts once the body is handed to the transport,
# not once it is sent: with the reads' half of the bound, a body still draining at 512 KiB/s
# was given up on after 2.5 s (a 1.5 MB upload answered 503). The writes' client waits for
# the largest part at this rate too; the bound around each write is what ends it.
WRITE_MIN_BYTES_PER_SECOND = 256 * 1024


class S3ObjectStore:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        session: aioboto3.Session | None = None,
        timeout_seconds: float = TIMEOUT_SECONDS,
    ) -> None:
        self._bucket = bucket
        self._timeout = timeout_seconds

        def config(read_timeout: float) -> AioConfig:
            return AioConfig(
                connect_timeout=timeout_seconds / 4,
                read_timeout=read_timeout,
                retries={"total_max_attempts": 2, "mode": "standard"},
            )

        self._config = config(timeout_seconds / 2)
        self._writes_config = config(timeout_seconds / 2 + PART_SIZE / WRITE_MIN_BYTES_PER_SECOND)
        self._endpoint_url = endpoint_url
        self._region_name = region_name
        self._session = session or aioboto3.Session()
        self._stack: contextlib.AsyncExitStack | None = None
        self._s3: S3Client | None = None
        self._s3_writes: S3Client | None = None

    async def start(self) -> None:
        """Open the clients every call shares (their connection pools included): one for the
        bodies' writes, one for everything else."""
        if self._stack is not None:
            return
        stack = contextlib.AsyncExitStack()
        self._s3, self._s3_writes = [
            await stack.enter_async_context(
                self._session.client(
                    "s3",
                    endpoint_url=self._endpoint_url,
                    region_name=self._region_name,
                    config=config,
                )
            )
            for config in (self._config, self._writes_config)
        ]
        self._stack = stack

    async def close(self) -> None:
        stack, self._stack, self._s3, self._s3_writes = self._stack, None, None, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> S3ObjectStore:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def _client(self) -> S3Client:
        if self._s3 is None:
            raise RuntimeError("S3ObjectStore.start() has not been awaited")
        return self._s3

    async def put(
        self,
        key: str,
        chunks: AsyncIterator[bytes],
        *,
        max_size: int,
        expect: StoredObject | None = None,
    ) -> StoredObject:
        key_segments(key)
        s3 = self._client
        writes = self._s3_writes
        assert writes is not None
        digest = hashlib.sha256()
        size = 0
        part = bytearray()
        upload: _Multipart | None = None
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_size:
                    raise ObjectTooLarge(f"the body passes {max_size} bytes", max_size=max_size)
                digest.update(chunk)
                part += chunk
                if len(part) >= PART_SIZE:
                    if upload is None:
                        upload = await _Multipart.create(s3, writes, self._bucket)
                    async with asyncio.timeout(self._write_bound(len(part))):
                        await upload.send(bytes(part))
                    part.clear()
            stored = StoredObject(size=size, sha256=digest.digest())
            if expect is not None and stored != expect:
                if upload is not None:
                    await upload.discard()
                return stored  # nothing written at `key`
            if upload is None:
                async with asyncio.timeout(self._write_bound(len(part))):
                    await writes.put_object(
                        Bucket=self._bucket,
                        Key=key,
                        Body=bytes(part),
                        ChecksumAlgorithm="SHA256",
                        ChecksumSHA256=_b64(digest.digest()),
                        Metadata={_SHA256: digest.hexdigest()},
                    )
                return stored
            if part:
                async with asyncio.timeout(self._write_bound(len(part))):
                    await upload.send(bytes(part))
            await upload.complete()
        except BaseException:
            if upload is not None:
                await upload.discard()
            raise
        try:
            await self._copy(upload.key, key, digest.digest())
        finally:
            await upload.discard()
        return stored

    def _write_bound(self, size: int) -> float:
        return self._timeout + size / WRITE_MIN_BYTES_PER_SECOND

    async def _copy(self, source: str, key: str, sha256: bytes) -> None:
        answer = await self._client.copy_object(
            Bucket=self._bucket,
            Key=key,
            CopySource={"Bucket": self._bucket, "Key": source},
            MetadataDirective="REPLACE",
            Metadata={_SHA256: sha256.hex()},
            ChecksumAlgorithm="SHA256",
        )
        stored = answer.get("CopyObjectResult", {}).get("ChecksumSHA256")
        # The body is in place by now; failing the put keeps a damaged copy from being reported
        # as stored, and `stat` will report the store's digest, so a commit refuses it too.
        if stored is not None and _full_object(stored) and stored != _b64(sha256):
            raise OSError(f"S3 stored a different body at {key!r} than the one sent")

    async def stat(self, key: str) -> StoredObject | None:
        key_segments(key)
        try:
            head = await self._client.head_object(
                Bucket=self._bucket, Key=key, ChecksumMode="ENABLED"
            )
        except ClientError as error:
            if _code(error) in _MISSING:
                return None
            raise
        size = head["ContentLength"]
        checksum = head.get("ChecksumSHA256")
        if checksum and _full_object(checksum, head):
            return StoredObject(size=size, sha256=base64.b64decode(checksum))
        claimed = head.get("Metadata", {}).get(_SHA256)
        if claimed:
            return StoredObject(size=size, sha256=bytes.fromhex(claimed))
        digest = hashlib.sha256()
        counted = 0
        try:
            async for chunk in self.get(key):
                digest.update(chunk)
                counted += len(chunk)
        except ObjectMissing:
            return None
        return StoredObject(size=counted, sha256=digest.digest())

    async def get(
        self, key: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        key_segments(key)
        check_span(offset, length)
        if length == 0:  # no Range can ask for nothing; the key must still exist
            if await self._size(key) is None:
                raise ObjectMissing(f"no object is stored at {key!r}")
            return
        request: dict[str, Any] = {"Bucket": self._bucket, "Key": key}
        if offset or length is not None:
            last = "" if length is None else str(offset + length - 1)
            request["Range"] = f"bytes={offset}-{last}"
        try:
            answer = await self._client.get_object(**request)
        except ClientError as error:
            if _code(error) in _MISSING:
                raise ObjectMissing(f"no object is stored at {key!r}") from None
            if _code(error) == "InvalidRange":  # the span starts at or past the body's end
                if await self._size(key) is not None:
                    return
                raise ObjectMissing(f"no object is stored at {key!r}") from None
            raise
        body = answer["Body"]
        try:
            async for chunk in body.iter_chunks(CHUNK_SIZE):
                yield chunk
        finally:
            body.close()

    async def _size(self, key: str) -> int | None:
        """The stored body's size, without its digest (None: nothing stored at `key`)."""
        try:
            head = await self._client.head_object(Bucket=self._bucket, Key=key)
        except ClientError as error:
            if _code(error) in _MISSING:
                return None
            raise
        return head["ContentLength"]

    async def delete(self, key: str) -> None:
        key_segments(key)
        await self._client.delete_object(Bucket=self._bucket, Key=key)  # S3: absent is fine

    async def keys(self, prefix: str) -> AsyncIterator[str]:
        prefix_segments(prefix)
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, Prefix=prefix
        )
        async for page in pages:
            for item in page.get("Contents", ()):
                if not item["Key"].startswith(_TEMPORARY):
                    yield item["Key"]

    async def sweep_incomplete(self, older_than: timedelta) -> int:
        """Abort the multipart uploads to temporary keys started more than `older_than` ago, and
        delete the temporary objects older than that (a put killed between its upload's
        completion and the copy). Keys under `LEGACY_UPLOADS`, left by earlier versions, are
        swept too, as far as the store lists them (SeaweedFS lists its multipart uploads there,
        but hides objects). The bucket's lifecycle rule (AbortIncompleteMultipartUpload, and
        expiring the temporary prefix) is the belt to this."""
        cutoff = time.time() - older_than.total_seconds()
        removed = 0
        for prefix in _TEMPORARY:
            removed += await self._sweep_prefix(prefix, cutoff)
        return removed

    async def _sweep_prefix(self, prefix: str, cutoff: float) -> int:
        s3 = self._client
        removed = 0
        # Each key is checked against the prefix too: a store's own entries (SeaweedFS lists an
        # object it keeps under `.uploads/` as an upload with an empty key) are never touched.
        pages = s3.get_paginator("list_multipart_uploads").paginate(
            Bucket=self._bucket, Prefix=prefix
        )
        async for page in pages:
            for upload in page.get("Uploads", ()):
                key = upload["Key"]
                if key.startswith(prefix) and _started(key, upload["Initiated"]) <= cutoff:
                    with contextlib.suppress(ClientError):  # finished or aborted meanwhile
                        await s3.abort_multipart_upload(
                            Bucket=self._bucket, Key=key, UploadId=upload["UploadId"]
                        )
                        removed += 1
        objects = s3.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix)
        async for listed in objects:
            for item in listed.get("Contents", ()):
                key = item["Key"]
                if key.startswith(prefix) and _started(key, item["LastModified"]) <= cutoff:
                    await s3.delete_object(Bucket=self._bucket, Key=key)
                    removed += 1
        return removed


class _Multipart:
    """One multipart upload to a temporary key, each part checked by S3 against its SHA-256."""

    def __init__(self, s3: Any, writes: Any, bucket: str, key: str, upload_id: str) -> None:
        self._s3 = s3
        self._writes = writes  # (the parts' client)
        self._bucket = bucket
        self.key = key
        self._upload_id = upload_id
        self._parts: list[dict[str, Any]] = []
        self._completed = False

    @classmethod
    async def create(cls, s3: Any, writes: Any, bucket: str) -> _Multipart:
        key = f"{UPLOADS}{int(time.time())}-{secrets.token_hex(12)}"
        answer = await s3.create_multipart_upload(
            Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256"
        )
        return cls(s3, writes, bucket, key, answer["UploadId"])

    async def send(self, body: bytes) -> None:
        number = len(self._parts) + 1
        checksum = _b64(hashlib.sha256(body).digest())
        answer = await self._writes.upload_part(
            Bucket=self._bucket,
            Key=self.key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=checksum,
        )
        self._parts.append(
            {"PartNumber": number, "ETag": answer["ETag"], "ChecksumSHA256": checksum}
        )

    async def complete(self) -> None:
        await self._s3.complete_multipart_upload(
            Bucket=self._bucket,
            Key=self.key,
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._parts},
        )
        self._completed = True

    async def discard(self) -> None:
        """Abort the upload, or delete its temporary object once completed; never raises."""
        with contextlib.suppress(Exception):
            if self._completed:
                await self._s3.delete_object(Bucket=self._bucket, Key=self.key)
            else:
                await self._s3.abort_multipart_upload(
                    Bucket=self._bucket, Key=self.key, UploadId=self._upload_id
                )


def _started(key: str, stamped: datetime) -> float:
    """When the upload to temporary `key` started: the time this service put in its name
    (`<unix seconds>-<random>`), else what the store stamped (some S3 APIs stamp no real
    time on multipart uploads)."""
    name = key.rpartition("/")[2]
    started, dash, _ = name.partition("-")
    return float(started) if dash and started.isdigit() else stamped.timestamp()


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _full_object(checksum: str, head: HeadObjectOutputTypeDef | None = None) -> bool:
    """Whether a ChecksumSHA256 is the SHA-256 of the whole body, not of its parts' digests."""
    if "-" in checksum:  # a composite checksum ends in "-<number of parts>"
        return False
    if head is None or "ChecksumType" in head:
        return head is None or head["ChecksumType"] == "FULL_OBJECT"
    # Without a ChecksumType (older S3 APIs, moto), a multipart ETag ("…-<parts>") warns that
    # the checksum may be composite even when it lacks the suffix.
    return "-" not in head.get("ETag", "")


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))
