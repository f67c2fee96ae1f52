/*
 * auth_store.c — the in-process nonce and revocation stores, shared by
 * every worker thread of one sluice process.
 *
 * Nonces: a cuckoo table per shard (16 shards, one mutex each, picked by
 * a key byte): 16-byte slots, four to a cache line, and each key may sit
 * in one of two lines picked by a secret keyed hash, so a lookup reads two
 * lines (fetched together) and nothing else. Expiry writes no entry: a
 * ring of time buckets per shard counts the entries expiring in each
 * AUTH_NONCE_BUCKET_S epoch, and when an epoch is over its count comes off
 * the live total in one step; the entries stay in their slots, where an
 * expired one (NONCE_GRACE_S past its expiry) is a free slot to the next
 * key that needs one. A key whose lines are both full moves another entry
 * to its other line (a bounded walk), and a table grows (doubles) when
 * three quarters of its slots are held or a walk fails. The capacity
 * (nonce_memory / the bytes an entry is counted at) holds for the whole
 * store through one atomic count of live entries, and the tables of all
 * shards together stay within nonce_memory, so no shard can fill while
 * others have room. A full store therefore refuses in O(1) — a two-line
 * lookup (a replay is still a replay) and an atomic add — instead of
 * walking a shard. Refusing is the only choice: evicting a live nonce
 * would reopen a replay.
 *
 * A table changes size without a long stop: a resize allocates the new
 * table (big ones straight from mmap, zero pages, nothing to clear) and
 * makes it the one inserts go to, and the old one is moved into it a few
 * lines at a time (nonce_move: each insert pays a bounded share, and the
 * gateway's once-a-second tick, auth_stores_maintain, moves the rest in
 * bounded lock holds, after faulting a mapped new table's pages in without
 * the lock), as Redis rehashes a dict. During a move a lookup
 * reads the key's two lines in each table (old lines already moved are
 * empty and skipped), and a key is in one slot of one table. The move
 * ends by unmapping the old table outside the lock. A table grows (x2)
 * when three quarters of its slots are held and shrinks (to at most half,
 * at least an eighth) when fewer than an eighth are: 3/8 held after
 * either, so it cannot flap. Both tables of a move count against
 * nonce_memory. An entry found expired is treated as absent, so
 * lateness in counting never changes an answer; a nonce counts against
 * the capacity up to one bucket longer than its expiry.
 *
 * The find-or-insert happens under one shard lock, which is what makes 100
 * concurrent copies of a request let exactly one through. Revocations are
 * read on every request and written rarely: one rwlock, plus an atomic
 * count so the common "nothing revoked" case takes no lock at all; they
 * expire from the head of an insertion-ordered list (their expiries are
 * now + a constant).
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "auth/auth_internal.h"

/* Set by uthash when it cannot grow a table; the element is then not
 * added. Every HASH_ADD below has an `oom` variable in scope. */
#define HASH_NONFATAL_OOM        1
#define uthash_nonfatal_oom(obj) (oom = 1)
#include <uthash.h>
#include <utlist.h>

#include <openssl/rand.h>

#define NONCE_SHARDS           AUTH_NONCE_SHARDS
#define DEFAULT_NONCE_CAP      (AUTH_NONCE_MEMORY_DEFAULT / AUTH_NONCE_ENTRY_BYTES)
#define DEFAULT_REVOCATION_CAP 65536
/* Time buckets per shard: enough for the longest life of a nonce (2 x the
 * longest window, 1 h: a timestamp up to a window ahead, kept a window
 * after it) plus the bucket being filled and the one being emptied. */
#define NONCE_BUCKETS 1024
_Static_assert(2 * 3600 / AUTH_NONCE_BUCKET_S + 3 < NONCE_BUCKETS, "nonce ring too short");

/* One remembered nonce: 16 bytes, four to a cache line. A key is found by
 * its 64-bit keyed hash (which also places it) plus two more key bytes:
 * 80 bits must match, so a fresh nonce taken for a replay is a 2^-80 event
 * per entry, and only ever refuses (never lets a replay through). */
typedef struct nonce_slot {
    uint64_t h;   /* nonce_hash(key) */
    uint16_t ver; /* key bytes 14, 15 */
    uint16_t gen; /* its time bucket's gen when it went in */
    uint32_t exp; /* expiry, s from the store's base; 0 = never used */
} nonce_slot_t;

#define NONCE_WAYS 4
typedef struct nonce_line {
    nonce_slot_t s[NONCE_WAYS];
} __attribute__((aligned(64))) nonce_line_t;
_Static_assert(sizeof(nonce_line_t) == 64, "a line of slots is one cache line");

/* A time bucket: how many of the shard's entries expire in its epoch. */
typedef struct nonce_bucket {
    int64_t epoch; /* expiry / AUTH_NONCE_BUCKET_S of what n counts */
    uint32_t n;
    uint16_t gen; /* +1 each time the bucket is emptied */
} nonce_bucket_t;

typedef struct nonce_shard {
    pthread_mutex_t mu;
    nonce_line_t *lines; /* the table inserts go to */
    uint32_t mask;       /* lines - 1; lines is a power of two */
    uint32_t omask;      /* old's lines - 1 */
    nonce_line_t *old;   /* the table being moved into lines, or NULL */
    size_t moved;        /* old's lines below this are empty */
    nonce_line_t *spent; /* a moved-out mapped table the tick unmaps */
    size_t spent_lines;
    nonce_line_t *warm;     /* lines, once the tick has faulted its pages in */
    nonce_line_t *pinned;   /* the table the tick is faulting in, unlocked */
    nonce_line_t *unpinned; /* pinned, but moved out meanwhile: the tick frees it */
    size_t unpinned_lines;
    size_t live;    /* entries its buckets count */
    int64_t cursor; /* next epoch whose bucket may have expired */
    nonce_bucket_t ring[NONCE_BUCKETS];
} __attribute__((aligned(64))) nonce_shard_t;

