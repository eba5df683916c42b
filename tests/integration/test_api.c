/* SPDX-License-Identifier: MIT */
/*
 * test_api.c — the public API end to end, used the way an inference engine
 * uses it, checked against dense attention computed here.
 *
 * Shape: SmolLM2-135M's heads (9 query heads, 3 kv heads, head_dim 64) with
 * 4 layers instead of 30 (for speed), default page size (16 tokens).
 * Flow: three sequences (520 tokens prefilled in two chunks, 37, 5 with F16
 * input); per layer kv_append + kv_attn_prefill with statistics over a
 * SnapKV-like window of the last rows; decode steps (one token appended per
 * sequence and layer, one batched kv_attn_decode per layer, statistics on);
 * a fork for parallel sampling decoded beside its parent with different
 * tokens (copy-on-write); H2O-like kv_compact (sinks + heavy hitters by
 * attention statistics + recent window) on one sequence and a random
 * compaction of the fork's shared pages; decode after compaction.
 *
 * Checked: every attention output against a double-precision dense
 * reference over the test's own FP16-rounded copy of the appended values
 * (relative error <= 1e-3), the statistics against the exact probabilities
 * summed over the group's query heads, read-back of values and positions
 * (bit exact), the store statistics (tokens, fp16_bytes, kv_bytes, exact
 * page counts where no page is shared, a fork taking no page, n_seqs),
 * kv_store_check, and no page or metadata byte left after freeing.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_attn.h"

#define NL 4
#define NQ 9
#define NKV 3
#define GROUP (NQ / NKV)
#define HD 64
#define TPP 16
#define PAGE_BYTES (64 * HD)
#define POOL 1024
#define MAXS 4
#define TOL 1e-3

/* ---- FP16 rounding (round to nearest even), independent of the library -- */

static float half_round(float f)
{
    double a = fabs((double)f);
    int e;
    if (a == 0.0)
        return f;
    (void)frexp(a, &e);
    double step = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
    double r = nearbyint(a / step) * step;
    return (float)(f < 0 ? -r : r);
}

/* ---- the test's dense copy of the store -------------------------------- */

typedef struct list {
    float *k, *v; /* [cap][HD], FP16-rounded */
    int32_t *pos; /* [cap] */
    uint32_t len, cap;
} list_t;

static list_t M[MAXS][NL][NKV];
static kv_seq_id_t ID[MAXS];
static int live[MAXS];
static kv_store_t *S;
static uint64_t rng = 2024;
static double worst_out, worst_stats; /* largest errors seen */

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        exit(2);
    return p;
}

static void list_push(list_t *l, const float *k, const float *v, int32_t pos)
{
    if (l->len == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->k = xrealloc(l->k, (size_t)l->cap * HD * 4);
        l->v = xrealloc(l->v, (size_t)l->cap * HD * 4);
        l->pos = xrealloc(l->pos, (size_t)l->cap * 4);
    }
    for (int d = 0; d < HD; d++) {
        l->k[(size_t)l->len * HD + d] = half_round(k[d]);
        l->v[(size_t)l->len * HD + d] = half_round(v[d]);
    }
    l->pos[l->len++] = pos;
}

static void list_copy(list_t *dst, const list_t *src)
{
    dst->len = dst->cap = 0;
    dst->k = dst->v = NULL;
    dst->pos = NULL;
    for (uint32_t t = 0; t < src->len; t++) {
        list_push(dst, src->k + (size_t)t * HD, src->v + (size_t)t * HD,
                  src->pos[t]);
    }
}

static void list_free(list_t *l)
{
    free(l->k);
    free(l->v);
    free(l->pos);
    memset(l, 0, sizeof *l);
}

static void fill(float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kv_test_randf(&rng) * amp;
}

/* ---- reference attention ---------------------------------------------- */

/* One query row (all q heads) against tokens [0, lim[g]) of each kv head's
 * list. Checks out[NQ][HD]; adds each token's probability (summed over the
 * group) to psum[g][t] when psum is given. */
static void ref_row(const list_t *l /* [NKV] */, const uint32_t *lim,
                    const float *q, const float *out, double scale,
                    double *const *psum, const char *what)
{
    for (uint32_t h = 0; h < NQ; h++) {
        const list_t *L = &l[h / GROUP];
        double o[HD];
        kv_test_dense_row(L->k, L->v, HD, lim[h / GROUP], q + (size_t)h * HD, scale, o,
                          psum ? psum[h / GROUP] : NULL);
        kv_test_check_row(out + (size_t)h * HD, o, HD, TOL, &worst_out, what, h);
    }
}

