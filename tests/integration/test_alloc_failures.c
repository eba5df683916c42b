/* SPDX-License-Identifier: MIT */
/*
 * test_alloc_failures.c — every public call that can allocate, failed at each
 * of its allocations in turn (kv_fault_arm), must leave the store unchanged.
 *
 * For each call: the store is put in a known state; then for N = 1, 2, ...:
 * snapshot (every list's length, K, V and positions via kv_read; the store
 * statistics; kv_mem_live_bytes), kv_fault_arm(N), the call, kv_fault_arm(0).
 * If the fault fired, the call must have returned KV_ENOMEM and the store must
 * equal the snapshot (and pass kv_store_check); if it did not fire, the call
 * made fewer than N allocations and must have succeeded: its result is then
 * checked and the loop moves on to the next call. The number of allocations
 * found for each call is printed. Calls that must allocate (store creation,
 * an append that needs a page, copy-on-write, compaction of shared pages)
 * are required to have been failed at least once, so an inert fault
 * mechanism cannot pass. Leaks show under ASan (detect_leaks=1) and in
 * kv_mem_live_bytes() after the store is destroyed.
 *
 * Test-side buffers use malloc (they are not the library's metadata).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_snap.h"

#define NL 2
#define NKV 2
#define NQ 4
#define HD 32
#define TPP 16 /* page_bytes 0 = 16 FP16 tokens */
#define POOL 64
#define MAX_TRACK 8
#define MAX_N 100000 /* no call makes this many allocations */

/* ---- the store under test and its snapshots --------------------------- */

typedef struct fixture {
    kv_store_t *s;
    kv_seq_id_t ids[MAX_TRACK]; /* sequences whose contents are compared */
    int n_ids;
} fixture_t;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

/* Reads everything (no fault armed; kv_test_snap.h). Returns 0 if every read
 * succeeded. */
static int snap_take(const fixture_t *f, kv_test_snap_t *sn)
{
    return kv_test_snap_take(f->s, f->ids, (uint32_t)f->n_ids, kv_mem_live_bytes(), sn);
}

/* 1 if the two snapshots describe the same store. Prints the first difference. */
static int snap_equal(const kv_test_snap_t *a, const kv_test_snap_t *b, const char *what,
                      uint64_t n)
{
    const char *diff = kv_test_snap_diff(a, b);
    if (diff)
        fprintf(stderr,
                "%s with fault at allocation %llu: %s changed (pages_used "
                "%llu -> %llu, meta_bytes %llu -> %llu, live %llu -> %llu)\n",
                what, (unsigned long long)n, diff,
                (unsigned long long)a->st.pages_used,
                (unsigned long long)b->st.pages_used,
                (unsigned long long)a->st.meta_bytes,
                (unsigned long long)b->st.meta_bytes,
                (unsigned long long)a->live, (unsigned long long)b->live);
    return diff == NULL;
}

/* ---- the calls -------------------------------------------------------- */

/* Everything one call needs; filled by the test before the fault loop. */
typedef struct call {
    enum {
        C_SEQ_CREATE, C_FORK, C_APPEND, C_COMPACT, C_DECODE, C_PREFILL,
        C_READ, C_SEQ_FREE, C_STATS, C_CHECK, C_SEQ_LEN, C_CONFIG
    } kind;
    kv_seq_id_t seq;
    uint32_t layer, head, n;
    kv_dtype_t dtype;
    const void *k, *v;
    const int32_t *pos;
    const uint32_t *keep;
    kv_decode_t dec;
    kv_prefill_t pre;
    float *rk, *rv;
    int32_t *rpos;
    kv_seq_id_t out_id; /* create / fork result */
} call_t;

static int do_call(fixture_t *f, call_t *c)
{
    kv_stats_t st = {.struct_size = sizeof st};
    kv_config_t cfg;
    uint32_t len;
    switch (c->kind) {
    case C_SEQ_CREATE: return kv_seq_create(f->s, &c->out_id);
    case C_FORK: return kv_seq_fork(f->s, c->seq, &c->out_id);
    case C_APPEND:
        return kv_append(f->s, c->seq, c->layer, c->n, c->dtype, c->k, c->v,
                         c->pos);
    case C_COMPACT:
        return kv_compact(f->s, c->seq, c->layer, c->head, c->keep, c->n);
    case C_DECODE: return kv_attn_decode(f->s, &c->dec);
    case C_PREFILL: return kv_attn_prefill(f->s, &c->pre);
    case C_READ:
        return kv_read(f->s, c->seq, c->layer, c->head, 0, c->n, c->rk, c->rv,
                       c->rpos);
    case C_SEQ_FREE: return kv_seq_free(f->s, c->seq);
    case C_STATS: return kv_store_stats(f->s, &st);
    case C_CHECK: return kv_store_check(f->s);
    case C_SEQ_LEN: return kv_seq_len(f->s, c->seq, c->layer, c->head, &len);
    case C_CONFIG: return kv_store_config(f->s, &cfg);
    }
    return KV_EINVAL;
}

