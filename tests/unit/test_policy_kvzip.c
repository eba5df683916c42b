/* SPDX-License-Identifier: MIT */
/*
 * test_policy_kvzip.c — KVzip through the store (store/kv_policy_kvzip.c,
 * kv_seq_score_begin).
 *
 * Scoring: a context of T random tokens, scored by two passes (chunks
 * [0, 48) and [48, T)), each a fork that appends its own random
 * "reconstruction" tokens in two kv_attn_prefill calls with random
 * queries. A reference computed here in double (per row and q head: the
 * softmax over the sinks, the chunk and the pass's tokens up to the row;
 * the largest probability per chunk token over rows, group and passes)
 * equals the owner's scores (relative 1e-4) and decides which tokens
 * kv_seq_prefill_end must keep: the sinks and the
 * top-c (compared with a tolerance for near ties). AdaKV (ada=1): each
 * layer keeps c * heads tokens in all, the sinks of every head among them.
 * The passes change nothing of the owner; a fork of the owner selects
 * the same tokens.
 * Errors: every refusal of kv_seq_score_begin with its code and nothing
 * changed, a prefill end without scores (KV_ESTATE), an owner that changes
 * during its pass (the pass's next call: KV_ESTATE). Allocation failures:
 * every allocation of the passes and the prefill end failed in turn, each
 * failed call KV_ENOMEM and retried: the same kept tokens as without.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "store/kv_policy_int.h"

#define L 2u
#define H 2u
#define G 2u
#define HQ (H * G)
#define D 16u
#define T 96u
#define C 24u  /* kept tokens per list */
#define SINK 4u
#define NPASS 2u
#define ROWS 60u /* reconstruction rows of a pass (two calls: 25 + 35) */

static const uint32_t chunk[NPASS][2] = {{0, 48}, {48, T}};

static float ck[L][T][H][D], cv[L][T][H][D];                  /* the context   */
static float rk[NPASS][L][ROWS][H][D], rq[NPASS][L][ROWS][HQ][D]; /* the passes */
static double ref[L][H][T];

/* Keys on a 1/256 grid below 8 in magnitude: exact in the FP16 pages, so
 * the reference sees the keys the store scores with. */
static float grid(float x)
{
    return roundf(x * 256.0f) / 256.0f;
}

static void make_data(uint64_t seed)
{
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t d = 0; d < D; d++) {
                    ck[l][t][h][d] = grid(kv_test_randf(&seed) * (t % 5 == 2 ? 2.5f : 1.0f));
                    cv[l][t][h][d] = kv_test_randf(&seed);
                }
    for (uint32_t p = 0; p < NPASS; p++)
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t r = 0; r < ROWS; r++) {
                for (uint32_t h = 0; h < H; h++)
                    for (uint32_t d = 0; d < D; d++)
                        rk[p][l][r][h][d] = grid(kv_test_randf(&seed));
                for (uint32_t g = 0; g < HQ; g++)
                    for (uint32_t d = 0; d < D; d++)
                        rq[p][l][r][g][d] = 2.0f * kv_test_randf(&seed);
            }
}

/* The reference scores of every context token (0: never scored). */
static void make_ref(void)
{
    memset(ref, 0, sizeof ref);
    const double scale = 1.0 / sqrt((double)D);
    for (uint32_t p = 0; p < NPASS; p++) {
        const uint32_t t0 = chunk[p][0], t1 = chunk[p][1], ns = t0 < SINK ? t0 : SINK;
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t g = 0; g < HQ; g++) {
                const uint32_t h = g / G;
                for (uint32_t r = 0; r < ROWS; r++) {
                    double lg[T + ROWS], m = -INFINITY, z = 0;
                    uint32_t n = 0;
                    for (uint32_t t = 0; t < ns + (t1 - t0) + r + 1; t++) {
                        const float *k = t < ns              ? ck[l][t][h]
                                         : t < ns + t1 - t0 ? ck[l][t0 + t - ns][h]
                                                            : rk[p][l][t - ns - (t1 - t0)][h];
                        double x = 0;
                        for (uint32_t d = 0; d < D; d++)
                            x += (double)rq[p][l][r][g][d] * k[d];
                        lg[n] = scale * x;
                        m = lg[n] > m ? lg[n] : m;
                        n++;
                    }
                    for (uint32_t j = 0; j < n; j++)
                        z += exp(lg[j] - m);
                    for (uint32_t t = t0; t < t1; t++) {
                        double pr = exp(lg[ns + t - t0] - m) / z;
                        ref[l][h][t] = pr > ref[l][h][t] ? pr : ref[l][h][t];
                    }
                }
            }
    }
}

