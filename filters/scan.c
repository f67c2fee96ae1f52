/*
 * scan.c — the text channel: one stream of text (a choice of a streamed
 * answer, or one prompt message) run through the word automaton and the
 * regexes, releasing text as soon as it can no longer be part of a match.
 *
 * Text arrives in pieces. Each piece is appended to two buffers: the
 * original bytes not yet released (ob) and a width-folded copy (fb) with a
 * map from every folded byte back to its original offset (fmap). Then:
 *  - the automaton steps over the new folded bytes; each word ending there
 *    is a hit (block: stop; mask: remember the range; log: count);
 *  - each regex searches from where its last search stopped (rstart) with
 *    PCRE2_PARTIAL_HARD: a complete match found that way cannot change when
 *    more text comes; a partial match leaves rstart at its start; no match
 *    moves rstart to the end;
 *  - the release point R is the smallest of (end - automaton depth) and
 *    every rstart: no future match can start before R, so everything before
 *    it is final and goes out, masks applied. R is a character boundary
 *    because matches start on one. Overlapping matches merge into one mask.
 * At the end of the text the regexes run once more without partial
 * matching and everything is released. Feeding the same text in any split
 * gives the same output (the fuzz target checks it).
 *
 * Bounded: at most rs->holdback_max original bytes stay held; past that the
 * oldest text is released anyway and the regexes restart after it (counted
 * in sluice_filter_holdback_forced_total). The folded window keeps only what
 * the regexes still need (their scan point minus the longest lookbehind).
 */
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SCAN_X86 1
#endif

#include "filters/flt_internal.h"

static bool scan_ascii(const unsigned char *u, size_t n);
static size_t re_next(const flt_ruleset_t *rs, const unsigned char *u, size_t i, size_t n);

static size_t chan_nregex(const flt_chan_t *c)
{
    return c->rs->nrules - c->rs->first_regex;
}

int flt_chan_init(flt_chan_t *c, const flt_ruleset_t *rs)
{
    memset(c, 0, sizeof *c);
    c->rs = rs;
    c->block_rule = -1;
    size_t nre = chan_nregex(c);
    if (nre) {
        /* the match data is made at the first search (chan_regex): most
         * channels of a stream never run one (chan_feed_clean) */
        c->rstart = calloc(nre, sizeof *c->rstart);
        if (!c->rstart) {
            flt_chan_fini(c);
            return -1;
        }
        c->nrstart = nre;
    }
    return 0;
}

void flt_chan_recycle(flt_chan_t *c)
{
    flt_chan_t k = {.md = c->md, .rstart = c->rstart, .nrstart = c->nrstart, .block_rule = -1};
    if (c->fcap <= FLT_CHAN_KEEP) {
        k.fb = c->fb, k.fmap = c->fmap, k.fcap = c->fcap;
    } else {
        free(c->fb);
        free(c->fmap);
    }
    if (c->ocap <= FLT_CHAN_KEEP) {
        k.ob = c->ob, k.ocap = c->ocap;
    } else {
        free(c->ob);
    }
    if (c->rgcap <= FLT_CHAN_KEEP / sizeof *c->rg) {
        k.rg = c->rg, k.rgcap = c->rgcap;
    } else {
        free(c->rg);
    }
    *c = k; /* every other field as a new channel's: nothing of the last text */
}

int flt_chan_rearm(flt_chan_t *c, const flt_ruleset_t *rs)
{
    c->rs = rs;
    size_t nre = chan_nregex(c);
    if (nre != c->nrstart) { /* another ruleset (a reload) */
        free(c->rstart);
        c->rstart = nre ? calloc(nre, sizeof *c->rstart) : NULL;
        c->nrstart = c->rstart ? nre : 0;
        if (nre && !c->rstart) {
            flt_chan_fini(c);
            return -1;
        }
    } else if (nre) {
        memset(c->rstart, 0, nre * sizeof *c->rstart);
    }
    return 0;
}

void flt_chan_fini(flt_chan_t *c)
{
    pcre2_match_data_free(c->md);
    free(c->rstart);
    free(c->fb);
    free(c->fmap);
    free(c->ob);
    free(c->rg);
    memset(c, 0, sizeof *c);
    c->block_rule = -1;
}

size_t flt_chan_held(const flt_chan_t *c)
{
    return c->olen;
}