static int read_only(const call_t *c)
{
    return c->kind == C_DECODE || c->kind == C_PREFILL || c->kind == C_READ ||
           c->kind == C_STATS || c->kind == C_CHECK || c->kind == C_SEQ_LEN ||
           c->kind == C_CONFIG;
}

/* After a successful call: read-only calls changed nothing at all; mutating
 * calls changed no list but the ones they target (append: every head of
 * (seq, layer); compact: (seq, layer, head); others: none of the tracked). */
static int snap_same_except(const kv_test_snap_t *a, const kv_test_snap_t *b,
                            const fixture_t *f, const call_t *c,
                            const char *what)
{
    if (read_only(c))
        return snap_equal(a, b, what, 0);
    for (uint32_t i = 0; i < a->n; i++)
        for (uint32_t j = 0; j < NL * NKV; j++) {
            int target = f->ids[i] == c->seq && j / NKV == c->layer &&
                         (c->kind == C_APPEND ||
                          (c->kind == C_COMPACT && j % NKV == c->head));
            if (target)
                continue;
            if (!kv_test_list_same(&a->seq[i].l[j], &b->seq[i].l[j], HD)) {
                fprintf(stderr, "%s: changed list %u of tracked sequence %u\n",
                        what, j, i);
                return 0;
            }
        }
    return 1;
}

/* The fault loop. Returns the call's final status (0 expected) and sets
 * *n_alloc to the number of allocations the call made. */
static int fault_loop(fixture_t *f, call_t *c, const char *what,
                      uint64_t *n_alloc)
{
    for (uint64_t n = 1; n <= MAX_N; n++) {
        kv_test_snap_t a, b;
        CHECK(snap_take(f, &a) == 0);
        kv_fault_arm(n);
        int rc = do_call(f, c);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (!fired) {
            *n_alloc = n - 1;
            if (rc != 0)
                fprintf(stderr, "%s: no fault fired at %llu, yet rc %d (%s)\n",
                        what, (unsigned long long)n, rc, kv_strerror(rc));
            CHECK_EQ(rc, 0);
            /* success: only what the call was meant to change has changed */
            CHECK(snap_take(f, &b) == 0);
            CHECK(snap_same_except(&a, &b, f, c, what));
            kv_test_snap_free(&a);
            kv_test_snap_free(&b);
            printf("%-34s %3llu allocation(s); failing each one left the "
                   "store unchanged\n",
                   what, (unsigned long long)*n_alloc);
            return rc;
        }
        if (rc != KV_ENOMEM)
            fprintf(stderr, "%s: fault at allocation %llu fired, rc %d (%s)\n",
                    what, (unsigned long long)n, rc, kv_strerror(rc));
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK(snap_take(f, &b) == 0);
        CHECK(snap_equal(&a, &b, what, n));
        CHECK_OK(kv_store_check(f->s));
        kv_test_snap_free(&a);
        kv_test_snap_free(&b);
        if (rc == 0) { /* it claimed success after a failed allocation */
            *n_alloc = n;
            return KV_ECORRUPT;
        }
    }
    fprintf(stderr, "%s: more than %d allocations\n", what, MAX_N);
    CHECK(0);
    return KV_ECORRUPT;
}

/* ---- helpers ----------------------------------------------------------- */

/* Exact-in-FP16 inputs (multiples of 1/64 in [-2, 2]), so read-back is exact. */
static void fill_exact(float *x, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(kv_test_rand(rng) % 257) - 128) / 64.0f;
}

static uint16_t half_of_exact(float x) /* x a multiple of 1/64, |x| <= 2 */
{
    uint16_t s = x < 0 ? 0x8000 : 0;
    float a = fabsf(x);
    if (a == 0.0f)
        return s;
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    return s | (uint16_t)((e - 1 + 15) << 10) |
           (uint16_t)((m * 2.0f - 1.0f) * 1024.0f);
}

