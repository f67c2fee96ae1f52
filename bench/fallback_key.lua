-- fallback_key.lua — wrk script of bench/fallback_bench.sh: the request of
-- post.lua with a fresh Idempotency-Key on every request (so sluice claims,
-- stores and completes a key each time; no replays). Prints the same BENCH
-- line as post.lua.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("wrk_common") -- the BENCH line
local stream = os.getenv("BENCH_STREAM") == "1"
local body = '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]'
    .. (stream and ',"stream":true}' or '}')
local n = 0
local prefix = string.format("k%d-%d-", os.time(), math.random(1, 1000000000))

request = function()
    n = n + 1
    return wrk.format("POST", nil, {
        ["Content-Type"] = "application/json",
        ["Idempotency-Key"] = prefix .. n,
    }, body)
end

done = common.done