static kv_store_t *open_store(void)
{
    kv_config_t c = kv_config_default();
    c.n_layers = L, c.n_kv_heads = H, c.n_q_heads = HQ, c.head_dim = D;
    c.host_pages = 256, c.n_threads = 1;
    kv_store_t *s = NULL;
    CHECK_OK(kv_store_create(&c, &s));
    return s;
}

/* A call that may fail with KV_ENOMEM under an armed fault: then it must
 * have changed nothing a retry depends on, and the retry succeeds. */
static int n_refused; /* calls that failed (and were retried) */
#define RETRY(call)                                      \
    do {                                                 \
        int rc_ = (call);                                \
        if (rc_) {                                       \
            CHECK_EQ(rc_, KV_ENOMEM);                    \
            n_refused++;                                 \
            kv_fault_arm(0);                             \
            CHECK_OK(call);                              \
        }                                                \
    } while (0)

static kv_seq_id_t owner_with(kv_store_t *s, const char *spec)
{
    kv_policy_t *p;
    char err[200];
    kv_seq_id_t seq;
    CHECK_OK(kv_policy_parse(spec, &p, err, sizeof err));
    CHECK_OK(kv_seq_create(s, &seq));
    CHECK_OK(kv_seq_set_policy(s, seq, p));
    kv_policy_destroy(p);
    int32_t pos[T];
    for (uint32_t t = 0; t < T; t++)
        pos[t] = (int32_t)t;
    for (uint32_t l = 0; l < L; l++)
        CHECK_OK(kv_append(s, seq, l, T, KV_DTYPE_F32, ck[l], cv[l], pos));
    return seq;
}

/* Pass p over its chunk, every call retried after a KV_ENOMEM. */
static void run_pass(kv_store_t *s, kv_seq_id_t owner, uint32_t p)
{
    kv_seq_id_t pass;
    RETRY(kv_seq_fork(s, owner, &pass));
    RETRY(kv_seq_score_begin(s, pass, owner, chunk[p][0], chunk[p][1]));
    static float out[ROWS][HQ][D];
    const uint32_t split[3] = {0, 25, ROWS};
    for (uint32_t c = 0; c < 2; c++) {
        const uint32_t r0 = split[c], n = split[c + 1] - split[c];
        int32_t pos[ROWS];
        for (uint32_t r = 0; r < n; r++)
            pos[r] = (int32_t)(T + r0 + r);
        for (uint32_t l = 0; l < L; l++) {
            RETRY(kv_append(s, pass, l, n, KV_DTYPE_F32, rk[p][l][r0], rk[p][l][r0], pos));
            kv_prefill_t pf = {.layer = l, .seq = pass, .n_new = n, .q = &rq[p][l][r0][0][0],
                               .out = &out[0][0][0]};
            RETRY(kv_attn_prefill(s, &pf));
        }
    }
    CHECK_OK(kv_seq_free(s, pass));
}

/* Positions kept by list (l, h) into keep[], their count. */
static uint32_t kept(kv_store_t *s, kv_seq_id_t seq, uint32_t l, uint32_t h, int32_t *keep)
{
    uint32_t n = 0;
    CHECK_OK(kv_seq_len(s, seq, l, h, &n));
    if (n)
        CHECK_OK(kv_read(s, seq, l, h, 0, n, NULL, NULL, keep));
    return n;
}

