"""The webhook sender (adapters/webhooks.py): at every delivery, every address a name resolves
to (here: names resolved by the test itself) is checked before any connection is made, and the
address connected to after. Nothing here sends traffic off the machine: refused addresses are
never connected to, and the deliveries that are made go to receivers on loopback."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import httpcore
import pytest

from adapters.webhooks import HttpWebhookSender
from domain.subscriptions import WebhookUrlRejected
from domain.webhook_urls import IPAddress


class Names:
    """The test's own DNS: each name's addresses, and which names were looked up."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.looked_up: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.looked_up.append(host)
        return [ipaddress.ip_address(a) for a in self.table[host]]


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every TCP connection the sender opens."""
    made: list[tuple[str, int]] = []
    real = httpcore.AnyIOBackend.connect_tcp

    async def connect_tcp(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        made.append((host, port))
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_tcp)
    return made


@pytest.mark.parametrize(
    ("name", "addresses"),
    [
        ("private.test", ["10.1.2.3"]),
        ("metadata.test", ["169.254.169.254"]),
        ("linklocal.test", ["fe80::5"]),
        ("multicast.test", ["239.1.1.1"]),
        ("zero.test", ["0.0.0.0"]),
        ("mapped.test", ["::ffff:192.168.0.1"]),
        ("loopback.test", ["127.0.0.1"]),  # a public name must not lead to loopback
        ("mixed.test", ["8.8.8.8", "10.0.0.7"]),  # one refused address refuses the name
    ],
)
async def test_a_name_that_resolves_to_a_refused_address_is_never_connected_to(
    name: str, addresses: list[str], connects: list[tuple[str, int]]
) -> None:
    names = Names({name: addresses})
    sender = HttpWebhookSender(resolve=names, timeout=2, loopback=True)
    sender.check(f"https://{name}/hook")  # the name alone passes when it is stored
    with pytest.raises(WebhookUrlRejected):
        await sender.post(f"https://{name}/hook", b"{}", {})
    assert names.looked_up == [name]
    assert connects == []


async def test_a_loopback_name_that_resolves_elsewhere_is_refused(
    connects: list[tuple[str, int]],
) -> None:
    sender = HttpWebhookSender(resolve=Names({"localhost": ["10.0.0.1"]}), timeout=2, loopback=True)
    with pytest.raises(WebhookUrlRejected):
        await sender.post("http://localhost:9/hook", b"{}", {})
    assert connects == []


async def test_the_check_is_made_again_at_every_delivery(connects: list[tuple[str, int]]) -> None:
    """DNS rebinding: a name that led to loopback's receiver now leads to a private address."""
    received: list[bytes] = []

    async def receiver(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(
            b"HTTP/1.1 302 Found\r\nlocation: http://10.0.0.1/\r\ncontent-length: 0\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(receiver, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    names = Names({"hooks.internal": ["127.0.0.1"]})
    sender = HttpWebhookSender(frozenset({"hooks.internal"}), resolve=names, timeout=2)
    try:
        answer = await sender.post(f"http://hooks.internal:{port}/x", b"{}", {})
        assert answer.status == 302  # redirects are not followed
        assert len(received) == 1 and connects == [("127.0.0.1", port)]
        # The operator takes the host off the list: the same URL is refused at once.
        strict = HttpWebhookSender(resolve=Names({"hooks.internal": ["10.0.0.1"]}), timeout=2)
        with pytest.raises(WebhookUrlRejected):
            await strict.post(f"http://hooks.internal:{port}/x", b"{}", {})
        assert len(connects) == 1
    finally:
        server.close()
        await server.wait_closed()


async def test_a_large_answer_is_read_only_up_to_the_limit() -> None:
    async def receiver(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10000000\r\n\r\n" + b"x" * 200_000)
        await writer.drain()
        await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(receiver, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        sender = HttpWebhookSender(max_body=1024, timeout=2, loopback=True)
        answer = await sender.post(f"http://127.0.0.1:{port}/x", b"{}", {})
        assert answer.status == 200 and len(answer.body) == 1024
    finally:
        server.close()


async def test_a_receiver_that_never_answers_times_out() -> None:
    async def receiver(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    server = await asyncio.start_server(receiver, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        sender = HttpWebhookSender(timeout=0.3, loopback=True)
        with pytest.raises(TimeoutError):
            await sender.post(f"http://127.0.0.1:{port}/x", b"{}", {})
    finally:
        server.close()
