/*
 * rl_redis.lua.h — the one Lua script of the Redis backend, as a C string
 * (included by rl.c only). It is the same arithmetic as gcra.c and mem.c,
 * in µs of Redis's own clock (TIME), so that N sluice instances with skewed
 * clocks still share one limit, and it runs atomically: one round trip
 * takes or refuses everything a request needs.
 *
 * KEYS[1]  hash: r, m, d = GCRA times (µs) of requests, tokens/minute, tokens/day
 * KEYS[2]  sorted set: concurrency leases (member = lease id, score = expiry µs)
 * ARGV     op ("c" check, "s" settle), rpm, concurrent, tpm, tpd,
 *          n (c: tokens to reserve; s: refund = reserved - used, < 0 charges),
 *          lease id ("" = none), lease ms
 * Returns  c: {allowed, which (1 requests, 2 tpm, 3 tpd, 4 concurrent, 0 none),
 *              retry ms (-1 never), limit, remaining, reset ms}
 *          s: {1}
 */
#ifndef SL_RL_REDIS_LUA_H
#define SL_RL_REDIS_LUA_H

static const char rl_redis_lua[] =
    "if redis.replicate_commands then redis.replicate_commands() end\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local lim = {tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])}\n"
    "local conc = tonumber(ARGV[3])\n"
    "local n = tonumber(ARGV[6])\n"
    "local per = {60000000, 60000000, 86400000000}\n"
    "local h = redis.call('HMGET', KEYS[1], 'r', 'm', 'd')\n"
    "local tat = {}\n"
    "for i = 1, 3 do tat[i] = tonumber(h[i]) or 0 end\n"
    "local function iv(i) return math.max(math.floor(per[i] / lim[i]), 1) end\n"
    "local function rem(i, x)\n"
    "  local lvl = math.max(x - now, 0)\n"
    "  if lvl >= per[i] then return 0 end\n"
    "  return math.min(math.floor((per[i] - lvl) / iv(i)), lim[i])\n"
    "end\n"
    "local function ms(us) return math.ceil(us / 1000) end\n"
    "local function save()\n"
    "  local top = now\n"
    "  local f = {'r', 'm', 'd'}\n"
    "  for i = 1, 3 do\n"
    "    if lim[i] > 0 and tat[i] > now then\n"
    "      redis.call('HSET', KEYS[1], f[i], string.format('%.0f', tat[i]))\n"
    "      if tat[i] > top then top = tat[i] end\n"
    "    end\n"
    "  end\n"
    "  if top > now then redis.call('PEXPIRE', KEYS[1], ms(top - now) + 1000) end\n"
    "end\n"
    "if ARGV[1] == 's' then\n"
    "  for i = 2, 3 do\n"
    "    if lim[i] > 0 and n ~= 0 then\n"
    "      local T = iv(i)\n"
    "      if n > 0 then\n"
    "        if tat[i] > now then tat[i] = math.max(tat[i] - n * T, now) end\n"
    "      else\n"
    "        local c = math.max(tat[i], now) + math.min(-n, 4 * lim[i]) * T\n"
    "        tat[i] = math.min(c, now + 5 * per[i])\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  if ARGV[7] ~= '' then redis.call('ZREM', KEYS[2], ARGV[7]) end\n"
    "  save()\n"
    "  return {1}\n"
    "end\n"
    "local cost = {1, n, n}\n"
    "local w, wr, wl, wrem, wres = 0, 0, 0, 0, 0\n"
    "local function refuse(i, retry, l, r, res)\n"
    "  if w == 0 or retry == -1 or (wr ~= -1 and retry > wr) then\n"
    "    w, wr, wl, wrem, wres = i, retry, l, r, res\n"
    "  end\n"
    "end\n"
    "for i = 1, 3 do\n"
    "  if lim[i] > 0 and cost[i] > 0 then\n"
    "    local cur = math.max(tat[i], now)\n"
    "    local nt = cur + cost[i] * iv(i)\n"
    "    if cost[i] > lim[i] then refuse(i, -1, lim[i], rem(i, tat[i]), ms(cur - now))\n"
    "    elseif nt - per[i] > now then\n"
    "      refuse(i, ms(nt - per[i] - now), lim[i], rem(i, tat[i]), ms(cur - now))\n"
    "    else tat[i] = nt end\n"
    "  end\n"
    "end\n"
    "if conc > 0 then\n"
    "  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)\n"
    "  if redis.call('ZCARD', KEYS[2]) >= conc then refuse(4, 1000, conc, 0, 1000) end\n"
    "end\n"
    "if w ~= 0 then return {0, w, wr, wl, wrem, wres} end\n"
    "if conc > 0 then\n"
    "  local lease_ms = tonumber(ARGV[8])\n"
    "  redis.call('ZADD', KEYS[2], now + lease_ms * 1000, ARGV[7])\n"
    "  redis.call('PEXPIRE', KEYS[2], lease_ms)\n"
    "end\n"
    "save()\n"
    "for i = 1, 3 do\n"
    "  if lim[i] > 0 and cost[i] > 0 then\n"
    "    return {1, i, 0, lim[i], rem(i, tat[i]), ms(math.max(tat[i] - now, 0))}\n"
    "  end\n"
    "end\n"
    "return {1, 0, 0, 0, 0, 0}\n";

#endif