/* The kept tokens of every list are the sinks and the reference's top C. */
static void check_topc(kv_store_t *s, kv_seq_id_t seq)
{
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++) {
            int32_t keep[T];
            uint32_t n = kept(s, seq, l, h, keep);
            CHECK_EQ(n, C);
            double sc[T], sorted[T];
            for (uint32_t t = 0; t < T; t++)
                sc[t] = sorted[t] = t < SINK ? INFINITY : ref[l][h][t];
            for (uint32_t i = 0; i < T; i++) /* descending */
                for (uint32_t j = i + 1; j < T; j++)
                    if (sorted[j] > sorted[i]) {
                        double x = sorted[i];
                        sorted[i] = sorted[j];
                        sorted[j] = x;
                    }
            const double cut = sorted[C - 1];
            uint8_t in[T] = {0};
            for (uint32_t i = 0; i < n; i++) {
                CHECK(keep[i] >= 0 && keep[i] < (int32_t)T);
                if (keep[i] >= 0 && keep[i] < (int32_t)T)
                    in[keep[i]] = 1;
            }
            for (uint32_t t = 0; t < T; t++) {
                if (t < SINK)
                    CHECK(in[t]);
                if (in[t])
                    CHECK(sc[t] >= cut - 1e-6);
                else
                    CHECK(sc[t] <= cut + 1e-6);
            }
        }
}