typedef struct rev_ent {
    int64_t revoked_at; /* sub: tokens with iat <= this are revoked */
    int64_t expires;
    struct rev_ent *prev, *next;
    UT_hash_handle hh;
    size_t klen;
    char key[]; /* kind byte + id */
} rev_ent_t;

struct auth_stores {
    nonce_shard_t shards[NONCE_SHARDS];
    /* Random per process: the key of nonce_hash. The key is already a
     * SHA-256 prefix, so a full hash of it only costs time; the secret
     * keeps a client who grinds nonces from aiming them at one line of a
     * table, which a fixed function (or the key bytes themselves) would
     * allow. */
    uint64_t hash_key[2];
    /* Expiries are kept as 32-bit seconds from here: the first insert's
     * clock less 2^31 (INT64_MIN until then), so +-68 years of clock fit. */
    _Atomic int64_t nonce_base;
    _Atomic size_t nonce_table_bytes; /* all shards' tables */
    _Atomic size_t nonce_live;        /* entries the time buckets count */
    _Atomic size_t nonce_cap;
    _Atomic int64_t nonce_looked; /* when a full store last looked at every shard */
    long nonce_step;              /* an insert's share of a move (test hook) */
    pthread_rwlock_t rev_mu;
    rev_ent_t *rev_table;
    rev_ent_t *rev_list;
    _Atomic size_t rev_count;
    size_t rev_cap;
    int64_t started; /* auth_stores_set_started; INT64_MIN = never set */
};

/* Tables start at this many lines per shard and double when 3/4 of their
 * slots are held; a key that finds no slot even by moving others
 * (NONCE_KICKS steps) doubles the table too. */
#define NONCE_LINES_MIN 8
#define NONCE_KICKS     64

/* A move's work is counted as lines looked at (1 each) plus entries moved
 * (NONCE_MOVE_COST each, a placement with its cache misses). An insert
 * pays NONCE_STEP_WORK (a few us at most): enough that a move always ends
 * long before the new table fills. A grow of L lines (3L entries, 25L of
 * work) has 3L inserts before the new table is 3/4 held: 0.1 L of inserts
 * do it. A shrink of L lines (under L/2 entries, under 5L of work) into
 * one of at least L/8 lines, 3/8 held at most, has at least 0.19 L
 * inserts: 0.02 L do it. The tick pays NONCE_TICK_WORK a lock hold,
 * AUTH_NONCE_TICK_HOLDS holds a shard a tick. */
#define NONCE_MOVE_COST 8
#define NONCE_STEP_WORK 256
#define NONCE_TICK_WORK 1024

/* Tables of this many lines (64 KiB) and more are mapped directly: fresh
 * zero pages (no clearing them under the lock; each is touched by the
 * insert that first writes it) that munmap gives back to the system at
 * once, whatever malloc's thresholds would do. */
#define NONCE_MAP_LINES 1024

static nonce_line_t *nonce_table_new(size_t n)
{
    size_t bytes = n * sizeof(nonce_line_t);
    if (n >= NONCE_MAP_LINES) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    nonce_line_t *t = aligned_alloc(sizeof(nonce_line_t), bytes);
    if (t)
        memset(t, 0, bytes);
    return t;
}

static void nonce_table_free(nonce_line_t *t, size_t n)
{
    if (!t)
        return;
    if (n >= NONCE_MAP_LINES)
        munmap(t, n * sizeof(nonce_line_t));
    else
        free(t);
}

auth_stores_t *auth_stores_new(size_t nonce_capacity, size_t revocation_capacity)
{
    auth_stores_t *s = NULL;
    /* aligned: the shards are cache-line aligned */
    if (posix_memalign((void **)&s, 64, sizeof(*s)) != 0)
        return NULL;
    memset(s, 0, sizeof(*s));
    s->started = INT64_MIN;
    if (nonce_capacity == 0)
        nonce_capacity = DEFAULT_NONCE_CAP;
    if (revocation_capacity == 0)
        revocation_capacity = DEFAULT_REVOCATION_CAP;
    for (size_t i = 0; i < NONCE_SHARDS; i++)
        pthread_mutex_init(&s->shards[i].mu, NULL);
    atomic_store(&s->nonce_cap, nonce_capacity);
    atomic_store(&s->nonce_base, INT64_MIN);
    s->nonce_step = NONCE_STEP_WORK;
    if (RAND_bytes((unsigned char *)s->hash_key, sizeof(s->hash_key)) != 1) {
        free(s);
        return NULL;
    }
    pthread_rwlock_init(&s->rev_mu, NULL);
    s->rev_cap = revocation_capacity;
    return s;
}

void auth_stores_free(auth_stores_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < NONCE_SHARDS; i++) {
        nonce_shard_t *sh = &s->shards[i];
        nonce_table_free(sh->lines, sh->lines ? (size_t)sh->mask + 1 : 0);
        nonce_table_free(sh->old, sh->old ? (size_t)sh->omask + 1 : 0);
        nonce_table_free(sh->spent, sh->spent_lines);
        nonce_table_free(sh->unpinned, sh->unpinned_lines);
        pthread_mutex_destroy(&sh->mu);
    }
    rev_ent_t *r, *rtmp;
    HASH_ITER(hh, s->rev_table, r, rtmp)
    {
        HASH_DEL(s->rev_table, r);
        free(r);
    }
    pthread_rwlock_destroy(&s->rev_mu);
    free(s);
}

void auth_stores_set_nonce_capacity(auth_stores_t *s, size_t entries)
{
    atomic_store(&s->nonce_cap, entries > 0 ? entries : 1);
}

size_t auth_stores_nonce_capacity(const auth_stores_t *s)
{
    return atomic_load(&((auth_stores_t *)s)->nonce_cap);
}

