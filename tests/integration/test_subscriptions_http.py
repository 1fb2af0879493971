"""Subscriptions over HTTP on the real server: the native API below /api/workflow-streams and
the protocol's `__ds` routes are the same objects; scopes and tenancy; bad input is a
problem+json that changes nothing; pull-wake claim/ack/release by sequence."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import httpx
import pytest

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV, Tokens, api_client
from tests.support.offsets import At
from tests.support.pull_wake import claimed_pull_wake
from tests.support.server import ServerProcess

HOOK = "http://127.0.0.1:9/hook"  # nothing listens there; these tests run no delivering worker


def sid() -> str:
    return "sub-" + secrets.token_hex(4)


async def test_a_native_subscription_is_the_protocols_too(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "a", "direction": "output"}
    )
    assert created.status_code == 201
    await api.post(
        f"/runs/{run_id}/streams/a/records", json={"records": [{"data": 1}, {"data": 2}]}
    )
    name = sid()
    body = {
        "type": "webhook",
        "pattern": {"run_id": run_id, "stream_id": "*"},
        "webhook": {"url": HOOK},
    }
    put = await api.put(f"/subscriptions/{name}", json=body)
    assert put.status_code == 201, put.text
    view = put.json()
    assert view["streams"] == [
        {
            "run_id": run_id,
            "stream_id": "a",
            "link_type": "glob",
            "acked_sequence": 2,
            "head": 2,
            "pending": False,
        }
    ]
    assert view["webhook"]["signing"]["jwks_url"].endswith(
        "/api/durable-streams/v1/stream/__ds/jwks.json"
    )
    assert (await api.put(f"/subscriptions/{name}", json=body)).status_code == 200
    other = {**body, "description": "changed"}
    conflict = await api.put(f"/subscriptions/{name}", json=other)
    assert conflict.status_code == 409 and conflict.json()["code"] == "subscription-conflict"
    protocol = await api.get(
        f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions/{name}"
    )
    assert protocol.status_code == 200
    assert protocol.json()["streams"] == [
        {
            "path": f"{run_id}/a",
            "link_type": "glob",
            "acked_offset": At(2),
        }
    ]
    listed = await api.get(f"/runs/{run_id}/streams/a/subscriptions")
    assert [s["id"] for s in listed.json()["subscriptions"]] == [name]
    assert (await api.get(f"/runs/{run_id}/streams/nope/subscriptions")).status_code == 404
    linked = await api.post(
        f"/subscriptions/{name}/streams", json={"streams": [{"run_id": run_id, "stream_id": "b"}]}
    )
    assert linked.status_code == 204
    got = (await api.get(f"/subscriptions/{name}")).json()
    assert [(s["stream_id"], s["link_type"]) for s in got["streams"]] == [
        ("a", "glob"),
        ("b", "explicit"),
    ]
    assert (await api.delete(f"/subscriptions/{name}/streams/{run_id}/b")).status_code == 204
    assert (await api.delete(f"/subscriptions/{name}")).status_code == 204
    assert (await api.get(f"/subscriptions/{name}")).status_code == 404


async def test_unlinking_a_named_stream_the_pattern_matches_keeps_its_glob_link(
    api: httpx.AsyncClient, run_id: str
) -> None:
    """A stream named in `streams` and matched by the pattern is linked both ways: unlinked by
    name, it stays linked by the glob, and its next records still wake the subscription."""
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "a", "direction": "output"}
    )
    assert created.status_code == 201
    name = sid()
    body = {
        "type": "webhook",
        "pattern": {"run_id": run_id, "stream_id": "*"},
        "streams": [{"run_id": run_id, "stream_id": "a"}],
        "webhook": {"url": HOOK},
    }
    put = await api.put(f"/subscriptions/{name}", json=body)
    assert put.status_code == 201, put.text
    assert [s["link_type"] for s in put.json()["streams"]] == ["explicit"]
    assert (await api.delete(f"/subscriptions/{name}/streams/{run_id}/a")).status_code == 204
    await api.post(f"/runs/{run_id}/streams/a/records", json={"records": [{"data": 1}]})
    got = (await api.get(f"/subscriptions/{name}")).json()
    assert [(s["stream_id"], s["link_type"], s["pending"]) for s in got["streams"]] == [
        ("a", "glob", True)
    ]
    assert (await api.delete(f"/subscriptions/{name}")).status_code == 204


async def test_the_same_subscription_made_at_once_by_many_is_one_201_and_the_rest_200(
    api: httpx.AsyncClient, run_id: str
) -> None:
    """None of them finds a row to lock: the first insert wins, the others decide again from
    its row (they got a 500 from the unique key)."""
    for attempt in range(3):
        name = sid()
        body = {
            "type": "webhook",
            "streams": [{"run_id": run_id, "stream_id": f"s{attempt}"}],
            "webhook": {"url": HOOK},
        }
        other = {**body, "description": "another configuration"}
        answers = await asyncio.gather(
            *(api.put(f"/subscriptions/{name}", json=body) for _ in range(6)),
            api.put(f"/subscriptions/{name}", json=other),
        )
        statuses = sorted(a.status_code for a in answers[:-1])
        if answers[-1].status_code == 201:  # the other configuration was made first
            assert statuses == [409] * 6, [a.text for a in answers]
        else:
            assert answers[-1].status_code == 409, answers[-1].text
            assert statuses == [200] * 5 + [201], [a.text for a in answers]


async def test_creating_needs_admin_and_another_tenant_sees_nothing(
    server: ServerProcess, tokens: Tokens, api: httpx.AsyncClient
) -> None:
    writer = await tokens.create(scopes=("streams:read", "streams:write"))
    stranger = await tokens.create(tenant="elsewhere")
    name = sid()
    body = {
        "type": "webhook",
        "streams": [{"run_id": "r", "stream_id": "s"}],
        "webhook": {"url": HOOK},
    }
    async with api_client(server, writer) as w:
        denied = await w.put(f"/subscriptions/{name}", json=body)
        assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
        ds = await w.put(
            f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions/{name}",
            json={"type": "webhook", "streams": ["r/s"], "webhook": {"url": HOOK}},
        )
        assert ds.status_code == 403
    assert (await api.put(f"/subscriptions/{name}", json=body)).status_code == 201
    async with api_client(server, stranger) as s:
        assert (await s.get(f"/subscriptions/{name}")).status_code == 404
        assert (await s.delete(f"/subscriptions/{name}")).status_code == 404
    assert (await api.get(f"/subscriptions/{name}")).status_code == 200


async def test_a_subscription_shows_no_stream_its_reader_may_not_read(
    server: ServerProcess, tokens: Tokens, api: httpx.AsyncClient, run_id: str
) -> None:
    """A stream's pinned readers hold for its link in a subscription too: another reader of the
    tenant sees neither its path nor its acknowledged position, on either surface."""
    pinned = {"stream_id": "pinned", "direction": "output", "authorization": {"readers": ["alice"]}}
    assert (await api.post(f"/runs/{run_id}/streams", json=pinned)).status_code == 201
    opened = {"stream_id": "open", "direction": "output"}
    assert (await api.post(f"/runs/{run_id}/streams", json=opened)).status_code == 201
    name = sid()
    body = {
        "type": "webhook",
        "streams": [
            {"run_id": run_id, "stream_id": "pinned"},
            {"run_id": run_id, "stream_id": "open"},
        ],
        "webhook": {"url": HOOK},
    }
    made = await api.put(f"/subscriptions/{name}", json=body)
    assert made.status_code == 201
    # Its creator may not read `pinned` either: the answer shows it no more than GET would.
    assert [s["stream_id"] for s in made.json()["streams"]] == ["open"], made.text
    again = await api.put(f"/subscriptions/{name}", json=body)
    assert again.status_code == 200 and "pinned" not in again.text
    alice = await tokens.create(principal="alice", scopes=("streams:read",))
    bob = await tokens.create(principal="bob", scopes=("streams:read",))
    ds = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions/{name}"
    async with api_client(server, alice) as a:
        native = (await a.get(f"/subscriptions/{name}")).json()
        assert sorted(s["stream_id"] for s in native["streams"]) == ["open", "pinned"]
    async with api_client(server, bob) as b:
        native = await b.get(f"/subscriptions/{name}")
        assert native.status_code == 200, native.text
        assert [s["stream_id"] for s in native.json()["streams"]] == ["open"]
        protocol = await b.get(ds)
        assert [s["path"] for s in protocol.json()["streams"]] == [f"{run_id}/open"]
        assert "pinned" not in native.text + protocol.text


async def test_a_run_scoped_token_sees_and_makes_only_subscriptions_within_its_runs(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str
) -> None:
    """As if the other runs were another tenant's: a subscription reaching past the token's runs
    is 404 to it on both surfaces, and it cannot make one (a glob spanning runs, another run's
    stream) — its webhook would otherwise hear of streams the token cannot see."""
    other = run_id + "-other"
    minted = await api.post(
        "/tokens",
        json={
            "scopes": ["streams:read", "streams:write", "streams:admin"],
            "expires_in_seconds": 600,
            "runs": [run_id],
        },
    )
    assert minted.status_code == 201, minted.text
    wide, mine = sid(), sid()
    everything = {
        "type": "webhook",
        "pattern": {"run_id": "*", "stream_id": "*"},
        "webhook": {"url": HOOK},
    }
    assert (await api.put(f"/subscriptions/{wide}", json=everything)).status_code == 201
    ds = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    async with api_client(server, minted.json()["token"]) as scoped:
        for path in (f"/subscriptions/{wide}", f"{ds}/{wide}"):
            assert (await scoped.get(path)).status_code == 404
        assert (await scoped.delete(f"/subscriptions/{wide}")).status_code == 404
        for refused in (
            everything,
            {
                "type": "webhook",
                "pattern": {"run_id": other, "stream_id": "*"},
                "webhook": {"url": HOOK},
            },
            {
                "type": "webhook",
                "streams": [{"run_id": other, "stream_id": "s"}],
                "webhook": {"url": HOOK},
            },
        ):
            answer = await scoped.put(f"/subscriptions/{sid()}", json=refused)
            assert answer.status_code == 403 and answer.json()["code"] == "forbidden", answer.text
        own = {
            "type": "webhook",
            "pattern": {"run_id": run_id, "stream_id": "*"},
            "webhook": {"url": HOOK},
        }
        assert (await scoped.put(f"/subscriptions/{mine}", json=own)).status_code == 201
        assert (await scoped.get(f"/subscriptions/{mine}")).status_code == 200
        linked = await scoped.post(
            f"/subscriptions/{mine}/streams",
            json={"streams": [{"run_id": other, "stream_id": "s"}]},
        )
        assert linked.status_code == 404, linked.text
        assert (await scoped.delete(f"/subscriptions/{mine}")).status_code == 204
        # Made within its runs, then reaching past them: an admin over every run links another
        # run's stream to it. It is not there for the token any more (it was read and deleted).
        assert (await scoped.put(f"/subscriptions/{mine}", json=own)).status_code == 201
        reaching = await api.post(
            f"/subscriptions/{mine}/streams",
            json={"streams": [{"run_id": other, "stream_id": "s"}]},
        )
        assert reaching.status_code == 204, reaching.text
        for path in (f"/subscriptions/{mine}", f"{ds}/{mine}"):
            assert (await scoped.get(path)).status_code == 404
        assert (await scoped.delete(f"/subscriptions/{mine}")).status_code == 404
        assert (await scoped.put(f"/subscriptions/{mine}", json=own)).status_code == 409
    assert (await api.delete(f"/subscriptions/{mine}")).status_code == 204  # still there
    assert (await api.get(f"/subscriptions/{wide}")).status_code == 200  # untouched
    assert (await api.delete(f"/subscriptions/{wide}")).status_code == 204  # it matches all


async def test_a_streams_subscriptions_show_a_run_scoped_reader_nothing_of_other_runs(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str, pool: asyncpg.Pool
) -> None:
    """The listing of one stream's subscriptions is `get`'s view of each: a subscription that
    names another run (its wake stream, here) is not listed to a token restricted to this run,
    and a reader without `streams:admin` sees a webhook's origin, not its path or query (often
    the receiver's credential)."""
    other = run_id + "-other"
    for run, stream in ((run_id, "s"), (other, "wake")):
        made = await api.post(
            f"/runs/{run}/streams", json={"stream_id": stream, "direction": "output"}
        )
        assert made.status_code == 201, made.text
    secret_hook = "http://127.0.0.1:9/hook?secret=SUPERSECRET"
    waking, hooked = sid(), sid()
    configs = {
        waking: {
            "type": "pull-wake",
            "streams": [{"run_id": run_id, "stream_id": "s"}],
            "wake_stream": {"run_id": other, "stream_id": "wake"},
        },
        hooked: {
            "type": "webhook",
            "streams": [{"run_id": run_id, "stream_id": "s"}],
            "webhook": {"url": secret_hook},
        },
    }
    for name, config in configs.items():
        made = await api.put(f"/subscriptions/{name}", json=config)
        assert made.status_code == 201, made.text
    # Its last attempt failed, saying where it went (as a connection error may).
    await pool.execute(
        "UPDATE ds_subscriptions SET failing = true, last_error = $2 WHERE subscription_id = $1",
        hooked,
        "ConnectError: 127.0.0.1:9/hook?secret=SUPERSECRET refused",
    )
    listing = f"/runs/{run_id}/streams/s/subscriptions"
    whole = (await api.get(listing)).json()["subscriptions"]
    assert {sub["id"] for sub in whole} == {waking, hooked}
    assert [sub["webhook"]["url"] for sub in whole if sub["id"] == hooked] == [secret_hook]
    admin_view = (await api.get(f"/subscriptions/{hooked}")).json()
    assert admin_view["status"] == "failed" and "refused" in admin_view["last_error"]
    minted = await api.post(
        "/tokens",
        json={"scopes": ["streams:read"], "expires_in_seconds": 600, "runs": [run_id]},
    )
    assert minted.status_code == 201, minted.text
    ds = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    async with api_client(server, minted.json()["token"]) as reader:
        listed = await reader.get(listing)
        assert listed.status_code == 200, listed.text
        [shown] = listed.json()["subscriptions"]
        assert shown["id"] == hooked
        assert shown["webhook"]["url"] == "http://127.0.0.1:9"
        assert "SUPERSECRET" not in listed.text and other not in listed.text
        for path in (f"/subscriptions/{hooked}", f"{ds}/{hooked}"):
            got = await reader.get(path)
            assert got.status_code == 200, got.text
            assert "SUPERSECRET" not in got.text
        assert (await reader.get(f"/subscriptions/{waking}")).status_code == 404
    for name in configs:
        assert (await api.delete(f"/subscriptions/{name}")).status_code == 204


