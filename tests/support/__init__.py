"""Shared test support: PostgreSQL for tests, a real server process, HTTP helpers."""
