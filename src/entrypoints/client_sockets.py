"""Clients that take nothing: the connections of a peer that stopped reading, or vanished
without a word, are dropped by the kernel (`TCP_USER_TIMEOUT`).

An event stream whose client stops reading is ended by the application after
`WRITE_STALL_SECONDS` (entrypoints/sse/asgi.py), but granian keeps the connection until what it
has buffered is written, and a client that acknowledges the kernel's window probes (its window
stays shut) keeps it for ever: a file descriptor and a few MB of send buffer each, no longer
counted by any live-connection cap. One that vanished (no FIN, no RST) was held until the
kernel gave up retransmitting: about 15 minutes (`tcp_retries2`). With `TCP_USER_TIMEOUT`, data
the peer has not acknowledged, or a window it has kept shut, for that long ends the connection.
The kernel counts a window opened by less than a segment as shut, so a client reading a few KB
a second with a small window is cut too: the default (300 s) leaves such readers five minutes.

granian binds its sockets itself and takes no socket options, but a listening socket's options
are inherited by the connections it accepts: so this process's listening TCP sockets are found
among its file descriptors, once the server has made them, and given the option (Linux only;
elsewhere nothing is done)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger("ductor_streams")

_FDS = Path("/proc/self/fd")
# How long to look for the server's listening sockets after start-up, and how often.
LOOK_SECONDS = 10.0
LOOK_EVERY_SECONDS = 0.05


def listening_sockets() -> list[socket.socket]:
    """This process's listening TCP sockets, each as a socket of its own over a duplicate of its
    file descriptor (close each: the original stays open)."""
    found = []
    for entry in _FDS.iterdir() if _FDS.is_dir() else ():
        try:
            if not os.readlink(entry).startswith("socket:"):
                continue
            fd = os.dup(int(entry.name))
        except (OSError, ValueError):
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)  # its number reused meanwhile, by something that is not a socket
            continue
        try:
            if (
                sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            ):
                found.append(sock)
                continue
        except OSError:
            pass
        sock.close()
    return found


def supported() -> bool:
    """Whether this system has the option, and lists a process's file descriptors."""
    return getattr(socket, "TCP_USER_TIMEOUT", None) is not None and _FDS.is_dir()


def drop_silent_clients(sock: socket.socket, seconds: float) -> None:
    """Connections `sock` accepts from now on end when their peer takes nothing for `seconds`."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None:
        sock.setsockopt(socket.IPPROTO_TCP, option, round(seconds * 1000))


async def drop_silent_clients_once_listening(seconds: float) -> int:
    """`drop_silent_clients` on this process's listening sockets, as soon as there are any
    (looked for over LOOK_SECONDS); answers how many it found."""
    if not supported():
        return 0
    try:
        return await _drop_once_listening(seconds)
    except Exception:  # (a setting the kernel refuses): said, and the kernel's defaults kept
        log.exception("TCP_USER_TIMEOUT could not be set on the listening sockets")
        return 0


async def _drop_once_listening(seconds: float) -> int:
    loop = asyncio.get_running_loop()
    until = loop.time() + LOOK_SECONDS
    while True:
        found = listening_sockets()
        for sock in found:
            with sock:
                drop_silent_clients(sock, seconds)
        if found or loop.time() >= until:
            if not found:
                log.warning("no listening socket found: a silent client is left to the kernel")
            return len(found)
        await asyncio.sleep(LOOK_EVERY_SECONDS)
