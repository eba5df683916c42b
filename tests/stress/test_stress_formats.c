/* SPDX-License-Identifier: MIT */
/*
 * test_stress_formats.c — randomized test of the compressed formats through
 * the public API: appends with residual conversion (INT4/INT2), set_format,
 * quantize, MiniCache merges, forks, compaction, frees and attention, with
 * injected allocation failures and a small pool, against a shadow model.
 *
 * The shadow holds, per live sequence and (layer, kv_head) list, the value
 * every token must read back as, its position, the list's target format and
 * where its FP16 residual starts (the residual is always a suffix of the
 * list: appends add to it, conversions and merges consume its head,
 * compaction makes the whole list residual again). Values are exact:
 *   - appended tokens: the FP16 rounding of the input;
 *   - a conversion (after an append the model expects floor(residual / R)
 *     * R tokens, or none if the conversion was deferred for lack of
 *     memory, in all heads of the layer alike; kv_seq_quantize: all but
 *     keep, in whole groups) shrinks the library's residual (read through
 *     the internal page table) by exactly that count and may change only
 *     those first c residual tokens, each element by at most the scale/2
 *     of its group computed from the group's min/max (keys: 16 tokens of
 *     one channel; values: 16 channels of one token); the shadow then
 *     takes the values kv_read returns right after the conversion, and
 *     every later read, fork and copy must reproduce them bit for bit;
 *   - a merge must permute the first m residual tokens of both layers the
 *     same way, keep every position, restore every token's K and V norms
 *     (1e-5 relative) and leave the tokens it retained bit-exact; the
 *     shadow takes the read values. It may take the previous segment's
 *     partly filled RETAINED and MERGED pages along (pages/kv_page_merge.c:
 *     packing): then the permuted range starts up to PACK_BACK tokens
 *     before the residual, the same in both layers;
 *   - compaction: the kept tokens' values rounded to FP16, exactly.
 * After every operation every list of every live sequence is compared with
 * the shadow (so copy-on-write never leaks into a fork), kv_store_check
 * passes and the statistics add up (tokens, bytes per format, kv_bytes).
 * Failed calls (KV_ENOMEM under kv_fault_arm or a full pool) must change
 * nothing; an append may succeed with its conversion deferred. Decode
 * attention over random batches is checked against dense attention over
 * kv_read (relative error <= 1e-3). At the end everything is freed: no
 * page in use, no metadata byte left.
 *
 * argv[1] / KV_STRESS_SEED: seed; KV_STRESS_OPS: operations (default 12000).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "store/kv_store_int.h" /* the residual length, to name conversions */
#include "kv_test.h"
#include "pages/kv_page_int.h"

#define NL 4       /* layers: pairs (0,1) and (2,3) can merge */
#define NKV 2
#define NQ 4
#define HD 32
#define PAGE_BYTES (64 * HD) /* 16 FP16 tokens, 64 INT2, 32 INT4      */
#define POOL_PAGES 480
#define MAX_SEQS 8
#define R 32
#define MAX_TOKENS 600 /* per list, to keep reads cheap */
/* A merge's repacked tokens before the residual: < 16 of a RETAINED page
 * and < 31 of a MERGED page (INT4 directions at HD 32, PAGE_BYTES). */
#define PACK_BACK (15 + 30)

/* ---- the shadow ------------------------------------------------------------- */

typedef struct slist {
    float *k, *v;   /* [cap][HD] expected read-back */
    int32_t *pos;   /* [cap]                        */
    uint32_t n, cap;
    uint32_t rs;    /* residual start               */
} slist_t;

typedef struct sseq {
    int live;
    kv_seq_id_t id;
    slist_t l[NL][NKV];
    uint32_t target[NL];
} sseq_t;

static sseq_t SH[MAX_SEQS];
static kv_store_t *S;
static uint64_t rng;
static long op_no;
static int failed; /* stop at the first failure of a seed */
static long n_conv, n_defer, n_merge, n_enomem, n_compact, n_attn;