/* stats[g*stride + t] vs psum[g][t] for t < len[g]; entries past len must be
 * untouched (still `sentinel`). */
static void check_stats(const float *stats, uint32_t stride,
                        double *const *psum, const uint32_t *len,
                        double count, float sentinel, const char *what)
{
    int bad = 0;
    for (uint32_t g = 0; g < NKV; g++) {
        double total = 0;
        for (uint32_t t = 0; t < len[g]; t++) {
            double s = stats[(size_t)g * stride + t], r = psum[g][t];
            double e = fabs(s - r);
            total += s;
            worst_stats = fmax(worst_stats, e / fmax(r, 1e-6));
            if (!(e <= TOL * r + 1e-7 * count) && bad++ < 3)
                fprintf(stderr, "%s: stats kv head %u token %u: %g vs %g\n",
                        what, g, t, s, r);
        }
        for (uint32_t t = len[g]; t < stride; t++)
            if (stats[(size_t)g * stride + t] != sentinel && bad++ < 3)
                fprintf(stderr, "%s: stats past the list written\n", what);
        /* each counted row's probabilities sum to 1 per q head */
        if (!(fabs(total - count) <= 1e-3 * count) && bad++ < 3)
            fprintf(stderr, "%s: stats sum %g, want %g\n", what, total, count);
    }
    CHECK(bad == 0);
}

static double **psum_new(uint32_t n)
{
    double **p = malloc(NKV * sizeof *p);
    if (!p)
        exit(2);
    for (int g = 0; g < NKV; g++) {
        p[g] = calloc(n ? n : 1, sizeof **p);
        if (!p[g])
            exit(2);
    }
    return p;
}

static void psum_free(double **p)
{
    for (int g = 0; g < NKV; g++)
        free(p[g]);
    free(p);
}

/* ---- engine-like steps ------------------------------------------------- */

/* Append n tokens to sequence i at layer (F32 or F16 input), mirror them. */
static void append(int i, uint32_t layer, uint32_t n, int f16)
{
    size_t ne = (size_t)n * NKV * HD;
    float *k = malloc(ne * 4), *v = malloc(ne * 4);
    uint16_t *kh = malloc(ne * 2), *vh = malloc(ne * 2);
    if (!k || !v || !kh || !vh)
        exit(2);
    fill(k, ne, 1.0f);
    fill(v, ne, 1.0f);
    if (f16) { /* hand the library half bits of the rounded values */
        for (size_t j = 0; j < ne; j++) {
            float r[2] = {half_round(k[j]), half_round(v[j])};
            uint16_t hb[2];
            for (int w = 0; w < 2; w++) {
                float a = fabsf(r[w]);
                int e;
                uint16_t s = r[w] < 0 ? 0x8000 : 0;
                if (a == 0.0f) {
                    hb[w] = s;
                } else if (a < 0x1p-14f) {
                    hb[w] = s | (uint16_t)(a * 0x1p24f);
                } else {
                    float m = frexpf(a, &e);
                    hb[w] = s | (uint16_t)((e - 1 + 15) << 10) |
                            (uint16_t)((m * 2.0f - 1.0f) * 1024.0f);
                }
            }
            kh[j] = hb[0];
            vh[j] = hb[1];
        }
    }
    CHECK_OK(kv_append(S, ID[i], layer, n, f16 ? KV_DTYPE_F16 : KV_DTYPE_F32,
                       f16 ? (const void *)kh : (const void *)k,
                       f16 ? (const void *)vh : (const void *)v, NULL));
    for (uint32_t g = 0; g < NKV; g++) {
        list_t *l = &M[i][layer][g];
        for (uint32_t t = 0; t < n; t++) {
            int32_t pos = l->len ? l->pos[l->len - 1] + 1 : 0;
            list_push(l, k + ((size_t)t * NKV + g) * HD,
                      v + ((size_t)t * NKV + g) * HD, pos);
        }
    }
    free(k);
    free(v);
    free(kh);
    free(vh);
}

/* Causal prefill of the last n_new tokens of sequence i at layer; statistics
 * over the last `window` rows; reference-checked on a sample of rows and on
 * every row of the window. */
