/* SPDX-License-Identifier: MIT */
/*
 * test_api_formats.c — compressed formats through the public API
 * (kvpage.h, "compressed formats"): config kv_format/residual,
 * kv_seq_set_format, kv_seq_quantize, kv_seq_merge_layers, kv_format_note,
 * and the store's statistics and attention over mixed-format lists.
 *
 * Checks:
 *   - config: kv_format only FP16/INT4/INT2 (KV_EINVAL), residual a
 *     multiple of 16 in 16..65536 (KV_ERANGE), 0 = 128, INT formats whose
 *     pages hold no group and shapes whose INT2 pages would hold > 65535
 *     tokens refused;
 *   - notes: "FP16 = 16 bits/element", "INT4 g16 = 6 bits/element",
 *     "INT2 g16 = 4 bits/element", MERGED's note, NULL for unknown;
 *   - statistics: a (layer, head) of 4096 tokens as INT2 with R = 128 is
 *     >= 3.5x smaller than FP16 counting metadata (kv_store_stats); an
 *     INT2 page holds exactly 4x and an INT4 page 8/3x (page_bytes =
 *     192 * head_dim) the tokens of an FP16 page; bytes per format; the
 *     ratios are printed with the format notes;
 *   - NaN/Inf rejected by an INT2 store, nothing stored;
 *   - attention through kv_attn_decode (batch with a fork, statistics) and
 *     kv_attn_prefill (statistics from a row) over lists that mix FP16,
 *     INT4, INT2 and MERGED (both layers of a pair, FP16 and INT4
 *     directions) pages, GQA 6/2, equals dense double-precision attention
 *     over the values kv_read returns (relative error <= 1e-3 per row,
 *     statistics 1e-3); a control shows the INT lists really differ from
 *     the appended values;
 *   - merging: norms of every restored token equal the originals, gamma 0
 *     retains none, gamma 1 keeps all tokens in FP16 (no MERGED page),
 *     errors (layer 0, differing residuals, bad options, struct_size);
 *     repeated policy merges that retain everything (minicache gamma 1,
 *     prompt then decode tokens) keep the fill invariant, read back the
 *     originals (FP16-rounded) and leave a fork's shared retained pages
 *     unwritten; a repacking head beside a merging one keeps the heads'
 *     retention marks apart (page counts per format);
 *   - fork / copy-on-write / compaction / free across formats: the other
 *     sequence reads bit-identically, kv_store_check passes, every page and
 *     metadata byte comes back;
 *   - allocation failure (kv_fault_arm N = 1..) on set_format, quantize,
 *     merge and appends that convert: a failed call changes nothing
 *     (read-back, stats, kv_mem bytes); an append whose conversion failed
 *     stands and a later one catches up.
 */
#include <math.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "kv_test_snap.h"
#include "kv_test_attn.h"

#define NL 4
#define NQ 6
#define NKV 2
#define GROUP (NQ / NKV)
#define HD 64
#define TOL 1e-3

static uint64_t rng = 777;
static double worst_out, worst_stats;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        exit(2);
    return p;
}

static kv_store_t *open_store(uint32_t L, uint32_t nq, uint32_t nkv,
                              uint32_t page_bytes, uint32_t fmt, uint32_t R,
                              uint64_t pages)
{
    kv_config_t c = kv_config_default();
    c.n_layers = L;
    c.n_q_heads = nq;
    c.n_kv_heads = nkv;
    c.head_dim = HD;
    c.page_bytes = page_bytes;
    c.host_pages = pages;
    c.n_threads = 2;
    c.kv_format = fmt;
    c.residual = R;
    kv_store_t *s = NULL;
    int rc = kv_store_create(&c, &s);
    if (rc) {
        fprintf(stderr, "store: %s\n", kv_strerror(rc));
        exit(2);
    }
    return s;
}

/* Append n random tokens to (seq, layer). base_k/base_v (or NULL): values
 * of the pair's shallower layer the new ones are made similar to. out_k,
 * out_v (or NULL): receive the appended values. */
static void gen_append(kv_store_t *s, kv_seq_id_t q, uint32_t layer,
                       uint32_t n, uint32_t nkv, const float *base_k,
                       const float *base_v, float *out_k, float *out_v)
{
    size_t ne = (size_t)n * nkv * HD;
    float *k = xmalloc(ne * 4), *v = xmalloc(ne * 4);
    for (size_t i = 0; i < ne; i++) {
        k[i] = kv_test_randf(&rng) * 1.5f;
        v[i] = kv_test_randf(&rng);
        if (base_k) {
            k[i] = base_k[i] * 1.3f + 0.25f * k[i];
            v[i] = base_v[i] * 0.7f + 0.25f * v[i];
        }
    }
    CHECK_OK(kv_append(s, q, layer, n, KV_DTYPE_F32, k, v, NULL));
    if (out_k)
        memcpy(out_k, k, ne * 4);
    if (out_v)
        memcpy(out_v, v, ne * 4);
    free(k);
    free(v);
}

static void append_rand(kv_store_t *s, kv_seq_id_t q, uint32_t layer,
                        uint32_t n, uint32_t nkv)
{
    gen_append(s, q, layer, n, nkv, NULL, NULL, NULL, NULL);
}

/* Append n tokens to layers l0 and l0+1, the second similar to the first. */
static void append_pair(kv_store_t *s, kv_seq_id_t q, uint32_t l0, uint32_t n,
                        uint32_t nkv)
{
    size_t ne = (size_t)n * nkv * HD;
    float *k = xmalloc(ne * 4), *v = xmalloc(ne * 4);
    gen_append(s, q, l0, n, nkv, NULL, NULL, k, v);
    gen_append(s, q, l0 + 1, n, nkv, k, v, NULL, NULL);
    free(k);
    free(v);
}

/* ---- config and notes ------------------------------------------------------ */

