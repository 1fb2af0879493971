"""Durable Streams writers and forks end to end: idempotent producers, Stream-Seq, append and
close, forks and soft delete, through the protocol and seen through the native API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import httpx

from domain.definition import MAX_COMMAND_RECORDS
from tests.integration.test_durable_streams import ds  # noqa: F401  (a fixture)
from tests.integration.test_http_records import assert_problem
from tests.support.offsets import At

TEXT = {"Content-Type": "text/plain"}


def producer(epoch: int, seq: int, name: str = "p") -> dict[str, str]:
    return {"Producer-Id": name, "Producer-Epoch": str(epoch), "Producer-Seq": str(seq)}


async def test_an_idempotent_producer_appends_each_batch_once(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    run_id: str,
) -> None:
    url = f"/{run_id}/produced"
    assert (await ds.put(url, headers=TEXT)).status_code == 201
    first = await ds.post(url, content=b"a", headers={**TEXT, **producer(0, 0)})
    assert first.status_code == 200, first.text
    assert (first.headers["producer-epoch"], first.headers["producer-seq"]) == ("0", "0")
    retry = await ds.post(url, content=b"a", headers={**TEXT, **producer(0, 0)})
    assert retry.status_code == 204 and retry.headers["producer-seq"] == "0"
    gap = await ds.post(url, content=b"c", headers={**TEXT, **producer(0, 2)})
    assert_problem(gap, 409, "producer-sequence-gap")
    assert (gap.headers["producer-expected-seq"], gap.headers["producer-received-seq"]) == (
        "1",
        "2",
    )
    assert (await ds.post(url, content=b"b", headers={**TEXT, **producer(1, 0)})).status_code == 200
    stale = await ds.post(url, content=b"z", headers={**TEXT, **producer(0, 1)})
    assert_problem(stale, 403, "producer-epoch-stale")
    assert stale.headers["producer-epoch"] == "1"
    assert_problem(
        await ds.post(url, content=b"z", headers={**TEXT, **producer(2, 5)}), 400, "invalid-input"
    )
    assert (await ds.get(url)).content == b"ab"
    native = (await api.get(f"/runs/{run_id}/streams/produced")).json()
    assert native["state"]["head"] == 2


async def test_stream_seq_is_per_stream_and_byte_wise(
    ds: httpx.AsyncClient,  # noqa: F811
    run_id: str,
) -> None:
    url = f"/{run_id}/seq"
    assert (await ds.put(url, headers=TEXT)).status_code == 201
    assert (
        await ds.post(url, content=b"1", headers={**TEXT, "Stream-Seq": "09"})
    ).status_code == 204
    assert (
        await ds.post(url, content=b"2", headers={**TEXT, "Stream-Seq": "10"})
    ).status_code == 204
    regression = await ds.post(url, content=b"3", headers={**TEXT, "Stream-Seq": "9"})  # "9" > "10"
    assert regression.status_code == 204
    refused = await ds.post(url, content=b"4", headers={**TEXT, "Stream-Seq": "10"})
    assert_problem(refused, 409, "stream-seq-regression")
    assert (await ds.get(url)).content == b"123"


async def test_a_producer_sees_native_backpressure_as_429(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    run_id: str,
) -> None:
    created = await api.post(
        f"/runs/{run_id}/streams",
        json={"stream_id": "tight", "direction": "output", "limits": {"max_unread_items": 1}},
    )
    assert created.status_code == 201
    json_type = {"Content-Type": "application/json"}
    ok = await ds.post(f"/{run_id}/tight", content=b"1", headers={**json_type, **producer(0, 0)})
    assert ok.status_code == 200, ok.text
    refused = await ds.post(
        f"/{run_id}/tight", content=b"2", headers={**json_type, **producer(0, 1)}
    )
    assert_problem(refused, 429, "backpressure")
    assert int(refused.headers["retry-after"]) >= 1
    await api.post(f"/runs/{run_id}/streams/tight/consumers/c/ack", json={"sequence": 1})
    retried = await ds.post(
        f"/{run_id}/tight", content=b"2", headers={**json_type, **producer(0, 1)}
    )
    assert retried.status_code == 200, retried.text  # the refused batch was not applied


async def test_create_closed_with_a_body_and_append_and_close(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    run_id: str,
) -> None:
    done = await ds.put(
        f"/{run_id}/done", content=b"all", headers={**TEXT, "Stream-Closed": "true"}
    )
    assert done.status_code == 201 and done.headers["stream-closed"] == "true"
    assert (await api.get(f"/runs/{run_id}/streams/done")).json()["state"]["closed"] is True
    assert_problem(await ds.put(f"/{run_id}/done", headers=TEXT), 409, "definition-conflict")
    again = await ds.put(f"/{run_id}/done", headers={**TEXT, "Stream-Closed": "TRUE"})
    assert again.status_code == 200
    assert (await ds.put(f"/{run_id}/last", headers=TEXT)).status_code == 201
    final = await ds.post(
        f"/{run_id}/last", content=b"bye", headers={**TEXT, "Stream-Closed": "true"}
    )
    assert final.status_code == 204 and final.headers["stream-closed"] == "true"
    read = await ds.get(f"/{run_id}/last")
    assert (read.content, read.headers["stream-closed"]) == (b"bye", "true")


async def test_a_fork_reads_its_source_prefix_and_a_deleted_source_is_gone(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    run_id: str,
) -> None:
    source = f"/{run_id}/source"
    created = await ds.put(source, content=b"abc", headers=TEXT)
    assert created.status_code == 201
    source_offset = created.headers["stream-next-offset"]
    forked = await ds.put(
        f"/{run_id}/fork",
        headers={"Stream-Forked-From": f"/v1/stream{source}", "Stream-TTL": "3600"},
    )
    assert forked.status_code == 201, forked.text
    assert forked.headers["content-type"] == "text/plain"
    # The fork point is the source's offset, the same text (one record: "abc").
    assert forked.headers["stream-next-offset"] == source_offset == At(1)
    # Natively, the document says what the fork inherits; its state counts its own records.
    document = (await api.get(f"/runs/{run_id}/streams/fork")).json()
    assert document["content_type"] == "text/plain"
    assert {k: document["fork"][k] for k in ("run_id", "stream_id", "through")} == {
        "run_id": run_id,
        "stream_id": "source",
        "through": 1,
    }
    assert (document["state"]["head"], document["state"]["total_items"]) == (1, 0)
    native = (await api.get(f"/runs/{run_id}/streams/source")).json()
    assert "fork" not in native and native["content_type"] == "text/plain"
    at_the_fork_point = await ds.get(f"/{run_id}/fork", params={"offset": source_offset})
    assert (at_the_fork_point.status_code, at_the_fork_point.content) == (200, b"")
    assert at_the_fork_point.headers["stream-up-to-date"] == "true"
    assert (await ds.post(source, content=b"-src", headers=TEXT)).status_code == 204
    assert (await ds.post(f"/{run_id}/fork", content=b"-fork", headers=TEXT)).status_code == 204
    assert (await ds.get(f"/{run_id}/fork")).content == b"abc-fork"
    assert (await ds.head(f"/{run_id}/fork")).headers["stream-ttl"] == "3600"
    assert (await ds.delete(source)).status_code == 204
    assert_problem(await ds.get(source), 410, "stream-gone")
    assert_problem(await api.get(f"/runs/{run_id}/streams/source/records"), 410, "stream-gone")
    assert_problem(await ds.put(source, headers=TEXT), 409, None)
    assert (await ds.get(f"/{run_id}/fork")).content == b"abc-fork"
    assert (await ds.delete(f"/{run_id}/fork")).status_code == 204
    missing = await ds.put(
        f"/{run_id}/fork2", headers={"Stream-Forked-From": f"/v1/stream/{run_id}/nothing"}
    )
    assert_problem(missing, 404, "not-found")


async def test_a_fork_names_a_source_path_on_this_server_and_an_offset_it_issued(
    ds: httpx.AsyncClient,  # noqa: F811
    run_id: str,
) -> None:
    source = f"/{run_id}/b1"
    assert (await ds.put(source, content=b"abc", headers=TEXT)).status_code == 201
    refused = [
        ({"Stream-Forked-From": f"http://evil.example/api/durable-streams/v1/stream{source}"}),
        ({"Stream-Forked-From": f"/api/durable-streams/v1/stream{source}"}),
        ({"Stream-Forked-From": f"/v1/stream/{run_id}/../b1"}),
        ({"Stream-Forked-From": f"/v1/stream/{run_id}%2Fb1"}),
        ({"Stream-Forked-From": f"/v1/stream{source}", "Stream-Fork-Offset": "now"}),
    ]
    for headers in refused:
        answer = await ds.put(f"/{run_id}/fk", headers=headers)
        assert_problem(answer, 400, "invalid-input")
        assert_problem(await ds.get(f"/{run_id}/fk"), 404, "not-found")  # nothing created
    start = await ds.put(
        f"/{run_id}/fk",
        headers={"Stream-Forked-From": f"/v1/stream{source}", "Stream-Fork-Offset": "-1"},
    )
    assert start.status_code == 201, start.text
    assert start.headers["stream-next-offset"] == At(0)  # forked at the start: nothing
    assert (await ds.get(f"/{run_id}/fk")).content == b""


JSON_TYPE = {"Content-Type": "application/json"}
LIMITS_MIGRATION = (
    Path(__file__).resolve().parents[2] / "migrations" / "0502_protocol_stream_limits.sql"
)


async def test_a_protocol_stream_takes_appends_past_the_native_unread_ceiling(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    run_id: str,
) -> None:
    """The protocol has no way to acknowledge: a stream it creates has no unread ceiling (the
    native default, 10,000 records, made every append 429 for good once it held that many),
    and one request may carry far more than a native append's 1,000 messages."""
    url = f"/{run_id}/unbounded"
    assert (await ds.put(url, headers=JSON_TYPE)).status_code == 201
    batch = json.dumps(list(range(6_000))).encode()
    for _ in range(2):  # 12,000 records, with no consumer
        appended = await ds.post(url, content=batch, headers=JSON_TYPE)
        assert appended.status_code == 204, appended.text
    assert (await ds.post(url, content=b'"one more"', headers=JSON_TYPE)).status_code == 204
    native = (await api.get(f"/runs/{run_id}/streams/unbounded")).json()
    assert native["state"]["head"] == 12_001
    assert native["limits"]["max_unread_items"] == 2**53 - 1
    assert native["limits"]["max_unread_bytes"] == 2**53 - 1
    # A request past the most one append takes is 413, and changes nothing.
    too_many = json.dumps([0] * (MAX_COMMAND_RECORDS + 1)).encode()
    refused = await ds.post(url, content=too_many, headers=JSON_TYPE)
    assert_problem(refused, 413, "request-too-large")
    assert (await api.get(f"/runs/{run_id}/streams/unbounded")).json()["state"]["head"] == 12_001