static inline size_t chan_fend(const flt_chan_t *c)
{
    return c->fstart + c->flen;
}

/* Original offset of folded offset f (f in [fstart, fend]). */
static inline size_t chan_map(const flt_chan_t *c, size_t f)
{
    return f >= chan_fend(c) ? c->ostart + c->olen : c->fmap[f - c->fstart];
}

/* Room in the folded window for n more bytes. */
static int chan_fgrow(flt_chan_t *c, size_t n)
{
    if (c->flen + n <= c->fcap)
        return 0;
    size_t cap = c->fcap ? c->fcap : 256;
    while (cap < c->flen + n)
        cap *= 2;
    unsigned char *p = realloc(c->fb, cap);
    if (!p)
        return -1;
    c->fb = p;
    size_t *m = realloc(c->fmap, cap * sizeof *m);
    if (!m)
        return -1;
    c->fmap = m;
    c->fcap = cap;
    return 0;
}

static int chan_append(flt_chan_t *c, const char *s, size_t n)
{
    if (c->olen + n > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 256;
        while (cap < c->olen + n)
            cap *= 2;
        char *p = realloc(c->ob, cap);
        if (!p)
            return -1;
        c->ob = p;
        c->ocap = cap;
    }
    if (chan_fgrow(c, n) != 0) /* folding never makes text longer */
        return -1;
    size_t o = c->ostart + c->olen;
    memcpy(c->ob + c->olen, s, n);
    c->olen += n;
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned char tmp[4];
        size_t used, k = flt_fold_char(u + i, n - i, tmp, &used);
        for (size_t j = 0; j < k; j++) {
            c->fb[c->flen] = tmp[j];
            c->fmap[c->flen] = o + i;
            c->flen++;
        }
        i += used;
    }
    return 0;
}

/* A rule matched folded [fs, fe). */
static flt_chan_rc_t chan_hit(flt_chan_t *c, size_t rule, size_t fs, size_t fe)
{
    const flt_rule_t *r = &c->rs->rules[rule];
    if (r->hits)
        sl_counter_add(r->hits, 1);
    switch (r->action) {
    case FLT_ACTION_BLOCK:
        c->block_rule = (int)rule;
        return FLT_CHAN_BLOCK;
    case FLT_ACTION_LOG:
        c->nlog++;
        return FLT_CHAN_OK;
    default:
        break;
    }
    c->nmask++;
    if (fs < c->femit) /* only after a forced release: mask what is left */
        fs = c->femit;
    if (fe <= fs)
        return FLT_CHAN_OK;
    if (c->nrg == c->rgcap) {
        size_t cap = c->rgcap ? c->rgcap * 2 : 8;
        flt_range_t *p = realloc(c->rg, cap * sizeof *p);
        if (!p)
            return FLT_CHAN_ERR;
        c->rg = p;
        c->rgcap = cap;
    }
    c->rg[c->nrg].os = chan_map(c, fs);
    c->rg[c->nrg].oe = chan_map(c, fe);
    c->nrg++;
    return FLT_CHAN_OK;
}

static flt_chan_rc_t chan_words(flt_chan_t *c, size_t from)
{
    const flt_ac_t *ac = c->rs->ac;
    if (!ac)
        return FLT_CHAN_OK;
    uint32_t st = c->ac;
    size_t fend = chan_fend(c);
    for (size_t p = from; p < fend; p++) {
        st = flt_ac_step(ac, st, c->fb[p - c->fstart]);
        for (int32_t o = flt_ac_out_first(ac, st); o >= 0; o = flt_ac_out_next(ac, o)) {
            size_t len = flt_ac_out_len(ac, o);
            flt_chan_rc_t rc = chan_hit(c, (size_t)flt_ac_out_rule(ac, o), p + 1 - len, p + 1);
            if (rc != FLT_CHAN_OK) {
                c->ac = st;
                return rc;
            }
        }
    }
    c->ac = st;
    return FLT_CHAN_OK;
}

