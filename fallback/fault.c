/*
 * fault.c — fault-injection decisions for drills (Envoy-style): abort a
 * share of requests with a status, delay a share of them, from the conf
 * (root fault:, or a model's) or from one request's X-Sluice-Fault header
 * when it carries the admin key. The gateway applies the decision in front
 * of the upstream, so an injected abort runs the whole fallback chain.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/sl.h"
#include "fallback/fb_internal.h"

void fb_fault_resolve(const conf_fault_t *root, const conf_fault_t *model, fb_fault_spec_t *out)
{
    out->abort_percent = (int)root->abort_percent;
    out->abort_status = (int)root->abort_status;
    out->delay_percent = (int)root->delay_percent;
    out->delay_ms = root->delay_ms;
    if (!model)
        return;
    if (model->abort_percent >= 0)
        out->abort_percent = (int)model->abort_percent;
    if (model->abort_status >= 0)
        out->abort_status = (int)model->abort_status;
    if (model->delay_percent >= 0)
        out->delay_percent = (int)model->delay_percent;
    if (model->delay_ms > 0)
        out->delay_ms = model->delay_ms;
}

/* "503", "2s" ... "@PERCENT" split off; percent defaults to 100. */
static int fb_fault_value(const char *v, size_t n, char *val, size_t vcap, int *percent, char *err,
                          size_t errlen)
{
    const char *at = memchr(v, '@', n);
    size_t vl = at ? (size_t)(at - v) : n;
    if (vl == 0 || vl >= vcap) {
        snprintf(err, errlen, "empty or too long value");
        return -1;
    }
    memcpy(val, v, vl);
    val[vl] = '\0';
    *percent = 100;
    if (at) {
        const char *p = at + 1;
        size_t pl = n - vl - 1;
        if (pl == 0 || pl > 3) {
            snprintf(err, errlen, "percent after @ must be 0..100");
            return -1;
        }
        int x = 0;
        for (size_t i = 0; i < pl; i++) {
            if (p[i] < '0' || p[i] > '9') {
                snprintf(err, errlen, "percent after @ must be 0..100");
                return -1;
            }
            x = x * 10 + (p[i] - '0');
        }
        if (x > 100) {
            snprintf(err, errlen, "percent after @ must be 0..100");
            return -1;
        }
        *percent = x;
    }
    return 0;
}

int fb_fault_parse(const char *v, size_t len, fb_fault_spec_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->abort_status = 503;
    bool any = false, seen_abort = false, seen_delay = false;
    const char *p = v, *end = v + len;
    if (len > 256) {
        snprintf(err, errlen, "header longer than 256 bytes");
        return -1;
    }
    while (p < end) {
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *ie = semi ? semi : end;
        const char *a = p, *b = ie;
        p = semi ? semi + 1 : end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a == b)
            continue;
        const char *eq = memchr(a, '=', (size_t)(b - a));
        if (!eq) {
            snprintf(err, errlen, "expected abort=STATUS[@PERCENT] or delay=DURATION[@PERCENT]");
            return -1;
        }
        size_t kl = (size_t)(eq - a);
        char val[32];
        int pct;
        if (fb_fault_value(eq + 1, (size_t)(b - eq - 1), val, sizeof(val), &pct, err, errlen) != 0)
            return -1;
        if (kl == 5 && strncasecmp(a, "abort", 5) == 0 && !seen_abort) {
            int st = 0;
            bool ok = strlen(val) == 3;
            for (int i = 0; ok && i < 3; i++)
                ok = val[i] >= '0' && val[i] <= '9';
            if (ok)
                st = (val[0] - '0') * 100 + (val[1] - '0') * 10 + (val[2] - '0');
            if (!ok || st < 400 || st > 599) {
                snprintf(err, errlen, "abort status must be 400..599");
                return -1;
            }
            out->abort_status = st;
            out->abort_percent = pct;
            seen_abort = true;
        } else if (kl == 5 && strncasecmp(a, "delay", 5) == 0 && !seen_delay) {
            int64_t ms;
            if (conf_parse_duration_ms(val, &ms) != 0 || ms < 0 || ms > 600000) {
                snprintf(err, errlen, "delay must be a duration up to 10m (250ms, 2s)");
                return -1;
            }
            out->delay_ms = ms;
            out->delay_percent = pct;
            seen_delay = true;
        } else {
            snprintf(err, errlen, "unknown or repeated key \"%.*s\" (abort, delay)", (int)kl, a);
            return -1;
        }
        any = true;
    }
    if (!any) {
        snprintf(err, errlen, "empty");
        return -1;
    }
    return 0;
}

/* rnd's 32 bits -> hit with probability percent/100, without modulo bias. */
static bool fb_hit(uint32_t r, int percent)
{
    if (percent <= 0)
        return false;
    if (percent >= 100)
        return true;
    return ((uint64_t)r * 100) >> 32 < (uint64_t)percent;
}

void fb_fault_decide(const fb_fault_spec_t *s, uint64_t rnd, fb_fault_action_t *a)
{
    memset(a, 0, sizeof(*a));
    if (fb_hit((uint32_t)rnd, s->abort_percent)) {
        a->abort = true;
        a->status = s->abort_status;
    }
    if (s->delay_ms > 0 && fb_hit((uint32_t)(rnd >> 32), s->delay_percent))
        a->delay_ms = s->delay_ms;
}

fb_fault_rc_t fb_fault_for_request(const conf_fault_t *root, const conf_fault_t *model,
                                   const char *header, size_t hlen, bool admin_ok, uint64_t rnd,
                                   fb_fault_action_t *a, char *err, size_t errlen)
{
    fb_metrics_init();
    memset(a, 0, sizeof(*a));
    fb_fault_spec_t s;
    fb_fault_source_t src = FB_FAULT_FROM_CONF;
    if (header) {
        if (!admin_ok || !root->header) {
            snprintf(err, errlen, "%s needs a valid %s", FB_FAULT_HEADER, FB_FAULT_ADMIN_HEADER);
            return FB_FAULT_FORBIDDEN;
        }
        if (fb_fault_parse(header, hlen, &s, err, errlen) != 0)
            return FB_FAULT_BAD_HEADER;
        src = FB_FAULT_FROM_HEADER;
    } else {
        fb_fault_resolve(root, model, &s);
    }
    fb_fault_decide(&s, rnd, a);
    if (a->abort || a->delay_ms) {
        a->source = src;
        const char *sname = src == FB_FAULT_FROM_HEADER ? "header" : "conf";
        if (a->abort) {
            const char *l[2] = {"abort", sname};
            sl_counter_add(sl_metric_series(fb_m.faults, l), 1);
        }
        if (a->delay_ms) {
            const char *l[2] = {"delay", sname};
            sl_counter_add(sl_metric_series(fb_m.faults, l), 1);
        }
    }
    return FB_FAULT_OK;
}
