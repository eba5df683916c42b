/* SPDX-License-Identifier: MIT */
/*
 * test_policy_eattn.c — Expected Attention and AdaKV budgets.
 *
 * Scoring: random pre-RoPE queries and keys, RoPE applied here (both
 * layouts), prefilled in chunks through kv_attn_prefill; the scores the
 * store holds at prefill end (budget above the prompt: nothing evicted)
 * equal a direct reference computed here in double from the pre-RoPE
 * queries with explicit D x D matrices (mean RoPE rotation over the future
 * positions, Rbar Sigma Rbar^T, softmax, group mean, ||v||), for w = 0 (all
 * rows past the sinks), w = 8 (the last call's last rows), cov=0, vnorm=0.
 * Selection: c tokens kept, the sinks among them, the rest the reference's
 * top scores. Composition with int4 (kept tokens INT4). AdaKV: the split
 * against a brute-force reference (floors, then the layer's best), budget
 * conservation per layer with floors respected for snapkv, eattn and h2o
 * (at every decode step), lists of different lengths still attend.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pages/kv_page.h"
#include "store/kv_policy_int.h"
#include "kv_test.h"

#define D 16u
#define H 2u
#define G 2u
#define HQ (H * G)
#define TMAX 256u

typedef struct env {
    kv_store_t *s;
    uint32_t L, T, chunk;
    float qpre[2][TMAX][HQ][D];  /* pre-RoPE queries [layer][t][qh]  */
    float kpre[2][TMAX][H][D];
    float v[2][TMAX][H][D];
} env_t;

static env_t E;

static void rope_f(float *x, uint32_t pos, double theta, int halves)
{
    double y[D];
    for (uint32_t d = 0; d < D; d++)
        y[d] = x[d];
    for (uint32_t f = 0; f < D / 2; f++) {
        uint32_t i = halves ? f : 2 * f, j = halves ? f + D / 2 : 2 * f + 1;
        double a = pos * pow(theta, -2.0 * f / D);
        x[i] = (float)(y[i] * cos(a) - y[j] * sin(a));
        x[j] = (float)(y[i] * sin(a) + y[j] * cos(a));
    }
}

static void env_data(uint32_t L, uint32_t T, uint64_t seed)
{
    E.L = L, E.T = T;
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < T; t++) {
            for (uint32_t h = 0; h < HQ; h++)
                for (uint32_t d = 0; d < D; d++) /* a mean direction + noise */
                    E.qpre[l][t][h][d] = (d == h ? 1.5f : 0.0f) + kv_test_randf(&seed);
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t d = 0; d < D; d++) {
                    E.kpre[l][t][h][d] = kv_test_randf(&seed) * (t % 7 == 3 ? 2.0f : 1.0f);
                    E.v[l][t][h][d] = kv_test_randf(&seed);
                }
        }
}

static int env_open(uint32_t residual)
{
    kv_config_t c = kv_config_default();
    c.n_layers = E.L, c.n_kv_heads = H, c.n_q_heads = HQ, c.head_dim = D;
    c.host_pages = 512, c.n_threads = 1, c.residual = residual;
    return kv_store_create(&c, &E.s);
}

static int seq_with(const char *spec, kv_seq_id_t *seq)
{
    kv_policy_t *p;
    char err[256];
    int rc = kv_policy_parse(spec, &p, err, sizeof err);
    if (rc) {
        fprintf(stderr, "parse '%s': %s\n", spec, err);
        return rc;
    }
    if (!(rc = kv_seq_create(E.s, seq)))
        rc = kv_seq_set_policy(E.s, *seq, p);
    kv_policy_destroy(p);
    return rc;
}

