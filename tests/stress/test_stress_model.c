/* SPDX-License-Identifier: MIT */
/*
 * test_stress_model.c — randomized model-based test of the public API
 * (allocator + page table + fork + compaction + attention) against a shadow
 * model written in plain C.
 *
 * The model holds, for every live sequence and every (layer, kv_head) list,
 * the exact FP16 bits and the position of every token. The FP16 bits of F32
 * input come from this file's own float->half (round to nearest even), so the
 * library's conversion is checked against an independent one.
 *
 * Every random operation is one or more public calls. Invariants checked:
 *   - a successful mutation changes the store exactly as the model says;
 *   - KV_ENOMEM / KV_ELIMIT / KV_ERANGE / KV_ENOENT change nothing (the
 *     touched sequence is compared in full, and the store statistics);
 *   - KV_ENOMEM never happens while the pool clearly has room, fork never
 *     takes a page, every expected ELIMIT / ENOENT / ESTATE happens;
 *   - decode output matches a dense reference over the model's values, and
 *     decode/prefill statistics are probabilities (each row sums to 1);
 *   - every ~1000 ops and at the end: every list of every live sequence is
 *     bit exact, kv_store_check() == 0, and the statistics add up;
 *   - after freeing everything: no page in use, and after kv_store_destroy
 *     kv_mem_live_bytes() is back where it was (no metadata leak).
 *
 * The store and the model are owned by main(); a failure prints the seed and
 * the operation number and stops that seed's run (rerun with the seed as
 * argv[1] or KV_STRESS_SEED). KV_STRESS_OPS scales the total op count
 * (default 10^6, split over the fixed seeds).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_snap.h"

/* Store shape: tiny, so that a million ops are fast and the pool is small
 * enough that running out of pages is routine. */
#define NL 2                 /* layers                               */
#define NKV 2                /* kv heads                             */
#define NQ 4                 /* query heads (groups of 2)            */
#define HD 16                /* head_dim                             */
#define TPP 16               /* FP16 tokens per page                 */
#define PAGE_BYTES (64 * HD) /* = 16 tokens of K+V                   */
#define POOL_PAGES 128
#define MAX_SEQS 24
#define N_LISTS (NL * NKV)
#define MAX_APPEND 40
#define FULL_CHECK_EVERY 1000

/* ---- independent FP16 conversion ------------------------------------- */

static float h2f_table[65536]; /* half bits -> float, exact */

