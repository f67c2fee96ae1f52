/* Unit tests of the bounded spares stack (common/spares.h): last given back is
 * first taken, at most SL_SPARES_MAX kept, the one past it refused (still the
 * caller's), and free empties it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/spares.h"

static void test_take_from_empty_is_null(void **state)
{
    (void)state;
    sl_spares_t s = {0};
    assert_null(sl_spares_take(&s));
    sl_spares_free(&s); /* nothing to free */
    assert_int_equal(s.n, 0);
}

static void test_last_kept_first_taken(void **state)
{
    (void)state;
    sl_spares_t s = {0};
    void *a = malloc(8), *b = malloc(8);
    assert_true(sl_spares_keep(&s, a));
    assert_true(sl_spares_keep(&s, b));
    assert_ptr_equal(sl_spares_take(&s), b);
    assert_ptr_equal(sl_spares_take(&s), a);
    assert_null(sl_spares_take(&s));
    free(a);
    free(b);
}

static void test_bounded_and_freed(void **state)
{
    (void)state;
    sl_spares_t s = {0};
    void *p[SL_SPARES_MAX + 1];
    for (size_t i = 0; i < SL_SPARES_MAX; i++) {
        p[i] = malloc(16);
        assert_true(sl_spares_keep(&s, p[i]));
    }
    /* the one past the bound is refused and stays the caller's */
    p[SL_SPARES_MAX] = malloc(16);
    assert_false(sl_spares_keep(&s, p[SL_SPARES_MAX]));
    assert_int_equal(s.n, SL_SPARES_MAX);
    free(p[SL_SPARES_MAX]);
    /* free releases all of them (ASan reports a leak otherwise) and empties it */
    sl_spares_free(&s);
    assert_int_equal(s.n, 0);
    assert_null(sl_spares_take(&s));
    void *q = malloc(16);
    assert_true(sl_spares_keep(&s, q));
    assert_ptr_equal(sl_spares_take(&s), q);
    free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_take_from_empty_is_null),
        cmocka_unit_test(test_last_kept_first_taken),
        cmocka_unit_test(test_bounded_and_freed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
