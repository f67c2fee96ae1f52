/*
 * ruleset.c — builds the immutable, refcounted ruleset from config: reads
 * the word files (folded into one automaton), compiles the regexes (UTF
 * mode, JIT for complete and partial matching, match/depth/heap limits),
 * registers the metrics and resolves each rule's series once so the hot
 * path only does atomic adds. Also the slot that swaps rulesets on reload.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "filters/flt_internal.h"

#define FLT_WORD_FILE_MAX   (64u << 20) /* a word file larger than this is a mistake */
#define FLT_HOLDBACK_MAXMAX (16u << 20)

static const char *const flt_action_names[] = {"block", "mask", "log"};

/* conf.h's enums are stored as these, value for value. */
_Static_assert((int)CONF_FILTER_BLOCK == (int)FLT_ACTION_BLOCK &&
                   (int)CONF_FILTER_MASK == (int)FLT_ACTION_MASK &&
                   (int)CONF_FILTER_LOG == (int)FLT_ACTION_LOG,
               "conf_filter_action_t and flt_action_t differ");

void flt_conf_defaults(flt_conf_t *c)
{
    memset(c, 0, sizeof *c);
    c->input.max_chars = 8000;
    c->input.on_overflow = FLT_OVERFLOW_REJECT;
    c->input.keep_turns = 10;
    c->input.system_prompt_mode = FLT_SYSPROMPT_PREPEND;
    c->mask = "***";
    c->output = true;
    c->regex_limits.match = 100000;
    c->regex_limits.depth = 10000;
    c->regex_limits.heap_kib = 4096;
    c->regex_limits.on_limit = FLT_ON_LIMIT_MATCH;
    c->holdback_max = 4096;
}

static void flt_err(char *err, size_t errlen, const char *fmt, ...) SL_PRINTF(3, 4);
static void flt_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void ruleset_free(flt_ruleset_t *rs)
{
    if (!rs)
        return;
    for (size_t i = 0; i < rs->nrules; i++) {
        free(rs->rules[i].name);
        pcre2_code_free(rs->rules[i].code);
    }
    free(rs->rules);
    flt_ac_free(rs->ac);
    pcre2_match_context_free(rs->mctx);
    free(rs->mask);
    free(rs->system_prompt);
    free(rs);
}

flt_ruleset_t *flt_ruleset_ref(flt_ruleset_t *rs)
{
    if (rs)
        atomic_fetch_add_explicit(&rs->refs, 1, memory_order_relaxed);
    return rs;
}

void flt_ruleset_unref(flt_ruleset_t *rs)
{
    if (rs && atomic_fetch_sub_explicit(&rs->refs, 1, memory_order_acq_rel) == 1)
        ruleset_free(rs);
}

bool flt_ruleset_filters_output(const flt_ruleset_t *rs)
{
    return rs && rs->output && rs->nrules > 0;
}

size_t flt_ruleset_word_count(const flt_ruleset_t *rs)
{
    return rs ? rs->nwords : 0;
}

size_t flt_ruleset_regex_count(const flt_ruleset_t *rs)
{
    return rs ? rs->nrules - rs->first_regex : 0;
}

/* "conf/words/example.txt" -> "example" */
static char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    const char *dot = strrchr(b, '.');
    size_t n = dot && dot != b ? (size_t)(dot - b) : strlen(b);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, b, n);
        s[n] = '\0';
    }
    return s;
}

static int rule_name_taken(const flt_ruleset_t *rs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rs->rules[i].name, name) == 0)
            return 1;
    return 0;
}

/* Growing array of words for the automaton. */
typedef struct word_vec {
    flt_ac_word_t *v;
    size_t n, cap;
    char **arenas; /* one folded copy per file */
    size_t narenas;
} word_vec_t;