async def test_a_large_append_commits_whole_and_in_order_beside_small_ones(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    run_id: str,
) -> None:
    """A request of 12,345 messages goes to PostgreSQL in several COPY pieces and commits in
    a transaction of its own beside the others' batches (application/group_commit.py): its
    messages are stored whole, in order and together, and the small appends made to the same
    stream meanwhile are each there once, before or after them. (That other streams do not
    wait for it is shown in tests/unit/test_group_commit.py and measured by
    bench/large_append.py.)"""
    big, other = f"/{run_id}/big", f"/{run_id}/other"
    for url in (big, other):
        assert (await ds.put(url, headers=JSON_TYPE)).status_code == 201
    batch = json.dumps([{"n": n} for n in range(12_345)]).encode()

    async def small(url: str, n: int) -> None:
        appended = await ds.post(url, content=json.dumps({"small": n}).encode(), headers=JSON_TYPE)
        assert appended.status_code == 204, appended.text

    large = asyncio.ensure_future(ds.post(big, content=batch, headers=JSON_TYPE))
    await asyncio.sleep(0.05)  # the large one is being prepared or committed
    await asyncio.gather(*(small(big, n) for n in range(10)), *(small(other, n) for n in range(10)))
    assert (await large).status_code == 204, (await large).text
    records = []
    cursor = 0
    while True:
        page = (
            await api.get(
                f"/runs/{run_id}/streams/big/records", params={"cursor": cursor, "limit": 1000}
            )
        ).json()
        records += page["records"]
        if not page["records"]:
            break
        cursor = page["records"][-1]["sequence"]
    assert [r["sequence"] for r in records] == list(range(1, len(records) + 1))
    datas = [r["data"] for r in records]
    assert len(datas) == 12_355
    start = datas.index({"n": 0})
    assert datas[start : start + 12_345] == [{"n": n} for n in range(12_345)]
    smalls = [d["small"] for d in datas if "small" in d]
    assert sorted(smalls) == list(range(10))


