"""Webhook delivery end to end: a real server, a real worker process delivering, and a real
receiver process (tests/support/webhook_receiver.py) on loopback.

Signatures are verified independently (PyPI `cryptography`, against the JWKS fetched without a
token); a receiver failing five times then succeeding is retried with backoff under one
generation; a slow receiver does not hold up another; a worker killed mid-delivery is taken
over and every pending stream is woken and acknowledged exactly."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.conftest import BOOTSTRAP_TOKEN, SERVER_ENV
from tests.support.server import ROOT, ServerProcess, WorkerProcess, free_port

RETRY_BASE = 0.1  # the backoff's unit: 0.1, 0.2, 0.4 ... s instead of 1, 2, 4 ... s
WORKER_ENV = {
    **SERVER_ENV,
    "DUCTOR_STREAMS_WEBHOOK_RETRY_BASE_SECONDS": str(RETRY_BASE),
    "DUCTOR_STREAMS_WORKER_LEASE_SECONDS": "1",
    "DUCTOR_STREAMS_SUBSCRIPTION_POLL_SECONDS": "0.05",
}


@dataclass
class Receiver:
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    def url(self, name: str, **query: object) -> str:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"http://127.0.0.1:{self.port}/{name}" + (f"?{q}" if q else "")

    def entries(self, name: str, event: str = "start") -> list[dict[str, Any]]:
        text = self.log.read_text() if self.log.exists() else ""
        # Complete lines only: the receiver may be writing the last one as it is read.
        found = [json.loads(line) for line in text.split("\n")[:-1] if line]
        return [e for e in found if e["path"] == f"/{name}" and e["event"] == event]


@dataclass
class Deployment:
    server: ServerProcess
    worker: WorkerProcess
    receiver: Receiver
    database_url: str
    data_dir: Path

    @property
    def root(self) -> str:
        return self.server.base_url + "/api/durable-streams/v1/stream"

    def client(self) -> httpx.Client:
        return httpx.Client(headers={"authorization": f"Bearer {BOOTSTRAP_TOKEN}"}, timeout=10)

    def subscribe(self, url: str, pattern: str, ttl: int = 30_000) -> dict[str, Any]:
        sid = "sub-" + secrets.token_hex(4)
        with self.client() as c:
            answer = c.put(
                f"{self.root}/__ds/subscriptions/{sid}",
                json={
                    "type": "webhook",
                    "pattern": pattern,
                    "webhook": {"url": url},
                    "lease_ttl_ms": ttl,
                },
            )
        assert answer.status_code == 201, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def write(self, path: str, value: object, create: bool = True) -> None:
        with self.client() as c:
            answer = c.request(
                "PUT" if create else "POST",
                f"{self.root}/{path}",
                headers={"content-type": "application/json"},
                content=json.dumps(value),
            )
        assert answer.status_code in (200, 201, 204), answer.text

    def subscription(self, sid: str) -> dict[str, Any]:
        with self.client() as c:
            answer = c.get(f"{self.root}/__ds/subscriptions/{sid}")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def tail(self, path: str) -> str:
        with self.client() as c:
            return c.head(f"{self.root}/{path}").headers["stream-next-offset"]


def wait_for(check: Callable[[], Any], seconds: float = 15.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s")


@pytest.fixture(scope="module")
def deployment(own_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    data_dir = tmp_path_factory.mktemp("webhooks")
    port = free_port()
    log = data_dir / "receiver.jsonl"
    receiver = subprocess.Popen(
        [sys.executable, "-m", "tests.support.webhook_receiver", str(port), str(log)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    assert receiver.stdout is not None and receiver.stdout.readline() == b"receiving\n"
    server = ServerProcess(database_url=own_database, data_dir=data_dir, env=SERVER_ENV).start()
    worker = WorkerProcess(database_url=own_database, data_dir=data_dir, env=WORKER_ENV).start()
    deployed = Deployment(server, worker, Receiver(port, log, receiver), own_database, data_dir)
    yield deployed
    deployed.worker.stop()  # the one running now: a test may have replaced the first
    server.stop()
    receiver.kill()
    receiver.wait()


def woken_for(deployment: Deployment, name: str, path: str, seconds: float = 20) -> None:
    """Wait until a notification the receiver `name` got says `path` is pending."""
    wait_for(
        lambda: any(
            s["path"] == path and s["has_pending"]
            for e in deployment.receiver.entries(name)
            for s in body_of(e)["streams"]
        ),
        seconds,
    )


def body_of(entry: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(base64.b64decode(entry["body"]))
    return found


def verify(entry: dict[str, Any], jwks: dict[str, Any], raw: bytes | None = None) -> str:
    """The kid that signed `entry`; raises InvalidSignature when it does not verify."""
    header = entry["headers"]["webhook-signature"]
    fields = dict(part.split("=", 1) for part in header.split(","))
    key = next(k for k in jwks["keys"] if k["kid"] == fields["kid"])
    assert (key["kty"], key["crv"], key["alg"]) == ("OKP", "Ed25519", "EdDSA")
    public = Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(key["x"] + "=="))
    signature = base64.urlsafe_b64decode(fields["ed25519"] + "==")
    body = base64.b64decode(entry["body"]) if raw is None else raw
    public.verify(signature, fields["t"].encode() + b"." + body)
    assert abs(int(fields["t"]) - time.time()) < 300
    return fields["kid"]


def test_signatures_verify_against_the_public_jwks(deployment: Deployment) -> None:
    run = "sig-" + secrets.token_hex(3)
    sub = deployment.subscribe(deployment.receiver.url(run, done=1), f"{run}/*")
    deployment.write(f"{run}/a", {"n": 1})
    entry = wait_for(lambda: deployment.receiver.entries(run))[0]
    answer = httpx.get(sub["webhook"]["signing"]["jwks_url"], timeout=5)  # no token
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/jwk-set+json")
    jwks = answer.json()
    assert verify(entry, jwks) == sub["webhook"]["signing"]["kid"]
    with pytest.raises(InvalidSignature):
        verify(entry, jwks, raw=base64.b64decode(entry["body"]) + b" ")
    body = body_of(entry)
    assert body["subscription_id"] == sub["id"]
    assert [s["path"] for s in body["streams"]] == [f"{run}/a"]
    # Its offsets are the stream's, as a read states them (the incarnation too): a receiver
    # compares them with what it reads.
    assert body["streams"][0]["tail_offset"] == deployment.tail(f"{run}/a")
    assert not body["streams"][0]["tail_offset"].startswith("0" * 16)


def test_a_receiver_failing_five_times_then_succeeding_is_retried_with_backoff(
    deployment: Deployment,
) -> None:
    run = "flaky-" + secrets.token_hex(3)
    sub = deployment.subscribe(deployment.receiver.url(run, fail=5, done=1), f"{run}/*")
    deployment.write(f"{run}/a", {"n": 1})
    entries = wait_for(lambda: (e := deployment.receiver.entries(run)) and len(e) >= 6 and e, 30)
    time.sleep(0.5)
    entries = deployment.receiver.entries(run)
    assert len(entries) == 6  # five refusals, then the delivery: nothing after it
    wakes = {(body_of(e)["generation"], body_of(e)["wake_id"]) for e in entries}
    assert len(wakes) == 1  # every retry is the same wake
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(entries)]
    for attempt, gap in enumerate(gaps, start=1):  # 0.1, 0.2, 0.4, 0.8, 1.6 s, each +-20%
        assert gap >= RETRY_BASE * 2 ** (attempt - 1) * 0.8 - 0.02, gaps
    state = wait_for(
        lambda: (
            (s := deployment.subscription(sub["id"]))["streams"][0]["acked_offset"]
            == deployment.tail(f"{run}/a")
            and s
        )
    )
    assert state["status"] == "active"


def test_a_slow_receiver_does_not_hold_up_another(deployment: Deployment) -> None:
    slow, fast = "slow-" + secrets.token_hex(3), "fast-" + secrets.token_hex(3)
    deployment.subscribe(deployment.receiver.url(slow, delay=4, done=1), f"{slow}/*")
    deployment.subscribe(deployment.receiver.url(fast, done=1), f"{fast}/*")
    deployment.write(f"{slow}/a", {"n": 1})
    wait_for(lambda: deployment.receiver.entries(slow))
    deployment.write(f"{fast}/a", {"n": 1})
    fast_end = wait_for(lambda: deployment.receiver.entries(fast, "end"))[0]
    assert not deployment.receiver.entries(slow, "end")  # still held by the slow receiver
    slow_end = wait_for(lambda: deployment.receiver.entries(slow, "end"))[0]
    assert fast_end["at"] < slow_end["at"]


@pytest.mark.slow
def test_a_worker_killed_mid_delivery_is_taken_over_and_every_stream_acked_exactly(
    deployment: Deployment,
) -> None:
    run = "kill-" + secrets.token_hex(3)
    sub = deployment.subscribe(deployment.receiver.url(run, hang_first=20, done=1), f"{run}/*")
    paths = [f"{run}/s{i}" for i in range(3)]
    for path in paths:
        deployment.write(path, [{"n": 1}, {"n": 2}])
    first = wait_for(lambda: deployment.receiver.entries(run))[0]
    for path in paths:  # more records while the first wake is held
        deployment.write(path, {"n": 3}, create=False)
    deployment.worker.stop(signal.SIGKILL)
    deployment.worker = WorkerProcess(
        database_url=deployment.database_url, data_dir=deployment.data_dir, env=WORKER_ENV
    ).start()
    tails = {path: deployment.tail(path) for path in paths}

    def acked() -> bool:
        streams = deployment.subscription(sub["id"])["streams"]
        return {s["path"]: s["acked_offset"] for s in streams} == tails

    wait_for(acked, 30)
    entries = deployment.receiver.entries(run)
    again = body_of(entries[1])
    assert (again["generation"], again["wake_id"]) == (
        body_of(first)["generation"],
        body_of(first)["wake_id"],
    )  # the delivery was taken over, not a new wake
    generations = [body_of(e)["generation"] for e in entries]
    assert generations == sorted(generations)
    assert len(set(generations)) == len(generations) - 1  # one wake was sent twice, no other


def test_a_done_for_a_stream_erased_and_created_again_meanwhile_ends_the_wake(
    deployment: Deployment,
) -> None:
    """The receiver answers `{"done": true}` for a wake that named a stream's tail; meanwhile
    the stream was erased and created again, shorter. Its new records were never seen: they
    wake the subscription again, and the done is not refused (it was, and the delivery was
    retried forever while nothing else woke)."""
    run = "again-" + secrets.token_hex(3)
    sub = deployment.subscribe(deployment.receiver.url(run, hang_first=2, done=1), f"{run}/a")
    deployment.write(f"{run}/a", [{"n": n} for n in range(5)])
    first = wait_for(lambda: deployment.receiver.entries(run))[0]
    with deployment.client() as c:
        assert c.delete(f"{deployment.root}/{run}/a").status_code == 204
    deployment.write(f"{run}/a", [{"n": 1}, {"n": 2}])
    tail = deployment.tail(f"{run}/a")

    def acked_anew() -> bool:
        streams = deployment.subscription(sub["id"])["streams"]
        return [s["acked_offset"] for s in streams] == [tail]

    wait_for(acked_anew, 20)
    entries = deployment.receiver.entries(run)
    assert len(entries) == 2, entries  # the first wake, then one for the new stream
    assert body_of(entries[1])["generation"] > body_of(first)["generation"]
    assert deployment.subscription(sub["id"])["status"] == "active"


def test_a_pull_wake_failing_for_a_missing_wake_stream_is_active_once_delivered(
    deployment: Deployment,
) -> None:
    """Its status is `failed` while a retry is scheduled, and `active` again once a retry is
    delivered (it stayed `failed` for good)."""
    run = "pw-" + secrets.token_hex(3)
    sid = "sub-" + secrets.token_hex(4)
    deployment.write(f"{run}/e1", [])
    with deployment.client() as c:
        answer = c.put(
            f"{deployment.root}/__ds/subscriptions/{sid}",
            json={"type": "pull-wake", "streams": [f"{run}/e1"], "wake_stream": f"{run}/wake"},
        )
    assert answer.status_code == 201, answer.text
    deployment.write(f"{run}/e1", {"n": 1}, create=False)
    failed = wait_for(lambda: (s := deployment.subscription(sid))["status"] == "failed" and s, 20)
    # It says why, to whoever configures subscriptions (this token may).
    assert f"the wake stream '{run}/wake'" in failed["last_error"], failed
    deployment.write(f"{run}/wake", [])
    wait_for(lambda: deployment.subscription(sid)["status"] == "active", 30)
    assert "last_error" not in deployment.subscription(sid)
    with deployment.client() as c:
        woken = c.get(f"{deployment.root}/{run}/wake", params={"offset": "-1"})
    assert len(woken.json()) == 1, woken.text


def test_a_pull_wake_keeps_waking_past_the_wake_streams_unread_ceiling(
    deployment: Deployment,
) -> None:
    """No one acknowledges a wake stream (workers read it and claim): the service's wake events
    are not held back by its unread ceiling, which stopped every wake once it filled (here 2,
    by default 10,000 wakes)."""
    run = "pw-" + secrets.token_hex(3)
    sid = "sub-" + secrets.token_hex(4)
    native = deployment.server.base_url + "/api/workflow-streams"
    with deployment.client() as c:
        for name, limits in (("wake", {"max_unread_items": 2}), ("jobs", {})):
            made = c.post(
                f"{native}/runs/{run}/streams",
                json={"stream_id": name, "direction": "output", "limits": limits},
            )
            assert made.status_code == 201, made.text
        answer = c.put(
            f"{native}/subscriptions/{sid}",
            json={
                "type": "pull-wake",
                "streams": [{"run_id": run, "stream_id": "jobs"}],
                "wake_stream": {"run_id": run, "stream_id": "wake"},
            },
        )
        assert answer.status_code == 201, answer.text

        def wakes() -> int:
            head: int = c.get(f"{native}/runs/{run}/streams/wake").json()["state"]["head"]
            return head

        for n in range(1, 5):
            appended = c.post(
                f"{native}/runs/{run}/streams/jobs/records", json={"records": [{"data": n}]}
            )
            assert appended.status_code == 201, appended.text
            wait_for(lambda n=n: wakes() >= n, 20)  # type: ignore[misc]
            claim = c.post(f"{native}/subscriptions/{sid}/claim", json={"worker": "w"})
            assert claim.status_code == 200, claim.text
            claimed = claim.json()
            done = c.post(
                f"{native}/subscriptions/{sid}/ack",
                json={
                    "wake_id": claimed["wake_id"],
                    "generation": claimed["generation"],
                    "acks": [{"run_id": run, "stream_id": "jobs", "sequence": n}],
                    "done": True,
                },
                headers={"authorization": f"Bearer {claimed['token']}"},
            )
            assert done.status_code == 200, done.text
        assert deployment.subscription(sid)["status"] == "active"


def test_a_webhook_names_no_stream_its_creator_may_not_read(deployment: Deployment) -> None:
    """A pattern links every stream it matches, one whose pinned readers leave the
    subscription's creator out included: the receiver is told nothing of that one, and its
    appends wake nothing (it is acknowledged as it goes: no receiver could ever end a wake for
    it, and every `done` woke the subscription again at once)."""
    run = "pinned-" + secrets.token_hex(3)
    native = deployment.server.base_url + "/api/workflow-streams"
    with deployment.client() as c:
        for name, readers in (("secret", ["alice"]), ("open", ["*"])):
            made = c.post(
                f"{native}/runs/{run}/streams",
                json={
                    "stream_id": name,
                    "direction": "output",
                    "authorization": {"readers": readers},
                },
            )
            assert made.status_code == 201, made.text
    # The receiver ends each wake by its callback, with `done` and no acks (what it can say of
    # what it was shown: the open stream is not pending in the first one).
    deployment.subscribe(deployment.receiver.url(run, callback=1), f"{run}/*")

    def append(name: str) -> None:
        with deployment.client() as c:
            appended = c.post(
                f"{native}/runs/{run}/streams/{name}/records", json={"records": [{"data": 1}]}
            )
            assert appended.status_code == 201, appended.text

    append("secret")
    time.sleep(1.5)
    assert deployment.receiver.entries(run) == []  # nothing it may read changed
    append("open")
    woken_for(deployment, run, f"{run}/open")
    append("secret")
    time.sleep(1.5)
    entries = deployment.receiver.entries(run)
    assert len(entries) <= 2, len(entries)  # the wake for `open`, perhaps one repeat: no storm
    for entry in entries:
        assert "secret" not in json.dumps(body_of(entry)), body_of(entry)


def test_a_fork_a_pattern_links_wakes_its_subscription_when_it_is_made(
    deployment: Deployment,
) -> None:
    """A fork starts with its source's records and no append of its own: its creation marks
    its links pending (migration 0508) and is announced like an append, so the subscription
    wakes then, not at the scheduler's next look at every subscription. The fork is made here
    with no worker running, and its links must be marked all the same; the worker started
    after looks at every subscription once an hour, so a creation that was not announced would
    not wake it within the test."""
    deployment.worker.stop()
    try:
        run = "forked-" + secrets.token_hex(3)
        deployment.write(f"{run}/src", [1, 2])
        deployment.subscribe(deployment.receiver.url(run, done=1), f"{run}/*")
        with deployment.client() as c:
            forked = c.put(
                f"{deployment.root}/{run}/fork",
                headers={"Stream-Forked-From": f"/v1/stream/{run}/src"},
            )
        assert forked.status_code == 201, forked.text
        assert asyncio.run(marks_of(deployment.database_url, run)) == [("fork", 2)]
        deployment.worker = WorkerProcess(
            database_url=deployment.database_url,
            data_dir=deployment.data_dir,
            env={**WORKER_ENV, "DUCTOR_STREAMS_SUBSCRIPTION_SWEEP_SECONDS": "3600"},
        ).start()
        wait_for(
            lambda: any(
                s["path"] == f"{run}/fork" and s["has_pending"]
                for e in deployment.receiver.entries(run)
                for s in body_of(e)["streams"]
            ),
            20,
        )
    finally:
        deployment.worker.stop()
        deployment.worker = WorkerProcess(
            database_url=deployment.database_url, data_dir=deployment.data_dir, env=WORKER_ENV
        ).start()


async def marks_of(database_url: str, run_id: str) -> list[tuple[str, int]]:
    """The marks of pending links to streams of `run_id` (stream ID, head)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT stream_id, head FROM ds_subscription_pending WHERE run_id = $1"
            " ORDER BY stream_id",
            run_id,
        )
        return [(r[0], r[1]) for r in rows]
    finally:
        await conn.close()