static void test_config(void)
{
    kv_config_t c = kv_config_default();
    c.n_layers = 1, c.n_q_heads = 1, c.n_kv_heads = 1, c.head_dim = HD;
    c.host_pages = 4;
    kv_store_t *s = NULL;
    CHECK_EQ(c.kv_format, KV_FMT_FP16);
    CHECK_EQ(c.residual, 0);
    kv_config_t b = c;
    b.kv_format = KV_FMT_MERGED;
    CHECK_EQ(kv_store_create(&b, &s), KV_EINVAL);
    b.kv_format = 9;
    CHECK_EQ(kv_store_create(&b, &s), KV_EINVAL);
    b = c, b.residual = 24;
    CHECK_EQ(kv_store_create(&b, &s), KV_ERANGE);
    b.residual = 65536 + 16;
    CHECK_EQ(kv_store_create(&b, &s), KV_ERANGE);
    b = c, b.kv_format = KV_FMT_INT2, b.page_bytes = 512; /* no INT2 group */
    CHECK_EQ(kv_store_create(&b, &s), KV_ERANGE);
    b = c, b.head_dim = 16, b.page_bytes = 1u << 20; /* 65536 INT2 tokens */
    CHECK_EQ(kv_store_create(&b, &s), KV_ERANGE);
    CHECK(s == NULL);
    b = c, b.kv_format = KV_FMT_INT4;
    CHECK_OK(kv_store_create(&b, &s));
    if (s) {
        kv_config_t r;
        CHECK_OK(kv_store_config(s, &r));
        CHECK_EQ(r.residual, 128);
        CHECK_EQ(r.kv_format, KV_FMT_INT4);
        kv_store_destroy(s);
    }
    b = c, b.residual = 65536;
    s = NULL;
    CHECK_OK(kv_store_create(&b, &s));
    kv_store_destroy(s);
}

static void test_notes(void)
{
    CHECK(strcmp(kv_format_note(KV_FMT_FP16), "FP16 = 16 bits/element") == 0);
    CHECK(strcmp(kv_format_note(KV_FMT_INT4), "INT4 g16 = 6 bits/element") == 0);
    CHECK(strcmp(kv_format_note(KV_FMT_INT2), "INT2 g16 = 4 bits/element") == 0);
    const char *m = kv_format_note(KV_FMT_MERGED);
    CHECK(m && strstr(m, "MERGED") && strstr(m, "bits/element"));
    CHECK(kv_format_note(KV_FMT_COUNT) == NULL);
    CHECK(kv_format_note((kv_format_t)99) == NULL);
}

/* ---- statistics ---------------------------------------------------------------- */

static double ratio_of(const kv_stats_t *st)
{
    return (double)st->fp16_bytes / (double)(st->kv_bytes + st->meta_bytes);
}

static void test_ratio(void)
{
    /* one (layer, head), 4096 tokens, INT2, R = 128, default 4 KiB pages */
    kv_store_t *s = open_store(1, 1, 1, 0, KV_FMT_INT2, 128, 256);
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(s, &q));
    append_rand(s, q, 0, 1000, 1); /* prefill */
    for (int t = 0; t < 3096; t++)              /* decode */
        append_rand(s, q, 0, 1, 1);
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ(st.tokens, 4096);
    CHECK_EQ(st.pages_by_format[KV_FMT_INT2], 64);
    CHECK_EQ(st.pages_by_format[KV_FMT_FP16], 0);
    CHECK_EQ(st.tokens / st.pages_by_format[KV_FMT_INT2],
             4 * st.fp16_tokens_per_page); /* exactly 4x per page */
    CHECK_EQ(st.bytes_by_format[KV_FMT_INT2], 64 * st.page_bytes);
    CHECK_EQ(st.kv_bytes, st.bytes_by_format[KV_FMT_INT2]);
    CHECK_EQ(st.fp16_bytes, 4096ull * 2 * HD * 2);
    double r = ratio_of(&st);
    printf("INT2 4096 tokens, R 128: kv %llu + meta %llu bytes vs FP16 %llu: "
           "%.2fx smaller (%s)\n",
           (unsigned long long)st.kv_bytes, (unsigned long long)st.meta_bytes,
           (unsigned long long)st.fp16_bytes, r, kv_format_note(KV_FMT_INT2));
    CHECK(r >= 3.5);
    CHECK(r < 4.0); /* metadata counted: never the naive 4x (nor 8x) */
    /* the 128-token residual of a 4100-token list stays FP16 */
    append_rand(s, q, 0, 4, 1);
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ(st.pages_by_format[KV_FMT_FP16], 1);
    CHECK(ratio_of(&st) >= 3.5);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);

    /* INT4 at page_bytes = 192 * head_dim: 128 tokens per page = 8/3 x 48 */
    s = open_store(1, 1, 1, 192 * HD, KV_FMT_INT4, 128, 256);
    CHECK_OK(kv_seq_create(s, &q));
    append_rand(s, q, 0, 4096, 1);
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ(st.fp16_tokens_per_page, 48);
    CHECK_EQ(st.pages_by_format[KV_FMT_INT4], 32);
    CHECK_EQ(3 * (st.tokens / st.pages_by_format[KV_FMT_INT4]),
             8 * st.fp16_tokens_per_page);
    r = ratio_of(&st);
    printf("INT4 4096 tokens, 12 KiB pages: %.2fx smaller (%s)\n", r,
           kv_format_note(KV_FMT_INT4));
    CHECK(r >= 2.5 && r < 8.0 / 3.0);
    kv_store_destroy(s);

    /* MERGED: a layer pair of 2048 tokens, merged pages counted once */
    s = open_store(2, 1, 1, 0, KV_FMT_FP16, 0, 1024);
    CHECK_OK(kv_seq_create(s, &q));
    append_pair(s, q, 0, 2048, 1);
    kv_merge_opts_t o = kv_merge_opts_default();
    CHECK_OK(kv_seq_merge_layers(s, q, 1, &o));
    CHECK_OK(kv_store_stats(s, &st));
    CHECK(st.pages_by_format[KV_FMT_MERGED] > 0);
    CHECK_EQ(st.kv_bytes, (st.pages_by_format[KV_FMT_MERGED] +
                           st.pages_by_format[KV_FMT_FP16]) * st.page_bytes);
    r = ratio_of(&st);
    printf("MERGED pair, 2048 tokens, gamma 0.05: %llu merged + %llu FP16 "
           "pages, %.2fx smaller (%s)\n",
           (unsigned long long)st.pages_by_format[KV_FMT_MERGED],
           (unsigned long long)st.pages_by_format[KV_FMT_FP16], r,
           kv_format_note(KV_FMT_MERGED));
    CHECK(r > 1.5 && r < 2.0);
    o.dir_format = KV_FMT_INT4;
    kv_seq_id_t q2;
    CHECK_OK(kv_seq_create(s, &q2));
    append_pair(s, q2, 0, 2048, 1);
    kv_stats_t st0 = st;
    CHECK_OK(kv_seq_merge_layers(s, q2, 1, &o));
    CHECK_OK(kv_store_stats(s, &st));
    double r4 = (double)(st.fp16_bytes - st0.fp16_bytes) /
                (double)(st.kv_bytes - st0.kv_bytes);
    printf("MERGED pair, INT4 directions: %.2fx smaller (pages only)\n", r4);
    CHECK(r4 > 3.0);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

