/* SPDX-License-Identifier: MIT */
/*
 * test_api_rot.c — rotated INT pages (KV_FMT_ROT; formats/kv_fmt_rot.h)
 * through the public API and the format traits.
 *
 * Checks:
 *   - the rotation: R^T R x == x within 1e-6 relative, |R x| == |x|, for
 *     every power-of-two head_dim 16..1024; kv_fmt_rot_ok refuses others;
 *   - round trip on KV with outlier channels (K: two channels 30x the
 *     others; V: one massive +-60 channel): quantize through the store (append,
 *     kv_seq_quantize), kv_read: both RMS errors printed; the rotated one
 *     within 3x the plain one (rows come back in the original basis: a
 *     wrong basis would be far off). Whether rotation lowers the error is
 *     measured on the real model (docs/results.md), not claimed on
 *     synthetic rows (here it does not, see the printed figures);
 *   - attention (kv_attn_decode, GQA 4/2, and kv_attn_prefill) over a list
 *     mixing rotated INT pages and the FP16 residual equals dense
 *     double-precision attention over the rows kv_read returns (the scores
 *     and sums are taken in the rotated space: the same up to FP32
 *     rounding); the error against the original FP32 rows is printed;
 *     prefill statistics over more rows than a CPU prefill block holds
 *     (the rotated queries' scratch) sum to the number of counted rows;
 *   - refusals: KV_FMT_ROT on FP16, on head_dim 48 (KV_EINVAL), the policies
 *     kivi2:rot=1 / minikv:rot=1 / int4:rot=1 on head_dim 48 (KV_EINVAL at attach),
 *     rot=2, minicache with rot=1;
 *   - the policies kivi2:rot=1 / kivi4:rot=1 store rotated pages (the same
 *     page count as without rot);
 *   - a page entry without the rotation bit (every page file written before
 *     rotation existed) reads as plain INT: an unrotated sequence's pages
 *     read back bit-identically to their plain decode;
 *   - fork, compaction (rotated pages decode to FP16 originals' space),
 *     kv_store_check after each step;
 *   - allocation failure (kv_fault_arm N = 1..) on kv_seq_quantize of a
 *     rotated list: a failed call changes nothing (read-back bit-identical).
 */
#include <math.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "formats/kv_fmt_rot.h"
#include "formats/kv_format.h"
#include "kv_test.h"
#include "test_offload_util.h"
#include "kv_test_attn.h"

#define NQ 4
#define NKV 2
#define HD 64
#define NT 256 /* tokens */

static uint64_t rng = 4242;

/* K/V rows [NT][NKV][HD] with outlier channels. */
static void make_kv(float *k, float *v)
{
    for (uint32_t t = 0; t < NT; t++)
        for (uint32_t h = 0; h < NKV; h++)
            for (uint32_t c = 0; c < HD; c++) {
                size_t i = ((size_t)t * NKV + h) * HD + c;
                float ko = (c == 3 || c == 40) ? 30.0f : 1.0f;
                k[i] = ko * (kv_test_randf(&rng) - 0.5f) + (c == 3 ? 8.0f : 0.0f);
                v[i] = kv_test_randf(&rng) - 0.5f;
                if (c == 7) /* a massive channel: +-60 */
                    v[i] = kv_test_randf(&rng) < 0.5f ? -60.0f : 60.0f;
            }
}

/* A store of the test shape at head_dim hd; with a page file at path when
 * path != NULL (offload flags: KV_OFFLOAD_OPEN reopens it). */
static kv_store_t *store_open(uint32_t hd, const char *path, uint32_t flags)
{
    kv_config_t c = kv_config_default();
    c.n_layers = 1;
    c.n_q_heads = NQ;
    c.n_kv_heads = NKV;
    c.head_dim = hd;
    c.host_pages = 4096;
    c.residual = 32;
    c.n_threads = 2;
    if (path) {
        c.offload_path = path;
        c.offload_pages = (flags & KV_OFFLOAD_OPEN) ? 0 : 512;
        c.offload_qd = 8;
        c.offload_flags = flags;
    }
    kv_store_t *s = NULL;
    return kv_store_create(&c, &s) ? NULL : s;
}

static kv_store_t *store_new(uint32_t hd)
{
    return store_open(hd, NULL, 0);
}

