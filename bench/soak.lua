-- wrk script for the soak (bench/soak.py): single-record keyed appends spread over many streams.
-- Arguments after `--`: TOKEN PREFIX STREAMS QUOTA THREADS TAG
--   PREFIX  /api/workflow-streams/runs/<run>/streams; the streams are s0 .. s<STREAMS-1>
--   QUOTA   201 answers each thread waits for before it stops (bench/soak.py then ends wrk)
--   TAG     makes the Idempotency-Keys of one run unique: TAG-<n>
-- Request n of a thread (a per-thread counter) is global number n * THREADS + thread id: it
-- goes to stream s(n mod STREAMS) with Idempotency-Key TAG-n, so every request has its own key.
-- done() prints one machine-readable line for bench/soak.py.

local threads = {}
local next_id = 0

function setup(thread)
   thread:set("id", next_id)
   next_id = next_id + 1
   table.insert(threads, thread)
end

function init(args)
   -- wrk.format() takes its headers from this table alone (it adds only Host)
   headers = {
      ["Host"] = wrk.headers["Host"],
      ["Authorization"] = "Bearer " .. args[1],
      ["Content-Type"] = "application/json",
   }
   prefix = args[2]
   streams = tonumber(args[3])
   quota = tonumber(args[4])
   nthreads = tonumber(args[5])
   tag = args[6]
   counter = 0
   ok = 0
   bad = 0
   pad = string.rep("x", 60)
end

function request()
   local n = counter * nthreads + id
   counter = counter + 1
   local body = string.format(
      '{"records":[{"data":{"i":%d,"kind":"token","text":"%s"}}]}', n, pad)
   headers["Idempotency-Key"] = tag .. "-" .. n
   return wrk.format("POST", string.format("%s/s%d/records", prefix, n % streams), headers, body)
end

function response(status, answer_headers, body)
   if status == 201 then
      ok = ok + 1
      if ok >= quota then
         wrk.thread:stop()
      end
   else
      bad = bad + 1
      if bad <= 5 then
         io.stderr:write(string.format("status %d: %s\n", status, body or ""))
      end
   end
end

function done(summary, latency, requests)
   local created, failed = 0, 0
   for _, t in ipairs(threads) do
      created = created + (t:get("ok") or 0)
      failed = failed + (t:get("bad") or 0)
   end
   local e = summary.errors
   io.write(string.format(
      "SOAK_RESULT requests=%d created=%d other=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d max_us=%d\n",
      summary.requests, created, failed, summary.duration, e.connect, e.read, e.write, e.status,
      e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
