/* SPDX-License-Identifier: MIT */
/*
 * test_api_pressure.c — the memory-pressure ladder (kvpage.h, "memory
 * pressure"; store/kv_store_pressure.c) through the public API.
 *
 * Store: 2 layers, 2 kv heads, head_dim 32, 16 FP16 / 32 INT4 / 64 INT2
 * tokens per page. A cold sequence A (and sometimes C) holds 128 tokens per
 * list; the hot sequence B then appends until the pool runs out. Appended
 * values are multiples of 1/256 in [-1, 1] (exact in FP16), so FP16 reads
 * are compared bit for bit.
 *
 * Checks:
 *   - off: the failing append returns KV_ENOMEM, everything reads back as
 *     before, counters stay 0, kv_store_check passes;
 *   - int4 with 4 pages free: the append succeeds after one run; only A's
 *     shortest-first layer 0 converted (64 tokens per head, within the INT4
 *     bound, target INT4), A's layer 1 and B bit-exact and FP16; counters
 *     (runs, rescued, pages freed, tokens converted) and bytes per format;
 *   - a ladder that cannot free enough (int4 with no free page; int4 when
 *     the append needs more than converting all of A frees): KV_ENOMEM, B
 *     unchanged, A unchanged or within the bound, kv_store_check passes;
 *   - evict with no free page: A's layer 0 keeps exactly tokens 0..3 and
 *     112..127 (values, positions), layer 1 untouched; evicted counter;
 *   - the whole ladder int4,int2,evict with cold A and C: both convert
 *     before anything is evicted, then only the colder A is evicted;
 *   - recency: attention on A makes C the colder one, the next run
 *     converts C first;
 *   - reserve: single-token decode appends at 1 free page fail without a
 *     reserve (a conversion needs a page per kv head to start) and all
 *     succeed with pressure_reserve 4, with no page ever refused;
 *   - kv_compact of a forked (shared) list needs fresh pages: rescued by
 *     evicting A, while the fork's shared pages stay untouched;
 *   - allocation failure (kv_fault_arm N = 1..) through the escalation
 *     path (int4 and evict ladders): KV_ENOMEM or success, never anything
 *     else; B changed only on success; A unchanged or converted within the
 *     bound / evicted to exactly sink + recent; kv_store_check passes; a
 *     metadata failure does not run the ladder; no byte leaks;
 *   - config: bad ladders and reserves (KV_EINVAL, KV_ERANGE, KV_ENOTSUP),
 *     good ones accepted, kv_store_config hands back the store's copy.
 * Prints the pages each scenario freed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "store/kv_store_int.h" /* list targets and entry formats */
#include "kv_test.h"
#include "kv_test_snap.h"

#define NL 2
#define NKV 2
#define NQ 4
#define HD 32
#define LA 128 /* tokens per list of a cold sequence */

static uint64_t rng = 4242;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        exit(2);
    return p;
}

/* ---- stores and data ------------------------------------------------------- */

static int open_store(uint64_t pages, const char *ladder, uint32_t reserve,
                      kv_store_t **s)
{
    kv_config_t c = kv_config_default();
    c.n_layers = NL, c.n_kv_heads = NKV, c.n_q_heads = NQ, c.head_dim = HD;
    c.host_pages = pages, c.n_threads = 1, c.flags = KV_CONFIG_NO_TCACHE;
    c.pressure = ladder;
    c.pressure_reserve = reserve;
    return kv_store_create(&c, s);
}

/* n tokens of one layer, values k/256 (exact in FP16). */
static int append_n(kv_store_t *s, kv_seq_id_t q, uint32_t layer, uint32_t n,
                    float **kept)
{
    size_t ne = (size_t)n * NKV * HD;
    float *k = xmalloc(ne * 4), *v = xmalloc(ne * 4);
    for (size_t i = 0; i < ne; i++) {
        k[i] = (float)((int)(kv_test_rand(&rng) % 513) - 256) / 256.0f;
        v[i] = (float)((int)(kv_test_rand(&rng) % 513) - 256) / 256.0f;
    }
    int rc = kv_append(s, q, layer, n, KV_DTYPE_F32, k, v, NULL);
    if (kept)
        *kept = k;
    else
        free(k);
    free(v);
    return rc;
}

static kv_seq_id_t new_seq(kv_store_t *s, uint32_t tokens)
{
    kv_seq_id_t q = 0;
    CHECK_OK(kv_seq_create(s, &q));
    for (uint32_t l = 0; l < NL && tokens; l++)
        CHECK_OK(append_n(s, q, l, tokens, NULL));
    return q;
}

static kv_stats_t stats(const kv_store_t *s)
{
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(s, &st));
    return st;
}