size_t auth_stores_nonce_count(const auth_stores_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < NONCE_SHARDS; i++) {
        nonce_shard_t *sh = (nonce_shard_t *)&s->shards[i];
        pthread_mutex_lock(&sh->mu);
        n += sh->live;
        pthread_mutex_unlock(&sh->mu);
    }
    return n;
}

size_t auth_stores_nonce_live(const auth_stores_t *s)
{
    return atomic_load(&((auth_stores_t *)s)->nonce_live);
}

size_t auth_stores_nonce_table_bytes(const auth_stores_t *s)
{
    return atomic_load(&((auth_stores_t *)s)->nonce_table_bytes);
}

void auth_stores_set_started(auth_stores_t *s, int64_t unix_s)
{
    s->started = unix_s;
}

int64_t auth_stores_started(const auth_stores_t *s)
{
    return s->started;
}

size_t auth_stores_revocation_count(const auth_stores_t *s)
{
    return atomic_load(&s->rev_count);
}

/* ---- nonces ------------------------------------------------------------------ */

static int64_t nonce_epoch(int64_t t)
{
    /* floor division: a clock before 1970 (tests) must not round up */
    return t >= 0 ? t / AUTH_NONCE_BUCKET_S
                  : -((-t + AUTH_NONCE_BUCKET_S - 1) / AUTH_NONCE_BUCKET_S);
}

static nonce_bucket_t *nonce_bucket(nonce_shard_t *sh, int64_t epoch)
{
    return &sh->ring[(uint64_t)epoch % NONCE_BUCKETS];
}

/* Empties a time bucket: what it counted no longer counts against the
 * capacity. The entries stay in their slots, where an expired entry is a
 * free slot to whoever looks; nothing walks them. */
static void nonce_bucket_kill(auth_stores_t *s, nonce_shard_t *sh, nonce_bucket_t *b)
{
    if (b->n == 0)
        return;
    atomic_fetch_sub(&s->nonce_live, b->n);
    sh->live -= b->n;
    b->n = 0;
    b->gen++;
}

/* Kills the buckets whose last second has passed. Normally zero or one
 * step; after a long idle spell at most one turn of the ring. */
static void nonce_expire(auth_stores_t *s, nonce_shard_t *sh, int64_t now)
{
    int64_t now_e = nonce_epoch(now); /* bucket q is over when q < now_e */
    if (sh->cursor < now_e - NONCE_BUCKETS)
        sh->cursor = now_e - NONCE_BUCKETS;
    for (; sh->cursor < now_e; sh->cursor++) {
        nonce_bucket_t *b = nonce_bucket(sh, sh->cursor);
        if (b->n && b->epoch < now_e)
            nonce_bucket_kill(s, sh, b);
    }
}

/* An expired entry whose slot is taken stops counting now rather than
 * when its bucket is over, if its bucket still counts it: same epoch and
 * same gen (a wall clock stepping back can refill, under the same epoch,
 * a bucket emptied after the entry went in). */
static void nonce_uncount(auth_stores_t *s, nonce_shard_t *sh, const nonce_slot_t *e, int64_t base)
{
    int64_t p = nonce_epoch(base + (int64_t)e->exp);
    nonce_bucket_t *b = nonce_bucket(sh, p);
    if (b->n && b->epoch == p && b->gen == e->gen) {
        b->n--;
        sh->live--;
        atomic_fetch_sub(&s->nonce_live, 1);
    }
}

/* The keyed hash of a key, all 16 bytes (two keys equal in 8 bytes must
 * still land apart): one 64x64->128 multiply of the halves, each mixed
 * with a secret, folded. The key is already uniform; the secret is what
 * matters (see hash_key). */
static uint64_t nonce_hash(const auth_stores_t *s, const unsigned char *key)
{
    uint64_t a, b;
    memcpy(&a, key, sizeof(a));
    memcpy(&b, key + 8, sizeof(b));
    __extension__ unsigned __int128 m =
        (unsigned __int128)(a ^ s->hash_key[0]) * (b ^ s->hash_key[1]);
    return (uint64_t)m ^ (uint64_t)(m >> 64);
}

static uint16_t nonce_ver(const unsigned char *key)
{
    return (uint16_t)(key[12] | key[13] << 8);
}

/* A key's two lines (cuckoo hashing): the low bits of its hash, and bits
 * from its high half (never the same line). */
static uint32_t nonce_line1(uint64_t h, uint32_t mask)
{
    return (uint32_t)h & mask;
}

static uint32_t nonce_line2(uint64_t h, uint32_t mask)
{
    uint32_t a = (uint32_t)h & mask, b = (uint32_t)(h >> 32) & mask;
    return a == b ? a ^ 1 : b;
}

static uint32_t nonce_alt(uint64_t h, uint32_t mask, uint32_t line)
{
    uint32_t a = nonce_line1(h, mask);
    return line == a ? nonce_line2(h, mask) : a;
}

/* A slot may be taken when it was never used (exp 0) or its entry expired
 * more than NONCE_GRACE_S ago: threads read the clock at different
 * moments, and one a second behind must still find a nonce in its last
 * second. free_before = now - NONCE_GRACE_S, at least 1. */
#define NONCE_GRACE_S 2

static bool nonce_free(const nonce_slot_t *e, uint32_t free_before)
{
    return e->exp < free_before;
}

/* Room in one of the lines of a key whose two lines are full: walks from
 * `start`, each step moving one entry to its other line, up to NONCE_KICKS
 * steps, and only once a free slot ends the path are the entries moved
 * (from the end), so a failed walk changes nothing. A path that comes back
 * to a slot it holds is not taken (moving along it would put an entry on
 * a line not its own). Returns the slot freed in `start` (exp 0), or NULL. */