#define EXPECT(cond)                                                         \
    do {                                                                     \
        CHECK(cond);                                                         \
        if (!(cond) && !failed) {                                            \
            failed = 1;                                                      \
            fprintf(stderr, "  at op %ld\n", op_no);                         \
        }                                                                    \
    } while (0)

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        exit(2);
    return p;
}

/* memcmp / memcpy that accept NULL with a zero size (empty lists). */
static int same_bytes(const void *a, const void *b, size_t n)
{
    return n == 0 || memcmp(a, b, n) == 0;
}
static void copy_bytes(void *d, const void *s, size_t n)
{
    if (n)
        memcpy(d, s, n);
}

static void sl_reserve(slist_t *l, uint32_t need)
{
    if (need <= l->cap)
        return;
    uint32_t cap = need < 2 * l->cap ? 2 * l->cap : need;
    l->k = xrealloc(l->k, (size_t)cap * HD * 4);
    l->v = xrealloc(l->v, (size_t)cap * HD * 4);
    l->pos = xrealloc(l->pos, (size_t)cap * 4);
    l->cap = cap;
}

static void sl_free(slist_t *l)
{
    free(l->k), free(l->v), free(l->pos);
    memset(l, 0, sizeof *l);
}

static void sl_copy(slist_t *d, const slist_t *s)
{
    sl_free(d);
    sl_reserve(d, s->n);
    copy_bytes(d->k, s->k, (size_t)s->n * HD * 4);
    copy_bytes(d->v, s->v, (size_t)s->n * HD * 4);
    copy_bytes(d->pos, s->pos, (size_t)s->n * 4);
    d->n = s->n;
    d->rs = s->rs;
}

static float h16(float x)
{
    /* independent of the library: round to nearest even via double */
    double a = fabs((double)x);
    if (a == 0.0)
        return x;
    int e;
    (void)frexp(a, &e);
    double step = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
    double r = nearbyint(a / step) * step;
    return (float)(x < 0 ? -r : r);
}

/* ---- comparing ---------------------------------------------------------------- */

/* Read one list into k, v, pos (caller frees). */
static uint32_t read_all(kv_seq_id_t q, uint32_t l, uint32_t h, float **k,
                         float **v, int32_t **pos)
{
    uint32_t n = 0;
    CHECK_OK(kv_seq_len(S, q, l, h, &n));
    *k = xrealloc(NULL, (size_t)n * HD * 4);
    *v = xrealloc(NULL, (size_t)n * HD * 4);
    *pos = xrealloc(NULL, (size_t)n * 4);
    if (n)
        CHECK_OK(kv_read(S, q, l, h, 0, n, *k, *v, *pos));
    return n;
}

static int list_same(const sseq_t *s, uint32_t l, uint32_t h)
{
    float *k, *v;
    int32_t *p;
    const slist_t *x = &s->l[l][h];
    uint32_t n = read_all(s->id, l, h, &k, &v, &p);
    int ok = n == x->n && same_bytes(k, x->k, (size_t)n * HD * 4) &&
             same_bytes(v, x->v, (size_t)n * HD * 4) &&
             same_bytes(p, x->pos, (size_t)n * 4);
    free(k), free(v), free(p);
    return ok;
}

/* Everything matches the shadow; statistics add up. */
static void verify_all(void)
{
    uint64_t tokens = 0;
    for (int i = 0; i < MAX_SEQS; i++) {
        if (!SH[i].live)
            continue;
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t h = 0; h < NKV; h++) {
                EXPECT(list_same(&SH[i], l, h));
                tokens += SH[i].l[l][h].n;
            }
    }
    EXPECT(kv_store_check(S) == 0);
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    EXPECT(st.tokens == tokens);
    EXPECT(st.fp16_bytes == tokens * 2 * HD * 2);
    uint64_t pages = 0, bytes = 0;
    for (int f = 0; f < KV_FMT_COUNT; f++) {
        pages += st.pages_by_format[f];
        bytes += st.bytes_by_format[f];
        EXPECT(st.bytes_by_format[f] == st.pages_by_format[f] * PAGE_BYTES);
    }
    EXPECT(pages == st.pages_used && bytes == st.kv_bytes);
}