/* Tokens [t0, t0+n) of (seq, layer, head) equal rows of x ([n][NKV][HD],
 * head h) and positions p. */
static void expect_tokens(fixture_t *f, kv_seq_id_t seq, uint32_t layer,
                          uint32_t head, uint32_t t0, uint32_t n,
                          const float *xk, const float *xv, const int32_t *p)
{
    float *k = xmalloc((size_t)n * HD * 4), *v = xmalloc((size_t)n * HD * 4);
    int32_t *pos = xmalloc((size_t)n * 4);
    CHECK_OK(kv_read(f->s, seq, layer, head, t0, n, k, v, pos));
    int same = 1;
    for (uint32_t t = 0; t < n; t++) {
        const float *sk = xk + ((size_t)t * NKV + head) * HD;
        const float *sv = xv + ((size_t)t * NKV + head) * HD;
        same &= memcmp(k + (size_t)t * HD, sk, HD * 4) == 0;
        same &= memcmp(v + (size_t)t * HD, sv, HD * 4) == 0;
        same &= pos[t] == p[t];
    }
    CHECK(same);
    free(k);
    free(v);
    free(pos);
}

static uint32_t list_len(fixture_t *f, kv_seq_id_t seq, uint32_t layer,
                         uint32_t head)
{
    uint32_t len = 0;
    CHECK_OK(kv_seq_len(f->s, seq, layer, head, &len));
    return len;
}

/* Append n tokens of exact values to (seq, layer) through the fault loop,
 * then check them. dtype F16 converts the same values to half bits. */
static uint64_t append_case(fixture_t *f, const char *what, kv_seq_id_t seq,
                            uint32_t layer, uint32_t n, kv_dtype_t dtype,
                            const int32_t *pos, uint64_t *rng)
{
    size_t ne = (size_t)n * NKV * HD;
    float *k = xmalloc(ne * 4), *v = xmalloc(ne * 4);
    uint16_t *kh = xmalloc(ne * 2), *vh = xmalloc(ne * 2);
    uint32_t old[NKV];
    int32_t *want_pos[NKV]; /* expected positions of the new tokens */
    uint64_t n_alloc = 0;
    fill_exact(k, ne, rng);
    fill_exact(v, ne, rng);
    for (size_t i = 0; i < ne; i++) {
        kh[i] = half_of_exact(k[i]);
        vh[i] = half_of_exact(v[i]);
    }
    for (uint32_t h = 0; h < NKV; h++) {
        int32_t last = -1;
        old[h] = list_len(f, seq, layer, h);
        if (old[h])
            CHECK_OK(kv_read(f->s, seq, layer, h, old[h] - 1, 1, NULL, NULL,
                             &last));
        want_pos[h] = xmalloc((size_t)n * sizeof(int32_t));
        for (uint32_t t = 0; t < n; t++)
            want_pos[h][t] = pos ? pos[t] : last + 1 + (int32_t)t;
    }
    call_t c = {.kind = C_APPEND, .seq = seq, .layer = layer, .n = n,
                .dtype = dtype, .pos = pos};
    c.k = dtype == KV_DTYPE_F16 ? (const void *)kh : (const void *)k;
    c.v = dtype == KV_DTYPE_F16 ? (const void *)vh : (const void *)v;
    if (fault_loop(f, &c, what, &n_alloc) == 0)
        for (uint32_t h = 0; h < NKV; h++) {
            CHECK_EQ(list_len(f, seq, layer, h), old[h] + n);
            expect_tokens(f, seq, layer, h, old[h], n, k, v, want_pos[h]);
        }
    for (uint32_t h = 0; h < NKV; h++)
        free(want_pos[h]);
    free(k);
    free(v);
    free(kh);
    free(vh);
    return n_alloc;
}