static void test_scores(void)
{
    kv_store_t *s = open_store();
    kv_seq_id_t owner = owner_with(s, "kvzip:c=24,sink=4");
    for (uint32_t p = 0; p < NPASS; p++)
        run_pass(s, owner, p);
    for (uint32_t l = 0; l < L; l++) /* the passes left the owner as it was */
        for (uint32_t h = 0; h < H; h++) {
            float k[T * D];
            int32_t pos[T];
            uint32_t n;
            CHECK_OK(kv_seq_len(s, owner, l, h, &n));
            CHECK_EQ(n, T);
            CHECK_OK(kv_read(s, owner, l, h, 0, T, k, NULL, pos));
            for (uint32_t t = 0; t < T; t++) /* FP16 pages: rounded */
                CHECK(pos[t] == (int32_t)t &&
                      fabsf(k[t * D + 3] - ck[l][t][h][3]) <= 2e-3f * (1 + fabsf(ck[l][t][h][3])));
        }
    /* the scores themselves: the reference's, every token */
    const kv_pol_seq_t *ps = kv_pol_get(s, owner);
    double worst = 0;
    for (uint32_t l = 0; ps && l < L; l++)
        for (uint32_t h = 0; h < H; h++) {
            const kv_pol_vec_t *v = &ps->win[l * H + h];
            CHECK_EQ(v->n, T);
            for (uint32_t t = 0; t < T && t < v->n; t++)
                worst = fmax(worst, fabs(v->v[t] - ref[l][h][t]) / (ref[l][h][t] + 1e-6));
        }
    fprintf(stderr, "scores: largest relative difference from the reference %.2g\n", worst);
    CHECK(ps != NULL && worst < 1e-4);
    kv_seq_id_t child; /* a fork of the owner holds its scores */
    CHECK_OK(kv_seq_fork(s, owner, &child));
    CHECK_OK(kv_seq_prefill_end(s, owner));
    check_topc(s, owner);
    CHECK_OK(kv_seq_prefill_end(s, child));
    check_topc(s, child);
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

static void test_ada(void)
{
    kv_store_t *s = open_store();
    kv_seq_id_t owner = owner_with(s, "kvzip:c=24,sink=4,ada=1");
    for (uint32_t p = 0; p < NPASS; p++)
        run_pass(s, owner, p);
    CHECK_OK(kv_seq_prefill_end(s, owner));
    for (uint32_t l = 0; l < L; l++) {
        uint32_t total = 0;
        for (uint32_t h = 0; h < H; h++) {
            int32_t keep[T];
            uint32_t n = kept(s, owner, l, h, keep);
            total += n;
            for (uint32_t t = 0; t < SINK; t++)
                CHECK(n > t && keep[t] == (int32_t)t);
        }
        CHECK_EQ(total, C * H);
    }
    kv_store_destroy(s);
}

static void test_errors(void)
{
    kv_store_t *s = open_store();
    kv_seq_id_t owner = owner_with(s, "kvzip:c=24");
    kv_seq_id_t snap = owner_with(s, "snapkv:c=24");
    kv_seq_id_t pass, other;
    CHECK_OK(kv_seq_fork(s, owner, &pass));
    CHECK_OK(kv_seq_fork(s, snap, &other));
    uint64_t live = kv_mem_live_bytes();
    CHECK_EQ(kv_seq_score_begin(NULL, pass, owner, 0, 8), KV_EINVAL);
    CHECK_EQ(kv_seq_score_begin(s, pass, 999, 0, 8), KV_ENOENT);
    CHECK_EQ(kv_seq_score_begin(s, 999, owner, 0, 8), KV_ENOENT);
    CHECK_EQ(kv_seq_score_begin(s, other, snap, 0, 8), KV_ENOTSUP);
    CHECK_EQ(kv_seq_score_begin(s, other, owner, 0, 8), KV_ESTATE); /* pass without kvzip */
    CHECK_EQ(kv_seq_score_begin(s, owner, owner, 0, 8), KV_ESTATE);
    CHECK_EQ(kv_seq_score_begin(s, pass, owner, 8, 8), KV_ERANGE);
    CHECK_EQ(kv_seq_score_begin(s, pass, owner, 0, T + 1), KV_ERANGE);
    CHECK_EQ(kv_mem_live_bytes(), live); /* refusals changed nothing */
    /* a prefill end with no scores would evict blindly */
    CHECK_EQ(kv_seq_prefill_end(s, owner), KV_ESTATE);
    /* a pass already, and a pass whose lists are not the owner's length */
    CHECK_OK(kv_seq_score_begin(s, pass, owner, 0, 8));
    CHECK_EQ(kv_seq_score_begin(s, pass, owner, 0, 8), KV_ESTATE);
    kv_seq_id_t late;
    CHECK_OK(kv_seq_fork(s, owner, &late));
    int32_t p1 = T;
    CHECK_OK(kv_append(s, late, 0, 1, KV_DTYPE_F32, rk[0][0][0], rk[0][0][0], &p1));
    CHECK_EQ(kv_seq_score_begin(s, late, owner, 0, 8), KV_ESTATE);
    /* the owner changes during the pass: the pass's next call refuses */
    float out[HQ * D];
    for (uint32_t l = 0; l < L; l++)
        CHECK_OK(kv_append(s, pass, l, 1, KV_DTYPE_F32, rk[0][l][0], rk[0][l][0], &p1));
    kv_prefill_t pf = {.layer = 0, .seq = pass, .n_new = 1, .q = &rq[0][0][0][0][0], .out = out};
    CHECK_OK(kv_attn_prefill(s, &pf));
    CHECK_OK(kv_seq_prefill_end(s, owner)); /* scored now (tokens 0..7) */
    CHECK_EQ(kv_attn_prefill(s, &pf), KV_ESTATE);
    CHECK_EQ(kv_seq_score_begin(s, late, owner, 0, 8), KV_ESTATE); /* owner decoding */
    /* a prompt within the budget needs no scores */
    kv_seq_id_t small;
    kv_policy_t *p;
    char err[100];
    CHECK_OK(kv_policy_parse("kvzip:c=1000", &p, err, sizeof err));
    CHECK_OK(kv_seq_create(s, &small));
    CHECK_OK(kv_seq_set_policy(s, small, p));
    kv_policy_destroy(p);
    for (uint32_t l = 0; l < L; l++)
        CHECK_OK(kv_append(s, small, l, 1, KV_DTYPE_F32, ck[l][0], cv[l][0], &p1));
    CHECK_OK(kv_seq_prefill_end(s, small));
    CHECK_OK(kv_store_check(s));
    kv_store_destroy(s);
}

static void test_faults(void)
{
    int done = 0, failed = 0;
    for (uint64_t n = 1; n < 2000 && !done; n++) {
        kv_store_t *s = open_store();
        kv_seq_id_t owner = owner_with(s, "kvzip:c=24,sink=4");
        n_refused = 0;
        kv_fault_arm(n);
        for (uint32_t p = 0; p < NPASS; p++)
            run_pass(s, owner, p);
        RETRY(kv_seq_prefill_end(s, owner));
        done = !n_refused && !kv_fault_fired();
        failed += n_refused;
        kv_fault_arm(0);
        check_topc(s, owner);
        CHECK_OK(kv_store_check(s));
        kv_store_destroy(s);
    }
    CHECK(done);
    CHECK(failed > 10);
    fprintf(stderr, "faults: %d allocations failed in turn\n", failed);
}

int main(void)
{
    make_data(7);
    make_ref();
    test_scores();
    test_ada();
    test_errors();
    test_faults();
    return kv_test_end();
}
