"""Webhook POSTs that connect only where the URL rules allow (domain.webhook_urls).

The name is resolved here, every address it resolves to is checked, and the connection is made
to a checked address; the address the socket is then connected to is checked again. Redirects
are never followed (httpcore does not follow them), the answer's body is read up to
`max_body` bytes, the whole exchange is bounded by `timeout`, and connections are not kept
alive, so every delivery checks afresh."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpcore

from application.subscriptions import WebhookAnswer
from domain.subscriptions import WebhookUrlRejected
from domain.webhook_urls import IPAddress, WebhookTarget, check_target_address, check_url

Resolve = Callable[[str, int], Awaitable[list[IPAddress]]]


async def system_resolve(host: str, port: int) -> list[IPAddress]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in found:
            found.append(address)
    return found


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, target: WebhookTarget, resolve: Resolve) -> None:
        self._inner = httpcore.AnyIOBackend()
        self._target = target
        self._resolve = resolve

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._resolve(self._target.host, port)
        if not addresses:
            raise WebhookUrlRejected(f"{self._target.host} resolves to no address")
        for address in addresses:  # one refused address refuses the name (no DNS games)
            check_target_address(self._target, address)
        stream = await self._inner.connect_tcp(
            str(addresses[0]), port, timeout=timeout, socket_options=socket_options
        )
        peer = stream.get_extra_info("socket")
        connected = peer.getpeername()[0] if peer is not None else None
        if connected is None:
            await stream.aclose()
            raise WebhookUrlRejected("the connected address is unknown")
        try:
            check_target_address(self._target, ipaddress.ip_address(connected.split("%")[0]))
        except WebhookUrlRejected:
            await stream.aclose()
            raise
        return stream

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class HttpWebhookSender:
    def __init__(
        self,
        allowed_hosts: frozenset[str] = frozenset(),
        timeout: float = 10.0,
        max_body: int = 64 * 1024,
        resolve: Resolve = system_resolve,
        loopback: bool = False,
    ) -> None:
        self._allowed = allowed_hosts
        self._loopback = loopback
        self._timeout = timeout
        self._max_body = max_body
        self._resolve = resolve
        self._ssl = ssl.create_default_context()

    def check(self, url: str) -> None:
        check_url(url, self._allowed, loopback=self._loopback)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> WebhookAnswer:
        target = check_url(url, self._allowed, loopback=self._loopback)
        pool = httpcore.AsyncConnectionPool(
            ssl_context=self._ssl,
            max_keepalive_connections=0,
            network_backend=_CheckedBackend(target, self._resolve),
        )
        t = self._timeout
        try:
            async with (
                asyncio.timeout(t),
                pool,
                pool.stream(
                    "POST",
                    url,
                    headers=[*headers.items(), ("content-length", str(len(body)))],
                    content=body,
                    extensions={"timeout": {"connect": t, "read": t, "write": t, "pool": t}},
                ) as response,
            ):
                read = b""
                async for chunk in response.aiter_stream():
                    read += chunk
                    if len(read) >= self._max_body:
                        read = read[: self._max_body]
                        break
                return WebhookAnswer(response.status, read)
        except httpcore.TimeoutException as error:
            raise TimeoutError(f"webhook timed out: {error}") from None
        except (
            httpcore.NetworkError,
            httpcore.ProtocolError,
            httpcore.UnsupportedProtocol,
        ) as error:
            raise OSError(f"webhook unreachable: {type(error).__name__}: {error}") from None