async def test_the_migration_lifts_the_old_default_ceiling_of_protocol_streams(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    pool: asyncpg.Pool,
    run_id: str,
) -> None:
    for name in ("old", "chosen"):
        assert (await ds.put(f"/{run_id}/{name}", headers=JSON_TYPE)).status_code == 201
    created = await api.post(
        f"/runs/{run_id}/streams", json={"stream_id": "native", "direction": "output"}
    )
    assert created.status_code == 201

    async def set_limits(name: str, items: int, size: int) -> None:
        await pool.execute(
            """UPDATE streams SET definition = convert_to(jsonb_set(jsonb_set(
                   convert_from(definition, 'UTF8')::jsonb, '{limits,max_unread_items}', $3),
                   '{limits,max_unread_bytes}', $4)::text, 'UTF8')
               WHERE run_id = $1 AND stream_id = $2""",
            run_id,
            name,
            str(items),
            str(size),
        )

    async def limits(name: str) -> tuple[int, int]:
        stored = await pool.fetchval(
            "SELECT definition FROM streams WHERE run_id = $1 AND stream_id = $2", run_id, name
        )
        found = json.loads(stored)["limits"]
        return found["max_unread_items"], found["max_unread_bytes"]

    await set_limits("old", 10_000, 67_108_864)  # as a protocol stream was created before
    await set_limits("chosen", 5, 100)
    await pool.execute(LIMITS_MIGRATION.read_text())
    await pool.execute(LIMITS_MIGRATION.read_text())  # and again: nothing more to do
    assert await limits("old") == (2**53 - 1, 2**53 - 1)
    assert await limits("chosen") == (5, 100)  # a ceiling someone chose is kept
    assert await limits("native") == (10_000, 67_108_864)  # a native stream keeps its own