static void prefill(int i, uint32_t layer, uint32_t n_new, uint32_t window)
{
    const list_t *l = M[i][layer];
    uint32_t len[NKV], stride = 0;
    for (int g = 0; g < NKV; g++) {
        len[g] = l[g].len;
        stride = len[g] > stride ? len[g] : stride;
    }
    stride += 3;
    size_t nq = (size_t)n_new * NQ * HD;
    float *q = malloc(nq * 4), *out = malloc(nq * 4);
    float *st = malloc((size_t)NKV * stride * 4);
    if (!q || !out || !st)
        exit(2);
    fill(q, nq, 3.0f);
    for (size_t j = 0; j < (size_t)NKV * stride; j++)
        st[j] = -1.0f;
    uint32_t row0 = n_new > window ? n_new - window : 0;
    kv_prefill_t a = {.layer = layer, .seq = ID[i], .n_new = n_new, .q = q,
                      .out = out, .stats = st, .stats_stride = stride,
                      .stats_row0 = row0, .scale = 0.0f};
    CHECK_OK(kv_attn_prefill(S, &a));
    double **ps = psum_new(stride);
    char what[64];
    snprintf(what, sizeof what, "prefill seq %d layer %u", i, layer);
    for (uint32_t r = 0; r < n_new; r++) {
        if (r < row0 && r % 7 != 0 && r != 0)
            continue;
        uint32_t lim[NKV];
        for (int g = 0; g < NKV; g++)
            lim[g] = len[g] - n_new + r + 1;
        ref_row(l, lim, q + (size_t)r * NQ * HD, out + (size_t)r * NQ * HD,
                1.0 / sqrt((double)HD), r >= row0 ? ps : NULL, what);
    }
    check_stats(st, stride, ps, len, (double)(n_new - row0) * GROUP, -1.0f,
                what);
    psum_free(ps);
    free(q);
    free(out);
    free(st);
}

/* One batched decode at layer over the sequences idx[0..batch), statistics
 * for every row; `keep_stats` (optional) receives row 0's statistics. */
static void decode(const int *idx, uint32_t batch, uint32_t layer, float scale,
                   float *keep_stats, uint32_t keep_stride)
{
    kv_seq_id_t seqs[8];
    uint32_t stride = 0;
    for (uint32_t b = 0; b < batch; b++) {
        seqs[b] = ID[idx[b]];
        for (int g = 0; g < NKV; g++)
            if (M[idx[b]][layer][g].len > stride)
                stride = M[idx[b]][layer][g].len;
    }
    stride += 5;
    size_t nq = (size_t)batch * NQ * HD;
    float *q = malloc(nq * 4), *out = malloc(nq * 4);
    float *st[8];
    if (!q || !out)
        exit(2);
    fill(q, nq, 3.0f);
    for (uint32_t b = 0; b < batch; b++) {
        st[b] = malloc((size_t)NKV * stride * 4);
        if (!st[b])
            exit(2);
        for (size_t j = 0; j < (size_t)NKV * stride; j++)
            st[b][j] = 9.0f;
    }
    kv_decode_t a = {.layer = layer, .batch = batch, .seqs = seqs, .q = q,
                     .out = out, .stats = st, .stats_stride = stride,
                     .scale = scale};
    CHECK_OK(kv_attn_decode(S, &a));
    for (uint32_t b = 0; b < batch; b++) {
        const list_t *l = M[idx[b]][layer];
        uint32_t len[NKV];
        char what[64];
        double **ps = psum_new(stride);
        for (int g = 0; g < NKV; g++)
            len[g] = l[g].len;
        snprintf(what, sizeof what, "decode seq %d layer %u", idx[b], layer);
        ref_row(l, len, q + (size_t)b * NQ * HD, out + (size_t)b * NQ * HD,
                scale > 0 ? scale : 1.0 / sqrt((double)HD), ps, what);
        check_stats(st[b], stride, ps, len, GROUP, 9.0f, what);
        psum_free(ps);
        if (b == 0 && keep_stats)
            for (int g = 0; g < NKV; g++)
                for (uint32_t t = 0; t < len[g]; t++)
                    keep_stats[(size_t)g * keep_stride + t] =
                        st[0][(size_t)g * stride + t];
    }
    for (uint32_t b = 0; b < batch; b++)
        free(st[b]);
    free(q);
    free(out);
}

/* One decode step: every sequence in idx gets a token at every layer, then
 * one batched decode per layer. */
static void decode_step(const int *idx, uint32_t batch)
{
    for (uint32_t layer = 0; layer < NL; layer++) {
        for (uint32_t b = 0; b < batch; b++)
            append(idx[b], layer, 1, 0);
        decode(idx, batch, layer, 0.0f, NULL, 0);
    }
}

