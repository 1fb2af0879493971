-- wrk script for the spread loads (bench/spread.py): each request goes to a stream drawn at
-- random from a file of paths, one a line.
-- Arguments after `--`: BODY_FILE TOKEN PATHS_FILE CONTENT_TYPE

local paths = {}
local body

function init(args)
   local f = assert(io.open(args[1], "rb"))
   body = f:read("*a")
   f:close()
   if args[2] and args[2] ~= "" then
      wrk.headers["Authorization"] = "Bearer " .. args[2]
   end
   wrk.headers["Content-Type"] = args[4] or "application/json"
   for line in io.lines(args[3]) do
      paths[#paths + 1] = line
   end
   -- a seed of its own per thread (each has its own Lua state)
   math.randomseed(os.time() + tonumber(tostring(paths):match("0x(%x+)") or "0", 16) % 100000)
end

function request()
   return wrk.format("POST", paths[math.random(#paths)], nil, body)
end

-- done(): the shared result line, from the file beside this one.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_result.lua")
