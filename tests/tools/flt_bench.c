/*
 * flt_bench.c — throughput and per-event cost of the content filter, with
 * 10,000 words (half Latin, half Chinese) and 20 typical PII/secret regexes.
 * Prints: the load time of 10,000 and 100,000 words; MB/s filtering a text
 * whole and streamed in delta-sized pieces; and the time flt_stream_event()
 * adds per typical delta event (a real chat.completion.chunk JSON of one or
 * two tokens), mean and p50/p99, beside the cost of parsing the same chunk
 * with jansson (the old way) and with yajl alone (the floor of the new way).
 * Results go to bench/RESULTS.md.
 *
 *   build/tools/flt_bench [MB of text, default 8]
 *   build/tools/flt_bench events [rounds]   per-event figures only, repeated
 *   build/tools/flt_bench streams same|early|late|one [streams]
 *       many short streams (role, content and finish events, each stream
 *       its own id and created), through flt_stream_event(): "same" has one
 *       server's shapes; "early" an escape in each id, "late" a float that
 *       changes at each event's end (events no kept shape can read); "one"
 *       is one stream of as many events (the stream's template). Meant
 *       for callgrind --toggle-collect=flt_stream_event: instructions per
 *       event, whatever the machine's load.
 *   build/tools/flt_bench clean BYTES [calls]
 *       flt_text_clean() on BYTES of ASCII prose then "caf\u00e9 by the
 *       harbour." (a clean text whose first byte >= 0x80 comes late), with
 *       bench/lib.sh's full rules (1,001 words, 1[3-9]\d{9}). Meant for
 *       callgrind, run with two call counts: the difference of the totals
 *       over the difference of the counts is the instructions per call.
 *   build/tools/flt_bench respstream FILE [streams]
 *       the Responses stream in FILE (an SSE capture: `event:` and `data:`
 *       lines, events apart by a blank line; bench_upstream's) as many
 *       times, each a stream of its own (gw_flt_resp_t and filter state
 *       new) with issue16_rules: every event's data through
 *       gw_flt_resp_event and its raw bytes through the metrics' scan
 *       (gw_llm_resp_scan), as the relay does. Meant for callgrind, run
 *       with two stream counts: per-function instructions a stream are the
 *       difference of the two runs over the difference of the counts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <yajl/yajl_parse.h>

#include "common/sl.h"
#include "filters/flt_internal.h"
#include "gateway/gw_flt_resp.h"
#include "gateway/gw_llm.h"
#include "tests/tools/issue16_rules.h"

/* CPU time of this thread: the machine is shared, wall time would measure
 * the neighbours too. */
static int64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint32_t rnd_state = 2463534242u;
static uint32_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 17;
    rnd_state ^= rnd_state << 5;
    return rnd_state;
}