/* Bit f set: some entry of (q, l, h) has format f. */
static uint32_t formats(const kv_store_t *s, kv_seq_id_t q, uint32_t l, uint32_t h)
{
    const kv_page_list_t *x = kv_page_list_get(s->pt, q, l, h);
    uint32_t m = 0;
    for (uint32_t e = 0; e < x->n_ents; e++)
        m |= 1u << x->ents[e].format;
    return m;
}

static uint32_t target(const kv_store_t *s, kv_seq_id_t q, uint32_t l)
{
    return kv_page_list_get(s->pt, q, l, 0)->target;
}

/* ---- snapshots -------------------------------------------------------------------- */

/* A sequence's lists, bit for bit (kv_test_snap.h); LS: list (l, h). */
#define LS(q, l, h) kv_test_seq_list(&(q), (l), (h))

static void take(const kv_store_t *s, kv_seq_id_t q, kv_test_seq_t *o)
{
    CHECK_OK(kv_test_seq_take(s, q, o));
}

/* Half a quantization step of 16 values x[j * stride] at `levels` levels,
 * with slack for the FP16 rounding of min and scale. */
static double half_step(const float *x, size_t stride, double levels)
{
    double mn = x[0], mx = x[0];
    for (int j = 1; j < 16; j++) {
        mn = fmin(mn, x[j * stride]);
        mx = fmax(mx, x[j * stride]);
    }
    return (mx - mn) / levels * 0.5 * 1.004 + 2e-3 * fmax(fabs(mn), fabs(mx));
}

/* got is ref quantized to `levels` (15: INT4, 3: INT2) in 16-token groups
 * from token 0, or equal: same length and positions, every element within
 * half a step of its group (keys: a channel over 16 tokens; values: 16
 * channels of a token). *changed counts elements that differ. */
static int within(const kv_test_list_t *ref, const kv_test_list_t *got, double levels,
                  long *changed)
{
    if (ref->n != got->n || (ref->n && memcmp(ref->pos, got->pos, (size_t)ref->n * 4)))
        return 0;
    int ok = 1;
    for (uint32_t g = 0; g + 16 <= ref->n; g += 16) {
        for (uint32_t c = 0; c < HD; c++) {
            double b = half_step(ref->k + (size_t)g * HD + c, HD, levels);
            for (uint32_t j = 0; j < 16; j++) {
                size_t i = (size_t)(g + j) * HD + c;
                ok &= fabs(got->k[i] - ref->k[i]) <= b;
                *changed += got->k[i] != ref->k[i];
            }
        }
        for (uint32_t j = 0; j < 16; j++)
            for (uint32_t c = 0; c < HD; c += 16) {
                size_t i = (size_t)(g + j) * HD + c;
                double b = half_step(ref->v + i, 1, levels);
                for (uint32_t e = 0; e < 16; e++) {
                    ok &= fabs(got->v[i + e] - ref->v[i + e]) <= b;
                    *changed += got->v[i + e] != ref->v[i + e];
                }
            }
    }
    for (uint32_t t = ref->n / 16 * 16; t < ref->n; t++) /* a partial group: FP16 */
        ok &= !memcmp(got->k + (size_t)t * HD, ref->k + (size_t)t * HD, HD * 4) &&
              !memcmp(got->v + (size_t)t * HD, ref->v + (size_t)t * HD, HD * 4);
    return ok;
}

/* got is ref with only tokens [0, sink) and [n - recent, n) kept, values
 * within the INT4 bound of ref (levels 0: bit-exact). */
static int evicted_to(const kv_test_list_t *ref, const kv_test_list_t *got, uint32_t sink,
                      uint32_t recent, double levels)
{
    if (got->n != sink + recent || ref->n < got->n)
        return 0;
    int ok = 1;
    kv_test_list_t sub = {.n = got->n};
    sub.k = xmalloc((size_t)got->n * HD * 4);
    sub.v = xmalloc((size_t)got->n * HD * 4);
    sub.pos = xmalloc((size_t)got->n * 4);
    for (uint32_t i = 0; i < got->n; i++) {
        uint32_t t = i < sink ? i : ref->n - got->n + i;
        memcpy(sub.k + (size_t)i * HD, ref->k + (size_t)t * HD, HD * 4);
        memcpy(sub.v + (size_t)i * HD, ref->v + (size_t)t * HD, HD * 4);
        sub.pos[i] = ref->pos[t];
        ok &= got->pos[i] == (int32_t)t;
    }
    if (levels == 0)
        ok &= kv_test_list_same(&sub, got, HD);
    else /* kept tokens read as their INT4 decodes: check token-wise */
        for (uint32_t i = 0; i < got->n; i++)
            for (uint32_t c = 0; c < HD; c++) {
                size_t x = (size_t)i * HD + c;
                ok &= fabs(got->k[x] - sub.k[x]) <= 2.0 / levels &&
                      fabs(got->v[x] - sub.v[x]) <= 2.0 / levels;
            }
    free(sub.k), free(sub.v), free(sub.pos);
    return ok;
}