static void check_rotation(void)
{
    float x[KV_FMT_MAX_DIM], y[KV_FMT_MAX_DIM];
    for (uint32_t d = 16; d <= KV_FMT_MAX_DIM; d *= 2) {
        CHECK(kv_fmt_rot_ok(d));
        double n0 = 0, n1 = 0, e = 0;
        for (uint32_t c = 0; c < d; c++) {
            x[c] = y[c] = kv_test_randf(&rng) * 4.0f - 2.0f;
            n0 += (double)x[c] * x[c];
        }
        kv_fmt_rot_fwd(y, d);
        for (uint32_t c = 0; c < d; c++)
            n1 += (double)y[c] * y[c];
        kv_fmt_rot_inv(y, d);
        for (uint32_t c = 0; c < d; c++)
            e = fmax(e, fabs((double)y[c] - x[c]));
        CHECK(fabs(n1 - n0) <= 1e-5 * n0);
        CHECK(e <= 1e-5 * sqrt(n0 / d) * 4);
    }
    CHECK(!kv_fmt_rot_ok(48) && !kv_fmt_rot_ok(8) && !kv_fmt_rot_ok(2048) &&
          !kv_fmt_rot_ok(0) && !kv_fmt_rot_ok(96));
}

/* RMS error of the list (seq, head) against the original rows. */
static void list_err(kv_store_t *s, kv_seq_id_t seq, const float *k,
                     const float *v, double *ek, double *ev)
{
    static float rk[NT * HD], rv[NT * HD];
    *ek = *ev = 0;
    for (uint32_t h = 0; h < NKV; h++) {
        CHECK_OK(kv_read(s, seq, 0, h, 0, NT, rk, rv, NULL));
        for (uint32_t t = 0; t < NT; t++)
            for (uint32_t c = 0; c < HD; c++) {
                size_t i = ((size_t)t * NKV + h) * HD + c;
                double a = rk[t * HD + c] - k[i], b = rv[t * HD + c] - v[i];
                *ek += a * a;
                *ev += b * b;
            }
    }
    *ek = sqrt(*ek / (NT * NKV * HD));
    *ev = sqrt(*ev / (NT * NKV * HD));
}

/* Decode attention of seq; out [NQ][HD]; errors against the dense
 * reference over kv_read rows (*e_read) and over the originals (*e_orig). */
static void attn_err(kv_store_t *s, kv_seq_id_t seq, const float *k,
                     const float *v, const float *q, double *e_read,
                     double *e_orig)
{
    float out[NQ * HD];
    kv_decode_t a = {.layer = 0, .batch = 1, .seqs = &seq, .q = q, .out = out};
    CHECK_OK(kv_attn_decode(s, &a));
    static float rk[NT * HD], rv[NT * HD], ok[NT * HD], ov[NT * HD];
    double ref[HD];
    *e_read = *e_orig = 0;
    for (uint32_t qh = 0; qh < NQ; qh++) {
        uint32_t h = qh / (NQ / NKV);
        CHECK_OK(kv_read(s, seq, 0, h, 0, NT, rk, rv, NULL));
        for (uint32_t t = 0; t < NT; t++)
            for (uint32_t c = 0; c < HD; c++) {
                ok[t * HD + c] = k[((size_t)t * NKV + h) * HD + c];
                ov[t * HD + c] = v[((size_t)t * NKV + h) * HD + c];
            }
        kv_test_dense_row(rk, rv, HD, NT, q + qh * HD, 1.0 / sqrt(HD), ref, NULL);
        *e_read = fmax(*e_read, kv_test_rel_err(out + qh * HD, ref, HD));
        kv_test_dense_row(ok, ov, HD, NT, q + qh * HD, 1.0 / sqrt(HD), ref, NULL);
        *e_orig = fmax(*e_orig, kv_test_rel_err(out + qh * HD, ref, HD));
    }
}

static uint64_t pages_of(kv_store_t *s, uint32_t fmt)
{
    kv_stats_t st = {.struct_size = sizeof st};
    if (kv_store_stats(s, &st))
        return UINT64_MAX;
    return st.pages_by_format[fmt];
}