/* The prompt in chunks, RoPE (theta, layout) applied to q and k here. */
static int prefill(kv_seq_id_t seq, double theta, int halves)
{
    static float k[TMAX][H][D], q[TMAX][HQ][D], out[TMAX][HQ][D];
    for (uint32_t l = 0; l < E.L; l++)
        for (uint32_t t0 = 0; t0 < E.T; t0 += E.chunk) {
            uint32_t n = E.T - t0 < E.chunk ? E.T - t0 : E.chunk;
            for (uint32_t i = 0; i < n; i++) {
                memcpy(k[i], E.kpre[l][t0 + i], sizeof k[i]);
                memcpy(q[i], E.qpre[l][t0 + i], sizeof q[i]);
                for (uint32_t h = 0; h < H; h++)
                    rope_f(k[i][h], t0 + i, theta, halves);
                for (uint32_t h = 0; h < HQ; h++)
                    rope_f(q[i][h], t0 + i, theta, halves);
            }
            static float vv[TMAX][H][D];
            for (uint32_t i = 0; i < n; i++)
                memcpy(vv[i], E.v[l][t0 + i], sizeof vv[i]);
            int rc = kv_append(E.s, seq, l, n, KV_DTYPE_F32, k, vv, NULL);
            kv_prefill_t a = {.layer = l, .seq = seq, .n_new = n, .q = &q[0][0][0],
                              .out = &out[0][0][0]};
            if (rc || (rc = kv_attn_prefill(E.s, &a)))
                return rc;
        }
    return 0;
}

/* Direct reference of one list's scores (layer l, kv head h): rows
 * [r0, T) at positions >= sink, keys/values as the store holds them. */
static void reference(uint32_t l, uint32_t h, uint32_t r0, uint32_t sink, uint32_t future,
                      double theta, int halves, int cov_on, int vnorm, const float *K,
                      const float *V, double *out)
{
    static double Rb[D][D];
    memset(Rb, 0, sizeof Rb);
    for (uint32_t p = E.T; p < E.T + future; p++) /* mean of the RoPE matrices */
        for (uint32_t f = 0; f < D / 2; f++) {
            uint32_t i = halves ? f : 2 * f, j = halves ? f + D / 2 : 2 * f + 1;
            double a = p * pow(theta, -2.0 * f / D);
            Rb[i][i] += cos(a) / future, Rb[i][j] -= sin(a) / future;
            Rb[j][i] += sin(a) / future, Rb[j][j] += cos(a) / future;
        }
    for (uint32_t t = 0; t < E.T; t++)
        out[t] = 0;
    for (uint32_t g = 0; g < G; g++) {
        uint32_t qh = h * G + g, cnt = 0;
        double mu[D] = {0}, S[D][D], mu2[D], S2[D][D], tmp[D][D];
        memset(S, 0, sizeof S);
        for (uint32_t t = r0; t < E.T; t++) {
            if (t < sink)
                continue;
            cnt++;
            for (uint32_t i = 0; i < D; i++)
                mu[i] += E.qpre[l][t][qh][i];
        }
        for (uint32_t i = 0; i < D; i++)
            mu[i] /= cnt;
        for (uint32_t t = r0; t < E.T; t++)
            for (uint32_t i = 0; t >= sink && i < D; i++)
                for (uint32_t j = 0; j < D; j++)
                    S[i][j] += (E.qpre[l][t][qh][i] - mu[i]) * (E.qpre[l][t][qh][j] - mu[j]) / cnt;
        for (uint32_t i = 0; i < D; i++) {
            mu2[i] = 0;
            for (uint32_t j = 0; j < D; j++)
                mu2[i] += Rb[i][j] * mu[j];
        }
        for (uint32_t i = 0; i < D; i++)
            for (uint32_t j = 0; j < D; j++) {
                tmp[i][j] = 0;
                for (uint32_t a = 0; a < D; a++)
                    tmp[i][j] += Rb[i][a] * S[a][j];
            }
        for (uint32_t i = 0; i < D; i++)
            for (uint32_t j = 0; j < D; j++) {
                S2[i][j] = 0;
                for (uint32_t a = 0; a < D; a++)
                    S2[i][j] += tmp[i][a] * Rb[j][a];
            }
        double lg[TMAX], mx = -INFINITY, z = 0, sc = 1.0 / sqrt((double)D);
        for (uint32_t t = sink; t < E.T; t++) {
            const float *k = K + t * D;
            double a = 0, b = 0;
            for (uint32_t i = 0; i < D; i++) {
                a += mu2[i] * k[i];
                for (uint32_t j = 0; cov_on && j < D; j++)
                    b += k[i] * S2[i][j] * k[j];
            }
            lg[t] = sc * a + sc * sc * b / 2;
            mx = fmax(mx, lg[t]);
        }
        for (uint32_t t = sink; t < E.T; t++)
            z += exp(lg[t] - mx);
        for (uint32_t t = sink; t < E.T; t++)
            out[t] += exp(lg[t] - mx) / z / G;
    }
    for (uint32_t t = sink; t < E.T && vnorm; t++) {
        double n2 = 0;
        for (uint32_t d = 0; d < D; d++)
            n2 += (double)V[t * D + d] * V[t * D + d];
        out[t] *= sqrt(n2);
    }
}

