"""The client commands refuse what they cannot use (a server address, bad JSON) as a usage
error: one line on stderr, exit 2."""

from __future__ import annotations

import io

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


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e400", "[1, -1e999]"])
def test_a_number_json_cannot_carry_is_bad_json_not_sent_as_null(
    text: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python's json.loads takes NaN and Infinity and makes 1e400 infinity; the client sent
    # each as null, and the append succeeded.
    monkeypatch.setenv("DUCTOR_STREAMS_TOKEN", "dst_unused")
    monkeypatch.setenv("DUCTOR_STREAMS_URL", "http://127.0.0.1:9")  # never reached
    assert main(["append", "r1", "s1", "--", "1", text]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: argument 2 is not valid JSON: ")
    monkeypatch.setattr("sys.stdin", io.StringIO(f"1\n{text}\n"))
    assert main(["append", "r1", "s1"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: stdin line 2 is not valid JSON: ")