/* from: folded offset where the new text starts (ignored when final). */
static flt_chan_rc_t chan_regex(flt_chan_t *c, bool final, size_t from)
{
    const flt_ruleset_t *rs = c->rs;
    size_t nre = chan_nregex(c), fend = chan_fend(c);
    /* the regexes some byte of the new text may start */
    uint64_t may[FLT_RE_WORDS] = {0};
    size_t nw = (nre + 63) / 64;
    for (size_t p = from; !final && p < fend; p++) {
        const uint64_t *m = rs->re_start[c->fb[p - c->fstart]];
        for (size_t w = 0; w < nw; w++)
            may[w] |= m[w];
    }
    /* the text was checked once on the way in (flt_chan_feed); PCRE2 would
     * check the whole rest of the subject on every call otherwise */
    uint32_t opts = PCRE2_NO_UTF_CHECK | (final ? 0 : PCRE2_PARTIAL_HARD);
    for (size_t k = 0; k < nre; k++) {
        size_t rule = rs->first_regex + k;
        const flt_rule_t *r = &rs->rules[rule];
        if (!final && c->rstart[k] >= from && !(may[k / 64] & (1ull << (k % 64)))) {
            /* nothing pending and no byte can start a match: what PCRE2's
             * own start optimisation would find, without the call */
            c->rstart[k] = fend;
            continue;
        }
        if (c->rstart[k] < fend && !c->md && !(c->md = pcre2_match_data_create(1, NULL)))
            return FLT_CHAN_ERR;
        while (c->rstart[k] < fend) {
            size_t off = c->rstart[k] - c->fstart;
            int rc = pcre2_match(r->code, c->fb, c->flen, off, opts, c->md, rs->mctx);
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
            if (rc >= 0) {
                size_t s = ov[0] + c->fstart, e = ov[1] + c->fstart;
                if (e > s) {
                    flt_chan_rc_t h = chan_hit(c, rule, s, e);
                    if (h != FLT_CHAN_OK)
                        return h;
                }
                /* \K or a lookahead can end a match at or before its
                 * search start; always make progress by a character */
                size_t next = e > c->rstart[k] ? e : c->rstart[k] + flt_utf8_len(c->fb[off]);
                c->rstart[k] = next;
            } else if (rc == PCRE2_ERROR_PARTIAL) {
                size_t p = ov[0] + c->fstart;
                if (p > c->rstart[k])
                    c->rstart[k] = p;
                break;
            } else if (rc == PCRE2_ERROR_NOMATCH) {
                c->rstart[k] = fend;
                break;
            } else {
                /* match/depth/heap/JIT-stack limit (or another match-time
                 * error): the configured verdict for the text searched */
                c->nlimit++;
                if (r->limit_hits)
                    sl_counter_add(r->limit_hits, 1);
                if (rs->on_limit == FLT_ON_LIMIT_MATCH) {
                    flt_chan_rc_t h = chan_hit(c, rule, c->rstart[k], fend);
                    if (h != FLT_CHAN_OK)
                        return h;
                }
                c->rstart[k] = fend;
                break;
            }
        }
    }
    return FLT_CHAN_OK;
}

static int range_cmp(const void *pa, const void *pb)
{
    const flt_range_t *a = pa, *b = pb;
    return a->os < b->os ? -1 : a->os > b->os;
}

/* Releases original text up to ro, masks applied. */
static int chan_emit(flt_chan_t *c, size_t ro, sl_buf_t *out)
{
    const flt_ruleset_t *rs = c->rs;
    if (c->nrg > 1)
        qsort(c->rg, c->nrg, sizeof *c->rg, range_cmp);
    size_t pos = c->ostart, used = 0;
    for (; used < c->nrg && c->rg[used].os < ro; used++) {
        const flt_range_t *r = &c->rg[used];
        if (r->os < c->mask_until) { /* overlaps the open mask: one mask for both */
            if (r->oe > c->mask_until)
                c->mask_until = r->oe;
            continue;
        }
        size_t start = SL_MAX(pos, c->mask_until);
        if (sl_buf_add(out, c->ob + (start - c->ostart), r->os - start) != 0 ||
            sl_buf_add(out, rs->mask, rs->mask_len) != 0)
            return -1;
        c->mask_until = r->oe;
        pos = r->os;
    }
    size_t start = SL_MAX(pos, c->mask_until);
    if (start < ro && sl_buf_add(out, c->ob + (start - c->ostart), ro - start) != 0)
        return -1;
    if (used) {
        memmove(c->rg, c->rg + used, (c->nrg - used) * sizeof *c->rg);
        c->nrg -= used;
    }
    size_t d = ro - c->ostart;
    if (d) {
        memmove(c->ob, c->ob + d, c->olen - d);
        c->olen -= d;
        c->ostart = ro;
    }
    return 0;
}

