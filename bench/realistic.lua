-- realistic.lua — wrk script of bench/realistic.sh: POSTs issue #16's
-- realistic chat request (or, with BENCH_BODY_FILE, that file's bytes), with
-- a bearer token when BENCH_TOKEN is set. BENCH_BODY_VARY=key: each request's
-- body gets a member "metadata":{"rNNNNNNN":"1"} with a key of its own (the
-- same length each time): a JSON shape body_scan.c has not kept (a miss). Prints the machine-readable line
-- realistic.sh collects (microseconds).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local tok = os.getenv("BENCH_TOKEN")
if tok and tok ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. tok
end
local f = os.getenv("BENCH_BODY_FILE")
if f and f ~= "" then
    local h = assert(io.open(f, "rb"))
    wrk.body = h:read("*a")
    h:close()
else
    wrk.body = '{"model":"chat-model","messages":[{"role":"system","content":"You are a helpful assistant."},'
        .. '{"role":"user","content":"Write one sentence about the sea, please, in plain English."}],"max_tokens":64}'
end

if os.getenv("BENCH_BODY_VARY") == "key" then
    local base = wrk.body:gsub("}%s*$", "")
    local n = 0
    request = function()
        n = n + 1
        return wrk.format(nil, nil, nil,
            base .. string.format(',"metadata":{"r%07d":"1"}}', n))
    end
end

done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
        summary.requests, summary.duration, latency:percentile(50),
        latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
