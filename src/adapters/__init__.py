"""Adapters: PostgreSQL (asyncpg), memory fakes, and what the ports need of the outside."""