async def test_bad_input_is_a_problem_that_changes_nothing(
    api: httpx.AsyncClient, server: ServerProcess
) -> None:
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    name = sid()
    for bad in [
        b"not json",
        b"{}",
        b'{"type":"webhook","pattern":"a/*"}',  # no webhook
        b'{"type":"pull-wake","pattern":"a/*"}',  # no wake stream
        b'{"type":"webhook","webhook":{"url":"https://x.example/h"}}',  # no pattern, no streams
        b'{"type":"webhook","pattern":"a/*","webhook":{"url":"https://x.example/h"},"lease_ttl_ms":5}',
        b'{"type":"webhook","streams":["a/b/c/d"],"webhook":{"url":"https://x.example/h"}}',
        b'{"type":"webhook","pattern":"a/*","webhook":{"url":"http://169.254.169.254/"}}',
        b'{"type":"webhook","pattern":"a/*","webhook":{"url":"https://[fd00::1]/"}}',
        # never deliverable: an HTTP request line is ASCII
        '{"type":"webhook","pattern":"a/*","webhook":{"url":"https://bücher.example/h"}}'.encode(),
        b'{"type":"teapot","pattern":"a/*"}',
        # stored text is shown again: no control character, no bidirectional override
        b'{"type":"webhook","pattern":"a/*","webhook":{"url":"https://x.example/h"},'
        b'"description":"a\\u0000b"}',
        b'{"type":"webhook","pattern":"a/*","webhook":{"url":"https://x.example/h"},'
        b'"description":"case 42\\u202e"}',
    ]:
        answer = await api.put(
            f"{root}/{name}", content=bad, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.json()["error"]["code"] in ("INVALID_INPUT", "WEBHOOK_URL_REJECTED")
    assert (await api.get(f"{root}/{name}")).status_code == 404
    forged = await api.post(
        f"{root}/{name}/callback",
        json={"wake_id": "w", "generation": 1, "done": True},
        headers={"authorization": "Bearer forged.token"},
    )
    assert forged.status_code == 401 and forged.json()["error"]["code"] == "WAKE_TOKEN_INVALID"


async def test_an_unlink_names_its_stream_as_a_link_would(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """`DELETE .../streams/{path}` takes the URL-encoded path as it was sent: `ul%2F%2Fs1`
    (`ul//s1`, which a link's body refuses) is 400 and unlinks nothing; the router, which takes
    `//` as `/`, once had it unlink `ul/s1`."""
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    name = sid()
    body = {"type": "webhook", "streams": [f"{run_id}/s1"], "webhook": {"url": HOOK}}
    assert (await api.put(f"{root}/{name}", json=body)).status_code == 201
    for odd in (f"{run_id}%2F%2Fs1", f"{run_id}%2F%2F%2F%2Fs1", f"{run_id}%2Fs1%2Fx"):
        refused = await api.delete(f"{root}/{name}/streams/{odd}")
        assert refused.status_code == 400, (odd, refused.text)
        assert refused.headers["content-type"].startswith("application/problem+json")
    shown = (await api.get(f"{root}/{name}")).json()
    assert [s["path"] for s in shown["streams"]] == [f"{run_id}/s1"]  # still linked
    assert (await api.delete(f"{root}/{name}/streams/{run_id}%2Fs1")).status_code == 204
    assert (await api.get(f"{root}/{name}")).json()["streams"] == []


async def test_a_subscription_names_at_most_1000_streams(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """`GET` lists every link of a subscription, and the sweep passes over them: one grown by
    links of 40,000 streams a request to 160,000 held every wake decision past its bound (when
    decisions still read every link)."""
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    name = sid()
    named = [f"{run_id}/s{i}" for i in range(900)]
    made = await api.put(
        f"{root}/{name}",
        json={"type": "webhook", "streams": named, "webhook": {"url": HOOK}},
    )
    assert made.status_code == 201, made.text
    more = [f"{run_id}/t{i}" for i in range(100)]
    assert (await api.post(f"{root}/{name}/streams", json={"streams": more})).status_code == 204
    # At the bound: those it names already may be named again, one more may not, on either
    # surface, and nothing of a refused request is linked.
    again = await api.post(f"{root}/{name}/streams", json={"streams": more[:10]})
    assert again.status_code == 204, again.text
    refused = await api.post(f"{root}/{name}/streams", json={"streams": ["x/one", "x/two"]})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "TOO_MANY_LINKS"
    native = await api.post(
        f"/subscriptions/{name}/streams", json={"streams": [{"run_id": "x", "stream_id": "one"}]}
    )
    assert native.status_code == 409 and native.json()["code"] == "too-many-links", native.text
    assert native.json()["named"] == 1000
    paths = {s["path"] for s in (await api.get(f"{root}/{name}")).json()["streams"]}
    assert len(paths) == 1000 and "x/one" not in paths
    # One request links at most 1,000 (the PUT's bound too).
    many = [f"y/s{i}" for i in range(1001)]
    too_many = await api.post(f"{root}/{name}/streams", json={"streams": many})
    assert too_many.status_code == 400, too_many.text
    # Unlinked, there is room again.
    gone = await api.delete(f"{root}/{name}/streams/{run_id}%2Fs0")
    assert gone.status_code == 204, gone.text
    linked = await api.post(f"{root}/{name}/streams", json={"streams": ["x/one"]})
    assert linked.status_code == 204, linked.text
    assert (await api.delete(f"{root}/{name}")).status_code == 204


async def test_pull_wake_claim_ack_release_by_sequence(api: httpx.AsyncClient, run_id: str) -> None:
    for stream in ("wake", "e1"):
        await api.post(f"/runs/{run_id}/streams", json={"stream_id": stream, "direction": "output"})
    name = sid()
    put = await api.put(
        f"/subscriptions/{name}",
        json={
            "type": "pull-wake",
            "pattern": {"run_id": run_id, "stream_id": "e*"},
            "wake_stream": {"run_id": run_id, "stream_id": "wake"},
        },
    )
    assert put.status_code == 201, put.text
    none = await api.post(f"/subscriptions/{name}/claim", json={"worker": "w1"})
    assert none.status_code == 409 and none.json()["code"] == "no-pending-work"
    await api.post(f"/runs/{run_id}/streams/e1/records", json={"records": [{"data": 1}]})
    claim = await api.post(f"/subscriptions/{name}/claim", json={"worker": "w1"})
    assert claim.status_code == 200, claim.text
    claimed = claim.json()
    busy = await api.post(f"/subscriptions/{name}/claim", json={"worker": "w2"})
    assert busy.status_code == 409 and busy.json()["current_holder"] == "w1"
    auth = {"authorization": f"Bearer {claimed['token']}"}
    wake = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
    ahead = await api.post(
        f"/subscriptions/{name}/ack",
        json={**wake, "acks": [{"run_id": run_id, "stream_id": "e1", "sequence": 5}]},
        headers=auth,
    )
    assert ahead.status_code == 409 and ahead.json()["code"] == "invalid-offset"
    done = await api.post(
        f"/subscriptions/{name}/ack",
        json={**wake, "acks": [{"run_id": run_id, "stream_id": "e1", "sequence": 1}], "done": True},
        headers=auth,
    )
    assert done.json() == {"ok": True, "next_wake": False}
    stale = await api.post(f"/subscriptions/{name}/release", json=wake, headers=auth)
    assert stale.status_code == 409 and stale.json()["code"] == "fenced"
    got = (await api.get(f"/subscriptions/{name}")).json()
    assert got["streams"][0]["acked_sequence"] == 1 and got["wake"] is None


async def test_a_run_scoped_claim_acks_nothing_once_its_subscription_names_another_run(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str
) -> None:
    """Claimed by a token restricted to its run, then an admin links another run's stream: the
    claim's token may no longer ack (the other run's stream least of all) nor extend the lease,
    as the token may no longer see the subscription."""
    other = run_id + "-other"
    for run, stream in ((run_id, "pw-wake"), (run_id, "pw-e1"), (other, "s")):
        made = await api.post(
            f"/runs/{run}/streams", json={"stream_id": stream, "direction": "output"}
        )
        assert made.status_code == 201, made.text
    name = sid()
    put = await api.put(
        f"/subscriptions/{name}",
        json={
            "type": "pull-wake",
            "streams": [{"run_id": run_id, "stream_id": "pw-e1"}],
            "wake_stream": {"run_id": run_id, "stream_id": "pw-wake"},
        },
    )
    assert put.status_code == 201, put.text
    await api.post(f"/runs/{run_id}/streams/pw-e1/records", json={"records": [{"data": 1}]})
    minted = await api.post(
        "/tokens",
        json={
            "scopes": ["streams:read", "streams:write"],
            "expires_in_seconds": 600,
            "runs": [run_id, *(f"{run_id}-{'x' * 100}-{n}" for n in range(50))],
        },
    )
    assert minted.status_code == 201, minted.text
    async with api_client(server, minted.json()["token"]) as scoped:
        claim = await scoped.post(f"/subscriptions/{name}/claim", json={"worker": "w1"})
        assert claim.status_code == 200, claim.text
    claimed = claim.json()
    # Its runs are read from its row, not carried: 51 runs of 100-odd characters made a claim
    # token of 8 KB, past some proxies' limit on a header.
    assert len(claimed["token"]) < 400, len(claimed["token"])
    auth = {"authorization": f"Bearer {claimed['token']}"}
    wake = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
    linked = await api.post(
        f"/subscriptions/{name}/streams", json={"streams": [{"run_id": other, "stream_id": "s"}]}
    )
    assert linked.status_code == 204, linked.text
    await api.post(f"/runs/{other}/streams/s/records", json={"records": [{"data": 1}, {"data": 2}]})
    for acks in (
        [{"run_id": other, "stream_id": "s", "sequence": 2}],
        [{"run_id": run_id, "stream_id": "pw-e1", "sequence": 1}],
    ):
        answer = await api.post(
            f"/subscriptions/{name}/ack", json={**wake, "acks": acks}, headers=auth
        )
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "subscription-not-found", answer.text
    got = (await api.get(f"/subscriptions/{name}")).json()
    acked = {(s["run_id"], s["stream_id"]): s["acked_sequence"] for s in got["streams"]}
    assert acked[(other, "s")] == 0 and acked[(run_id, "pw-e1")] == 0, got


async def test_a_claim_ends_with_the_token_that_made_it(
    server: ServerProcess, api: httpx.AsyncClient, run_id: str
) -> None:
    """A worker's claim holds no longer than its credential: once the API token that claimed
    is revoked, the claim's token is refused (401), so its holder can no longer ack or extend
    the lease (the next claim takes the wake over when the lease runs out)."""
    minted = await api.post(
        "/tokens",
        json={
            "scopes": ["streams:read", "streams:write", "streams:admin"],
            "expires_in_seconds": 600,
        },
    )
    assert minted.status_code == 201, minted.text
    name = sid()
    async with api_client(server, minted.json()["token"]) as worker:
        claimed = await claimed_pull_wake(worker, "", run_id, name)
    auth = {"authorization": f"Bearer {claimed['token']}"}
    wake = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
    beat = await api.post(f"/subscriptions/{name}/ack", json=wake, headers=auth)
    assert beat.status_code == 200, beat.text
    assert (await api.delete(f"/tokens/{minted.json()['id']}")).status_code == 204
    await asyncio.sleep(1.2)  # what the claim knew of its token (a second) has passed
    refused = await api.post(
        f"/subscriptions/{name}/ack",
        json={**wake, "acks": [{"run_id": run_id, "stream_id": "e1", "sequence": 1}]},
        headers=auth,
    )
    assert refused.status_code == 401, refused.text
    assert refused.json()["code"] == "wake-token-invalid"
    got = (await api.get(f"/subscriptions/{name}")).json()
    assert got["streams"][0]["acked_sequence"] == 0  # the ack changed nothing
    # Releasing is still allowed: it only gives the wake up.
    released = await api.post(f"/subscriptions/{name}/release", json=wake, headers=auth)
    assert released.status_code == 204, released.text


async def test_a_claim_shows_no_stream_its_worker_may_not_read(
    server: ServerProcess, tokens: Tokens, api: httpx.AsyncClient, run_id: str
) -> None:
    """As the subscription's own document: a claim's answer lists only the streams its caller
    may read (a stream's pinned readers), not every linked stream's path and tail."""
    pinned = {"stream_id": "pinned", "direction": "output", "authorization": {"readers": ["a"]}}
    for definition in (pinned, {"stream_id": "open", "direction": "output"}):
        assert (await api.post(f"/runs/{run_id}/streams", json=definition)).status_code == 201
    await api.post(f"/runs/{run_id}/streams", json={"stream_id": "wake", "direction": "output"})
    name = sid()
    put = await api.put(
        f"/subscriptions/{name}",
        json={
            "type": "pull-wake",
            "streams": [
                {"run_id": run_id, "stream_id": "pinned"},
                {"run_id": run_id, "stream_id": "open"},
            ],
            "wake_stream": {"run_id": run_id, "stream_id": "wake"},
        },
    )
    assert put.status_code == 201, put.text
    for stream in ("pinned", "open"):
        await api.post(f"/runs/{run_id}/streams/{stream}/records", json={"records": [{"data": 1}]})
    worker = await tokens.create(principal="bob", scopes=("streams:read", "streams:write"))
    async with api_client(server, worker) as b:
        claim = await b.post(f"/subscriptions/{name}/claim", json={"worker": "w1"})
        assert claim.status_code == 200, claim.text
        assert [s["stream_id"] for s in claim.json()["streams"]] == ["open"]
        assert "pinned" not in claim.text
        claimed = claim.json()
        wake = {"wake_id": claimed["wake_id"], "generation": claimed["generation"]}
        auth = {"authorization": f"Bearer {claimed['token']}"}
        released = await b.post(f"/subscriptions/{name}/release", json=wake, headers=auth)
        assert released.status_code == 204, released.text
    # A worker that may read `pinned` is not shown it either: the subscription's creator may
    # not read it, so it is acknowledged as it grows, and an ack of it would go back.
    await api.post(f"/runs/{run_id}/streams/pinned/records", json={"records": [{"data": 2}]})
    reader = await tokens.create(principal="a", scopes=("streams:read", "streams:write"))
    async with api_client(server, reader) as a_client:
        claim = await a_client.post(f"/subscriptions/{name}/claim", json={"worker": "w2"})
        assert claim.status_code == 200, claim.text
        claimed = claim.json()
        assert [s["stream_id"] for s in claimed["streams"]] == ["open"], claim.text
        done = await a_client.post(
            f"/subscriptions/{name}/ack",
            json={
                "wake_id": claimed["wake_id"],
                "generation": claimed["generation"],
                "acks": [{"run_id": run_id, "stream_id": "open", "sequence": 1}],
                "done": True,
            },
            headers={"authorization": f"Bearer {claimed['token']}"},
        )
        assert done.status_code == 200 and done.json() == {"ok": True, "next_wake": False}, (
            done.text
        )


async def test_a_deployment_that_allows_no_loopback_refuses_webhooks_to_it(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Off by default (DUCTOR_STREAMS_WEBHOOK_LOOPBACK): a tenant's admin token would otherwise
    have the service POST to the host's own ports. The session's server allows it (its
    receivers listen here), this one does not."""
    process = ServerProcess(
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("no-loopback"),
        env={**SERVER_ENV, "DUCTOR_STREAMS_WEBHOOK_LOOPBACK": "false"},
    ).start()
    try:
        async with api_client(process) as api:
            for url in (
                "http://127.0.0.1:9/hook",
                "https://127.0.0.1:8443/admin",
                "http://localhost:9/hook",
                "http://[::1]:9/hook",
                "http://127.1/hook",
            ):
                config = {
                    "type": "webhook",
                    "pattern": {"run_id": "r", "stream_id": "*"},
                    "webhook": {"url": url},
                }
                answer = await api.put(f"/subscriptions/{sid()}", json=config)
                assert answer.status_code == 400, (url, answer.text)
                assert answer.json()["code"] == "webhook-url-rejected", answer.text
                assert "loopback" in answer.json()["detail"], answer.text
    finally:
        process.stop()


def _public_methods(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_the_async_and_sync_clients_have_the_same_subscription_methods() -> None:
    from ductor_streams_client import StreamsClient, SyncStreamsClient

    subscription_methods = {m for m in _public_methods(StreamsClient) if "subscription" in m}
    assert subscription_methods == {
        m for m in _public_methods(SyncStreamsClient) if "subscription" in m
    }
    assert "webhook_jwks" in _public_methods(StreamsClient) & _public_methods(SyncStreamsClient)


async def test_the_clients_drive_a_pull_wake_and_verify_a_signature(
    server: ServerProcess, run_id: str
) -> None:
    import asyncio

    from ductor_streams_client import (
        AlreadyClaimed,
        StreamsClient,
        SyncStreamsClient,
        verify_webhook,
    )

    name = sid()
    async with StreamsClient(server.base_url, BOOTSTRAP_TOKEN) as client:
        for stream in ("wake", "e1"):
            await client.create_stream(run_id, stream_id=stream)
        sub = await client.put_subscription(
            name, type="pull-wake", pattern=(run_id, "e*"), wake_stream=(run_id, "wake")
        )
        assert sub.wake_stream is not None and sub.wake_stream.stream_id == "wake"
        await client.append(run_id, "e1", [{"n": 1}])
        claim = await client.claim_subscription(name, "w1")

        def other_claim() -> None:
            with SyncStreamsClient(server.base_url, BOOTSTRAP_TOKEN) as sync:
                with pytest.raises(AlreadyClaimed) as held:
                    sync.claim_subscription(name, "w2")
                assert held.value.current_holder == "w1"
                assert held.value.generation == claim.generation
                assert sync.get_subscription(name).wake is not None

        await asyncio.to_thread(other_claim)
        done = await client.ack_subscription(
            name, claim.token, claim.wake_id, claim.generation, [(run_id, "e1", 1)], done=True
        )
        assert (done.ok, done.next_wake) == (True, False)
        listed = await client.stream_subscriptions(run_id, "e1")
        assert [s.id for s in listed.subscriptions] == [name]
        jwks = await client.webhook_jwks()
        await client.delete_subscription(name)
    body = b'{"subscription_id":"x"}'
    # A signature the test makes with the service's own key rows would need the private key:
    # the helper is checked against one it cannot have made, and a malformed header.
    assert not verify_webhook(body, "t=1,kid=nope,ed25519=AAAA", jwks)
    assert not verify_webhook(body, None, jwks)


def test_metrics_show_the_wake_outbox_and_webhook_attempts(server: ServerProcess) -> None:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    assert 'ductor_streams_outbox_pending{outbox="subscription_wake"}' in text
    assert 'ductor_streams_outbox_lag_seconds{outbox="subscription_wake"}' in text
    assert "ductor_streams_webhook_attempts_total" in text
    assert "ductor_streams_webhook_failures_total" in text


def test_a_rotated_webhook_key_signs_and_the_old_one_stays_published(
    server: ServerProcess, database_url: str
) -> None:
    import os
    import subprocess
    import sys
    import time

    from tests.support.server import ROOT

    jwks_url = server.base_url + "/api/durable-streams/v1/stream/__ds/jwks.json"
    before = {k["kid"] for k in httpx.get(jwks_url, timeout=5).json()["keys"]}
    done = subprocess.run(
        [sys.executable, "-m", "entrypoints.cli", "webhook-key", "rotate"],
        cwd=ROOT,
        env={**os.environ, "DUCTOR_STREAMS_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    kid = done.stdout.strip()
    assert kid.startswith("ds_") and kid not in before
    # Announced to every process (KEYS_CHANNEL): published at once, not at the next reload
    # (every 30 s).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = {k["kid"] for k in httpx.get(jwks_url, timeout=5).json()["keys"]}
        if kid in after:
            break
        time.sleep(0.5)
    assert kid in after and before <= after


async def test_a_webhook_key_published_ahead_is_in_the_jwks_before_it_signs(
    server: ServerProcess, database_url: str, pool: asyncpg.Pool
) -> None:
    """`webhook-key rotate --publish-ahead S`: the key is published at once on every process
    and signs only S seconds later, on PostgreSQL's clock; the keys it replaces sign until then
    and stay published ten minutes after. Rotations run one at a time, so two at once never
    retire each other's key."""
    import asyncio
    import os
    import subprocess
    import sys

    from adapters.webhook_signing import PostgresKeyRows, WebhookKeys
    from tests.support.server import ROOT

    def rotate(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "entrypoints.cli", "webhook-key", "rotate", *extra],
            cwd=ROOT,
            env={**os.environ, "DUCTOR_STREAMS_DATABASE_URL": database_url},
            capture_output=True,
            text=True,
            timeout=60,
        )

    for bad in ("-1", "10", "86401", "nan", "soon"):
        refused = rotate("--publish-ahead", bad)
        assert refused.returncode == 2 and "--publish-ahead" in refused.stderr, refused.stderr
    done = rotate("--publish-ahead", "330")
    assert done.returncode == 0, done.stderr
    kid = done.stdout.strip()
    ahead, retired = await pool.fetchrow(
        "SELECT extract(epoch FROM k.sign_after - now()),"
        " (SELECT max(extract(epoch FROM o.retire_after - k.sign_after))"
        "  FROM ds_signing_keys o WHERE o.kid <> k.kid AND o.retire_after > now())"
        " FROM ds_signing_keys k WHERE kid = $1",
        kid,
    )
    assert 300 < ahead <= 330 and retired == 600
    jwks_url = server.base_url + "/api/durable-streams/v1/stream/__ds/jwks.json"
    async with httpx.AsyncClient(timeout=5) as client:
        async with asyncio.timeout(5):
            while kid not in {k["kid"] for k in (await client.get(jwks_url)).json()["keys"]}:
                await asyncio.sleep(0.2)
    signing = WebhookKeys(PostgresKeyRows(pool))
    assert await signing.kid() != kid  # published, not signing yet

    # Two rotations at once (one published two seconds ahead): one after the other, the last
    # one's key signs once its time comes, and a key published before stays until then.
    first, second = await asyncio.gather(
        WebhookKeys(PostgresKeyRows(pool)).rotate(publish_ahead=2),
        WebhookKeys(PostgresKeyRows(pool)).rotate(publish_ahead=2),
    )
    live = await pool.fetch(
        "SELECT kid FROM ds_signing_keys WHERE retire_after IS NULL OR retire_after > now()"
    )
    assert {first, second} <= {r[0] for r in live}
    await asyncio.sleep(2.2)
    signing.forget()
    assert await signing.kid() in {first, second}
    assert await signing.kid() == (
        await pool.fetchval("SELECT kid FROM ds_signing_keys WHERE retire_after IS NULL")
    )


async def test_the_reserved_paths_are_never_a_stream(
    api: httpx.AsyncClient, server: ServerProcess
) -> None:
    """`__ds` is the protocol's reserved segment: a POST to its JWKS is 405 (the route reads
    only), not an append to a stream `jwks.json` of a run `__ds`, through the append front and
    the router alike."""
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds"
    for method in ("POST", "PUT", "DELETE"):
        answer = await api.request(
            method,
            f"{root}/jwks.json",
            content=b"[1]",
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 405, (method, answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
    public = await httpx.AsyncClient().get(f"{root}/jwks.json")
    assert public.status_code == 200 and "keys" in public.json()


async def test_odd_requests_to_the_wake_routes_are_problems_never_500(
    api: httpx.AsyncClient, server: ServerProcess
) -> None:
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    name = sid()
    put = await api.put(
        f"{root}/{name}",
        json={"type": "pull-wake", "pattern": "odd/*", "wake_stream": "odd-wakes/wake"},
    )
    assert put.status_code == 201, put.text
    token = {"authorization": "Bearer " + "x" * 40}
    cases = [
        ("POST", "/claim", b"[]", {}),
        ("POST", "/claim", b'{"worker": 5}', {}),
        ("POST", "/claim", b'{"worker": ""}', {}),
        ("POST", "/ack", b'{"wake_id": "w", "generation": 1}', {}),  # no token
        ("POST", "/ack", b'{"wake_id": "w", "generation": 1}', token),
        ("POST", "/ack", b'{"wake_id": "w", "generation": 1e400}', token),
        ("POST", "/ack", b'{"wake_id": "w", "generation": 99999999999999999999999}', token),
        ("POST", "/release", b"{", token),
        (
            "POST",
            "/callback",
            b'{"wake_id": "w", "generation": 1, "acks": [{"offset": "zz"}]}',
            token,
        ),
        ("POST", "/streams", b'{"streams": ["../x"]}', {}),
        ("POST", "/streams", b'{"streams": "odd/x"}', {}),
        ("DELETE", "/streams/%2E%2E", b"", {}),
        ("DELETE", "/streams/a%2Fb%2Fc%2Fd", b"", {}),
    ]
    for method, tail, body, headers in cases:
        answer = await api.request(
            method,
            f"{root}/{name}{tail}",
            content=body,
            headers={"content-type": "application/json", **headers},
        )
        assert 400 <= answer.status_code < 500, (
            method,
            tail,
            body,
            answer.status_code,
            answer.text,
        )
    for bad_id in ("_x", "a" * 200, "a%20b"):
        answer = await api.get(f"{root}/{bad_id}")
        assert 400 <= answer.status_code < 500, (bad_id, answer.text)
    # An encoded slash in an ID is 400, as on every path; only a link's stream path holds one.
    for where in (f"{root}/a%2Fb", f"{root}/a%2Fb/streams/r%2Fs"):
        answer = await api.request("GET" if where.endswith("b") else "DELETE", where)
        assert answer.status_code == 400, (where, answer.text)
    claim = await api.post(f"{root}/{name}/claim", json={"worker": "w"})
    assert claim.status_code == 409 and claim.json()["error"]["code"] == "NO_PENDING_WORK"


async def test_a_pull_wake_may_not_watch_its_own_wake_stream(
    api: httpx.AsyncClient, server: ServerProcess, run_id: str
) -> None:
    """Each wake event written to a watched wake stream would wake the subscription again: its
    pattern, its streams, or a stream linked later naming the wake stream is 400, and nothing
    is stored."""
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"
    name = sid()
    for body in (
        {"type": "pull-wake", "pattern": f"{run_id}/*", "wake_stream": f"{run_id}/wakes"},
        {"type": "pull-wake", "streams": [f"{run_id}/wakes"], "wake_stream": f"{run_id}/wakes"},
    ):
        refused = await api.put(f"{root}/{name}", json=body)
        assert refused.status_code == 400, refused.text
        assert (await api.get(f"{root}/{name}")).status_code == 404
    made = await api.put(
        f"{root}/{name}",
        json={"type": "pull-wake", "streams": [f"{run_id}/a"], "wake_stream": f"{run_id}/wakes"},
    )
    assert made.status_code == 201, made.text
    linked = await api.post(f"{root}/{name}/streams", json={"streams": [f"{run_id}/wakes"]})
    assert linked.status_code == 400, linked.text
    shown = (await api.get(f"{root}/{name}")).json()
    assert [s["path"] for s in shown["streams"]] == [f"{run_id}/a"]  # the wake stream not linked


async def test_pull_wakes_may_not_wake_each_other_in_a_ring(
    api: httpx.AsyncClient, server: ServerProcess, tokens: Tokens, run_id: str
) -> None:
    """A wake event of one wakes the next, whose wake event wakes the one after, and round
    again without end: a PUT or a `POST .../streams` that would close such a ring is 400 and
    stores nothing. A chain that does not come round is served; two PUTs at once that would
    close a ring together are decided one after the other."""
    root = f"{server.base_url}/api/durable-streams/v1/stream/__ds/subscriptions"

    def pull(wakes: str, *streams: str, pattern: str | None = None) -> dict[str, object]:
        body: dict[str, object] = {"type": "pull-wake", "wake_stream": f"{run_id}/{wakes}"}
        if streams:
            body["streams"] = [f"{run_id}/{s}" for s in streams]
        if pattern is not None:
            body["pattern"] = f"{run_id}/{pattern}"
        return body

    a, b, c = sid(), sid(), sid()
    assert (await api.put(f"{root}/{a}", json=pull("wa", "wb"))).status_code == 201
    refused = await api.put(f"{root}/{b}", json=pull("wb", pattern="wa*"))
    assert refused.status_code == 400, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert a in refused.json()["detail"] and b in refused.json()["detail"]
    assert (await api.get(f"{root}/{b}")).status_code == 404
    # A chain: b watches c's wake stream, c watches a's; nothing watches b's.
    assert (await api.put(f"{root}/{b}", json=pull("wb2", "wc"))).status_code == 201
    assert (await api.put(f"{root}/{c}", json=pull("wc", "wa"))).status_code == 201
    # a already watches `wb`; linking b's wake stream `wb2` to it closes a → c → b → a.
    ring = await api.post(f"{root}/{a}/streams", json={"streams": [f"{run_id}/wb2"]})
    assert ring.status_code == 400, ring.text
    assert all(s in ring.json()["detail"] for s in (a, b, c))
    shown = (await api.get(f"{root}/{a}")).json()
    assert [s["path"] for s in shown["streams"]] == [f"{run_id}/wb"]
    # A token restricted to the run is refused too, without the other subscriptions' names.
    scoped = await api.post(
        "/tokens",
        json={
            "principal": "scoped-" + run_id,
            "scopes": ["streams:admin", "streams:read", "streams:write"],
            "expires_in_seconds": 300,
            "runs": [run_id],
        },
    )
    assert scoped.status_code == 201, scoped.text
    async with httpx.AsyncClient(
        headers={"Authorization": f"Bearer {scoped.json()['token']}"}, timeout=30
    ) as restricted:
        d = sid()
        hidden = await restricted.put(f"{root}/{d}", json=pull("wb", "wb2"))
        assert hidden.status_code == 400, hidden.text
        assert not any(s in hidden.json()["detail"] for s in (a, b, c))
    # Two at once that would each close the ring with the other: one is made, one refused.
    for _ in range(5):
        x, y = sid(), sid()
        wx, wy = "x-" + x, "y-" + y
        answers = await asyncio.gather(
            api.put(f"{root}/{x}", json=pull(wx, wy)), api.put(f"{root}/{y}", json=pull(wy, wx))
        )
        assert sorted(r.status_code for r in answers) == [201, 400], [r.text for r in answers]
    # Two links at once, each of the other's wake stream, that would close a ring together:
    # one is made, one refused (a link of a wake stream takes the tenant's census alone).
    for _ in range(5):
        x, y = sid(), sid()
        wx, wy = "x-" + x, "y-" + y
        assert (await api.put(f"{root}/{x}", json=pull(wx, "s-" + x))).status_code == 201
        assert (await api.put(f"{root}/{y}", json=pull(wy, "s-" + y))).status_code == 201
        answers = await asyncio.gather(
            api.post(f"{root}/{x}/streams", json={"streams": [f"{run_id}/{wy}"]}),
            api.post(f"{root}/{y}/streams", json={"streams": [f"{run_id}/{wx}"]}),
        )
        assert sorted(r.status_code for r in answers) == [204, 400], [r.text for r in answers]
