"""Use cases (one per module) and the ports they need (typing.Protocol)."""
