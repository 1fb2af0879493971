-- wrk script for the ductor-streams benchmarks.
-- Arguments after `--`: METHOD BODY_FILE TOKEN   (BODY_FILE "-" for no body).
-- The request is static (no request()/response() callbacks), so wrk sends it from C at full
-- speed; done() prints one machine-readable line for bench/load.py.

function init(args)
   wrk.method = args[1] or "GET"
   if args[2] and args[2] ~= "-" then
      local f = assert(io.open(args[2], "rb"))
      wrk.body = f:read("*a")
      f:close()
      wrk.headers["Content-Type"] = "application/json"
   end
   if args[3] and args[3] ~= "" then
      wrk.headers["Authorization"] = "Bearer " .. args[3]
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d mean_us=%.1f max_us=%d\n",
      summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
      e.timeout, latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