static void check_roundtrip_attention(void)
{
    static float k[NT * NKV * HD], v[NT * NKV * HD];
    make_kv(k, v);
    float q[NQ * HD];
    for (uint32_t i = 0; i < NQ * HD; i++)
        q[i] = kv_test_randf(&rng) - 0.5f;
    const uint32_t fmts[2] = {KV_FMT_INT2, KV_FMT_INT4};
    for (uint32_t f = 0; f < 2; f++) {
        kv_store_t *s = store_new(HD);
        CHECK(s != NULL);
        if (!s)
            return;
        kv_seq_id_t plain, rot;
        CHECK_OK(kv_seq_create(s, &plain));
        CHECK_OK(kv_seq_create(s, &rot));
        CHECK_OK(kv_seq_set_format(s, plain, 0, (kv_format_t)fmts[f]));
        CHECK_OK(kv_seq_set_format(s, rot, 0, (kv_format_t)(fmts[f] | KV_FMT_ROT)));
        CHECK_OK(kv_append(s, plain, 0, NT, KV_DTYPE_F32, k, v, NULL));
        uint64_t np = pages_of(s, fmts[f]);
        CHECK_OK(kv_append(s, rot, 0, NT, KV_DTYPE_F32, k, v, NULL));
        CHECK_EQ(pages_of(s, fmts[f]), 2 * np); /* same bytes */
        CHECK_OK(kv_store_check(s));
        double pk, pv, rk, rv;
        list_err(s, plain, k, v, &pk, &pv);
        list_err(s, rot, k, v, &rk, &rv);
        printf("int%u round trip RMS: K plain %.4g rot %.4g, V plain %.4g rot %.4g\n",
               fmts[f] == KV_FMT_INT2 ? 2 : 4, pk, rk, pv, rv);
        /* Reported, not asserted: on these synthetic rows rotation does
         * not win everywhere (K is quantized per channel over 16 tokens,
         * which already isolates a channel; docs/policies.md). Asserted:
         * the rotated list decodes to the original space (error of the
         * same order as plain quantization, not of a wrong basis). */
        CHECK(rk < 3.0 * pk && rv < 3.0 * pv);
        double pr, po, rr, ro;
        attn_err(s, plain, k, v, q, &pr, &po);
        attn_err(s, rot, k, v, q, &rr, &ro);
        printf("int%u attention rel err: vs read plain %.3g rot %.3g; vs originals "
               "plain %.3g rot %.3g\n", fmts[f] == KV_FMT_INT2 ? 2 : 4, pr, rr, po, ro);
        CHECK(pr <= 1e-4 && rr <= 1e-4);

        /* prefill over the same list (the last 16 tokens are the new rows) */
        float pq[16 * NQ * HD], pout[16 * NQ * HD];
        for (uint32_t i = 0; i < 16 * NQ * HD; i++)
            pq[i] = kv_test_randf(&rng) - 0.5f;
        kv_prefill_t pa = {.layer = 0, .seq = rot, .n_new = 16, .q = pq, .out = pout};
        CHECK_OK(kv_attn_prefill(s, &pa));
        static float xk[NT * HD], xv[NT * HD];
        double ref[HD], worst = 0;
        for (uint32_t i = 0; i < 16; i++)
            for (uint32_t qh = 0; qh < NQ; qh++) {
                CHECK_OK(kv_read(s, rot, 0, qh / (NQ / NKV), 0, NT, xk, xv, NULL));
                kv_test_dense_row(xk, xv, HD, NT - 16 + i + 1,
                                  pq + ((size_t)i * NQ + qh) * HD, 1.0 / sqrt(HD), ref, NULL);
                worst = fmax(worst, kv_test_rel_err(pout + ((size_t)i * NQ + qh) * HD, ref, HD));
            }
        CHECK(worst <= 1e-4);

        /* statistics of a prefill counting more rows (96 x G = 192) than a
         * CPU prefill block (64; its scratch rotates q for rotated pages):
         * each counted row's probabilities sum to 1, so do a head's stats
         * over its G rows per position */
        enum { SN = 96, SG = NQ / NKV };
        static float sq[SN * NQ * HD], sout[SN * NQ * HD], st[NKV * NT];
        for (uint32_t i = 0; i < SN * NQ * HD; i++)
            sq[i] = kv_test_randf(&rng) - 0.5f;
        kv_prefill_t sa = {.layer = 0, .seq = rot, .n_new = SN, .q = sq,
                           .out = sout, .stats = st, .stats_stride = NT};
        CHECK_OK(kv_attn_prefill(s, &sa));
        for (uint32_t h = 0; h < NKV; h++) {
            double sum = 0;
            for (uint32_t t = 0; t < NT; t++)
                sum += st[h * NT + t];
            CHECK(fabs(sum - SN * SG) <= 1e-3 * SN * SG);
        }

        /* fork + compaction: kept tokens decode to the original space */
        kv_seq_id_t fk;
        CHECK_OK(kv_seq_fork(s, rot, &fk));
        static float before[NT * HD], after[NT * HD];
        CHECK_OK(kv_read(s, rot, 0, 1, 0, NT, before, NULL, NULL));
        uint32_t keep[NT / 2];
        for (uint32_t i = 0; i < NT / 2; i++)
            keep[i] = 2 * i;
        CHECK_OK(kv_compact(s, fk, 0, 1, keep, NT / 2));
        CHECK_OK(kv_read(s, fk, 0, 1, 0, NT / 2, after, NULL, NULL));
        uint32_t same = 1;
        for (uint32_t i = 0; i < NT / 2; i++)
            for (uint32_t c = 0; c < HD; c++) /* FP16 of the decoded value */
                same &= fabsf(after[i * HD + c] - before[2 * i * HD + c]) <=
                        1e-3f * (1.0f + fabsf(before[2 * i * HD + c]));
        CHECK(same);
        CHECK_OK(kv_store_check(s));

        /* allocation failures on a quantize of a rotated list */
        kv_seq_id_t fq;
        CHECK_OK(kv_seq_create(s, &fq));
        CHECK_OK(kv_seq_set_format(s, fq, 0, (kv_format_t)(fmts[f] | KV_FMT_ROT)));
        CHECK_OK(kv_seq_set_format(s, fq, 0, KV_FMT_FP16));
        CHECK_OK(kv_append(s, fq, 0, NT, KV_DTYPE_F32, k, v, NULL));
        CHECK_OK(kv_seq_set_format(s, fq, 0, (kv_format_t)(fmts[f] | KV_FMT_ROT)));
        static float r0[NT * HD], r1[NT * HD];
        CHECK_OK(kv_read(s, fq, 0, 0, 0, NT, r0, NULL, NULL));
        int done = 0;
        for (uint64_t n = 1; n < 64 && !done; n++) {
            kv_fault_arm(n);
            int rc = kv_seq_quantize(s, fq, 0, 0);
            int fired = kv_fault_fired();
            kv_fault_arm(0);
            if (rc) {
                CHECK(fired && rc == KV_ENOMEM);
                CHECK_OK(kv_read(s, fq, 0, 0, 0, NT, r1, NULL, NULL));
                CHECK(memcmp(r0, r1, sizeof r0) == 0);
                CHECK_OK(kv_store_check(s));
            } else {
                done = 1;
            }
        }
        CHECK(done);
        double qk, qv;
        list_err(s, fq, k, v, &qk, &qv);
        CHECK(qk < 3.0 * pk && qv < 3.0 * pv);
        kv_store_destroy(s);
    }
}

