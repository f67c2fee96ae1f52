-- signed.lua — wrk script of bench/policy.sh: POSTs a small chat completion,
-- each request with its own token from a pool and, optionally, a fresh
-- request signature (docs/auth.md): X-Sluice-Timestamp, a nonce never used
-- before, and HMAC-SHA256(signing key, canonical) in lowercase hex.
--
-- wrk's LuaJIT has no HMAC: the script calls OpenSSL's libcrypto (already
-- loaded into wrk, which links it for TLS) through the FFI, so every
-- request is signed as it is sent; nonces are a per-thread random prefix
-- plus a counter, so replay protection never sees one twice.
--
-- Environment:
--   BENCH_TOKENS   file of "access_token signing_key" lines (none: no
--                  Authorization header)
--   BENCH_SIGN=1   add the three X-Sluice-* headers (computed either way)
-- Every configuration of a run uses this same script (a sluice without auth
-- ignores the headers), so the load generator's cost is the same for all.
-- At the end it prints one machine-readable line that policy.sh collects.
local ffi = require("ffi")
ffi.cdef [[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_sha256(void);
unsigned char *HMAC(const EVP_MD *evp_md, const void *key, int key_len,
                    const unsigned char *d, size_t n, unsigned char *md,
                    unsigned int *md_len);
unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);
int RAND_bytes(unsigned char *buf, int num);
]]
local C = ffi.C

local path = "/v1/chat/completions"
local body = '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]}'
local sign = os.getenv("BENCH_SIGN") == "1"
local tokens = {}

local mdbuf = ffi.new("unsigned char[32]")
local mdlen = ffi.new("unsigned int[1]")

local function hex(buf, n)
    local t = {}
    for i = 0, n - 1 do
        t[#t + 1] = string.format("%02x", buf[i])
    end
    return table.concat(t)
end

C.SHA256(body, #body, mdbuf)
local body_hash = hex(mdbuf, 32)

local f = os.getenv("BENCH_TOKENS")
if f and f ~= "" then
    for line in io.lines(f) do
        local tok, key = line:match("^(%S+)%s+(%S+)$")
        if tok then
            tokens[#tokens + 1] = { auth = "Bearer " .. tok, key = key }
        end
    end
    assert(#tokens > 0, "no tokens in " .. f)
end

local prefix, counter, next_tok = "", 0, 0

function init(args)
    local r = ffi.new("unsigned char[6]")
    assert(C.RAND_bytes(r, 6) == 1)
    prefix = hex(r, 6) -- 12 characters, per thread
end

function request()
    local h = { ["Content-Type"] = "application/json" }
    if #tokens > 0 then
        next_tok = next_tok % #tokens + 1
        local t = tokens[next_tok]
        h["Authorization"] = t.auth
        -- The signature is computed whether or not it is sent: wrk shares
        -- its core with the upstream, so a cheaper script would send
        -- requests faster, and sluice's CPU per request depends on the rate
        -- (fewer requests per wakeup cost more each). Only the headers
        -- differ between a signed and an unsigned run.
        counter = counter + 1
        local ts = tostring(os.time())
        local nonce = prefix .. string.format("%012x", counter)
        local canon = "POST\n" .. path .. "\n" .. ts .. "\n" .. nonce .. "\n" .. body_hash
        C.HMAC(C.EVP_sha256(), t.key, #t.key, canon, #canon, mdbuf, mdlen)
        local sig = hex(mdbuf, 32)
        if sign then
            h["X-Sluice-Timestamp"] = ts
            h["X-Sluice-Nonce"] = nonce
            h["X-Sluice-Signature"] = sig
        end
    end
    return wrk.format("POST", path, h, body)
end

done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
        summary.requests, summary.duration, latency:percentile(50),
        latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
