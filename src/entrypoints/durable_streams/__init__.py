"""The Durable Streams protocol surface: routes.py (Litestar), protocol.py (wire <-> use cases), wire.py (headers and bodies), answers.py."""