/* ---- fixture: A cold (LA tokens per list), B hot (64 on layer 0) ------------- */

typedef struct fix {
    kv_store_t *s;
    kv_seq_id_t a, b, c; /* c: a second cold sequence, or == a */
} fix_t;

static int fixture(fix_t *f, uint64_t pages, const char *ladder, uint32_t reserve,
                   int with_c)
{
    memset(f, 0, sizeof *f);
    int rc = open_store(pages, ladder, reserve, &f->s);
    if (rc)
        return rc;
    f->a = new_seq(f->s, LA);
    f->c = with_c ? new_seq(f->s, LA) : f->a;
    CHECK_OK(kv_seq_create(f->s, &f->b));
    return append_n(f->s, f->b, 0, 64, NULL);
}

/* The ladder's counters are exactly these. */
static void expect_counters(const kv_store_t *s, uint64_t runs, uint64_t rescued,
                            uint64_t freed, uint64_t converted, uint64_t evicted)
{
    kv_stats_t st = stats(s);
    CHECK_EQ(st.pressure_runs, runs);
    CHECK_EQ(st.pressure_rescued, rescued);
    CHECK_EQ(st.pressure_pages_freed, freed);
    CHECK_EQ(st.pressure_converted_tokens, converted);
    CHECK_EQ(st.pressure_evicted_tokens, evicted);
}

static void report(const char *what, const kv_store_t *s)
{
    kv_stats_t st = stats(s);
    printf("  %-34s runs %llu rescued %llu pages freed %llu converted %llu "
           "evicted %llu (pages free now %llu)\n",
           what, (unsigned long long)st.pressure_runs,
           (unsigned long long)st.pressure_rescued,
           (unsigned long long)st.pressure_pages_freed,
           (unsigned long long)st.pressure_converted_tokens,
           (unsigned long long)st.pressure_evicted_tokens,
           (unsigned long long)st.pages_free);
}

/* ---- scenarios ----------------------------------------------------------------------- */

static void test_off(void)
{
    fix_t f;
    CHECK_OK(fixture(&f, 44, NULL, 0, 0)); /* A 32 pages, B 8: 4 free */
    kv_test_seq_t a0, b0, a1, b1;
    take(f.s, f.a, &a0);
    take(f.s, f.b, &b0);
    kv_stats_t s0 = stats(f.s);
    CHECK_EQ(s0.pages_free, 4);
    CHECK_EQ(append_n(f.s, f.b, 1, 64, NULL), KV_ENOMEM); /* needs 8 */
    take(f.s, f.a, &a1);
    take(f.s, f.b, &b1);
    kv_stats_t s1 = stats(f.s);
    CHECK(kv_test_seq_same(&a0, &a1) && kv_test_seq_same(&b0, &b1));
    CHECK_EQ(s1.pages_used, s0.pages_used);
    CHECK_EQ(s1.tokens, s0.tokens);
    CHECK_EQ(s1.alloc_failures, s0.alloc_failures + 1);
    CHECK_EQ(s1.pressure_runs + s1.pressure_pages_freed + s1.pressure_rescued, 0);
    kv_config_t c;
    CHECK_OK(kv_store_config(f.s, &c));
    CHECK(c.pressure == NULL && c.pressure_reserve == 0);
    CHECK_OK(kv_store_check(f.s));
    kv_test_seq_free(&a0), kv_test_seq_free(&b0);
    kv_test_seq_free(&a1), kv_test_seq_free(&b1);
    kv_store_destroy(f.s);
}

