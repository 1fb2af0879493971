"""Serving safely from the command line: a busy port is refused, stopping `python3 dev.py serve`
stops everything it started, slow or oversize requests lose their connection, and every log
line is one JSON object."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ROOT, ServerProcess, free_port

PREFIX = "/api/workflow-streams"


@pytest.fixture
def embedded_dir() -> Iterator[Path]:
    """A data directory for an embedded PostgreSQL. Not below pytest's tmp_path: run as root,
    the wheel runs PostgreSQL as a user of its own, which cannot enter that private folder."""
    path = Path(tempfile.mkdtemp(prefix="ds-serving-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def service_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """This environment without any DUCTOR_STREAMS_ setting (so PostgreSQL is the embedded one
    unless given), plus `settings` (names without the prefix)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    env["DUCTOR_STREAMS_DATA_DIR"] = str(data_dir)
    env.update({f"DUCTOR_STREAMS_{name}": value for name, value in settings.items()})
    return env


def serve(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoints.cli", "serve", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def refused(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of a server expected to give up at once."""
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the server did not refuse and kept running:\n{out}\n{err}")
    return process.returncode, out, err


def processes_of(data_dir: Path, port: int | None = None) -> list[psutil.Process]:
    """Live processes whose command line names `data_dir` (the embedded PostgreSQL: `-D
    <data_dir>/pg`) or, given `port`, a server started with `--port <port>`."""
    marks = [str(data_dir.resolve())]
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        named = any(mark in part for part in cmdline for mark in marks)
        serving = port is not None and "serve" in cmdline and str(port) in cmdline
        if named or serving:
            found.append(process)
    return found


def assert_one_line_about_the_port(code: int, out: str, err: str, port: int) -> None:
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(port) in lines[0] and "--port" in lines[0], lines[0]
    assert "listening" not in out


def test_a_port_another_program_holds_is_refused_before_anything_starts(
    embedded_dir: Path,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        code, out, err = refused(serve(service_env(embedded_dir), "--port", str(port)))
    assert_one_line_about_the_port(code, out, err, port)
    assert not (embedded_dir / "pg").exists()  # the embedded PostgreSQL was never started
    assert not processes_of(embedded_dir)


def test_a_second_server_on_a_busy_port_is_refused_and_the_first_keeps_serving(
    server: ServerProcess, database_url: str, tmp_path: Path
) -> None:
    env = service_env(tmp_path, DATABASE_URL=database_url, BOOTSTRAP_TOKEN="dst_other")
    code, out, err = refused(serve(env, "--port", str(server.port), "--no-workers"))
    assert_one_line_about_the_port(code, out, err, server.port)
    for _ in range(5):  # new connections each time: every one reaches the first server
        answer = httpx.get(
            f"{server.base_url}{PREFIX}/runs/nope/streams",
            headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        )
        assert answer.status_code == 404, answer.text


def test_the_port_can_come_from_the_environment(database_url: str, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        env = service_env(tmp_path, DATABASE_URL=database_url, PORT=str(port))
        code, out, err = refused(serve(env, "--no-workers"))
    assert_one_line_about_the_port(code, out, err, port)


@pytest.mark.parametrize("args", [[], ["--workers", "2"], ["--server", "uvicorn"]])
def test_the_listening_line_comes_once_the_server_answers(
    database_url: str, tmp_path: Path, args: list[str]
) -> None:
    """A script that waits for `listening on` and then sends its requests is served: the line
    is printed once the server answers, not when the port is bound (a connection made between
    the two is refused, or reset once its request is sent)."""
    import queue
    import threading

    port = free_port()
    env = service_env(tmp_path, DATABASE_URL=database_url, BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN)
    process = serve(env, "--port", str(port), "--no-workers", *args)
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    threading.Thread(target=lambda: [lines.put(x) for x in process.stdout], daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in (line := lines.get(timeout=deadline - time.monotonic())):
            pass
        assert line.strip() == f"ductor-streams listening on http://127.0.0.1:{port}"
        for _ in range(3):  # at once, each on a connection of its own
            answer = httpx.post(
                f"http://127.0.0.1:{port}{PREFIX}/runs/listening/streams",
                json={"stream_id": "s", "direction": "output"},
                headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
            )
            assert answer.status_code in (200, 201), answer.text
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    assert lines.empty() or "listening" not in "".join(lines.queue)  # printed once


def _server_ends(server_pids: list[int], client: socket.socket, seconds: float) -> float | None:
    """How long until no process of `server_pids` holds the connection `client` is the other
    end of (None: still held after `seconds`)."""
    mine = client.getsockname()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        held = any(
            c.raddr and tuple(c.raddr) == mine
            for pid in server_pids
            for c in psutil.Process(pid).net_connections(kind="tcp")
        )
        if not held:
            return time.monotonic() - start
        time.sleep(0.25)
    return None


@pytest.mark.parametrize("args", [[], ["--workers", "2"], ["--server", "uvicorn"]])
def test_a_subscriber_that_stops_reading_loses_its_connection(
    database_url: str, tmp_path: Path, args: list[str]
) -> None:
    """A client that keeps its window shut (it reads nothing, and acknowledges the kernel's
    probes) is dropped after DUCTOR_STREAMS_CLIENT_SILENCE_SECONDS: before, the application
    ended its subscription after 30 s, but the server held the connection (a descriptor and MBs
    of send buffer, counted by no cap) for as long as the client liked."""
    env = {**SERVER_ENV, "DUCTOR_STREAMS_CLIENT_SILENCE_SECONDS": "2"}
    server = ServerProcess(database_url=database_url, data_dir=tmp_path, env=env, args=args).start()
    headers = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
    run = "silent-" + secrets.token_hex(3)
    try:
        with httpx.Client(base_url=server.base_url + PREFIX, headers=headers) as api:
            assert (
                api.post(
                    f"/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}
                ).status_code
                == 201
            )
            big = {"records": [{"data": "x" * 60_000} for _ in range(16)]}
            for _ in range(10):  # about 10 MB: more than the kernel's buffers hold
                assert api.post(f"/runs/{run}/streams/s/records", json=big).status_code == 201
        assert server.process is not None
        pids = [server.process.pid] + [
            c.pid for c in psutil.Process(server.process.pid).children(recursive=True)
        ]
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", server.port))
        target = f"{PREFIX}/runs/{run}/streams/s/subscribe?cursor=0"
        client.sendall(
            f"GET {target} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {BOOTSTRAP_TOKEN}\r\n\r\n".encode()
        )
        with client:
            head = client.recv(100)
            assert head.startswith(b"HTTP/1.1 200"), head
            ended = _server_ends(pids, client, 30)
        assert ended is not None, (
            "the server still holds the connection of a client reading nothing"
        )
    finally:
        server.stop()


@pytest.mark.parametrize("args", [["--workers", "2"], ["--supervised"]])
def test_supervised_server_processes_share_the_port_and_refuse_a_second_server(
    database_url: str, tmp_path: Path, args: list[str]
) -> None:
    server = ServerProcess(
        database_url=database_url, data_dir=tmp_path / "first", env=SERVER_ENV, args=args
    ).start()
    try:
        for _ in range(6):
            answer = httpx.get(
                f"{server.base_url}{PREFIX}/runs/nope/streams",
                headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
            )
            assert answer.status_code == 404, answer.text
        env = service_env(tmp_path / "second", DATABASE_URL=database_url)
        code, out, err = refused(serve(env, "--port", str(server.port), "--no-workers"))
        assert_one_line_about_the_port(code, out, err, server.port)
    finally:
        server.stop()


def test_server_processes_whose_supervisor_was_killed_stop_and_free_the_port(
    database_url: str, tmp_path: Path
) -> None:
    """A supervisor killed outright cannot stop its processes: they notice it gone within
    about a second and stop as SIGTERM stops them, so the port is free for a new `serve`."""
    server = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path / "orphans",
        env=SERVER_ENV,
        args=["--workers", "2"],
    ).start()
    try:
        assert server.process is not None
        supervisor = psutil.Process(server.process.pid)
        children = supervisor.children(recursive=True)
        assert len(children) >= 2, children
        supervisor.kill()
        _, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, f"server processes still running without their supervisor: {alive}"
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", server.port))
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the port is still held"
                    time.sleep(0.2)
    finally:
        server.stop(signal.SIGKILL)


def test_stopping_dev_py_serve_stops_the_server_and_its_postgresql(
    embedded_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "dev.log"
    with log.open("wb") as output:
        dev = subprocess.Popen(
            [sys.executable, str(ROOT / "dev.py"), "serve", "--port", str(port)],
            cwd=ROOT,
            env=service_env(embedded_dir),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # only for the clean-up below if the test fails
        )
    try:
        until_ready(dev, port, log)
        assert any("postgres" in p.name() for p in processes_of(embedded_dir))
        until_stopped(dev, embedded_dir, port)
        assert not ready(port)
    finally:
        with_group_gone(dev, embedded_dir, port)


def test_an_embedded_postgresql_killed_outright_is_started_again(
    embedded_dir: Path, tmp_path: Path
) -> None:
    """The postmaster killed (kill -9, the OOM killer): `serve` starts it again, PostgreSQL
    recovers its data, and the service answers again with what it had acknowledged, without
    being restarted itself. Then SIGTERM still stops both."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = service_env(embedded_dir, BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN)
    with log.open("wb") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "entrypoints.cli", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api = f"http://127.0.0.1:{port}{PREFIX}"
    auth = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
    try:
        until_ready(server, port, log)
        made = httpx.post(
            f"{api}/runs/r/streams",
            json={"stream_id": "s", "direction": "output"},
            headers=auth,
            timeout=10,
        )
        assert made.status_code == 201, made.text
        kept = httpx.post(
            f"{api}/runs/r/streams/s/records",
            json={"records": [{"data": 1}]},
            headers=auth,
            timeout=10,
        )
        assert kept.status_code == 201, kept.text
        postmaster = int((embedded_dir / "pg" / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            try:
                read = httpx.get(f"{api}/runs/r/streams/s/records", headers=auth, timeout=5)
            except httpx.HTTPError:
                read = None
            if read is not None and read.status_code == 200:
                break
            assert read is None or read.status_code == 503, read.text
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the service did not come back:\n" + log.read_text()
            time.sleep(0.5)
        assert [r["data"] for r in read.json()["records"]] == [1]
        again = int((embedded_dir / "pg" / "postmaster.pid").read_text().split()[0])
        assert again != postmaster
        assert "stopped: starting it" in log.read_text()
        until_stopped(server, embedded_dir, port)
    finally:
        with_group_gone(server, embedded_dir, port)


def until_ready(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Wait (90 s at most) for the server on `port` to answer /readyz, while `process` runs."""
    deadline = time.monotonic() + 90
    while not ready(port):
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the server did not become ready:\n" + log.read_text()
        time.sleep(0.2)


def until_stopped(process: subprocess.Popen[bytes], data_dir: Path, port: int) -> None:
    """SIGTERM to `process` alone (as a terminal or systemd sends it), then nothing it started
    may be left within 30 s."""
    process.send_signal(signal.SIGTERM)
    process.wait(30)
    deadline = time.monotonic() + 30
    while (left := processes_of(data_dir, port)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [p.info["cmdline"] for p in left]


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def with_group_gone(process: subprocess.Popen[bytes], data_dir: Path, port: int) -> None:
    """Leave nothing behind even when the test failed."""
    for leftover in processes_of(data_dir, port):
        leftover.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


# --- slow and oversize requests, through granian (the default) and uvicorn


@pytest.fixture(scope="module", params=["granian", "uvicorn"])
def impatient_server(
    request: pytest.FixtureRequest, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("impatient"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_HEADER_READ_TIMEOUT_SECONDS": "1"},
        args=["--server", request.param],
    ).start()
    yield process
    process.stop()


def closed_within(connection: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Read until the server closes the connection; (closed, everything read)."""
    connection.settimeout(seconds)
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except TimeoutError:
        return False, received
    except ConnectionResetError:
        pass
    return True, received


def test_a_client_that_never_finishes_its_request_head_is_disconnected(
    impatient_server: ServerProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", impatient_server.port)) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        started = time.monotonic()
        closed, received = closed_within(connection, 15)
    assert closed and received == b""
    assert time.monotonic() - started < 12  # the configured second, not the default 30


def test_an_oversize_body_is_refused_and_the_connection_closed_without_reading_it(
    impatient_server: ServerProcess, run_id: str
) -> None:
    head = (
        f"POST {PREFIX}/runs/{run_id}/streams/s/records HTTP/1.1\r\n"
        "Host: localhost\r\n"
        f"Authorization: Bearer {BOOTSTRAP_TOKEN}\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: 100000000\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", impatient_server.port)) as connection:
        connection.sendall(head + b'{"records": [' + b" " * 65536)
        closed, received = closed_within(connection, 10)
    answer_head, _, body = received.partition(b"\r\n\r\n")
    lines = answer_head.decode().lower().splitlines()
    assert lines and " 413 " in lines[0], received[:300]
    assert "connection: close" in lines
    assert json.loads(body)["code"] == "request-too-large"
    assert closed  # not held open waiting for the other 99.9 MB


def test_a_client_that_sends_a_body_a_little_over_the_limit_whole_gets_its_413_then_eof(
    server: ServerProcess, run_id: str
) -> None:
    """granian (the default) lets the application read on after its answer, so a little of the
    rest is read before closing; uvicorn closes at once (docs/errors.md)."""
    body = b'{"records": [' + b" " * (9 * 1024 * 1024) + b"]}"
    head = (
        f"POST {PREFIX}/runs/{run_id}/streams/s/records HTTP/1.1\r\n"
        "Host: localhost\r\n"
        f"Authorization: Bearer {BOOTSTRAP_TOKEN}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as connection:
        connection.settimeout(30)
        connection.sendall(head + body)  # all of it before reading, as most clients do
        closed, received = closed_within(connection, 10)
    lines = received.partition(b"\r\n\r\n")[0].decode().lower().splitlines()
    assert lines and " 413 " in lines[0], received[:300]
    assert "connection: close" in lines
    assert closed


# --- one log format


@pytest.mark.parametrize("server_name", ["granian", "uvicorn"])
def test_every_line_the_service_logs_is_one_json_object(
    database_url: str, tmp_path: Path, run_id: str, server_name: str
) -> None:
    port = free_port()
    env = service_env(
        tmp_path,
        DATABASE_URL=database_url,
        BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN,
        LOG_LEVEL="DEBUG",
        PRUNE_INTERVAL_SECONDS="0.2",
    )
    process = serve(env, "--port", str(port), "--server", server_name)
    try:
        deadline = time.monotonic() + 60
        while not ready(port):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}{PREFIX}",
            headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        ) as api:
            assert api.get("/runs/no-such-run/streams").status_code == 404
            assert api.get("/runs/x/streams", headers={"Authorization": "Bearer no"}).status_code
            definition = {"stream_id": "s", "direction": "output", "retention": {"max_records": 1}}
            assert api.post(f"/runs/{run_id}/streams", json=definition).status_code == 201
            records = {"records": [{"data": n} for n in range(3)]}
            assert api.post(f"/runs/{run_id}/streams/s/records", json=records).status_code == 201
            while api.get(f"/runs/{run_id}/streams/s").json()["state"]["earliest"] < 3:
                assert time.monotonic() < deadline, "retention did not run"
                time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # each one parses
    assert all(isinstance(line, dict) and line.get("msg") is not None for line in lines)
    about_requests = [line for line in lines if "request_id" in line]
    assert any("/no-such-run/" in line["msg"] for line in about_requests), lines
    assert any(line.get("stream_id") == "s" and line.get("run_id") == run_id for line in lines)
    assert any("pruned" in line["msg"] for line in lines), lines  # a worker's line
    assert "experimental" not in out + err


def start_serving(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    process = serve(env, "--port", str(port))
    deadline = time.monotonic() + 90
    while not ready(port):
        if process.poll() is not None:
            pytest.fail(f"serve exited:\n{process.communicate()}")
        assert time.monotonic() < deadline, "serve did not become ready"
        time.sleep(0.2)
    return process


def test_a_server_that_reuses_the_postgresql_a_killed_one_left_stops_it_on_sigterm(
    embedded_dir: Path,
) -> None:
    """`kill -9` leaves the embedded PostgreSQL running (nothing could stop it); the next
    `serve` of that data directory takes it over, so its own SIGTERM stops it."""
    port = free_port()
    env = service_env(embedded_dir)
    first = start_serving(env, port)
    second = None
    try:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        assert any("postgres" in p.name() for p in processes_of(embedded_dir))  # it survived
        second = start_serving(env, port)
        until_stopped(second, embedded_dir, port)
        assert not (embedded_dir / "pg" / "postmaster.pid").exists()
    finally:
        for process in (first, second):
            if process is not None:
                with_group_gone(process, embedded_dir, port)  # type: ignore[arg-type]
