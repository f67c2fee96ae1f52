/* Unit tests of the runtime's server URLs (issue 12, item 1): the runtime
 * takes the conf loader's parse (scheme, host, port, base path) instead of
 * its own, so a URL with a base path builds; the Host header keeps the
 * upstream's host; a client's /v1/REST maps to BASE/REST and nothing outside
 * /v1/ maps at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"
#include "conf/conf.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"

static gw_rt_t *build(const char *urls, gw_shared_t **sh)
{
    static bool metrics_done;
    if (!metrics_done) {
        gw_metrics_init(gw_route_name);
        metrics_done = true;
    }
    sl_log_set_level(SL_LOG_ERROR);
    char yaml[1024];
    snprintf(yaml, sizeof(yaml),
             "listen:\n  - address: 127.0.0.1:8080\n"
             "upstreams:\n  main:\n    servers: [ %s ]\n"
             "models:\n  chat-model: { upstream: main }\n"
             "log: { access: off }\n",
             urls);
    char err[512] = "";
    conf_t *c = conf_load_string(yaml, strlen(yaml), "test", err, sizeof(err));
    if (!c)
        fail_msg("conf: %s", err);
    *sh = gw_shared_new();
    gw_rt_t *rt = gw_rt_new(c, *sh, err, sizeof(err));
    if (!rt)
        fail_msg("runtime: %s", err);
    return rt;
}

static void test_base_paths(void **state)
{
    (void)state;
    gw_shared_t *sh = NULL;
    gw_rt_t *rt = build("{ url: \"http://127.0.0.1:8000\" }, "
                        "{ url: \"http://127.0.0.1:8001/\" }, "
                        "{ url: \"http://127.0.0.1:8002/openai/v1/\" }, "
                        "{ url: \"http://[::1]/api\" }",
                        &sh);
    assert_int_equal(rt->nservers, 4);
    const char *want_base[4] = {"/v1", "/v1", "/openai/v1", "/api"};
    const char *want_host[4] = {"127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002", "[::1]"};
    const int want_port[4] = {8000, 8001, 8002, 80};
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(rt->servers[i].base_path, want_base[i]);
        assert_string_equal(rt->servers[i].host_header, want_host[i]);
        assert_int_equal(rt->servers[i].port, want_port[i]);
        assert_false(rt->servers[i].https);
    }
    assert_string_equal(rt->servers[3].host, "::1");
    gw_rt_unref(rt);
    gw_shared_free(sh);
}

static void test_v1_rest(void **state)
{
    (void)state;
    static const char t1[] = "/v1/chat/completions?x=1";
    const char *rest = gw_rt_v1_rest(t1, sizeof(t1) - 1);
    assert_non_null(rest);
    assert_string_equal(rest, "/chat/completions?x=1");
    static const char *const outside[] = {
        "/v1", "/v2/chat/completions", "/openai/v1/chat", "/chat/completions", "/v1x/chat", ""};
    for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++)
        assert_null(gw_rt_v1_rest(outside[i], strlen(outside[i])));
    /* counted, not NUL-terminated: "/v1/" past the length is not seen */
    assert_null(gw_rt_v1_rest("/v1/embeddings", 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_paths),
        cmocka_unit_test(test_v1_rest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