static nonce_slot_t *nonce_make_room(auth_stores_t *s, nonce_shard_t *sh, nonce_line_t *lines,
                                     uint32_t mask, uint32_t start, uint32_t free_before,
                                     int64_t base, uint64_t seed)
{
    nonce_slot_t *path[NONCE_KICKS];
    uint32_t cur = start;
    for (int d = 0; d < NONCE_KICKS; d++) {
        nonce_slot_t *v = NULL;
        for (unsigned t = 0; t < NONCE_WAYS && !v; t++) {
            nonce_slot_t *c = &lines[cur].s[(seed + t) % NONCE_WAYS];
            bool seen = false;
            for (int j = 0; j < d && !seen; j++)
                seen = path[j] == c;
            if (!seen)
                v = c;
        }
        if (!v)
            return NULL;
        path[d] = v;
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        seed ^= seed >> 33;
        nonce_line_t *next = &lines[nonce_alt(v->h, mask, cur)];
        for (unsigned w = 0; w < NONCE_WAYS; w++) {
            nonce_slot_t *f = &next->s[w];
            if (!nonce_free(f, free_before))
                continue;
            if (f->exp)
                nonce_uncount(s, sh, f, base);
            for (int j = d; j >= 0; j--) {
                *f = *path[j];
                f = path[j];
            }
            f->exp = 0;
            return f;
        }
        cur = (uint32_t)(next - lines);
    }
    return NULL;
}

/* A free slot for hash h in a table, moving others if need be, or NULL. */
static nonce_slot_t *nonce_place(auth_stores_t *s, nonce_shard_t *sh, nonce_line_t *lines,
                                 uint32_t mask, uint64_t h, uint32_t free_before, int64_t base)
{
    nonce_line_t *l1 = &lines[nonce_line1(h, mask)], *l2 = &lines[nonce_line2(h, mask)];
    for (unsigned w = 0; w < NONCE_WAYS; w++)
        if (nonce_free(&l1->s[w], free_before))
            return &l1->s[w];
    for (unsigned w = 0; w < NONCE_WAYS; w++)
        if (nonce_free(&l2->s[w], free_before))
            return &l2->s[w];
    return nonce_make_room(s, sh, lines, mask, (uint32_t)(l1 - lines), free_before, base, h >> 40);
}

/* The lines every shard may have whatever the budget (a small capacity
 * still gets a working table). */
#define NONCE_LINES_FREE 64

/* Starts moving a shard's table into a new one of n lines (the first
 * table, a grow or a shrink): from now on inserts go to the new table and
 * nonce_move empties the old one into it. Both count against nonce_memory
 * (capacity x AUTH_NONCE_ENTRY_BYTES) until the old one is freed; a shard
 * may always have NONCE_LINES_FREE lines. Not while a move is under way.
 * -1: no room, or no memory (nothing changed). */
static int nonce_resize(auth_stores_t *s, nonce_shard_t *sh, size_t n)
{
    size_t add = n * sizeof(nonce_line_t);
    size_t budget = atomic_load(&s->nonce_cap) * AUTH_NONCE_ENTRY_BYTES;
    size_t had = atomic_fetch_add(&s->nonce_table_bytes, add);
    nonce_line_t *nl = NULL;
    if ((n <= NONCE_LINES_FREE || had + add <= budget) && n <= ((size_t)1 << 26))
        nl = nonce_table_new(n);
    if (!nl) {
        atomic_fetch_sub(&s->nonce_table_bytes, add);
        return -1;
    }
    sh->old = sh->lines;
    sh->omask = sh->mask;
    sh->moved = 0;
    sh->lines = nl;
    sh->mask = (uint32_t)(n - 1);
    sh->warm = NULL; /* (a new table may reuse a freed one's address) */
    return 0;
}

/* What one move of a shard gives back, to free once its lock is released
 * (unmapping a big table takes a while): up to two tables. */
typedef struct nonce_dead {
    nonce_line_t *t, *t2;
    size_t lines, lines2;
} nonce_dead_t;

/* Frees what a move gave back (outside the shard's lock); nonce_memory
 * counts a table until it is freed. */
__attribute__((noinline)) static void nonce_dead_free(auth_stores_t *s, nonce_dead_t *d)
{
    nonce_table_free(d->t, d->lines);
    nonce_table_free(d->t2, d->lines2);
    atomic_fetch_sub(&s->nonce_table_bytes, (d->lines + d->lines2) * sizeof(nonce_line_t));
}

/* Unmapping a big table takes a while (a few hundred us for 8 MiB): the
 * request that ended a move leaves it to the tick (auth_stores_maintain)
 * rather than pay for it, one a shard (a second one, without a tick to
 * take the first, is freed by that request). Under the shard's lock. */
static void nonce_park(nonce_shard_t *sh, nonce_dead_t *d)
{
    /* The tick is faulting this one in, unlocked: it frees it after. */
    if (d->t && d->t == sh->pinned) {
        sh->unpinned = d->t;
        sh->unpinned_lines = d->lines;
        d->t = NULL;
        d->lines = 0;
    }
    if (d->t2 && d->t2 == sh->pinned) {
        sh->unpinned = d->t2;
        sh->unpinned_lines = d->lines2;
        d->t2 = NULL;
        d->lines2 = 0;
    }
    if (d->t && d->lines >= NONCE_MAP_LINES && !sh->spent) {
        sh->spent = d->t;
        sh->spent_lines = d->lines;
        d->t = NULL;
        d->lines = 0;
    }
}

/* An expired entry a move leaves behind: off its bucket's count now if
 * the bucket still counts it (as when its slot is taken), so that the
 * count stays exact even when a wall clock stepped back keeps its bucket
 * from ending for a while. */
static void nonce_drop(auth_stores_t *s, nonce_shard_t *sh, nonce_slot_t *e, int64_t base)
{
    if (e->exp) {
        nonce_uncount(s, sh, e, base);
        e->exp = 0;
    }
}

/* Copies the unexpired entries of lines [from, n) of table t into table
 * nl (of mask nmask), dropping the expired ones. false: a walk failed. */