/* Scores held by the store at prefill end vs the reference. */
static void check_scores(const char *spec, uint32_t r0, uint32_t sink, uint32_t future,
                         double theta, int halves, int cov_on, int vnorm)
{
    CHECK_OK(env_open(0));
    kv_seq_id_t seq;
    CHECK_OK(seq_with(spec, &seq));
    CHECK_OK(prefill(seq, theta, halves));
    CHECK_OK(kv_seq_prefill_end(E.s, seq));
    const kv_pol_seq_t *ps = kv_pol_get(E.s, seq);
    CHECK(ps && ps->ea_scored && ps->qmom == NULL);
    double worst = 0;
    for (uint32_t l = 0; ps && l < E.L; l++)
        for (uint32_t h = 0; h < H; h++) {
            static float K[TMAX * D], V[TMAX * D];
            double ref[TMAX];
            CHECK_OK(kv_read(E.s, seq, l, h, 0, E.T, K, V, NULL));
            reference(l, h, r0, sink, future, theta, halves, cov_on, vnorm, K, V, ref);
            const kv_pol_vec_t *w = &ps->win[l * H + h];
            CHECK_EQ(w->n, E.T);
            for (uint32_t t = 0; t < E.T && t < w->n; t++) {
                if (t < sink) {
                    CHECK(isinf(w->v[t]) && w->v[t] > 0);
                    continue;
                }
                double e = fabs(w->v[t] - ref[t]) / (fabs(ref[t]) + 1e-6);
                worst = e > worst ? e : worst;
            }
        }
    printf("  %-58s worst relative error %.2e\n", spec, worst);
    CHECK(worst < 1e-4);
    kv_store_destroy(E.s);
}

static void test_scores(void)
{
    env_data(2, 100, 7);
    E.chunk = 32;
    check_scores("eattn:c=1000", 0, 4, 512, 10000, 0, 1, 1);
    check_scores("eattn:c=1000,theta=100000,rope=halves,future=64", 0, 4, 64, 100000, 1, 1, 1);
    /* the last call holds rows 96..99 only: w=8 is those 4 (as SnapKV) */
    check_scores("eattn:c=1000,w=8,sink=0", 96, 0, 512, 10000, 0, 1, 1);
    check_scores("eattn:c=1000,cov=0,vnorm=0,sink=2", 0, 2, 512, 10000, 0, 0, 0);
    E.chunk = 100; /* one call: w=40 is the last 40 rows */
    check_scores("eattn:c=1000,w=40", 60, 4, 512, 10000, 0, 1, 1);
}