static void word_vec_free(word_vec_t *w)
{
    for (size_t i = 0; i < w->narenas; i++)
        free(w->arenas[i]);
    free(w->arenas);
    free(w->v);
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

/* Reads one word file into w; folded words live in a per-file arena. */
static int load_words(word_vec_t *w, const char *path, int rule, int action, const char *where,
                      char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        flt_err(err, errlen, "%s: %s: %s", where, path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 65536;
            if (cap > FLT_WORD_FILE_MAX + 1)
                cap = FLT_WORD_FILE_MAX + 1;
            char *p = len == cap ? NULL : realloc(buf, cap);
            if (!p) {
                fclose(f);
                free(buf);
                flt_err(err, errlen, "%s: %s: larger than %u bytes", where, path,
                        FLT_WORD_FILE_MAX);
                return -1;
            }
            buf = p;
        }
        size_t k = fread(buf + len, 1, cap - len, f);
        len += k;
        if (k == 0)
            break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        free(buf);
        flt_err(err, errlen, "%s: %s: read error", where, path);
        return -1;
    }
    char *arena = malloc(len ? len : 1);
    char **arenas = realloc(w->arenas, (w->narenas + 1) * sizeof *arenas);
    if (!arena || !arenas) {
        free(arena);
        free(buf);
        if (arenas)
            w->arenas = arenas;
        flt_err(err, errlen, "%s: out of memory", where);
        return -1;
    }
    w->arenas = arenas;
    w->arenas[w->narenas++] = arena;

    size_t i = 0, used = 0;
    int line = 0;
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
        i = 3;
    while (i < len) {
        line++;
        size_t s = i;
        while (i < len && buf[i] != '\n')
            i++;
        size_t e = i;
        i++; /* past the newline */
        while (s < e && is_space((unsigned char)buf[s]))
            s++;
        while (e > s && is_space((unsigned char)buf[e - 1]))
            e--;
        if (s == e || buf[s] == '#')
            continue;
        if (!flt_utf8_valid(buf + s, e - s)) {
            free(buf);
            flt_err(err, errlen, "%s: %s:%d: invalid UTF-8", where, path, line);
            return -1;
        }
        size_t n = flt_fold_word(buf + s, e - s, arena + used, FLT_MAX_WORD_BYTES);
        if (n == SIZE_MAX) {
            free(buf);
            flt_err(err, errlen, "%s: %s:%d: word longer than %d bytes", where, path, line,
                    FLT_MAX_WORD_BYTES);
            return -1;
        }
        if (w->n == w->cap) {
            size_t ncap = w->cap ? w->cap * 2 : 1024;
            flt_ac_word_t *p = realloc(w->v, ncap * sizeof *p);
            if (!p) {
                free(buf);
                flt_err(err, errlen, "%s: out of memory", where);
                return -1;
            }
            w->v = p;
            w->cap = ncap;
        }
        w->v[w->n++] = (flt_ac_word_t){arena + used, n, rule, action};
        used += n;
    }
    free(buf);
    return 0;
}

static int check_action(int a)
{
    return a >= FLT_ACTION_BLOCK && a <= FLT_ACTION_LOG;
}

static int rule_metrics(flt_rule_t *r, sl_metric_t *hits, sl_metric_t *limits)
{
    const char *v[2] = {r->name, flt_action_names[r->action]};
    r->hits = sl_metric_series(hits, v);
    if (r->is_regex)
        r->limit_hits = sl_metric_series1(limits, r->name);
    return 0;
}

/* Which bytes can start a match of regex k, from PCRE2's start analysis:
 * a fixed first code unit (both ASCII cases, as (?i) may apply) or the
 * start bitmap; anything else (^ in multiline mode, no analysis) may start
 * anywhere. */