/* Drops folded bytes no longer needed: before the release point and before
 * every regex's scan point minus the lookbehind history. */
static void chan_trim(flt_chan_t *c)
{
    size_t keep = c->femit, nre = chan_nregex(c), h = c->rs->history;
    for (size_t k = 0; k < nre; k++) {
        size_t f = c->rstart[k] > h ? c->rstart[k] - h : 0;
        if (f < keep)
            keep = f;
    }
    if (keep <= c->fstart)
        return;
    /* back to a character's first byte; the end of the text is one (and
     * has no byte to look at: fb may be exactly full) */
    while (keep > c->fstart && keep < chan_fend(c) && (c->fb[keep - c->fstart] & 0xC0) == 0x80)
        keep--;
    size_t d = keep - c->fstart;
    if (!d)
        return;
    memmove(c->fb, c->fb + d, c->flen - d);
    memmove(c->fmap, c->fmap + d, (c->flen - d) * sizeof *c->fmap);
    c->flen -= d;
    c->fstart = keep;
}

static int chan_release(flt_chan_t *c, bool final, sl_buf_t *out)
{
    size_t fend = chan_fend(c), nre = chan_nregex(c);
    size_t R = fend;
    if (!final) {
        if (c->rs->ac)
            R = fend - flt_ac_depth(c->rs->ac, c->ac);
        for (size_t k = 0; k < nre; k++)
            if (c->rstart[k] < R)
                R = c->rstart[k];
        if (R < c->femit)
            R = c->femit;
        size_t oend = c->ostart + c->olen, cap = c->rs->holdback_max;
        if (!c->unbounded && oend - chan_map(c, R) > cap) {
            while (R < fend && oend - chan_map(c, R) > cap)
                R += flt_utf8_len(c->fb[R - c->fstart]);
            c->nforced++;
            if (c->rs->holdback_forced)
                sl_counter_add(c->rs->holdback_forced, 1);
            for (size_t k = 0; k < nre; k++)
                if (c->rstart[k] < R)
                    c->rstart[k] = R;
        }
    }
    if (chan_emit(c, chan_map(c, R), out) != 0)
        return -1;
    c->femit = R;
    chan_trim(c);
    return 0;
}

/* The usual streamed delta: nothing held, nothing pending, ASCII text in
 * which no word ends, that leaves no partial word and that no regex can
 * start in. Such text is released whole, straight from the caller's
 * bytes, and the channel is left as the full path would leave it: empty
 * original window, every offset at the end, and in the folded window only
 * the regexes' lookbehind history (ASCII folds to itself, byte for byte).
 * The full path's copies, per-byte fold map and release steps were most of
 * a delta event's filter cost. false: nothing changed, take the full path.
 * out NULL: the piece is not copied (flt_chan_feed_same). */
static bool chan_feed_clean(flt_chan_t *c, const char *s, size_t n, sl_buf_t *out, bool *err)
{
    const flt_ruleset_t *rs = c->rs;
    size_t nre = chan_nregex(c), fend = chan_fend(c);
    if (c->olen || c->nrg || c->femit != fend || c->mask_until > c->ostart)
        return false;
    for (size_t k = 0; k < nre; k++)
        if (c->rstart[k] < fend)
            return false; /* a regex still has text to look at */
    const unsigned char *u = (const unsigned char *)s;
    uint32_t st = c->ac;
    if (rs->ac ? !flt_ac_ascii_run(rs->ac, &st, u, n) || flt_ac_depth(rs->ac, st)
               : !scan_ascii(u, n))
        return false;
    if (nre && re_next(rs, u, 0, n) < n)
        return false; /* a byte some regex may start with */
    /* the history the regexes may look behind at: at most rs->history of
     * the piece's last bytes join the window (chan_trim cuts the rest) */
    size_t tail = nre ? SL_MIN(n, rs->history) : 0;
    if ((out && sl_buf_add(out, s, n) != 0) || chan_fgrow(c, tail) != 0) {
        *err = true;
        return true;
    }
    size_t skip = n - tail;
    if (skip || !c->flen) { /* the piece alone fills the history (or none is kept) */
        c->fstart = fend + skip;
        c->flen = 0;
    }
    for (size_t i = 0; i < tail; i++) {
        c->fb[c->flen] = u[skip + i];
        c->fmap[c->flen] = c->ostart + skip + i;
        c->flen++;
    }
    c->ac = st;
    c->ostart += n;
    c->femit = fend + n;
    for (size_t k = 0; k < nre; k++)
        c->rstart[k] = fend + n;
    chan_trim(c);
    c->nclean++;
    return true;
}

