"""Objects: their metadata flows, what an upload sends (`Upload`, `ObjectSource`), the
prepare-upload-commit flow `put_object`, and the download's digest check (`BodyCheck`)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ductor_streams_client import models
from ductor_streams_client._core.exchange import Call, Flow, one
from ductor_streams_client._core.wire import CHUNK, Progress, new_key, object_path, stream_path
from ductor_streams_client._core.wire import encode_json as _encode
from ductor_streams_client.errors import (
    DigestMismatch,
    ObjectStateConflict,
    SizeMismatch,
)


@dataclass
class Upload:
    """An object body to send: bytes or a file (re-readable, so the upload may be retried), or
    an iterable the caller gave (read once: never retried)."""

    source: bytes | Path | Any
    size: int
    progress: Progress | None = None

    @property
    def replayable(self) -> bool:
        return isinstance(self.source, bytes | Path)

    def count(self, sent: int, chunk: bytes) -> int:
        """`sent` plus the chunk about to go, which may not pass the declared size (it is the
        Content-Length: the HTTP layer would fail on its own terms)."""
        sent += len(chunk)
        if sent > self.size:
            raise SizeMismatch(
                0,
                "size-mismatch",
                f"the body comes to more than the {self.size} bytes given as its size "
                f"({sent} so far); nothing was stored",
            )
        return sent

    def check_end(self, sent: int) -> None:
        """After the last chunk: the body may not fall short of its declared size either."""
        if sent != self.size:
            raise SizeMismatch(
                0,
                "size-mismatch",
                f"the body comes to {sent} bytes, not the {self.size} given as its size; "
                "nothing was stored",
            )

    def sync_chunks(self) -> Iterable[bytes]:
        sent = 0
        if self.progress:
            self.progress(0, self.size)
        for chunk in self._sync_source():
            sent = self.count(sent, chunk)
            yield chunk
            if self.progress:
                self.progress(sent, self.size)
        self.check_end(sent)

    def _sync_source(self) -> Iterable[bytes]:
        if isinstance(self.source, bytes):
            data = self.source
            for start in range(0, len(data), CHUNK):
                yield data[start : start + CHUNK]
        elif isinstance(self.source, Path):
            with self.source.open("rb") as file:
                while chunk := file.read(CHUNK):
                    yield chunk
        else:
            yield from self.source


def get_object(run_id: str, stream_id: str, object_id: str) -> Flow[models.ObjectIntent]:
    return one(Call("GET", object_path(run_id, stream_id, object_id), models.ObjectIntent))


def list_open_objects(
    run_id: str, stream_id: str, after: str | None, limit: int
) -> Flow[models.OpenObjectsPage]:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    return one(
        Call(
            "GET", stream_path(run_id, stream_id, "/objects"), models.OpenObjectsPage, params=params
        )
    )


def abort_object(run_id: str, stream_id: str, object_id: str) -> Flow[models.ObjectIntent]:
    return one(
        Call("POST", object_path(run_id, stream_id, object_id, "/abort"), models.ObjectIntent)
    )


@dataclass
class ObjectSource:
    """What `put_object` uploads, its size and SHA-256 (hex)."""

    body: bytes | Path | Any
    size: int
    sha256: str


def object_source(
    source: Any, size: int | None, sha256: str | None, *, iterable: type | tuple[type, ...]
) -> ObjectSource:
    """Bytes, a path (hashed here by reading it once, in chunks; blocking), or an iterable of
    `iterable` kind, for which `size` and `sha256` are required."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        return ObjectSource(
            data,
            len(data) if size is None else size,
            sha256 or hashlib.sha256(data).hexdigest(),
        )
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if size is None or sha256 is None:
            digest = hashlib.sha256()
            size = 0
            with path.open("rb") as file:
                while chunk := file.read(1024 * 1024):
                    digest.update(chunk)
                    size += len(chunk)
            sha256 = digest.hexdigest()
        return ObjectSource(path, size, sha256)
    if isinstance(source, iterable):
        if size is None or sha256 is None:
            raise ValueError("an iterable source needs size= and sha256=")
        return ObjectSource(source, size, sha256)
    raise TypeError(f"cannot upload a {type(source).__name__}: give bytes, a path or chunks")


def put_object(
    run_id: str,
    stream_id: str,
    source: ObjectSource,
    *,
    content_type: str,
    idempotency_key: str | None,
    schema: Any,
    expires_in_seconds: int | None,
    progress: Progress | None,
) -> Flow[models.CommitAnswer]:
    """Prepare (idempotent by its key), upload unless already uploaded, commit (idempotent)."""
    prepare: dict[str, Any] = {
        "idempotency_key": idempotency_key or new_key(),
        "size": source.size,
        "sha256": source.sha256.lower(),
        "content_type": content_type,
    }
    if schema is not None:
        prepare["schema"] = schema
    if expires_in_seconds is not None:
        prepare["expires_in_seconds"] = expires_in_seconds
    intent: models.ObjectIntent = yield Call(
        "POST",
        stream_path(run_id, stream_id, "/objects"),
        models.ObjectIntent,
        body=_encode(prepare),
    )
    if intent.state == "prepared":
        url = (intent.upload or {}).get("url") or object_path(
            run_id, stream_id, intent.object_id, "/body"
        )
        try:
            yield Call(
                "PUT",
                url,
                models.ObjectIntent,
                headers={"Content-Type": content_type, "Content-Length": str(source.size)},
                upload=Upload(source.body, source.size, progress),
            )
        except ObjectStateConflict:
            # An earlier try may have landed although its answer was lost.
            now: models.ObjectIntent = yield Call(
                "GET", object_path(run_id, stream_id, intent.object_id), models.ObjectIntent
            )
            if now.state not in ("uploaded", "committed"):
                raise
    committed: models.CommitAnswer = yield Call(
        "POST", object_path(run_id, stream_id, intent.object_id, "/commit"), models.CommitAnswer
    )
    return committed


def get_object_body(run_id: str, stream_id: str, object_id: str) -> Call:
    return Call("GET", object_path(run_id, stream_id, object_id, "/body"), stream=True)


class BodyCheck:
    """Checks a downloaded body against the SHA-256 its `Repr-Digest` announced."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.expected = repr_digest(response.headers.get("repr-digest"))
        self.digest = hashlib.sha256()

    def feed(self, chunk: bytes) -> bytes:
        self.digest.update(chunk)
        return chunk

    def finish(self) -> None:
        if self.expected is not None and self.digest.digest() != self.expected:
            raise DigestMismatch(
                self.status,
                "digest-mismatch",
                "the downloaded body does not match its Repr-Digest",
            )


def repr_digest(header: str | None) -> bytes | None:
    if not header:
        return None
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "sha-256" and value.startswith(":") and value.endswith(":"):
            try:
                return base64.b64decode(value[1:-1])
            except ValueError:
                return None
    return None