static bool nonce_copy(auth_stores_t *s, nonce_shard_t *sh, nonce_line_t *nl, uint32_t nmask,
                       nonce_line_t *t, size_t from, size_t n, uint32_t free_before, int64_t base)
{
    for (size_t i = from; i < n; i++) {
        for (unsigned w = 0; w < NONCE_WAYS; w++) {
            nonce_slot_t *e = &t[i].s[w];
            if (nonce_free(e, free_before)) {
                nonce_drop(s, sh, e, base);
                continue;
            }
            nonce_slot_t *f = nonce_place(s, sh, nl, nmask, e->h, free_before, base);
            if (!f)
                return false;
            *f = *e;
        }
    }
    return true;
}

/* The way out of a move that cannot go on (the new table too small for
 * what the old one still holds: a wall clock stepped back made expired
 * entries live again, or walks failed): both tables into one of n lines
 * or more, in one go. A long hold, but never on the way of a normal grow
 * or shrink. -1: no room (nothing changed). */
static int nonce_rebuild(auth_stores_t *s, nonce_shard_t *sh, size_t n, uint32_t free_before,
                         int64_t base, nonce_dead_t *dead)
{
    size_t budget = atomic_load(&s->nonce_cap) * AUTH_NONCE_ENTRY_BYTES;
    size_t cur = (size_t)sh->mask + 1, old = sh->old ? (size_t)sh->omask + 1 : 0;
    for (; n <= ((size_t)1 << 26); n *= 2) {
        size_t add = n * sizeof(nonce_line_t);
        size_t had = atomic_fetch_add(&s->nonce_table_bytes, add);
        nonce_line_t *nl = NULL;
        if (n <= NONCE_LINES_FREE || had + add <= budget)
            nl = nonce_table_new(n);
        if (!nl) {
            atomic_fetch_sub(&s->nonce_table_bytes, add);
            return -1;
        }
        uint32_t m = (uint32_t)(n - 1);
        if (nonce_copy(s, sh, nl, m, sh->lines, 0, cur, free_before, base) &&
            (!old || nonce_copy(s, sh, nl, m, sh->old, sh->moved, old, free_before, base))) {
            *dead = (nonce_dead_t){sh->lines, sh->old, cur, old};
            sh->lines = nl;
            sh->mask = m;
            sh->warm = NULL;
            sh->old = NULL;
            sh->omask = 0;
            sh->moved = 0;
            return 0;
        }
        nonce_table_free(nl, n); /* a walk failed: one twice as big */
        atomic_fetch_sub(&s->nonce_table_bytes, add);
    }
    return -1;
}

/* Moves the old table's entries into the new one, a line at a time from
 * `moved` on, until `work` is spent (see NONCE_MOVE_COST). Entries free to
 * take (expired NONCE_GRACE_S ago) stay behind, off their buckets' counts
 * (nonce_drop). A walk that fails in the new table
 * leaves its entry where it is (lookups still find it) and the move stops
 * there until a later step. Once the old table is empty it is detached
 * into *dead (nonce_memory no longer counts it) and true returned. */
static bool nonce_move(auth_stores_t *s, nonce_shard_t *sh, long work, uint32_t free_before,
                       int64_t base, nonce_dead_t *dead)
{
    size_t n = (size_t)sh->omask + 1;
    while (sh->moved < n && work > 0) {
        nonce_line_t *l = &sh->old[sh->moved];
        work--;
        for (unsigned w = 0; w < NONCE_WAYS; w++) {
            nonce_slot_t *e = &l->s[w];
            if (nonce_free(e, free_before)) {
                nonce_drop(s, sh, e, base);
                continue;
            }
            nonce_slot_t *f = nonce_place(s, sh, sh->lines, sh->mask, e->h, free_before, base);
            if (!f)
                return false;
            if (f->exp)
                nonce_uncount(s, sh, f, base); /* an expired entry's slot */
            *f = *e;
            e->exp = 0;
            work -= NONCE_MOVE_COST;
        }
        sh->moved++;
    }
    if (sh->moved < n)
        return false;
    dead->t = sh->old; /* (t2 may hold a parked table the tick frees) */
    dead->lines = n;
    sh->old = NULL;
    sh->omask = 0;
    sh->moved = 0;
    return true;
}

/* After a peak: a table with fewer than 1/8 of its slots held is moved into
 * one 3/8 held or less (half the size at most, an eighth at least: a move
 * always ends before the new table fills, see NONCE_STEP_WORK). 3/8 is
 * what a grow leaves, so grow and shrink never follow each other. */
static void nonce_shrink(auth_stores_t *s, nonce_shard_t *sh)
{
    size_t lines = (size_t)sh->mask + 1;
    if (sh->old || !sh->lines || lines <= NONCE_LINES_MIN || sh->live * 8 >= lines * NONCE_WAYS)
        return;
    size_t n = NONCE_LINES_MIN;
    while (n < lines / 8 || sh->live * 8 > n * NONCE_WAYS * 3)
        n *= 2;
    if (n < lines)
        (void)nonce_resize(s, sh, n);
}

/* The store's time base (set by the first insert; see nonce_base). */
static int64_t nonce_base_get(auth_stores_t *s, int64_t now)
{
    int64_t base = atomic_load_explicit(&s->nonce_base, memory_order_acquire);
    if (base != INT64_MIN)
        return base;
    int64_t want = now - ((int64_t)1 << 31);
    if (atomic_compare_exchange_strong(&s->nonce_base, &base, want))
        return want;
    return base; /* another thread's */
}

/* now as seconds from the store's base (clamped), and the first second
 * a slot is not free to take before (see NONCE_GRACE_S). */
static uint32_t nonce_rel(int64_t now, int64_t base, uint32_t *free_before)
{
    int64_t r = now - base;
    uint32_t now_rel = r < 1 ? 1 : r > UINT32_MAX ? UINT32_MAX : (uint32_t)r;
    *free_before = now_rel > NONCE_GRACE_S ? now_rel - NONCE_GRACE_S : 1;
    return now_rel;
}