static void regex_start_set(flt_ruleset_t *rs, const pcre2_code *code, size_t k)
{
    uint64_t bit = 1ull << (k % 64);
    size_t w = k / 64;
    uint32_t type = 0, cu = 0;
    const uint8_t *bitmap = NULL;
    if (pcre2_pattern_info(code, PCRE2_INFO_FIRSTCODETYPE, &type) == 0 && type == 1 &&
        pcre2_pattern_info(code, PCRE2_INFO_FIRSTCODEUNIT, &cu) == 0 && cu < 256) {
        rs->re_start[cu][w] |= bit;
        if ((cu | 0x20) >= 'a' && (cu | 0x20) <= 'z')
            rs->re_start[cu ^ 0x20][w] |= bit;
        return;
    }
    if (pcre2_pattern_info(code, PCRE2_INFO_FIRSTBITMAP, &bitmap) == 0 && bitmap) {
        for (unsigned c = 0; c < 256; c++)
            if (bitmap[c / 8] & (1u << (c % 8)))
                rs->re_start[c][w] |= bit;
        return;
    }
    for (unsigned c = 0; c < 256; c++)
        rs->re_start[c][w] |= bit;
}

static int compile_regex(flt_ruleset_t *rs, flt_rule_t *r, const char *pattern, const char *where,
                         char *err, size_t errlen)
{
    int ec;
    PCRE2_SIZE eoff;
    r->code =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eoff, NULL);
    if (!r->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        flt_err(err, errlen, "%s: pattern: %s at offset %zu", where, (const char *)msg,
                (size_t)eoff);
        return -1;
    }
    uint32_t minlen = 0, lb = 0;
    if (pcre2_pattern_info(r->code, PCRE2_INFO_MINLENGTH, &minlen) != 0 || minlen == 0) {
        flt_err(err, errlen, "%s: pattern can match the empty string", where);
        return -1;
    }
    if (pcre2_pattern_info(r->code, PCRE2_INFO_MAXLOOKBEHIND, &lb) != 0)
        lb = 255;
    r->lookbehind = lb;
    /* JIT is an optimisation: without it (no JIT on this CPU) the interpreter
     * runs the same pattern under the depth and heap limits as well. */
    (void)pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    size_t k = (size_t)(r - rs->rules) - rs->first_regex;
    regex_start_set(rs, r->code, k);
    for (unsigned c = 0; c < 256; c++)
        if (rs->re_start[c][k / 64] & (1ull << (k % 64)))
            rs->re_any[c] = 1;
    size_t h = ((size_t)lb + 1) * 4; /* characters to bytes, at most 4 each */
    if (h > rs->history)
        rs->history = h;
    return 0;
}

