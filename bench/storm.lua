-- wrk script for bench/run_storm.py: runs starting and ending. Each thread numbers its
-- requests; what a request does follows from its number, so that no state is kept per
-- connection. Arguments after `--`: TOKEN KIND PREFIX CONNECTIONS_PER_THREAD
--   append:        one record to stream a<n mod 1000> of run PREFIX-appends (made beforehand)
--   create:        a stream `s` of a new run
--   create-delete: a stream created, and the one created LAG requests before deleted
--   lifecycle:     a run's three streams created, one record appended to each, the run deleted,
--                  each step of a run LAG runs after its previous step (by then it has been
--                  answered: a thread has at most CONNECTIONS_PER_THREAD requests in flight)

local threads = 0

function setup(thread)
   thread:set("id", threads)
   threads = threads + 1
end

local API = "/api/workflow-streams/runs/"
local STREAMS = { "input", "output", "events" }
local RECORD = '{"records":[{"data":{"step":1}}]}'
local kind, base, prefix, lag
local n = 0

function init(args)
   wrk.headers["Authorization"] = "Bearer " .. args[1]
   wrk.headers["Content-Type"] = "application/json"
   kind = args[2]
   base = args[3]
   prefix = base .. "-" .. id .. "-"
   lag = math.ceil(4 * tonumber(args[4]) / 7) + 1
end

local function create(run, stream)
   local body = '{"stream_id":"' .. stream .. '","direction":"output"}'
   return wrk.format("POST", API .. run .. "/streams", nil, body)
end

function request()
   n = n + 1
   if kind == "append" then
      local path = API .. base .. "-appends/streams/a" .. (n % 1000) .. "/records"
      return wrk.format("POST", path, nil, RECORD)
   elseif kind == "create" then
      return create(prefix .. n, "s")
   elseif kind == "create-delete" then
      local r = math.floor(n / 2)
      if n % 2 == 0 then
         return create(prefix .. r, "s")
      elseif r - lag * 2 >= 1 then -- created 4 * lag + 1 requests before
         return wrk.format("DELETE", API .. prefix .. (r - lag * 2) .. "/streams/s")
      end
      return create(prefix .. "extra-" .. n, "s")
   end
   local step = n % 7
   local r = math.floor(n / 7) - step * lag
   if r < 1 then -- (wrk may build a thread's first request before its connections start)
      return create(prefix .. "extra-" .. n, "s")
   end
   local run = prefix .. r
   if step < 3 then
      return create(run, STREAMS[step + 1])
   elseif step < 6 then
      return wrk.format("POST", API .. run .. "/streams/" .. STREAMS[step - 2] .. "/records", nil, RECORD)
   end
   return wrk.format("DELETE", API .. run)
end

-- done(): the shared result line, from the file beside this one.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_result.lua")