/* Compact through the fault loop; on success the list is the kept subset. */
static uint64_t compact_case(fixture_t *f, const char *what, kv_seq_id_t seq,
                             uint32_t layer, uint32_t head,
                             const uint32_t *keep, uint32_t n_keep)
{
    uint32_t len = list_len(f, seq, layer, head);
    float *k = xmalloc((size_t)len * HD * 4), *v = xmalloc((size_t)len * HD * 4);
    int32_t *pos = xmalloc((size_t)len * 4);
    uint64_t n_alloc = 0;
    CHECK_OK(kv_read(f->s, seq, layer, head, 0, len, k, v, pos));
    call_t c = {.kind = C_COMPACT, .seq = seq, .layer = layer, .head = head,
                .keep = keep, .n = n_keep};
    if (fault_loop(f, &c, what, &n_alloc) == 0) {
        float *k2 = xmalloc((size_t)n_keep * HD * 4);
        float *v2 = xmalloc((size_t)n_keep * HD * 4);
        int32_t *p2 = xmalloc((size_t)n_keep * 4);
        CHECK_EQ(list_len(f, seq, layer, head), n_keep);
        CHECK_OK(kv_read(f->s, seq, layer, head, 0, n_keep, k2, v2, p2));
        int same = 1;
        for (uint32_t i = 0; i < n_keep; i++) {
            same &= memcmp(k2 + (size_t)i * HD, k + (size_t)keep[i] * HD, HD * 4) == 0;
            same &= memcmp(v2 + (size_t)i * HD, v + (size_t)keep[i] * HD, HD * 4) == 0;
            same &= p2[i] == pos[keep[i]];
        }
        CHECK(same);
        free(k2);
        free(v2);
        free(p2);
    }
    free(k);
    free(v);
    free(pos);
    return n_alloc;
}

/* Largest |a-b| relative to max |b|, over n floats. */
static double rel_err(const float *a, const float *b, size_t n)
{
    double e = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return e / m;
}

/* Decode over the batch through the fault loop; the final output (and
 * stats) must match a fault-free call made afterwards. */
static uint64_t decode_case(fixture_t *f, const char *what,
                            const kv_seq_id_t *seqs, uint32_t batch,
                            uint32_t layer, int with_stats, uint64_t *rng)
{
    size_t nq = (size_t)batch * NQ * HD;
    const uint32_t stride = 128;
    float *q = xmalloc(nq * 4), *out = xmalloc(nq * 4), *ref = xmalloc(nq * 4);
    float *st[4], *st_ref[4];
    uint64_t n_alloc = 0;
    for (size_t i = 0; i < nq; i++)
        q[i] = kv_test_randf(rng);
    for (uint32_t b = 0; b < batch; b++) {
        st[b] = xmalloc((size_t)NKV * stride * 4);
        st_ref[b] = xmalloc((size_t)NKV * stride * 4);
        memset(st[b], 0, (size_t)NKV * stride * 4);
        memset(st_ref[b], 0, (size_t)NKV * stride * 4);
    }
    call_t c = {.kind = C_DECODE};
    c.dec = (kv_decode_t){.layer = layer, .batch = batch, .seqs = seqs, .q = q,
                          .out = out, .stats = with_stats ? st : NULL,
                          .stats_stride = stride};
    if (fault_loop(f, &c, what, &n_alloc) == 0) {
        kv_decode_t d = c.dec;
        d.out = ref;
        d.stats = with_stats ? st_ref : NULL;
        CHECK_OK(kv_attn_decode(f->s, &d));
        CHECK(rel_err(out, ref, nq) <= 1e-6);
        for (uint32_t b = 0; b < batch && with_stats; b++)
            CHECK(rel_err(st[b], st_ref[b], (size_t)NKV * stride) <= 1e-6);
    }
    for (uint32_t b = 0; b < batch; b++) {
        free(st[b]);
        free(st_ref[b]);
    }
    free(q);
    free(out);
    free(ref);
    return n_alloc;
}

static uint64_t prefill_case(fixture_t *f, const char *what, kv_seq_id_t seq,
                             uint32_t layer, uint32_t n_new, int with_stats,
                             uint64_t *rng)
{
    size_t nq = (size_t)n_new * NQ * HD;
    const uint32_t stride = 128;
    float *q = xmalloc(nq * 4), *out = xmalloc(nq * 4), *ref = xmalloc(nq * 4);
    float *st = xmalloc((size_t)NKV * stride * 4);
    float *st_ref = xmalloc((size_t)NKV * stride * 4);
    uint64_t n_alloc = 0;
    for (size_t i = 0; i < nq; i++)
        q[i] = kv_test_randf(rng);
    memset(st, 0, (size_t)NKV * stride * 4);
    memset(st_ref, 0, (size_t)NKV * stride * 4);
    call_t c = {.kind = C_PREFILL};
    c.pre = (kv_prefill_t){.layer = layer, .seq = seq, .n_new = n_new, .q = q,
                           .out = out, .stats = with_stats ? st : NULL,
                           .stats_stride = stride, .stats_row0 = n_new / 2};
    if (fault_loop(f, &c, what, &n_alloc) == 0) {
        kv_prefill_t p = c.pre;
        p.out = ref;
        p.stats = with_stats ? st_ref : NULL;
        CHECK_OK(kv_attn_prefill(f->s, &p));
        CHECK(rel_err(out, ref, nq) <= 1e-6);
        if (with_stats)
            CHECK(rel_err(st, st_ref, (size_t)NKV * stride) <= 1e-6);
    }
    free(q);
    free(out);
    free(ref);
    free(st);
    free(st_ref);
    return n_alloc;
}

