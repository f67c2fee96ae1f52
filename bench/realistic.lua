-- realistic.lua — wrk script of bench/realistic.sh: POSTs issue #16's
-- realistic chat request (or, with BENCH_BODY_FILE, that file's bytes), with
-- a bearer token when BENCH_TOKEN is set. BENCH_BODY_VARY=key: each request's
-- body gets a member "metadata":{"rNNNNNNN":"1"} with a key of its own (the
-- same length each time): a JSON shape body_scan.c has not kept (a miss).
-- BENCH_SIGNING_KEY: every request signed with that key (full-sig; not with
-- BENCH_BODY_VARY). Prints the machine-readable line
-- realistic.sh collects (microseconds).
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("wrk_common")

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

local key = os.getenv("BENCH_SIGNING_KEY")
if key and key ~= "" then
    -- Every request signed as bench/signed.lua does (docs/auth.md). The
    -- client's cost does not count in the callgrind benches (they count
    -- sluice's instructions only).
    local path = wrk.path ~= "" and wrk.path or "/v1/chat/completions"
    local body_hash = common.body_hash(wrk.body)
    local sign
    init = function(args)
        sign = common.signer()
    end
    request = function()
        local ts, nonce, sig = sign(key, path, body_hash)
        local h = {} -- wrk.format's headers replace wrk.headers
        for k, v in pairs(wrk.headers) do
            h[k] = v
        end
        h["X-Sluice-Timestamp"] = ts
        h["X-Sluice-Nonce"] = nonce
        h["X-Sluice-Signature"] = sig
        return wrk.format(nil, nil, h, nil)
    end
elseif os.getenv("BENCH_BODY_VARY") == "key" then
    local base = wrk.body:gsub("}%s*$", "")
    local n = 0
    request = function()
        n = n + 1
        return wrk.format(nil, nil, nil,
            base .. string.format(',"metadata":{"r%07d":"1"}}', n))
    end
end

done = common.done