/* ---- errors ------------------------------------------------------------------- */

static void test_errors(void)
{
    kv_store_t *s = open_store(3, 2, 2, 0, KV_FMT_INT2, 32, 128);
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(s, &q));
    CHECK_EQ(kv_seq_set_format(NULL, q, 0, KV_FMT_INT4), KV_EINVAL);
    CHECK_EQ(kv_seq_set_format(s, q + 1, 0, KV_FMT_INT4), KV_ENOENT);
    CHECK_EQ(kv_seq_set_format(s, q, 3, KV_FMT_INT4), KV_ERANGE);
    CHECK_EQ(kv_seq_set_format(s, q, 0, KV_FMT_MERGED), KV_EINVAL);
    CHECK_EQ(kv_seq_set_format(s, q, 0, (kv_format_t)7), KV_EINVAL);
    CHECK_EQ(kv_seq_quantize(NULL, q, 0, 0), KV_EINVAL);
    CHECK_EQ(kv_seq_quantize(s, q + 1, 0, 0), KV_ENOENT);
    CHECK_EQ(kv_seq_quantize(s, q, 3, 0), KV_ERANGE);
    kv_merge_opts_t o = kv_merge_opts_default();
    CHECK_EQ(o.struct_size, sizeof o);
    CHECK(o.t == 0.6f && o.gamma == 0.05f && o.dir_format == KV_FMT_FP16);
    CHECK_EQ(kv_seq_merge_layers(NULL, q, 1, &o), KV_EINVAL);
    CHECK_EQ(kv_seq_merge_layers(s, q + 1, 1, &o), KV_ENOENT);
    CHECK_EQ(kv_seq_merge_layers(s, q, 0, &o), KV_ERANGE);
    CHECK_EQ(kv_seq_merge_layers(s, q, 3, &o), KV_ERANGE);
    kv_merge_opts_t b = o;
    b.struct_size = 8;
    CHECK_EQ(kv_seq_merge_layers(s, q, 1, &b), KV_EVERSION);
    b = o, b.t = NAN;
    CHECK_EQ(kv_seq_merge_layers(s, q, 1, &b), KV_EINVAL);
    b = o, b.gamma = 1.01f;
    CHECK_EQ(kv_seq_merge_layers(s, q, 1, &b), KV_EINVAL);
    b = o, b.dir_format = KV_FMT_INT2;
    CHECK_EQ(kv_seq_merge_layers(s, q, 1, &b), KV_EINVAL);
    /* NaN / Inf: refused by an INT2 store, nothing stored */
    float k[2 * HD] = {0}, v[2 * HD] = {0};
    k[70] = NAN;
    CHECK_EQ(kv_append(s, q, 0, 1, KV_DTYPE_F32, k, v, NULL), KV_ERANGE);
    k[70] = 0, v[3] = INFINITY;
    CHECK_EQ(kv_append(s, q, 0, 1, KV_DTYPE_F32, k, v, NULL), KV_ERANGE);
    v[3] = 70000.0f;
    CHECK_EQ(kv_append(s, q, 0, 1, KV_DTYPE_F32, k, v, NULL), KV_ERANGE);
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(s, &st));
    CHECK_EQ(st.tokens, 0);
    CHECK_EQ(st.pages_used, 0);
    /* merge needs equal residuals */
    append_rand(s, q, 0, 10, 2);
    CHECK_EQ(kv_seq_merge_layers(s, q, 1, &o), KV_ESTATE);
    append_rand(s, q, 1, 9, 2);
    CHECK_EQ(kv_seq_merge_layers(s, q, 1, &o), KV_ESTATE);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

/* ---- attention over mixed formats ---------------------------------------------- */

static kv_store_t *S;

/* Read a whole list (decoded) into fresh arrays. */
static uint32_t read_list(kv_seq_id_t q, uint32_t l, uint32_t h, float **k,
                          float **v, int32_t **pos)
{
    uint32_t n;
    CHECK_OK(kv_seq_len(S, q, l, h, &n));
    *k = xmalloc((size_t)n * HD * 4);
    *v = xmalloc((size_t)n * HD * 4);
    if (pos)
        *pos = xmalloc((size_t)n * 4);
    CHECK_OK(kv_read(S, q, l, h, 0, n, *k, *v, pos ? *pos : NULL));
    return n;
}

/* Dense attention of one query row (all q heads) over tokens [0, lim[g]) of
 * each kv head's decoded list; out checked, probabilities added to psum. */
static void ref_row(float *const *lk, float *const *lv, const uint32_t *lim,
                    const float *q, const float *out, double *const *psum,
                    const char *what)
{
    const double scale = 1.0 / sqrt((double)HD);
    for (uint32_t h = 0; h < NQ; h++) {
        uint32_t g = h / GROUP;
        double o[HD];
        kv_test_dense_row(lk[g], lv[g], HD, lim[g], q + (size_t)h * HD, scale, o,
                          psum ? psum[g] : NULL);
        kv_test_check_row(out + (size_t)h * HD, o, HD, TOL, &worst_out, what, h);
    }
}

static void check_stats(const float *st, uint32_t stride, double *const *psum,
                        const uint32_t *len, double count, const char *what)
{
    int bad = 0;
    for (uint32_t g = 0; g < NKV; g++) {
        double total = 0;
        for (uint32_t t = 0; t < len[g]; t++) {
            double a = st[(size_t)g * stride + t], r = psum[g][t];
            total += a;
            worst_stats = fmax(worst_stats, fabs(a - r) / fmax(r, 1e-6));
            if (!(fabs(a - r) <= TOL * r + 1e-7 * count) && bad++ < 3)
                fprintf(stderr, "%s: stats g %u t %u: %g vs %g\n", what, g, t,
                        a, r);
        }
        if (!(fabs(total - count) <= 1e-3 * count) && bad++ < 3)
            fprintf(stderr, "%s: stats sum %g vs %g\n", what, total, count);
    }
    CHECK(bad == 0);
}