/* ---- conversion bound ----------------------------------------------------------- */

/* Largest |x - x^| the codec allows in a 16-element group (scale/2 with
 * FP16 rounding of min and scale), given the elements x[j * stride]. */
static double group_bound(const float *x, size_t stride, double levels)
{
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 16; j++) {
        mn = fminf(mn, x[j * stride]);
        mx = fmaxf(mx, x[j * stride]);
    }
    if (mn == mx)
        return 0.0;
    double ulp = fmax(fabs(mn), 6.1e-5) / 1024.0;
    return ((double)mx - mn + ulp) / levels * (1.0 + 1.0 / 512) / 2.0 +
           1e-6 * fmax(fabs(mn), fabs(mx));
}

/* After an operation that may convert list (s, l, h): the library's
 * residual must have shrunk by c tokens, c in {want, alt} (alt: a deferred
 * conversion); the read values must equal the shadow outside the first c
 * residual tokens and be within the codec's bound inside (a group may by
 * chance decode to the same values: re-quantizing values that already sit
 * on a grid, after a compaction, is idempotent). Updates the shadow.
 * Returns c. */
static uint32_t absorb_conversion(sseq_t *s, uint32_t l, uint32_t h,
                                  uint32_t want, uint32_t alt)
{
    slist_t *x = &s->l[l][h];
    float *k, *v;
    int32_t *p;
    uint32_t n = read_all(s->id, l, h, &k, &v, &p);
    EXPECT(n == x->n && same_bytes(p, x->pos, (size_t)n * 4));
    uint32_t r0, res = kv_page_residual(kv_page_list_get(S->pt, s->id, l, h),
                                        &r0);
    uint32_t c = n - res - x->rs;
    if (c != want && c != alt && !failed)
        fprintf(stderr, "conversion of %u tokens, expected %u or %u\n", c,
                want, alt);
    EXPECT(c == want || c == alt);
    EXPECT(c % 16 == 0 && x->rs + c <= n);
    c = x->rs + c <= n ? c : 0;
    /* unchanged outside [rs, rs + c) */
    uint32_t e = x->rs + c;
    EXPECT(same_bytes(k, x->k, (size_t)x->rs * HD * 4) &&
           same_bytes(v, x->v, (size_t)x->rs * HD * 4));
    EXPECT(same_bytes(k + (size_t)e * HD, x->k + (size_t)e * HD,
                   (size_t)(n - e) * HD * 4) &&
           same_bytes(v + (size_t)e * HD, x->v + (size_t)e * HD,
                   (size_t)(n - e) * HD * 4));
    double levels = s->target[l] == KV_FMT_INT2 ? 3.0 : 15.0;
    int in_bound = 1;
    for (uint32_t g = x->rs; g + 16 <= e; g += 16) {
        for (uint32_t ch = 0; ch < HD; ch++) {
            double b = group_bound(x->k + (size_t)g * HD + ch, HD, levels);
            for (uint32_t j = 0; j < 16; j++)
                in_bound &= fabs(k[(size_t)(g + j) * HD + ch] -
                                 x->k[(size_t)(g + j) * HD + ch]) <= b;
        }
        for (uint32_t j = 0; j < 16; j++)
            for (uint32_t cg = 0; cg < HD; cg += 16) {
                const float *xv = x->v + (size_t)(g + j) * HD + cg;
                double b = group_bound(xv, 1, levels);
                for (uint32_t i = 0; i < 16; i++)
                    in_bound &= fabs(v[(size_t)(g + j) * HD + cg + i] - xv[i]) <= b;
            }
    }
    EXPECT(in_bound);
    copy_bytes(x->k, k, (size_t)n * HD * 4);
    copy_bytes(x->v, v, (size_t)n * HD * 4);
    x->rs = e;
    free(k), free(v), free(p);
    return c;
}