flt_ruleset_t *flt_ruleset_build(const flt_conf_t *conf, char *err, size_t errlen)
{
    const flt_conf_input_t *in = &conf->input;
    const flt_conf_regex_limits_t *lim = &conf->regex_limits;
    if (conf->nwords + conf->nregex > FLT_MAX_RULES) {
        flt_err(err, errlen, "filters: more than %d rules", FLT_MAX_RULES);
        return NULL;
    }
    if (in->max_chars < 0 || in->keep_turns < 0 ||
        (in->on_overflow != FLT_OVERFLOW_REJECT && in->on_overflow != FLT_OVERFLOW_TRUNCATE) ||
        (in->system_prompt_mode != FLT_SYSPROMPT_PREPEND &&
         in->system_prompt_mode != FLT_SYSPROMPT_REPLACE)) {
        flt_err(err, errlen, "filters.input: value out of range");
        return NULL;
    }
    if (lim->match < 1 || lim->depth < 1 || lim->heap_kib < 1 || lim->match > UINT32_MAX ||
        lim->depth > UINT32_MAX || lim->heap_kib > UINT32_MAX ||
        (lim->on_limit != FLT_ON_LIMIT_MATCH && lim->on_limit != FLT_ON_LIMIT_NOMATCH)) {
        flt_err(err, errlen, "filters.regex_limits: value out of range");
        return NULL;
    }
    if (conf->holdback_max < FLT_HOLDBACK_MIN || conf->holdback_max > FLT_HOLDBACK_MAXMAX) {
        flt_err(err, errlen, "filters.holdback_max: must be %d..%u bytes", FLT_HOLDBACK_MIN,
                FLT_HOLDBACK_MAXMAX);
        return NULL;
    }
    const char *mask = conf->mask ? conf->mask : "***";
    if (!flt_utf8_valid(mask, strlen(mask))) {
        flt_err(err, errlen, "filters.mask: invalid UTF-8");
        return NULL;
    }
    if (in->system_prompt && !flt_utf8_valid(in->system_prompt, strlen(in->system_prompt))) {
        flt_err(err, errlen, "filters.input.system_prompt: invalid UTF-8");
        return NULL;
    }

    flt_ruleset_t *rs = sl_xcalloc(1, sizeof *rs);
    atomic_init(&rs->refs, 1);
    rs->rules = sl_xcalloc(conf->nwords + conf->nregex + 1, sizeof *rs->rules);
    rs->mask = sl_xstrdup(mask);
    rs->mask_len = strlen(mask);
    rs->input = *in;
    rs->system_prompt =
        in->system_prompt && in->system_prompt[0] ? sl_xstrdup(in->system_prompt) : NULL;
    rs->input.system_prompt = rs->system_prompt;
    rs->output = conf->output;
    rs->on_limit = lim->on_limit;
    rs->holdback_max = (size_t)conf->holdback_max;

    static const double ev_buckets[] = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5,
                                        1e-4, 2.5e-4, 1e-3, 1e-2, 0.1};
    sl_metric_t *m_hits =
        sl_metric_register("sluice_filter_hits_total", "Content filter rule matches.",
                           SL_METRIC_COUNTER, "rule,action", NULL, 0);
    sl_metric_t *m_lim = sl_metric_register("sluice_filter_regex_limit_hits_total",
                                            "Regex runs stopped by the match, depth or heap limit.",
                                            SL_METRIC_COUNTER, "rule", NULL, 0);
    rs->event_seconds = sl_metric_series0(sl_metric_register(
        "sluice_filter_event_seconds", "Time the content filter adds per SSE event.",
        SL_METRIC_HISTOGRAM, NULL, ev_buckets, SL_ARRAY_LEN(ev_buckets)));
    rs->holdback_forced =
        sl_metric_counter0("sluice_filter_holdback_forced_total",
                           "Answer text released because holdback_max was reached.");

    word_vec_t wv = {0};
    char where[96];
    for (size_t i = 0; i < conf->nwords; i++) {
        const flt_conf_words_t *wc = &conf->words[i];
        snprintf(where, sizeof where, "filters.words[%zu]", i);
        if (!wc->file || !wc->file[0] || !check_action(wc->action)) {
            flt_err(err, errlen, "%s: needs a file and an action", where);
            goto fail;
        }
        flt_rule_t *r = &rs->rules[rs->nrules];
        r->name = wc->name && wc->name[0] ? sl_xstrdup(wc->name) : base_name(wc->file);
        if (!r->name || rule_name_taken(rs, rs->nrules, r->name)) {
            flt_err(err, errlen, "%s: rule name \"%s\" used twice", where, r->name ? r->name : "");
            free(r->name);
            r->name = NULL;
            goto fail;
        }
        r->action = wc->action;
        rs->nrules++;
        if (load_words(&wv, wc->file, (int)(rs->nrules - 1), wc->action, where, err, errlen) != 0)
            goto fail;
        rule_metrics(r, m_hits, m_lim);
    }
    if (wv.n) {
        rs->ac = flt_ac_new(wv.v, wv.n);
        if (!rs->ac) {
            flt_err(err, errlen, "filters.words: out of memory");
            goto fail;
        }
        rs->nwords = flt_ac_words(rs->ac);
    }
    word_vec_free(&wv);
    memset(&wv, 0, sizeof wv);

    rs->first_regex = rs->nrules;
    for (size_t i = 0; i < conf->nregex; i++) {
        const flt_conf_regex_t *rc = &conf->regex[i];
        snprintf(where, sizeof where, "filters.regex[%zu]", i);
        if (!rc->name || !rc->name[0] || !rc->pattern || !check_action(rc->action)) {
            flt_err(err, errlen, "%s: needs a name, a pattern and an action", where);
            goto fail;
        }
        if (rule_name_taken(rs, rs->nrules, rc->name)) {
            flt_err(err, errlen, "%s: rule name \"%s\" used twice", where, rc->name);
            goto fail;
        }
        flt_rule_t *r = &rs->rules[rs->nrules++];
        r->name = sl_xstrdup(rc->name);
        r->action = rc->action;
        r->is_regex = true;
        snprintf(where, sizeof where, "filters.regex[%zu] (%.40s)", i, rc->name);
        if (compile_regex(rs, r, rc->pattern, where, err, errlen) != 0)
            goto fail;
        rule_metrics(r, m_hits, m_lim);
    }
    flt_re_tables_build(rs);
    rs->mctx = pcre2_match_context_create(NULL);
    if (!rs->mctx) {
        flt_err(err, errlen, "filters: out of memory");
        goto fail;
    }
    pcre2_set_match_limit(rs->mctx, (uint32_t)lim->match);
    pcre2_set_depth_limit(rs->mctx, (uint32_t)lim->depth);
    pcre2_set_heap_limit(rs->mctx, (uint32_t)lim->heap_kib);
    return rs;