/* Compact sequence i's list (layer, g) to keep[0..n) and mirror it. */
static void compact(int i, uint32_t layer, uint32_t g, const uint32_t *keep,
                    uint32_t n)
{
    list_t *l = &M[i][layer][g];
    CHECK_OK(kv_compact(S, ID[i], layer, g, keep, n));
    for (uint32_t j = 0; j < n; j++) {
        memmove(l->k + (size_t)j * HD, l->k + (size_t)keep[j] * HD, HD * 4);
        memmove(l->v + (size_t)j * HD, l->v + (size_t)keep[j] * HD, HD * 4);
        l->pos[j] = l->pos[keep[j]];
    }
    l->len = n;
}

/* Read back every list of sequence i: values and positions bit exact. */
static void check_contents(int i)
{
    int bad = 0;
    for (uint32_t layer = 0; layer < NL; layer++)
        for (uint32_t g = 0; g < NKV; g++) {
            const list_t *l = &M[i][layer][g];
            uint32_t len = 0;
            CHECK_OK(kv_seq_len(S, ID[i], layer, g, &len));
            CHECK_EQ(len, l->len);
            if (len != l->len || !len)
                continue;
            float *k = malloc((size_t)len * HD * 4), *v = malloc((size_t)len * HD * 4);
            int32_t *pos = malloc((size_t)len * 4);
            if (!k || !v || !pos)
                exit(2);
            CHECK_OK(kv_read(S, ID[i], layer, g, 0, len, k, v, pos));
            bad |= memcmp(k, l->k, (size_t)len * HD * 4) != 0;
            bad |= memcmp(v, l->v, (size_t)len * HD * 4) != 0;
            bad |= memcmp(pos, l->pos, (size_t)len * 4) != 0;
            free(k);
            free(v);
            free(pos);
        }
    CHECK(bad == 0);
}

/* Store statistics against the mirror; exact_pages: no page is shared, so
 * every list holds ceil(len / 16) pages. */
static void check_stats_store(int exact_pages)
{
    kv_stats_t st = {.struct_size = sizeof st};
    uint64_t tokens = 0, pages = 0, n = 0;
    CHECK_OK(kv_store_stats(S, &st));
    for (int i = 0; i < MAXS; i++) {
        if (!live[i])
            continue;
        n++;
        for (int layer = 0; layer < NL; layer++)
            for (int g = 0; g < NKV; g++) {
                tokens += M[i][layer][g].len;
                pages += (M[i][layer][g].len + TPP - 1) / TPP;
            }
    }
    CHECK_EQ(st.n_seqs, n);
    CHECK_EQ(st.tokens, tokens);
    CHECK_EQ(st.fp16_bytes, tokens * 2 * HD * 2);
    CHECK_EQ(st.kv_bytes, st.pages_used * PAGE_BYTES);
    CHECK_EQ(st.pages_by_format[KV_FMT_FP16], st.pages_used);
    CHECK_EQ(st.bytes_by_format[KV_FMT_FP16], st.pages_used * PAGE_BYTES);
    CHECK_EQ(st.pages_used + st.pages_free, st.pages_capacity);
    CHECK(st.pages_peak >= st.pages_used);
    CHECK(st.pages_used <= pages);
    if (exact_pages)
        CHECK_EQ(st.pages_used, pages);
    CHECK(st.meta_bytes > 0 || n == 0);
    CHECK_OK(kv_store_check(S));
}

