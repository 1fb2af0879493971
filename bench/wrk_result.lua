-- done() for the benchmarks' wrk scripts (wrk.lua, spread.lua, storm.lua load it): one
-- machine-readable line, which bench/load.py reads (`load.result_of`).

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d mean_us=%.1f max_us=%d\n",
      summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
      e.timeout, latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