/* Decode at every layer for a batch, checked against dense over kv_read. */
static void decode_check(const kv_seq_id_t *ids, uint32_t batch, const char *what)
{
    const uint32_t stride = 2048;
    for (uint32_t l = 0; l < NL; l++) {
        float *q = xmalloc((size_t)batch * NQ * HD * 4);
        float *out = xmalloc((size_t)batch * NQ * HD * 4);
        float **stp = xmalloc(batch * sizeof *stp);
        for (size_t i = 0; i < (size_t)batch * NQ * HD; i++)
            q[i] = kv_test_randf(&rng) * 2.0f;
        for (uint32_t b = 0; b < batch; b++)
            stp[b] = b == 1 ? NULL : xmalloc((size_t)NKV * stride * 4);
        kv_decode_t a = {.layer = l, .batch = batch, .seqs = ids, .q = q,
                         .out = out, .stats = stp, .stats_stride = stride};
        CHECK_OK(kv_attn_decode(S, &a));
        for (uint32_t b = 0; b < batch; b++) {
            float *lk[NKV], *lv[NKV];
            uint32_t len[NKV];
            double *ps[NKV];
            for (uint32_t g = 0; g < NKV; g++) {
                len[g] = read_list(ids[b], l, g, &lk[g], &lv[g], NULL);
                ps[g] = calloc(len[g] + 1, sizeof(double));
            }
            char w[64];
            snprintf(w, sizeof w, "%s decode layer %u seq %u", what, l, b);
            ref_row(lk, lv, len, q + (size_t)b * NQ * HD,
                    out + (size_t)b * NQ * HD, ps, w);
            if (stp[b])
                check_stats(stp[b], stride, ps, len, GROUP, w);
            for (uint32_t g = 0; g < NKV; g++)
                free(lk[g]), free(lv[g]), free(ps[g]);
        }
        for (uint32_t b = 0; b < batch; b++)
            free(stp[b]);
        free(stp), free(q), free(out);
    }
}

/* Prefill n_new rows at every layer of q (tokens already appended). */
static void prefill_check(kv_seq_id_t sq, uint32_t n_new, uint32_t row0)
{
    const uint32_t stride = 2048;
    for (uint32_t l = 0; l < NL; l++) {
        float *q = xmalloc((size_t)n_new * NQ * HD * 4);
        float *out = xmalloc((size_t)n_new * NQ * HD * 4);
        float *st = xmalloc((size_t)NKV * stride * 4);
        for (size_t i = 0; i < (size_t)n_new * NQ * HD; i++)
            q[i] = kv_test_randf(&rng) * 2.0f;
        kv_prefill_t a = {.layer = l, .seq = sq, .n_new = n_new, .q = q,
                          .out = out, .stats = st, .stats_stride = stride,
                          .stats_row0 = row0};
        CHECK_OK(kv_attn_prefill(S, &a));
        float *lk[NKV], *lv[NKV];
        uint32_t len[NKV], lim[NKV];
        double *ps[NKV];
        for (uint32_t g = 0; g < NKV; g++) {
            len[g] = read_list(sq, l, g, &lk[g], &lv[g], NULL);
            ps[g] = calloc(len[g] + 1, sizeof(double));
        }
        for (uint32_t r = 0; r < n_new; r++) {
            for (uint32_t g = 0; g < NKV; g++)
                lim[g] = len[g] - n_new + r + 1;
            char w[64];
            snprintf(w, sizeof w, "prefill layer %u row %u", l, r);
            ref_row(lk, lv, lim, q + (size_t)r * NQ * HD,
                    out + (size_t)r * NQ * HD, r >= row0 ? ps : NULL, w);
        }
        check_stats(st, stride, ps, len, (double)GROUP * (n_new - row0),
                    "prefill");
        for (uint32_t g = 0; g < NKV; g++)
            free(lk[g]), free(lv[g]), free(ps[g]);
        free(q), free(out), free(st);
    }
}

/* Tokens of every list of q, bit for bit (for "unchanged" checks;
 * kv_test_snap.h); SL: list (l, g) of a snapshot. */
#define SL(s, l, g) kv_test_seq_list(&(s), (l), (g))

static void shot_take(kv_seq_id_t q, kv_test_seq_t *s)
{
    CHECK_OK(kv_test_seq_take(S, q, s));
}

static double vnorm(const float *x)
{
    double s = 0;
    for (int d = 0; d < HD; d++)
        s += (double)x[d] * x[d];
    return sqrt(s);
}

