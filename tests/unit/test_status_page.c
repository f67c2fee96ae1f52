/* Unit test of the embedded status page (common/status_page.h): the array
 * linked into libsluice.a is byte for byte gateway/www/status.html (run from
 * the repository root, as `make unit` does), NUL-terminated, and the page is
 * self-contained: no external script, style, image or font reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status_page.h"

static void test_embedded_equals_source(void **state)
{
    (void)state;
    FILE *f = fopen("gateway/www/status.html", "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n > 1000);
    rewind(f);
    unsigned char *buf = malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    assert_int_equal(sl_status_page_len, (size_t)n);
    assert_memory_equal(sl_status_page, buf, (size_t)n);
    assert_int_equal(sl_status_page[sl_status_page_len], 0);
    free(buf);
}

static void test_self_contained(void **state)
{
    (void)state;
    const char *p = (const char *)sl_status_page;
    assert_int_equal(strlen(p), sl_status_page_len); /* no NUL inside */
    assert_true(strncmp(p, "<!DOCTYPE html>", 15) == 0);
    static const char *const banned[] = {"src=\"http", "href=\"http", "src=\"//",
                                         "href=\"//",  "url(http",    "url(//",
                                         "@import",    "<script src", "<link rel=\"stylesheet"};
    for (size_t i = 0; i < sizeof(banned) / sizeof(banned[0]); i++)
        if (strstr(p, banned[i]))
            fail_msg("the page refers to an external asset: %s", banned[i]);
    /* what it polls (docs/metrics.md) */
    assert_non_null(strstr(p, "\"/admin/state\""));
    assert_non_null(strstr(p, "\"/metrics\""));
    /* the favicon is inline, so the browser fetches nothing else */
    assert_non_null(strstr(p, "<link rel=\"icon\" href=\"data:,\">"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedded_equals_source),
        cmocka_unit_test(test_self_contained),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
