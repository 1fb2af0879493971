"""The Durable Streams protocol surface: routes.py (Litestar), protocol.py (wire to use cases
and back), wire.py (headers and bodies), answers.py (exact answers)."""
