/*
 * Client address: trusted_proxies decide whether X-Forwarded-For is read;
 * the right-most address that is not a trusted proxy is the client.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>

#include "ratelimit/ratelimit.h"

static rl_proxies_t *mk(void)
{
    const char *cidrs[] = {"10.0.0.0/8", "192.168.1.7", "fd00::/8", "172.16.0.0/12"};
    char err[128];
    rl_proxies_t *p = rl_proxies_new(cidrs, 4, err, sizeof(err));
    assert_non_null(p);
    return p;
}

static void expect(const rl_proxies_t *p, const char *peer, const char *xff, const char *want)
{
    char out[64];
    if (rl_client_ip(p, peer, xff, out, sizeof(out)) != 0)
        fail_msg("peer %s refused", peer);
    if (strcmp(out, want) != 0)
        fail_msg("peer %s xff \"%s\": got %s, want %s", peer, xff ? xff : "(null)", out, want);
}

static void test_cidrs(void **state)
{
    (void)state;
    rl_proxies_t *p = mk();
    assert_true(rl_proxies_contains(p, "10.255.0.1"));
    assert_false(rl_proxies_contains(p, "11.0.0.1"));
    assert_true(rl_proxies_contains(p, "192.168.1.7"));
    assert_false(rl_proxies_contains(p, "192.168.1.8"));
    assert_true(rl_proxies_contains(p, "172.31.255.255"));
    assert_false(rl_proxies_contains(p, "172.32.0.0"));
    assert_true(rl_proxies_contains(p, "fd12::1"));
    assert_false(rl_proxies_contains(p, "fe80::1"));
    assert_true(rl_proxies_contains(p, "::ffff:10.1.1.1")); /* mapped v4 */
    assert_false(rl_proxies_contains(p, "garbage"));
    rl_proxies_free(p);
    const char *bad[] = {"10.0.0.0/33", "fd00::/129", "10.0.0.0/", "x/8", "10.0.0.0/8x", ""};
    char err[128];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = rl_proxies_new(&bad[i], 1, err, sizeof(err));
        if (p)
            fail_msg("accepted %s", bad[i]);
    }
    p = rl_proxies_new(NULL, 0, err, sizeof(err)); /* an empty list trusts nobody */
    assert_non_null(p);
    expect(p, "10.0.0.1", "1.2.3.4", "10.0.0.1");
    rl_proxies_free(p);
}

static void test_xff(void **state)
{
    (void)state;
    rl_proxies_t *p = mk();
    /* an untrusted peer's header proves nothing */
    expect(p, "203.0.113.9", "1.2.3.4", "203.0.113.9");
    /* a trusted peer: the address it appended */
    expect(p, "10.0.0.1", "1.2.3.4", "1.2.3.4");
    /* a client-forged entry on the left is ignored: right-most untrusted wins */
    expect(p, "10.0.0.1", "6.6.6.6, 1.2.3.4", "1.2.3.4");
    /* through two proxies */
    expect(p, "10.0.0.1", "6.6.6.6,1.2.3.4, 10.9.9.9", "1.2.3.4");
    expect(p, "10.0.0.1", "6.6.6.6, 1.2.3.4,10.9.9.9,192.168.1.7", "1.2.3.4");
    /* every hop trusted: the left-most */
    expect(p, "10.0.0.1", "10.1.1.1, 10.2.2.2", "10.1.1.1");
    /* garbage where an address should be: the last trusted hop */
    expect(p, "10.0.0.1", "1.2.3.4, unknown, 10.2.2.2", "10.2.2.2");
    expect(p, "10.0.0.1", "nonsense", "10.0.0.1");
    /* empty, blank and missing */
    expect(p, "10.0.0.1", "", "10.0.0.1");
    expect(p, "10.0.0.1", " , ", "10.0.0.1");
    expect(p, "10.0.0.1", NULL, "10.0.0.1");
    /* IPv6, brackets, mapped v4 */
    expect(p, "fd00::1", "2001:db8::5", "2001:db8::5");
    expect(p, "fd00::1", "[2001:db8::6]", "2001:db8::6");
    expect(p, "::ffff:10.0.0.1", "::ffff:198.51.100.4", "198.51.100.4");
    expect(p, "::ffff:203.0.113.1", NULL, "203.0.113.1");
    /* the peer must be an address */
    char out[64];
    assert_int_equal(rl_client_ip(p, "not-an-ip", NULL, out, sizeof(out)), -1);
    assert_int_equal(rl_client_ip(p, NULL, NULL, out, sizeof(out)), -1);
    rl_proxies_free(p);
}

/* IPv4 is formatted without inet_ntop: the same text for every octet
 * value in every position, mapped IPv6 included. */
static void test_ipv4_format(void **state)
{
    (void)state;
    for (unsigned v = 0; v < 256; v++) {
        unsigned char a[4] = {(unsigned char)v, (unsigned char)(255 - v), (unsigned char)(v / 3),
                              (unsigned char)(v * 7)};
        for (int rot = 0; rot < 4; rot++) {
            unsigned char b[4];
            for (int k = 0; k < 4; k++)
                b[k] = a[(k + rot) % 4];
            char want[INET_ADDRSTRLEN], mapped[64];
            assert_non_null(inet_ntop(AF_INET, b, want, sizeof(want)));
            expect(NULL, want, NULL, want);
            snprintf(mapped, sizeof(mapped), "::ffff:%s", want);
            expect(NULL, mapped, NULL, want);
        }
    }
    expect(NULL, "2001:db8::1", NULL, "2001:db8::1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cidrs),
        cmocka_unit_test(test_xff),
        cmocka_unit_test(test_ipv4_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