static kv_config_t test_config(void)
{
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = NL;
    cfg.n_q_heads = NQ;
    cfg.n_kv_heads = NKV;
    cfg.head_dim = HD;
    cfg.host_pages = POOL;
    cfg.max_seqs = 16;
    cfg.n_threads = 2; /* attention scratch may be per thread */
    return cfg;
}

/* kv_store_create: on failure *out untouched and no byte left allocated. */
static uint64_t create_case(void)
{
    kv_config_t cfg = test_config();
    uint64_t n;
    for (n = 1; n <= MAX_N; n++) {
        kv_store_t *s = (kv_store_t *)&cfg; /* sentinel */
        uint64_t live = kv_mem_live_bytes();
        kv_fault_arm(n);
        int rc = kv_store_create(&cfg, &s);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (!fired) {
            CHECK_OK(rc);
            CHECK(s != (kv_store_t *)&cfg && s != NULL);
            if (rc == 0) {
                kv_stats_t st = {.struct_size = sizeof st};
                CHECK_OK(kv_store_stats(s, &st));
                CHECK_EQ(st.pages_capacity, POOL);
                CHECK_OK(kv_store_check(s));
                kv_store_destroy(s);
            }
            CHECK_EQ(kv_mem_live_bytes(), live);
            break;
        }
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK(s == (kv_store_t *)&cfg);
        CHECK_EQ(kv_mem_live_bytes(), live);
        if (rc == 0)
            kv_store_destroy(s);
    }
    printf("%-34s %3llu allocation(s); failing each one leaked nothing\n",
           "kv_store_create", (unsigned long long)(n - 1));
    return n - 1;
}