static inline flt_chan_rc_t chan_feed(flt_chan_t *c, const char *s, size_t n, sl_buf_t *out,
                                      bool *same)
{
    if (c->block_rule >= 0)
        return FLT_CHAN_BLOCK;
    if (c->finished)
        return FLT_CHAN_ERR;
    if (n == 0)
        return FLT_CHAN_OK;
    bool err = false;
    if (chan_feed_clean(c, s, n, same ? NULL : out, &err)) {
        if (same)
            *same = !err;
        return err ? FLT_CHAN_ERR : FLT_CHAN_OK;
    }
    if (!flt_utf8_valid(s, n))
        return FLT_CHAN_ERR;
    size_t from = chan_fend(c);
    if (chan_append(c, s, n) != 0)
        return FLT_CHAN_ERR;
    flt_chan_rc_t rc = chan_words(c, from);
    if (rc == FLT_CHAN_OK)
        rc = chan_regex(c, false, from);
    if (rc != FLT_CHAN_OK)
        return rc;
    return chan_release(c, false, out) == 0 ? FLT_CHAN_OK : FLT_CHAN_ERR;
}

flt_chan_rc_t flt_chan_feed(flt_chan_t *c, const char *s, size_t n, sl_buf_t *out)
{
    return chan_feed(c, s, n, out, NULL);
}

flt_chan_rc_t flt_chan_feed_same(flt_chan_t *c, const char *s, size_t n, sl_buf_t *out, bool *same)
{
    *same = false;
    return chan_feed(c, s, n, out, same);
}

flt_chan_rc_t flt_chan_finish(flt_chan_t *c, sl_buf_t *out)
{
    if (c->block_rule >= 0)
        return FLT_CHAN_BLOCK;
    if (c->finished)
        return FLT_CHAN_OK;
    flt_chan_rc_t rc = chan_regex(c, true, 0);
    if (rc != FLT_CHAN_OK)
        return rc;
    if (chan_release(c, true, out) != 0)
        return FLT_CHAN_ERR;
    c->finished = true;
    return FLT_CHAN_OK;
}

/* ---- byte passes over whole texts -----------------------------------------
 *
 * The checks on a request and its answer ask of every byte of the prompt
 * and answer texts whether some regex may start with it (re_any) and, in an
 * answer's bytes, where its strings are. A per-byte loop cost ~6
 * instructions a byte (bench/RESULTS.md, issue 16); these passes take 32
 * bytes a round with AVX2. re_any is looked up exactly: an ASCII byte's
 * high nibble picks a bit, its low nibble a table row holding the bits of
 * the high nibbles that are in the set (two byte shuffles); a byte >= 0x80
 * is confirmed in re_any itself. */

void flt_re_tables_build(flt_ruleset_t *rs)
{
    memset(rs->re_nib, 0, sizeof rs->re_nib);
    for (unsigned c = 0; c < 0x80; c++)
        if (rs->re_any[c])
            for (unsigned lane = 0; lane < 32; lane += 16)
                rs->re_nib[0][lane + (c & 15)] |= (unsigned char)(1u << (c >> 4));
    for (unsigned h = 0; h < 8; h++)
        for (unsigned lane = 0; lane < 32; lane += 16)
            rs->re_nib[1][lane + h] = (unsigned char)(1u << h);
#ifdef SCAN_X86
    __builtin_cpu_init();
    rs->avx2 = __builtin_cpu_supports("avx2");
#endif
}

#ifdef SCAN_X86
/* The bits of the 32 bytes at p that some regex may start with, or that
 * are >= 0x80 (the caller confirms those in re_any). */
