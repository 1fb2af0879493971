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

-- done(): the shared result line, from the file beside this one.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_result.lua")
