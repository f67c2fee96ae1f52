/*
 * gcra.c — the Generic Cell Rate Algorithm, the arithmetic under every
 * limit: one integer per limit (the theoretical arrival time, TAT), no
 * windows, no timers. A limit of L per period P spaces units T = P/L
 * apart and tolerates a burst of L: a take of `cost` fits when
 * max(TAT, now) + cost*T - P <= now. Pure functions of (state, now).
 */
#include "ratelimit/rl_internal.h"

static int64_t rl_gcra_interval(int64_t limit, int64_t period_ns)
{
    int64_t t = period_ns / limit;
    return t > 0 ? t : 1;
}

void rl_gcra_peek(int64_t tat, int64_t now, int64_t limit, int64_t period_ns, rl_gcra_result_t *out)
{
    int64_t t = rl_gcra_interval(limit, period_ns);
    int64_t level = tat > now ? tat - now : 0; /* how much of the period is used up */
    out->allowed = true;
    out->remaining = level >= period_ns ? 0 : (period_ns - level) / t;
    if (out->remaining > limit)
        out->remaining = limit;
    out->reset_ns = level;
    out->retry_ns = 0;
}

void rl_gcra_take(int64_t *tat, int64_t now, int64_t limit, int64_t period_ns, int64_t cost,
                  rl_gcra_result_t *out)
{
    int64_t t = rl_gcra_interval(limit, period_ns);
    int64_t cur = *tat > now ? *tat : now;
    if (cost > limit) { /* can never fit: cost * t would also overflow for huge costs */
        rl_gcra_peek(*tat, now, limit, period_ns, out);
        out->allowed = false;
        out->retry_ns = -1;
        return;
    }
    int64_t next = cur + cost * t;
    int64_t fits_at = next - period_ns;
    if (fits_at > now) {
        rl_gcra_peek(*tat, now, limit, period_ns, out);
        out->allowed = false;
        out->retry_ns = fits_at - now;
        return;
    }
    *tat = next;
    rl_gcra_peek(next, now, limit, period_ns, out);
}

void rl_gcra_adjust(int64_t *tat, int64_t now, int64_t limit, int64_t period_ns, int64_t n)
{
    int64_t t = rl_gcra_interval(limit, period_ns);
    if (n > 0) {
        if (*tat <= now)
            return; /* already full */
        /* n * t cannot overflow usefully beyond the level; cap n first */
        int64_t level = *tat - now;
        if (n >= level / t + 1)
            *tat = now;
        else
            *tat -= n * t;
    } else if (n < 0) {
        int64_t charge = -n;
        int64_t cap = RL_MAX_DEBT_PERIODS * limit;
        if (charge > cap)
            charge = cap;
        int64_t cur = *tat > now ? *tat : now;
        int64_t max_tat = now + (RL_MAX_DEBT_PERIODS + 1) * period_ns;
        cur += charge * t;
        *tat = cur > max_tat ? max_tat : cur;
    }
}
