/*
 * balance.c — choosing a server of a pool, as a pure function over the
 * servers' weights, in-flight counts and eligibility, so it can be tested
 * without sockets.
 *
 * Round-robin is the "smooth" weighted variant: each pick adds every
 * eligible server's weight to its running score, takes the highest, and
 * subtracts the total from the winner. Weights 5,1,1 give a a b a c a a —
 * spread out, not bunched. Least-connections compares active/weight by
 * cross-multiplying (no division); ties are broken by a rotating start so
 * equal servers share the load.
 */
#include "conf/conf.h"
#include "gateway/gw_balance.h"
#include "gateway/gw_types.h"

static int gw_balance_rr(gw_balance_item_t *items, size_t n)
{
    int total = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        if (!items[i].eligible)
            continue;
        *items[i].current += items[i].weight;
        total += items[i].weight;
        if (best < 0 || *items[i].current > *items[best].current)
            best = (int)i;
    }
    if (best >= 0)
        *items[best].current -= total;
    return best;
}

static int gw_balance_lc(const gw_balance_item_t *items, size_t n, uint64_t tiebreak)
{
    int best = -1;
    for (size_t k = 0; k < n; k++) {
        size_t i = (size_t)((tiebreak + k) % n);
        if (!items[i].eligible)
            continue;
        if (best < 0) {
            best = (int)i;
            continue;
        }
        /* active_i / weight_i < active_best / weight_best */
        int64_t lhs = (int64_t)items[i].active * items[best].weight;
        int64_t rhs = (int64_t)items[best].active * items[i].weight;
        if (lhs < rhs)
            best = (int)i;
    }
    return best;
}

int gw_balance_pick(gw_balance_item_t *items, size_t n, int balance, uint64_t tiebreak)
{
    if (n == 0)
        return -1;
    if (balance == CONF_BALANCE_LEAST_CONN)
        return gw_balance_lc(items, n, tiebreak);
    return gw_balance_rr(items, n);
}
