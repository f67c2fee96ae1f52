/*
 * hooks.c — the hook chain driver (see gw_hook.h): runs the adapters'
 * callbacks in order, keeps each one's per-request state, and guarantees
 * on_end exactly once for every hook whose on_request ran.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_hook.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_req.h"
#include "gateway/gw_types.h"

#define GW_HOOK_INDEX(name, when) GW_HOOK_I_##name,
enum { GW_HOOK_TABLE(GW_HOOK_INDEX) GW_HOOK_COUNT };
/* Bit i set: hook i runs before routing. The pre-route hooks come first
 * when the set bits are the low ones, i.e. the mask is 2^k - 1. */
#define GW_HOOK_PRE_BIT(name, when) | ((when) << GW_HOOK_I_##name)
enum { GW_HOOK_PRE_MASK = 0 GW_HOOK_TABLE(GW_HOOK_PRE_BIT) };
_Static_assert(GW_HOOK_COUNT <= GW_MAX_HOOKS, "more hooks than GW_MAX_HOOKS");
_Static_assert(GW_MAX_HOOKS <= sizeof(unsigned) * 8, "gw_hooks_req_t.ran is a bit per hook");
_Static_assert((GW_HOOK_PRE_MASK & (GW_HOOK_PRE_MASK + 1)) == 0,
               "pre-route hooks must come first in GW_HOOK_TABLE");

#define GW_HOOK_PTR(name, when) &gw_hook_##name,
const gw_hook_t *const gw_hooks[] = {GW_HOOK_TABLE(GW_HOOK_PTR)};
#define GW_HOOK_PRE(name, when) (when) == GW_HOOK_PRE_ROUTE,
const bool gw_hook_pre_route[] = {GW_HOOK_TABLE(GW_HOOK_PRE)};
const size_t gw_nhooks = GW_HOOK_COUNT;
_Static_assert(sizeof(gw_hooks) / sizeof(gw_hooks[0]) == GW_HOOK_COUNT, "hook table size");

int gw_hook_index(const gw_hook_t *h)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks[i] == h)
            return (int)i;
    return -1;
}

/* ---- lifecycle ------------------------------------------------------------ */

int gw_hooks_check(const conf_t *c, char *err, size_t errlen)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks[i]->check && gw_hooks[i]->check(c, err, errlen) != 0)
            return -1;
    return 0;
}

int gw_hooks_rt_build(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks[i]->rt_build && gw_hooks[i]->rt_build(rt, sh, err, errlen) != 0)
            return -1; /* the caller frees rt: every rt_free runs */
    return 0;
}

void gw_hooks_rt_free(gw_rt_t *rt)
{
    for (size_t i = gw_nhooks; i-- > 0;)
        if (gw_hooks[i]->rt_free)
            gw_hooks[i]->rt_free(rt);
}

int gw_hooks_process_init(gw_server_t *s, const conf_t *c, char *err, size_t errlen)
{
    for (size_t i = 0; i < gw_nhooks; i++) {
        if (!gw_hooks[i]->process_init)
            continue;
        char e[768];
        if (gw_hooks[i]->process_init(s, c, e, sizeof(e)) != 0) {
            snprintf(err, errlen, "%s: %s", gw_hooks[i]->name, e);
            return -1;
        }
    }
    return 0;
}

void gw_hooks_process_stop(gw_server_t *s)
{
    for (size_t i = gw_nhooks; i-- > 0;)
        if (gw_hooks[i]->process_stop)
            gw_hooks[i]->process_stop(s);
}

void gw_hooks_process_fini(gw_server_t *s)
{
    for (size_t i = gw_nhooks; i-- > 0;)
        if (gw_hooks[i]->process_fini)
            gw_hooks[i]->process_fini(s);
}

void gw_hooks_tick(gw_server_t *s)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks[i]->tick)
            gw_hooks[i]->tick(s);
}

void gw_hooks_metrics(gw_server_t *s)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks[i]->metrics)
            gw_hooks[i]->metrics(s);
}

int gw_hooks_worker_init(gw_worker_t *w)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks[i]->worker_init && gw_hooks[i]->worker_init(w) != 0)
            return -1;
    return 0;
}

void gw_hooks_worker_fini(gw_worker_t *w)
{
    for (size_t i = gw_nhooks; i-- > 0;)
        if (gw_hooks[i]->worker_fini)
            gw_hooks[i]->worker_fini(w);
}

void gw_hooks_worker_tick(gw_worker_t *w, bool all)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks[i]->worker_tick)
            gw_hooks[i]->worker_tick(w, all);
}

/* ---- the request ---------------------------------------------------------- */

