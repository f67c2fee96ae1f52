-- signed.lua — wrk script of bench/policy.sh: POSTs a small chat completion,
-- each request with its own token from a pool and, optionally, a fresh
-- request signature (docs/auth.md): X-Sluice-Timestamp, a nonce never used
-- before, and HMAC-SHA256(signing key, canonical) in lowercase hex.
--
-- Signing and the BENCH line: bench/wrk_common.lua.
--
-- Environment:
--   BENCH_TOKENS   file of "access_token signing_key" lines (none: no
--                  Authorization header)
--   BENCH_SIGN=1   add the three X-Sluice-* headers (computed either way)
-- Every configuration of a run uses this same script (a sluice without auth
-- ignores the headers), so the load generator's cost is the same for all.
-- At the end it prints one machine-readable line that policy.sh collects.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("wrk_common")

local path = "/v1/chat/completions"
local body = '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]}'
local sign = os.getenv("BENCH_SIGN") == "1"
local tokens = {}

local body_hash = common.body_hash(body)

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

local next_tok, signer = 0, nil

function init(args)
    signer = common.signer()
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
        local ts, nonce, sig = signer(t.key, path, body_hash)
        if sign then
            h["X-Sluice-Timestamp"] = ts
            h["X-Sluice-Nonce"] = nonce
            h["X-Sluice-Signature"] = sig
        end
    end
    return wrk.format("POST", path, h, body)
end

done = common.done
