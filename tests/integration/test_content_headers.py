"""A stream's bytes are served as what they are, never as a page of the service's origin: every
answer that sets no policy of its own (whatever its path's spelling) has `nosniff` and a
Content-Security-Policy that runs nothing, and every answer says `Vary: Origin` whatever the
Origin (allowed, another, or none), since what the CORS layer adds depends on it. Against a
server with CORS origins configured, and against the session's server without any."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ServerProcess

ORIGIN = "https://app.example.com"
POLICY = "default-src 'none'; sandbox"
AUTH = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
NATIVE = "/api/workflow-streams"
PROTOCOL = "/api/durable-streams/v1/stream"
PAGE = b"<html><body><script>alert(document.domain)</script></body></html>"


@pytest.fixture(scope="module")
def cors_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("content-headers"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_CORS_ORIGINS": ORIGIN},
    ).start()
    yield process
    process.stop()


@pytest.fixture(params=["cors", "no-cors"])
def any_server(request: pytest.FixtureRequest) -> ServerProcess:
    return request.getfixturevalue("cors_server" if request.param == "cors" else "server")


def assert_inert(answer: httpx.Response) -> None:
    assert answer.headers.get("x-content-type-options") == "nosniff", answer.headers
    assert answer.headers.get("content-security-policy") == POLICY, answer.headers


def assert_varies(answer: httpx.Response) -> None:
    varied = [v.strip().lower() for v in answer.headers.get("vary", "").split(",")]
    assert "origin" in varied, answer.headers


def html_protocol_stream(base: str) -> str:
    url = f"{base}{PROTOCOL}/content-{secrets.token_hex(4)}"
    created = httpx.put(url, headers={**AUTH, "Content-Type": "text/html"}, content=PAGE)
    assert created.status_code == 201, created.text
    return url


def test_a_protocol_stream_of_html_is_read_inert_by_catch_up_long_poll_and_sse(
    any_server: ServerProcess,
) -> None:
    url = html_protocol_stream(any_server.base_url)
    read = httpx.get(url, headers=AUTH)
    assert read.status_code == 200 and read.content == PAGE
    assert read.headers["content-type"].startswith("text/html")
    assert_inert(read)
    offset = read.headers["stream-next-offset"]
    unchanged = httpx.get(url, headers={**AUTH, "If-None-Match": read.headers["etag"]})
    assert unchanged.status_code == 304
    assert_inert(unchanged)
    head = httpx.head(url, headers=AUTH)
    assert_inert(head)
    waited = httpx.get(url, params={"offset": offset, "live": "long-poll"}, headers=AUTH)
    assert waited.status_code == 204
    assert_inert(waited)
    with httpx.stream(
        "GET", url, params={"offset": "-1", "live": "sse"}, headers=AUTH, timeout=10
    ) as live:
        assert live.status_code == 200
        assert live.headers["content-type"].startswith("text/event-stream")
        assert_inert(live)
    appended = httpx.post(url, headers={**AUTH, "Content-Type": "text/html"}, content=b"<p>")
    assert appended.status_code == 204  # the append front
    assert_inert(appended)
    refused = httpx.get(url, params={"offset": "nonsense"}, headers=AUTH)
    assert refused.status_code == 400
    assert_inert(refused)


def test_native_object_bodies_and_record_reads_are_served_inert(
    any_server: ServerProcess,
) -> None:
    run = "content-" + secrets.token_hex(4)
    base = f"{any_server.base_url}{NATIVE}/runs/{run}/streams"
    with httpx.Client(headers=AUTH, timeout=30) as api:
        assert api.post(base, json={"stream_id": "o", "direction": "output"}).status_code == 201
        fields = {
            "idempotency_key": "k1",
            "size": len(PAGE),
            "sha256": hashlib.sha256(PAGE).hexdigest(),
            "content_type": "text/html",
        }
        intent = api.post(f"{base}/o/objects", json=fields).json()
        body = f"{base}/o/objects/{intent['object_id']}/body"
        assert api.put(body, content=PAGE).status_code in (200, 201, 204)
        assert api.post(f"{base}/o/objects/{intent['object_id']}/commit").status_code == 201
        downloaded = api.get(body)
        assert downloaded.status_code == 200 and downloaded.content == PAGE
        assert downloaded.headers["content-type"].startswith("text/html")
        assert_inert(downloaded)
        part = api.get(body, headers={"Range": "bytes=0-5"})
        assert part.status_code == 206
        assert_inert(part)
        appended = api.post(f"{base}/o/records", json={"records": [{"data": "<b>"}]})
        assert appended.status_code == 201  # the append front
        assert_inert(appended)
        records = api.get(f"{base}/o/records")
        assert records.status_code == 200
        assert_inert(records)
        with api.stream("GET", f"{base}/o/subscribe", params={"cursor": 0}) as live:
            assert live.status_code == 200
            assert_inert(live)


@pytest.mark.parametrize("slashes", ["//", "///"])
def test_content_reached_under_a_doubled_slash_is_served_inert(
    server: ServerProcess, slashes: str
) -> None:
    """The router reaches a handler under `//api/…` as under `/api/…`: the policy is not
    decided by the path's spelling, so such a spelling cannot serve a stream's page live."""
    url = html_protocol_stream(server.base_url)
    doubled = server.base_url + slashes + url.removeprefix(server.base_url + "/")
    read = httpx.get(doubled, headers=AUTH)
    assert read.status_code == 200 and read.content == PAGE, (read.status_code, read.text)
    assert read.headers["content-type"].startswith("text/html")
    assert_inert(read)
    refused = httpx.get(doubled, params={"offset": "nonsense"}, headers=AUTH)
    assert refused.status_code == 400
    assert_inert(refused)


def test_answers_that_say_nothing_of_caching_are_kept_by_no_cache(server: ServerProcess) -> None:
    """Records, stream documents, token lists and errors, through Litestar and through the
    append front, carry one `Cache-Control: no-store`; an answer that says otherwise keeps its
    own (a Durable Streams read of history, the console's page)."""
    run = "cache-" + secrets.token_hex(4)
    base = f"{server.base_url}{NATIVE}/runs/{run}/streams"
    with httpx.Client(headers=AUTH, timeout=30) as api:
        answers = [
            api.post(base, json={"stream_id": "s", "direction": "output"}),
            api.post(f"{base}/s/records", json={"records": [{"data": "x"}]}),
            api.post(f"{base}/s/records", content=b"{"),
            api.get(f"{base}/s/records", params={"cursor": 0}),
            api.get(f"{base}/s"),
            api.get(f"{server.base_url}{NATIVE}/tokens"),
            api.get(f"{base}/missing"),
        ]
        for answer in answers:
            assert answer.headers.get_list("cache-control") == ["no-store"], (
                answer.request.url,
                answer.status_code,
                answer.headers,
            )
        url = html_protocol_stream(server.base_url)
        history = api.get(url, params={"offset": "-1"})
        assert history.status_code == 200
        assert len(history.headers.get_list("cache-control")) == 1
        assert history.headers["cache-control"] != "no-store"
    console = httpx.get(server.base_url + "/console")
    assert console.headers.get_list("cache-control") == ["no-cache"]


def test_the_console_keeps_its_own_policy(any_server: ServerProcess) -> None:
    page = httpx.get(any_server.base_url + "/console")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "sandbox" not in policy
    assert page.headers.get_list("content-security-policy") == [policy]
    assert_varies(page)


@pytest.mark.parametrize("origin", [ORIGIN, "https://evil.example", None])
def test_every_answer_varies_by_origin(any_server: ServerProcess, origin: str | None) -> None:
    """Allowed, another or no Origin: the same `Vary`, on the routes Litestar answers and on
    the append front's (both surfaces), on success and on refusal."""
    with_origin = {} if origin is None else {"Origin": origin}
    headers = {**AUTH, **with_origin}
    url = html_protocol_stream(any_server.base_url)
    run = "vary-" + secrets.token_hex(4)
    native = f"{any_server.base_url}{NATIVE}/runs/{run}/streams"
    created = httpx.post(native, headers=headers, json={"stream_id": "s", "direction": "output"})
    assert created.status_code == 201
    answers = [
        created,
        httpx.get(native, headers=headers),
        httpx.get(f"{native}/s", headers=headers),
        httpx.get(f"{native}/nothing", headers=headers),  # 404
        httpx.get(f"{native}/s", headers=with_origin),  # 401
        httpx.post(f"{native}/s/records", headers=headers, json={"records": [{"data": 1}]}),
        httpx.post(f"{native}/s/records", headers=with_origin, json={"records": []}),
        httpx.get(url, headers=headers),
        httpx.post(url, headers={**headers, "Content-Type": "text/html"}, content=b"x"),
        httpx.post(url, headers={**with_origin, "Content-Type": "text/html"}, content=b"x"),
        httpx.get(any_server.base_url + "/healthz", headers=with_origin),
        httpx.options(url, headers={**with_origin, "Access-Control-Request-Method": "GET"}),
    ]
    allowed = origin == ORIGIN and any_server.env.get("DUCTOR_STREAMS_CORS_ORIGINS") == ORIGIN
    for answer in answers:
        assert_varies(answer)
        assert answer.headers.get("access-control-allow-origin") == (ORIGIN if allowed else None)
