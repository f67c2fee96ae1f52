/*
 * sem.c — the semantic index: per partition (model, user in user scope,
 * system prompt) a bounded ring of int8-quantised unit vectors, each
 * naming the exact key of the answer it stands for; a lookup scans the
 * partition with the int8 dot kernel and returns the best cosine at or
 * above the threshold. Partitions are bounded too (the least recently
 * added goes first). Also the persisted form of an entry (what the Redis
 * stream carries, so every instance can load and tail it) and the
 * /v1/embeddings request and answer.
 *
 * Quantisation: v is scaled to unit length u, then q = round(u * 127 /
 * max|u|) with scale = max|u| / 127, so cos(a, b) ~ dot(qa, qb) * sa * sb.
 * The error's spread is ~1e-3 at 128 dimensions and shrinks as 1/sqrt(dim):
 * only a cosine within ~0.002 of the threshold can fall either side.
 *
 * Large partitions are searched in two passes, because a flat scan of
 * 100k x 384 bytes is bound by memory bandwidth (~2.5 ms on one core):
 * every entry also keeps a 64-byte sketch — its vector through a fixed
 * random +-1 projection to 64 dimensions (Johnson-Lindenstrauss), unit-
 * normalised and int8-quantised — so the first pass reads 64 bytes per
 * entry; the entries whose estimated cosine comes within CACHE_SK_MARGIN
 * of the threshold (the best CACHE_SK_TOPK of them) are then compared at
 * full dimension, and only that exact cosine decides. The estimate's
 * spread at cosine 0.95 is ~0.012 at 64 dimensions, so a true match falls
 * out of the first pass with negligible probability (bench/cache_bench.c
 * measures the recall against the flat scan).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <uthash.h>

#include "cache/cache_internal.h"

#define CACHE_SK_DIM    64   /* sketch dimensions (bytes per entry in the first pass) */
#define CACHE_SK_MARGIN 0.08 /* first pass keeps estimates >= threshold - this */
#define CACHE_SK_TOPK   64   /* ... at most this many, the best */
#define CACHE_SK_FROM   2048 /* partitions up to this size are scanned flat */
#define CACHE_SK_CHUNK  1024 /* rows scored per kernel call (a stack buffer) */

typedef struct cache_part cache_part_t;
struct cache_part {
    unsigned char id[CACHE_KEY_LEN];
    size_t n, cap, next; /* next: the slot the next add overwrites once full */
    int8_t *vecs;        /* cap x dim */
    float *scales;
    unsigned char *keys; /* cap x CACHE_KEY_LEN */
    int64_t *expires;
    int8_t *sk; /* cap x CACHE_SK_DIM */
    UT_hash_handle hh;
    TAILQ_ENTRY(cache_part) link; /* most recently added first */
};
TAILQ_HEAD(cache_plist, cache_part);

struct cache_sem {
    pthread_rwlock_t lock;
    size_t dim;   /* 0 until the first vector */
    int8_t *proj; /* CACHE_SK_DIM x dim of +-1, fixed seed */
    size_t max_per_part, max_parts, nparts, count;
    size_t max_bytes, bytes; /* as allocated: cap x cache_slot_bytes() per partition */
    size_t flat_max;         /* partitions up to this size are scanned flat */
    cache_part_t *by_id;
    struct cache_plist order;
};

/* What one slot of a partition costs: vector, sketch, key, scale, expiry. */
static size_t cache_slot_bytes(size_t dim)
{
    return dim + CACHE_SK_DIM + CACHE_KEY_LEN + sizeof(float) + sizeof(int64_t);
}

cache_sem_t *cache_sem_new(size_t max_per_partition, size_t max_partitions, size_t max_bytes)
{
    cache_metrics_init();
    cache_sem_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    pthread_rwlock_init(&s->lock, NULL);
    s->max_per_part = max_per_partition ? max_per_partition : 1;
    s->max_parts = max_partitions ? max_partitions : 1;
    s->flat_max = CACHE_SK_FROM;
    s->max_bytes = max_bytes ? max_bytes : SIZE_MAX;
    TAILQ_INIT(&s->order);
    return s;
}

