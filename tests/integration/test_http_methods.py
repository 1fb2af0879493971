"""A method a path does not serve is 405 problem JSON with `Allow`; OPTIONS lists every method
of the path, HEAD wherever GET (docs/http-api.md "Errors")."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.test_http_bad_input import assert_problem
from tests.integration.test_tenant_bodies import answer_of
from tests.support.server import ServerProcess

STREAM = "/runs/r-methods/streams/s"
# Every API path and the methods it serves, OPTIONS included.
PATHS = {
    "/runs": "GET, HEAD, OPTIONS",
    "/runs/r-methods": "DELETE, OPTIONS",
    "/runs/r-methods/streams": "GET, HEAD, OPTIONS, POST",
    STREAM: "DELETE, GET, HEAD, OPTIONS",
    STREAM + "/records": "GET, HEAD, OPTIONS, POST",
    STREAM + "/subscribe": "GET, HEAD, OPTIONS",
    STREAM + "/consumers/c/ack": "OPTIONS, POST",
    STREAM + "/close": "OPTIONS, POST",
    STREAM + "/legal-hold": "OPTIONS, PUT",
    STREAM + "/objects": "GET, HEAD, OPTIONS, POST",
    STREAM + "/objects/o": "GET, HEAD, OPTIONS",
    STREAM + "/objects/o/body": "GET, HEAD, OPTIONS, PUT",
    STREAM + "/objects/o/commit": "OPTIONS, POST",
    STREAM + "/objects/o/abort": "OPTIONS, POST",
}


@pytest.mark.parametrize(("path", "allow"), PATHS.items(), ids=list(PATHS))
async def test_options_lists_every_method_of_the_path(
    api: httpx.AsyncClient, path: str, allow: str
) -> None:
    response = await api.options(path, headers={"Authorization": ""})  # needs no token
    assert response.status_code == 204, response.text
    assert response.headers["allow"] == allow


@pytest.mark.parametrize(("path", "allow"), PATHS.items(), ids=list(PATHS))
async def test_a_method_the_path_does_not_serve_is_405_with_allow(
    api: httpx.AsyncClient, path: str, allow: str
) -> None:
    method = "PATCH" if "PUT" in allow else "PUT"
    response = await api.request(method, path, json={})
    body = assert_problem(response, 405, ("method-not-allowed",))
    assert response.headers["allow"] == allow
    assert method in body["detail"]


async def test_delete_on_records_is_405_and_changes_nothing(
    api: httpx.AsyncClient, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "s", "direction": "output"}
    )
    assert created.status_code == 201, created.text
    assert (
        await api.post(f"/runs/{run_id}/streams/s/records", json={"records": [{"data": 1}]})
    ).status_code == 201
    response = await api.delete(f"/runs/{run_id}/streams/s/records")
    assert_problem(response, 405, ("method-not-allowed",))
    assert response.headers["allow"] == "GET, HEAD, OPTIONS, POST"
    page = (await api.get(f"/runs/{run_id}/streams/s/records")).json()
    assert [r["data"] for r in page["records"]] == [1]


@pytest.mark.parametrize(
    "path",
    ["/nope", "/healthz", "/api/workflow-streams/runs", "/api/durable-streams/v1/stream/r/s"],
)
def test_a_websocket_handshake_is_the_404_problem_on_every_path(
    server: ServerProcess, path: str
) -> None:
    """Live reads are Server-Sent Events: no path serves a WebSocket. A handshake is answered
    with the 404 problem and the headers every answer carries (the framework gave a bare 403,
    even on a path that does not exist)."""
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        status, fields, problem = answer_of(conn)
    assert status == 404, (status, problem)
    assert fields["content-type"] == "application/problem+json"
    assert fields["x-content-type-options"] == "nosniff"
    assert fields["x-request-id"]
    assert problem["code"] == "not-found" and "Server-Sent Events" in problem["detail"]