/* A plain INT sequence (entries without the rotation bit: what every page
 * file written before rotation existed holds) reads exactly as the format's
 * own decode of the appended FP32 rows, untouched by rotation. */
static void check_plain_unchanged(void)
{
    static float k[NT * NKV * HD], v[NT * NKV * HD];
    make_kv(k, v);
    kv_store_t *s = store_new(HD);
    CHECK(s != NULL);
    if (!s)
        return;
    kv_seq_id_t a;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(kv_seq_set_format(s, a, 0, KV_FMT_INT2));
    CHECK_OK(kv_append(s, a, 0, NT, KV_DTYPE_F32, k, v, NULL));
    CHECK_OK(kv_seq_quantize(s, a, 0, 0));
    /* the same rows through the INT2 traits directly */
    const kv_format_traits_t *tr = kv_format_get(KV_FMT_INT2);
    kv_page_geom_t g = {.head_dim = HD, .page_bytes = 4u * 16u * HD};
    uint32_t tpp = tr->tokens_per_page(&g);
    static uint8_t page[4u * 16u * HD] __attribute__((aligned(64)));
    static float dk[NT * HD], rk[NT * HD];
    static float fk[NT * HD], fv[NT * HD]; /* the FP16 rows it converted */
    kv_seq_id_t b;
    CHECK_OK(kv_seq_create(s, &b));
    CHECK_OK(kv_append(s, b, 0, NT, KV_DTYPE_F32, k, v, NULL));
    CHECK_OK(kv_read(s, b, 0, 1, 0, NT, fk, fv, NULL));
    CHECK_OK(kv_read(s, a, 0, 1, 0, NT, rk, NULL, NULL));
    for (uint32_t t0 = 0; t0 < NT; t0 += tpp) {
        tr->store(page, &g, 0, tpp, KV_DTYPE_F32, fk + (size_t)t0 * HD,
                  fv + (size_t)t0 * HD, HD);
        kv_format_load(KV_FMT_INT2, 0, page, &g, 0, tpp, dk + (size_t)t0 * HD, NULL);
    }
    CHECK(memcmp(dk, rk, sizeof dk) == 0);
    kv_store_destroy(s);
}