fail:
    word_vec_free(&wv);
    ruleset_free(rs);
    return NULL;
}

flt_ruleset_t *flt_ruleset_new(const conf_filters_t *cf, char *err, size_t errlen)
{
    flt_conf_t c;
    flt_conf_defaults(&c);
    c.input.max_chars = cf->input.max_chars;
    c.input.on_overflow = cf->input.on_overflow;
    c.input.keep_turns = cf->input.keep_turns;
    c.input.system_prompt = cf->input.system_prompt;
    c.input.system_prompt_mode = cf->input.system_prompt_mode;
    c.mask = cf->mask;
    c.output = cf->output;
    c.regex_limits.match = cf->regex_limits.match;
    c.regex_limits.depth = cf->regex_limits.depth;
    c.regex_limits.heap_kib = (cf->regex_limits.heap_bytes + 1023) / 1024;
    c.regex_limits.on_limit = cf->regex_limits.on_limit;
    c.holdback_max = cf->holdback_max;
    flt_conf_words_t *w = calloc(cf->nwords + 1, sizeof *w);
    flt_conf_regex_t *r = calloc(cf->nregex + 1, sizeof *r);
    if (!w || !r) {
        free(w);
        free(r);
        flt_err(err, errlen, "filters: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < cf->nwords; i++)
        w[i] = (flt_conf_words_t){cf->words[i].file, cf->words[i].action, cf->words[i].name};
    for (size_t i = 0; i < cf->nregex; i++)
        r[i] = (flt_conf_regex_t){cf->regex[i].name, cf->regex[i].pattern, cf->regex[i].action};
    c.words = w;
    c.nwords = cf->nwords;
    c.regex = r;
    c.nregex = cf->nregex;
    flt_ruleset_t *rs = flt_ruleset_build(&c, err, errlen);
    free(w);
    free(r);
    return rs;
}

/* ---- the reload slot ---------------------------------------------------- */

struct flt_slot {
    pthread_mutex_t lock; /* held for a pointer copy and an atomic add only */
    flt_ruleset_t *rs;
};

flt_slot_t *flt_slot_new(flt_ruleset_t *rs)
{
    flt_slot_t *s = calloc(1, sizeof *s);
    if (!s) {
        flt_ruleset_unref(rs);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->rs = rs;
    return s;
}

void flt_slot_free(flt_slot_t *s)
{
    if (!s)
        return;
    flt_ruleset_unref(s->rs);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

flt_ruleset_t *flt_slot_acquire(flt_slot_t *s)
{
    pthread_mutex_lock(&s->lock);
    flt_ruleset_t *rs = flt_ruleset_ref(s->rs);
    pthread_mutex_unlock(&s->lock);
    return rs;
}

void flt_slot_swap(flt_slot_t *s, flt_ruleset_t *rs)
{
    pthread_mutex_lock(&s->lock);
    flt_ruleset_t *old = s->rs;
    s->rs = rs;
    pthread_mutex_unlock(&s->lock);
    flt_ruleset_unref(old); /* outside the lock: may free a large automaton */
}