int gw_payloads_push(gw_payloads_t *p, char *data, size_t len)
{
    if (p->n == (p->ext ? p->cap : GW_PAYLOADS_INLINE)) {
        size_t cap = 2 * p->n;
        gw_payload_t *v = realloc(p->ext, cap * sizeof(*v));
        if (!v) {
            free(data);
            return -1;
        }
        if (!p->ext)
            memcpy(v, p->in, sizeof(p->in));
        p->ext = v;
        p->cap = cap;
    }
    *gw_payloads_at(p, p->n++) = (gw_payload_t){data, len};
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

void gw_payloads_free(gw_payloads_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(gw_payloads_at(p, i)->data);
    free(p->ext);
    gw_payloads_init(p);
}

/* The request's wait slot while a hook is pending. */
static void gw_hooks_wait_cancel(gw_req_t *r, void *arg)
{
    (void)arg;
    gw_hooks_cancel(r);
}

gw_hook_rc_t gw_hooks_run(gw_req_t *r, bool pre_route)
{
    gw_hooks_req_t *h = &r->hooks;
    while (h->next < gw_nhooks) {
        size_t i = h->next;
        const gw_hook_t *hk = gw_hooks[i];
        if (gw_hook_pre_route[i] != pre_route) {
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
            gw_req_wait(r, gw_hooks_wait_cancel, NULL);
            return rc;
        }
        if (rc == GW_HOOK_DONE)
            return rc;
    }
    if (pre_route) {
        h->pre_done = true;
        /* skip to the first post-route hook */
        h->next = 0;
        while (h->next < gw_nhooks && gw_hook_pre_route[h->next])
            h->next++;
    }
    return GW_HOOK_NEXT;
}

void gw_hook_resume(gw_req_t *r, gw_hook_rc_t rc)
{
    r->hooks.pending = -1;
    gw_req_wait_done(r);
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
    if (r->wait.cancel == gw_hooks_wait_cancel)
        gw_req_wait_done(r);
    if (gw_hooks[i]->on_cancel)
        gw_hooks[i]->on_cancel(r, r->hooks.state[i]);
}

void gw_hooks_headers(gw_req_t *r, gw_sb_t *head)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if ((r->hooks.ran & (1u << i)) && gw_hooks[i]->on_headers)
            gw_hooks[i]->on_headers(r, r->hooks.state[i], head);
}

bool gw_hooks_events_begin(gw_req_t *r)
{
    gw_hooks_req_t *h = &r->hooks;
    h->nev = h->nans = 0;
    for (size_t i = 0; i < gw_nhooks; i++) {
        const gw_hook_t *hk = gw_hooks[i];
        void *st = h->state[i];
        if (!(h->ran & (1u << i)) || !st)
            continue;
        if (hk->on_answer)
            h->ans[h->nans++] = (unsigned char)i;
        if (hk->on_event && (!hk->wants_events || hk->wants_events(r, st)))
            h->ev[h->nev++] = (unsigned char)i;
    }
    return h->nev > 0 || h->nans > 0;
}

/* Whether hook i reads this request's whole answer (inline: asked of
 * every hook of every request). */
static inline __attribute__((always_inline)) bool gw_hooks_reads_body(const gw_req_t *r, size_t i)
{
    const gw_hook_t *hk = gw_hooks[i];
    return (r->hooks.ran & (1u << i)) && (hk->on_body || hk->on_answer) && r->hooks.state[i] &&
           (!hk->wants_body || hk->wants_body(r, r->hooks.state[i]));
}

bool gw_hooks_want_body(const gw_req_t *r)
{
    for (unsigned ran = r->hooks.ran; ran; ran &= ran - 1) /* the hooks that ran */
        if (gw_hooks_reads_body(r, (size_t)__builtin_ctz(ran)))
            return true;
    return false;
}

/* The chain from hook list entry k on, after an earlier hook changed the
 * event: cur (taken over) holds its payloads, each handed through the rest
 * in turn; result is what the chain says so far (REPLACE). */