/* ---- operations ------------------------------------------------------------------- */

static int pick_live(void)
{
    int n = 0, idx[MAX_SEQS];
    for (int i = 0; i < MAX_SEQS; i++)
        if (SH[i].live)
            idx[n++] = i;
    return n ? idx[kv_test_rand(&rng) % (uint64_t)n] : -1;
}

static int pick_free(void)
{
    for (int i = 0; i < MAX_SEQS; i++)
        if (!SH[i].live)
            return i;
    return -1;
}

static void arm_maybe(void)
{
    if (kv_test_rand(&rng) % 4 == 0)
        kv_fault_arm(1 + kv_test_rand(&rng) % 6);
}

/* Result of a call under a possibly armed fault. */
static int finish(int rc, int *fired)
{
    *fired = kv_fault_fired();
    kv_fault_arm(0);
    if (rc == KV_ENOMEM)
        n_enomem++;
    return rc;
}

static void op_create(void)
{
    int i = pick_free();
    if (i < 0)
        return;
    kv_seq_id_t id;
    int fired;
    arm_maybe();
    int rc = finish(kv_seq_create(S, &id), &fired);
    if (rc) {
        EXPECT(rc == KV_ENOMEM);
        return;
    }
    sseq_t *s = &SH[i];
    memset(s, 0, sizeof *s);
    s->live = 1;
    s->id = id;
    for (uint32_t l = 0; l < NL; l++)
        s->target[l] = KV_FMT_INT2; /* the store's kv_format */
}

static void op_free(void)
{
    int i = pick_live();
    if (i < 0)
        return;
    CHECK_OK(kv_seq_free(S, SH[i].id));
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++)
            sl_free(&SH[i].l[l][h]);
    SH[i].live = 0;
}

static void op_fork(void)
{
    int p = pick_live(), c = pick_free();
    if (p < 0 || c < 0)
        return;
    kv_seq_id_t id;
    int fired;
    arm_maybe();
    int rc = finish(kv_seq_fork(S, SH[p].id, &id), &fired);
    if (rc) {
        EXPECT(rc == KV_ENOMEM);
        return;
    }
    EXPECT(!fired);
    sseq_t *d = &SH[c];
    memset(d, 0, sizeof *d);
    d->live = 1;
    d->id = id;
    copy_bytes(d->target, SH[p].target, sizeof d->target);
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t h = 0; h < NKV; h++)
            sl_copy(&d->l[l][h], &SH[p].l[l][h]);
}

/* Append n tokens to layer l (base: the pair's shallower layer's values
 * for correlation, or NULL). Keeps the appended values in out when given. */