/* Room for one more live nonce in the whole store. */
static bool nonce_reserve(auth_stores_t *s)
{
    if (atomic_fetch_add(&s->nonce_live, 1) < atomic_load(&s->nonce_cap))
        return true;
    atomic_fetch_sub(&s->nonce_live, 1);
    return false;
}

/* A key's line in the old table during a move, or NULL when that line is
 * already moved (empty). */
static nonce_line_t *nonce_old_line(const nonce_shard_t *sh, uint32_t i)
{
    return sh->old && i >= sh->moved ? &sh->old[i] : NULL;
}

static nonce_slot_t *nonce_match(nonce_line_t *l, uint64_t h, uint16_t ver)
{
    for (unsigned w = 0; w < NONCE_WAYS; w++)
        if (l->s[w].h == h && l->s[w].ver == ver && l->s[w].exp)
            return &l->s[w];
    return NULL;
}

/* Takes a slot for a new key (or the key's own, expired): in the new table,
 * moving others if need be; a key that finds none starts a grow (ending a
 * move under way first: by NONCE_STEP_WORK's sizing a move is long over
 * before a table is that full, so that long hold is all but never paid). */
static nonce_slot_t *nonce_take(auth_stores_t *s, nonce_shard_t *sh, uint64_t h,
                                uint32_t free_before, int64_t base, nonce_dead_t *dead)
{
    /* At most twice round: a rebuilt table may be nearly full, and then
     * the resize that follows gives an empty one, where a place is sure. */
    for (int round = 0; round < 2; round++) {
        nonce_slot_t *e = nonce_place(s, sh, sh->lines, sh->mask, h, free_before, base);
        if (e)
            return e;
        size_t n = ((size_t)sh->mask + 1) * 2;
        if (sh->old && !nonce_move(s, sh, LONG_MAX, free_before, base, dead)) {
            if (nonce_rebuild(s, sh, n, free_before, base, dead) != 0)
                return NULL;
        } else if (nonce_resize(s, sh, n) != 0) {
            return NULL;
        }
    }
    return nonce_place(s, sh, sh->lines, sh->mask, h, free_before, base);
}

auth_store_rc_t auth_nonce_insert(auth_stores_t *s, const unsigned char key[AUTH_NONCE_KEY_LEN],
                                  int64_t expires, int64_t now)
{
    /* The key is a hash prefix, so any byte is a uniform shard index; the
     * capacity and the table memory are the whole store's, so a skewed key
     * cannot fill a shard. */
    nonce_shard_t *sh = &s->shards[key[AUTH_NONCE_KEY_LEN - 1] % NONCE_SHARDS];
    uint64_t h = nonce_hash(s, key);
    uint16_t ver = nonce_ver(key);
    int64_t base = nonce_base_get(s, now);
    uint32_t free_before;
    uint32_t now_rel = nonce_rel(now, base, &free_before);
    auth_store_rc_t rc = AUTH_STORE_NEW;
    nonce_dead_t dead = {0};
    pthread_mutex_lock(&sh->mu);
    if (!sh->lines && nonce_resize(s, sh, NONCE_LINES_MIN) != 0) {
        rc = AUTH_STORE_FULL;
        goto out;
    }
    nonce_line_t *l1 = &sh->lines[nonce_line1(h, sh->mask)];
    nonce_line_t *l2 = &sh->lines[nonce_line2(h, sh->mask)];
    nonce_line_t *o1 = NULL, *o2 = NULL;
    /* Both lines are all a lookup reads (one miss each in a big store),
     * four during a move: start them now, while the time buckets are
     * looked at. */
    __builtin_prefetch(l1, 1);
    __builtin_prefetch(l2, 1);
    if (__builtin_expect(sh->old != NULL, 0)) {
        o1 = nonce_old_line(sh, nonce_line1(h, sh->omask));
        o2 = nonce_old_line(sh, nonce_line2(h, sh->omask));
        if (o1)
            __builtin_prefetch(o1, 1);
        if (o2)
            __builtin_prefetch(o2, 1);
    }
    nonce_expire(s, sh, now);
    /* A key is in one slot of one table (a move takes it out of the old
     * one as it puts it in the new one). */
    nonce_slot_t *found = nonce_match(l1, h, ver), *ofound = NULL;
    if (!found)
        found = nonce_match(l2, h, ver);
    if (!found && o1)
        ofound = nonce_match(o1, h, ver);
    if (!found && !ofound && o2)
        ofound = nonce_match(o2, h, ver);
    if ((found && found->exp >= now_rel) || (ofound && ofound->exp >= now_rel)) {
        rc = AUTH_STORE_SEEN;
        goto out;
    }
    if (expires < now)
        goto out; /* replayable never again: nothing to remember */
    int64_t p = nonce_epoch(expires);
    int64_t exp_rel = expires - base;
    if (p - nonce_epoch(now) >= NONCE_BUCKETS - 2 || exp_rel < 1 || exp_rel > UINT32_MAX) {
        /* beyond the ring (a window over 1 h), or the clock 68 years away
         * from the store's base: cannot be kept */
        rc = AUTH_STORE_FULL;
        goto out;
    }
    if (!nonce_reserve(s)) {
        /* Buckets of quiet shards may be over without anyone having looked:
         * look (trylock, so two full shards never wait on each other),
         * then ask again. At most NONCE_SHARDS - 1 short looks, and once a
         * second at most (buckets end on whole seconds): under a flood the
         * refusal itself stays cheap. */
        int64_t looked = atomic_load(&s->nonce_looked);
        bool room = false;
        if (looked != now && atomic_compare_exchange_strong(&s->nonce_looked, &looked, now)) {
            for (size_t i = 0; i < NONCE_SHARDS; i++) {
                nonce_shard_t *o = &s->shards[i];
                if (o == sh || pthread_mutex_trylock(&o->mu) != 0)
                    continue;
                nonce_expire(s, o, now);
                pthread_mutex_unlock(&o->mu);
            }
            room = nonce_reserve(s);
        }
        if (!room) {
            rc = AUTH_STORE_FULL;
            goto out;
        }
    }
    /* The same key found expired keeps its slot, in whichever table: a
     * thread whose clock is a second behind still finds it there (now with
     * a later expiry: a replay to it too), and a move carries it over like
     * any other. (Placing it in the new table instead could find no room
     * there while a wall clock stepped back has made entries of the old
     * one live again, and refuse a nonce while the store has room.) */
    nonce_slot_t *e = found    ? found
                      : ofound ? ofound
                               : nonce_take(s, sh, h, free_before, base, &dead);
    if (!e) {
        atomic_fetch_sub(&s->nonce_live, 1);
        rc = AUTH_STORE_FULL; /* no slot within nonce_memory */
        goto out;
    }
    if (e->exp)
        nonce_uncount(s, sh, e, base); /* an expired entry's slot */
    nonce_bucket_t *b = nonce_bucket(sh, p);
    if (b->epoch != p) { /* an older turn of the ring: over by construction */
        nonce_bucket_kill(s, sh, b);
        b->gen++;
        b->epoch = p;
    }
    e->h = h;
    e->ver = ver;
    e->gen = b->gen;
    e->exp = (uint32_t)exp_rel;
    b->n++;
    sh->live++;
    /* This insert's share of a move; else three quarters held: a bigger
     * table while walks are still short (a table that cannot grow keeps
     * working until a key finds no slot); else maybe a smaller one. */
    if (sh->old) {
        if (!dead.t)
            (void)nonce_move(s, sh, s->nonce_step, free_before, base, &dead);
    } else if (sh->live > ((size_t)sh->mask + 1) * NONCE_WAYS * 3 / 4) {
        (void)nonce_resize(s, sh, ((size_t)sh->mask + 1) * 2);
    } else if (sh->live * 8 < ((size_t)sh->mask + 1) * NONCE_WAYS) {
        nonce_shrink(s, sh);
    }
out:
    if (__builtin_expect(dead.t || dead.t2, 0))
        nonce_park(sh, &dead);
    pthread_mutex_unlock(&sh->mu);
    if (__builtin_expect(dead.t || dead.t2, 0))
        nonce_dead_free(s, &dead);
    return rc;
}

