"""PostgreSQL adapters (asyncpg): the one source of truth."""
