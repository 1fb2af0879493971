"""Resumable downloads: Range on an object's body, through the real server, on each object store
(the filesystem, and S3 on a real SeaweedFS store: see tests/integration/test_objects_http.py)."""

from __future__ import annotations

import base64
import hashlib
import os

import httpx
import psutil
import pytest

from tests.conftest import on_each_object_store
from tests.integration.test_objects_http import BODY, new_stream, prepare_body
from tests.support.server import ServerProcess

MiB = 1024 * 1024
SIZE = len(BODY)
DIGEST = "sha-256=:" + base64.b64encode(hashlib.sha256(BODY).digest()).decode() + ":"


@pytest.fixture(scope="module", params=["filesystem", "s3"])
def server(request: pytest.FixtureRequest, server: ServerProcess) -> ServerProcess:
    return on_each_object_store(request, server)


async def committed_object(api: httpx.AsyncClient, run_id: str, body: bytes = BODY) -> str:
    """The body URL of a committed object holding `body`."""
    path = await new_stream(api, run_id)
    intent = (await api.post(f"{path}/objects", json=prepare_body(body))).json()
    object_path = f"{path}/objects/{intent['object_id']}"
    uploaded = await api.put(f"{object_path}/body", content=body)
    assert uploaded.status_code == 200, uploaded.text
    assert (await api.post(f"{object_path}/commit")).status_code == 201
    return f"{object_path}/body"


@pytest.fixture
async def body_url(api: httpx.AsyncClient, run_id: str) -> str:
    return await committed_object(api, run_id)


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        ("bytes=0-99", 0, 99),
        ("bytes=100-", 100, SIZE - 1),
        ("bytes=-17", SIZE - 17, SIZE - 1),
        ("bytes=-99999999999", 0, SIZE - 1),  # a suffix longer than the body is all of it
        (f"bytes={SIZE - 5}-{SIZE * 2}", SIZE - 5, SIZE - 1),  # the last position is clamped
        (f"bytes={SIZE - 1}-{SIZE - 1}", SIZE - 1, SIZE - 1),
        (f"BYTES={MiB - 1}-{2 * MiB}", MiB - 1, 2 * MiB),  # units compare case-insensitively
    ],
)
async def test_a_single_range_answers_206_with_only_those_bytes(
    api: httpx.AsyncClient, body_url: str, header: str, first: int, last: int
) -> None:
    answer = await api.get(body_url, headers={"Range": header})
    assert answer.status_code == 206, answer.text
    assert answer.content == BODY[first : last + 1]
    assert answer.headers["content-range"] == f"bytes {first}-{last}/{SIZE}"
    assert answer.headers["content-length"] == str(last - first + 1)
    assert answer.headers["accept-ranges"] == "bytes"
    assert answer.headers["repr-digest"] == DIGEST  # the whole representation's digest
    assert answer.headers["content-type"] == "application/octet-stream"


async def test_the_whole_body_announces_that_ranges_are_accepted(
    api: httpx.AsyncClient, body_url: str
) -> None:
    answer = await api.get(body_url)
    assert answer.status_code == 200 and answer.content == BODY
    assert answer.headers["accept-ranges"] == "bytes"
    assert answer.headers["content-length"] == str(SIZE)
    assert "content-range" not in answer.headers


@pytest.mark.parametrize("header", [f"bytes={SIZE}-", f"bytes={SIZE + 10}-{SIZE + 20}", "bytes=-0"])
async def test_an_unsatisfiable_range_is_416_with_the_size(
    api: httpx.AsyncClient, body_url: str, header: str
) -> None:
    answer = await api.get(body_url, headers={"Range": header})
    assert answer.status_code == 416
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["content-range"] == f"bytes */{SIZE}"
    assert answer.headers["accept-ranges"] == "bytes"
    problem = answer.json()
    assert problem["code"] == "range-not-satisfiable" and problem["status"] == 416
    assert problem["size"] == SIZE and problem["detail"]


