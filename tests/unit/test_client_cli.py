"""The client commands refuse what they cannot use (a server address, bad JSON) as a usage
error: one line on stderr, exit 2."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from entrypoints.cli import build_parser, main


@pytest.mark.parametrize("url", ["notaurl", "ftp://example.com", "http://", "127.0.0.1:8080"])
def test_a_server_url_that_is_not_http_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUCTOR_STREAMS_TOKEN", "dst_unused")
    assert main(["append", "r1", "s1", "--url", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ductor-streams: error: --url must be an http:// or https:// URL, got {url!r}"]


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
    assert line.startswith("ductor-streams: error: argument 2 is not valid JSON: ")
    monkeypatch.setattr("sys.stdin", io.StringIO(f"1\n{text}\n"))
    assert main(["append", "r1", "s1"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ductor-streams: error: stdin line 2 is not valid JSON: ")


def commands(tmp_path: Path) -> list[list[str]]:
    """Every client command, with arguments that would reach the server."""
    body = tmp_path / "body.bin"
    body.write_bytes(b"x")
    return [
        ["tail", "r1", "s1"],
        ["append", "r1", "s1", "1"],
        ["put-object", "r1", "s1", str(body), "--no-progress"],
        ["token", "list", "--server"],
        ["token", "create", "--server", "--scope", "streams:read", "--expires-in", "60"],
        ["token", "revoke", "--server", "tok_0123456789abcdef"],
    ]


def one_usage_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "Traceback" not in captured.err
    [line] = captured.err.strip().splitlines()
    return line


@pytest.mark.parametrize(
    ("option", "environment", "named"),
    [
        (["--token", "tökén"], {}, "--token"),
        ([], {"DUCTOR_STREAMS_TOKEN": "tökén"}, "DUCTOR_STREAMS_TOKEN"),
        ([], {"DUCTOR_STREAMS_TOKEN": "dst_a\x01b"}, "DUCTOR_STREAMS_TOKEN"),
        (["--token", "dst a b"], {}, "--token"),
    ],
)
def test_a_token_no_header_can_carry_is_a_usage_error_naming_where_it_came_from(
    option: list[str],
    environment: dict[str, str],
    named: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It raised ValueError from the client's constructor: a traceback.
    monkeypatch.delenv("DUCTOR_STREAMS_TOKEN", raising=False)
    monkeypatch.setenv("DUCTOR_STREAMS_URL", "http://127.0.0.1:9")  # never reached
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    for command in commands(tmp_path):
        line = one_usage_line(capsys, main([*command, *option]))
        assert line == (
            f"ductor-streams: error: the token of {named} holds a character no Bearer token has "
            "(a space, a control character or non-ASCII)"
        ), command


def test_the_development_token_file_is_named_when_its_token_is_bad(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DUCTOR_STREAMS_TOKEN", raising=False)
    monkeypatch.setenv("DUCTOR_STREAMS_DATA_DIR", str(tmp_path))
    (tmp_path / "dev-token").write_text("tök\n")
    line = one_usage_line(capsys, main(["tail", "r1", "s1", "--url", "http://127.0.0.1:9"]))
    assert f"the token of {tmp_path / 'dev-token'} holds a character" in line


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:0", "its port is not 1 to 65535"),
        ("http://127.0.0.1:port", "Port could not be cast"),
    ],
)
def test_a_server_url_that_no_request_could_use_is_a_usage_error(
    url: str,
    reason: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `http://[::1` raised ValueError from urlsplit; port 99999 OverflowError in an
    # ExceptionGroup from the socket, on every attempt: tracebacks both.
    monkeypatch.setenv("DUCTOR_STREAMS_TOKEN", "dst_unused")
    for command in commands(tmp_path):
        line = one_usage_line(capsys, main([*command, "--url", url]))
        assert line.startswith(
            f"ductor-streams: error: --url must be an http:// or https:// URL, got {url!r}: "
        )
        assert reason in line, line
    monkeypatch.setenv("DUCTOR_STREAMS_URL", url)
    line = one_usage_line(capsys, main(["tail", "r1", "s1"]))
    assert line.startswith(
        f"ductor-streams: error: DUCTOR_STREAMS_URL must be an http:// or https:// URL, got {url!r}"
    )


@pytest.mark.parametrize("key", ["ключ", "k" * 256, "", " k", "line\nbreak"])
def test_an_idempotency_key_no_header_can_carry_is_a_usage_error(
    key: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client's ValueError came out as a traceback.
    monkeypatch.setenv("DUCTOR_STREAMS_TOKEN", "dst_unused")
    monkeypatch.setenv("DUCTOR_STREAMS_URL", "http://127.0.0.1:9")  # never reached
    line = one_usage_line(capsys, main(["append", "r1", "s1", "1", "--idempotency-key", key]))
    assert line.startswith(
        "ductor-streams: error: --idempotency-key is 1 to 255 printable ASCII characters"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["append", "r1", "s1", "--url", "http://h:1", '{"a":1}', "2"],
        ["append", "--url", "http://h:1", "r1", "s1", '{"a":1}', "2"],
        ["append", "r1", "--url", "http://h:1", "s1", '{"a":1}', "--token", "t", "2"],
        ["append", "r1", "s1", '{"a":1}', "2", "--url", "http://h:1"],
    ],
)
def test_options_go_anywhere_among_a_commands_arguments(argv: list[str]) -> None:
    # An option between STREAM and the JSON arguments left them unrecognized, with the
    # top-level usage.
    args = build_parser().parse_args(argv)
    assert (args.run, args.stream, args.records, args.url) == (
        "r1",
        "s1",
        ['{"a":1}', "2"],
        "http://h:1",
    )
    tail = build_parser().parse_args(["tail", "r1", "--cursor", "3", "s1"])
    assert (tail.run, tail.stream, tail.cursor) == ("r1", "s1", 3)
    dashed = build_parser().parse_args(["append", "r1", "s1", "--url", "http://h:1", "--", "-1"])
    assert dashed.records == ["-1"]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["append", "r1", "s1", "1", "--bogus"], "append"),
        (["serve", "--bogus"], "serve"),
        (["token", "create", "--scope", "streams:read", "extra"], "token create"),
    ],
)
def test_what_a_command_does_not_know_is_refused_with_its_own_usage(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: ductor-streams {command} ")
    assert f"ductor-streams {command}: error: unrecognized arguments: {argv[-1]}" in err