static void test_int4_rescue(void)
{
    fix_t f;
    CHECK_OK(fixture(&f, 44, "int4", 0, 0));
    kv_test_seq_t a0, b0, a1, b1;
    take(f.s, f.a, &a0);
    take(f.s, f.b, &b0);
    float *k;
    CHECK_OK(append_n(f.s, f.b, 1, 64, &k));
    take(f.s, f.a, &a1);
    take(f.s, f.b, &b1);
    /* B: layer 0 as before, layer 1 the appended keys, all FP16 */
    CHECK(kv_test_list_same(LS(b0, 0, 0), LS(b1, 0, 0), HD) &&
          kv_test_list_same(LS(b0, 0, 1), LS(b1, 0, 1), HD));
    int exact = 1;
    for (uint32_t h = 0; h < NKV; h++) {
        CHECK_EQ(LS(b1, 1, h)->n, 64);
        for (uint32_t t = 0; t < 64 && LS(b1, 1, h)->n == 64; t++)
            exact &= !memcmp(LS(b1, 1, h)->k + (size_t)t * HD,
                             k + ((size_t)t * NKV + h) * HD, HD * 4);
        for (uint32_t l = 0; l < NL; l++)
            CHECK_EQ(formats(f.s, f.b, l, h), 1u << KV_FMT_FP16);
    }
    CHECK(exact);
    free(k);
    CHECK_EQ(target(f.s, f.b, 0), KV_FMT_FP16);
    /* A: layer 0 half converted (64 tokens per head), layer 1 untouched */
    long changed = 0;
    for (uint32_t h = 0; h < NKV; h++) {
        CHECK(within(LS(a0, 0, h), LS(a1, 0, h), 15.0, &changed));
        CHECK(!memcmp(LS(a1, 0, h)->k + 64 * HD, LS(a0, 0, h)->k + 64 * HD, 64 * HD * 4));
        CHECK(kv_test_list_same(LS(a0, 1, h), LS(a1, 1, h), HD));
        CHECK_EQ(formats(f.s, f.a, 0, h), (1u << KV_FMT_FP16) | (1u << KV_FMT_INT4));
        CHECK_EQ(formats(f.s, f.a, 1, h), 1u << KV_FMT_FP16);
    }
    CHECK(changed > 1000);
    CHECK_EQ(target(f.s, f.a, 0), KV_FMT_INT4);
    CHECK_EQ(target(f.s, f.a, 1), KV_FMT_FP16);
    expect_counters(f.s, 1, 1, 4, 2 * 64, 0); /* 4 free -> 8 */
    kv_stats_t st = stats(f.s);
    CHECK_EQ(st.pages_by_format[KV_FMT_INT4], 4);
    CHECK_EQ(st.pages_free, 0);
    CHECK_OK(kv_store_check(f.s));
    report("int4, 4 pages free, needs 8:", f.s);
    kv_test_seq_free(&a0), kv_test_seq_free(&b0);
    kv_test_seq_free(&a1), kv_test_seq_free(&b1);
    kv_store_destroy(f.s);
}

static void test_cannot(void)
{
    /* no page free: a conversion cannot start */
    fix_t f;
    CHECK_OK(fixture(&f, 40, "int4", 0, 0));
    kv_test_seq_t a0, b0, a1, b1;
    take(f.s, f.a, &a0);
    take(f.s, f.b, &b0);
    CHECK_EQ(append_n(f.s, f.b, 1, 64, NULL), KV_ENOMEM);
    take(f.s, f.a, &a1);
    take(f.s, f.b, &b1);
    CHECK(kv_test_seq_same(&a0, &a1) && kv_test_seq_same(&b0, &b1));
    expect_counters(f.s, 1, 0, 0, 0, 0);
    CHECK_EQ(target(f.s, f.a, 0), KV_FMT_FP16); /* nothing converted: target kept */
    CHECK_OK(kv_store_check(f.s));
    kv_test_seq_free(&a0), kv_test_seq_free(&b0);
    kv_test_seq_free(&a1), kv_test_seq_free(&b1);
    kv_store_destroy(f.s);

    /* converting all of A frees 16 pages; the append needs 64 */
    CHECK_OK(fixture(&f, 44, "int4", 0, 0));
    take(f.s, f.a, &a0);
    take(f.s, f.b, &b0);
    CHECK_EQ(append_n(f.s, f.b, 1, 512, NULL), KV_ENOMEM);
    take(f.s, f.a, &a1);
    take(f.s, f.b, &b1);
    CHECK(kv_test_seq_same(&b0, &b1));
    long changed = 0;
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++) {
            CHECK(within(LS(a0, l, h), LS(a1, l, h), 15.0, &changed));
            CHECK_EQ(formats(f.s, f.a, l, h), 1u << KV_FMT_INT4);
        }
    expect_counters(f.s, 1, 0, 16, NL * NKV * LA, 0);
    CHECK_EQ(stats(f.s).pages_free, 20);
    CHECK_OK(kv_store_check(f.s));
    report("int4, needs 64, can free 16:", f.s);
    kv_test_seq_free(&a0), kv_test_seq_free(&b0);
    kv_test_seq_free(&a1), kv_test_seq_free(&b1);
    kv_store_destroy(f.s);
}

static void test_evict(void)
{
    fix_t f;
    CHECK_OK(fixture(&f, 40, "evict:sink=4,recent=16", 0, 0)); /* 0 free */
    kv_test_seq_t a0, b0, a1, b1;
    take(f.s, f.a, &a0);
    take(f.s, f.b, &b0);
    CHECK_OK(append_n(f.s, f.b, 1, 64, NULL));
    take(f.s, f.a, &a1);
    take(f.s, f.b, &b1);
    for (uint32_t h = 0; h < NKV; h++) {
        CHECK(evicted_to(LS(a0, 0, h), LS(a1, 0, h), 4, 16, 0));
        CHECK(kv_test_list_same(LS(a0, 1, h), LS(a1, 1, h), HD));
        CHECK(kv_test_list_same(LS(b0, 0, h), LS(b1, 0, h), HD));
        CHECK_EQ(LS(b1, 1, h)->n, 64);
    }
    expect_counters(f.s, 1, 1, 12, 0, NKV * (LA - 20)); /* 8 pages -> 2 per list */
    CHECK_OK(kv_store_check(f.s));
    report("evict, 0 free, needs 8:", f.s);
    kv_test_seq_free(&a0), kv_test_seq_free(&b0);
    kv_test_seq_free(&a1), kv_test_seq_free(&b1);
    kv_store_destroy(f.s);
}