static void check_refusals(void)
{
    kv_store_t *s = store_new(48);
    CHECK(s != NULL);
    if (!s)
        return;
    kv_seq_id_t a;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_EQ(kv_seq_set_format(s, a, 0, (kv_format_t)(KV_FMT_INT2 | KV_FMT_ROT)), KV_EINVAL);
    CHECK_EQ(kv_seq_set_format(s, a, 0, (kv_format_t)(KV_FMT_INT4 | KV_FMT_ROT)), KV_EINVAL);
    CHECK_OK(kv_seq_set_format(s, a, 0, KV_FMT_INT2)); /* plain is fine */
    const char *specs[] = {"kivi2:rot=1,r=32", "minikv:rot=1", "int4:rot=1,r=32"};
    for (uint32_t i = 0; i < 3; i++) {
        kv_policy_t *p = NULL;
        char err[256];
        CHECK_OK(kv_policy_parse(specs[i], &p, err, sizeof err));
        kv_seq_id_t b;
        CHECK_OK(kv_seq_create(s, &b));
        CHECK_EQ(kv_seq_set_policy(s, b, p), KV_EINVAL);
        kv_policy_destroy(p);
    }
    kv_store_destroy(s);
    s = store_new(HD);
    CHECK(s != NULL);
    if (!s)
        return;
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_EQ(kv_seq_set_format(s, a, 0, (kv_format_t)(KV_FMT_FP16 | KV_FMT_ROT)), KV_EINVAL);
    CHECK_EQ(kv_seq_set_format(s, a, 0, (kv_format_t)(KV_FMT_INT2 | 0x200u)), KV_EINVAL);
    kv_store_destroy(s);
    kv_policy_t *p = NULL;
    char err[256];
    CHECK_EQ(kv_policy_parse("kivi2:rot=2", &p, err, sizeof err), KV_EINVAL);
    CHECK_EQ(kv_policy_parse("minicache+int4:rot=1", &p, err, sizeof err), KV_EINVAL);
    CHECK_EQ(kv_policy_parse("h2o:rot=1", &p, err, sizeof err), KV_EINVAL);
}

/* Policies with rot=1 store rotated pages, as many as without. */
static void check_policies(void)
{
    static float k[NT * NKV * HD], v[NT * NKV * HD];
    make_kv(k, v);
    const char *pairs[][2] = {{"kivi2:r=32", "kivi2:r=32,rot=1"},
                              {"kivi4:r=32", "kivi4:r=32,rot=1"}};
    for (uint32_t i = 0; i < 2; i++) {
        kv_store_t *s = store_new(HD);
        CHECK(s != NULL);
        if (!s)
            return;
        kv_seq_id_t sq[2];
        double e[2][2];
        for (uint32_t j = 0; j < 2; j++) {
            kv_policy_t *p = NULL;
            char err[256];
            CHECK_OK(kv_policy_parse(pairs[i][j], &p, err, sizeof err));
            CHECK_OK(kv_seq_create(s, &sq[j]));
            CHECK_OK(kv_seq_set_policy(s, sq[j], p));
            kv_policy_destroy(p);
            CHECK_OK(kv_append(s, sq[j], 0, NT, KV_DTYPE_F32, k, v, NULL));
            list_err(s, sq[j], k, v, &e[j][0], &e[j][1]);
        }
        CHECK(e[1][0] < 3.0 * e[0][0] && e[1][1] < 3.0 * e[0][1]);
        kv_stats_t st = {.struct_size = sizeof st};
        CHECK_OK(kv_store_stats(s, &st));
        CHECK(st.pages_by_format[i ? KV_FMT_INT4 : KV_FMT_INT2] % 2 == 0);
        CHECK_OK(kv_store_check(s));
        kv_store_destroy(s);
    }
}