/* Selection keeps the sinks and the reference's top c - sink. */
static void test_select(const char *spec, uint32_t c, int fmt_int4)
{
    env_data(2, 120, 11);
    E.chunk = 64;
    CHECK_OK(env_open(fmt_int4 ? 16 : 0));
    kv_seq_id_t seq;
    CHECK_OK(seq_with(spec, &seq));
    CHECK_OK(prefill(seq, 10000, 0));
    static float K[2][H][TMAX * D], V[2][H][TMAX * D];
    for (uint32_t l = 0; l < E.L; l++)
        for (uint32_t h = 0; h < H; h++)
            CHECK_OK(kv_read(E.s, seq, l, h, 0, E.T, K[l][h], V[l][h], NULL));
    CHECK_OK(kv_seq_prefill_end(E.s, seq));
    for (uint32_t l = 0; l < E.L; l++)
        for (uint32_t h = 0; h < H; h++) {
            double ref[TMAX];
            reference(l, h, 0, 4, 512, 10000, 0, 1, 1, K[l][h], V[l][h], ref);
            uint32_t n = 0;
            CHECK_OK(kv_seq_len(E.s, seq, l, h, &n));
            CHECK_EQ(n, c);
            int32_t pos[TMAX];
            CHECK_OK(kv_read(E.s, seq, l, h, 0, n, NULL, NULL, pos));
            double least_kept = INFINITY;
            uint8_t kept[TMAX] = {0};
            for (uint32_t i = 0; i < n; i++) {
                kept[pos[i]] = 1;
                if (pos[i] >= 4)
                    least_kept = fmin(least_kept, ref[pos[i]]);
            }
            for (uint32_t t = 0; t < 4; t++)
                CHECK(kept[t]);
            int order_ok = 1; /* every dropped token scores below every kept one */
            for (uint32_t t = 4; t < E.T; t++)
                if (!kept[t] && ref[t] > least_kept * (1 + 1e-5))
                    order_ok = 0;
            CHECK(order_ok);
            if (fmt_int4) { /* kept tokens INT4 but the newest c mod R */
                const kv_page_list_t *li = kv_page_list_get(E.s->pt, seq, l, h);
                uint32_t int4 = 0;
                for (uint32_t e = 0; e < li->n_ents; e++)
                    int4 += li->ents[e].format == KV_FMT_INT4 ? li->ents[e].n_tokens : 0;
                CHECK_EQ(int4, c - c % 16);
            }
        }
    /* decoding keeps every new token */
    float k[H * D] = {0}, v[H * D] = {0}, q[HQ * D] = {0}, out[HQ * D];
    for (uint32_t l = 0; l < E.L; l++) {
        int32_t p = (int32_t)E.T;
        CHECK_OK(kv_append(E.s, seq, l, 1, KV_DTYPE_F32, k, v, &p));
        kv_decode_t d = {.layer = l, .batch = 1, .seqs = &seq, .q = q, .out = out};
        CHECK_OK(kv_attn_decode(E.s, &d));
    }
    CHECK_OK(kv_seq_step_end(E.s, seq));
    uint32_t n = 0;
    CHECK_OK(kv_seq_len(E.s, seq, 0, 0, &n));
    CHECK_EQ(n, c + 1);
    CHECK_OK(kv_store_check(E.s));
    kv_store_destroy(E.s);
}

/* rw: the newest rw tokens kept whatever they score, the sinks, and the
 * best of the rest: c in all. */
static void test_select_window(void)
{
    env_data(2, 120, 17);
    E.chunk = 64;
    CHECK_OK(env_open(0));
    kv_seq_id_t seq;
    CHECK_OK(seq_with("eattn:c=30,rw=10", &seq));
    CHECK_OK(prefill(seq, 10000, 0));
    static float K[TMAX * D], V[TMAX * D];
    CHECK_OK(kv_read(E.s, seq, 1, 1, 0, E.T, K, V, NULL));
    CHECK_OK(kv_seq_prefill_end(E.s, seq));
    double ref[TMAX];
    reference(1, 1, 0, 4, 512, 10000, 0, 1, 1, K, V, ref);
    uint32_t n = 0;
    CHECK_OK(kv_seq_len(E.s, seq, 1, 1, &n));
    CHECK_EQ(n, 30);
    int32_t pos[TMAX];
    CHECK_OK(kv_read(E.s, seq, 1, 1, 0, n, NULL, NULL, pos));
    uint8_t kept[TMAX] = {0};
    double least = INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        kept[pos[i]] = 1;
        if (pos[i] >= 4 && pos[i] < 110)
            least = fmin(least, ref[pos[i]]);
    }
    int ok = 1;
    for (uint32_t t = 0; t < E.T; t++) {
        if (t < 4 || t >= 110)
            ok &= kept[t];
        else if (!kept[t])
            ok &= ref[t] <= least * (1 + 1e-5);
    }
    CHECK(ok);
    kv_store_destroy(E.s);
}

