"""An in-memory object store for unit tests, held to the same contract as the real ones."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta

from adapters.objects.keys import check_span, key_segments, prefix_segments
from application.ports import StoredObject
from domain.errors import ObjectMissing, ObjectTooLarge

CHUNK_SIZE = 1024 * 1024


class MemoryObjectStore:
    def __init__(self) -> None:
        self._bodies: dict[str, bytes] = {}
        # Uploads in progress: when each started, as the other stores keep temp files and
        # multipart uploads; a swept one fails instead of storing its body.
        self._uploads: dict[int, float] = {}
        self._next_upload = 0

    async def put(
        self,
        key: str,
        chunks: AsyncIterator[bytes],
        *,
        max_size: int,
        expect: StoredObject | None = None,
    ) -> StoredObject:
        key_segments(key)
        parts: list[bytes] = []
        size = 0
        digest = hashlib.sha256()
        upload = self._next_upload = self._next_upload + 1
        self._uploads[upload] = time.time()
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_size:
                    raise ObjectTooLarge(f"the body passes {max_size} bytes", max_size=max_size)
                digest.update(chunk)
                parts.append(chunk)
            if upload not in self._uploads:
                raise RuntimeError("the upload was swept as abandoned before it completed")
        finally:
            self._uploads.pop(upload, None)
        stored = StoredObject(size=size, sha256=digest.digest())
        if expect is None or stored == expect:
            self._bodies[key] = b"".join(parts)  # one assignment: the whole old body or the new
        return stored

    async def stat(self, key: str) -> StoredObject | None:
        key_segments(key)
        body = self._bodies.get(key)
        if body is None:
            return None
        return StoredObject(size=len(body), sha256=hashlib.sha256(body).digest())

    async def get(
        self, key: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        key_segments(key)
        check_span(offset, length)
        body = self._bodies.get(key)
        if body is None:
            raise ObjectMissing(f"no object is stored at {key!r}")
        end = len(body) if length is None else min(len(body), offset + length)
        for start in range(offset, end, CHUNK_SIZE):
            yield body[start : min(start + CHUNK_SIZE, end)]

    async def delete(self, key: str) -> None:
        key_segments(key)
        self._bodies.pop(key, None)

    async def keys(self, prefix: str) -> AsyncIterator[str]:
        prefix_segments(prefix)
        for key in sorted(self._bodies):
            if key.startswith(prefix):
                yield key

    async def sweep_incomplete(self, older_than: timedelta) -> int:
        cutoff = time.time() - older_than.total_seconds()
        stale = [upload for upload, started in self._uploads.items() if started <= cutoff]
        for upload in stale:
            del self._uploads[upload]
        return len(stale)
