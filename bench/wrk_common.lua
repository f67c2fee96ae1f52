-- wrk_common.lua — what the wrk scripts of bench/ share (post.lua,
-- signed.lua, realistic.lua, fallback_key.lua, cache_hit.sh's req.lua):
-- request signing as docs/auth.md specifies it, and the machine-readable
-- line the bench scripts collect. Loaded with
--   package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
--       .. "?.lua;" .. package.path
--   local common = require("wrk_common")
--
-- wrk's LuaJIT has no HMAC: signing calls OpenSSL's libcrypto (already
-- loaded into wrk, which links it for TLS) through the FFI. Nonces are a
-- per-thread random prefix plus a counter, so replay protection never sees
-- one twice.
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

local M = {}

local function hex(buf, n)
    local t = {}
    for i = 0, n - 1 do
        t[#t + 1] = string.format("%02x", buf[i])
    end
    return table.concat(t)
end

-- A body's SHA-256 in lowercase hex (the canonical string's last line).
function M.body_hash(body)
    C.SHA256(body, #body, md)
    return hex(md, 32)
end

-- A signer for one wrk thread: call from init(). signer(key, path,
-- body_hash) returns the three header values: timestamp, a fresh nonce,
-- HMAC-SHA256(key, canonical) in hex.
function M.signer()
    local r = ffi.new("unsigned char[6]")
    assert(C.RAND_bytes(r, 6) == 1)
    local prefix, counter = hex(r, 6), 0 -- 12 characters, per thread
    return function(key, path, body_hash)
        counter = counter + 1
        local ts = tostring(os.time())
        local nonce = prefix .. string.format("%012x", counter)
        local canon = "POST\n" .. path .. "\n" .. ts .. "\n" .. nonce .. "\n" .. body_hash
        C.HMAC(C.EVP_sha256(), key, #key, canon, #canon, md, mdlen)
        return ts, nonce, hex(md, 32)
    end
end

-- wrk's done(): the line the bench scripts collect (microseconds).
function M.done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
        summary.requests, summary.duration, latency:percentile(50),
        latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end

return M
