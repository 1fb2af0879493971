"""Operating the service: /metrics in Prometheus text, request ids, health and readiness."""

from __future__ import annotations

import httpx

from tests.support.server import ServerProcess


def metric(text: str, name: str, **labels: str) -> float:
    """The sample of `name` with exactly `labels` (in any order); without labels, the sum of
    every sample of `name` (whatever its labels)."""
    if not labels:
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith((f"{name} ", f"{name}{{"))
        )
    wanted = sorted(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and "} " in line:
            inside = line[len(name) + 1 : line.index("} ")]
            if sorted(inside.split(",")) == wanted:
                return float(line.split()[-1])
    return 0.0


async def test_metrics_count_appends_refusals_and_latency(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as plain:
        before = (await plain.get("/metrics")).text
        body = {"stream_id": "m", "direction": "output", "limits": {"max_unread_items": 2}}
        assert (await api.post(f"/runs/{run_id}/streams", json=body)).status_code == 201
        records = {"records": [{"data": 1}, {"data": 2}]}
        assert (
            await api.post(f"/runs/{run_id}/streams/m/records", json=records)
        ).status_code == 201
        refused = await api.post(f"/runs/{run_id}/streams/m/records", json=records)
        assert refused.status_code == 429
        answer = await plain.get("/metrics")
    assert answer.status_code == 200
    content_type = answer.headers["content-type"]
    assert content_type.startswith("text/plain") and content_type.count("charset") == 1
    after = answer.text
    assert (
        metric(after, "ductor_streams_records_total")
        - metric(before, "ductor_streams_records_total")
        >= 2
    )
    assert metric(after, "ductor_streams_problems_total", code="backpressure") >= 1
    route = "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"
    assert (
        metric(
            after,
            "ductor_streams_request_duration_seconds_count",
            method="POST",
            route=route,
            status="201",
        )
        >= 1
    )
    for name in (
        "ductor_streams_active_subscriptions",
        'ductor_streams_outbox_pending{outbox="input_delivery"}',
        'ductor_streams_outbox_lag_seconds{outbox="deletion"}',
    ):
        assert name in after


async def test_records_are_counted_whichever_surface_and_way_brought_them(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """Native appends, Durable Streams appends, a Durable Streams create's initial records and
    an object commit: each is counted once, under its surface and entry."""
    import hashlib

    ds = httpx.AsyncClient(
        base_url=server.base_url + "/api/durable-streams/v1/stream",
        headers=dict(api.headers),
    )
    async with httpx.AsyncClient(base_url=server.base_url) as plain, ds:
        before = (await plain.get("/metrics")).text
        body = {"stream_id": "n", "direction": "output"}
        assert (await api.post(f"/runs/{run_id}/streams", json=body)).status_code == 201
        records = {"records": [{"data": 1}, {"data": 2}, {"data": 3}]}
        native = await api.post(f"/runs/{run_id}/streams/n/records", json=records)
        assert native.status_code == 201, native.text
        created = await ds.put(
            f"/{run_id}/d", content=b"hello", headers={"Content-Type": "text/plain"}
        )
        assert created.status_code == 201, created.text
        for chunk in (b" a", b" b"):
            appended = await ds.post(
                f"/{run_id}/d", content=chunk, headers={"Content-Type": "text/plain"}
            )
            assert appended.status_code in (200, 204), appended.text
        blob = b"an object body"
        intent = await api.post(
            f"/runs/{run_id}/streams/n/objects",
            json={
                "idempotency_key": "o1",
                "size": len(blob),
                "sha256": hashlib.sha256(blob).hexdigest(),
                "content_type": "application/octet-stream",
            },
        )
        assert intent.status_code == 201, intent.text
        object_path = f"/runs/{run_id}/streams/n/objects/{intent.json()['object_id']}"
        assert (await api.put(f"{object_path}/body", content=blob)).status_code == 200
        assert (await api.post(f"{object_path}/commit")).status_code == 201
        after = (await plain.get("/metrics")).text

    def grew(name: str, surface: str, entry: str) -> float:
        labels = {"surface": surface, "entry": entry}
        return metric(after, name, **labels) - metric(before, name, **labels)

    # Other tests may share this server, but not these streams: at least ours are counted.
    assert grew("ductor_streams_records_total", "workflow-streams", "append") >= 3
    assert grew("ductor_streams_appends_total", "workflow-streams", "append") >= 1
    assert grew("ductor_streams_records_total", "durable-streams", "create") >= 1
    assert grew("ductor_streams_records_total", "durable-streams", "append") >= 2
    assert grew("ductor_streams_appends_total", "durable-streams", "append") >= 2
    assert grew("ductor_streams_records_total", "workflow-streams", "object") >= 1


async def test_metrics_follow_prometheus_conventions(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as plain:
        text = (await plain.get("/metrics")).text
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))
    # Counts are counters (exposed as `<name>_total`), never gauges.
    for count in (
        "ductor_streams_wake_bus_reconnects",
        "ductor_streams_gaps_repaired",
        "ductor_streams_appends",
        "ductor_streams_records",
        "ductor_streams_problems",
    ):
        assert types.get(f"{count}_total", types.get(count)) == "counter", count
        assert f"{count}_total " in text or f"{count}_total{{" in text
    assert types.get("ductor_streams_request_duration_seconds") == "histogram"
    # The process's own figures, and the platform's.
    assert metric(text, "process_resident_memory_bytes") > 0
    assert metric(text, "process_open_fds") > 0
    assert "python_info{" in text


async def test_every_answer_carries_a_request_id_and_keeps_the_callers(
    api: httpx.AsyncClient,
) -> None:
    mine = await api.get("/runs/nope/streams", headers={"X-Request-ID": "trace-123"})
    assert mine.headers["x-request-id"] == "trace-123"
    fresh = [(await api.get("/runs/nope/streams")).headers["x-request-id"] for _ in range(3)]
    assert len(set(fresh)) == 3 and all(fresh)


async def test_the_append_route_answers_as_every_route_does(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """The append route is served in front of the router (entrypoints/front.py): its answers,
    good and bad, carry what every other route's do: the request id (the caller's or a new
    one), the security headers, problem+json with the application's own headers."""
    body = {"stream_id": "hot", "direction": "output"}
    assert (await api.post(f"/runs/{run_id}/streams", json=body)).status_code == 201
    path = f"/runs/{run_id}/streams/hot/records"
    ok = await api.post(path, json={"records": [{"data": 1}]}, headers={"X-Request-ID": "t-1"})
    assert ok.status_code == 201 and ok.headers["x-request-id"] == "t-1"
    assert ok.headers["x-content-type-options"] == "nosniff"
    assert ok.headers["content-type"] == "application/json"
    fresh = [
        (await api.post(path, json={"records": [{"data": 2}]})).headers["x-request-id"]
        for _ in range(2)
    ]
    assert len(set(fresh)) == 2 and all(fresh)
    async with httpx.AsyncClient(base_url=server.base_url + "/api/workflow-streams") as plain:
        anonymous = await plain.post(path, json={"records": [{"data": 3}]})
    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"] == "application/problem+json"
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert anonymous.headers["x-request-id"] and anonymous.json()["code"] == "unauthenticated"
    assert anonymous.headers["x-content-type-options"] == "nosniff"
    bad = await api.post(path, content=b"{", headers={"X-Request-ID": "t-2"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid-input"
    assert bad.headers["x-request-id"] == "t-2"
    encoded = await api.post(
        path, json={"records": [{"data": 4}]}, headers={"Content-Encoding": "gzip"}
    )
    assert encoded.status_code == 415 and encoded.json()["code"] == "unsupported-media-type"
    missing = await api.post(f"/runs/{run_id}/streams/nope/records", json={"records": [{}]})
    assert missing.status_code == 404 and missing.json()["code"] == "not-found"
    # Paths the router alone knows keep its answers: a trailing slash, another method.
    assert (await api.post(path + "/", json={"records": [{"data": 5}]})).status_code == 201
    assert (await api.put(path, json={"records": [{"data": 6}]})).status_code == 405
    page = (await api.get(f"{path}?cursor=0")).json()
    assert [r["data"] for r in page["records"]] == [1, 2, 2, 5]


async def test_appends_answered_in_front_of_the_router_are_timed_under_the_routers_templates(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """The metric's route label of a front-served POST is the template Litestar records for a
    GET of the same path (which the router serves), on both surfaces."""
    ds = f"{server.base_url}/api/durable-streams/v1/stream"
    auth = {"Authorization": api.headers["authorization"]}
    async with httpx.AsyncClient() as plain:
        for url in (f"{ds}/{run_id}/m2", f"{ds}/{run_id}-m2"):
            created = await plain.put(url, headers={**auth, "Content-Type": "text/plain"})
            assert created.status_code == 201, created.text
            posted = await plain.post(
                url, headers={**auth, "Content-Type": "text/plain"}, content=b"x"
            )
            assert posted.status_code == 204, posted.text
            assert (await plain.get(url, headers=auth, params={"offset": "-1"})).status_code == 200
        native = f"/runs/{run_id}/streams/m3"
        body = {"stream_id": "m3", "direction": "output"}
        assert (await api.post(f"/runs/{run_id}/streams", json=body)).status_code == 201
        assert (
            await api.post(native + "/records", json={"records": [{"data": 1}]})
        ).status_code == 201
        assert (await api.get(native + "/records")).status_code == 200
        text = (await plain.get(f"{server.base_url}/metrics")).text
    lines = [line for line in text.splitlines() if "request_duration_seconds_count" in line]

    def routes(method: str, status: str) -> set[str]:
        return {
            line.split('route="', 1)[1].split('"', 1)[0]
            for line in lines
            if f'method="{method}"' in line and f'status="{status}"' in line
        }

    ds_routes = {  # the stream routes (not the subscriptions' reserved `__ds` ones)
        r
        for r in routes("GET", "200")
        if r.startswith("/api/durable-streams/") and "/__ds/" not in r
    }
    assert len(ds_routes) == 2
    assert ds_routes <= routes("POST", "204")
    native_route = "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"
    assert native_route in routes("GET", "200") and native_route in routes("POST", "201")


async def test_the_console_is_served_with_one_charset_per_content_type(
    server: ServerProcess,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as plain:
        for path, kind in (
            ("/console", "text/html"),
            ("/console/console.js", "text/javascript"),
            ("/console/console.css", "text/css"),
        ):
            answer = await plain.get(path)
            assert answer.status_code == 200, path
            assert answer.headers["content-type"] == f"{kind}; charset=utf-8", path


async def test_health_and_readiness_need_no_token(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as plain:
        assert (await plain.get("/healthz")).json() == {"status": "ok"}
        assert (await plain.get("/readyz")).json() == {"status": "ready"}