async def test_a_put_again_with_other_media_type_parameters_is_the_same_stream(
    ds: httpx.AsyncClient,  # noqa: F811
    run_id: str,
) -> None:
    url = f"/{run_id}/charset"
    created = await ds.put(url, headers={"Content-Type": "text/plain; charset=utf-8"})
    assert created.status_code == 201
    again = await ds.put(url, headers={"Content-Type": "text/plain"})
    assert again.status_code == 200, again.text
    assert again.headers["Content-Type"] == "text/plain; charset=utf-8"  # as it is
    other = await ds.put(url, headers={"Content-Type": "text/html"})
    assert_problem(other, 409, "definition-conflict")
    closed = await ds.put(url, headers={"Content-Type": "text/plain", "Stream-Closed": "true"})
    assert_problem(closed, 409, "definition-conflict")  # its closure still differs


async def test_json_with_a_byte_order_mark_is_taken_and_a_lone_surrogate_is_explained(
    ds: httpx.AsyncClient,  # noqa: F811
    run_id: str,
) -> None:
    url = f"/{run_id}/bom"
    assert (await ds.put(url, headers=JSON_TYPE)).status_code == 201
    taken = await ds.post(url, content=b'\xef\xbb\xbf{"a":1}', headers=JSON_TYPE)
    assert taken.status_code == 204, taken.text
    lone = await ds.post(url, content=b'{"u":"\\ud800"}', headers=JSON_TYPE)
    assert "surrogate pair" in assert_problem(lone, 400, "invalid-input")["detail"]
    blank = await ds.post(url, content=b"  \n ", headers=JSON_TYPE)
    assert "only whitespace" in assert_problem(blank, 400, "invalid-input")["detail"]
    big = await ds.post(url, content=json.dumps({"x": "a" * 70_000}).encode(), headers=JSON_TYPE)
    problem = assert_problem(big, 413, "record-too-large")
    assert "message 0" in problem["detail"] and "object" not in problem["detail"]
    assert (await ds.get(url)).json() == [{"a": 1}]


