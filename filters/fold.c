/*
 * fold.c — UTF-8 helpers and the width folding that makes a fullwidth
 * "ＢＡＤ" match the word "bad". Words are folded once at load time
 * (flt_fold_word); answer and prompt text is folded character by character
 * as it arrives (flt_fold_char), keeping a map back to the original bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "filters/flt_internal.h"

/* Table lookups keep the automaton's inner loop branch-free. */
#define L4(x)  x, x + 1, x + 2, x + 3
#define L16(x) L4(x), L4(x + 4), L4(x + 8), L4(x + 12)
const unsigned char flt_lower[256] = {
    L16(0),   L16(16),  L16(32),  L16(48),  64,       L4('a'),  L4('e'),
    L4('i'),  L4('m'),  L4('q'),  L4('u'),  'y',      'z',      91,
    92,       93,       94,       95,       L16(96),  L16(112), L16(128),
    L16(144), L16(160), L16(176), L16(192), L16(208), L16(224), L16(240),
};
#undef L4
#undef L16

size_t flt_utf8_len(unsigned char lead)
{
    if (lead < 0xC0)
        return 1; /* ASCII, or a stray continuation byte */
    if (lead < 0xE0)
        return 2;
    if (lead < 0xF0)
        return 3;
    return 4;
}

int flt_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i = sl_ascii_end(s, i, n);
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* Code points = bytes - continuation bytes (10xxxxxx). Eight bytes a step:
 * a byte is a continuation when its bit 7 is set and its bit 6 is not
 * (x & ~(x << 1), bit 7 of each byte; the shift's carry into the next byte
 * lands on bit 0, masked off), summed by one multiply. The byte loop cost
 * ~6 instructions a byte on every message of every request (the length
 * filter counts characters). */
size_t flt_utf8_count(const char *s, size_t n)
{
    const uint64_t hi = 0x8080808080808080ull;
    size_t cont = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        uint64_t c = (x & ~(x << 1) & hi) >> 7;
        cont += (size_t)((c * 0x0101010101010101ull) >> 56);
    }
    for (; i < n; i++)
        cont += ((unsigned char)s[i] & 0xC0) == 0x80;
    return n - cont;
}

size_t flt_utf8_prefix(const char *s, size_t n, size_t max_cp)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (k == max_cp)
                return i;
            k++;
        }
    }
    return n;
}

size_t flt_fold_char(const unsigned char *s, size_t n, unsigned char out[4], size_t *used)
{
    size_t len = flt_utf8_len(s[0]);
    if (len > n)
        len = n;
    /* U+FF01..U+FF5E is EF BC 81..EF BC BF, EF BD 80..EF BD 9E. */
    if (len == 3 && s[0] == 0xEF && (s[1] == 0xBC || s[1] == 0xBD)) {
        uint32_t cp = 0xF000u | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        if (cp >= 0xFF01 && cp <= 0xFF5E) {
            out[0] = (unsigned char)(cp - 0xFEE0);
            *used = 3;
            return 1;
        }
    } else if (len == 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80) {
        out[0] = ' ';
        *used = 3;
        return 1;
    }
    memcpy(out, s, len);
    *used = len;
    return len;
}

/* Whether no character led by byte lead folds to something else (memchr:
 * most texts have no such lead byte at all). */
static bool fold_same_lead(const unsigned char *s, size_t n, unsigned char lead)
{
    const unsigned char *p = s, *end = s + n;
    while ((p = memchr(p, lead, (size_t)(end - p))) != NULL) {
        unsigned char tmp[4];
        size_t used, k = flt_fold_char(p, (size_t)(end - p), tmp, &used);
        if (k != used || memcmp(tmp, p, k) != 0)
            return false;
        p++;
    }
    return true;
}

bool flt_fold_same(const char *str, size_t n)
{
    /* the lead bytes of the forms that fold (flt_fold_char) */
    const unsigned char *s = (const unsigned char *)str;
    return fold_same_lead(s, n, 0xEF) && fold_same_lead(s, n, 0xE3);
}

size_t flt_fold_word(const char *str, size_t n, char *out, size_t cap)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned char tmp[4];
        size_t used;
        size_t k = flt_fold_char(s + i, n - i, tmp, &used);
        if (o + k > cap)
            return SIZE_MAX;
        for (size_t j = 0; j < k; j++)
            out[o++] = (char)flt_lower[tmp[j]];
        i += used;
    }
    return o;
}
