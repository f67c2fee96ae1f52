/*
 * rl_redis.lua.h — the one Lua script of the Redis backend, as a C string
 * (included by rl.c only). It is the same arithmetic as gcra.c and mem.c,
 * in µs of Redis's own clock (TIME), so that N sluice instances with skewed
 * clocks still share one limit, and it runs atomically: one round trip
 * takes or refuses everything each of its requests needs.
 *
 * One call carries a batch: every check and settle a worker made in one
 * turn of its event loop (rl.c, up to RL_BATCH_MAX), applied in order, so
 * that N concurrent requests cost one round trip, one script run and one
 * TIME instead of N. Each entry runs under pcall: an entry that fails (a
 * key of the wrong type, say) gets its own error reply in the array and the
 * others are unaffected.
 *
 * KEYS     per entry e: [2e-1] hash: r, m, d = GCRA times (µs) of requests,
 *          tokens/minute, tokens/day; [2e] sorted set: concurrency leases
 *          (member = lease id, score = expiry µs)
 * ARGV     [1] lease ms; then 8 per entry: op ("c" check, "s" settle, "r"
 *          return leased requests), rpm, concurrent, tpm, tpd, n (c: tokens
 *          to reserve; s: refund = reserved - used, < 0 charges; r: request
 *          units given back), lease id ("" = none), want (c: request units
 *          to lease on top, rl.c's leased local quotas; 0 = none)
 * Returns  an array with one reply per entry, in order:
 *          c: {allowed, which (1 requests, 2 tpm, 3 tpd, 4 concurrent, 0 none),
 *              retry ms (-1 never), limit, remaining, reset ms, leased}
 *          s, r: {1}
 *
 * Expired concurrency leases are pruned only when the set looks full: they
 * matter only then, and the common check saves a command.
 *
 * A lease is granted only when it is small against the limit (want * 64 <=
 * rpm) and the bucket stays at least half full after it: the units are
 * taken here, before they are spent, so leases never let more than the
 * limit through; near the limit every check comes here.
 *          or an error reply for an entry that failed.
 */
#ifndef SL_RL_REDIS_LUA_H
#define SL_RL_REDIS_LUA_H

