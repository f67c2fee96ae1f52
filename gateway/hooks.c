/*
 * hooks.c — the hook chain driver (see gw_hook.h): runs the adapters'
 * callbacks in order, keeps each one's per-request state, and guarantees
 * on_end exactly once for every hook whose on_request ran.
 */
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_hook.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_types.h"

const gw_hook_t *const gw_hooks[] = {
    &gw_hook_auth,
    &gw_hook_filters,
    &gw_hook_ratelimit,
    &gw_hook_fallback,
};
const size_t gw_nhooks = sizeof(gw_hooks) / sizeof(gw_hooks[0]);

int gw_payloads_push(gw_payloads_t *p, char *data, size_t len)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 4;
        char **d = realloc(p->data, cap * sizeof(*d));
        if (!d) {
            free(data);
            return -1;
        }
        p->data = d;
        size_t *l = realloc(p->len, cap * sizeof(*l));
        if (!l) {
            free(data);
            return -1;
        }
        p->len = l;
        p->cap = cap;
    }
    p->data[p->n] = data;
    p->len[p->n] = len;
    p->n++;
    return 0;
}

int gw_payloads_push_copy(gw_payloads_t *p, const char *data, size_t len)
{
    char *c = malloc(len + 1);
    if (!c)
        return -1;
    memcpy(c, data, len);
    c[len] = '\0';
    return gw_payloads_push(p, c, len);
}

void gw_payloads_clear(gw_payloads_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->data[i]);
    free(p->data);
    free(p->len);
    memset(p, 0, sizeof(*p));
}

gw_hook_rc_t gw_hooks_run(gw_req_t *r, bool pre_route)
{
    gw_hooks_req_t *h = &r->hooks;
    while (h->next < gw_nhooks) {
        size_t i = h->next;
        const gw_hook_t *hk = gw_hooks[i];
        if (hk->pre_route != pre_route) {
            if (pre_route)
                break; /* the pre-route hooks come first in the table */
            h->next++;
            continue;
        }
        h->next++;
        if (!hk->on_request)
            continue;
        h->ran |= 1u << i;
        gw_hook_rc_t rc = hk->on_request(r, &h->state[i]);
        if (rc == GW_HOOK_PENDING) {
            h->pending = (int)i;
            return rc;
        }
        if (rc == GW_HOOK_DONE)
            return rc;
    }
    if (pre_route) {
        h->pre_done = true;
        /* skip to the first post-route hook */
        h->next = 0;
        while (h->next < gw_nhooks && gw_hooks[h->next]->pre_route)
            h->next++;
    }
    return GW_HOOK_NEXT;
}

void gw_hook_resume(gw_req_t *r, gw_hook_rc_t rc)
{
    r->hooks.pending = -1;
    if (rc == GW_HOOK_DONE)
        return;
    gw_proxy_resume(r);
}

void gw_hooks_cancel(gw_req_t *r)
{
    int i = r->hooks.pending;
    if (i < 0)
        return;
    r->hooks.pending = -1;
    if (gw_hooks[i]->on_cancel)
        gw_hooks[i]->on_cancel(r, r->hooks.state[i]);
}

void gw_hooks_headers(gw_req_t *r, struct evbuffer *out)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if ((r->hooks.ran & (1u << i)) && gw_hooks[i]->on_headers)
            gw_hooks[i]->on_headers(r, r->hooks.state[i], out);
}

bool gw_hooks_want_events(const gw_req_t *r)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if ((r->hooks.ran & (1u << i)) && gw_hooks[i]->on_event && r->hooks.state[i])
            return true;
    return false;
}

bool gw_hooks_want_body(const gw_req_t *r)
{
    for (size_t i = 0; i < gw_nhooks; i++) {
        const gw_hook_t *hk = gw_hooks[i];
        if ((r->hooks.ran & (1u << i)) && hk->on_body && r->hooks.state[i] &&
            (!hk->wants_body || hk->wants_body(r, r->hooks.state[i])))
            return true;
    }
    return false;
}

gw_ev_rc_t gw_hooks_event(gw_req_t *r, const char *data, size_t len, gw_payloads_t *out)
{
    /* cur holds the payloads between hooks; NULL data means "the original,
     * unchanged" so a chain of PASSes copies nothing. */
    gw_payloads_t cur = {0};
    bool changed = false;
    gw_ev_rc_t result = GW_EV_PASS;
    for (size_t i = 0; i < gw_nhooks; i++) {
        const gw_hook_t *hk = gw_hooks[i];
        if (!(r->hooks.ran & (1u << i)) || !hk->on_event || !r->hooks.state[i])
            continue;
        gw_payloads_t next = {0};
        size_t n = changed ? cur.n : 1;
        for (size_t k = 0; k < n; k++) {
            const char *d = changed ? cur.data[k] : data;
            size_t l = changed ? cur.len[k] : len;
            gw_payloads_t o = {0};
            gw_ev_rc_t rc = hk->on_event(r, r->hooks.state[i], d, l, &o);
            if (rc == GW_EV_PASS) {
                if (gw_payloads_push_copy(&next, d, l) != 0)
                    rc = GW_EV_STOP;
            } else {
                for (size_t j = 0; j < o.n; j++) {
                    gw_payloads_push(&next, o.data[j], o.len[j]);
                    o.data[j] = NULL;
                }
                changed = true;
            }
            gw_payloads_clear(&o);
            if (rc == GW_EV_STOP) {
                result = GW_EV_STOP;
                break;
            }
            if (rc == GW_EV_REPLACE)
                result = GW_EV_REPLACE;
        }
        gw_payloads_clear(&cur);
        cur = next;
        if (!changed) {
            /* Still the original: drop the copy we made. */
            gw_payloads_clear(&cur);
        }
        if (result == GW_EV_STOP)
            break;
    }
    if (!changed) {
        gw_payloads_clear(&cur);
        return result == GW_EV_STOP ? GW_EV_STOP : GW_EV_PASS;
    }
    *out = cur;
    return result == GW_EV_STOP ? GW_EV_STOP : GW_EV_REPLACE;
}

int gw_hooks_body(gw_req_t *r, json_t *body, bool *modified)
{
    for (size_t i = 0; i < gw_nhooks; i++) {
        if (!(r->hooks.ran & (1u << i)) || !gw_hooks[i]->on_body || !r->hooks.state[i])
            continue;
        if (gw_hooks[i]->on_body(r, r->hooks.state[i], body, modified) != 0)
            return -1;
    }
    return 0;
}

void gw_hooks_end(gw_req_t *r, gw_end_t how)
{
    if (r->hooks.ended)
        return;
    r->hooks.ended = true;
    gw_hooks_cancel(r);
    for (size_t i = 0; i < gw_nhooks; i++)
        if ((r->hooks.ran & (1u << i)) && gw_hooks[i]->on_end)
            gw_hooks[i]->on_end(r, r->hooks.state[i], how);
}