__attribute__((target("avx2"))) static inline uint32_t re_mask32(const flt_ruleset_t *rs, __m256i v)
{
    const __m256i lo = _mm256_loadu_si256((const __m256i *)rs->re_nib[0]);
    const __m256i hi = _mm256_loadu_si256((const __m256i *)rs->re_nib[1]);
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i m =
        _mm256_and_si256(_mm256_shuffle_epi8(lo, _mm256_and_si256(v, nib)),
                         _mm256_shuffle_epi8(hi, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib)));
    uint32_t none = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(m, _mm256_setzero_si256()));
    return ~none | (uint32_t)_mm256_movemask_epi8(v);
}

/* The 32 bytes at u + i, zeros past n (*valid: the bits of real bytes). */
__attribute__((target("avx2"))) static inline __m256i load32(const unsigned char *u, size_t i,
                                                             size_t n, uint32_t *valid)
{
    if (n - i >= 32) {
        *valid = UINT32_MAX;
        return _mm256_loadu_si256((const __m256i *)(u + i));
    }
    unsigned char pad[32] = {0};
    memcpy(pad, u + i, n - i);
    *valid = (1u << (n - i)) - 1;
    return _mm256_loadu_si256((const __m256i *)pad);
}

__attribute__((target("avx2"))) static size_t
re_next_avx2(const flt_ruleset_t *rs, const unsigned char *u, size_t i, size_t n)
{
    for (; i < n; i += 32) {
        uint32_t valid, c;
        c = re_mask32(rs, load32(u, i, n, &valid)) & valid;
        for (; c; c &= c - 1) {
            size_t j = i + (size_t)__builtin_ctz(c);
            if (rs->re_any[u[j]])
                return j;
        }
    }
    return n;
}

/* flt_json_strings_clean's byte checks in one pass: no backslash, no byte
 * >= 0x80, and (with regexes) the quotes pair up and no byte between an
 * odd quote and the next is in re_any. A string's bytes are those after an
 * odd quote: the prefix XOR of the quote bits, carried across rounds. */
__attribute__((target("avx2"))) static bool
json_bytes_clean_avx2(const flt_ruleset_t *rs, const unsigned char *u, size_t n, bool regex)
{
    const __m256i bs = _mm256_set1_epi8('\\'), qu = _mm256_set1_epi8('"');
    uint32_t carry = 0; /* all ones: a string is open at the round's start */
    for (size_t i = 0; i < n; i += 32) {
        uint32_t valid;
        __m256i v = load32(u, i, n, &valid);
        if (_mm256_movemask_epi8(v) |
            _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, bs))) /* the padding is zeros */
            return false;
        if (!regex)
            continue;
        uint32_t q = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, qu));
        uint32_t in = q;
        in ^= in << 1;
        in ^= in << 2;
        in ^= in << 4;
        in ^= in << 8;
        in ^= in << 16;
        in ^= carry; /* the bytes after an odd quote, the opening quote too */
        uint32_t c = re_mask32(rs, v) & in & ~q & valid;
        for (; c; c &= c - 1)
            if (rs->re_any[u[i + (size_t)__builtin_ctz(c)]])
                return false;
        carry = (uint32_t)((int32_t)in >> 31);
    }
    return carry == 0; /* an unpaired quote: not JSON, not judged */
}
#endif

/* The first position in [i, n) whose byte some regex may start with, or n. */
static size_t re_next(const flt_ruleset_t *rs, const unsigned char *u, size_t i, size_t n)
{
#ifdef SCAN_X86
    if (rs->avx2)
        return re_next_avx2(rs, u, i, n);
#endif
    while (i < n && !rs->re_any[u[i]])
        i++;
    return i;
}

static bool scan_ascii(const unsigned char *u, size_t n)
{
    return sl_ascii_end(u, 0, n) == n;
}

