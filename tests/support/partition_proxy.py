"""A TCP proxy on 127.0.0.1 in front of PostgreSQL that can make chosen connections go silent.

A silenced ("frozen") connection stays open at both ends, but nothing is forwarded either way:
no RST, no FIN, exactly what a network path that starts dropping packets looks like to both
sides. Healing forwards again whatever was held (as TCP would retransmit it). New connections
can be frozen too (accepted, and then silent). The proxy runs its own event loop in a thread,
so it keeps forwarding while a test blocks, and server processes (which connect to it by URL)
see a plain PostgreSQL on a TCP port.

The upstream is a PostgreSQL URL: a TCP host and port, or a Unix socket directory given as
`?host=/dir` (the embedded test server listens on a Unix socket only)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

CHUNK = 65536


@dataclass
class ProxiedConnection:
    number: int
    flowing: asyncio.Event
    application_name: str = ""
    listening: bool = False  # the client issued LISTEN on it
    closed: bool = False
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def frozen(self) -> bool:
        return not self.flowing.is_set()


def _application_name(startup: bytes) -> str:
    # In the startup message (after an SSLRequest, maybe): NUL-separated name/value pairs.
    _, _, rest = startup.partition(b"application_name\x00")
    return rest.split(b"\x00", 1)[0].decode(errors="replace")


class PartitionProxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        query = parse_qs(parts.query)
        self._upstream_parts = parts
        self._query = {k: v for k, v in query.items() if k != "host"}
        self._socket: str | None = None
        if "host" in query and query["host"][0].startswith("/"):
            port = parts.port or 5432
            self._socket = f"{query['host'][0]}/.s.PGSQL.{port}"
            self._tcp = None
        else:
            self._tcp = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.connections: list[ProxiedConnection] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self._freeze_new = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    # --- from the test's side (any thread) ------------------------------------------------

    def __enter__(self) -> PartitionProxy:
        self._thread.start()
        self._call(self._start()).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._close()).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def url(self, database_url: str | None = None) -> str:
        """`database_url` (default: the upstream's) reached through this proxy."""
        parts = urlsplit(database_url) if database_url else self._upstream_parts
        user = parts.username or "postgres"
        password = f":{parts.password}" if parts.password else ""
        query = {k: v for k, v in parse_qs(parts.query).items() if k != "host"}
        return urlunsplit(
            (
                "postgresql",
                f"{user}{password}@127.0.0.1:{self.port}",
                parts.path,
                urlencode(query, doseq=True),
                "",
            )
        )

    def freeze(self, which: Callable[[ProxiedConnection], bool]) -> list[ProxiedConnection]:
        """Silence the open connections `which` chooses; returns them."""
        return self._call(self._set(which, flowing=False)).result(10)

    def freeze_listen(self) -> list[ProxiedConnection]:
        """Silence the connections that issued LISTEN (a process's wake bus)."""
        return self.freeze(lambda c: c.listening)

    def freeze_all(self, *, new_too: bool = True) -> list[ProxiedConnection]:
        """Silence every open connection and (by default) every new one: a partition."""
        self._freeze_new = new_too
        return self.freeze(lambda c: True)

    def heal(self) -> None:
        """Forward again on every connection, and let new ones through."""
        self._freeze_new = False
        self._call(self._set(lambda c: True, flowing=True)).result(10)

    def open_connections(self) -> list[ProxiedConnection]:
        return [c for c in self.connections if not c.closed]

    def _call(self, coroutine):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # --- on the proxy's loop -------------------------------------------------------------

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in self.connections:
            connection.flowing.set()
            for writer in connection.writers:
                writer.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _set(
        self, which: Callable[[ProxiedConnection], bool], *, flowing: bool
    ) -> list[ProxiedConnection]:
        chosen = [c for c in self.connections if not c.closed and which(c)]
        for connection in chosen:
            if flowing:
                connection.flowing.set()
            else:
                connection.flowing.clear()
        return chosen

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        connection = ProxiedConnection(len(self.connections) + 1, asyncio.Event())
        if not self._freeze_new:
            connection.flowing.set()
        self.connections.append(connection)
        try:
            if self._socket is not None:
                server_r, server_w = await asyncio.open_unix_connection(self._socket)
            else:
                assert self._tcp is not None
                server_r, server_w = await asyncio.open_connection(*self._tcp)
        except OSError:
            connection.closed = True
            client_w.close()
            return
        connection.writers = [client_w, server_w]
        with contextlib.suppress(asyncio.CancelledError):  # the proxy closing
            await asyncio.gather(
                self._pump(connection, client_r, server_w, from_client=True),
                self._pump(connection, server_r, client_w, from_client=False),
                return_exceptions=True,
            )
        connection.closed = True
        for writer in (client_w, server_w):
            writer.close()

    async def _pump(
        self,
        connection: ProxiedConnection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        from_client: bool,
    ) -> None:
        try:
            while True:
                await connection.flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                if from_client and not connection.application_name:
                    connection.application_name = _application_name(data)
                if from_client and b"LISTEN " in data:
                    connection.listening = True
                # Silenced between the read and the write: held until healed, like a packet
                # the network drops and TCP sends again later.
                await connection.flowing.wait()
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