static const char rl_redis_lua[] =
    "if redis.replicate_commands then redis.replicate_commands() end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local lease_ms = tonumber(ARGV[1])\n"
    "local per = {60000000, 60000000, 86400000000}\n"
    "local fld = {'r', 'm', 'd'}\n"
    "local function iv(lim, i) return math.max(math.floor(per[i] / lim[i]), 1) end\n"
    "local function rem(lim, i, x)\n"
    "  local lvl = math.max(x - now, 0)\n"
    "  if lvl >= per[i] then return 0 end\n"
    "  return math.min(math.floor((per[i] - lvl) / iv(lim, i)), lim[i])\n"
    "end\n"
    "local function ms(us) return math.ceil(us / 1000) end\n"
    "local function save(k1, lim, tat)\n"
    "  local hs, top = {}, now\n"
    "  for i = 1, 3 do\n"
    "    if lim[i] > 0 then\n"
    "      hs[#hs + 1] = fld[i]\n"
    "      hs[#hs + 1] = string.format('%.0f', math.max(tat[i], now))\n"
    "      if tat[i] > top then top = tat[i] end\n"
    "    end\n"
    "  end\n"
    "  if #hs > 0 then\n"
    "    redis.call('HSET', k1, unpack(hs))\n"
    "    redis.call('PEXPIRE', k1, ms(top - now) + 1000)\n"
    "  end\n"
    "end\n"
    "local function one(k1, k2, a)\n"
    "  local lim = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])}\n"
    "  local conc = tonumber(ARGV[a + 2])\n"
    "  local n = tonumber(ARGV[a + 5])\n"
    "  local lease = ARGV[a + 6]\n"
    "  local want = tonumber(ARGV[a + 7])\n"
    "  local h = redis.call('HMGET', k1, 'r', 'm', 'd')\n"
    "  local tat = {tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0}\n"
    "  if ARGV[a] == 'r' then\n"
    "    if lim[1] > 0 and n > 0 and tat[1] > now then\n"
    "      tat[1] = math.max(tat[1] - n * iv(lim, 1), now)\n"
    "    end\n"
    "    save(k1, lim, tat)\n"
    "    return {1}\n"
    "  end\n"
    "  if ARGV[a] == 's' then\n"
    "    for i = 2, 3 do\n"
    "      if lim[i] > 0 and n ~= 0 then\n"
    "        local T = iv(lim, i)\n"
    "        if n > 0 then\n"
    "          if tat[i] > now then tat[i] = math.max(tat[i] - n * T, now) end\n"
    "        else\n"
    "          local c = math.max(tat[i], now) + math.min(-n, 4 * lim[i]) * T\n"
    "          tat[i] = math.min(c, now + 5 * per[i])\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "    if lease ~= '' then redis.call('ZREM', k2, lease) end\n"
    "    save(k1, lim, tat)\n"
    "    return {1}\n"
    "  end\n"
    "  local cost = {1, n, n}\n"
    "  local w, wr, wl, wrem, wres = 0, 0, 0, 0, 0\n"
    "  local function refuse(i, retry, l, r, res)\n"
    "    if w == 0 or retry == -1 or (wr ~= -1 and retry > wr) then\n"
    "      w, wr, wl, wrem, wres = i, retry, l, r, res\n"
    "    end\n"
    "  end\n"
    "  for i = 1, 3 do\n"
    "    if lim[i] > 0 and cost[i] > 0 then\n"
    "      local cur = math.max(tat[i], now)\n"
    "      local nt = cur + cost[i] * iv(lim, i)\n"
    "      if cost[i] > lim[i] then refuse(i, -1, lim[i], rem(lim, i, tat[i]), ms(cur - now))\n"
    "      elseif nt - per[i] > now then\n"
    "        refuse(i, ms(nt - per[i] - now), lim[i], rem(lim, i, tat[i]), ms(cur - now))\n"
    "      else tat[i] = nt end\n"
    "    end\n"
    "  end\n"
    "  if conc > 0 then\n"
    "    local held = redis.call('ZCARD', k2)\n"
    "    if held >= conc then\n"
    "      redis.call('ZREMRANGEBYSCORE', k2, '-inf', now)\n"
    "      held = redis.call('ZCARD', k2)\n"
    "    end\n"
    "    if held >= conc then refuse(4, 1000, conc, 0, 1000) end\n"
    "  end\n"
    "  if w ~= 0 then return {0, w, wr, wl, wrem, wres, 0} end\n"
    "  local got = 0\n"
    "  if want > 0 and lim[1] > 0 and want * 64 <= lim[1] then\n"
    "    local nt = tat[1] + want * iv(lim, 1)\n"
    "    if nt - now <= per[1] / 2 then tat[1] = nt; got = want end\n"
    "  end\n"
    "  if conc > 0 then\n"
    "    redis.call('ZADD', k2, now + lease_ms * 1000, lease)\n"
    "    redis.call('PEXPIRE', k2, lease_ms)\n"
    "  end\n"
    "  save(k1, lim, tat)\n"
    "  for i = 1, 3 do\n"
    "    if lim[i] > 0 and cost[i] > 0 then\n"
    "      return {1, i, 0, lim[i], rem(lim, i, tat[i]), ms(math.max(tat[i] - now, 0)), got}\n"
    "    end\n"
    "  end\n"
    "  return {1, 0, 0, 0, 0, 0, 0}\n"
    "end\n"
    "local out = {}\n"
    "for e = 1, #KEYS / 2 do\n"
    "  local ok, res = pcall(one, KEYS[2 * e - 1], KEYS[2 * e], 2 + (e - 1) * 8)\n"
    "  if ok then out[e] = res\n"
    "  else\n"
    "    local m = type(res) == 'table' and (res.err or 'error') or tostring(res)\n"
    "    out[e] = {err = 'ERR sluice rl entry: ' .. m}\n"
    "  end\n"
    "end\n"
    "return out\n";

#endif