static void cache_part_free(cache_part_t *p)
{
    free(p->vecs);
    free(p->scales);
    free(p->keys);
    free(p->expires);
    free(p->sk);
    free(p);
}

/* Under the write lock. */
static void cache_part_drop(cache_sem_t *s, cache_part_t *p)
{
    HASH_DEL(s->by_id, p);
    TAILQ_REMOVE(&s->order, p, link);
    s->nparts--;
    s->count -= p->n;
    s->bytes -= p->cap * cache_slot_bytes(s->dim);
    sl_gauge_add(sl_metric_series0(cache_m.sem_entries), -(int64_t)p->n);
    cache_part_free(p);
}

void cache_sem_free(cache_sem_t *s)
{
    if (!s)
        return;
    cache_part_t *p, *tmp;
    HASH_ITER(hh, s->by_id, p, tmp)
    cache_part_drop(s, p);
    pthread_rwlock_destroy(&s->lock);
    free(s->proj);
    free(s);
}

size_t cache_sem_bytes(cache_sem_t *s)
{
    pthread_rwlock_rdlock(&s->lock);
    size_t n = s->bytes;
    pthread_rwlock_unlock(&s->lock);
    return n;
}

size_t cache_sem_count(cache_sem_t *s)
{
    pthread_rwlock_rdlock(&s->lock);
    size_t n = s->count;
    pthread_rwlock_unlock(&s->lock);
    return n;
}

int cache_quantise(const float *v, size_t dim, int8_t *out, float *scale)
{
    double ss = 0;
    for (size_t i = 0; i < dim; i++)
        ss += (double)v[i] * v[i];
    if (!(ss > 0) || !isfinite(ss))
        return -1;
    double inv = 1.0 / sqrt(ss), maxabs = 0;
    for (size_t i = 0; i < dim; i++)
        maxabs = fmax(maxabs, fabs(v[i] * inv));
    double k = 127.0 / maxabs;
    for (size_t i = 0; i < dim; i++) {
        long q = lrint(v[i] * inv * k);
        out[i] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
    }
    *scale = (float)(maxabs / 127.0);
    return 0;
}

/* Grows a partition's arrays to hold one more (up to max_per_part), making
 * room under max_bytes by dropping the least recently added other
 * partitions; -1 when even that leaves no room (then the partition keeps
 * its size and overwrites its oldest). */
static int cache_part_grow(cache_sem_t *s, cache_part_t *p)
{
    size_t cap = p->cap ? p->cap * 2 : 64;
    if (cap > s->max_per_part)
        cap = s->max_per_part;
    size_t slot = cache_slot_bytes(s->dim), more = (cap - p->cap) * slot;
    while (s->bytes + more > s->max_bytes) {
        cache_part_t *old = TAILQ_LAST(&s->order, cache_plist);
        if (!old || old == p)
            break;
        cache_part_drop(s, old);
    }
    if (s->bytes + more > s->max_bytes) {
        /* alone over the bound: grow only as far as it allows */
        size_t fit = (s->max_bytes - s->bytes) / slot;
        if (fit == 0)
            return -1;
        cap = p->cap + fit;
        more = fit * slot;
    }
    int8_t *v = realloc(p->vecs, cap * s->dim);
    if (!v)
        return -1;
    p->vecs = v;
    float *sc = realloc(p->scales, cap * sizeof(float));
    if (!sc)
        return -1;
    p->scales = sc;
    unsigned char *k = realloc(p->keys, cap * CACHE_KEY_LEN);
    if (!k)
        return -1;
    p->keys = k;
    int64_t *e = realloc(p->expires, cap * sizeof(int64_t));
    if (!e)
        return -1;
    p->expires = e;
    int8_t *sk = realloc(p->sk, cap * CACHE_SK_DIM);
    if (!sk)
        return -1;
    p->sk = sk;
    p->cap = cap;
    s->bytes += more;
    return 0;
}

/* The fixed projection for dim (under the write lock, once). The same seed
 * everywhere, though only this process's sketches are ever compared. */
static int cache_proj_init(cache_sem_t *s, size_t dim)
{
    s->proj = malloc(CACHE_SK_DIM * dim);
    if (!s->proj)
        return -1;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < CACHE_SK_DIM * dim; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s->proj[i] = (x >> 63) ? 1 : -1;
    }
    return 0;
}