@pytest.mark.parametrize(
    "header",
    [
        "bytes=10-5",  # last before first: invalid
        "bytes=0-1, 5-6",  # several ranges: not served as multipart
        "items=0-5",
        "bytes=abc",
        "bytes=-",
        "bytes 0-5",
    ],
)
async def test_an_invalid_or_multi_range_header_is_ignored(
    api: httpx.AsyncClient, body_url: str, header: str
) -> None:
    answer = await api.get(body_url, headers={"Range": header})
    assert answer.status_code == 200 and answer.content == BODY
    assert answer.headers["accept-ranges"] == "bytes"


async def test_positions_of_thousands_of_digits_are_read_as_past_the_end(
    api: httpx.AsyncClient, body_url: str
) -> None:
    huge = "9" * 5000  # past the digits Python's int() converts by default: still no 500
    clamped = await api.get(body_url, headers={"Range": f"bytes=3-{huge}"})
    assert clamped.status_code == 206 and clamped.content == BODY[3:]
    refused = await api.get(body_url, headers={"Range": f"bytes={huge}-"})
    assert refused.status_code == 416
    padded = await api.get(body_url, headers={"Range": "bytes=" + "0" * 40 + "7-8"})
    assert padded.status_code == 206 and padded.content == BODY[7:9]


async def test_if_range_honours_the_range_only_for_this_bodys_entity_tag(
    api: httpx.AsyncClient, body_url: str
) -> None:
    etag = (await api.get(body_url, headers={"Range": "bytes=0-0"})).headers["etag"]
    assert etag == '"' + hashlib.sha256(BODY).hexdigest() + '"'
    same = await api.get(body_url, headers={"Range": "bytes=10-19", "If-Range": etag})
    assert same.status_code == 206 and same.content == BODY[10:20]
    for validator in ('"another-tag"', "W/" + etag, "Tue, 01 Dec 2026 10:00:00 GMT"):
        other = await api.get(body_url, headers={"Range": "bytes=10-19", "If-Range": validator})
        assert other.status_code == 200 and other.content == BODY, validator


async def test_an_empty_body_answers_a_range_with_416_or_the_empty_body(
    api: httpx.AsyncClient, run_id: str
) -> None:
    url = await committed_object(api, run_id, b"")
    refused = await api.get(url, headers={"Range": "bytes=0-"})
    assert refused.status_code == 416 and refused.headers["content-range"] == "bytes */0"
    whole = await api.get(url, headers={"Range": "bytes=-5"})
    assert whole.status_code == 200 and whole.content == b""


def _tree_rss(process: psutil.Process) -> int:
    members = [process, *process.children(recursive=True)]
    return sum(member.memory_info().rss for member in members)


async def test_a_32_mib_download_resumes_where_it_stopped_with_flat_memory(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    body = os.urandom(32 * MiB)
    url = await committed_object(api, run_id, body)
    assert server.process is not None
    serving = psutil.Process(server.process.pid)
    received = bytearray()
    async with api.stream("GET", url) as first:
        assert first.status_code == 200
        async for chunk in first.aiter_bytes():
            received += chunk
            if len(received) >= 13 * MiB + 5:
                break  # the connection drops mid-body
    baseline = _tree_rss(serving)
    peak = baseline
    resume = {
        "Range": f"bytes={len(received)}-",
        "If-Range": f'"{hashlib.sha256(body).hexdigest()}"',
    }
    async with api.stream("GET", url, headers=resume) as rest:
        assert rest.status_code == 206
        assert rest.headers["content-range"] == f"bytes {len(received)}-{len(body) - 1}/{len(body)}"
        async for chunk in rest.aiter_bytes():
            received += chunk
            peak = max(peak, _tree_rss(serving))
    assert bytes(received) == body
    # Serving 19 MiB from a 32 MiB file in 1 MiB reads: a server that held the body (or the span)
    # in memory would grow by at least that much.
    print("RSS", baseline, peak)
    assert peak - baseline < 12 * MiB, (baseline, peak)