static int append_layer(sseq_t *s, uint32_t l, uint32_t n, const float *bk,
                        const float *bv, float *ok, float *ov)
{
    size_t ne = (size_t)n * NKV * HD;
    float *k = xrealloc(NULL, ne * 4), *v = xrealloc(NULL, ne * 4);
    for (size_t i = 0; i < ne; i++) {
        k[i] = kv_test_randf(&rng) * 2.0f;
        v[i] = kv_test_randf(&rng);
        if (bk) {
            k[i] = bk[i] * 1.1f + 0.3f * k[i];
            v[i] = bv[i] * 0.9f + 0.3f * v[i];
        }
    }
    int fired;
    arm_maybe();
    int rc = finish(kv_append(S, s->id, l, n, KV_DTYPE_F32, k, v, NULL), &fired);
    if (rc == 0) {
        for (uint32_t h = 0; h < NKV; h++) {
            slist_t *x = &s->l[l][h];
            sl_reserve(x, x->n + n);
            int32_t next = 0; /* one past the largest position held */
            for (uint32_t t = 0; t < x->n; t++)
                next = x->pos[t] >= next ? x->pos[t] + 1 : next;
            for (uint32_t t = 0; t < n; t++) {
                for (int d = 0; d < HD; d++) {
                    x->k[(size_t)(x->n + t) * HD + d] = h16(k[((size_t)t * NKV + h) * HD + d]);
                    x->v[(size_t)(x->n + t) * HD + d] = h16(v[((size_t)t * NKV + h) * HD + d]);
                }
                x->pos[x->n + t] = next + (int32_t)t;
            }
            x->n += n;
        }
        /* the conversion: all heads or none */
        uint32_t deferred = 0, done = 0;
        for (uint32_t h = 0; h < NKV; h++) {
            slist_t *x = &s->l[l][h];
            uint32_t want = s->target[l] == KV_FMT_FP16
                                ? 0
                                : (x->n - x->rs) / R * R;
            uint32_t c = absorb_conversion(s, l, h, want, 0);
            done += c > 0;
            deferred += c == 0 && want > 0;
        }
        EXPECT(!(done && deferred));
        n_conv += done > 0;
        if (deferred) {
            n_defer++;
            kv_stats_t st = {.struct_size = sizeof st};
            CHECK_OK(kv_store_stats(S, &st));
            /* deferred only for lack of memory: injected or a tight pool
             * (a conversion needs at most ~10 pages per head here) */
            EXPECT(fired || st.pages_free < 64);
        }
    } else {
        EXPECT(rc == KV_ENOMEM);
    }
    if (ok && rc == 0)
        copy_bytes(ok, k, ne * 4), copy_bytes(ov, v, ne * 4);
    free(k), free(v);
    return rc;
}

static void op_append(void)
{
    int i = pick_live();
    if (i < 0)
        return;
    sseq_t *s = &SH[i];
    uint32_t big = kv_test_rand(&rng) % 4 == 0; /* one draw at a time: */
    uint32_t n = 1 + (uint32_t)(kv_test_rand(&rng) % (big ? 48 : 4)); /* order */
    if (kv_test_rand(&rng) % 2) { /* a pair, same positions */
        uint32_t l0 = 2 * (uint32_t)(kv_test_rand(&rng) % 2);
        if (s->l[l0][0].n != s->l[l0 + 1][0].n ||
            s->l[l0][0].n + n > MAX_TOKENS || s->l[l0][1].n != s->l[l0 + 1][1].n)
            return;
        size_t ne = (size_t)n * NKV * HD;
        float *k = xrealloc(NULL, ne * 4), *v = xrealloc(NULL, ne * 4);
        /* if the second append fails the pair is uneven: merges of it
         * then answer KV_ESTATE (modelled) */
        if (append_layer(s, l0, n, NULL, NULL, k, v) == 0)
            append_layer(s, l0 + 1, n, k, v, NULL, NULL);
        free(k), free(v);
        return;
    }
    uint32_t l = (uint32_t)(kv_test_rand(&rng) % NL);
    if (s->l[l][0].n + n <= MAX_TOKENS)
        append_layer(s, l, n, NULL, NULL, NULL, NULL);
}

static void op_set_format(void)
{
    int i = pick_live();
    if (i < 0)
        return;
    static const kv_format_t f[3] = {KV_FMT_FP16, KV_FMT_INT4, KV_FMT_INT2};
    uint32_t l = (uint32_t)(kv_test_rand(&rng) % NL);
    kv_format_t fmt = f[kv_test_rand(&rng) % 3];
    CHECK_OK(kv_seq_set_format(S, SH[i].id, l, fmt));
    SH[i].target[l] = fmt;
}

static void op_quantize(void)
{
    int i = pick_live();
    if (i < 0)
        return;
    sseq_t *s = &SH[i];
    uint32_t l = (uint32_t)(kv_test_rand(&rng) % NL);
    uint32_t keep = (uint32_t)(kv_test_rand(&rng) % 40);
    int fired;
    arm_maybe();
    int rc = finish(kv_seq_quantize(S, s->id, l, keep), &fired);
    if (rc) {
        EXPECT(rc == KV_ENOMEM);
        return;
    }
    EXPECT(!fired);
    for (uint32_t h = 0; h < NKV; h++) {
        slist_t *x = &s->l[l][h];
        uint32_t res = x->n - x->rs;
        uint32_t want = s->target[l] == KV_FMT_FP16 || res <= keep
                            ? 0
                            : (res - keep) / 16 * 16;
        n_conv += absorb_conversion(s, l, h, want, want) > 0;
    }
}