static uint64_t pages_used(void)
{
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    return st.pages_used;
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = NL;
    cfg.n_q_heads = NQ;
    cfg.n_kv_heads = NKV;
    cfg.head_dim = HD;
    cfg.host_pages = POOL;
    CHECK_OK(kv_store_create(&cfg, &S));
    if (!S)
        return kv_test_end();
    kv_config_t got;
    CHECK_OK(kv_store_config(S, &got));
    CHECK_EQ(got.page_bytes, PAGE_BYTES);
    CHECK(got.n_threads >= 1);
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.fp16_tokens_per_page, TPP);
    CHECK_EQ(st.pages_capacity, POOL);

    for (int i = 0; i < 3; i++) {
        CHECK_OK(kv_seq_create(S, &ID[i]));
        live[i] = 1;
    }

    /* prefill: seq 0 in two chunks (the second attends to the first) */
    for (uint32_t layer = 0; layer < NL; layer++) {
        append(0, layer, 300, 0);
        prefill(0, layer, 300, 32);
    }
    for (uint32_t layer = 0; layer < NL; layer++) {
        append(0, layer, 220, 0);
        prefill(0, layer, 220, 32);
        append(1, layer, 37, 0);
        prefill(1, layer, 37, 32);
        append(2, layer, 5, 1);
        prefill(2, layer, 5, 32);
    }
    check_stats_store(1);
    for (int i = 0; i < 3; i++)
        check_contents(i);

    /* decode */
    const int all3[3] = {0, 1, 2};
    for (int step = 0; step < 5; step++)
        decode_step(all3, 3);
    check_stats_store(1);

    /* parallel sampling: fork seq 1, decode both with different tokens */
    uint64_t before = pages_used();
    CHECK_OK(kv_seq_fork(S, ID[1], &ID[3]));
    live[3] = 1;
    CHECK(ID[3] != ID[0] && ID[3] != ID[1] && ID[3] != ID[2]);
    for (int layer = 0; layer < NL; layer++)
        for (int g = 0; g < NKV; g++)
            list_copy(&M[3][layer][g], &M[1][layer][g]);
    CHECK_EQ(pages_used(), before); /* every page shared */
    check_contents(3);
    const int all4[4] = {0, 1, 2, 3};
    for (int step = 0; step < 6; step++)
        decode_step(all4, 4);
    const int dup[3] = {3, 1, 3};
    decode(dup, 3, 2, 0.0f, NULL, 0);
    decode(all4, 4, 1, 0.05f, NULL, 0); /* explicit softmax scale */
    check_contents(1);
    check_contents(3);
    check_stats_store(0);

    /* H2O-like compaction of seq 0 at every layer and head: 4 sinks, the 64
     * tokens with the most attention in one decode, the last 16 */
    for (uint32_t layer = 0; layer < NL; layer++) {
        uint32_t stride = 0;
        for (int g = 0; g < NKV; g++)
            stride = M[0][layer][g].len > stride ? M[0][layer][g].len : stride;
        float *acc = calloc((size_t)NKV * stride, sizeof *acc);
        uint32_t *keep = malloc((size_t)stride * sizeof *keep);
        if (!acc || !keep)
            exit(2);
        const int one[1] = {0};
        decode(one, 1, layer, 0.0f, acc, stride);
        for (uint32_t g = 0; g < NKV; g++) {
            uint32_t len = M[0][layer][g].len, n = 0;
            char *sel = calloc(len, 1);
            if (!sel)
                exit(2);
            for (uint32_t t = 0; t < len; t++)
                sel[t] = t < 4 || t + 16 >= len;
            for (int h = 0; h < 64; h++) { /* top 64 of the middle */
                int best = -1;
                for (uint32_t t = 0; t < len; t++)
                    if (!sel[t] && (best < 0 || acc[(size_t)g * stride + t] >
                                                    acc[(size_t)g * stride + best]))
                        best = (int)t;
                if (best < 0)
                    break;
                sel[best] = 1;
            }
            for (uint32_t t = 0; t < len; t++)
                if (sel[t])
                    keep[n++] = t;
            CHECK_EQ(n, 4 + 64 + 16);
            compact(0, layer, g, keep, n);
            free(sel);
        }
        free(acc);
        free(keep);
    }
    check_contents(0);

    /* the fork's pages are shared with seq 1: compact a subset of one list */
    {
        list_t *l = &M[3][0][2];
        uint32_t keep[256], n = 0;
        for (uint32_t t = 0; t < l->len && n < 256; t++)
            if (kv_test_rand(&rng) % 3 == 0 || t + 1 == l->len)
                keep[n++] = t;
        compact(3, 0, 2, keep, n);
    }
    check_contents(1);
    check_contents(3);
    for (int step = 0; step < 3; step++)
        decode_step(all4, 4);
    check_contents(0);
    check_stats_store(0);

    /* free the fork: nothing is shared any more, page counts are exact */
    CHECK_OK(kv_seq_free(S, ID[3]));
    live[3] = 0;
    check_stats_store(1);
    decode_step(all3, 3);
    check_stats_store(1);

    for (int i = 0; i < 3; i++) {
        CHECK_OK(kv_seq_free(S, ID[i]));
        live[i] = 0;
    }
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_used, 0);
    CHECK_EQ(st.n_seqs, 0);
    CHECK_EQ(st.tokens, 0);
    CHECK_EQ(st.kv_bytes, 0);
    CHECK_OK(kv_store_check(S));
    kv_store_destroy(S);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    for (int i = 0; i < MAXS; i++)
        for (int layer = 0; layer < NL; layer++)
            for (int g = 0; g < NKV; g++)
                list_free(&M[i][layer][g]);
    printf("worst relative error: attention output %.3g, statistics %.3g "
           "(tolerance %g)\n",
           worst_out, worst_stats, TOL);
    return kv_test_end();
}
