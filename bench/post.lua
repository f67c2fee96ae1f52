-- post.lua — wrk script of bench/run.sh: POSTs a small chat completion.
-- BENCH_STREAM=1 asks for an SSE stream ("stream":true). At the end it
-- prints one machine-readable line (microseconds) that run.sh collects.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local stream = os.getenv("BENCH_STREAM") == "1"
wrk.body = '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]'
    .. (stream and ',"stream":true}' or '}')

done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
        summary.requests, summary.duration, latency:percentile(50),
        latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