/* This thread's CPU time, for auth_nonce_maintain_step's hold_ns. */
static int64_t nonce_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Faults in the pages of a mapped table about to be moved into, outside
 * the shard's lock: a move places its entries all over a table fresh from
 * mmap, and each first touch of a page (the kernel zeroing it, ~1 us) is
 * otherwise paid under the lock, hundreds a hold. MADV_POPULATE_WRITE
 * (Linux 5.14) only maps pages, never changes what they hold, so inserts
 * may write the table meanwhile; an older kernel refuses it and the faults
 * stay where they were. */
static void nonce_table_warm(nonce_line_t *t, size_t n)
{
    (void)madvise(t, n * sizeof(nonce_line_t), MADV_POPULATE_WRITE);
}

/* Ends a pin (see auth_nonce_maintain_step): the table is warm if it is
 * still the one inserts go to; freed if a request moved it out meanwhile. */
static void nonce_unpin(auth_stores_t *s, nonce_shard_t *sh, nonce_line_t *warmed)
{
    nonce_dead_t gone = {0};
    pthread_mutex_lock(&sh->mu);
    if (warmed && sh->lines == warmed)
        sh->warm = warmed;
    sh->pinned = NULL;
    gone.t = sh->unpinned;
    gone.lines = sh->unpinned_lines;
    sh->unpinned = NULL;
    sh->unpinned_lines = 0;
    pthread_mutex_unlock(&sh->mu);
    nonce_dead_free(s, &gone);
}

bool auth_nonce_maintain_step(auth_stores_t *s, unsigned shard, int64_t now, int64_t *hold_ns)
{
    int64_t base = atomic_load_explicit(&s->nonce_base, memory_order_acquire);
    if (base == INT64_MIN)
        return false; /* no nonce yet */
    nonce_shard_t *sh = &s->shards[shard % NONCE_SHARDS];
    uint32_t free_before;
    (void)nonce_rel(now, base, &free_before);
    nonce_dead_t dead = {0};
    nonce_line_t *cold = NULL;
    size_t cold_lines = 0;
    bool more = false;
    pthread_mutex_lock(&sh->mu);
    int64_t t0 = hold_ns ? nonce_cpu_ns() : 0;
    nonce_expire(s, sh, now);
    dead.t2 = sh->spent; /* parked by a request */
    dead.lines2 = sh->spent_lines;
    sh->spent = NULL;
    sh->spent_lines = 0;
    if (!sh->old) {
        nonce_shrink(s, sh);
        more = sh->old != NULL; /* started: warmed before it is moved into */
    } else if (sh->lines != sh->warm && sh->mask + 1 >= NONCE_MAP_LINES) {
        /* A move (a request's grow, or a shrink) into a table still cold:
         * fault it in first, unlocked; pinned, a request that moves it out
         * meanwhile leaves it to this thread to free. */
        cold = sh->lines;
        cold_lines = (size_t)sh->mask + 1;
        sh->pinned = cold;
        more = true;
    } else {
        size_t before = sh->moved;
        more = !nonce_move(s, sh, NONCE_TICK_WORK, free_before, base, &dead);
        more = more && sh->moved != before; /* a stuck move waits for the next tick */
        if (!more && dead.t)
            more = true; /* maybe a further shrink */
    }
    if (hold_ns)
        *hold_ns = nonce_cpu_ns() - t0;
    pthread_mutex_unlock(&sh->mu);
    nonce_dead_free(s, &dead);
    if (cold) {
        nonce_table_warm(cold, cold_lines);
        nonce_unpin(s, sh, cold);
    }
    return more;
}