static void test_attention(void)
{
    uint64_t mem0 = kv_mem_live_bytes();
    /* layer 0: INT2 (store default), 1: INT4 then INT2, 2-3: a merged pair */
    S = open_store(NL, NQ, NKV, 0, KV_FMT_INT2, 32, 4096);
    kv_seq_id_t ids[3];
    CHECK_OK(kv_seq_create(S, &ids[0]));
    CHECK_OK(kv_seq_create(S, &ids[1]));
    float *orig_k = xmalloc((size_t)150 * NKV * HD * 4);
    for (int i = 0; i < 2; i++) {
        kv_seq_id_t q = ids[i];
        CHECK_OK(kv_seq_set_format(S, q, 1, KV_FMT_INT4));
        CHECK_OK(kv_seq_set_format(S, q, 2, KV_FMT_FP16));
        CHECK_OK(kv_seq_set_format(S, q, 3, KV_FMT_FP16));
        gen_append(S, q, 0, 150 + 17 * (uint32_t)i, NKV, NULL, NULL,
                   i ? NULL : orig_k, NULL);
        append_rand(S, q, 1, 80, NKV);
        CHECK_OK(kv_seq_set_format(S, q, 1, KV_FMT_INT2));
        append_rand(S, q, 1, 70 + 17 * (uint32_t)i, NKV);
        append_pair(S, q, 2, 150 + 17 * (uint32_t)i, NKV);
    }
    /* control: the INT2 layer holds quantized, not the appended values */
    {
        float *k, *v;
        uint32_t n = read_list(ids[0], 0, 0, &k, &v, NULL);
        double worst = 0;
        for (uint32_t t = 0; t < 128; t++) /* converted: R = 32 */
            for (int d = 0; d < HD; d++)
                worst = fmax(worst, fabs(k[t * HD + d] -
                                         orig_k[(size_t)t * NKV * HD + d]));
        CHECK_EQ(n, 150);
        CHECK(worst > 0.05); /* INT2 error ~ range/6 >> 1e-3 */
        CHECK(worst < 1.5 * 3 / 6 + 0.01); /* <= scale/2 of a [-1.5,1.5] */
        free(k), free(v);
    }
    free(orig_k);
    kv_merge_opts_t o = kv_merge_opts_default();
    o.keep_fp16 = 7;
    CHECK_OK(kv_seq_merge_layers(S, ids[0], 3, &o));
    o.dir_format = KV_FMT_INT4;
    o.keep_fp16 = 0;
    CHECK_OK(kv_seq_merge_layers(S, ids[1], 3, &o));
    CHECK_OK(kv_store_check(S));
    CHECK_OK(kv_seq_fork(S, ids[0], &ids[2]));
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    for (int f = 0; f < KV_FMT_COUNT; f++)
        CHECK(st.pages_by_format[f] > 0);
    decode_check(ids, 3, "mixed");

    /* decode steps: one token per layer per sequence, merge as we go */
    kv_test_seq_t before, after;
    for (int step = 0; step < 40; step++) {
        for (int i = 0; i < 3; i++) {
            append_rand(S, ids[i], 0, 1, NKV);
            append_rand(S, ids[i], 1, 1, NKV);
            append_pair(S, ids[i], 2, 1, NKV);
        }
        if (step == 20) {
            shot_take(ids[2], &before);
            o = kv_merge_opts_default();
            CHECK_OK(kv_seq_merge_layers(S, ids[0], 3, &o)); /* parent only */
            shot_take(ids[2], &after);
            CHECK(kv_test_seq_same(&before, &after)); /* the fork is untouched */
            kv_test_seq_free(&before), kv_test_seq_free(&after);
        }
        if (step % 13 == 0)
            decode_check(ids, 3, "steps");
    }
    CHECK_OK(kv_store_check(S));
    decode_check(ids, 3, "after steps");

    /* prefill over mixed history */
    for (uint32_t l = 0; l < NL; l += 2) {
        if (l == 2)
            append_pair(S, ids[1], 2, 45, NKV);
        else {
            append_rand(S, ids[1], 0, 45, NKV);
            append_rand(S, ids[1], 1, 45, NKV);
        }
    }
    prefill_check(ids[1], 45, 5);

    /* compaction of one merged layer of the fork; the parent unchanged */
    shot_take(ids[0], &before);
    for (uint32_t g = 0; g < NKV; g++) {
        uint32_t n;
        CHECK_OK(kv_seq_len(S, ids[2], 3, g, &n));
        uint32_t *keep = xmalloc(n * 4), nk = 0;
        for (uint32_t i = 0; i < n; i++)
            if (i < 4 || i % 2)
                keep[nk++] = i;
        CHECK_OK(kv_compact(S, ids[2], 3, g, keep, nk));
        free(keep);
    }
    shot_take(ids[0], &after);
    CHECK(kv_test_seq_same(&before, &after));
    kv_test_seq_free(&before), kv_test_seq_free(&after);
    CHECK_OK(kv_store_check(S));
    decode_check(ids, 3, "after compaction");

    /* norms of merged tokens of seq 1 (INT4 directions) vs a re-read of the
     * original correlated data is not available here: check instead that
     * no value is NaN and both layers keep equal positions */
    for (uint32_t g = 0; g < NKV; g++) {
        float *k2, *v2, *k3, *v3;
        int32_t *p2, *p3;
        uint32_t n2 = read_list(ids[1], 2, g, &k2, &v2, &p2);
        uint32_t n3 = read_list(ids[1], 3, g, &k3, &v3, &p3);
        CHECK_EQ(n2, n3);
        CHECK(memcmp(p2, p3, n2 * 4) == 0);
        int finite = 1;
        for (size_t i = 0; i < (size_t)n2 * HD; i++)
            finite &= isfinite(k2[i]) && isfinite(v3[i]);
        CHECK(finite);
        free(k2), free(v2), free(k3), free(v3), free(p2), free(p3);
    }

    for (int i = 0; i < 3; i++)
        CHECK_OK(kv_seq_free(S, ids[i]));
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_used, 0);
    CHECK_OK(kv_store_check(S));
    kv_store_destroy(S);
    S = NULL;
    CHECK_EQ(kv_mem_live_bytes(), mem0);
    printf("worst relative error: output %.2e, stats %.2e\n", worst_out,
           worst_stats);
}

/* Merge through the API: norms, gamma edge cases. */
static void test_merge_api(void)
{
    S = open_store(NL, NQ, NKV, 0, KV_FMT_FP16, 0, 2048);
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(S, &q));
    append_pair(S, q, 0, 100, NKV);
    append_pair(S, q, 2, 100, NKV);
    kv_test_seq_t orig;
    shot_take(q, &orig);
    kv_merge_opts_t o = kv_merge_opts_default();
    o.gamma = 0.0f; /* merge everything */
    CHECK_OK(kv_seq_merge_layers(S, q, 1, &o));
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    /* 100 tokens per head, 15 per FP16-direction page, 2 heads: 14 pages;
     * layers 0-1 hold no FP16 page any more, layers 2-3 do (7 each) */
    CHECK_EQ(st.pages_by_format[KV_FMT_MERGED], 14);
    CHECK_EQ(st.pages_by_format[KV_FMT_FP16], 2 * 2 * 7);
    o.gamma = 1.0f; /* keep all but tokens minimal in K and V */
    CHECK_OK(kv_seq_merge_layers(S, q, 3, &o));
    CHECK_OK(kv_store_stats(S, &st));
    CHECK(st.pages_by_format[KV_FMT_MERGED] <= 14 + 2);
    kv_test_seq_t now;
    shot_take(q, &now);
    int norms = 1, exact = 0;
    for (uint32_t l = 0; l < NL; l++)
        for (uint32_t g = 0; g < NKV; g++)
            for (uint32_t i = 0; i < SL(now, l, g)->n; i++) {
                /* token with the same position in the original */
                int32_t p = SL(now, l, g)->pos[i];
                const float *a = SL(orig, l, g)->k + (size_t)p * HD;
                const float *b = SL(now, l, g)->k + (size_t)i * HD;
                double na = vnorm(a), nb = vnorm(b);
                norms &= fabs(na - nb) <= 1e-5 * na;
                na = vnorm(SL(orig, l, g)->v + (size_t)p * HD);
                nb = vnorm(SL(now, l, g)->v + (size_t)i * HD);
                norms &= fabs(na - nb) <= 1e-5 * na;
                if (l >= 2)
                    exact += memcmp(a, b, HD * 4) == 0;
            }
    CHECK(norms);
    /* gamma 1: all but at most one token per head retained, bit-exact */
    CHECK(exact >= 2 * NKV * (100 - 1));
    CHECK_OK(kv_store_check(S));
    kv_test_seq_free(&orig), kv_test_seq_free(&now);
    kv_store_destroy(S);
    S = NULL;
}