static gw_ev_rc_t gw_hooks_event_rest(gw_req_t *r, unsigned k, gw_payloads_t *cur,
                                      gw_payloads_t *out)
{
    gw_hooks_req_t *h = &r->hooks;
    gw_ev_rc_t result = GW_EV_REPLACE;
    for (; k < h->nev && result != GW_EV_STOP; k++) {
        size_t i = h->ev[k];
        const gw_hook_t *hk = gw_hooks[i];
        gw_payloads_t next;
        gw_payloads_init(&next);
        for (size_t j = 0; j < cur->n; j++) {
            gw_payload_t *p = gw_payloads_at(cur, j);
            gw_payloads_t o;
            gw_payloads_init(&o);
            gw_ev_rc_t rc = hk->on_event(r, h->state[i], p->data, p->len, &o);
            if (rc == GW_EV_PASS) {
                /* carried on, moved (cur's entry gives it up), not copied */
                char *d = p->data;
                p->data = NULL;
                if (gw_payloads_push(&next, d, p->len) != 0)
                    rc = GW_EV_STOP;   /* d was freed */
                gw_payloads_clear(&o); /* a PASS pushes nothing: never sent */
            } else if (next.n == 0) {
                gw_payloads_clear(&next);
                next = o; /* the usual case: moved whole, no copy */
            } else {
                for (size_t q = 0; q < o.n; q++)
                    gw_payloads_push(&next, gw_payloads_at(&o, q)->data,
                                     gw_payloads_at(&o, q)->len);
                o.n = 0; /* moved (a failed push freed its payload) */
                gw_payloads_clear(&o);
            }
            if (rc == GW_EV_STOP) {
                result = GW_EV_STOP;
                break;
            }
        }
        gw_payloads_clear(cur);
        *cur = next;
    }
    *out = *cur;
    return result;
}

gw_ev_rc_t gw_hooks_event(gw_req_t *r, const char *data, size_t len, gw_payloads_t *out)
{
    gw_hooks_req_t *h = &r->hooks;
    for (unsigned k = 0; k < h->nans; k++) { /* in table order */
        size_t i = h->ans[k];
        gw_hooks[i]->on_answer(r, h->state[i], data, len, NULL);
    }
    /* The usual event: every hook passes the original, so no list is built
     * or handed on; the first hook that changes it hands its payloads to
     * the rest of the chain (gw_hooks_event_rest). */
    gw_payloads_t o;
    gw_payloads_init(&o);
    for (unsigned k = 0; k < h->nev; k++) {
        size_t i = h->ev[k];
        gw_ev_rc_t rc = gw_hooks[i]->on_event(r, h->state[i], data, len, &o);
        if (rc == GW_EV_STOP) {
            *out = o;
            return GW_EV_STOP;
        }
        if (rc == GW_EV_REPLACE)
            return gw_hooks_event_rest(r, k + 1, &o, out);
        gw_payloads_clear(&o); /* a PASS pushes nothing: never sent */
    }
    return GW_EV_PASS;
}

int gw_hooks_body(gw_req_t *r, json_t *body, bool *modified)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if ((r->hooks.ran & (1u << i)) && gw_hooks[i]->on_answer && r->hooks.state[i])
            gw_hooks[i]->on_answer(r, r->hooks.state[i], NULL, 0, body);
    for (size_t i = 0; i < gw_nhooks; i++) {
        if (!(r->hooks.ran & (1u << i)) || !gw_hooks[i]->on_body || !r->hooks.state[i])
            continue;
        if (gw_hooks[i]->on_body(r, r->hooks.state[i], body, modified) != 0)
            return -1;
    }
    return 0;
}

/* 0 done, 1 some hook needs the tree (nothing was done), -1 refused. */
static int gw_hooks_body_raw(gw_req_t *r, const char *data, size_t len, char **edited, size_t *elen)
{
    for (size_t i = 0; i < gw_nhooks; i++)
        if (gw_hooks_reads_body(r, i) && (gw_hooks[i]->on_answer || !gw_hooks[i]->on_body_raw))
            return 1; /* a recorder sees the tree as it came; others only know trees */
    const char *cur = data;
    size_t curlen = len;
    for (size_t i = 0; i < gw_nhooks; i++) {
        if (!gw_hooks_reads_body(r, i))
            continue;
        char *o = NULL;
        size_t olen = 0;
        int rc = gw_hooks[i]->on_body_raw(r, r->hooks.state[i], cur, curlen, &o, &olen);
        if (rc == 1 && cur == data)
            return 1; /* still the answer as it came: the tree path from here */
        if (rc != 0) {
            /* a refusal, or a tree wanted after another hook's edit */
            free(o);
            free(*edited);
            *edited = NULL;
            return -1;
        }
        if (o) {
            free(*edited);
            *edited = o;
            *elen = olen;
            cur = o;
            curlen = olen;
        }
    }
    return 0;
}

int gw_hooks_body_bytes(gw_req_t *r, const char *data, size_t len, char **edited, size_t *elen)
{
    *edited = NULL;
    *elen = 0;
    int rc = gw_hooks_body_raw(r, data, len, edited, elen);
    if (rc != 1)
        return rc;
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!j)
        return 0; /* not JSON: relayed as it came */
    bool modified = false;
    rc = gw_hooks_body(r, j, &modified);
    if (rc == 0 && modified) {
        *edited = json_dumps(j, JSON_COMPACT);
        *elen = *edited ? strlen(*edited) : 0;
        if (!*edited)
            rc = -1; /* never the unfiltered answer instead */
    }
    json_decref(j);
    return rc;
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