async def creator_runs_of(database_url: str, subscription_id: str) -> list[str] | None:
    conn = await asyncpg.connect(database_url)
    try:
        runs: list[str] | None = await conn.fetchval(
            "SELECT creator_runs FROM ds_subscriptions WHERE subscription_id = $1",
            subscription_id,
        )
        return runs
    finally:
        await conn.close()


def test_a_run_scoped_creators_wakes_leave_out_a_fork_of_another_run(
    deployment: Deployment,
) -> None:
    """To a token restricted to a run, a fork there of another run's stream is not there (404
    on every route): a subscription it made neither shows the fork, nor tells its receiver of
    it, nor writes its wake events into it."""
    mine, other = "scoped-" + secrets.token_hex(3), "other-" + secrets.token_hex(3)
    deployment.write(f"{other}/src", [1, 2])
    deployment.write(f"{mine}/open", [])
    with deployment.client() as c:
        forked = c.put(
            f"{deployment.root}/{mine}/hidden",
            headers={"Stream-Forked-From": f"/v1/stream/{other}/src"},
        )
        assert forked.status_code == 201, forked.text
        minted = c.post(
            f"{deployment.server.base_url}/api/workflow-streams/tokens",
            json={
                "scopes": ["streams:read", "streams:write", "streams:admin"],
                "expires_in_seconds": 600,
                "runs": [mine],
            },
        )
        assert minted.status_code == 201, minted.text
    scoped = httpx.Client(headers={"authorization": f"Bearer {minted.json()['token']}"}, timeout=10)
    subs = f"{deployment.root}/__ds/subscriptions"
    hook, wake = "sub-" + secrets.token_hex(4), "sub-" + secrets.token_hex(4)
    with scoped:
        assert scoped.get(f"{deployment.root}/{mine}/hidden").status_code == 404
        made = scoped.put(
            f"{subs}/{hook}",
            json={
                "type": "webhook",
                "pattern": f"{mine}/*",
                "webhook": {"url": deployment.receiver.url(mine, callback=1)},
            },
        )
        assert made.status_code == 201, made.text
        # It names a stream not there yet: notifications list it, at nothing.
        named = scoped.post(f"{subs}/{hook}/streams", json={"streams": [f"{mine}/late"]})
        assert named.status_code == 204, named.text
        made = scoped.put(
            f"{subs}/{wake}",
            json={
                "type": "pull-wake",
                "streams": [f"{mine}/open"],
                "wake_stream": f"{mine}/hidden",
            },
        )
        assert made.status_code == 201, made.text
        # An unrestricted admin links another run's stream to it: not there for its creator
        # either (it must neither be told of it, nor stop waking).
        with deployment.client() as c:
            added = c.post(f"{subs}/{hook}/streams", json={"streams": [f"{other}/src"]})
        assert added.status_code == 204, added.text
        deployment.write(f"{other}/src", [3], create=False)
        # The creator's runs are kept in a column of their own, which a process that does not
        # know them (an earlier version's, during an upgrade) does not rewrite with the state.
        kept = asyncio.run(creator_runs_of(deployment.database_url, hook))
        assert kept == [mine]
        # The fork is linked by the pattern: its creator's token is not shown it.
        linked = {s["path"] for s in deployment.subscription(hook)["streams"]}
        assert {f"{mine}/hidden", f"{other}/src"} <= linked
        # Naming another run's stream now, the subscription is not there for the token either
        # (as another tenant's is not): it may no longer read, claim or delete it.
        assert scoped.get(f"{subs}/{hook}").status_code == 404
        assert scoped.delete(f"{subs}/{hook}").status_code == 404
        deployment.write(f"{mine}/hidden", {"n": 3}, create=False)
        time.sleep(1.5)
        assert deployment.receiver.entries(mine) == []  # nothing its creator sees changed
        deployment.write(f"{mine}/open", {"n": 1}, create=False)
        woken_for(deployment, mine, f"{mine}/open")
        # That stream is then made a fork of the other run's (by an admin) and appended to:
        # what was known of it (nothing there) is not taken for what it is now.
        with deployment.client() as c:
            late = c.put(
                f"{deployment.root}/{mine}/late",
                headers={"Stream-Forked-From": f"/v1/stream/{other}/src"},
            )
        assert late.status_code == 201, late.text
        deployment.write(f"{mine}/late", {"n": 4}, create=False)
        seen = len(deployment.receiver.entries(mine))
        deployment.write(f"{mine}/open", {"n": 2}, create=False)
        wait_for(lambda: len(deployment.receiver.entries(mine)) > seen)
        time.sleep(1)
        for entry in deployment.receiver.entries(mine):
            told = body_of(entry)
            assert "hidden" not in json.dumps(told) and other not in json.dumps(told), told
            for stream in told["streams"]:
                if stream["path"] == f"{mine}/late":  # listed as not there: nothing of it
                    assert not stream["has_pending"], told
        # The pull-wake's wake stream is not there for its creator: the wake fails as for one
        # that does not exist, and nothing is written into the fork.
        failed = wait_for(lambda: (s := deployment.subscription(wake))["status"] == "failed" and s)
        assert f"the wake stream '{mine}/hidden'" in failed["last_error"], failed
    with deployment.client() as c:
        read = c.get(f"{deployment.root}/{mine}/hidden", params={"offset": "-1"})
    assert read.json() == [1, 2, {"n": 3}], read.text