static size_t put_cjk(char *p)
{
    unsigned cp = 0x4E00 + rnd() % 0x5000;
    p[0] = (char)(0xE0 | (cp >> 12));
    p[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    p[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* n words, one per line, into a temp file; returns its path. */
static char *word_file(size_t n)
{
    char path[] = "/tmp/flt_bench_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        perror("word file");
        exit(1);
    }
    fprintf(f, "# bench words\n");
    char w[64];
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        if (i % 2) {
            size_t k = 6 + rnd() % 6; /* rare-ish Latin words: no common English */
            for (size_t j = 0; j < k; j++)
                w[len++] = (char)('a' + rnd() % 26);
        } else {
            size_t k = 2 + rnd() % 3;
            for (size_t j = 0; j < k; j++)
                len += put_cjk(w + len);
        }
        fprintf(f, "%.*s\n", (int)len, w);
    }
    fclose(f);
    return strdup(path);
}

static const flt_conf_regex_t bench_regex[20] = {
    {"cn_mobile", "1[3-9]\\d{9}", FLT_ACTION_MASK},
    {"email", "[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}", FLT_ACTION_MASK},
    {"cn_id", "\\d{17}[\\dXx]", FLT_ACTION_MASK},
    {"card", "\\b(?:\\d[ -]?){13,16}\\b", FLT_ACTION_MASK},
    {"ipv4", "\\b(?:\\d{1,3}\\.){3}\\d{1,3}\\b", FLT_ACTION_LOG},
    {"url_token", "https?://[^\\s]*[?&]token=[^\\s&]+", FLT_ACTION_MASK},
    {"ssn", "\\b\\d{3}-\\d{2}-\\d{4}\\b", FLT_ACTION_MASK},
    {"iban", "\\b[A-Z]{2}\\d{2}[A-Z0-9]{11,30}\\b", FLT_ACTION_MASK},
    {"aws_key", "AKIA[0-9A-Z]{16}", FLT_ACTION_BLOCK},
    {"jwt", "eyJ[A-Za-z0-9_-]{10,}\\.[A-Za-z0-9_-]{10,}", FLT_ACTION_MASK},
    {"pem", "-----BEGIN [A-Z ]*PRIVATE KEY-----", FLT_ACTION_BLOCK},
    {"password", "(?i)password\\s*[:=]\\s*\\S+", FLT_ACTION_MASK},
    {"api_key", "(?i)api[_-]?key\\s*[:=]\\s*\\S+", FLT_ACTION_MASK},
    {"cn_landline", "0\\d{2,3}-\\d{7,8}", FLT_ACTION_MASK},
    {"us_phone", "\\(\\d{3}\\) \\d{3}-\\d{4}", FLT_ACTION_MASK},
    {"btc", "\\b[13][a-km-zA-HJ-NP-Z1-9]{25,34}\\b", FLT_ACTION_LOG},
    {"mac", "(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}", FLT_ACTION_LOG},
    {"wechat", "(?i)wechat\\s*id\\s*[:：]\\s*\\w+", FLT_ACTION_MASK},
    {"qq", "(?i)\\bqq\\s*[:：]?\\s*\\d{5,11}", FLT_ACTION_MASK},
    {"passport", "\\b[EG]\\d{8}\\b", FLT_ACTION_MASK},
};

static flt_ruleset_t *build(size_t nwords, size_t nregex, double *ms)
{
    flt_conf_t c;
    flt_conf_defaults(&c);
    char *path = nwords ? word_file(nwords) : NULL;
    flt_conf_words_t w = {path, FLT_ACTION_MASK, "bench"};
    c.words = &w;
    c.nwords = nwords ? 1 : 0;
    c.regex = bench_regex;
    c.nregex = nregex;
    char err[256];
    int64_t t0 = sl_now_ns();
    flt_ruleset_t *rs = flt_ruleset_build(&c, err, sizeof err);
    if (ms)
        *ms = (double)(sl_now_ns() - t0) / 1e6;
    if (path) {
        unlink(path);
        free(path);
    }
    if (!rs) {
        fprintf(stderr, "ruleset: %s\n", err);
        exit(1);
    }
    return rs;
}

/* Answer-like text: English words, Chinese runs, numbers, punctuation. */
static char *make_text(size_t n)
{
    static const char *vocab[] = {"the",   "model", "answer", "is",      "a",       "of",
                                  "and",   "to",    "in",     "that",    "gateway", "stream",
                                  "token", "with",  "for",    "request", "server",  "we",
                                  "can",   "this",  "data",   "time",    "user",    "2024"};
    char *t = malloc(n + 64);
    size_t len = 0;
    while (len < n) {
        uint32_t r = rnd() % 100;
        if (r < 70) {
            len += (size_t)sprintf(t + len, "%s ", vocab[rnd() % SL_ARRAY_LEN(vocab)]);
        } else if (r < 90) {
            size_t k = 1 + rnd() % 4;
            for (size_t j = 0; j < k; j++)
                len += put_cjk(t + len);
        } else if (r < 96) {
            len += (size_t)sprintf(t + len, "%u", rnd() % 100000);
        } else {
            t[len++] = ",.;:!?\n"[rnd() % 7];
            t[len++] = ' ';
        }
    }
    t[len] = '\0';
    return t;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Splits text into delta-sized pieces (1..2 tokens: 2..12 bytes) at
 * character boundaries. Returns the number of pieces. */
static size_t pieces(const char *t, size_t n, size_t *off, size_t max)
{
    size_t k = 0, pos = 0;
    while (pos < n && k < max) {
        off[k++] = pos;
        size_t end = pos + 2 + rnd() % 11;
        if (end > n)
            end = n;
        while (end < n && ((unsigned char)t[end] & 0xC0) == 0x80)
            end++;
        pos = end;
    }
    off[k] = pos;
    return k;
}

static void bench_text(flt_ruleset_t *rs, const char *label, const char *text, size_t n)
{
    sl_buf_t out = {0};
    int64_t t0 = cpu_ns();
    flt_chan_rc_t rc = flt_text_filter(rs, text, n, &out);
    double s_whole = (double)(cpu_ns() - t0) / 1e9;
    if (rc == FLT_CHAN_ERR) {
        fprintf(stderr, "filter failed\n");
        exit(1);
    }
    sl_buf_free(&out);

    size_t *off = malloc((n + 2) * sizeof *off);
    size_t np = pieces(text, n, off, n);
    flt_chan_t c;
    if (flt_chan_init(&c, rs) != 0)
        exit(1);
    t0 = cpu_ns();
    for (size_t i = 0; i < np; i++) {
        out.len = 0;
        if (flt_chan_feed(&c, text + off[i], off[i + 1] - off[i], &out) != FLT_CHAN_OK) {
            flt_chan_fini(&c); /* a block rule hit: go on with a new channel */
            if (flt_chan_init(&c, rs) != 0)
                exit(1);
        }
    }
    double s_stream = (double)(cpu_ns() - t0) / 1e9;
    flt_chan_fini(&c);
    sl_buf_free(&out);
    free(off);
    printf("| %-28s | %8.1f | %8.1f | %6.3f |\n", label, (double)n / 1e6 / s_whole,
           (double)n / 1e6 / s_stream, s_stream / (double)np * 1e6);
}

static void bench_events(flt_ruleset_t *rs, const char *label, const char *text, size_t n,
                         size_t nev)
{
    size_t *off = malloc((nev + 2) * sizeof *off);
    size_t np = pieces(text, n, off, nev);
    char **ev = malloc(np * sizeof *ev);
    size_t *evlen = malloc(np * sizeof *evlen);
    size_t bytes = 0;
    for (size_t i = 0; i < np; i++) {
        json_t *o =
            json_pack("{s:s, s:s, s:i, s:s, s:s, s:[{s:i, s:{s:s%}, s:n, s:n}]}", "id",
                      "chatcmpl-8a7f2b9c41d04e5f", "object", "chat.completion.chunk", "created",
                      1718000000, "model", "qwen2.5-7b-instruct", "system_fingerprint",
                      "fp_0123456789", "choices", "index", 0, "delta", "content", text + off[i],
                      off[i + 1] - off[i], "logprobs", "finish_reason");
        ev[i] = json_dumps(o, JSON_COMPACT);
        evlen[i] = strlen(ev[i]);
        bytes += evlen[i];
        json_decref(o);
    }
    if (!rs) { /* baseline: what any rewrite of the chunk costs in jansson */
        int64_t c0 = cpu_ns();
        for (size_t i = 0; i < np; i++) {
            json_t *j = json_loadb(ev[i], evlen[i], 0, NULL);
            json_decref(j);
        }
        double parse = (double)(cpu_ns() - c0) / (double)np;
        c0 = cpu_ns();
        for (size_t i = 0; i < np; i++) {
            json_t *j = json_loadb(ev[i], evlen[i], 0, NULL);
            free(json_dumps(j, JSON_COMPACT));
            json_decref(j);
        }
        double both = (double)(cpu_ns() - c0) / (double)np;
        printf("| %-28s | %7.2f |         |         |        | %zu |\n", "jansson parse only",
               parse / 1e3, bytes / np);
        printf("| %-28s | %7.2f |         |         |        | %zu |\n", "jansson parse + dump",
               both / 1e3, bytes / np);
        static const yajl_callbacks none = {0};
        c0 = cpu_ns();
        for (size_t i = 0; i < np; i++) {
            yajl_handle h = yajl_alloc(&none, NULL, NULL);
            if (yajl_parse(h, (const unsigned char *)ev[i], evlen[i]) != yajl_status_ok ||
                yajl_complete_parse(h) != yajl_status_ok)
                exit(1);
            yajl_free(h);
        }
        double yajl = (double)(cpu_ns() - c0) / (double)np;
        printf("| %-28s | %7.2f |         |         |        | %zu |\n", "yajl parse only",
               yajl / 1e3, bytes / np);
        for (size_t i = 0; i < np; i++)
            free(ev[i]);
        free(ev);
        free(evlen);
        free(off);
        return;
    }
    int64_t *dt = malloc(np * sizeof *dt);
    flt_stream_t *st = flt_stream_new(rs);
    flt_out_t out = {0};
    size_t passed = 0, replaced = 0;
    int64_t c0 = cpu_ns();
    for (size_t i = 0; i < np; i++) {
        int64_t t0 = sl_now_ns();
        flt_ev_verdict_t v = flt_stream_event(st, ev[i], evlen[i], &out);
        dt[i] = sl_now_ns() - t0;
        passed += v == FLT_EV_PASS;
        replaced += v == FLT_EV_REPLACE;
        flt_out_reset(&out);
        if (v == FLT_EV_BLOCK) { /* an aws_key look-alike: start a new stream */
            flt_stream_free(st);
            st = flt_stream_new(rs);
        }
    }
    double sum = (double)(cpu_ns() - c0);
    flt_out_release(&out);
    flt_stream_free(st);
    qsort(dt, np, sizeof *dt, cmp_i64);
    printf("| %-28s | %7.2f | %7.2f | %7.2f | %5.1f%% | %zu |\n", label, sum / (double)np / 1e3,
           (double)dt[np / 2] / 1e3, (double)dt[np * 99 / 100] / 1e3,
           100.0 * (double)passed / (double)np, bytes / np);
    (void)replaced;
    for (size_t i = 0; i < np; i++)
        free(ev[i]);
    free(ev);
    free(evlen);
    free(dt);
    free(off);
}

/* The Responses API's delta events (gateway/flt_responses.c) through the
 * same rules: {"type":"response.output_text.delta",...,"delta":"..."}. */
static void bench_responses(flt_ruleset_t *rs, const char *label, const char *text, size_t n,
                            size_t nev)
{
    size_t *off = malloc((nev + 2) * sizeof *off);
    size_t np = pieces(text, n, off, nev);
    char **ev = malloc(np * sizeof *ev);
    size_t *evlen = malloc(np * sizeof *evlen), bytes = 0;
    for (size_t i = 0; i < np; i++) {
        json_t *o =
            json_pack("{s:s, s:s, s:i, s:i, s:s%, s:[]}", "type", "response.output_text.delta",
                      "item_id", "msg_67ccf18ef5fc8190", "output_index", 0, "content_index", 0,
                      "delta", text + off[i], off[i + 1] - off[i], "logprobs");
        ev[i] = json_dumps(o, JSON_COMPACT);
        evlen[i] = strlen(ev[i]);
        bytes += evlen[i];
        json_decref(o);
    }
    gw_flt_resp_t *x = gw_flt_resp_new();
    flt_stream_t *st = flt_stream_new(rs);
    gw_payloads_t out;
    memset(&out, 0, sizeof out);
    size_t passed = 0;
    int64_t c0 = cpu_ns();
    for (size_t i = 0; i < np; i++) {
        gw_ev_rc_t rc = gw_flt_resp_event(x, st, ev[i], evlen[i], &out);
        passed += rc == GW_EV_PASS;
        gw_payloads_clear(&out);
        if (rc == GW_EV_STOP || i % 4096 == 4095) { /* a block, or a new answer */
            gw_flt_resp_free(x);
            flt_stream_free(st);
            x = gw_flt_resp_new();
            st = flt_stream_new(rs);
        }
    }
    double sum = (double)(cpu_ns() - c0);
    gw_flt_resp_free(x);
    flt_stream_free(st);
    printf("| %-28s | %7.2f |         |         | %5.1f%% | %zu |\n", label, sum / (double)np / 1e3,
           100.0 * (double)passed / (double)np, bytes / np);
    for (size_t i = 0; i < np; i++)
        free(ev[i]);
    free(ev);
    free(evlen);
    free(off);
}

/* Short streams of one server: see the usage at the top. */
static int bench_streams(const char *variant, size_t nstreams)
{
    bool early = strcmp(variant, "early") == 0, late = strcmp(variant, "late") == 0;
    bool one = strcmp(variant, "one") == 0;
    if (!early && !late && !one && strcmp(variant, "same") != 0)
        return 2;
    flt_ruleset_t *rs = build(10000, 20, NULL);
    static const char *const body[] = {
        "{\"id\":\"chatcmpl-%s%08zx\",\"object\":\"chat.completion.chunk\",\"created\":%zu,"
        "\"model\":\"qwen2.5-7b-instruct\",\"system_fingerprint\":\"fp_0123456789\",\"choices\":"
        "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
        "\"finish_reason\":null}]%s}",
        "{\"id\":\"chatcmpl-%s%08zx\",\"object\":\"chat.completion.chunk\",\"created\":%zu,"
        "\"model\":\"qwen2.5-7b-instruct\",\"system_fingerprint\":\"fp_0123456789\",\"choices\":"
        "[{\"index\":0,\"delta\":{\"content\":\"The answer is\"},\"logprobs\":null,"
        "\"finish_reason\":null}]%s}",
        "{\"id\":\"chatcmpl-%s%08zx\",\"object\":\"chat.completion.chunk\",\"created\":%zu,"
        "\"model\":\"qwen2.5-7b-instruct\",\"system_fingerprint\":\"fp_0123456789\",\"choices\":"
        "[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]%s}",
    };
    flt_out_t out = {0};
    size_t events = 0;
    int64_t c0 = cpu_ns();
    flt_stream_t *st = NULL;
    for (size_t i = 0; i < nstreams; i++) {
        if (!st)
            st = flt_stream_new(rs);
        for (size_t k = 0; k < SL_ARRAY_LEN(body); k++) {
            if (one && (k == 2 || (k == 0 && i > 0)))
                continue; /* one role event, content events, no finish */
            char ev[512], tail[32] = "";
            if (late)
                snprintf(tail, sizeof tail, ",\"t\":%zu.5", i * 3 + k);
            int n = snprintf(ev, sizeof ev, body[k], early ? "\\u0041" : "", one ? 0 : i,
                             1700000000 + (one ? 0 : i), tail);
            if (flt_stream_event(st, ev, (size_t)n, &out) == FLT_EV_ERROR)
                return 1;
            flt_out_reset(&out);
            events++;
        }
        if (one && i + 1 < nstreams)
            continue;
        if (flt_stream_end(st, &out) == FLT_EV_ERROR)
            return 1;
        flt_out_reset(&out);
        flt_stream_free(st);
        st = NULL;
    }
    printf("streams %s: %zu events, %.3f us CPU per event\n", variant, events,
           (double)(cpu_ns() - c0) / 1e3 / (double)events);
    flt_out_release(&out);
    flt_ruleset_unref(rs);
    return 0;
}

/* flt_text_clean on a long ASCII prefix and a late é (see the top). */
static int bench_clean(size_t len, long calls)
{
    char err[256];
    flt_ruleset_t *rs = issue16_rules(false, err, sizeof err);
    static const char prose[] = "Write one sentence about the sea, please, in plain English. ";
    static const char tail[] = "caf\xc3\xa9 by the harbour.";
    char *t = malloc(len + sizeof tail);
    if (!rs || !t) {
        fprintf(stderr, "flt_bench: %s\n", rs ? "out of memory" : err);
        return 1;
    }
    for (size_t i = 0; i < len; i++)
        t[i] = prose[i % (sizeof prose - 1)];
    memcpy(t + len, tail, sizeof tail - 1);
    long clean = 0;
    for (long i = 0; i < calls; i++)
        clean += flt_text_clean(rs, t, len + sizeof tail - 1);
    printf("clean %zu bytes: %ld of %ld calls clean\n", len + sizeof tail - 1, clean, calls);
    free(t);
    flt_ruleset_unref(rs);
    return clean == calls ? 0 : 1;
}

/* A Responses stream's events from an SSE capture: see the usage at the
 * top. */
static int bench_respstream(const char *file, size_t nstreams)
{
    FILE *f = fopen(file, "rb");
    if (!f)
        return 2;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *raw[64], *data[64];
    size_t rawlen[64], datalen[64], nev = 0;
    for (const char *p = buf, *e; nev < 64 && (e = strstr(p, "\n\n")) != NULL; p = e + 2) {
        const char *d = strstr(p, "data: ");
        if (!d || d > e)
            continue;
        raw[nev] = p;
        rawlen[nev] = (size_t)(e + 2 - p);
        data[nev] = d + 6;
        datalen[nev] = (size_t)(e - d - 6);
        nev++;
    }
    char err[256];
    flt_ruleset_t *rs = issue16_rules(true, err, sizeof err);
    if (!rs) {
        fprintf(stderr, "flt_bench: %s\n", err);
        return 1;
    }
    gw_payloads_t out;
    memset(&out, 0, sizeof out);
    size_t pass = 0, repl = 0, tokens = 0, usage = 0;
    for (size_t s = 0; s < nstreams; s++) {
        gw_flt_resp_t *x = gw_flt_resp_new();
        flt_stream_t *st = flt_stream_new(rs);
        for (size_t i = 0; i < nev; i++) {
            bool content;
            usage += gw_llm_resp_scan(raw[i], rawlen[i], &content);
            tokens += content;
            gw_ev_rc_t rc = gw_flt_resp_event(x, st, data[i], datalen[i], &out);
            pass += rc == GW_EV_PASS;
            repl += rc == GW_EV_REPLACE;
            gw_payloads_clear(&out);
        }
        gw_flt_resp_free(x);
        flt_stream_free(st);
    }
    printf("%zu streams of %zu events: %zu passed, %zu replaced, %zu tokens, %zu usage\n", nstreams,
           nev, pass, repl, tokens, usage);
    flt_ruleset_unref(rs);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "respstream") == 0)
        return bench_respstream(argv[2], argc > 3 ? (size_t)atol(argv[3]) : 1000);
    if (argc > 2 && strcmp(argv[1], "clean") == 0)
        return bench_clean((size_t)atol(argv[2]), argc > 3 ? atol(argv[3]) : 1000);
    if (argc > 2 && strcmp(argv[1], "streams") == 0)
        return bench_streams(argv[2], argc > 3 ? (size_t)atol(argv[3]) : 20000);
    if (argc > 1 && strcmp(argv[1], "events") == 0) {
        /* per-event figures only, a few rounds (to interleave with another build) */
        int rounds = argc > 2 ? atoi(argv[2]) : 3;
        flt_ruleset_t *full = build(10000, 20, NULL);
        flt_ruleset_t *words = build(10000, 0, NULL);
        size_t n = 2u << 20;
        char *text = make_text(n);
        n = strlen(text);
        printf(
            "| rules                        | mean us | p50 us  | p99 us  | passed | event bytes "
            "|\n");
        printf("|------------------------------|--------:|--------:|--------:|-------:|------------"
               ":|\n");
        for (int r = 0; r < rounds; r++) {
            bench_events(full, "10k words + 20 regexes", text, n, 200000);
            bench_events(words, "10k words only", text, n, 200000);
            bench_events(NULL, "", text, n, 200000);
            bench_responses(full, "responses: 10k w + 20 re", text, n, 200000);
            bench_responses(words, "responses: 10k words", text, n, 200000);
        }
        flt_ruleset_unref(full);
        flt_ruleset_unref(words);
        free(text);
        return 0;
    }
    size_t mb = argc > 1 ? (size_t)atoi(argv[1]) : 8;
    if (mb < 1)
        mb = 1;
    double ms10k, ms100k;
    flt_ruleset_t *full = build(10000, 20, &ms10k);
    flt_ruleset_t *big = build(100000, 0, &ms100k);
    flt_ruleset_t *words = build(10000, 0, NULL);
    flt_ruleset_t *regex = build(0, 20, NULL);
    printf("load: 10,000 words + 20 regexes %.1f ms; 100,000 words %.1f ms (%zu distinct)\n\n",
           ms10k, ms100k, flt_ruleset_word_count(big));

    size_t n = mb << 20;
    char *text = make_text(n);
    n = strlen(text);
    printf("text: %.1f MB, delta pieces of 2..12 bytes\n\n", (double)n / 1e6);
    printf("| rules                        | whole MB/s | streamed MB/s | us/piece |\n");
    printf("|------------------------------|-----------:|--------------:|---------:|\n");
    bench_text(full, "10k words + 20 regexes", text, n);
    bench_text(words, "10k words only", text, n);
    bench_text(regex, "20 regexes only", text, n);
    bench_text(big, "100k words only", text, n);

    printf("\nper SSE event (flt_stream_event on a chat.completion.chunk):\n\n");
    printf("(mean: CPU time per event including the clock reads; p50/p99: wall time)\n\n");
    printf(
        "| rules                        | mean us | p50 us  | p99 us  | passed | event bytes |\n");
    printf(
        "|------------------------------|--------:|--------:|--------:|-------:|------------:|\n");
    bench_events(full, "10k words + 20 regexes", text, n, 200000);
    bench_events(words, "10k words only", text, n, 200000);
    bench_events(regex, "20 regexes only", text, n, 200000);
    bench_events(NULL, "", text, n, 200000);
    flt_ruleset_unref(full);
    flt_ruleset_unref(big);
    flt_ruleset_unref(words);
    flt_ruleset_unref(regex);
    free(text);
    return 0;
}
