"""Entrypoints: the Litestar HTTP API, the SSE adapter, the CLI and the wiring container."""