static float half_to_float_slow(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Round to nearest even, through exact double arithmetic. */
static uint16_t float_to_half(float f)
{
    uint16_t s = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f), step, q, r;
    int e, big_e;
    if (isnan(f))
        return s | 0x7E00;
    if (a >= 65520.0)
        return s | 0x7C00;
    if (a == 0.0)
        return s;
    (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
    big_e = e - 1;
    step = ldexp(1.0, (big_e < -14 ? -14 : big_e) - 10);
    q = nearbyint(a / step);
    r = q * step;
    if (r == 0.0)
        return s;
    if (r < ldexp(1.0, -14))
        return s | (uint16_t)q; /* subnormal */
    (void)frexp(r, &e);
    big_e = e - 1;
    return s | (uint16_t)((big_e + 15) << 10) |
           (uint16_t)(ldexp(r, -big_e) * 1024.0 - 1024.0);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- the model -------------------------------------------------------- */

typedef struct mlist {
    uint16_t *k, *v; /* [cap][HD] FP16 bits */
    int32_t *pos;    /* [cap]               */
    uint32_t len, cap;
} mlist_t;

typedef struct mseq {
    kv_seq_id_t id;
    mlist_t l[N_LISTS]; /* index layer * NKV + kv_head */
} mseq_t;

typedef struct model {
    mseq_t *seqs[MAX_SEQS]; /* [n] live sequences, any order */
    uint32_t n;
} model_t;

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return q;
}

static void mlist_reserve(mlist_t *l, uint32_t need)
{
    if (need <= l->cap)
        return;
    uint32_t cap = l->cap ? l->cap : 32;
    while (cap < need)
        cap *= 2;
    l->k = xrealloc(l->k, (size_t)cap * HD * 2);
    l->v = xrealloc(l->v, (size_t)cap * HD * 2);
    l->pos = xrealloc(l->pos, (size_t)cap * 4);
    l->cap = cap;
}

static void mlist_free(mlist_t *l)
{
    free(l->k);
    free(l->v);
    free(l->pos);
    memset(l, 0, sizeof *l);
}

static int32_t mlist_next_pos(const mlist_t *l)
{
    return l->len ? l->pos[l->len - 1] + 1 : 0;
}

static mseq_t *mseq_new(kv_seq_id_t id)
{
    mseq_t *s = calloc(1, sizeof *s);
    if (!s)
        exit(2);
    s->id = id;
    return s;
}

static void mseq_free(mseq_t *s)
{
    for (int i = 0; i < N_LISTS; i++)
        mlist_free(&s->l[i]);
    free(s);
}

static mseq_t *mseq_clone(const mseq_t *p, kv_seq_id_t id)
{
    mseq_t *s = mseq_new(id);
    for (int i = 0; i < N_LISTS; i++) {
        const mlist_t *a = &p->l[i];
        mlist_t *b = &s->l[i];
        mlist_reserve(b, a->len);
        if (a->len) {
            memcpy(b->k, a->k, (size_t)a->len * HD * 2);
            memcpy(b->v, a->v, (size_t)a->len * HD * 2);
            memcpy(b->pos, a->pos, (size_t)a->len * 4);
        }
        b->len = a->len;
    }
    return s;
}

static int model_find(const model_t *m, kv_seq_id_t id)
{
    for (uint32_t i = 0; i < m->n; i++)
        if (m->seqs[i]->id == id)
            return (int)i;
    return -1;
}

static void model_remove(model_t *m, uint32_t i)
{
    mseq_free(m->seqs[i]);
    m->seqs[i] = m->seqs[--m->n];
}

static uint64_t model_tokens(const model_t *m)
{
    uint64_t t = 0;
    for (uint32_t i = 0; i < m->n; i++)
        for (int j = 0; j < N_LISTS; j++)
            t += m->seqs[i]->l[j].len;
    return t;
}

/* Pages the model's lists would need with no sharing (only the last page of
 * a list may be partly filled): an upper bound on pages_used. */
static uint64_t model_pages_unshared(const model_t *m)
{
    uint64_t p = 0;
    for (uint32_t i = 0; i < m->n; i++)
        for (int j = 0; j < N_LISTS; j++)
            p += (m->seqs[i]->l[j].len + TPP - 1) / TPP;
    return p;
}

/* ---- run state -------------------------------------------------------- */

typedef struct run {
    uint64_t seed, rng;
    uint64_t op;         /* random operations so far          */
    uint64_t calls;      /* public API calls so far           */
    const char *op_name; /* current operation, for messages   */
    int failed;          /* first failure stops this seed     */
    kv_store_t *store;
    model_t m;
    /* counters for the summary */
    uint64_t n_enomem, n_elimit, n_forks, n_compacts, n_appends, n_decodes;
    uint64_t n_erange, n_enoent, n_estate;
    /* scratch */
    float *rk, *rv; /* [MAX list len][HD] */
    int32_t *rpos;
    uint32_t rcap;
} run_t;

static run_t R;

#define API(call) (R.calls++, (call))

static void fail_at(int line, const char *what)
{
    kv_test_fail_++;
    if (!R.failed)
        fprintf(stderr,
                "test_stress_model.c:%d: CHECK failed: %s (seed %llu, op %llu "
                "'%s')\n",
                line, what, (unsigned long long)R.seed,
                (unsigned long long)R.op, R.op_name ? R.op_name : "?");
    R.failed = 1;
}

#define SCHECK(cond)                  \
    do {                              \
        if (cond)                     \
            kv_test_pass_++;          \
        else                          \
            fail_at(__LINE__, #cond); \
    } while (0)

#define SCHECK_RC(expr, want)                                              \
    do {                                                                   \
        int rc_ = (expr), want_ = (want);                                  \
        if (rc_ == want_) {                                                \
            kv_test_pass_++;                                               \
        } else {                                                           \
            char m_[160];                                                  \
            snprintf(m_, sizeof m_, "%s returned %d (%s), want %d", #expr, \
                     rc_, kv_strerror(rc_), want_);                        \
            fail_at(__LINE__, m_);                                         \
        }                                                                  \
    } while (0)

static uint32_t rnd(uint32_t n) /* uniform in [0, n) */
{
    return (uint32_t)(kv_test_rand(&R.rng) % n);
}

static void scratch_reserve(uint32_t n)
{
    if (n <= R.rcap)
        return;
    uint32_t cap = R.rcap ? R.rcap : 256;
    while (cap < n)
        cap *= 2;
    R.rk = xrealloc(R.rk, (size_t)cap * HD * 4);
    R.rv = xrealloc(R.rv, (size_t)cap * HD * 4);
    R.rpos = xrealloc(R.rpos, (size_t)cap * 4);
    R.rcap = cap;
}

/* ---- verification ----------------------------------------------------- */

/* Tokens [t0, t0+n) of one list, read through kv_read, vs the model. */
static void verify_range(const mseq_t *s, int li, uint32_t t0, uint32_t n)
{
    const mlist_t *l = &s->l[li];
    if (n == 0)
        return;
    scratch_reserve(n);
    SCHECK_RC(API(kv_read(R.store, s->id, (uint32_t)li / NKV, (uint32_t)li % NKV,
                          t0, n, R.rk, R.rv, R.rpos)),
              0);
    for (uint32_t t = 0; t < n && !R.failed; t++) {
        SCHECK(R.rpos[t] == l->pos[t0 + t]);
        for (int d = 0; d < HD; d++) {
            size_t i = (size_t)(t0 + t) * HD + d, j = (size_t)t * HD + d;
            if (fbits(R.rk[j]) != fbits(h2f_table[l->k[i]]) ||
                fbits(R.rv[j]) != fbits(h2f_table[l->v[i]])) {
                char m[160];
                snprintf(m, sizeof m,
                         "list %d token %u dim %d: read k %a v %a, model %a %a",
                         li, t0 + t, d, (double)R.rk[j], (double)R.rv[j],
                         (double)h2f_table[l->k[i]], (double)h2f_table[l->v[i]]);
                fail_at(__LINE__, m);
                return;
            }
        }
    }
}

static void verify_list(const mseq_t *s, int li)
{
    uint32_t len = 0xFFFFFFFFu;
    SCHECK_RC(API(kv_seq_len(R.store, s->id, (uint32_t)li / NKV,
                             (uint32_t)li % NKV, &len)),
              0);
    SCHECK(len == s->l[li].len);
    if (len == s->l[li].len)
        verify_range(s, li, 0, len);
}

static void verify_seq(const mseq_t *s)
{
    for (int li = 0; li < N_LISTS && !R.failed; li++)
        verify_list(s, li);
}

static kv_stats_t get_stats(void)
{
    kv_stats_t st;
    memset(&st, 0xAB, sizeof st);
    st.struct_size = sizeof st;
    SCHECK_RC(API(kv_store_stats(R.store, &st)), 0);
    return st;
}

/* Statistics consistent with the model. */
static void verify_stats(void)
{
    kv_stats_t st = get_stats();
    uint64_t tok = model_tokens(&R.m);
    SCHECK(st.page_bytes == PAGE_BYTES);
    SCHECK(st.fp16_tokens_per_page == TPP);
    SCHECK(st.pages_capacity == POOL_PAGES);
    SCHECK(st.pages_used + st.pages_free == st.pages_capacity);
    SCHECK(st.pages_peak >= st.pages_used && st.pages_peak <= POOL_PAGES);
    SCHECK(st.n_seqs == R.m.n);
    SCHECK(st.tokens == tok);
    SCHECK(st.fp16_bytes == tok * 2 * HD * 2);
    SCHECK(st.pages_by_format[KV_FMT_FP16] == st.pages_used);
    SCHECK(st.kv_bytes == st.pages_used * PAGE_BYTES);
    SCHECK(st.bytes_by_format[KV_FMT_FP16] == st.pages_used * PAGE_BYTES);
    SCHECK(st.pages_used <= model_pages_unshared(&R.m));
    SCHECK(R.m.n == 0 || st.meta_bytes > 0);
}

static void verify_all(void)
{
    SCHECK_RC(API(kv_store_check(R.store)), 0);
    for (uint32_t i = 0; i < R.m.n && !R.failed; i++)
        verify_seq(R.m.seqs[i]);
    verify_stats();
}

/* After an error: nothing changed (stats, the touched sequence, check). */
static void verify_unchanged(const kv_stats_t *before, const mseq_t *s)
{
    kv_stats_t after = get_stats();
    SCHECK(kv_test_stats_same(before, &after)); /* kv_test_snap.h */
    if (s)
        verify_seq(s);
    SCHECK_RC(API(kv_store_check(R.store)), 0);
}

/* ---- value generators ------------------------------------------------- */

/* A random finite FP16 value; keys stay below 2 in magnitude so that dense
 * attention references stay well conditioned, values span the whole range. */
static uint16_t gen_half(int is_v)
{
    uint32_t r = rnd(100);
    uint16_t s = (uint16_t)(rnd(2) << 15);
    uint32_t e;
    if (r < 3)
        return s; /* +-0 */
    if (r < 8)
        e = 0; /* subnormal */
    else if (r < 90)
        e = 10 + rnd(6); /* 2^-5 .. 1 */
    else
        e = is_v ? rnd(31) : rnd(16);
    return s | (uint16_t)(e << 10) | (uint16_t)rnd(1024);
}

/* A random F32 input that fits FP16 (|x| <= 65504), with exact ties,
 * subnormal-range values and +-0 mixed in. */
static float gen_f32(int is_v)
{
    uint32_t r = rnd(100);
    if (r < 80)
        return kv_test_randf(&R.rng) * 2.0f;
    if (r < 88) { /* midpoint of two neighbouring halves: a rounding tie */
        uint16_t h = gen_half(0) & 0x7BFE;
        float a = h2f_table[h], b = h2f_table[h + 1];
        float t = (a + b) * 0.5f;
        return rnd(2) ? -t : t;
    }
    if (r < 93) /* FP16 subnormal range, including values that round to 0 */
        return ldexpf(kv_test_randf(&R.rng), -14 - (int)rnd(12));
    if (r < 95)
        return rnd(2) ? -0.0f : 0.0f;
    if (!is_v)
        return kv_test_randf(&R.rng) * 0.01f;
    switch (rnd(4)) {
    case 0: return 65504.0f;
    case 1: return -65504.0f;
    case 2: return 65503.9f; /* rounds to 65504 */
    default: return kv_test_randf(&R.rng) * 60000.0f;
    }
}

/* Tables of random inputs, drawn once per seed (generating and converting
 * every element of every append would dominate the run time). Index 0: keys,
 * 1: values. */
#define VT 65536
static float vt_f[2][VT];     /* F32 inputs                          */
static uint16_t vt_fh[2][VT]; /* their FP16 bits (float_to_half)     */
static uint16_t vt_h[2][VT];  /* F16 inputs                          */

static void value_tables_fill(void)
{
    for (int w = 0; w < 2; w++)
        for (uint32_t i = 0; i < VT; i++) {
            vt_f[w][i] = gen_f32(w);
            vt_fh[w][i] = float_to_half(vt_f[w][i]);
            vt_h[w][i] = gen_half(w);
        }
}

/* ---- dense reference for decode -------------------------------------- */

/* Check one batch row of decode output (and stats, when given) against a
 * double-precision dense attention over the model's list. */
static void check_decode_row(const mseq_t *s, uint32_t layer, const float *q,
                             const float *out, const float *stats,
                             uint32_t stride)
{
    const double scale = 1.0 / sqrt((double)HD);
    const uint32_t group = NQ / NKV;
    double *p = NULL;
    for (uint32_t g = 0; g < NKV && !R.failed; g++) {
        const mlist_t *l = &s->l[layer * NKV + g];
        double vmax = 1e-6;
        p = xrealloc(p, (size_t)l->len * sizeof *p);
        for (uint32_t t = 0; t < (size_t)l->len * HD; t++)
            vmax = fmax(vmax, fabs((double)h2f_table[l->v[t]]));
        double *psum = calloc(l->len ? l->len : 1, sizeof *psum);
        for (uint32_t h = g * group; h < (g + 1) * group; h++) {
            const float *qh = q + (size_t)h * HD;
            double mx = -INFINITY, sum = 0;
            for (uint32_t t = 0; t < l->len; t++) {
                double dot = 0;
                for (int d = 0; d < HD; d++)
                    dot += (double)qh[d] * h2f_table[l->k[(size_t)t * HD + d]];
                p[t] = dot * scale;
                mx = fmax(mx, p[t]);
            }
            for (uint32_t t = 0; t < l->len; t++)
                sum += (p[t] = exp(p[t] - mx));
            for (int d = 0; d < HD; d++) {
                double o = 0;
                for (uint32_t t = 0; t < l->len; t++)
                    o += p[t] / sum * h2f_table[l->v[(size_t)t * HD + d]];
                float got = out[(size_t)h * HD + d];
                if (!isfinite(got) || fabs(got - o) > 1e-3 * vmax) {
                    char m[160];
                    snprintf(m, sizeof m,
                             "decode seq %u layer %u qhead %u dim %d: %g vs "
                             "dense %g (len %u)",
                             s->id, layer, h, d, (double)got, o, l->len);
                    fail_at(__LINE__, m);
                    break;
                }
            }
            for (uint32_t t = 0; t < l->len; t++)
                psum[t] += p[t] / sum;
        }
        if (stats)
            for (uint32_t t = 0; t < l->len && !R.failed; t++)
                SCHECK(fabs(stats[(size_t)g * stride + t] - psum[t]) <=
                       1e-4 + 1e-3 * psum[t]);
        free(psum);
    }
    free(p);
}

/* ---- operations ------------------------------------------------------- */

/* 1 if every kv head of the layer holds a token (decode can run). */
static int layer_full(const mseq_t *s, uint32_t layer)
{
    for (uint32_t h = 0; h < NKV; h++)
        if (!s->l[layer * NKV + h].len)
            return 0;
    return 1;
}

static mseq_t *pick_live(void)
{
    return R.m.n ? R.m.seqs[rnd(R.m.n)] : NULL;
}

/* An id that is not live: never created, freed, or huge. */
static kv_seq_id_t pick_dead(void)
{
    for (;;) {
        kv_seq_id_t id;
        switch (rnd(3)) {
        case 0: id = 0xFFFFFFFFu - rnd(4); break;
        case 1: id = MAX_SEQS + rnd(1000); break;
        default: id = rnd(MAX_SEQS); break;
        }
        if (model_find(&R.m, id) < 0)
            return id;
    }
}

static void op_create(void)
{
    kv_seq_id_t id = 0xDEADBEEF;
    kv_stats_t before = get_stats();
    int rc = API(kv_seq_create(R.store, &id));
    if (R.m.n == MAX_SEQS) {
        SCHECK_RC(rc, KV_ELIMIT);
        R.n_elimit++;
        verify_unchanged(&before, NULL);
        return;
    }
    SCHECK_RC(rc, 0);
    if (rc)
        return;
    SCHECK(model_find(&R.m, id) < 0); /* unique among live sequences */
    R.m.seqs[R.m.n++] = mseq_new(id);
    verify_seq(R.m.seqs[R.m.n - 1]);
    kv_stats_t after = get_stats();
    SCHECK(after.pages_used == before.pages_used);
    SCHECK(after.n_seqs == before.n_seqs + 1);
}

static void op_free(void)
{
    if (!R.m.n)
        return;
    uint32_t i = rnd(R.m.n);
    kv_stats_t before = get_stats();
    SCHECK_RC(API(kv_seq_free(R.store, R.m.seqs[i]->id)), 0);
    kv_seq_id_t id = R.m.seqs[i]->id;
    model_remove(&R.m, i);
    kv_stats_t after = get_stats();
    SCHECK(after.pages_used <= before.pages_used);
    SCHECK(after.n_seqs == before.n_seqs - 1);
    uint32_t len;
    SCHECK_RC(API(kv_seq_len(R.store, id, 0, 0, &len)), KV_ENOENT);
}

static void op_fork(void)
{
    mseq_t *p = pick_live();
    if (!p)
        return;
    kv_seq_id_t child = 0xDEADBEEF;
    kv_stats_t before = get_stats();
    int rc = API(kv_seq_fork(R.store, p->id, &child));
    if (R.m.n == MAX_SEQS) {
        SCHECK_RC(rc, KV_ELIMIT);
        R.n_elimit++;
        verify_unchanged(&before, p);
        return;
    }
    SCHECK_RC(rc, 0); /* a fork takes no page: it cannot run out */
    if (rc)
        return;
    R.n_forks++;
    SCHECK(model_find(&R.m, child) < 0 && child != p->id);
    mseq_t *c = mseq_clone(p, child);
    R.m.seqs[R.m.n++] = c;
    kv_stats_t after = get_stats();
    SCHECK(after.pages_used == before.pages_used); /* every page shared */
    SCHECK(after.tokens == model_tokens(&R.m));
    verify_list(c, (int)rnd(N_LISTS));
}

/* Pages an append of n tokens may take, at most, for one list: new pages for
 * the tokens plus one copy of a shared tail. */
static uint32_t append_page_bound(uint32_t n)
{
    return (n + TPP - 1) / TPP + 1;
}

static void op_append(int bad_value)
{
    mseq_t *s = pick_live();
    if (!s)
        return;
    uint32_t layer = rnd(NL);
    uint32_t n = 1 + rnd(MAX_APPEND);
    int f16 = rnd(3) == 0;
    int explicit_pos = rnd(8) == 0;
    size_t ne = (size_t)n * NKV * HD;
    enum { MAXE = MAX_APPEND * NKV * HD };
    uint16_t kb[MAXE], vb[MAXE]; /* FP16 bits: the input or its rounding */
    float kf[MAXE], vf[MAXE];    /* F32 input                            */
    int32_t pos[MAX_APPEND];
    /* inputs: strided walks through the value tables (one draw per walk) */
    uint32_t ko = rnd(VT), ks = 2 * rnd(VT / 2) + 1;
    uint32_t vo = rnd(VT), vs = 2 * rnd(VT / 2) + 1;
    for (size_t i = 0; i < ne; i++) {
        uint32_t kj = (ko + (uint32_t)i * ks) & (VT - 1);
        uint32_t vj = (vo + (uint32_t)i * vs) & (VT - 1);
        if (f16) {
            kb[i] = vt_h[0][kj];
            vb[i] = vt_h[1][vj];
        } else {
            kf[i] = vt_f[0][kj];
            vf[i] = vt_f[1][vj];
            kb[i] = vt_fh[0][kj];
            vb[i] = vt_fh[1][vj];
        }
    }
    if (explicit_pos) {
        int32_t next = 0;
        for (uint32_t h = 0; h < NKV; h++) {
            int32_t np = mlist_next_pos(&s->l[layer * NKV + h]);
            next = np > next ? np : next;
        }
        next += (int32_t)rnd(5);
        for (uint32_t t = 0; t < n; t++) { /* strictly increasing, gaps */
            next += (int32_t)rnd(3);
            pos[t] = next++;
        }
    }
    if (bad_value) { /* one non-finite or out-of-range element anywhere */
        size_t i = rnd((uint32_t)ne);
        static const uint16_t bad_h[] = {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF};
        static const float bad_f[] = {65505.0f, -65520.0f, 1e10f, 70000.0f};
        int in_v = (int)rnd(2);
        if (f16) {
            (in_v ? vb : kb)[i] = bad_h[rnd(5)];
        } else {
            float x;
            switch (rnd(4)) {
            case 0: x = NAN; break;
            case 1: x = rnd(2) ? INFINITY : -INFINITY; break;
            default: x = bad_f[rnd(4)]; break;
            }
            (in_v ? vf : kf)[i] = x;
        }
    }
    kv_stats_t before = get_stats();
    int rc = API(kv_append(R.store, s->id, layer, n,
                           f16 ? KV_DTYPE_F16 : KV_DTYPE_F32,
                           f16 ? (const void *)kb : (const void *)kf,
                           f16 ? (const void *)vb : (const void *)vf,
                           explicit_pos ? pos : NULL));
    if (bad_value) {
        SCHECK_RC(rc, KV_ERANGE);
        R.n_erange++;
        verify_unchanged(&before, s);
    } else if (rc == KV_ENOMEM) {
        R.n_enomem++;
        uint32_t bound = 0;
        for (uint32_t h = 0; h < NKV; h++)
            bound += append_page_bound(n);
        SCHECK(before.pages_free < bound); /* no spurious ENOMEM */
        verify_unchanged(&before, s);
    } else {
        SCHECK_RC(rc, 0);
        if (rc == 0) {
            R.n_appends++;
            for (uint32_t h = 0; h < NKV; h++) {
                mlist_t *l = &s->l[layer * NKV + h];
                uint32_t old = l->len;
                int32_t p = mlist_next_pos(l);
                mlist_reserve(l, old + n);
                for (uint32_t t = 0; t < n; t++) {
                    size_t src = ((size_t)t * NKV + h) * HD;
                    memcpy(l->k + (size_t)(old + t) * HD, kb + src, HD * 2);
                    memcpy(l->v + (size_t)(old + t) * HD, vb + src, HD * 2);
                    l->pos[old + t] = explicit_pos ? pos[t] : p + (int32_t)t;
                }
                l->len = old + n;
                /* the new tokens, and the token before them (CoW copy) */
                uint32_t t0 = old ? old - 1 : 0;
                verify_range(s, (int)(layer * NKV + h), t0, l->len - t0);
            }
            kv_stats_t after = get_stats();
            SCHECK(after.tokens == before.tokens + (uint64_t)n * NKV);
            SCHECK(after.pages_used <= before.pages_used + NKV * append_page_bound(n));
        }
    }
}

static void op_compact(void)
{
    mseq_t *s = pick_live();
    if (!s)
        return;
    int li = (int)rnd(N_LISTS);
    mlist_t *l = &s->l[li];
    uint32_t *keep = malloc(((size_t)l->len + 2) * sizeof *keep), n_keep = 0;
    int want = 0;
    if (!keep)
        exit(2);
    uint32_t mode = rnd(20);
    if (mode == 0 && l->len >= 2) { /* not strictly increasing */
        for (uint32_t t = 0; t < l->len; t++)
            keep[n_keep++] = t;
        uint32_t i = 1 + rnd(n_keep - 1);
        keep[i] = keep[i - 1 - rnd(i < 2 ? 1 : 2)];
        want = KV_EINVAL;
    } else if (mode == 1) { /* an index past the end */
        for (uint32_t t = 0; t < l->len; t += 1 + rnd(3))
            keep[n_keep++] = t;
        keep[n_keep++] = l->len + rnd(3);
        want = KV_ERANGE;
    } else if (mode == 2) { /* keep nothing */
        n_keep = 0;
    } else if (mode == 3) { /* keep everything */
        for (uint32_t t = 0; t < l->len; t++)
            keep[n_keep++] = t;
    } else if (mode < 8) { /* StreamingLLM: sinks + recent window */
        uint32_t sinks = rnd(5), recent = rnd(l->len + 1);
        for (uint32_t t = 0; t < l->len; t++)
            if (t < sinks || t + recent >= l->len)
                keep[n_keep++] = t;
    } else { /* random subset */
        uint32_t p = 1 + rnd(99);
        for (uint32_t t = 0; t < l->len; t++)
            if (rnd(100) < p)
                keep[n_keep++] = t;
    }
    kv_stats_t before = get_stats();
    int rc = API(kv_compact(R.store, s->id, (uint32_t)li / NKV,
                            (uint32_t)li % NKV, keep, n_keep));
    if (want) {
        SCHECK_RC(rc, want);
        verify_unchanged(&before, s);
    } else if (rc == KV_ENOMEM) {
        R.n_enomem++;
        SCHECK(before.pages_free < (n_keep + TPP - 1) / TPP + 1);
        verify_unchanged(&before, s);
    } else {
        SCHECK_RC(rc, 0);
        if (rc == 0) {
            R.n_compacts++;
            for (uint32_t i = 0; i < n_keep; i++) {
                uint32_t t = keep[i];
                memmove(l->k + (size_t)i * HD, l->k + (size_t)t * HD, HD * 2);
                memmove(l->v + (size_t)i * HD, l->v + (size_t)t * HD, HD * 2);
                l->pos[i] = l->pos[t];
            }
            l->len = n_keep;
            verify_list(s, li);
            kv_stats_t after = get_stats();
            SCHECK(after.tokens == model_tokens(&R.m));
        }
    }
    free(keep);
}

static void op_read(void)
{
    mseq_t *s = pick_live();
    if (!s)
        return;
    int li = (int)rnd(N_LISTS);
    uint32_t len = s->l[li].len;
    if (rnd(10) == 0) { /* past the end */
        uint32_t t0 = rnd(len + 2), n = len + 1 - t0 + rnd(3);
        scratch_reserve(len + 8);
        SCHECK_RC(API(kv_read(R.store, s->id, (uint32_t)li / NKV,
                              (uint32_t)li % NKV, t0, n, R.rk, NULL, NULL)),
                  KV_ERANGE);
        return;
    }
    if (!len) {
        verify_list(s, li);
        return;
    }
    uint32_t t0 = rnd(len), n = 1 + rnd(len - t0);
    verify_range(s, li, t0, n);
}

/* Expected decode result for a batch: KV_ESTATE if a list is empty. */
static int decode_expect(mseq_t *const *b, uint32_t batch, uint32_t layer,
                         uint32_t *maxlen)
{
    int want = 0;
    *maxlen = 0;
    for (uint32_t i = 0; i < batch; i++)
        for (uint32_t h = 0; h < NKV; h++) {
            uint32_t len = b[i]->l[layer * NKV + h].len;
            if (!len)
                want = KV_ESTATE;
            *maxlen = len > *maxlen ? len : *maxlen;
        }
    return want;
}

static void op_decode(void)
{
    enum { MAXB = 4 };
    mseq_t *b[MAXB];
    kv_seq_id_t ids[MAXB];
    float q[MAXB * NQ * HD], out[MAXB * NQ * HD];
    float *stats[MAXB] = {0};
    uint32_t batch = 1 + rnd(MAXB), layer = rnd(NL), maxlen;
    if (!R.m.n)
        return;
    for (uint32_t i = 0; i < batch; i++) {
        b[i] = pick_live(); /* duplicates allowed */
        /* mostly sequences with tokens in every list (else KV_ESTATE) */
        for (int tries = 0; tries < 8 && rnd(8) && !layer_full(b[i], layer);
             tries++)
            b[i] = pick_live();
        ids[i] = b[i]->id;
    }
    for (uint32_t i = 0; i < batch * NQ * HD; i++)
        q[i] = kv_test_randf(&R.rng) * 2.0f;
    int want = decode_expect(b, batch, layer, &maxlen);
    int with_stats = rnd(3) == 0;
    uint32_t stride = maxlen + rnd(3);
    if (with_stats)
        for (uint32_t i = 0; i < batch; i++)
            if (rnd(4)) {
                stats[i] = malloc(((size_t)stride * NKV + 1) * sizeof(float));
                for (uint32_t j = 0; j < stride * NKV; j++)
                    stats[i][j] = -7.0f;
            }
    kv_decode_t a = {.layer = layer, .batch = batch, .seqs = ids, .q = q,
                     .out = out, .stats = with_stats ? stats : NULL,
                     .stats_stride = stride, .scale = 0.0f};
    kv_stats_t before = get_stats();
    int rc = API(kv_attn_decode(R.store, &a));
    SCHECK_RC(rc, want);
    if (want)
        R.n_estate++;
    if (rc == 0) {
        R.n_decodes++;
        /* the full dense reference for one batch row (cost ~ a read) */
        uint32_t i = rnd(batch);
        check_decode_row(b[i], layer, q + (size_t)i * NQ * HD,
                         out + (size_t)i * NQ * HD, stats[i], stride);
        for (uint32_t j = 0; j < batch * NQ * HD; j++)
            if (!isfinite(out[j])) {
                fail_at(__LINE__, "decode output not finite");
                break;
            }
        for (uint32_t r = 0; r < batch && with_stats; r++) {
            if (!stats[r])
                continue;
            for (uint32_t h = 0; h < NKV; h++) {
                uint32_t len = b[r]->l[layer * NKV + h].len;
                double sum = 0;
                for (uint32_t t = 0; t < len; t++)
                    sum += stats[r][h * stride + t];
                SCHECK(fabs(sum - (double)(NQ / NKV)) < 1e-3);
                for (uint32_t t = len; t < stride; t++)
                    SCHECK(stats[r][h * stride + t] == -7.0f); /* untouched */
            }
        }
    }
    kv_stats_t after = get_stats();
    SCHECK(kv_test_stats_same(&before, &after));
    for (uint32_t i = 0; i < MAXB; i++)
        free(stats[i]);
}

static void op_prefill(void)
{
    mseq_t *s = pick_live();
    if (!s)
        return;
    uint32_t layer = rnd(NL), minlen = 0xFFFFFFFFu, maxlen = 0;
    for (uint32_t h = 0; h < NKV; h++) {
        uint32_t len = s->l[layer * NKV + h].len;
        minlen = len < minlen ? len : minlen;
        maxlen = len > maxlen ? len : maxlen;
    }
    if (!minlen)
        return;
    uint32_t n_new = 1 + rnd(minlen < 48 ? minlen : 48);
    int too_many = rnd(10) == 0;
    if (too_many)
        n_new = minlen + 1 + rnd(3);
    float *q = malloc((size_t)n_new * NQ * HD * 4);
    float *out = malloc((size_t)n_new * NQ * HD * 4);
    float *st = malloc((size_t)maxlen * NKV * 4);
    if (!q || !out || !st)
        exit(2);
    for (size_t i = 0; i < (size_t)n_new * NQ * HD; i++)
        q[i] = kv_test_randf(&R.rng) * 2.0f;
    uint32_t row0 = rnd(n_new);
    kv_prefill_t a = {.layer = layer, .seq = s->id, .n_new = n_new, .q = q,
                      .out = out, .stats = st, .stats_stride = maxlen,
                      .stats_row0 = row0, .scale = 0.0f};
    kv_stats_t before = get_stats();
    int rc = API(kv_attn_prefill(R.store, &a));
    SCHECK_RC(rc, too_many ? KV_ERANGE : 0);
    if (rc == 0 && !too_many) {
        for (size_t i = 0; i < (size_t)n_new * NQ * HD; i++)
            if (!isfinite(out[i])) {
                fail_at(__LINE__, "prefill output not finite");
                break;
            }
        for (uint32_t h = 0; h < NKV; h++) {
            uint32_t len = s->l[layer * NKV + h].len;
            double sum = 0;
            for (uint32_t t = 0; t < len; t++)
                sum += st[h * maxlen + t];
            SCHECK(fabs(sum - (double)(n_new - row0) * (NQ / NKV)) <
                   1e-3 * (n_new - row0 + 1));
        }
    }
    kv_stats_t after = get_stats();
    SCHECK(kv_test_stats_same(&before, &after));
    free(q);
    free(out);
    free(st);
}

/* Every call on a sequence id that is not live: KV_ENOENT, nothing changes. */
static void op_dead_id(void)
{
    kv_seq_id_t id = pick_dead(), child;
    float buf[NKV * HD] = {0}, q[2 * NQ * HD] = {0}, out[2 * NQ * HD];
    uint32_t len, keep0 = 0;
    kv_stats_t before = get_stats();
    switch (rnd(8)) {
    case 0: SCHECK_RC(API(kv_seq_free(R.store, id)), KV_ENOENT); break;
    case 1: SCHECK_RC(API(kv_seq_fork(R.store, id, &child)), KV_ENOENT); break;
    case 2:
        SCHECK_RC(API(kv_append(R.store, id, 0, 1, KV_DTYPE_F32, buf, buf, NULL)),
                  KV_ENOENT);
        break;
    case 3: SCHECK_RC(API(kv_seq_len(R.store, id, 0, 0, &len)), KV_ENOENT); break;
    case 4:
        SCHECK_RC(API(kv_read(R.store, id, 0, 0, 0, 0, NULL, NULL, NULL)),
                  KV_ENOENT);
        break;
    case 5:
        SCHECK_RC(API(kv_compact(R.store, id, 0, 0, &keep0, 0)), KV_ENOENT);
        break;
    case 6: {
        kv_seq_id_t ids[2] = {id, id};
        mseq_t *s = pick_live();
        if (s && rnd(2) && layer_full(s, 0))
            ids[0] = s->id; /* one bad id in the batch is enough */
        kv_decode_t a = {.layer = 0, .batch = 2, .seqs = ids, .q = q,
                         .out = out};
        SCHECK_RC(API(kv_attn_decode(R.store, &a)), KV_ENOENT);
        break;
    }
    default: {
        kv_prefill_t a = {.layer = 0, .seq = id, .n_new = 1, .q = q,
                          .out = out};
        SCHECK_RC(API(kv_attn_prefill(R.store, &a)), KV_ENOENT);
        break;
    }
    }
    R.n_enoent++;
    verify_unchanged(&before, NULL);
}

/* ---- driver ----------------------------------------------------------- */

static void run_seed(uint64_t seed, uint64_t n_ops, uint32_t n_threads)
{
    memset(&R.m, 0, sizeof R.m);
    R.seed = seed;
    R.rng = seed * 0x2545F4914F6CDD1Dull + 1;
    R.op = 0;
    R.calls = 0;
    R.failed = 0;
    R.op_name = "create store";
    R.n_enomem = R.n_elimit = R.n_forks = R.n_compacts = R.n_appends = 0;
    R.n_decodes = R.n_erange = R.n_enoent = R.n_estate = 0;

    value_tables_fill();
    uint64_t live0 = kv_mem_live_bytes();
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = NL;
    cfg.n_q_heads = NQ;
    cfg.n_kv_heads = NKV;
    cfg.head_dim = HD;
    cfg.page_bytes = PAGE_BYTES;
    cfg.host_pages = POOL_PAGES;
    cfg.max_seqs = MAX_SEQS;
    cfg.n_threads = n_threads;
    R.store = NULL;
    SCHECK_RC(kv_store_create(&cfg, &R.store), 0);
    if (!R.store)
        return;

    uint64_t stats_alloc_failures = 0;
    for (R.op = 0; R.op < n_ops && !R.failed; R.op++) {
        uint32_t r = rnd(1000);
        if (r < 60) {
            R.op_name = "create", op_create();
        } else if (r < 140) {
            R.op_name = "free", op_free();
        } else if (r < 170) {
            R.op_name = "fork", op_fork();
        } else if (r < 500) {
            R.op_name = "append", op_append(0);
        } else if (r < 515) {
            R.op_name = "append bad value", op_append(1);
        } else if (r < 595) {
            R.op_name = "compact", op_compact();
        } else if (r < 780) {
            R.op_name = "read", op_read();
        } else if (r < 880) {
            R.op_name = "decode", op_decode();
        } else if (r < 920) {
            R.op_name = "prefill", op_prefill();
        } else if (r < 940) {
            R.op_name = "dead id", op_dead_id();
        } else if (r < 945) {
            R.op_name = "check";
            SCHECK_RC(API(kv_store_check(R.store)), 0);
        } else {
            R.op_name = "stats";
            kv_stats_t st = get_stats();
            SCHECK(st.alloc_failures >= stats_alloc_failures);
            stats_alloc_failures = st.alloc_failures;
            verify_stats();
        }
        if ((R.op + 1) % FULL_CHECK_EVERY == 0 && !R.failed) {
            R.op_name = "full check";
            verify_all();
        }
    }
    if (!R.failed) {
        R.op_name = "final check";
        verify_all();
    }
    kv_stats_t st = get_stats();
    printf("seed %llu: %llu ops (%llu API calls), %llu appends, %llu ENOMEM "
           "(store alloc_failures %llu), %llu ELIMIT, %llu forks, %llu "
           "compactions, %llu decodes, %llu ERANGE, %llu ENOENT, %llu ESTATE, "
           "pages peak %llu/%d, %u attention thread(s)%s\n",
           (unsigned long long)seed, (unsigned long long)R.op,
           (unsigned long long)R.calls, (unsigned long long)R.n_appends,
           (unsigned long long)R.n_enomem,
           (unsigned long long)st.alloc_failures,
           (unsigned long long)R.n_elimit, (unsigned long long)R.n_forks,
           (unsigned long long)R.n_compacts, (unsigned long long)R.n_decodes,
           (unsigned long long)R.n_erange, (unsigned long long)R.n_enoent,
           (unsigned long long)R.n_estate,
           (unsigned long long)st.pages_peak, POOL_PAGES, n_threads,
           R.failed ? " FAILED" : "");

    /* free everything: no page may stay in use */
    R.op_name = "free all";
    int failed = R.failed;
    R.failed = 0; /* report teardown problems even after a failure */
    while (R.m.n) {
        SCHECK_RC(API(kv_seq_free(R.store, R.m.seqs[R.m.n - 1]->id)), 0);
        model_remove(&R.m, R.m.n - 1);
    }
    st = get_stats();
    SCHECK(st.pages_used == 0);
    SCHECK(st.pages_free == POOL_PAGES);
    SCHECK(st.n_seqs == 0 && st.tokens == 0 && st.kv_bytes == 0);
    SCHECK_RC(kv_store_check(R.store), 0);
    kv_store_destroy(R.store);
    R.store = NULL;
    SCHECK(kv_mem_live_bytes() == live0);
    if (kv_mem_live_bytes() != live0)
        fprintf(stderr, "seed %llu: leaked %lld metadata bytes\n",
                (unsigned long long)seed,
                (long long)(kv_mem_live_bytes() - live0));
    R.failed |= failed;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *s = getenv(name);
    return s && *s ? strtoull(s, NULL, 0) : dflt;
}

int main(int argc, char **argv)
{
    for (uint32_t h = 0; h < 65536; h++)
        h2f_table[h] = half_to_float_slow((uint16_t)h);
    /* the model's converter must agree with the exact table on every half */
    int conv_ok = 1;
    for (uint32_t h = 0; h < 65536; h++)
        if ((h & 0x7C00) != 0x7C00 &&
            float_to_half(h2f_table[h]) != (uint16_t)h)
            conv_ok = 0;
    CHECK(conv_ok);
    CHECK(float_to_half(65519.0f) == 0x7BFF);       /* rounds down to max */
    CHECK(float_to_half(1.0f + 0x1p-11f) == 0x3C00); /* tie -> even */
    CHECK(float_to_half(1.0f + 0x3p-11f) == 0x3C02); /* tie -> even */
    CHECK(float_to_half(0x1p-25f) == 0x0000);        /* tie -> 0 */
    CHECK(float_to_half(0x1.8p-25f) == 0x0001);

    uint64_t total = env_u64("KV_STRESS_OPS", 1000000);
    uint64_t seeds[3] = {1, 0xC0FFEE, 20240607};
    int n_seeds = 3;
    if (argc > 1) {
        seeds[0] = strtoull(argv[1], NULL, 0);
        n_seeds = 1;
    } else if (getenv("KV_STRESS_SEED")) {
        seeds[0] = env_u64("KV_STRESS_SEED", 1);
        n_seeds = 1;
    }
    int any_failed = 0;
    for (int i = 0; i < n_seeds; i++) {
        /* the second seed runs attention on two threads */
        run_seed(seeds[i], (total + (uint64_t)n_seeds - 1) / (uint64_t)n_seeds,
                 i == 1 ? 2 : 1);
        if (R.failed) {
            fprintf(stderr, "FAILED with seed %llu (rerun: test_stress_model "
                            "%llu)\n",
                    (unsigned long long)seeds[i], (unsigned long long)seeds[i]);
            any_failed = 1;
        }
    }
    free(R.rk);
    free(R.rv);
    free(R.rpos);
    (void)any_failed;
    return kv_test_end();
}