int main(void)
{
    uint64_t rng = 42, n;
    uint64_t live0 = kv_mem_live_bytes();

    CHECK(create_case() >= 1); /* a store needs memory */

    fixture_t f = {0};
    kv_config_t cfg = test_config();
    CHECK_OK(kv_store_create(&cfg, &f.s));
    if (!f.s)
        return kv_test_end();

    /* sequence creation: A through the fault loop, B plainly */
    call_t c = {.kind = C_SEQ_CREATE};
    if (fault_loop(&f, &c, "kv_seq_create", &n) == 0)
        f.ids[f.n_ids++] = c.out_id;
    CHECK_OK(kv_seq_create(f.s, &f.ids[f.n_ids]));
    f.n_ids++;
    if (f.n_ids != 2)
        return kv_test_end();
    kv_seq_id_t A = f.ids[0], B = f.ids[1];

    /* appends on unshared lists */
    CHECK(append_case(&f, "kv_append (first page, F32)", A, 0, 20, KV_DTYPE_F32,
                      NULL, &rng) >= 1);
    append_case(&f, "kv_append (within page)", A, 0, 3, KV_DTYPE_F32, NULL, &rng);
    CHECK(append_case(&f, "kv_append (crosses page, F16)", A, 0, 12,
                      KV_DTYPE_F16, NULL, &rng) >= 1);
    int32_t pos[40];
    for (int i = 0; i < 40; i++)
        pos[i] = 100 + 3 * i;
    append_case(&f, "kv_append (explicit positions)", A, 1, 21, KV_DTYPE_F32,
                pos, &rng);
    append_case(&f, "kv_append (B, layer 0)", B, 0, 16, KV_DTYPE_F32, NULL, &rng);
    append_case(&f, "kv_append (B, layer 1)", B, 1, 5, KV_DTYPE_F16, NULL, &rng);

    /* fork: C shares every page of A */
    kv_stats_t st0 = {.struct_size = sizeof st0}, st1 = {.struct_size = sizeof st1};
    CHECK_OK(kv_store_stats(f.s, &st0));
    c = (call_t){.kind = C_FORK, .seq = A};
    if (fault_loop(&f, &c, "kv_seq_fork", &n) == 0)
        f.ids[f.n_ids++] = c.out_id;
    if (f.n_ids != 3)
        return kv_test_end();
    kv_seq_id_t C = f.ids[2];
    CHECK_OK(kv_store_stats(f.s, &st1));
    CHECK_EQ(st1.pages_used, st0.pages_used);

    /* copy-on-write appends: into C's shared tail (A layer 0 has 35 tokens:
     * 3 in a shared partial page), then into A's still-shared layer-1 tail */
    CHECK(append_case(&f, "kv_append (CoW, child tail)", C, 0, 2, KV_DTYPE_F32,
                      NULL, &rng) >= 1);
    CHECK(append_case(&f, "kv_append (CoW, parent tail)", A, 1, 3, KV_DTYPE_F16,
                      NULL, &rng) >= 1);
    /* C's layer-1 tail is no longer shared (A copied): in place + 2 pages */
    CHECK(append_case(&f, "kv_append (after CoW, 2 new pages)", C, 1, 30,
                      KV_DTYPE_F32, NULL, &rng) >= 1);

    /* compaction: unshared (B layer 0), shared (C layer 0 head 1 still
     * shares its two full pages with A) */
    static const uint32_t keep_b[] = {0, 1, 2, 3, 9, 14, 15};
    compact_case(&f, "kv_compact (unshared)", B, 0, 0, keep_b, 7);
    static const uint32_t keep_c[] = {0, 2, 5, 7, 17, 20, 30, 31, 33, 36};
    CHECK(compact_case(&f, "kv_compact (shared pages)", C, 0, 1, keep_c, 10) >= 1);
    static const uint32_t keep_c2[] = {1, 3, 4, 5, 6, 7, 8, 9, 10};
    compact_case(&f, "kv_compact (shared, layer 1)", C, 1, 0, keep_c2, 9);

    /* attention */
    kv_seq_id_t batch[3] = {A, B, C};
    decode_case(&f, "kv_attn_decode", batch, 3, 0, 0, &rng);
    decode_case(&f, "kv_attn_decode (stats)", batch, 3, 0, 1, &rng);
    decode_case(&f, "kv_attn_decode (layer 1, stats)", batch, 3, 1, 1, &rng);
    prefill_case(&f, "kv_attn_prefill", A, 0, 10, 0, &rng);
    prefill_case(&f, "kv_attn_prefill (stats)", A, 0, 10, 1, &rng);
    prefill_case(&f, "kv_attn_prefill (C, stats)", C, 1, 8, 1, &rng);

    /* reads and the read-only calls */
    uint32_t len = list_len(&f, A, 0, 0);
    float *rk = xmalloc((size_t)len * HD * 4), *rv = xmalloc((size_t)len * HD * 4);
    int32_t *rp = xmalloc((size_t)len * 4);
    c = (call_t){.kind = C_READ, .seq = A, .layer = 0, .head = 0, .n = len,
                 .rk = rk, .rv = rv, .rpos = rp};
    fault_loop(&f, &c, "kv_read", &n);
    free(rk);
    free(rv);
    free(rp);
    c = (call_t){.kind = C_SEQ_LEN, .seq = A};
    fault_loop(&f, &c, "kv_seq_len", &n);
    c = (call_t){.kind = C_STATS};
    fault_loop(&f, &c, "kv_store_stats", &n);
    c = (call_t){.kind = C_CONFIG};
    fault_loop(&f, &c, "kv_store_config", &n);
    c = (call_t){.kind = C_CHECK};
    fault_loop(&f, &c, "kv_store_check", &n);

    /* freeing the parent of a fork releases only the unshared pages */
    f.ids[0] = C;
    f.ids[2] = A;
    f.n_ids = 2; /* A is no longer compared */
    c = (call_t){.kind = C_SEQ_FREE, .seq = A};
    fault_loop(&f, &c, "kv_seq_free", &n);
    CHECK_OK(kv_store_check(f.s));
    CHECK_OK(kv_seq_free(f.s, B));
    CHECK_OK(kv_seq_free(f.s, C));
    CHECK_OK(kv_store_stats(f.s, &st0));
    CHECK_EQ(st0.pages_used, 0);
    CHECK_EQ(st0.n_seqs, 0);
    kv_store_destroy(f.s);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