/* kv_pol_ada_split against brute force: floors, then the best of the rest. */
static void test_ada_split(void)
{
    uint64_t seed = 5;
    for (int trial = 0; trial < 200; trial++) {
        uint32_t nh = 1 + (uint32_t)(kv_test_rand(&seed) % 6), k = (uint32_t)(kv_test_rand(&seed) % 20);
        double alpha = (double)(kv_test_rand(&seed) % 11) / 10.0;
        static float sc[6][64];
        const float *sp[6];
        uint32_t nc[6], kout[6], tot = 0;
        for (uint32_t h = 0; h < nh; h++) {
            nc[h] = (uint32_t)(kv_test_rand(&seed) % 40);
            tot += nc[h];
            for (uint32_t t = 0; t < nc[h]; t++) /* a few ties */
                sc[h][t] = (float)(kv_test_rand(&seed) % 50) * (h + 1);
            sp[h] = sc[h];
        }
        static uint64_t scr[6 * 64];
        kv_pol_ada_split(sp, nc, nh, k, alpha, kout, scr);
        uint32_t sum = 0, fl = (uint32_t)floor(alpha * k);
        int floors_ok = 1;
        for (uint32_t h = 0; h < nh; h++) {
            sum += kout[h];
            floors_ok &= kout[h] >= (fl < nc[h] ? fl : nc[h]) && kout[h] <= nc[h];
        }
        CHECK(floors_ok);
        CHECK_EQ(sum, tot < nh * k ? tot : nh * k);
        /* brute force: mark floors, then repeatedly take the best unmarked
         * (ties: lower head, then the head's order = lower index) */
        uint8_t taken[6][64] = {{0}};
        uint32_t bk[6] = {0}, left = nh * k;
        for (uint32_t h = 0; h < nh; h++)
            for (uint32_t r = 0; r < fl && r < nc[h]; r++) {
                int best = -1;
                for (uint32_t t = 0; t < nc[h]; t++)
                    if (!taken[h][t] && (best < 0 || sc[h][t] > sc[h][best]))
                        best = (int)t;
                taken[h][best] = 1, bk[h]++, left--;
            }
        while (left > 0) {
            int bh = -1, bt = -1;
            for (uint32_t h = 0; h < nh; h++)
                for (uint32_t t = 0; t < nc[h]; t++)
                    if (!taken[h][t] && (bh < 0 || sc[h][t] > sc[bh][bt]))
                        bh = (int)h, bt = (int)t;
            if (bh < 0)
                break;
            taken[bh][bt] = 1, bk[bh]++, left--;
        }
        int same = 1;
        for (uint32_t h = 0; h < nh; h++)
            same &= bk[h] == kout[h];
        CHECK(same);
    }
}

/* Lengths of one layer's lists; their sum. */
static uint32_t layer_lens(kv_seq_id_t seq, uint32_t l, uint32_t *n)
{
    uint32_t sum = 0;
    for (uint32_t h = 0; h < H; h++) {
        CHECK_OK(kv_seq_len(E.s, seq, l, h, &n[h]));
        sum += n[h];
    }
    return sum;
}

/* A store over E's data (prompt chunks of 64) and a sequence under spec,
 * prefilled and past its prefill end. */
static kv_seq_id_t open_ended(const char *spec)
{
    E.chunk = 64;
    CHECK_OK(env_open(0));
    kv_seq_id_t seq = 0;
    CHECK_OK(seq_with(spec, &seq));
    CHECK_OK(prefill(seq, 10000, 0));
    CHECK_OK(kv_seq_prefill_end(E.s, seq));
    return seq;
}

/* ada=1: per layer the kept total is the uniform one, floors respected, and
 * the lists differ; h2o keeps that at every step; attention still runs. */