bool flt_text_clean(const flt_ruleset_t *rs, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    const flt_ac_t *ac = rs->ac;
    size_t nre = rs->nrules - rs->first_regex, nw = (nre + 63) / 64;
    uint64_t may[FLT_RE_WORDS] = {0};
    /* ASCII first (folding is the identity); then non-ASCII text that is
     * valid UTF-8 and that folding leaves as it is (é, CJK): the automaton
     * and PCRE2 see the bytes the channel would. A word's end, a fullwidth
     * form or bad UTF-8: the channel. The checks of the rest start where
     * the ASCII run stopped, with the automaton's state there: the prefix
     * is ASCII (whole characters that fold to themselves) and was stepped
     * once (until branch arrparts, twice) */
    uint32_t st = FLT_AC_ROOT;
    size_t at = n;
    if (ac) {
        flt_ac_run_t r = flt_ac_ascii_scan(ac, &st, u, n, &at);
        if (r == FLT_AC_RUN_WORD)
            return false;
        if (r == FLT_AC_RUN_CLEAN)
            at = n;
    } else {
        at = sl_ascii_end(u, 0, n);
    }
    if (at < n) {
        if (!flt_utf8_valid(s + at, n - at) || !flt_fold_same(s + at, n - at))
            return false;
        if (ac && !flt_ac_clean_from(ac, st, u + at, n - at))
            return false;
    }
    for (size_t i = nw ? re_next(rs, u, 0, n) : n; i < n; i = re_next(rs, u, i + 1, n))
        for (size_t w = 0; w < nw; w++)
            may[w] |= rs->re_start[u[i]][w];
    pcre2_match_data *md = NULL;
    bool clean = true;
    for (size_t k = 0; clean && k < nre; k++) {
        if (!(may[k / 64] & (1ull << (k % 64))))
            continue; /* no byte can start a match */
        if (!md && !(md = pcre2_match_data_create(1, NULL)))
            return false;
        /* one complete search over the whole text: NOMATCH means no match
         * starts anywhere; a limit or any error is left to the channel */
        int rc = pcre2_match(rs->rules[rs->first_regex + k].code, u, n, 0, PCRE2_NO_UTF_CHECK, md,
                             rs->mctx);
        clean = rc == PCRE2_ERROR_NOMATCH;
    }
    pcre2_match_data_free(md);
    return clean;
}

bool flt_json_strings_clean(const flt_ruleset_t *rs, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    bool regex = rs->nrules > rs->first_regex;
#ifdef SCAN_X86
    if (rs->avx2) /* the same verdicts as below, the byte checks in one pass */
        return json_bytes_clean_avx2(rs, u, n, regex) &&
               (!rs->ac || flt_ac_ascii_clean(rs->ac, u, n));
#endif
    /* an escape may spell a word or a regex start (\u0066 is f): those
     * texts need decoding, so the answer's own reader */
    if (memchr(s, '\\', n))
        return false;
    /* every string is a run of these bytes, so a word in one is a word here */
    if (rs->ac ? !flt_ac_ascii_clean(rs->ac, u, n) : !scan_ascii(u, n))
        return false;
    if (!regex)
        return true;
    /* Without backslashes the quotes of valid JSON pair up: bytes between
     * an odd quote and the next are a string's. A regex start inside one
     * is not judged here (that string would need a search of its own); a
     * regex start outside (digits of a number, a key's colon) is no text.
     * An unpaired quote: not JSON, and not judged either. */
    unsigned may = 0;
    const unsigned char *p = u, *end = u + n;
    while (p < end) {
        const unsigned char *o = memchr(p, '"', (size_t)(end - p));
        if (!o)
            break;
        const unsigned char *c = memchr(o + 1, '"', (size_t)(end - o - 1));
        if (!c)
            return false;
        for (const unsigned char *q = o + 1; q < c; q++)
            may |= rs->re_any[*q];
        p = c + 1;
    }
    return may == 0;
}

flt_chan_rc_t flt_text_filter(const flt_ruleset_t *rs, const char *s, size_t n, sl_buf_t *out)
{
    if (flt_text_clean(rs, s, n))
        return sl_buf_add(out, s, n) == 0 ? FLT_CHAN_OK : FLT_CHAN_ERR;
    return flt_chan_text(rs, s, n, out);
}

flt_chan_rc_t flt_chan_text(const flt_ruleset_t *rs, const char *s, size_t n, sl_buf_t *out)
{
    flt_chan_t c;
    if (flt_chan_init(&c, rs) != 0)
        return FLT_CHAN_ERR;
    c.unbounded = true;
    flt_chan_rc_t rc = flt_chan_feed(&c, s, n, out);
    if (rc == FLT_CHAN_OK)
        rc = flt_chan_finish(&c, out);
    flt_chan_fini(&c);
    return rc;
}
