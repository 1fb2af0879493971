"""The Litestar HTTP entrypoint."""