/* The sketch of a quantised vector: the projection, unit-normalised, at
 * one fixed scale for every entry (CACHE_SK_Q per unit, clipped), so the
 * first pass compares raw integer dot products with one integer floor. A
 * unit vector's coordinates in 64 dimensions sit near 1/8; clipping at
 * 0.5 touches almost none. */
#define CACHE_SK_Q 254.0

static int cache_sketch(const cache_sem_t *s, const int8_t *q, int8_t *out)
{
    /* The projection of the int8 vector is exact in integers (the kernel
     * again); the vector's scale cancels in the normalisation. */
    int32_t yi[CACHE_SK_DIM];
    cache_dot_i8_rows(q, s->proj, s->dim, CACHE_SK_DIM, yi);
    double y[CACHE_SK_DIM], ss = 0;
    for (size_t j = 0; j < CACHE_SK_DIM; j++) {
        y[j] = yi[j];
        ss += y[j] * y[j];
    }
    if (!(ss > 0) || !isfinite(ss))
        return -1;
    double k = CACHE_SK_Q / sqrt(ss);
    for (size_t j = 0; j < CACHE_SK_DIM; j++) {
        long v = lrint(y[j] * k);
        out[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    return 0;
}

/* Adds a quantised vector (dim already checked). */
static int cache_sem_add_q(cache_sem_t *s, const unsigned char part[CACHE_KEY_LEN], const int8_t *q,
                           float scale, size_t dim, const unsigned char key[CACHE_KEY_LEN],
                           int64_t expires_ms)
{
    int rc = -1;
    pthread_rwlock_wrlock(&s->lock);
    if (s->dim == 0) {
        if (cache_proj_init(s, dim) != 0)
            goto out;
        s->dim = dim;
    }
    if (dim != s->dim)
        goto out;
    int8_t sk[CACHE_SK_DIM];
    if (cache_sketch(s, q, sk) != 0)
        goto out;
    cache_part_t *p;
    HASH_FIND(hh, s->by_id, part, CACHE_KEY_LEN, p);
    if (!p) {
        if (s->nparts >= s->max_parts)
            cache_part_drop(s, TAILQ_LAST(&s->order, cache_plist));
        p = calloc(1, sizeof(*p));
        if (!p)
            goto out;
        memcpy(p->id, part, CACHE_KEY_LEN);
        HASH_ADD(hh, s->by_id, id, CACHE_KEY_LEN, p);
        TAILQ_INSERT_HEAD(&s->order, p, link);
        s->nparts++;
    } else {
        TAILQ_REMOVE(&s->order, p, link);
        TAILQ_INSERT_HEAD(&s->order, p, link);
    }
    /* The same answer again (another instance's copy, a refresh): in place. */
    size_t slot = SIZE_MAX;
    for (size_t i = 0; i < p->n; i++)
        if (memcmp(p->keys + i * CACHE_KEY_LEN, key, CACHE_KEY_LEN) == 0) {
            slot = i;
            break;
        }
    if (slot == SIZE_MAX) {
        if (p->n == p->cap && p->cap < s->max_per_part && cache_part_grow(s, p) != 0 && p->cap == 0)
            goto out; /* no room at all */
        if (p->n < p->cap) {
            slot = p->n++;
            s->count++;
            sl_gauge_add(sl_metric_series0(cache_m.sem_entries), 1);
        } else {
            slot = p->next; /* full: the oldest goes */
            p->next = (p->next + 1) % p->cap;
        }
    }
    memcpy(p->vecs + slot * dim, q, dim);
    p->scales[slot] = scale;
    memcpy(p->keys + slot * CACHE_KEY_LEN, key, CACHE_KEY_LEN);
    p->expires[slot] = expires_ms;
    memcpy(p->sk + slot * CACHE_SK_DIM, sk, CACHE_SK_DIM);
    rc = 0;
out:
    pthread_rwlock_unlock(&s->lock);
    return rc;
}

int cache_sem_add(cache_sem_t *s, const unsigned char part[CACHE_KEY_LEN], const float *vec,
                  size_t dim, const unsigned char key[CACHE_KEY_LEN], int64_t expires_ms)
{
    if (dim == 0 || dim > CACHE_SEM_MAX_DIM)
        return -1;
    int8_t *q = malloc(dim);
    float scale;
    int rc = -1;
    if (q && cache_quantise(vec, dim, q, &scale) == 0)
        rc = cache_sem_add_q(s, part, q, scale, dim, key, expires_ms);
    free(q);
    return rc;
}

typedef struct cache_cand {
    double est;
    size_t i;
} cache_cand_t;

/* Under the read lock: the best live entry of p and its exact cosine. */
static double cache_part_search(const cache_sem_t *s, const cache_part_t *p, const int8_t *q,
                                float qs, double threshold, int64_t now_ms, size_t *best_i)
{
    int32_t dots[CACHE_SK_CHUNK];
    double best = -2;
    size_t dim = s->dim;
    if (p->n <= s->flat_max) {
        for (size_t c0 = 0; c0 < p->n; c0 += CACHE_SK_CHUNK) {
            size_t m = SL_MIN(CACHE_SK_CHUNK, p->n - c0);
            cache_dot_i8_rows(q, p->vecs + c0 * dim, dim, m, dots);
            for (size_t k = 0; k < m; k++) {
                size_t i = c0 + k;
                double c = (double)dots[k] * qs * p->scales[i];
                if (p->expires[i] > now_ms && c > best) {
                    best = c;
                    *best_i = i;
                }
            }
        }
        return best;
    }
    int8_t qsk[CACHE_SK_DIM];
    if (cache_sketch(s, q, qsk) != 0)
        return best;
    cache_cand_t cand[CACHE_SK_TOPK];
    size_t nc = 0, worst = 0;
    int32_t floor = (int32_t)((threshold - CACHE_SK_MARGIN) * CACHE_SK_Q * CACHE_SK_Q);
    for (size_t c0 = 0; c0 < p->n; c0 += CACHE_SK_CHUNK) {
        size_t m = SL_MIN(CACHE_SK_CHUNK, p->n - c0);
        cache_dot_i8_rows(qsk, p->sk + c0 * CACHE_SK_DIM, CACHE_SK_DIM, m, dots);
        for (size_t k = 0; k < m; k++) {
            size_t i = c0 + k;
            if (dots[k] < floor || p->expires[i] <= now_ms)
                continue;
            double est = dots[k];
            if (nc < CACHE_SK_TOPK) {
                cand[nc++] = (cache_cand_t){est, i};
            } else if (est > cand[worst].est) {
                cand[worst] = (cache_cand_t){est, i};
            } else {
                continue;
            }
            worst = 0;
            for (size_t j = 1; j < nc; j++)
                if (cand[j].est < cand[worst].est)
                    worst = j;
        }
    }
    for (size_t j = 0; j < nc; j++) {
        size_t i = cand[j].i;
        double c = (double)cache_dot_i8(q, p->vecs + i * dim, dim) * qs * p->scales[i];
        if (c > best) {
            best = c;
            *best_i = i;
        }
    }
    return best;
}

void cache_sem_set_flat_max(cache_sem_t *s, size_t n)
{
    pthread_rwlock_wrlock(&s->lock);
    s->flat_max = n;
    pthread_rwlock_unlock(&s->lock);
}

int cache_sem_lookup(cache_sem_t *s, const unsigned char part[CACHE_KEY_LEN], const float *vec,
                     size_t dim, double threshold, int64_t now_ms, unsigned char key[CACHE_KEY_LEN],
                     double *sim)
{
    if (dim == 0 || dim > CACHE_SEM_MAX_DIM)
        return 0;
    int8_t qbuf[CACHE_SEM_MAX_DIM];
    float qs;
    if (cache_quantise(vec, dim, qbuf, &qs) != 0)
        return 0;
    int found = 0;
    pthread_rwlock_rdlock(&s->lock);
    cache_part_t *p;
    HASH_FIND(hh, s->by_id, part, CACHE_KEY_LEN, p);
    if (p && dim == s->dim) {
        size_t bi = 0;
        double best = cache_part_search(s, p, qbuf, qs, threshold, now_ms, &bi);
        if (best >= threshold) {
            found = 1;
            memcpy(key, p->keys + bi * CACHE_KEY_LEN, CACHE_KEY_LEN);
            if (sim)
                *sim = best;
        }
    }
    pthread_rwlock_unlock(&s->lock);
    return found;
}

/* ---- persisted form ----------------------------------------------------------- */

/* "SC1" | part[32] | key[32] | expires (int64 LE) | dim (uint32 LE) |
 * scale (float, IEEE LE) | dim int8. */
#define CACHE_SEM_MAGIC "SC1"
#define CACHE_SEM_HDR   (3 + 2 * CACHE_KEY_LEN + 8 + 4 + 4)

static void cache_put_le(unsigned char *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t cache_get_le(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

char *cache_sem_encode(const unsigned char part[CACHE_KEY_LEN], const float *vec, size_t dim,
                       const unsigned char key[CACHE_KEY_LEN], int64_t expires_ms, size_t *len)
{
    if (dim == 0 || dim > CACHE_SEM_MAX_DIM)
        return NULL;
    unsigned char *b = malloc(CACHE_SEM_HDR + dim);
    if (!b)
        return NULL;
    float scale;
    if (cache_quantise(vec, dim, (int8_t *)(b + CACHE_SEM_HDR), &scale) != 0) {
        free(b);
        return NULL;
    }
    unsigned char *p = b;
    p = mempcpy(p, CACHE_SEM_MAGIC, 3);
    p = mempcpy(p, part, CACHE_KEY_LEN);
    p = mempcpy(p, key, CACHE_KEY_LEN);
    cache_put_le(p, (uint64_t)expires_ms, 8);
    p += 8;
    cache_put_le(p, (uint64_t)dim, 4);
    p += 4;
    uint32_t sbits;
    memcpy(&sbits, &scale, 4);
    cache_put_le(p, sbits, 4);
    *len = CACHE_SEM_HDR + dim;
    return (char *)b;
}

int cache_sem_apply(cache_sem_t *s, const char *rec, size_t len)
{
    const unsigned char *p = (const unsigned char *)rec;
    if (!rec || len < CACHE_SEM_HDR || memcmp(p, CACHE_SEM_MAGIC, 3) != 0)
        return -1;
    const unsigned char *part = p + 3, *key = p + 3 + CACHE_KEY_LEN;
    const unsigned char *q = key + CACHE_KEY_LEN;
    int64_t expires = (int64_t)cache_get_le(q, 8);
    size_t dim = (size_t)cache_get_le(q + 8, 4);
    uint32_t sbits = (uint32_t)cache_get_le(q + 12, 4);
    float scale;
    memcpy(&scale, &sbits, 4);
    if (dim == 0 || dim > CACHE_SEM_MAX_DIM || len != CACHE_SEM_HDR + dim || !isfinite(scale) ||
        !(scale > 0))
        return -1;
    const int8_t *v = (const int8_t *)(p + CACHE_SEM_HDR);
    for (size_t i = 0; i < dim; i++)
        if (v[i] == -128) /* the kernels' range */
            return -1;
    return cache_sem_add_q(s, part, v, scale, dim, key, expires);
}

/* ---- /v1/embeddings ----------------------------------------------------------- */

char *cache_embed_body(const char *model, const char *text, size_t len, size_t *outlen)
{
    json_t *o = json_pack("{s:s, s:s#, s:s}", "model", model, "input", text, len, "encoding_format",
                          "float");
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s && outlen)
        *outlen = strlen(s);
    return s;
}

float *cache_embed_parse(const char *body, size_t len, size_t *dim)
{
    json_t *o = json_loadb(body, len, 0, NULL);
    const json_t *e = json_object_get(json_array_get(json_object_get(o, "data"), 0), "embedding");
    float *v = NULL;
    size_t n = json_array_size(e);
    if (!json_is_array(e) || n == 0 || n > CACHE_SEM_MAX_DIM)
        goto out;
    v = malloc(n * sizeof(float));
    if (!v)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(e, i);
        if (!json_is_number(x) || !isfinite(json_number_value(x))) {
            SL_FREE(v);
            goto out;
        }
        v[i] = (float)json_number_value(x);
    }
    *dim = n;
out:
    json_decref(o);
    return v;
}