/* MiniCache policy with gamma 1 (every token retained) merging the prompt,
 * then the decode tokens every 16 steps: each merge that adds no MERGED
 * entry must repack the previous partly filled RETAINED page, so the fill
 * invariant holds (kv_store_check), the retained tokens read back
 * (FP16-rounded) at their positions, and a fork sharing those pages is not
 * written. */
#define PK_PROMPT 40
#define PK_STEPS 16
#define PK_N (PK_PROMPT + PK_STEPS)

static void pk_append(kv_seq_id_t q, uint32_t n, uint32_t t0, float *ok,
                      float *ov)
{
    size_t ne = (size_t)n * NKV * HD, row = (size_t)NKV * HD;
    float *k = xmalloc(ne * 4), *v = xmalloc(ne * 4);
    for (uint32_t pair = 0; pair < NL; pair += 2) {
        gen_append(S, q, pair, n, NKV, NULL, NULL, k, v);
        memcpy(ok + ((size_t)pair * PK_N + t0) * row, k, ne * 4);
        memcpy(ov + ((size_t)pair * PK_N + t0) * row, v, ne * 4);
        gen_append(S, q, pair + 1, n, NKV, k, v, NULL, NULL);
    }
    free(k);
    free(v);
}

/* 1 if y ([HD]) is x ([HD]) rounded to FP16 (half an ulp, 2^-11). */
static int fp16_of(const float *x, const float *y)
{
    for (uint32_t c = 0; c < HD; c++)
        if (fabsf(x[c] - y[c]) > fabsf(x[c]) * 0x1p-11f + 1e-7f)
            return 0;
    return 1;
}

static void test_merge_pack(void)
{
    S = open_store(NL, NQ, NKV, 0, KV_FMT_FP16, 0, 2048);
    kv_policy_t *pol = NULL;
    char err[128];
    CHECK_OK(kv_policy_parse("minicache:from=0,gamma=1", &pol, err,
                             sizeof err));
    kv_seq_id_t q, f;
    CHECK_OK(kv_seq_create(S, &q));
    CHECK_OK(kv_seq_set_policy(S, q, pol));
    size_t row = (size_t)NKV * HD, all = (size_t)NL * PK_N * row;
    float *ok = xmalloc(all * 4), *ov = xmalloc(all * 4);
    pk_append(q, PK_PROMPT, 0, ok, ov);
    CHECK_OK(kv_seq_prefill_end(S, q));
    CHECK_OK(kv_store_check(S));
    CHECK_OK(kv_seq_fork(S, q, &f));
    kv_test_seq_t fork0, fork1, now;
    shot_take(f, &fork0);
    int bad = 0;
    for (uint32_t st = 0; st < PK_STEPS; st++) {
        pk_append(q, 1, PK_PROMPT + st, ok, ov);
        CHECK_OK(kv_seq_step_end(S, q));
        bad += kv_store_check(S) != KV_OK;
    }
    CHECK_EQ(bad, 0);
    shot_take(f, &fork1);
    CHECK(kv_test_seq_same(&fork0, &fork1));
    /* shallower layers of each pair: every retained token is its original;
     * (FP16-rounded); at most one merged token per head and merge */
    shot_take(q, &now);
    uint32_t exact = 0, total = 0;
    for (uint32_t l = 0; l < NL; l += 2)
        for (uint32_t g = 0; g < NKV; g++)
            for (uint32_t i = 0; i < SL(now, l, g)->n; i++) {
                int32_t p = SL(now, l, g)->pos[i];
                const float *a = ok + ((size_t)l * PK_N + p) * row + g * HD;
                const float *b = ov + ((size_t)l * PK_N + p) * row + g * HD;
                total++;
                exact += fp16_of(a, SL(now, l, g)->k + (size_t)i * HD) &&
                         fp16_of(b, SL(now, l, g)->v + (size_t)i * HD);
            }
    CHECK_EQ(total, (NL / 2) * NKV * PK_N);
    CHECK(exact + 2u * (NL / 2) * NKV >= total);
    kv_test_seq_free(&fork0), kv_test_seq_free(&fork1), kv_test_seq_free(&now);
    free(ok), free(ov);
    kv_policy_destroy(pol);
    kv_store_destroy(S);
    S = NULL;
}

/* Direct merges, gamma 1, heads side by side. Layer 0 holds unit vectors
 * e0; layer 1 rotates them toward e1 by angles chosen per token. Head 0:
 * the newest 8 tokens of each call are zero in layer 1 (theta 0 = d_min
 * for K and V: merged), the others at growing angles (retained). Head 1:
 * K angles grow and V angles shrink with the token, so no token is
 * minimal in both (all retained). The second merge repacks head 1's partly
 * filled RETAINED page while head 0 adds a MERGED entry; each head must
 * keep its own retention marks (kv_store_check, pages per format); a
 * failed allocation during the repacking merge changes nothing. */
static void pk_rot(float *x, double a, float scale)
{
    memset(x, 0, HD * sizeof *x);
    x[0] = (float)cos(a) * scale;
    x[1] = (float)sin(a) * scale;
}

