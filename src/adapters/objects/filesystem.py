"""Object bodies as files under one root directory (single-node deployments, development).

A put streams to a temporary file beside the final one, counting and hashing each chunk, then
fsyncs it and renames it over the final path: a reader opens either the whole previous body or
the whole new one, and a failed or oversized put leaves the key as it was.

`stat` recomputes the SHA-256 from the file rather than reading a sidecar written at put time.
The commit path takes `stat` as the store's evidence of what is really stored, and a sidecar
would only repeat what the writer claimed: it could not catch a body truncated or damaged after
the put, and the body and a sidecar cannot be renamed into place together, so a sidecar could
describe a different body than the one a concurrent reader opens. Size and digest come from one
open file descriptor, i.e. one version of the body. The cost is bounded by the largest object
(32 MiB: tens of milliseconds, usually from the page cache right after the upload) and is paid
in a worker thread, off the event loop.

All blocking I/O runs in worker threads, one chunk at a time, so memory stays flat."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from adapters.objects.keys import RESERVED_MARK, check_span, key_segments, prefix_segments
from application.ports import StoredObject
from domain.errors import ObjectMissing, ObjectTooLarge

CHUNK_SIZE = 1024 * 1024
_TEMP_PREFIX = RESERVED_MARK + "upload-"


class FilesystemObjectStore:
    def __init__(self, root: Path) -> None:
        self._root = Path(root).resolve()

    def path(self, key: str) -> Path:
        """The file of `key`: always inside the root (ValueError for a key that is not safe)."""
        return self._root.joinpath(*key_segments(key))

    async def put(
        self,
        key: str,
        chunks: AsyncIterator[bytes],
        *,
        max_size: int,
        expect: StoredObject | None = None,
    ) -> StoredObject:
        path = self.path(key)
        file, temp = await asyncio.to_thread(_create_temp, path)
        digest = hashlib.sha256()
        size = 0
        pending = bytearray()  # small chunks are gathered so each thread hop writes ~1 MiB
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_size:
                    raise ObjectTooLarge(f"the body passes {max_size} bytes", max_size=max_size)
                pending += chunk
                if len(pending) >= CHUNK_SIZE:
                    await asyncio.to_thread(_write, file, digest, bytes(pending))
                    pending.clear()
            if pending:
                await asyncio.to_thread(_write, file, digest, bytes(pending))
            stored = StoredObject(size=size, sha256=digest.digest())
            if expect is not None and stored != expect:
                raise _NotExpected(stored)
            await asyncio.to_thread(_publish, file, temp, path)
        except _NotExpected as refused:
            file.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            return refused.stored
        except BaseException:
            # Synchronous on purpose: it must run even when the task is being cancelled. The
            # buffered file's lock makes close wait for a write still running in its thread.
            file.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        return stored

    async def stat(self, key: str) -> StoredObject | None:
        return await asyncio.to_thread(_stat, self.path(key))

    async def get(
        self, key: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        check_span(offset, length)
        path = self.path(key)
        try:
            file = await asyncio.to_thread(open, path, "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectMissing(f"no object is stored at {key!r}") from None
        try:
            if offset:
                await asyncio.to_thread(file.seek, offset)
            left = length
            while left is None or left > 0:
                wanted = CHUNK_SIZE if left is None else min(CHUNK_SIZE, left)
                chunk = await asyncio.to_thread(file.read, wanted)
                if not chunk:
                    break
                if left is not None:
                    left -= len(chunk)
                yield chunk
        finally:
            file.close()

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(_unlink, self.path(key))

    async def keys(self, prefix: str) -> AsyncIterator[str]:
        complete, _ = prefix_segments(prefix)
        # Walk only below the directory the prefix names in full, one directory per thread hop.
        walker = os.walk(self._root.joinpath(*complete))
        while (entry := await asyncio.to_thread(next, walker, None)) is not None:
            directory, subdirectories, files = entry
            base = Path(directory).relative_to(self._root).as_posix()
            base = "" if base == "." else base + "/"
            subdirectories[:] = sorted(
                name
                for name in subdirectories
                if not name.startswith(RESERVED_MARK) and _may_hold(base + name + "/", prefix)
            )
            for name in sorted(files):
                key = base + name
                if not name.startswith(RESERVED_MARK) and key.startswith(prefix):
                    yield key

    async def sweep_incomplete(self, older_than: timedelta) -> int:
        """Remove upload temporary files not written for `older_than` (a put killed mid-way
        leaves its temp file behind). A running put writes its temp file at least once per
        chunk, so its modification time stays fresh while the upload moves."""
        cutoff = time.time() - older_than.total_seconds()
        walker = os.walk(self._root)
        removed = 0
        while (entry := await asyncio.to_thread(next, walker, None)) is not None:
            directory, subdirectories, files = entry
            subdirectories[:] = [d for d in subdirectories if not d.startswith(RESERVED_MARK)]
            stray = [name for name in files if name.startswith(_TEMP_PREFIX)]
            if stray:
                removed += await asyncio.to_thread(_remove_stale, Path(directory), stray, cutoff)
        return removed


def _remove_stale(directory: Path, names: list[str], cutoff: float) -> int:
    removed = 0
    for name in names:
        path = directory / name
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # finished (renamed) or failed (unlinked) meanwhile
            continue
    return removed


def _may_hold(directory: str, prefix: str) -> bool:
    return directory.startswith(prefix) or prefix.startswith(directory)


def _create_temp(path: Path) -> tuple[BinaryIO, str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=path.parent)
    return os.fdopen(descriptor, "wb"), temp


def _write(file: BinaryIO, digest: hashlib._Hash, chunk: bytes) -> None:
    digest.update(chunk)
    file.write(chunk)


class _NotExpected(Exception):
    """The body is not the one expected: its temporary file is removed, never published."""

    def __init__(self, stored: StoredObject) -> None:
        self.stored = stored


def _publish(file: BinaryIO, temp: str, path: Path) -> None:
    with file:
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    # The rename itself is durable only once the directory entry is on disk.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _stat(path: Path) -> StoredObject | None:
    try:
        file = open(path, "rb")  # noqa: SIM115 - closed below, after the fstat and the hashing
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    with file:
        size = os.fstat(file.fileno()).st_size
        digest = hashlib.file_digest(file, "sha256")
    return StoredObject(size=size, sha256=digest.digest())


def _unlink(path: Path) -> None:
    # Empty directories stay: removing one could race a put that has just created it.
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
        os.unlink(path)