async def test_a_fork_of_a_fork_states_each_position_s_minting_stream(
    ds: httpx.AsyncClient,  # noqa: F811
    run_id: str,
) -> None:
    """Root `r` (records 1-2), fork `a` of it at 2 (then its own 3-4), fork `b` of `a` at 3
    (then its own 4). Each position of `b` carries the incarnation of the stream that minted
    it, the same text a read of that stream gives, and every level's offsets read `b` from
    where they say; its own are its own, after all the inherited ones."""
    root, a, b = f"/{run_id}/r", f"/{run_id}/a", f"/{run_id}/b"
    made = await ds.put(root, content=b"1", headers=TEXT)
    assert (await ds.post(root, content=b"2", headers=TEXT)).status_code == 204
    root_2 = (await ds.head(root)).headers["stream-next-offset"]
    assert root_2 == At(2, of=made.headers["stream-next-offset"])
    forked_a = await ds.put(a, headers={**TEXT, "Stream-Forked-From": f"/v1/stream{root}"})
    assert forked_a.headers["stream-next-offset"] == root_2  # the fork point: the root's
    a_3 = (await ds.post(a, content=b"3", headers=TEXT)).headers["stream-next-offset"]
    a_4 = (await ds.post(a, content=b"4", headers=TEXT)).headers["stream-next-offset"]
    assert a_4 == At(4, of=a_3) and a_3[:16] != root_2[:16] and a_3 > root_2
    forked_b = await ds.put(
        b, headers={**TEXT, "Stream-Forked-From": f"/v1/stream{a}", "Stream-Fork-Offset": a_3}
    )
    assert forked_b.status_code == 201, forked_b.text
    assert forked_b.headers["stream-next-offset"] == a_3
    b_4 = (await ds.post(b, content=b"x", headers=TEXT)).headers["stream-next-offset"]
    assert b_4 == At(4) and len({b_4[:16], a_4[:16], root_2[:16]}) == 3 and b_4 > a_3
    # Read from each level's offsets, b answers from the position they name.
    assert (await ds.get(b)).content == b"123x"
    assert (await ds.get(b, params={"offset": made.headers["stream-next-offset"]})).content == (
        b"23x"
    )
    assert (await ds.get(b, params={"offset": root_2})).content == b"3x"
    assert (await ds.get(b, params={"offset": a_3})).content == b"x"
    # A HEAD of a fork with nothing of its own states the minting source's offset.
    empty = await ds.put(
        f"/{run_id}/c",
        headers={**TEXT, "Stream-Forked-From": f"/v1/stream{a}", "Stream-Fork-Offset": a_3},
    )
    assert empty.status_code == 201
    assert (await ds.head(f"/{run_id}/c")).headers["stream-next-offset"] == a_3
    # The source's own record past the fork point is not b's: its offset reads b from the start.
    assert (await ds.get(b, params={"offset": a_4})).content == b"123x"


async def test_a_sub_offset_counts_the_bytes_a_read_answers_for_an_object_record(
    ds: httpx.AsyncClient,  # noqa: F811
    api: httpx.AsyncClient,
    run_id: str,
) -> None:
    """A text stream holds a record `ab`, an object (committed through the native API: a read
    answers its descriptor, not its body) and a record `cd`. `Stream-Fork-Sub-Offset` counts
    the bytes a read of the stream answers, the descriptor's included: a fork at the first
    byte of `cd` inherits the object whole and nothing of `cd`."""
    from tests.integration.test_http_head import committed_object

    url = f"/{run_id}/mixed"
    made = await ds.put(url, content=b"ab", headers=TEXT)
    assert made.status_code == 201
    await committed_object(api, f"/runs/{run_id}/streams/mixed", b"a body of 26 bytes, or so")
    assert (await ds.post(url, content=b"cd", headers=TEXT)).status_code == 204
    read = (await ds.get(url)).content
    assert read.startswith(b"ab") and read.endswith(b"cd") and len(read) > 4
    shown = len(read) - 2  # "ab" and the object as a read answers it
    forked = await ds.put(
        f"/{run_id}/mixed-fork",
        headers={
            **TEXT,
            "Stream-Forked-From": f"/v1/stream{url}",
            "Stream-Fork-Offset": "-1",
            "Stream-Fork-Sub-Offset": str(shown + 1),
        },
    )
    assert forked.status_code == 201, forked.text
    assert (await ds.get(f"/{run_id}/mixed-fork")).content == read[: shown + 1]
