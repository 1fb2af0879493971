"""The object-store contract on the filesystem adapter, plus what only a filesystem can get wrong:
keys that would climb out of the root, and temporary files left behind or listed."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

import pytest

from adapters.objects.filesystem import FilesystemObjectStore
from domain.errors import ObjectMissing, ObjectTooLarge
from tests.support.object_store_contract import ObjectStoreContract, chunks_of, from_list, read

ESCAPING_KEYS = [
    "",
    "../outside",
    "a/../../outside",
    "a/..",
    "..",
    "/etc/passwd",
    "//server/share",
    "a//b",
    "a/",
    "a/./b",
    ".upload-x",
    "a/.hidden",
    "a\\..\\..\\outside",
    "a/b\x00c",
]


class TestFilesystemObjectStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> FilesystemObjectStore:
        return FilesystemObjectStore(tmp_path / "objects")

    @pytest.mark.parametrize("key", ESCAPING_KEYS)
    async def test_a_key_that_could_escape_the_root_is_refused(
        self, store: FilesystemObjectStore, tmp_path: Path, key: str
    ) -> None:
        with pytest.raises(ValueError):
            await store.put(key, from_list([b"x"]), max_size=10)
        with pytest.raises(ValueError):
            await store.stat(key)
        with pytest.raises(ValueError):
            await read(store, key)
        with pytest.raises(ValueError):
            await store.delete(key)
        assert os.listdir(tmp_path) == []  # not even the root was created

    @pytest.mark.parametrize("prefix", ["../", "/", "a//", "a/../"])
    async def test_a_listing_prefix_that_could_escape_is_refused(
        self, store: FilesystemObjectStore, prefix: str
    ) -> None:
        with pytest.raises(ValueError):
            [key async for key in store.keys(prefix)]

    async def test_a_listing_prefix_ending_mid_segment_stays_inside(
        self, store: FilesystemObjectStore, tmp_path: Path
    ) -> None:
        (tmp_path / "secret").write_bytes(b"outside the root")
        await store.put("a/b", from_list([b"x"]), max_size=10)
        assert [key async for key in store.keys("..")] == []
        assert [key async for key in store.keys("a/..")] == []

    async def test_failed_puts_leave_no_temporary_files(
        self, store: FilesystemObjectStore, tmp_path: Path
    ) -> None:
        with pytest.raises(ObjectTooLarge):
            await store.put("t/r/s/obj-1", chunks_of(b"z" * 4096, 1000), max_size=3000)
        await store.put("t/r/s/obj-2", from_list([b"kept"]), max_size=10)
        assert os.listdir(tmp_path / "objects" / "t" / "r" / "s") == ["obj-2"]

    async def test_a_directory_is_not_an_object(self, store: FilesystemObjectStore) -> None:
        await store.put("t/r/s/obj-1", from_list([b"x"]), max_size=10)
        assert await store.stat("t/r/s") is None
        with pytest.raises(ObjectMissing):
            await read(store, "t/r")
        await store.delete("t/r/s/obj-1/deeper")

    async def test_stat_reads_what_is_on_disk_not_what_was_sent(
        self, store: FilesystemObjectStore
    ) -> None:
        await store.put("t/r/s/obj-1", from_list([b"original"]), max_size=100)
        store.path("t/r/s/obj-1").write_bytes(b"damaged")
        stored = await store.stat("t/r/s/obj-1")
        assert stored is not None and stored.size == len(b"damaged")

    async def test_a_span_reads_only_its_bytes_from_disk(
        self, store: FilesystemObjectStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        key = "t/r/s/obj-1"
        body = os.urandom(32 * 1024 * 1024)
        await store.put(key, chunks_of(body), max_size=len(body))
        read_bytes = 0

        class Counted:
            def __init__(self, file: BinaryIO) -> None:
                self._file = file

            def read(self, size: int = -1) -> bytes:
                nonlocal read_bytes
                data = self._file.read(size)
                read_bytes += len(data)
                return data

            def __getattr__(self, name: str):
                return getattr(self._file, name)

        real_open = open
        monkeypatch.setattr(
            "adapters.objects.filesystem.open",
            lambda *args, **kwargs: Counted(real_open(*args, **kwargs)),
            raising=False,
        )
        tail = body[-1000 - 17 : -17]
        got = b"".join([c async for c in store.get(key, offset=len(body) - 1017, length=1000)])
        assert got == tail
        assert read_bytes == 1000

    async def test_stray_temporary_files_older_than_the_age_are_swept(
        self, store: FilesystemObjectStore
    ) -> None:
        await store.put("t/run/stream/obj-kept", chunks_of(b"body"), max_size=100)
        directory = store.path("t/run/stream/obj-kept").parent
        old, young = directory / ".upload-old", directory / ".upload-young"
        old.write_bytes(b"left by a killed put")
        young.write_bytes(b"being written")
        os.utime(old, (0, 0))
        assert await store.sweep_incomplete(timedelta(hours=1)) == 1
        assert not old.exists() and young.exists()
        assert await read(store, "t/run/stream/obj-kept") == b"body"