static void test_ladder_order(void)
{
    /* A, C: 32 pages each; B 8; 2 free. B's 320 tokens need 40 pages:
     * int4 of A and C frees 32 (-> 34), int2 finds no FP16 left, evicting
     * A's INT4 lists (4 pages -> 2 fresh FP16) frees 4 per layer. */
    fix_t f;
    CHECK_OK(fixture(&f, 74, "int4,int2,evict:sink=4,recent=16", 0, 1));
    kv_test_seq_t a0, c0, b0, a1, c1, b1;
    take(f.s, f.a, &a0);
    take(f.s, f.c, &c0);
    take(f.s, f.b, &b0);
    CHECK_OK(append_n(f.s, f.b, 1, 320, NULL));
    take(f.s, f.a, &a1);
    take(f.s, f.c, &c1);
    take(f.s, f.b, &b1);
    long changed = 0;
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++) {
            CHECK(evicted_to(LS(a0, l, h), LS(a1, l, h), 4, 16, 15.0));
            CHECK(within(LS(c0, l, h), LS(c1, l, h), 15.0, &changed));
            CHECK_EQ(formats(f.s, f.c, l, h), 1u << KV_FMT_INT4);
        }
    CHECK(changed > 1000);
    CHECK(kv_test_list_same(LS(b0, 0, 0), LS(b1, 0, 0), HD) && LS(b1, 1, 1)->n == 320);
    expect_counters(f.s, 1, 1, 40, 2 * NL * NKV * LA, NL * NKV * (LA - 20));
    CHECK_OK(kv_store_check(f.s));
    report("int4,int2,evict, needs 40:", f.s);
    kv_test_seq_free(&a0), kv_test_seq_free(&c0), kv_test_seq_free(&b0);
    kv_test_seq_free(&a1), kv_test_seq_free(&c1), kv_test_seq_free(&b1);
    kv_store_destroy(f.s);
}

static void test_lru(void)
{
    fix_t f;
    CHECK_OK(fixture(&f, 76, "int4", 0, 1)); /* A, C 32 each, B 8: 4 free */
    CHECK_OK(append_n(f.s, f.b, 1, 64, NULL)); /* needs 8: A (coldest) layer 0 */
    CHECK_EQ(target(f.s, f.a, 0), KV_FMT_INT4);
    CHECK_EQ(target(f.s, f.c, 0), KV_FMT_FP16);
    CHECK_OK(kv_seq_free(f.s, f.b)); /* 16 pages back */
    float q[NQ * HD], out[NQ * HD];
    for (int i = 0; i < NQ * HD; i++)
        q[i] = kv_test_randf(&rng);
    kv_decode_t d = {.layer = 0, .batch = 1, .seqs = &f.a, .q = q, .out = out};
    CHECK_OK(kv_attn_decode(f.s, &d)); /* A is now the most recent */
    CHECK_OK(kv_seq_create(f.s, &f.b));
    CHECK_OK(append_n(f.s, f.b, 0, 64, NULL)); /* 8 free after */
    CHECK_EQ(stats(f.s).pages_free, 8);
    CHECK_OK(append_n(f.s, f.b, 1, 96, NULL)); /* needs 12 */
    CHECK_EQ(target(f.s, f.c, 0), KV_FMT_INT4); /* C was the coldest */
    CHECK_EQ(target(f.s, f.a, 1), KV_FMT_FP16);
    for (uint32_t h = 0; h < NKV; h++)
        CHECK_EQ(formats(f.s, f.a, 1, h), 1u << KV_FMT_FP16);
    CHECK_EQ(stats(f.s).pressure_runs, 2);
    CHECK_OK(kv_store_check(f.s));
    kv_store_destroy(f.s);
}

/* B (16 tokens per list, full pages) decodes `steps` tokens one at a time;
 * returns the steps that succeeded. */
static int decode_run(kv_store_t *s, kv_seq_id_t b, int steps)
{
    for (int i = 0; i < steps; i++)
        for (uint32_t l = 0; l < NL; l++)
            if (append_n(s, b, l, 1, NULL))
                return i;
    return steps;
}

