-- fallback_key.lua — wrk script of bench/fallback_bench.sh: the request of
-- post.lua with a fresh Idempotency-Key on every request (so sluice claims,
-- stores and completes a key each time; no replays). Prints the same BENCH
-- line as post.lua.
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

done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
        summary.requests, summary.duration, latency:percentile(50),
        latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