static void test_ada_store(const char *spec, uint32_t per_head, uint32_t floor_min, int steps)
{
    env_data(2, 200, 13);
    for (uint32_t t = 0; t < 200; t++) /* layer 0, head 1: keys aligned to queries */
        for (uint32_t d = 0; d < D; d++)
            E.kpre[0][t][1][d] = d == 2 ? 3.0f : 0.1f * E.kpre[0][t][1][d];
    kv_seq_id_t seq = open_ended(spec);
    int differ = 0;
    for (int step = 0; step <= steps; step++) {
        for (uint32_t l = 0; l < E.L; l++) {
            uint32_t n[H];
            uint32_t sum = layer_lens(seq, l, n);
            /* h2o evicts every step; the others keep decoded tokens */
            uint32_t want = H * per_head + (strncmp(spec, "h2o", 3) ? H * (uint32_t)step : 0);
            if (sum != want)
                fprintf(stderr, "  %s step %d layer %u: kept %u, want %u\n", spec, step, l, sum,
                        want);
            CHECK_EQ(sum, want);
            for (uint32_t h = 0; h < H; h++)
                CHECK(n[h] >= floor_min);
            differ |= n[0] != n[1];
        }
        if (step == steps)
            break;
        float k[H * D], v[H * D], q[HQ * D], out[HQ * D];
        uint64_t sd = 99 + (uint64_t)step;
        for (uint32_t l = 0; l < E.L; l++) {
            for (uint32_t i = 0; i < H * D; i++)
                k[i] = kv_test_randf(&sd), v[i] = kv_test_randf(&sd);
            for (uint32_t i = 0; i < HQ * D; i++)
                q[i] = kv_test_randf(&sd);
            int32_t p = (int32_t)(E.T + (uint32_t)step);
            CHECK_OK(kv_append(E.s, seq, l, 1, KV_DTYPE_F32, k, v, &p));
            kv_decode_t d = {.layer = l, .batch = 1, .seqs = &seq, .q = q, .out = out};
            CHECK_OK(kv_attn_decode(E.s, &d));
            int finite = 1;
            for (uint32_t i = 0; i < HQ * D; i++)
                finite &= isfinite(out[i]);
            CHECK(finite);
        }
        CHECK_OK(kv_seq_step_end(E.s, seq));
    }
    printf("  %-40s lists of one layer differ: %s\n", spec, differ ? "yes" : "no");
    CHECK(differ);
    CHECK_OK(kv_store_check(E.s));
    kv_store_destroy(E.s);
}

/* ada=2: one budget for the whole sequence. Layer 1's attention is
 * concentrated on a few tokens (their keys 8x longer), layer 0's spread
 * (every key the same before RoPE): the lists' total is the uniform one,
 * every list keeps its floor, and one layer keeps far more than the other
 * (ada=1 would keep H * per_head in each; which one depends on how the
 * method scores); attention still runs. */
static void test_ada_global(const char *spec, uint32_t per_head, uint32_t floor_min)
{
    env_data(2, 200, 13);
    for (uint32_t t = 0; t < 200; t++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t d = 0; d < D; d++) {
                E.kpre[0][t][h][d] = d == 2 ? 1.0f : 0.0f;
                E.kpre[1][t][h][d] *= t % 7 == 3 ? 8.0f : 1.0f;
            }
    kv_seq_id_t seq = open_ended(spec);
    uint32_t total = 0, lay[2], n[H];
    for (uint32_t l = 0; l < E.L; l++) {
        lay[l] = layer_lens(seq, l, n);
        total += lay[l];
        for (uint32_t h = 0; h < H; h++)
            CHECK(n[h] >= floor_min);
    }
    CHECK_EQ(total, E.L * H * per_head);
    printf("  %-40s kept per layer: %u %u (of %u)\n", spec, lay[0], lay[1],
           E.L * H * per_head);
    CHECK(lay[0] > lay[1] + H * per_head / 2 || lay[1] > lay[0] + H * per_head / 2);
    float q[HQ * D], out[HQ * D];
    uint64_t sd = 5;
    for (uint32_t i = 0; i < HQ * D; i++)
        q[i] = kv_test_randf(&sd);
    kv_decode_t d = {.layer = 0, .batch = 1, .seqs = &seq, .q = q, .out = out};
    CHECK_OK(kv_attn_decode(E.s, &d));
    CHECK_OK(kv_store_check(E.s));
    kv_store_destroy(E.s);
}