static double vnorm(const float *x)
{
    double a = 0;
    for (int d = 0; d < HD; d++)
        a += (double)x[d] * x[d];
    return sqrt(a);
}

static void op_merge(void)
{
    int i = pick_live();
    if (i < 0)
        return;
    sseq_t *s = &SH[i];
    uint32_t layer = 1 + 2 * (uint32_t)(kv_test_rand(&rng) % 2);
    kv_merge_opts_t o = kv_merge_opts_default();
    o.keep_fp16 = (uint32_t)(kv_test_rand(&rng) % 20);
    o.gamma = (float)(kv_test_rand(&rng) % 4) * 0.05f;
    o.t = kv_test_rand(&rng) % 2 ? 0.6f : 0.5f;
    o.dir_format = kv_test_rand(&rng) % 2 ? KV_FMT_INT4 : KV_FMT_FP16;
    /* expected: residuals equal in length and positions */
    int same = 1;
    for (uint32_t h = 0; h < NKV; h++) {
        slist_t *a = &s->l[layer - 1][h], *b = &s->l[layer][h];
        uint32_t ra = a->n - a->rs, rb = b->n - b->rs;
        same &= ra == rb &&
                same_bytes(a->pos + a->rs, b->pos + b->rs, (size_t)ra * 4);
    }
    int fired;
    arm_maybe();
    int rc = finish(kv_seq_merge_layers(S, s->id, layer, &o), &fired);
    if (!same) {
        EXPECT(rc == KV_ESTATE);
        return;
    }
    if (rc) {
        EXPECT(rc == KV_ENOMEM);
        return;
    }
    EXPECT(!fired);
    for (uint32_t h = 0; h < NKV; h++) {
        slist_t *a = &s->l[layer - 1][h];
        uint32_t res = a->n - a->rs, m = res > o.keep_fp16 ? res - o.keep_fp16 : 0;
        int32_t *p0 = NULL;
        uint32_t b0 = 0; /* layer l-1's repacked tokens, rs - a0 */
        for (uint32_t j = 0; j < 2; j++) {
            slist_t *x = &s->l[layer - 1 + j][h];
            float *k, *v;
            int32_t *p;
            uint32_t n = read_all(s->id, layer - 1 + j, h, &k, &v, &p);
            EXPECT(n == x->n);
            /* outside the merged segment (and what it repacked): unchanged */
            uint32_t a0 = 0, a1 = x->rs + m;
            while (a0 < x->rs && same_bytes(k + (size_t)a0 * HD, x->k + (size_t)a0 * HD,
                                            HD * 4) && p[a0] == x->pos[a0])
                a0++;
            EXPECT(x->rs - a0 <= PACK_BACK);
            if (j == 0)
                b0 = x->rs - a0;
            EXPECT(x->rs - a0 == b0);
            EXPECT(same_bytes(k + (size_t)a1 * HD, x->k + (size_t)a1 * HD,
                           (size_t)(n - a1) * HD * 4) &&
                   same_bytes(p + a1, x->pos + a1, (size_t)(n - a1) * 4));
            /* the segment: same positions permuted alike in both layers,
             * norms kept */
            int ok = 1;
            for (uint32_t t = a0; t < a1; t++) {
                uint32_t src = a0;
                while (src < a1 && x->pos[src] != p[t])
                    src++;
                if (src == a1) {
                    ok = 0;
                    continue;
                }
                double na = vnorm(x->k + (size_t)src * HD), nb = vnorm(k + (size_t)t * HD);
                ok &= fabs(na - nb) <= 1e-5 * na + 1e-12;
                na = vnorm(x->v + (size_t)src * HD), nb = vnorm(v + (size_t)t * HD);
                ok &= fabs(na - nb) <= 1e-5 * na + 1e-12;
            }
            EXPECT(ok);
            if (j == 0) {
                p0 = p;
            } else {
                EXPECT(same_bytes(p0 + a0, p + a0, (size_t)(a1 - a0) * 4));
                free(p0);
            }
            copy_bytes(x->k, k, (size_t)n * HD * 4);
            copy_bytes(x->v, v, (size_t)n * HD * 4);
            copy_bytes(x->pos, p, (size_t)n * 4);
            x->rs += m;
            free(k), free(v);
            if (j == 1)
                free(p);
        }
    }
    n_merge++;
}

