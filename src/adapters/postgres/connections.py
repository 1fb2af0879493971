"""The connection a statement of this package runs on: one taken from the pool (asyncpg hands
out a proxy of its `Connection`) or one opened alone (the wake bus, migrations)."""

from __future__ import annotations

import asyncpg
from asyncpg.pool import PoolConnectionProxy

Connection = asyncpg.Connection | PoolConnectionProxy