void auth_stores_maintain(auth_stores_t *s, int64_t now)
{
    for (unsigned i = 0; i < NONCE_SHARDS; i++)
        for (int k = 0; k < AUTH_NONCE_TICK_HOLDS; k++)
            if (!auth_nonce_maintain_step(s, i, now, NULL))
                break;
}

void auth_nonce_test_set_step(auth_stores_t *s, long work)
{
    s->nonce_step = work;
}

bool auth_nonce_test_step(auth_stores_t *s, unsigned shard, long work, int64_t now)
{
    int64_t base = atomic_load(&s->nonce_base);
    if (base == INT64_MIN)
        return false;
    nonce_shard_t *sh = &s->shards[shard % NONCE_SHARDS];
    uint32_t free_before;
    (void)nonce_rel(now, base, &free_before);
    nonce_dead_t dead = {0};
    pthread_mutex_lock(&sh->mu);
    bool moving = sh->old != NULL;
    if (moving)
        (void)nonce_move(s, sh, work, free_before, base, &dead);
    pthread_mutex_unlock(&sh->mu);
    nonce_dead_free(s, &dead);
    return moving;
}

void auth_nonce_test_pin(auth_stores_t *s, unsigned shard, bool on)
{
    nonce_shard_t *sh = &s->shards[shard % NONCE_SHARDS];
    if (!on) {
        nonce_unpin(s, sh, NULL);
        return;
    }
    pthread_mutex_lock(&sh->mu);
    sh->pinned = sh->old ? sh->old : sh->lines;
    pthread_mutex_unlock(&sh->mu);
}

size_t auth_nonce_test_lines(auth_stores_t *s, unsigned shard, size_t *old_lines, size_t *old_left)
{
    nonce_shard_t *sh = &s->shards[shard % NONCE_SHARDS];
    pthread_mutex_lock(&sh->mu);
    size_t n = sh->lines ? (size_t)sh->mask + 1 : 0;
    *old_lines = sh->old ? (size_t)sh->omask + 1 : 0;
    *old_left = sh->old ? (size_t)sh->omask + 1 - sh->moved : 0;
    pthread_mutex_unlock(&sh->mu);
    return n;
}

/* ---- revocations ---------------------------------------------------------------- */

#define REV_KEY_MAX (1 + AUTH_SUB_MAX)

static size_t rev_key(char *buf, auth_rev_kind_t kind, const char *id, size_t len)
{
    buf[0] = (char)kind;
    memcpy(buf + 1, id, len);
    return len + 1;
}

static void rev_remove(auth_stores_t *s, rev_ent_t *e)
{
    HASH_DEL(s->rev_table, e);
    DL_DELETE(s->rev_list, e);
    free(e);
    atomic_fetch_sub(&s->rev_count, 1);
}

static void rev_sweep(auth_stores_t *s, int64_t now, bool all)
{
    rev_ent_t *e, *tmp;
    DL_FOREACH_SAFE(s->rev_list, e, tmp)
    {
        if (e->expires >= now) {
            if (!all)
                break;
            continue;
        }
        rev_remove(s, e);
    }
}

int auth_rev_add(auth_stores_t *s, auth_rev_kind_t kind, const char *id, size_t len,
                 int64_t revoked_at, int64_t expires, int64_t now)
{
    if (len == 0 || len > (kind == AUTH_REV_JTI ? AUTH_JTI_MAX : AUTH_SUB_MAX))
        return -1;
    char key[REV_KEY_MAX];
    size_t klen = rev_key(key, kind, id, len);
    int rc = 0, oom = 0;
    pthread_rwlock_wrlock(&s->rev_mu);
    rev_sweep(s, now, false);
    rev_ent_t *e = NULL;
    HASH_FIND(hh, s->rev_table, key, klen, e);
    if (e) {
        /* Revoking again only ever widens: later cut-off, later expiry. */
        e->revoked_at = SL_MAX(e->revoked_at, revoked_at);
        e->expires = SL_MAX(e->expires, expires);
        DL_DELETE(s->rev_list, e);
        DL_APPEND(s->rev_list, e);
        goto out;
    }
    if (atomic_load(&s->rev_count) >= s->rev_cap)
        rev_sweep(s, now, true);
    if (atomic_load(&s->rev_count) >= s->rev_cap || !(e = malloc(sizeof(*e) + klen))) {
        rc = -1;
        goto out;
    }
    e->revoked_at = revoked_at;
    e->expires = expires;
    e->klen = klen;
    memcpy(e->key, key, klen);
    HASH_ADD_KEYPTR(hh, s->rev_table, e->key, klen, e);
    if (oom) {
        free(e);
        rc = -1;
        goto out;
    }
    DL_APPEND(s->rev_list, e);
    atomic_fetch_add(&s->rev_count, 1);
out:
    pthread_rwlock_unlock(&s->rev_mu);
    return rc;
}

bool auth_rev_check(auth_stores_t *s, const auth_claims_t *c, int64_t now)
{
    if (atomic_load_explicit(&s->rev_count, memory_order_acquire) == 0)
        return false;
    char key[REV_KEY_MAX];
    bool revoked = false;
    pthread_rwlock_rdlock(&s->rev_mu);
    rev_ent_t *e = NULL;
    if (c->jti[0]) {
        size_t klen = rev_key(key, AUTH_REV_JTI, c->jti, strlen(c->jti));
        HASH_FIND(hh, s->rev_table, key, klen, e);
        if (e && e->expires >= now)
            revoked = true;
    }
    if (!revoked && c->sub[0]) {
        size_t klen = rev_key(key, AUTH_REV_SUB, c->sub, strlen(c->sub));
        e = NULL;
        HASH_FIND(hh, s->rev_table, key, klen, e);
        /* A token without iat cannot show it was issued after the cut-off. */
        if (e && e->expires >= now && (!c->has_iat || c->iat <= e->revoked_at))
            revoked = true;
    }
    pthread_rwlock_unlock(&s->rev_mu);
    return revoked;
}