static void op_compact(void)
{
    int i = pick_live();
    if (i < 0)
        return;
    sseq_t *s = &SH[i];
    uint32_t l = (uint32_t)(kv_test_rand(&rng) % NL);
    uint32_t h = (uint32_t)(kv_test_rand(&rng) % NKV);
    slist_t *x = &s->l[l][h];
    uint32_t *keep = xrealloc(NULL, (size_t)x->n * 4 + 4), nk = 0;
    uint32_t drop = 1 + (uint32_t)(kv_test_rand(&rng) % 5);
    for (uint32_t t = 0; t < x->n; t++)
        if (kv_test_rand(&rng) % drop == 0 || t + 8 >= x->n)
            keep[nk++] = t;
    int fired;
    arm_maybe();
    int rc = finish(kv_compact(S, s->id, l, h, keep, nk), &fired);
    if (rc) {
        EXPECT(rc == KV_ENOMEM);
        free(keep);
        return;
    }
    EXPECT(!fired);
    for (uint32_t t = 0; t < nk; t++) {
        for (int d = 0; d < HD; d++) {
            x->k[(size_t)t * HD + d] = h16(x->k[(size_t)keep[t] * HD + d]);
            x->v[(size_t)t * HD + d] = h16(x->v[(size_t)keep[t] * HD + d]);
        }
        x->pos[t] = x->pos[keep[t]];
    }
    x->n = nk;
    x->rs = 0;
    free(keep);
    n_compact++;
}

/* Decode at a random layer for a random batch vs dense over kv_read. */
static void op_attn(void)
{
    kv_seq_id_t ids[MAX_SEQS];
    int who[MAX_SEQS], b = 0;
    uint32_t l = (uint32_t)(kv_test_rand(&rng) % NL);
    for (int i = 0; i < MAX_SEQS; i++)
        if (SH[i].live && SH[i].l[l][0].n && SH[i].l[l][1].n &&
            kv_test_rand(&rng) % 2)
            who[b] = i, ids[b++] = SH[i].id;
    if (!b)
        return;
    float *q = xrealloc(NULL, (size_t)b * NQ * HD * 4);
    float *out = xrealloc(NULL, (size_t)b * NQ * HD * 4);
    for (size_t j = 0; j < (size_t)b * NQ * HD; j++)
        q[j] = kv_test_randf(&rng) * 2.0f;
    kv_decode_t a = {.layer = l, .batch = (uint32_t)b, .seqs = ids, .q = q,
                     .out = out};
    CHECK_OK(kv_attn_decode(S, &a));
    double worst = 0;
    for (int j = 0; j < b; j++) {
        const sseq_t *s = &SH[who[j]];
        for (uint32_t hq = 0; hq < NQ; hq++) {
            const slist_t *x = &s->l[l][hq / (NQ / NKV)];
            const float *qh = q + ((size_t)j * NQ + hq) * HD;
            double mx = -INFINITY, sum = 0, o[HD] = {0}, mag = 1e-3, err = 0;
            double *p = xrealloc(NULL, (size_t)x->n * sizeof *p);
            for (uint32_t t = 0; t < x->n; t++) {
                double dot = 0;
                for (int d = 0; d < HD; d++)
                    dot += (double)qh[d] * x->k[(size_t)t * HD + d];
                p[t] = dot / sqrt((double)HD);
                mx = fmax(mx, p[t]);
            }
            for (uint32_t t = 0; t < x->n; t++)
                sum += (p[t] = exp(p[t] - mx));
            for (uint32_t t = 0; t < x->n; t++)
                for (int d = 0; d < HD; d++)
                    o[d] += p[t] / sum * x->v[(size_t)t * HD + d];
            for (int d = 0; d < HD; d++) {
                double got = out[((size_t)j * NQ + hq) * HD + d];
                err = isfinite(got) ? fmax(err, fabs(got - o[d])) : INFINITY;
                mag = fmax(mag, fabs(o[d]));
            }
            worst = fmax(worst, err / mag);
            free(p);
        }
    }
    EXPECT(worst <= 1e-3);
    n_attn++;
    free(q), free(out);
}