def test_a_wake_retried_after_its_stream_was_deleted_and_created_again_shows_the_old_one(
    deployment: Deployment,
) -> None:
    """A wake names a stream's first three records; its delivery fails and is retried while
    the stream is deleted and created again with seven. The retry still states the deleted
    stream's offsets (its incarnation, as decided), not the new stream's: read as the new
    stream's, they would skip its first records. Its `done` acknowledges nothing of the new
    stream, whose records are named by the next wake from its start."""
    run = "retried-" + secrets.token_hex(3)
    sub = deployment.subscribe(deployment.receiver.url(run, fail=5, done=1), f"{run}/*")
    deployment.write(f"{run}/a", [{"n": n} for n in range(3)])
    first = body_of(wait_for(lambda: deployment.receiver.entries(run))[0])
    old_tail = first["streams"][0]["tail_offset"]
    assert old_tail.endswith("_0000000000000003")
    with deployment.client() as c:
        assert c.delete(f"{deployment.root}/{run}/a").status_code == 204
    deployment.write(f"{run}/a", [{"n": n} for n in range(7)])
    new_tail = deployment.tail(f"{run}/a")
    assert new_tail[:16] != old_tail[:16]
    wait_for(lambda: deployment.subscription(sub["id"])["streams"][0]["acked_offset"] == new_tail)
    bodies = [body_of(e) for e in deployment.receiver.entries(run)]
    retries = [b for b in bodies if b["wake_id"] == first["wake_id"]]
    assert len(retries) == 6  # five refused, then delivered
    assert {b["streams"][0]["tail_offset"] for b in retries} == {old_tail}
    later = [b for b in bodies if b["generation"] > first["generation"]]
    assert later, bodies
    assert later[0]["streams"][0]["acked_offset"] == new_tail[:17] + "0" * 16
    assert later[0]["streams"][0]["tail_offset"] == new_tail


