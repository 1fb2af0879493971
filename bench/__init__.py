"""Benchmarks for ductor-streams: `python3 dev.py bench` (see docs/benchmarks.md).

One run measures, against one embedded PostgreSQL and one server process:

1. `floor`  - raw asyncpg, one transaction per single-record append under the stream-row lock;
2. `append` - single-record appends over HTTP from N keep-alive clients (wrk);
3. `noop`   - the same server's GET /healthz rate with the same clients;
4. `batch`  - HTTP appends of 1,000 x ~100-byte records per request;
   `copy`   - raw asyncpg COPY of the same 1,000-row batches into stream_records.
"""
