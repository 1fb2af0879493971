"""Browser access to both surfaces: CORS for the configured origins, the security headers on
every answer (a server process of its own, with DUCTOR_STREAMS_CORS_ORIGINS set)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ServerProcess

ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def browser_server(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("browser-server"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_CORS_ORIGINS": f"https://other.example, {ORIGIN}"},
    ).start()
    yield process
    process.stop()


@pytest.mark.parametrize(
    "path",
    ["/api/durable-streams/v1/stream/r/s", "/api/workflow-streams/runs/r/streams/s/records"],
)
def test_a_preflight_from_an_allowed_origin_needs_no_token(
    browser_server: ServerProcess, path: str
) -> None:
    answer = httpx.options(
        browser_server.base_url + path,
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-custom",
        },
    )
    assert answer.status_code == 204, answer.text
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    allowed = [h.strip() for h in answer.headers["access-control-allow-headers"].split(",")]
    assert {"authorization", "content-type", "if-none-match", "producer-id", "x-custom"} <= set(
        allowed
    )
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["x-request-id"]  # every answer has one, a preflight's too
    given = httpx.options(
        browser_server.base_url + path,
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "X-Request-ID": "p1"},
    )
    assert given.headers["x-request-id"] == "p1"


def test_answers_to_an_allowed_origin_expose_the_protocol_headers(
    browser_server: ServerProcess,
) -> None:
    url = browser_server.base_url + "/api/durable-streams/v1/stream/browser-run/exposed"
    auth = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}", "Origin": ORIGIN}
    created = httpx.put(url, headers={**auth, "Content-Type": "text/plain"}, content=b"hi")
    assert created.status_code == 201, created.text
    read = httpx.get(url, headers=auth)
    assert read.headers["access-control-allow-origin"] == ORIGIN
    exposed = {h.strip().lower() for h in read.headers["access-control-expose-headers"].split(",")}
    assert {"stream-next-offset", "stream-cursor", "stream-up-to-date", "stream-closed"} <= exposed
    assert {"etag", "producer-epoch", "stream-sse-data-encoding", "retry-after"} <= exposed
    assert read.headers["cross-origin-resource-policy"] == "cross-origin"


def test_another_origin_gets_no_cors_headers(browser_server: ServerProcess) -> None:
    url = browser_server.base_url + "/api/durable-streams/v1/stream/browser-run/exposed"
    preflight = httpx.options(
        url, headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}
    )
    assert "access-control-allow-origin" not in preflight.headers
    read = httpx.get(
        url,
        headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}", "Origin": "https://evil.example"},
    )
    assert "access-control-allow-origin" not in read.headers
    assert read.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("origin", [ORIGIN, "https://evil.example"])
def test_the_native_append_answers_an_allowed_origin_and_no_other(
    browser_server: ServerProcess, origin: str
) -> None:
    """The append route is answered in front of the router: the same browser headers, on an
    append and on a refusal."""
    base = browser_server.base_url + "/api/workflow-streams/runs/browser-run/streams"
    auth = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}", "Origin": origin}
    created = httpx.post(
        base, headers=auth, json={"stream_id": f"native-{len(origin)}", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    url = f"{base}/native-{len(origin)}/records"
    appended = httpx.post(url, headers=auth, json={"records": [{"data": 1}]})
    refused = httpx.post(url, headers={"Origin": origin}, json={"records": [{"data": 1}]})
    assert (appended.status_code, refused.status_code) == (201, 401)
    for answer in (appended, refused):
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cross-origin-resource-policy"] == "cross-origin"
        if origin == ORIGIN:
            assert answer.headers["access-control-allow-origin"] == ORIGIN
            assert "www-authenticate" in answer.headers["access-control-expose-headers"].lower()
            assert answer.headers["vary"] == "Origin"
        else:
            assert "access-control-allow-origin" not in answer.headers


@pytest.mark.parametrize("origin", [ORIGIN, "https://evil.example"])
def test_a_protocol_append_answers_an_allowed_origin_and_no_other(
    browser_server: ServerProcess, origin: str
) -> None:
    """A protocol POST is answered in front of the router too: the same browser headers on an
    append, a protocol refusal (409 on a closed stream) and an authentication failure."""
    url = f"{browser_server.base_url}/api/durable-streams/v1/stream/browser-run/p{len(origin)}"
    auth = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}", "Origin": origin}
    text = {"Content-Type": "text/plain"}
    assert httpx.put(url, headers={**auth, **text}).status_code == 201
    appended = httpx.post(url, headers={**auth, **text}, content=b"a")
    closing = httpx.post(url, headers={**auth, **text, "Stream-Closed": "true"}, content=b"b")
    refused = httpx.post(url, headers={**auth, **text}, content=b"c")
    anonymous = httpx.post(url, headers={"Origin": origin, **text}, content=b"d")
    statuses = [a.status_code for a in (appended, closing, refused, anonymous)]
    assert statuses == [204, 204, 409, 401]
    assert refused.headers["stream-closed"] == "true"
    for answer in (appended, closing, refused, anonymous):
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-request-id"]
        if origin == ORIGIN:
            assert answer.headers["access-control-allow-origin"] == ORIGIN
            assert "stream-next-offset" in answer.headers["access-control-expose-headers"].lower()
        else:
            assert "access-control-allow-origin" not in answer.headers