/* Append n tokens (positions t0...) to layers 0 and 1 of q: layer 0 holds
 * e0 in every head; in layer 1, head 0's newest 8 tokens are zero (theta 0:
 * merged) and the others at growing angles 0.1 + 0.02 t (retained); head 1
 * likewise if `alike`, else K angles grow and V angles shrink with t (all
 * retained). */
static void pk_append_rot(kv_seq_id_t q, uint32_t n, uint32_t t0, int alike)
{
    size_t ne = (size_t)n * NKV * HD;
    float *k = xmalloc(ne * 4), *v = xmalloc(ne * 4);
    for (uint32_t i = 0; i < n * NKV; i++) {
        pk_rot(k + (size_t)i * HD, 0.0, 1.0f);
        pk_rot(v + (size_t)i * HD, 0.0, 0.5f);
    }
    CHECK_OK(kv_append(S, q, 0, n, KV_DTYPE_F32, k, v, NULL));
    for (uint32_t i = 0; i < n; i++) {
        double a = 0.1 + 0.02 * (t0 + i), b = 1.5 - 0.02 * (t0 + i);
        float sc = i >= n - 8 ? 0.0f : 1.0f;
        for (uint32_t g = 0; g < NKV; g++) {
            float *kg = k + ((size_t)i * NKV + g) * HD, *vg = v + ((size_t)i * NKV + g) * HD;
            int mixed = g == 0 || alike;
            pk_rot(kg, a, 2.0f * (mixed ? sc : 1.0f));
            pk_rot(vg, mixed ? a : b, 0.7f * (mixed ? sc : 1.0f));
        }
    }
    CHECK_OK(kv_append(S, q, 1, n, KV_DTYPE_F32, k, v, NULL));
    free(k), free(v);
}

static void test_merge_pack_heads(void)
{
    S = open_store(NL, NQ, NKV, 0, KV_FMT_FP16, 0, 2048);
    kv_seq_id_t q;
    CHECK_OK(kv_seq_create(S, &q));
    kv_merge_opts_t o = kv_merge_opts_default();
    o.gamma = 1.0f;
    const uint32_t parts[2] = {PK_PROMPT, PK_STEPS};
    for (uint32_t r = 0, t0 = 0; r < 2; t0 += parts[r++]) {
        pk_append_rot(q, parts[r], t0, 0);
        int rc = KV_ENOMEM, fails = 0;
        for (uint64_t f = 1; rc == KV_ENOMEM && f < 100; f++) {
            kv_test_seq_t before, after;
            shot_take(q, &before);
            uint64_t live = kv_mem_live_bytes();
            kv_fault_arm(r ? f : 0); /* the repacking merge: failures */
            rc = kv_seq_merge_layers(S, q, 1, &o);
            kv_fault_arm(0);
            if (rc == KV_ENOMEM) { /* changed nothing */
                fails++;
                shot_take(q, &after);
                CHECK(kv_test_seq_same(&before, &after));
                CHECK_EQ(kv_mem_live_bytes(), live);
                kv_test_seq_free(&after);
            }
            kv_test_seq_free(&before);
        }
        CHECK_OK(rc);
        CHECK(r == 0 || fails >= 2);
        CHECK_OK(kv_store_check(S));
    }
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    /* per layer, 16-token FP16 pages: head 0 [M8][R16 R16][M8][R8],
     * head 1 [R16 R16 R8] then repacked [R16 R16][R16 R8] */
    CHECK_EQ(st.pages_by_format[KV_FMT_FP16], 2 * (3 + 4));
    CHECK_EQ(st.pages_by_format[KV_FMT_MERGED], 2);
    kv_store_destroy(S);
    S = NULL;
}

/* A merge that adds MERGED entries packs the previous segment's partly
 * filled pages. Both heads as head 0 above (the newest 8 tokens of each
 * call merged, the others retained), two calls of p0 then p1 tokens:
 *   36, 12: [M8][R16 R12], then [M8][R16][M8][R16] (the R12 repacked; the
 *           M8 is not, a full R16 separates it): 2 MERGED pages per head,
 *           2 FP16 per list, where without packing [M8][R16 R12][M8][R4];
 *   20, 12: [M8][R12], then [M16][R16] (both repacked): 1 and 1, where
 *           without packing [M8][R12][M8][R4].
 * (INT4 directions: 36 slots a MERGED page.)
 * Repacked tokens move: every position 0..N-1 still appears once per list,
 * retained tokens read back (FP16) at their positions, merged ones restore
 * to zero vectors; a fork sharing the old pages reads as before. */
static void merge_pack_mixed(uint32_t p0, uint32_t p1, uint32_t want_fp16,
                             uint32_t want_merged)
{
    S = open_store(NL, NQ, NKV, 0, KV_FMT_FP16, 0, 2048);
    kv_seq_id_t q, f = 0;
    CHECK_OK(kv_seq_create(S, &q));
    kv_merge_opts_t o = kv_merge_opts_default();
    o.gamma = 1.0f;
    o.dir_format = KV_FMT_INT4; /* 36 slots a page: the two calls' 16 fit one */
    const uint32_t parts[2] = {p0, p1}, N = p0 + p1;
    CHECK(N <= 48);
    kv_test_seq_t fork0, fork1, now;
    for (uint32_t r = 0, t0 = 0; r < 2; t0 += parts[r++]) {
        pk_append_rot(q, parts[r], t0, 1);
        CHECK_OK(kv_seq_merge_layers(S, q, 1, &o));
        CHECK_OK(kv_store_check(S));
        if (r == 0) {
            CHECK_OK(kv_seq_fork(S, q, &f));
            shot_take(f, &fork0);
        }
    }
    shot_take(f, &fork1);
    CHECK(kv_test_seq_same(&fork0, &fork1));
    shot_take(q, &now);
    uint32_t seen[2][48] = {{0}}, exact = 0, zero = 0;
    for (uint32_t g = 0; g < NKV; g++)
        for (uint32_t i = 0; i < SL(now, 1, g)->n; i++) {
            int32_t p = SL(now, 1, g)->pos[i];
            if (p < 0 || p >= (int32_t)N)
                continue;
            seen[g][p]++;
            uint32_t t = (uint32_t)p;
            int merged = (t >= p0 - 8 && t < p0) || t >= N - 8;
            float ek[HD], ev[HD];
            pk_rot(ek, 0.1 + 0.02 * t, merged ? 0.0f : 2.0f);
            pk_rot(ev, 0.1 + 0.02 * t, merged ? 0.0f : 0.7f);
            const float *k = SL(now, 1, g)->k + (size_t)i * HD;
            const float *v = SL(now, 1, g)->v + (size_t)i * HD;
            if (merged)
                zero += vnorm(k) < 1e-6 && vnorm(v) < 1e-6;
            else
                exact += fp16_of(ek, k) && fp16_of(ev, v);
        }
    uint32_t once = 0;
    for (uint32_t g = 0; g < NKV; g++)
        for (uint32_t t = 0; t < N; t++)
            once += seen[g][t] == 1;
    CHECK_EQ(once, NKV * N);
    CHECK_EQ(exact, NKV * (N - 16));
    CHECK_EQ(zero, NKV * 16);
    kv_test_seq_free(&fork0), kv_test_seq_free(&fork1), kv_test_seq_free(&now);
    CHECK_OK(kv_seq_free(S, f));
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_by_format[KV_FMT_FP16], want_fp16 * 2 * NKV);
    CHECK_EQ(st.pages_by_format[KV_FMT_MERGED], want_merged * NKV);
    kv_store_destroy(S);
    S = NULL;
}

