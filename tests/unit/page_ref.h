/* SPDX-License-Identifier: MIT */
/*
 * page_ref.h — helpers shared by the page-table unit tests (test_page,
 * test_page_cow, test_page_compact): a fixture (host pool + page table), a
 * plain-array reference model of every list's tokens and positions, and a
 * snapshot of everything observable about the table (structure, pool usage,
 * totals, metadata bytes) to prove that a failed call changed nothing.
 *
 * The reference model stores what the table must return: FP32 input rounded
 * to FP16 (kv_half_from_float then back), FP16 input decoded exactly. It uses
 * the system allocator (test code, not library metadata) and frees all.
 */
#ifndef PAGE_REF_H
#define PAGE_REF_H

#include <stdlib.h>
#include <string.h>

#include "alloc/kv_alloc.h"
#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "formats/kv_fmt_fp16.h"
#include "formats/kv_half.h"
#include "pages/kv_page.h"

/* ---- reference model ---------------------------------------------------- */

typedef struct ref_list {
    uint32_t n, cap; /* tokens, capacity in tokens   */
    float *k, *v;    /* [cap][D] expected read-back  */
    int32_t *pos;    /* [cap] expected positions     */
} ref_list_t;

typedef struct ref {
    uint32_t S, L, H, D; /* max_seqs, layers, kv heads, head_dim */
    uint8_t *live;       /* [S]                                  */
    ref_list_t *lists;   /* [S][L][H]                            */
} ref_t;

static inline ref_list_t *ref_at(ref_t *r, uint32_t s, uint32_t l, uint32_t h)
{
    return &r->lists[((size_t)s * r->L + l) * r->H + h];
}

static inline void ref_reserve(ref_t *r, ref_list_t *x, uint32_t need)
{
    if (need <= x->cap)
        return;
    uint32_t cap = need < 2 * x->cap ? 2 * x->cap : need;
    x->k = realloc(x->k, (size_t)cap * r->D * sizeof(float));
    x->v = realloc(x->v, (size_t)cap * r->D * sizeof(float));
    x->pos = realloc(x->pos, (size_t)cap * sizeof(int32_t));
    if (!x->k || !x->v || !x->pos) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    x->cap = cap;
}

static inline void ref_init(ref_t *r, uint32_t S, uint32_t L, uint32_t H,
                            uint32_t D)
{
    r->S = S, r->L = L, r->H = H, r->D = D;
    r->live = calloc(S, 1);
    r->lists = calloc((size_t)S * L * H, sizeof *r->lists);
}

static inline void ref_clear(ref_t *r, uint32_t s)
{
    for (uint32_t i = 0; i < r->L * r->H; i++) {
        ref_list_t *x = &r->lists[(size_t)s * r->L * r->H + i];
        free(x->k), free(x->v), free(x->pos);
        memset(x, 0, sizeof *x);
    }
    r->live[s] = 0;
}

static inline void ref_fini(ref_t *r)
{
    for (uint32_t s = 0; s < r->S; s++)
        ref_clear(r, s);
    free(r->live);
    free(r->lists);
}

/* k, v: [n][H][D] expected values; pos: [n] or NULL (continue). */
static inline void ref_append(ref_t *r, uint32_t s, uint32_t l, uint32_t n,
                              const float *k, const float *v,
                              const int32_t *pos)
{
    for (uint32_t h = 0; h < r->H; h++) {
        ref_list_t *x = ref_at(r, s, l, h);
        ref_reserve(r, x, x->n + n);
        int32_t next = 0; /* one past the largest position held */
        for (uint32_t i = 0; i < x->n; i++)
            next = x->pos[i] >= next ? x->pos[i] + 1 : next;
        for (uint32_t i = 0; i < n; i++) {
            memcpy(x->k + (size_t)(x->n + i) * r->D,
                   k + ((size_t)i * r->H + h) * r->D, r->D * sizeof(float));
            memcpy(x->v + (size_t)(x->n + i) * r->D,
                   v + ((size_t)i * r->H + h) * r->D, r->D * sizeof(float));
            x->pos[x->n + i] = pos ? pos[i] : next + (int32_t)i;
        }
        x->n += n;
    }
}

static inline void ref_fork(ref_t *r, uint32_t parent, uint32_t child)
{
    for (uint32_t l = 0; l < r->L; l++)
        for (uint32_t h = 0; h < r->H; h++) {
            ref_list_t *p = ref_at(r, parent, l, h);
            ref_list_t *c = ref_at(r, child, l, h);
            ref_reserve(r, c, p->n);
            if (p->n) {
                memcpy(c->k, p->k, (size_t)p->n * r->D * sizeof(float));
                memcpy(c->v, p->v, (size_t)p->n * r->D * sizeof(float));
                memcpy(c->pos, p->pos, (size_t)p->n * sizeof(int32_t));
            }
            c->n = p->n;
        }
    r->live[child] = 1;
}