static void test_reserve(void)
{
    kv_store_t *s;
    CHECK_OK(open_store(37, "int4", 0, &s));
    kv_seq_id_t a = new_seq(s, LA), b = new_seq(s, 16); /* 1 free */
    CHECK_EQ(stats(s).pages_free, 1);
    CHECK_EQ(decode_run(s, b, 48), 0); /* needs 2 pages, 1 free: no start */
    CHECK_EQ(stats(s).pressure_converted_tokens, 0);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);

    CHECK_OK(open_store(37, "int4", 4, &s));
    a = new_seq(s, LA);
    kv_test_seq_t a0, a1;
    take(s, a, &a0); /* before B: nothing converted yet */
    b = new_seq(s, 16);
    CHECK_EQ(decode_run(s, b, 48), 48);
    kv_stats_t st = stats(s);
    CHECK_EQ(st.alloc_failures, 0); /* the reserve kept pages ahead */
    CHECK(st.pressure_runs > 0 && st.pressure_converted_tokens > 0);
    CHECK_EQ(st.pressure_rescued, 0);
    take(s, a, &a1);
    long changed = 0;
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++)
            CHECK(within(LS(a0, l, h), LS(a1, l, h), 15.0, &changed));
    CHECK(changed > 0);
    uint32_t n;
    CHECK_OK(kv_seq_len(s, b, 1, 1, &n));
    CHECK_EQ(n, 16 + 48);
    CHECK_OK(kv_store_check(s));
    report("reserve 4, 48 decode steps:", s);
    kv_test_seq_free(&a0), kv_test_seq_free(&a1);
    kv_store_destroy(s);
}

static void test_compact(void)
{
    kv_store_t *s;
    for (int on = 0; on < 2; on++) {
        CHECK_OK(open_store(48, on ? "evict:sink=0,recent=16" : NULL, 0, &s));
        kv_seq_id_t a = new_seq(s, LA), b = new_seq(s, 64), b2; /* 0 free */
        CHECK_OK(kv_seq_fork(s, b, &b2));
        kv_test_seq_t f0, f1;
        take(s, b2, &f0);
        uint32_t keep[32];
        for (uint32_t i = 0; i < 32; i++)
            keep[i] = 2 * i + 1; /* misaligned: 2 fresh pages (B's are shared) */
        int rc = kv_compact(s, b, 0, 0, keep, 32);
        take(s, b2, &f1);
        CHECK(kv_test_seq_same(&f0, &f1));
        uint32_t n;
        CHECK_OK(kv_seq_len(s, b, 0, 0, &n));
        if (!on) {
            CHECK_EQ(rc, KV_ENOMEM);
            CHECK_EQ(n, 64);
        } else {
            CHECK_OK(rc);
            CHECK_EQ(n, 32);
            CHECK_OK(kv_seq_len(s, a, 0, 0, &n));
            CHECK_EQ(n, 16);
            CHECK_EQ(stats(s).pressure_rescued, 1);
        }
        CHECK_OK(kv_store_check(s));
        kv_test_seq_free(&f0), kv_test_seq_free(&f1);
        kv_store_destroy(s);
    }
}

/* ---- allocation failures through the ladder ------------------------------------ */

static void test_faults(const char *ladder, uint64_t pages, uint32_t n_new)
{
    long ok_fired = 0, fail_fired = 0, meta_only = 0;
    uint64_t base = kv_mem_live_bytes();
    for (uint64_t N = 1; N < 10000; N++) {
        fix_t f;
        CHECK_OK(fixture(&f, pages, ladder, 0, 0));
        kv_test_seq_t a0, b0, a1, b1;
        take(f.s, f.a, &a0);
        take(f.s, f.b, &b0);
        kv_fault_arm(N);
        int rc = append_n(f.s, f.b, 1, n_new, NULL);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        take(f.s, f.a, &a1);
        take(f.s, f.b, &b1);
        kv_stats_t st = stats(f.s);
        CHECK(rc == 0 || rc == KV_ENOMEM);
        CHECK_OK(kv_store_check(f.s));
        for (uint32_t h = 0; h < NKV; h++) {
            CHECK(kv_test_list_same(LS(b0, 0, h), LS(b1, 0, h), HD));
            CHECK_EQ(LS(b1, 1, h)->n, rc == 0 ? n_new : 0);
            for (uint32_t l = 0; l < NL; l++) {
                long changed = 0;
                int evict = ladder[0] == 'e';
                CHECK(evict ? kv_test_list_same(LS(a0, l, h), LS(a1, l, h), HD) ||
                                  evicted_to(LS(a0, l, h), LS(a1, l, h), 4, 16, 0)
                            : within(LS(a0, l, h), LS(a1, l, h), 15.0, &changed));
            }
        }
        if (rc == KV_ENOMEM && st.pressure_runs == 0) {
            meta_only++; /* a metadata failure: no ladder, nothing changed */
            CHECK(kv_test_seq_same(&a0, &a1));
        }
        ok_fired += fired && rc == 0;
        fail_fired += fired && rc != 0;
        kv_test_seq_free(&a0), kv_test_seq_free(&b0);
        kv_test_seq_free(&a1), kv_test_seq_free(&b1);
        kv_store_destroy(f.s);
        CHECK_EQ(kv_mem_live_bytes(), base);
        if (!fired) {
            CHECK_OK(rc);
            printf("  faults through %-24s %llu allocations: %ld failed calls, "
                   "%ld absorbed, %ld metadata-only\n",
                   ladder, (unsigned long long)N - 1, fail_fired, ok_fired, meta_only);
            break;
        }
    }
    CHECK(ok_fired > 0 && fail_fired > 0 && meta_only > 0);
}

