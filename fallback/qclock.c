/*
 * qclock.c — where Redis's clock stands against ours, for the Redis queue's
 * accept deadline (queue_redis.c, docs/fallback.md "queue").
 *
 * A reply that carries Redis's TIME (redis_us, its wall clock) to a call
 * sent at local send_us and answered at local recv_us (sluice's monotonic
 * clock) says that Redis read its clock at some local instant in
 * [send_us, recv_us]: the offset redis - local lies within half the round
 * trip of redis_us - midpoint. Between samples the two clocks may run apart
 * at up to FB_QCLOCK_DRIFT_PPM, so an estimate's bound widens with its age.
 * Pure functions over the times passed in: no clock is read here.
 */
#include "fallback/fb_internal.h"

/* Drift per elapsed microseconds, rounded up. */
static int64_t fb_qclock_drift(int64_t dt_us)
{
    if (dt_us < 0)
        dt_us = -dt_us;
    return (dt_us * FB_QCLOCK_DRIFT_PPM + 999999) / 1000000;
}

int64_t fb_qclock_err(const fb_qclock_t *c, int64_t at_us)
{
    if (!c->known)
        return INT64_MAX;
    return c->err_us + fb_qclock_drift(at_us - c->at_us);
}

void fb_qclock_sample(fb_qclock_t *c, int64_t send_us, int64_t recv_us, int64_t redis_us)
{
    if (recv_us < send_us || redis_us <= 0)
        return; /* not a sample: ignore it rather than trust it */
    fb_qclock_t n = {.known = true,
                     .at_us = send_us + (recv_us - send_us) / 2,
                     .err_us = (recv_us - send_us + 1) / 2};
    n.off_us = redis_us - n.at_us;
    if (c->known) {
        /* Both bounds aged to now (recv_us). A new sample outside the old
         * bounds means an assumption broke (Redis's clock was stepped):
         * the newest word is the truth. Otherwise keep the tighter one. */
        int64_t olderr = fb_qclock_err(c, recv_us), newerr = fb_qclock_err(&n, recv_us);
        int64_t d = n.off_us - c->off_us;
        bool overlap = (d < 0 ? -d : d) <= olderr + newerr;
        if (overlap && olderr <= newerr)
            return;
    }
    *c = n;
}

int fb_qclock_deadline(const fb_qclock_t *c, int64_t local_us, int64_t margin_us, int64_t *redis_us)
{
    if (!c->known)
        return -1;
    *redis_us = local_us + c->off_us - fb_qclock_err(c, local_us) - margin_us;
    return 0;
}