def test_a_wake_states_a_forks_inherited_positions_as_a_read_of_the_fork_does(
    deployment: Deployment,
) -> None:
    """A fork created where a pattern matches is linked from its start: its inherited records
    are pending. The wake states their offsets as a read of the fork does (its source's
    incarnation, the same text as the fork's HEAD), not with the fork's own: a receiver that
    reads until the wake's tail compares equal texts, in one order."""
    run = "fork-" + secrets.token_hex(3)
    deployment.write(f"{run}-src/s", [{"n": n} for n in range(3)])
    sub = deployment.subscribe(deployment.receiver.url(run, done=1), f"{run}/*")
    with deployment.client() as c:
        forked = c.put(
            f"{deployment.root}/{run}/f",
            headers={
                "content-type": "application/json",
                "Stream-Forked-From": f"/v1/stream/{run}-src/s",
            },
        )
    assert forked.status_code == 201, forked.text
    tail = deployment.tail(f"{run}/f")  # the fork point: the source's offset
    assert tail == forked.headers["stream-next-offset"]
    body = body_of(wait_for(lambda: deployment.receiver.entries(run))[0])
    [stream] = body["streams"]
    assert stream["tail_offset"] == tail
    assert stream["acked_offset"][:16] == tail[:16] and stream["acked_offset"] < tail
    assert "_stated_when_sent" not in body
    wait_for(lambda: deployment.subscription(sub["id"])["streams"][0]["acked_offset"] == tail)