static inline void ref_compact(ref_t *r, uint32_t s, uint32_t l, uint32_t h,
                               const uint32_t *keep, uint32_t n_keep)
{
    ref_list_t *x = ref_at(r, s, l, h);
    for (uint32_t i = 0; i < n_keep; i++) {
        memmove(x->k + (size_t)i * r->D, x->k + (size_t)keep[i] * r->D,
                r->D * sizeof(float));
        memmove(x->v + (size_t)i * r->D, x->v + (size_t)keep[i] * r->D,
                r->D * sizeof(float));
        x->pos[i] = x->pos[keep[i]];
    }
    x->n = n_keep;
}

/* Compare one list of the table with the model: 0 if identical. */
static inline int ref_diff_list(const kv_page_table_t *pt, ref_t *r, uint32_t s,
                                uint32_t l, uint32_t h)
{
    ref_list_t *x = ref_at(r, s, l, h);
    const kv_page_list_t *pl = kv_page_list_get(pt, s, l, h);
    if (!pl || pl->n_tokens != x->n)
        return 1;
    if (x->n == 0)
        return 0;
    size_t cnt = (size_t)x->n * r->D;
    float *k = malloc(cnt * sizeof *k), *v = malloc(cnt * sizeof *v);
    int32_t *pos = malloc(x->n * sizeof *pos);
    int bad = kv_page_read(pt, s, l, h, 0, x->n, k, v, pos) != 0 ||
              memcmp(k, x->k, cnt * sizeof *k) != 0 ||
              memcmp(v, x->v, cnt * sizeof *v) != 0 ||
              memcmp(pos, x->pos, x->n * sizeof *pos) != 0;
    free(k), free(v), free(pos);
    return bad;
}

/* Number of lists of live sequences that differ from the model (and a
 * sequence live in one but not the other counts as one). */
static inline int ref_diff(const kv_page_table_t *pt, ref_t *r)
{
    int bad = 0;
    for (uint32_t s = 0; s < r->S; s++) {
        if (r->live[s] != (kv_page_seq_live(pt, s) == 1)) {
            bad++;
            continue;
        }
        for (uint32_t l = 0; r->live[s] && l < r->L; l++)
            for (uint32_t h = 0; h < r->H; h++)
                bad += ref_diff_list(pt, r, s, l, h);
    }
    return bad;
}

/* ---- inputs ------------------------------------------------------------- */

/* n floats uniform in [-scale, scale) into x, and their FP16 rounding into
 * xr (what the table must return). */
static inline void gen_f32(uint64_t *seed, size_t n, float scale, float *x,
                           float *xr)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = kv_test_randf(seed) * scale;
        xr[i] = kv_half_to_float(kv_half_from_float(x[i]));
    }
}

/* n finite halves into x and their exact values into xr. */
static inline void gen_f16(uint64_t *seed, size_t n, float scale, kv_half_t *x,
                           float *xr)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = kv_half_from_float(kv_test_randf(seed) * scale);
        xr[i] = kv_half_to_float(x[i]);
    }
}

/* ---- fixture ------------------------------------------------------------ */

typedef struct fix {
    kv_alloc_pool_t *pool;
    kv_page_table_t *pt;
    ref_t ref;
    uint32_t T;    /* FP16 tokens per page */
    uint64_t mem0; /* kv_mem_live_bytes() before the table was created */
} fix_t;

/* A host pool of `capacity` pages of T FP16 tokens (+ `slack` bytes) and a
 * table over it. Exits on failure (a broken fixture makes every check moot). */
static inline void fix_open(fix_t *f, uint32_t L, uint32_t H, uint32_t D,
                            uint32_t T, uint32_t S, uint32_t capacity)
{
    memset(f, 0, sizeof *f);
    kv_alloc_config_t ac = {.page_bytes = 4 * D * T, .capacity = capacity,
                            .tier = KV_TIER_HOST, .flags = KV_ALLOC_NO_TCACHE};
    kv_page_table_config_t pc = {
        .geom = {.head_dim = D, .page_bytes = 4 * D * T},
        .n_layers = L, .n_kv_heads = H, .max_seqs = S};
    int rc = kv_alloc_pool_create(&ac, &f->pool);
    f->mem0 = kv_mem_live_bytes();
    if (!rc)
        rc = kv_page_table_create(&pc, f->pool, &f->pt);
    if (rc) {
        fprintf(stderr, "fixture: %s\n", kv_strerror(rc));
        exit(2);
    }
    f->T = T;
    ref_init(&f->ref, S, L, H, D);
}

static inline void fix_close(fix_t *f)
{
    kv_page_table_destroy(f->pt);
    /* Everything the table held from kv_mem is back. */
    CHECK_EQ(kv_mem_live_bytes(), f->mem0);
    kv_alloc_stats_t st;
    kv_alloc_stats(f->pool, &st);
    CHECK_EQ(st.used, 0);
    kv_alloc_pool_destroy(f->pool);
    ref_fini(&f->ref);
}