/* Rotated pages through a page file: offload, sync, destroy, reopen with
 * KV_OFFLOAD_OPEN: the restored rows are bit-identical (a lost rotation
 * flag would decode the codes in the wrong basis), and tokens appended
 * after the restart are quantized rotated, as in a store that never
 * restarted (the list's target keeps KV_FMT_ROT). */
static void check_restart(void)
{
    enum { NX = 40 };
    static float k[NT * NKV * HD], v[NT * NKV * HD];
    static float r0[NKV][2][(NT + NX) * HD], r1[NKV][2][(NT + NX) * HD];
    make_kv(k, v);
    kvt_dir_t d;
    kvt_dir_make(&d);
    char path[4096];
    kvt_path(&d, "rot.kvp", path);
    /* the reference: a store without a file, same calls */
    kv_store_t *ref = store_new(HD), *s = store_open(HD, path, 0);
    CHECK(ref != NULL && s != NULL);
    if (!ref || !s) {
        kv_store_destroy(ref);
        kv_store_destroy(s);
        kvt_dir_remove(&d);
        return;
    }
    kv_seq_id_t a, b;
    CHECK_OK(kv_seq_create(ref, &b));
    CHECK_OK(kv_seq_create(s, &a));
    CHECK_OK(kv_seq_set_format(ref, b, 0, (kv_format_t)(KV_FMT_INT2 | KV_FMT_ROT)));
    CHECK_OK(kv_seq_set_format(s, a, 0, (kv_format_t)(KV_FMT_INT2 | KV_FMT_ROT)));
    CHECK_OK(kv_append(ref, b, 0, NT, KV_DTYPE_F32, k, v, NULL));
    CHECK_OK(kv_append(s, a, 0, NT, KV_DTYPE_F32, k, v, NULL));
    CHECK_OK(kv_seq_offload(s, a));
    CHECK_OK(kv_seq_wait(s, a));
    CHECK_OK(kv_store_offload_sync(s));
    kv_store_destroy(s);
    s = store_open(HD, path, KV_OFFLOAD_OPEN);
    CHECK(s != NULL);
    if (s) {
        kv_seq_id_t ids[2];
        uint32_t n = 0;
        CHECK_OK(kv_store_seqs(s, ids, 2, &n));
        CHECK_EQ(n, 1);
        a = ids[0];
        CHECK_OK(kv_seq_prefetch(s, a));
        CHECK_OK(kv_seq_wait(s, a));
        /* NX more tokens (the last rows of k, v again) in both stores */
        const size_t off = (size_t)(NT - NX) * NKV * HD;
        CHECK_OK(kv_append(ref, b, 0, NX, KV_DTYPE_F32, k + off, v + off, NULL));
        CHECK_OK(kv_append(s, a, 0, NX, KV_DTYPE_F32, k + off, v + off, NULL));
        CHECK_EQ(pages_of(s, KV_FMT_INT2), pages_of(ref, KV_FMT_INT2));
        for (uint32_t h = 0; h < NKV; h++) {
            CHECK_OK(kv_read(ref, b, 0, h, 0, NT + NX, r0[h][0], r0[h][1], NULL));
            CHECK_OK(kv_read(s, a, 0, h, 0, NT + NX, r1[h][0], r1[h][1], NULL));
        }
        CHECK(memcmp(r0, r1, sizeof r0) == 0);
        CHECK_OK(kv_store_check(s));
        kv_store_destroy(s);
    }
    kv_store_destroy(ref);
    kvt_dir_remove(&d);
}

int main(void)
{
    check_rotation();
    check_roundtrip_attention();
    check_plain_unchanged();
    check_refusals();
    check_policies();
    check_restart();
    CHECK_EQ(kv_mem_live_bytes(), 0);
    return kv_test_end();
}
