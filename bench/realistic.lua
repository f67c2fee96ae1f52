-- realistic.lua — wrk script of bench/realistic.sh: POSTs issue #16's
-- realistic chat request (or, with BENCH_BODY_FILE, that file's bytes), with
-- a bearer token when BENCH_TOKEN is set. BENCH_BODY_VARY=key: each request's
-- body gets a member "metadata":{"rNNNNNNN":"1"} with a key of its own (the
-- same length each time): a JSON shape body_scan.c has not kept (a miss).
-- BENCH_SIGNING_KEY: every request signed with that key (full-sig; not with
-- BENCH_BODY_VARY). Prints the machine-readable line
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

local key = os.getenv("BENCH_SIGNING_KEY")
if key and key ~= "" then
    -- Every request signed as bench/signed.lua does (docs/auth.md): the
    -- timestamp, a nonce never sent before (a per-thread random prefix and
    -- a counter) and HMAC-SHA256(signing key, canonical) in hex, through
    -- the libcrypto that wrk links. The client's cost does not count in the
    -- callgrind benches (they count sluice's instructions only).
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
    local md, mdlen = ffi.new("unsigned char[32]"), ffi.new("unsigned int[1]")
    local function hex(buf, n)
        local t = {}
        for i = 0, n - 1 do
            t[#t + 1] = string.format("%02x", buf[i])
        end
        return table.concat(t)
    end
    local path = wrk.path ~= "" and wrk.path or "/v1/chat/completions"
    C.SHA256(wrk.body, #wrk.body, md)
    local body_hash = hex(md, 32)
    local prefix, counter = "", 0
    init = function(args)
        local r = ffi.new("unsigned char[6]")
        assert(C.RAND_bytes(r, 6) == 1)
        prefix = hex(r, 6)
    end
    request = function()
        counter = counter + 1
        local ts = tostring(os.time())
        local nonce = prefix .. string.format("%012x", counter)
        local canon = "POST\n" .. path .. "\n" .. ts .. "\n" .. nonce .. "\n" .. body_hash
        C.HMAC(C.EVP_sha256(), key, #key, canon, #canon, md, mdlen)
        local h = {} -- wrk.format's headers replace wrk.headers
        for k, v in pairs(wrk.headers) do
            h[k] = v
        end
        h["X-Sluice-Timestamp"] = ts
        h["X-Sluice-Nonce"] = nonce
        h["X-Sluice-Signature"] = hex(md, 32)
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

done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
        summary.requests, summary.duration, latency:percentile(50),
        latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
