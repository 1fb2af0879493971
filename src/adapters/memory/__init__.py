"""In-memory adapters with the same behaviour as the PostgreSQL ones, for fast tests."""