static inline uint64_t pool_used(const fix_t *f)
{
    kv_alloc_stats_t st;
    kv_alloc_stats(f->pool, &st);
    return st.used;
}

/* The table's own metadata accounting matches what kv_mem saw. */
static inline int meta_exact(const fix_t *f)
{
    kv_page_totals_t t;
    kv_page_table_totals(f->pt, &t);
    return t.meta_bytes == kv_mem_live_bytes() - f->mem0;
}

/* Append n random FP32 tokens to (s, layer) of the table and, if that
 * succeeds, to the model. Returns the table's result. */
static inline int fix_append(fix_t *f, uint64_t *seed, uint32_t s,
                             uint32_t layer, uint32_t n, const int32_t *pos)
{
    size_t cnt = (size_t)n * f->ref.H * f->ref.D;
    float *k = malloc(cnt * sizeof *k), *v = malloc(cnt * sizeof *v);
    float *kr = malloc(cnt * sizeof *kr), *vr = malloc(cnt * sizeof *vr);
    gen_f32(seed, cnt, 4.0f, k, kr);
    gen_f32(seed, cnt, 4.0f, v, vr);
    int rc = kv_page_append(f->pt, s, layer, n, KV_DTYPE_F32, k, v, pos);
    if (rc == 0)
        ref_append(&f->ref, s, layer, n, kr, vr, pos);
    free(k), free(v), free(kr), free(vr);
    return rc;
}

/* ---- snapshot ----------------------------------------------------------- */

/* Everything observable about the table, flattened to words. */
typedef struct snap {
    uint64_t *w;
    size_t n, cap;
} snap_t;

static inline void snap_put(snap_t *s, uint64_t x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->w = realloc(s->w, s->cap * sizeof *s->w);
        if (!s->w)
            exit(2);
    }
    s->w[s->n++] = x;
}

static inline void snap_take(const fix_t *f, snap_t *s)
{
    s->n = 0;
    kv_page_totals_t t;
    kv_page_table_totals(f->pt, &t);
    snap_put(s, t.tokens);
    snap_put(s, t.meta_bytes);
    for (uint32_t i = 0; i < KV_FMT_COUNT; i++)
        snap_put(s, t.pages_by_format[i]);
    snap_put(s, pool_used(f));
    snap_put(s, kv_mem_live_bytes());
    snap_put(s, kv_page_seq_count(f->pt));
    for (uint32_t q = 0; q < f->ref.S; q++) {
        snap_put(s, (uint64_t)kv_page_seq_live(f->pt, q));
        for (uint32_t l = 0; l < f->ref.L; l++)
            for (uint32_t h = 0; h < f->ref.H; h++) {
                const kv_page_list_t *pl = kv_page_list_get(f->pt, q, l, h);
                if (!pl)
                    continue;
                snap_put(s, pl->n_tokens);
                snap_put(s, pl->n_ents);
                snap_put(s, pl->pos != NULL);
                for (uint32_t e = 0; e < pl->n_ents; e++) {
                    snap_put(s, pl->ents[e].id);
                    snap_put(s, pl->ents[e].format);
                    snap_put(s, pl->ents[e].n_tokens);
                    snap_put(s, kv_alloc_refcount(f->pool, pl->ents[e].id));
                }
                for (uint32_t i = 0; i < pl->n_tokens; i++)
                    snap_put(s, (uint64_t)(uint32_t)kv_page_list_pos(pl, i));
            }
    }
}

static inline int snap_same(const snap_t *a, const snap_t *b)
{
    return a->n == b->n && memcmp(a->w, b->w, a->n * sizeof *a->w) == 0;
}

static inline void snap_free(snap_t *s)
{
    free(s->w);
    memset(s, 0, sizeof *s);
}

/* Run op under an injected failure of its N-th allocation, N = 1, 2, ...
 * until it succeeds. Every failed run must return KV_ENOMEM and leave the
 * table, pool, model contents and kv_mem exactly as before, with check()
 * passing. Returns the number of failed runs (-1 if op never succeeded within
 * max_n tries). op returns an error code; ctx is its argument. */
typedef int (*fault_op_t)(fix_t *f, void *ctx);

static inline int fault_sweep(fix_t *f, fault_op_t op, void *ctx, int max_n)
{
    snap_t before = {0}, after = {0};
    int n;
    for (n = 1; n <= max_n; n++) {
        snap_take(f, &before);
        kv_fault_arm((uint64_t)n);
        int rc = op(f, ctx);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (rc == 0) {
            CHECK(!fired);
            break;
        }
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK(fired);
        snap_take(f, &after);
        CHECK(snap_same(&before, &after));
        CHECK_OK(kv_page_table_check(f->pt));
        CHECK_EQ(ref_diff(f->pt, &f->ref), 0);
    }
    snap_free(&before);
    snap_free(&after);
    return n > max_n ? -1 : n - 1;
}

#endif /* PAGE_REF_H */
