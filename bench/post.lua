-- post.lua — wrk script of bench/run.sh: POSTs a small chat completion.
-- BENCH_STREAM=1 asks for an SSE stream ("stream":true). At the end it
-- prints one machine-readable line (microseconds) that run.sh collects.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("wrk_common") -- the BENCH line
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local stream = os.getenv("BENCH_STREAM") == "1"
wrk.body = '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]'
    .. (stream and ',"stream":true}' or '}')

done = common.done
