/*
 * sl_resp.h — what token accounting reads from one event of an OpenAI
 * Responses API stream (POST /v1/responses, "stream": true): the usage of
 * response.completed (also response.incomplete / .failed), which that API
 * nests in the event's `response` object (`response.usage`: input_tokens,
 * output_tokens, total_tokens), and the text of a `*.delta` event, counted
 * for an estimate when the stream is cut before its usage. Pure: bytes in,
 * facts out, read with yajl's callbacks (no tree: response.completed
 * repeats the whole answer). Used by ratelimit/ (budgets) and gateway/
 * (the per-model token metrics, the access log).
 */
#ifndef SL_RESP_H
#define SL_RESP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What sl_resp_event_read reads. */
#define SL_RESP_USAGE 0x1u /* response.usage */
#define SL_RESP_TEXT  0x2u /* a *.delta event's text (every string is then decoded) */

typedef struct sl_resp_ev {
    /* SL_RESP_USAGE: a response.usage object was read to its end; each
     * count an integer of its own members (have_*), none negative. */
    bool usage;
    bool have_in, have_out, have_total;
    int64_t in, out, total;
    /* SL_RESP_TEXT: the event is a `*.delta` whose `delta` is a string
     * (text, refusal, reasoning, tool-call arguments; not
     * response.audio.delta's base64), and its characters: ASCII, and
     * others (UTF-8 lead bytes), after JSON unescaping. */
    bool delta;
    int64_t ascii, other;
} sl_resp_ev_t;

/* Reads data[0..len) (one event's data, a JSON object) for what (SL_RESP_*
 * flags) into *out (zeroed first). The parse stops at the end of the usage
 * object (what follows is not read). 0 read, -1 not JSON that yajl read up
 * to there (*out then holds nothing). */
int sl_resp_event_read(const char *data, size_t len, unsigned what, sl_resp_ev_t *out);

/* sl_resp_event_read(data, len, SL_RESP_USAGE, out): the same result for
 * every input, most events of one server answered from this thread's kept
 * shapes of the usage events it read before (common/jshape.h; sl_resp.c
 * says why the result is the same) instead of yajl's pass. */
int sl_resp_usage_read(const char *data, size_t len, sl_resp_ev_t *out);

/* Forgets this thread's kept usage shapes; the reads they answered since
 * (tests). */
void sl_resp_shapes_clear(void);
uint64_t sl_resp_shape_hits(void);

/* The tokens a usage charges: total_tokens when it is there, else
 * input + output; -1 when e holds no usage. */
int64_t sl_resp_usage_total(const sl_resp_ev_t *e);

#endif
