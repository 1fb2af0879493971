"""The pure domain: the Stream aggregate, its definition, events and errors (stdlib + msgspec)."""