def test_an_unclaimed_wake_whose_streams_were_all_deleted_is_not_claimed(
    deployment: Deployment,
) -> None:
    """A pull-wake named stream `a`, which was deleted before any worker claimed the wake. A
    claim finds nothing of it to hand over: 409 NO_PENDING_WORK (it answered 200 naming no
    stream, and the wake held up every later one until a worker ended it); the next records
    are claimed with a new wake."""
    run = "unclaimed-" + secrets.token_hex(3)
    name = "sub-" + secrets.token_hex(4)
    subs = f"{deployment.root}/__ds/subscriptions/{name}"
    deployment.write(f"{run}/wake", [])
    with deployment.client() as c:
        put = c.put(
            subs, json={"type": "pull-wake", "pattern": f"{run}/s*", "wake_stream": f"{run}/wake"}
        )
        assert put.status_code == 201, put.text
    deployment.write(f"{run}/sa", [{"n": 1}])
    native = f"{deployment.server.base_url}/api/workflow-streams/subscriptions/{name}"

    def woken() -> bool:
        with deployment.client() as c:
            return c.get(native).json()["wake"] is not None

    wait_for(woken)  # issued by the worker's scheduler, as it hears the append
    with deployment.client() as c:
        assert c.delete(f"{deployment.root}/{run}/sa").status_code == 204
        none = c.post(f"{subs}/claim", json={"worker": "w1"})
        assert none.status_code == 409, none.text
        assert none.json()["error"]["code"] == "NO_PENDING_WORK"
    with deployment.client() as c:
        assert c.get(native).json()["wake"] is None  # ended, and stored so
    deployment.write(f"{run}/sb", [{"n": 2}])
    wait_for(woken)  # the next records wake anew, with no claim to prompt it
    with deployment.client() as c:
        assert c.get(native).json()["wake"]["generation"] == 2
        claim = c.post(f"{subs}/claim", json={"worker": "w1"})
        assert claim.status_code == 200, claim.text
        assert [s["path"] for s in claim.json()["streams"]] == [f"{run}/sb"]