/* Allocation failure through the API. */
static void test_faults(void)
{
    uint64_t mem0 = kv_mem_live_bytes();
    S = open_store(NL, NQ, NKV, 0, KV_FMT_FP16, 32, 1024);
    kv_seq_id_t q, c;
    CHECK_OK(kv_seq_create(S, &q));
    append_rand(S, q, 0, 40, NKV);
    append_rand(S, q, 1, 40, NKV);
    append_pair(S, q, 2, 40, NKV);
    CHECK_OK(kv_seq_fork(S, q, &c));
    /* set_format allocates nothing */
    kv_fault_arm(1);
    CHECK_OK(kv_seq_set_format(S, q, 0, KV_FMT_INT2));
    CHECK(!kv_fault_fired());
    kv_fault_arm(0);
    CHECK_OK(kv_seq_set_format(S, q, 1, KV_FMT_INT4));
    kv_test_seq_t before, after;
    kv_stats_t s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    int fails = 0, ops = 0;
    for (int op = 0; op < 3; op++) {
        for (int n = 1; n < 500; n++) {
            shot_take(q, &before);
            CHECK_OK(kv_store_stats(S, &s0));
            uint64_t live = kv_mem_live_bytes();
            kv_fault_arm((uint64_t)n);
            int rc;
            kv_merge_opts_t o = kv_merge_opts_default();
            o.keep_fp16 = 3;
            if (op == 0)
                rc = kv_seq_quantize(S, q, 0, 5);
            else if (op == 1)
                rc = kv_seq_quantize(S, q, 1, 0);
            else
                rc = kv_seq_merge_layers(S, q, 3, &o);
            int fired = kv_fault_fired();
            kv_fault_arm(0);
            if (rc == 0) {
                CHECK(!fired);
                kv_test_seq_free(&before);
                ops++;
                break;
            }
            fails++;
            CHECK_EQ(rc, KV_ENOMEM);
            shot_take(q, &after);
            CHECK_OK(kv_store_stats(S, &s1));
            CHECK(kv_test_seq_same(&before, &after));
            CHECK_EQ(s0.pages_used, s1.pages_used);
            CHECK_EQ(s0.meta_bytes, s1.meta_bytes);
            CHECK_EQ(kv_mem_live_bytes(), live);
            kv_test_seq_free(&before), kv_test_seq_free(&after);
        }
    }
    CHECK_EQ(ops, 3);
    CHECK(fails >= 6);
    CHECK_OK(kv_store_check(S));
    CHECK_OK(kv_store_stats(S, &s0));
    CHECK(s0.pages_by_format[KV_FMT_INT2] > 0 && s0.pages_by_format[KV_FMT_INT4] > 0 &&
          s0.pages_by_format[KV_FMT_MERGED] > 0);
    /* appends that convert: fail (unchanged) or succeed, maybe deferred */
    int deferred = 0;
    for (int n = 1; n < 500; n++) {
        shot_take(q, &before);
        uint64_t live = kv_mem_live_bytes();
        kv_fault_arm((uint64_t)n);
        uint64_t r0 = rng;
        float k[40 * NKV * HD], v[40 * NKV * HD];
        for (size_t i = 0; i < sizeof k / 4; i++)
            k[i] = kv_test_randf(&rng), v[i] = kv_test_randf(&rng);
        int rc = kv_append(S, q, 0, 40, KV_DTYPE_F32, k, v, NULL);
        int fired = kv_fault_fired();
        kv_fault_arm(0);
        if (rc == 0) {
            uint32_t len;
            CHECK_OK(kv_seq_len(S, q, 0, 0, &len));
            CHECK_EQ(len, SL(before, 0, 0)->n + 40);
            CHECK_OK(kv_store_check(S));
            kv_test_seq_free(&before);
            if (!fired)
                break;
            deferred++; /* the conversion failed: deferred, append stands */
            continue;
        }
        rng = r0;
        CHECK_EQ(rc, KV_ENOMEM);
        shot_take(q, &after);
        CHECK(kv_test_seq_same(&before, &after));
        CHECK_EQ(kv_mem_live_bytes(), live);
        kv_test_seq_free(&before), kv_test_seq_free(&after);
    }
    CHECK(deferred >= 1);
    CHECK_OK(kv_store_check(S));
    CHECK_OK(kv_seq_free(S, q));
    CHECK_OK(kv_seq_free(S, c));
    CHECK_OK(kv_store_stats(S, &s0));
    CHECK_EQ(s0.pages_used, 0);
    kv_store_destroy(S);
    S = NULL;
    CHECK_EQ(kv_mem_live_bytes(), mem0);
}

int main(void)
{
    test_config();
    test_notes();
    test_ratio();
    test_errors();
    test_attention();
    test_merge_api();
    test_merge_pack();
    test_merge_pack_heads();
    merge_pack_mixed(36, 12, 2, 2);
    merge_pack_mixed(20, 12, 1, 1);
    test_faults();
    return kv_test_end();
}
