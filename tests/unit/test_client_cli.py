"""The client commands refuse a server address they cannot use as a usage error (exit 2)."""

from __future__ import annotations

import pytest

from entrypoints.cli import main


@pytest.mark.parametrize("url", ["notaurl", "ftp://example.com", "http://", "127.0.0.1:8080"])
def test_a_server_url_that_is_not_http_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUCTOR_STREAMS_TOKEN", "dst_unused")
    assert main(["append", "r1", "s1", "--url", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --url must be an http:// or https:// URL, got {url!r}"]


def test_the_url_from_the_environment_is_named_when_it_is_bad(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUCTOR_STREAMS_TOKEN", "dst_unused")
    monkeypatch.setenv("DUCTOR_STREAMS_URL", "notaurl")
    assert main(["tail", "r1", "s1"]) == 2
    assert "DUCTOR_STREAMS_URL must be an http://" in capsys.readouterr().err
