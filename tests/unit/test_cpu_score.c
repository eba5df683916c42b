/* SPDX-License-Identifier: MIT */
/*
 * test_cpu_score.c — KVzip's scoring kernel (kv_backend.h,
 * kv_zip_score_params_t; kernels/cpu/kv_cpu_score.c): its scores against a
 * reference in double computed here; bit-identical scores on the calling
 * thread (no backend), on one worker and on three; maxima only (existing
 * larger scores kept, a repeated call changes nothing); argument checks;
 * an allocation failure leaves the scores as they were.
 */
#include <math.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kernels/cpu/kv_cpu_score.h"
#include "kernels/kv_backend.h"
#include "kv_test.h"

enum { H = 3, G = 3, D = 64, NS = 4, NC = 150, NR = 90, NK = NS + NC + NR };

static float q[NR][H * G][D], k[H][NK][D];

static void fill(float *x, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(kv_test_rand(s) % 20001) / 10000.0 - 1.0);
}

/* Rows r0.. of the pass: row i sees NS + NC + r0 + i + 1 keys. */
static kv_zip_score_params_t params(float *const *score, uint32_t r0, uint32_t n_rows)
{
    return (kv_zip_score_params_t){.q = &q[r0][0][0], .k = &k[0][0][0], .score = score,
                                   .n_q_heads = H * G, .n_kv_heads = H, .head_dim = D,
                                   .n_keys = NK, .n_sink = NS, .n_chunk = NC,
                                   .n_rows = n_rows, .n_vis0 = NS + NC + r0 + 1,
                                   .scale = 0.125f};
}

static void reference(double ref[H][NC])
{
    static double l[NK];
    memset(ref, 0, sizeof(double) * H * NC);
    for (uint32_t r = 0; r < NR; r++)
        for (uint32_t g = 0; g < H * G; g++) {
            const uint32_t h = g / G, n = NS + NC + r + 1;
            double m = -INFINITY, z = 0;
            for (uint32_t t = 0; t < n; t++) {
                double d = 0;
                for (uint32_t i = 0; i < D; i++)
                    d += (double)q[r][g][i] * k[h][t][i];
                l[t] = 0.125 * d;
                m = fmax(m, l[t]);
            }
            for (uint32_t t = 0; t < n; t++)
                z += exp(l[t] - m);
            for (uint32_t t = 0; t < NC; t++)
                ref[h][t] = fmax(ref[h][t], exp(l[NS + t] - m) / z);
        }
}

int main(void)
{
    uint64_t seed = 7;
    fill(&q[0][0][0], sizeof q / sizeof(float), &seed);
    fill(&k[0][0][0], sizeof k / sizeof(float), &seed);
    static double ref[H][NC];
    reference(ref);

    static float sc[4][H][NC]; /* no backend, 1 worker, 3 workers, 2 calls */
    float *ptr[4][H];
    for (int v = 0; v < 4; v++)
        for (int h = 0; h < H; h++)
            ptr[v][h] = sc[v][h];
    kv_backend_t b1, b3;
    CHECK_OK(kv_backend_cpu_create(1, 0, &b1));
    CHECK_OK(kv_backend_cpu_create(3, 0, &b3));
    kv_zip_score_params_t p = params(ptr[0], 0, NR);
    CHECK_OK(kv_backend_zip_score(NULL, &p));
    p.score = ptr[1];
    CHECK_OK(kv_backend_zip_score(&b1, &p));
    p.score = ptr[2];
    CHECK_OK(kv_backend_zip_score(&b3, &p));
    /* rows in two calls (as two prefill calls of one pass) */
    kv_zip_score_params_t a = params(ptr[3], 0, 37), c = params(ptr[3], 37, NR - 37);
    CHECK_OK(kv_backend_zip_score(&b3, &a));
    CHECK_OK(kv_backend_zip_score(&b3, &c));
    CHECK(memcmp(sc[0], sc[1], sizeof sc[0]) == 0);
    CHECK(memcmp(sc[0], sc[2], sizeof sc[0]) == 0);
    CHECK(memcmp(sc[0], sc[3], sizeof sc[0]) == 0);
    double worst = 0;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < NC; t++) {
            CHECK(sc[0][h][t] > 0);
            worst = fmax(worst, fabs(sc[0][h][t] - ref[h][t]) / ref[h][t]);
        }
    fprintf(stderr, "largest relative difference from the double reference: %.2g\n", worst);
    CHECK(worst < 1e-5);

    /* maxima: a repeated call changes nothing; larger scores stay */
    CHECK_OK(kv_backend_zip_score(&b3, &p));
    CHECK(memcmp(sc[0], sc[2], sizeof sc[0]) == 0);
    sc[2][1][5] = 2.0f;
    CHECK_OK(kv_backend_zip_score(&b3, &p));
    CHECK(sc[2][1][5] == 2.0f);
    sc[2][1][5] = sc[0][1][5];

    /* arguments */
    kv_zip_score_params_t bad = p;
    CHECK_EQ(kv_backend_zip_score(&b3, NULL), KV_EINVAL);
    bad.n_vis0 = NS + NC - 1; /* a row that does not see the chunk */
    CHECK_EQ(kv_backend_zip_score(&b3, &bad), KV_EINVAL);
    bad = p, bad.n_rows = NR + 1; /* past the keys */
    CHECK_EQ(kv_backend_zip_score(&b3, &bad), KV_EINVAL);
    bad = p, bad.n_q_heads = 10;
    CHECK_EQ(kv_backend_zip_score(&b3, &bad), KV_EINVAL);
    bad = p, bad.scale = 0;
    CHECK_EQ(kv_backend_zip_score(&b3, &bad), KV_EINVAL);
    bad = p, bad.k = NULL;
    CHECK_EQ(kv_backend_zip_score(&b3, &bad), KV_EINVAL);
    bad = p, bad.n_rows = 0;
    CHECK_OK(kv_backend_zip_score(&b3, &bad));

    /* out of memory: the scores as they were */
    memset(sc[2], 0, sizeof sc[2]);
    kv_fault_arm(1);
    CHECK_EQ(kv_backend_zip_score(&b3, &p), KV_ENOMEM);
    CHECK(kv_fault_fired());
    kv_fault_arm(0);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < NC; t++)
            CHECK(sc[2][h][t] == 0);
    kv_backend_destroy(&b1);
    kv_backend_destroy(&b3);
    return kv_test_end();
}