static void run(uint64_t seed, long ops)
{
    rng = seed;
    failed = 0;
    uint64_t mem0 = kv_mem_live_bytes();
    kv_config_t c = kv_config_default();
    c.n_layers = NL, c.n_q_heads = NQ, c.n_kv_heads = NKV, c.head_dim = HD;
    c.page_bytes = PAGE_BYTES, c.host_pages = POOL_PAGES;
    c.max_seqs = MAX_SEQS, c.n_threads = 2;
    c.kv_format = KV_FMT_INT2, c.residual = R;
    c.flags = KV_CONFIG_NO_TCACHE;
    CHECK_OK(kv_store_create(&c, &S));
    memset(SH, 0, sizeof SH);
    const int verbose = getenv("KV_STRESS_VERBOSE") != NULL;
    for (op_no = 0; op_no < ops && !failed; op_no++) {
        uint64_t r = kv_test_rand(&rng) % 100;
        if (verbose)
            fprintf(stderr, "op %ld: %llu\n", op_no, (unsigned long long)r);
        if (r < 4)
            op_create();
        else if (r < 7)
            op_free();
        else if (r < 11)
            op_fork();
        else if (r < 55)
            op_append();
        else if (r < 60)
            op_set_format();
        else if (r < 67)
            op_quantize();
        else if (r < 77)
            op_merge();
        else if (r < 85)
            op_compact();
        else
            op_attn();
        verify_all();
    }
    if (failed)
        fprintf(stderr, "seed %llu failed at op %ld\n",
                (unsigned long long)seed, op_no);
    for (int i = 0; i < MAX_SEQS; i++)
        if (SH[i].live) {
            CHECK_OK(kv_seq_free(S, SH[i].id));
            for (uint32_t l = 0; l < NL; l++)
                for (uint32_t h = 0; h < NKV; h++)
                    sl_free(&SH[i].l[l][h]);
            SH[i].live = 0;
        }
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_used, 0);
    CHECK_OK(kv_store_check(S));
    kv_store_destroy(S);
    S = NULL;
    CHECK_EQ(kv_mem_live_bytes(), mem0);
}

int main(int argc, char **argv)
{
    long ops = 12000;
    const char *e = getenv("KV_STRESS_OPS");
    if (e)
        ops = strtol(e, NULL, 0);
    uint64_t seeds[3] = {1, 0xC0FFEE, 424242};
    int n_seeds = 3;
    const char *es = getenv("KV_STRESS_SEED");
    if (argc > 1 || es) {
        seeds[0] = strtoull(argc > 1 ? argv[1] : es, NULL, 0);
        n_seeds = 1;
    }
    for (int i = 0; i < n_seeds; i++)
        run(seeds[i], ops / n_seeds + 1);
    printf("ops %ld: conversions %ld (deferred %ld), merges %ld, "
           "compactions %ld, attention %ld, ENOMEM %ld\n",
           ops, n_conv, n_defer, n_merge, n_compact, n_attn, n_enomem);
    CHECK(n_conv > 0 && n_merge > 0 && n_compact > 0 && n_attn > 0);
    return kv_test_end();
}
