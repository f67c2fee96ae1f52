/*
 * gw_fallback.h — the fallback chain as the proxy sees it (hook_fallback.c:
 * retry, the local tier, templates, the queue; resend.c: the resender and
 * the process/worker state of the queue and idempotency stores).
 */
#ifndef GW_FALLBACK_H
#define GW_FALLBACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "fallback/fallback.h"
#include "gateway/gw_types.h"

/* hook_fallback.c: the chain after an attempt failed with nothing sent to
 * the client. failure: fb_failure_t; status: the upstream's (or injected)
 * status for FB_FAIL_STATUS. Returns true when the chain took the request
 * over (a retry, the local tier, a template); false: the caller answers
 * with its error (or relays the upstream's 5xx). */
bool gw_fb_after_failure(gw_req_t *r, int failure, int status);
/* The same in two steps, for a 5xx answer that is relayed when the chain
 * has nothing better: what the chain would do (GW_FB_NONE: nothing; a
 * retry takes its budget here), then do it. */
enum {
    GW_FB_NONE = 0,
    GW_FB_RETRY,
    GW_FB_RETRY_ELSEWHERE,
    GW_FB_MAIN,
    GW_FB_LOCAL,
    GW_FB_TEMPLATE
};
int gw_fb_decide(gw_req_t *r, int failure, int status, int64_t *delay_ms);
void gw_fb_apply(gw_req_t *r, int action, int64_t delay_ms);
/* The attempt's end for its breaker: 1 ok, 0 failed, -1 cancelled. */
void gw_fb_attempt_end(gw_req_t *r, int outcome);
/* The retry hints of an error answer sluice sends after the chain gave up
 * (5xx), as header lines into buf: "x-should-retry: false" when sluice
 * already retried or fell back (a client's retry would repeat that work at
 * once), and "Retry-After" (seconds, rounded up) plus "retry-after-ms"
 * when every server of the pool waits on its breaker (the shortest wait).
 * The openai SDKs read all three. Returns buf ("" when none). */
const char *gw_fb_retry_headers(const gw_req_t *r, char *buf, size_t n);
/* GET /v1/requests/{id}, after the pre-route hooks. */
void gw_fb_requests_route(gw_req_t *r);
/* Per worker: queue and idempotency handles, and worker 0's resender. */
int gw_fb_worker_init(gw_worker_t *w);
void gw_fb_worker_fini(gw_worker_t *w);
/* Process: the queue and idempotency stores (NULL-safe when off). */
int gw_fb_server_init(gw_server_t *s, const conf_t *c, char *err, size_t errlen);
void gw_fb_server_fini(gw_server_t *s);
/* The journal accept thread: the client left (the accept completes anyway);
 * shutdown (after the workers stopped, before their mailboxes close). */
void gw_fb_queue_thread_stop(void);
/* Once a second on the main thread: queue maintenance. */
void gw_fb_maintain(gw_server_t *s);
/* Before rendering /metrics: refresh breaker gauges. */
void gw_fb_metrics_refresh(gw_server_t *s);

/* fallback_journal.c: stores r (body: its re-serialised request, taken) in
 * the journal on the journal thread; r waits (its wait slot) until done(r,
 * res) runs on its worker. -1: not queued (body freed, r not waiting). */
int gw_fb_journal_accept(gw_req_t *r, const char *key, char *body,
                         void (*done)(void *r, fb_qres_t *res));

#endif
