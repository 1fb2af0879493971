"""Adapters of the workflow wait service: a PostgreSQL table (embedded default), HTTP, memory."""