/* ---- the other hooked calls --------------------------------------------------------- */

static int hk_quantize(kv_store_t *s, kv_seq_id_t b)
{
    return kv_seq_quantize(s, b, 0, 0);
}

static int hk_merge(kv_store_t *s, kv_seq_id_t b)
{
    return kv_seq_merge_layers(s, b, 1, NULL);
}

/* Plain FP16 tokens at the end of list (l, h) of q. */
static uint32_t residual_of(const kv_store_t *s, kv_seq_id_t q, uint32_t l, uint32_t h)
{
    const kv_page_list_t *x = kv_page_list_get(s->pt, q, l, h);
    uint32_t n = 0;
    for (uint32_t e = x->n_ents; e > 0 && x->ents[e - 1].format == KV_FMT_FP16 &&
                                 !x->ents[e - 1].flags;
         e--)
        n += x->ents[e - 1].n_tokens;
    return n;
}

/* kv_seq_quantize, kv_seq_merge_layers, kv_seq_prefill_end (StreamingLLM
 * keeping all + INT4: converts the prompt) and kv_seq_step_end (MiniCache:
 * the 16th decode token merges) on hot B in a full pool: KV_ENOMEM without
 * a ladder (nothing of A changes); with "evict" one run rescues the call,
 * A's layer 0 keeps exactly sink + recent tokens, and the call did its job. */