/* Grammar: keys, ranges, errors, describe round trip. */
static void test_grammar(void)
{
    static const char *const bad[] = {
        "eattn:c=1.5", "eattn:w=65537", "eattn:future=0", "eattn:theta=0.5",
        "eattn:rope=interleaved", "eattn:cov=2", "eattn:vnorm=-1", "eattn:ada=3",
        "eattn:alpha=1.1", "eattn+snapkv", "eattn+cam", "eattn:c=0.2,c=0.3",
        "eattn:k=7", "streamingllm:ada=1", "eattn+fp16", "h2o:ada=2", "minikv:ada=2",
        "simlayerkv+snapkv:ada=2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kv_policy_t *p = NULL;
        char err[256] = "";
        CHECK_EQ(kv_policy_parse(bad[i], &p, err, sizeof err), KV_EINVAL);
        CHECK(err[0] != '\0');
    }
    static const char *const good[][2] = {
        {"eattn", "eattn:c=0.2,rw=32,w=0,sink=4,future=512,theta=10000,rope=pairs,cov=1,vnorm=1"},
        {"int4+eattn:c=0.25,ada=1",
         "eattn:c=0.25,rw=32,w=0,sink=4,future=512,theta=10000,rope=pairs,cov=1,vnorm=1,ada=1"
         "+int4:r=128"},
        {"eattn:theta=100000,rope=halves,alpha=0.5",
         "eattn:c=0.2,rw=32,w=0,sink=4,future=512,theta=100000,rope=halves,cov=1,vnorm=1,alpha=0.5"},
        {"snapkv:c=0.2,ada=1", "snapkv:w=32,k=7,c=0.2,ada=1"},
        {"h2o:ada=1,alpha=0", "h2o:hh=0.1,rw=0.1,ada=1,alpha=0"},
        {"minikv:ada=1", "minikv:hh=0.25,rw=0.25,pyramid=0,ada=1"},
        {"simlayerkv+eattn:c=64", "eattn:c=64,rw=32,w=0,sink=4,future=512,theta=10000,rope=pairs,"
                                  "cov=1,vnorm=1+simlayerkv:delta=0.9,w=1024,sink=4,rows=32,"
                                  "mode=decode"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        kv_policy_t *p = NULL, *p2 = NULL;
        char d[512], d2[512], err[256];
        CHECK_OK(kv_policy_parse(good[i][0], &p, err, sizeof err));
        CHECK_OK(kv_policy_describe(p, d, sizeof d));
        if (strcmp(d, good[i][1]))
            fprintf(stderr, "  describe '%s' = '%s'\n", good[i][0], d);
        CHECK(!strcmp(d, good[i][1]));
        CHECK_OK(kv_policy_parse(d, &p2, err, sizeof err));
        CHECK_OK(kv_policy_describe(p2, d2, sizeof d2));
        CHECK(!strcmp(d, d2));
        CHECK(!memcmp(p, p2, sizeof *p));
        kv_policy_destroy(p);
        kv_policy_destroy(p2);
    }
    kv_policy_t *p;
    CHECK_OK(kv_policy_parse("eattn:c=0.25,ada=1+int2", &p, NULL, 0));
    kv_policy_info_t in;
    CHECK_OK(kv_policy_info(p, 30, 1000, &in));
    CHECK_EQ(in.methods, KV_POLICY_EATTN | KV_POLICY_INT2);
    CHECK_EQ(in.budget, 250);
    CHECK_EQ(in.format, KV_FMT_INT2);
    CHECK_EQ(in.evicts, 0);
    double v;
    CHECK_OK(kv_policy_value(p, "eattn", "ada", &v));
    CHECK(v == 1);
    CHECK_OK(kv_policy_value(p, "eattn", "rope", &v));
    CHECK(v == 0);
    kv_policy_destroy(p);
}

int main(void)
{
    test_grammar();
    test_scores();
    test_select("eattn:c=40,rw=0", 40, 0);
    test_select_window();
    test_select("eattn:c=40,rw=0+int4:r=16", 40, 1);
    test_ada_split();
    /* per head 40, floor 0.2 * 40 = 8 (eattn: + 4 sinks are within it) */
    test_ada_store("eattn:c=40,rw=0,ada=1", 40, 8, 2);
    test_ada_store("eattn:c=48,rw=8,ada=1", 48, 8 + 8, 0);
    test_ada_store("snapkv:c=40,w=8,ada=1", 40, 8 + 8, 2);
    test_ada_store("h2o:hh=32,rw=8,ada=1", 40, 6 + 8, 6);
    test_ada_store("minikv:hh=32,rw=8,ada=1,alpha=0.5", 40, 16 + 8, 0);
    test_ada_global("eattn:c=40,rw=0,ada=2", 40, 8);
    test_ada_global("snapkv:c=40,w=8,ada=2", 40, 6 + 8); /* 0.2 * 32, + w */
    test_ada_global("eattn:c=40,rw=0,ada=2,alpha=0", 40, 0);
    return kv_test_end();
}