static void test_hooked(void)
{
    static const struct {
        const char *name, *policy;
        int (*call)(kv_store_t *, kv_seq_id_t);
        uint32_t fmt; /* format B's layer 0 gets; FP16: a merge (residual 0) */
    } cases[] = {
        {"kv_seq_quantize", NULL, hk_quantize, KV_FMT_INT4},
        {"kv_seq_merge_layers", NULL, hk_merge, KV_FMT_FP16},
        {"kv_seq_prefill_end", "streamingllm:sink=4,recent=1000+int4", kv_seq_prefill_end,
         KV_FMT_INT4},
        {"kv_seq_step_end", "minicache:from=0,every=16", kv_seq_step_end, KV_FMT_FP16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int on = 0; on < 2; on++) {
            kv_store_t *s;
            CHECK_OK(open_store(100, on ? "evict:sink=4,recent=16" : NULL, 0, &s));
            kv_seq_id_t a = new_seq(s, LA), b, f;
            CHECK_OK(kv_seq_create(s, &b));
            if (cases[i].policy) {
                kv_policy_t *pol;
                char err[128];
                CHECK_OK(kv_policy_parse(cases[i].policy, &pol, err, sizeof err));
                CHECK_OK(kv_seq_set_policy(s, b, pol));
                kv_policy_destroy(pol);
            }
            for (uint32_t l = 0; l < NL; l++)
                CHECK_OK(append_n(s, b, l, LA, NULL));
            if (cases[i].call == hk_quantize)
                CHECK_OK(kv_seq_set_format(s, b, 0, KV_FMT_INT4));
            if (cases[i].call == kv_seq_step_end) {
                CHECK_OK(kv_seq_prefill_end(s, b)); /* merges the prompt */
                for (int t = 0; t < 16; t++) {
                    for (uint32_t l = 0; l < NL; l++)
                        CHECK_OK(append_n(s, b, l, 1, NULL));
                    if (t < 15)
                        CHECK_OK(kv_seq_step_end(s, b));
                }
                CHECK_EQ(residual_of(s, b, 1, 0), 16);
            }
            CHECK_OK(kv_seq_create(s, &f)); /* fills the pool; warmer than A */
            while (stats(s).pages_free >= 2)
                CHECK_OK(append_n(s, f, 0, 16, NULL));
            kv_test_seq_t a0, a1;
            take(s, a, &a0);
            int rc = cases[i].call(s, b);
            take(s, a, &a1);
            kv_stats_t st = stats(s);
            if (!on) {
                if (rc != KV_ENOMEM)
                    fprintf(stderr, "  %s in a full pool: %d\n", cases[i].name, rc);
                CHECK_EQ(rc, KV_ENOMEM);
                CHECK(kv_test_seq_same(&a0, &a1));
            } else {
                CHECK_OK(rc);
                CHECK_EQ(st.pressure_runs, 1);
                CHECK_EQ(st.pressure_rescued, 1);
                for (uint32_t h = 0; h < NKV; h++) {
                    CHECK(evicted_to(LS(a0, 0, h), LS(a1, 0, h), 4, 16, 0));
                    if (cases[i].fmt == KV_FMT_INT4)
                        CHECK(formats(s, b, 0, h) & (1u << KV_FMT_INT4));
                    else
                        CHECK(residual_of(s, b, 1, h) == 0 &&
                              (formats(s, b, 1, h) & (1u << KV_FMT_MERGED)));
                }
                char what[64];
                snprintf(what, sizeof what, "%s, evict, full pool:", cases[i].name);
                report(what, s);
            }
            CHECK_OK(kv_store_check(s));
            kv_test_seq_free(&a0), kv_test_seq_free(&a1);
            kv_store_destroy(s);
        }
}

/* ---- configuration -------------------------------------------------------------------- */

static void test_config(void)
{
    static const struct {
        const char *spec;
        int rc;
    } cases[] = {
        {"int8", KV_EINVAL},          {"int4,int4", KV_EINVAL},
        {"int2,int4", KV_EINVAL},     {"evict,int4", KV_EINVAL},
        {"int4,", KV_EINVAL},         {",int4", KV_EINVAL},
        {"int4,,evict", KV_EINVAL},   {"int4:sink=1", KV_EINVAL},
        {"int4,sink=1", KV_EINVAL},   {"evict,sink=1", KV_EINVAL},
        {"evict:", KV_EINVAL},        {"evict:foo=1", KV_EINVAL},
        {"evict:sink", KV_EINVAL},    {"evict:sink=", KV_EINVAL},
        {"evict:sink=-1", KV_EINVAL}, {"evict:sink=4x", KV_EINVAL},
        {"evict:sink=4,sink=5", KV_EINVAL},
        {"evict:recent=0", KV_ERANGE}, {"evict:sink=65536", KV_ERANGE},
        {"evict:recent=16777217", KV_ERANGE},
        {"evict:recent=99999999999", KV_ERANGE},
        {"INT4", KV_EINVAL},          {"int4 ", KV_EINVAL},
        {"offload", KV_EINVAL},       {"offload,int4", KV_EINVAL}, /* no page file */
        {"int4,offload", KV_EINVAL},  {"offload:sink=1", KV_EINVAL},
        {"int4", 0},                  {"int2", 0},
        {"evict", 0},                 {"int4,evict:recent=1024", 0},
        {"int4,int2,evict:sink=4,recent=256", 0},
        {"evict:recent=16777216,sink=65535", 0},
        {"", 0},
    };
    kv_store_t *s;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s = NULL;
        int rc = open_store(64, cases[i].spec, 0, &s);
        if (rc != cases[i].rc)
            fprintf(stderr, "  pressure \"%s\": %d, expected %d\n", cases[i].spec, rc,
                    cases[i].rc);
        CHECK_EQ(rc, cases[i].rc);
        CHECK(rc ? s == NULL : s != NULL);
        kv_store_destroy(s);
    }
    CHECK_EQ(open_store(64, NULL, 8, &s), KV_EINVAL); /* reserve, no ladder */
    CHECK_EQ(open_store(64, "", 8, &s), KV_EINVAL);
    CHECK_EQ(open_store(64, "int4", 65, &s), KV_ERANGE);
    char spec[32] = "int4,evict";
    CHECK_OK(open_store(64, spec, 64, &s));
    spec[0] = 'x'; /* the store keeps its own copy */
    kv_config_t c;
    CHECK_OK(kv_store_config(s, &c));
    CHECK(c.pressure && c.pressure != spec && !strcmp(c.pressure, "int4,evict"));
    CHECK_EQ(c.pressure_reserve, 64);
    kv_stats_t st = stats(s);
    CHECK(st.meta_bytes > 0 && st.pressure_runs == 0);
    kv_store_destroy(s);
    /* pages of 1 FP16 token hold no INT4/INT2 group */
    kv_config_t t = kv_config_default();
    t.n_layers = 1, t.n_kv_heads = 1, t.n_q_heads = 1, t.head_dim = HD;
    t.host_pages = 8, t.n_threads = 1, t.page_bytes = 4 * HD;
    t.pressure = "int4";
    CHECK_EQ(kv_store_create(&t, &s), KV_ENOTSUP);
    t.pressure = "evict";
    CHECK_OK(kv_store_create(&t, &s));
    kv_store_destroy(s);
}

int main(void)
{
    test_config();
    test_off();
    test_int4_rescue();
    test_cannot();
    test_evict();
    test_ladder_order();
    test_lru();
    test_reserve();
    test_compact();
    test_hooked();
    test_faults("int4", 44, 64);
    test_faults("evict:sink=4,recent=16", 40, 64);
    return kv_test_end();
}
