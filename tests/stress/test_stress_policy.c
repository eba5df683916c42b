/* SPDX-License-Identifier: MIT */
/*
 * test_stress_policy.c — randomized test of policies through the public
 * API: sequences under every method and composition (and none) created,
 * prefilled in random chunks with attention, ended, decoded step by step
 * with batched attention, forked, compacted behind the policy's back and
 * freed, in a small pool, with injected allocation failures; one seed runs
 * without a memory-pressure ladder, the others with one (kvpage.h, "memory
 * pressure"), so the ladder converts and evicts sequences under policies.
 *
 * Invariants, after every operation:
 *   - kv_store_check passes;
 *   - conservation: the store's tokens equal the sum of every live list's
 *     length, pages used + free = capacity, pages by format add up to the
 *     pages used and kv_bytes to pages * page_bytes, n_seqs = live ones;
 *   - positions: every list's positions were handed out to its layer
 *     (< the next one) and are strictly increasing (distinct under
 *     MiniCache, whose merged tokens come first); no list holds more
 *     tokens than were appended to its layer;
 * and:
 *   - budgets: right after kv_seq_prefill_end every list is within its
 *     policy's budget (StreamingLLM sink + recent, H2O/MiniKV heavy hitters
 *     of its layer + recent window, SnapKV c, a SimLayerKV lazy layer sink
 *     + w); after kv_seq_step_end StreamingLLM/H2O lists and lazy layers
 *     are within it again;
 *   - attention: decode over a batch of live sequences and the last row of
 *     each prefill chunk equal dense attention over what kv_read returns
 *     (relative error <= 1e-3);
 *   - failures: a call under an injected fault returns 0 or KV_ENOMEM (and
 *     an all-or-nothing call that failed changed nothing of its sequence);
 *     kv_seq_prefill_end / kv_seq_step_end called again finish the job;
 *   - the end: everything freed, no page used, no token held, and after
 *     kv_store_destroy no kv_mem byte left.
 *
 * Seeds 1, 2, 3 (KV_STRESS_OPS: operations per seed, default 10000).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "store/kv_policy_int.h" /* budgets from the policy state */
#include "kv_test.h"
#include "kv_test_attn.h"

#define NL 4
#define NKV 2
#define NQ 4
#define HD 16
#define RES 32
#define POOL 64
#define MAX_SEQS 6
#define MAX_POS 360 /* positions handed out per layer, to keep reads cheap */
#define TOL 1e-3

static const char *const specs[] = {
    "fp16",
    "kivi2:r=32",
    "kivi4:r=32",
    "int4:r=32",
    "streamingllm:sink=4,recent=0.2",
    "streamingllm:sink=2,recent=24+cam:m=4",
    "h2o:hh=0.1,rw=0.1",
    "h2o:hh=8,rw=8+cam:m=8,seed=3",
    "h2o:hh=0.2,rw=0.1+int2:r=32",
    "snapkv:w=8,k=3,c=0.3",
    "snapkv:w=8,k=5,c=40+int4:r=32",
    "minikv:hh=0.25,rw=0.25",
    "minikv:hh=0.2,rw=0.2,pyramid=3",
    "minikv:hh=0.25,rw=0.25+int4:r=32",
    "simlayerkv:delta=0.2,w=16",
    "simlayerkv:delta=0.2,w=16,mode=prefill,rows=8",
    "simlayerkv:delta=0.2,w=16+int4:r=32",
    "simlayerkv:delta=0.2,w=16+minikv:hh=0.25,rw=0.25",
    "simlayerkv:delta=0.2,w=16,sink=2+h2o:hh=0.1,rw=0.1+cam",
    "streamingllm:sink=4,recent=16+int2:r=32",
    "minicache:from=0.5,t=0.6,gamma=0.05",
    "minicache:from=0,every=8+int4:r=32",
};
#define N_SPECS ((int)(sizeof specs / sizeof specs[0]))

typedef struct sseq {
    int live;
    kv_seq_id_t id;
    int spec;              /* index into specs; -1: no policy  */
    int ended;             /* kv_seq_prefill_end succeeded      */
    uint32_t next_pos[NL]; /* positions handed out per layer    */
} sseq_t;

static kv_store_t *S;
static kv_policy_t *POL[N_SPECS];
static sseq_t SH[MAX_SEQS];
static uint64_t rng;
static long op_no;
static int cur_op;
static int failed;
static long n_ops[16], n_enomem, n_fired, n_attn, n_budget;

/* CHECK that stops reporting a seed after its first failure; cond is
 * evaluated once. */
#define EXPECT(cond)                                                         \
    do {                                                                     \
        int ok_ = (cond);                                                    \
        if (!ok_ && !failed) {                                               \
            failed = 1;                                                      \
            fprintf(stderr, "%s:%d: %s failed at op %ld\n", __FILE__,        \
                    __LINE__, #cond, op_no);                                 \
        }                                                                    \
        CHECK(ok_);                                                          \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        exit(2);
    return p;
}

static uint32_t rnd(uint32_t n)
{
    return n ? (uint32_t)(kv_test_rand(&rng) % n) : 0;
}

/* A random slot that is live (want 1) or free (want 0); -1 if none. */
static int pick(int want)
{
    int n = 0, idx[MAX_SEQS];
    for (int i = 0; i < MAX_SEQS; i++)
        if (SH[i].live == want)
            idx[n++] = i;
    return n ? idx[rnd((uint32_t)n)] : -1;
}

static void arm_maybe(void)
{
    if (rnd(8) == 0)
        kv_fault_arm(1 + rnd(12));
}

/* rc of a call made under arm_maybe: 0 or KV_ENOMEM only. */
static int finish(int rc)
{
    n_fired += kv_fault_fired();
    kv_fault_arm(0);
    n_enomem += rc == KV_ENOMEM;
    if (rc && rc != KV_ENOMEM && !failed)
        fprintf(stderr, "  op %d returned %d (%s)\n", cur_op, rc, kv_strerror(rc));
    EXPECT(rc == 0 || rc == KV_ENOMEM);
    return rc;
}

static uint32_t len_of(const sseq_t *q, uint32_t l, uint32_t h)
{
    uint32_t n = 0;
    EXPECT(kv_seq_len(S, q->id, l, h, &n) == 0);
    return n;
}

/* ---- invariants ---------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static void verify_all(void)
{
    uint64_t tokens = 0, live = 0;
    int32_t *pos = xmalloc(MAX_POS * 4);
    for (int i = 0; i < MAX_SEQS; i++) {
        const sseq_t *q = &SH[i];
        if (!q->live)
            continue;
        live++;
        int mc = q->spec >= 0 && POL[q->spec]->mc;
        for (uint32_t l = 0; l < NL; l++)
            for (uint32_t h = 0; h < NKV; h++) {
                uint32_t n = len_of(q, l, h);
                tokens += n;
                EXPECT(n <= q->next_pos[l]);
                if (n == 0 || n > q->next_pos[l])
                    continue;
                EXPECT(kv_read(S, q->id, l, h, 0, n, NULL, NULL, pos) == 0);
                if (mc)
                    qsort(pos, n, sizeof *pos, cmp_i32);
                int ok = pos[n - 1] < (int32_t)q->next_pos[l] && pos[0] >= 0;
                for (uint32_t t = 1; t < n; t++)
                    ok &= pos[t] > pos[t - 1];
                EXPECT(ok);
            }
    }
    free(pos);
    EXPECT(kv_store_check(S) == 0);
    kv_stats_t st = {.struct_size = sizeof st};
    EXPECT(kv_store_stats(S, &st) == 0);
    EXPECT(st.tokens == tokens && st.n_seqs == live);
    EXPECT(st.pages_used + st.pages_free == st.pages_capacity);
    uint64_t pages = 0;
    for (int f = 0; f < KV_FMT_COUNT; f++)
        pages += st.pages_by_format[f];
    EXPECT(pages == st.pages_used && st.kv_bytes == pages * st.page_bytes);
}

/* Most tokens a list of layer l may hold right after the policy acted
 * (at_step: after kv_seq_step_end); UINT32_MAX: no bound. */
static uint32_t budget(const kv_pol_seq_t *ps, uint32_t l, int at_step)
{
    const kv_policy_t *p = &ps->pol;
    if (p->sim && ps->sim_decided && ps->lazy[l])
        return p->sim_sink + p->sim_w;
    switch (p->sel) {
    case KV_POL_SEL_STREAM:
        return p->sink + ps->recent;
    case KV_POL_SEL_H2O:
        return ps->hh_layer[l] + ps->recent;
    case KV_POL_SEL_MINIKV:
        return at_step ? UINT32_MAX : ps->hh_layer[l] + ps->recent;
    case KV_POL_SEL_SNAPKV:
        return at_step ? UINT32_MAX : ps->hh_layer[l];
    default:
        return UINT32_MAX;
    }
}

static void check_budget(const sseq_t *q, int at_step)
{
    const kv_pol_seq_t *ps = kv_pol_get(S, q->id);
    if (!ps)
        return;
    for (uint32_t l = 0; l < NL; l++) {
        uint32_t b = budget(ps, l, at_step);
        for (uint32_t h = 0; h < NKV && b != UINT32_MAX; h++) {
            uint32_t n = len_of(q, l, h);
            if (n > b && !failed)
                fprintf(stderr, "  %s: layer %u head %u holds %u > %u\n",
                        specs[q->spec], l, h, n, b);
            EXPECT(n <= b);
            n_budget++;
        }
    }
}

/* ---- attention against the dense reference -------------------------------------- */

/* Row q ([NQ][HD]) of (seq, layer) attending to tokens [0, upto) of every
 * kv head vs out ([NQ][HD]). */
static void check_row(kv_seq_id_t id, uint32_t layer, uint32_t upto, const float *q,
                      const float *out)
{
    float *k = xmalloc((size_t)MAX_POS * HD * 4), *v = xmalloc((size_t)MAX_POS * HD * 4);
    double ref[HD], worst = 0;
    for (uint32_t h = 0; h < NKV; h++) {
        uint32_t n = 0;
        EXPECT(kv_seq_len(S, id, layer, h, &n) == 0);
        n = upto < n ? upto : n;
        EXPECT(n <= MAX_POS && kv_read(S, id, layer, h, 0, n, k, v, NULL) == 0);
        for (uint32_t g = 0; g < NQ / NKV; g++) {
            uint32_t qh = h * (NQ / NKV) + g;
            kv_test_dense_row(k, v, HD, n, q + qh * HD, 1.0 / sqrt(HD), ref, NULL);
            double e = kv_test_rel_err(out + qh * HD, ref, HD);
            worst = e > worst ? e : worst;
        }
    }
    if (worst > TOL && !failed)
        fprintf(stderr, "  attention of seq %u layer %u: relative error %g\n", id, layer,
                worst);
    EXPECT(worst <= TOL);
    n_attn++;
    free(k), free(v);
}

/* ---- operations ------------------------------------------------------------------- */

/* 1 if every layer of q can take n more positions. */
static int room_for(const sseq_t *q, uint32_t n)
{
    for (uint32_t l = 0; l < NL; l++)
        if (q->next_pos[l] + n > MAX_POS)
            return 0;
    return 1;
}

static void make_tokens(uint32_t n, float *k, float *v)
{
    for (uint32_t i = 0; i < n * NKV * HD; i++) {
        k[i] = kv_test_randf(&rng);
        v[i] = kv_test_randf(&rng);
    }
}

/* Append n tokens to layer l of q; 0 or the error (shadow updated on 0). */
static int append(sseq_t *q, uint32_t l, uint32_t n)
{
    float *k = xmalloc((size_t)n * NKV * HD * 4), *v = xmalloc((size_t)n * NKV * HD * 4);
    int32_t *pos = xmalloc((size_t)n * 4);
    make_tokens(n, k, v);
    for (uint32_t i = 0; i < n; i++)
        pos[i] = (int32_t)(q->next_pos[l] + i);
    uint32_t before[NKV];
    for (uint32_t h = 0; h < NKV; h++)
        before[h] = len_of(q, l, h);
    arm_maybe();
    int rc = finish(kv_append(S, q->id, l, n, KV_DTYPE_F32, k, v, pos));
    for (uint32_t h = 0; h < NKV; h++) /* all heads or none */
        EXPECT(len_of(q, l, h) == before[h] + (rc == 0 ? n : 0));
    if (rc == 0)
        q->next_pos[l] += n;
    free(k), free(v), free(pos);
    return rc;
}

static void op_create(void)
{
    int i = pick(0);
    if (i < 0)
        return;
    sseq_t *q = &SH[i];
    memset(q, 0, sizeof *q);
    arm_maybe();
    if (finish(kv_seq_create(S, &q->id)))
        return;
    q->live = 1;
    q->spec = (int)rnd(N_SPECS + 1) - 1;
    if (q->spec >= 0) {
        arm_maybe();
        if (finish(kv_seq_set_policy(S, q->id, POL[q->spec])))
            q->spec = -1; /* stays without a policy */
    }
}

/* A prompt chunk on every layer, each followed by prefill attention. */
static void op_prefill(void)
{
    int i = pick(1);
    if (i < 0 || SH[i].ended)
        return;
    sseq_t *q = &SH[i];
    uint32_t n = 1 + rnd(48);
    if (!room_for(q, n))
        return;
    float *qr = xmalloc((size_t)n * NQ * HD * 4), *out = xmalloc((size_t)n * NQ * HD * 4);
    for (uint32_t l = 0; l < NL; l++) {
        if (append(q, l, n))
            break;
        for (uint32_t j = 0; j < n * NQ * HD; j++)
            qr[j] = kv_test_randf(&rng) * 2.0f;
        kv_prefill_t a = {.layer = l, .seq = q->id, .n_new = n, .q = qr, .out = out};
        int rc = kv_attn_prefill(S, &a);
        EXPECT(rc == 0);
        if (rc == 0) /* the last new row attends to every token */
            check_row(q->id, l, UINT32_MAX / 2, qr + (size_t)(n - 1) * NQ * HD,
                      out + (size_t)(n - 1) * NQ * HD);
    }
    free(qr), free(out);
}

/* Call f (prefill_end or step_end) under a possible fault; again without
 * one after a failure. 0 when it got done. */
static int policy_call(int (*f)(kv_store_t *, kv_seq_id_t), kv_seq_id_t id)
{
    arm_maybe();
    int rc = finish(f(S, id));
    if (rc == KV_ENOMEM) {
        verify_all(); /* every list done or untouched */
        rc = f(S, id);
        EXPECT(rc == 0 || rc == KV_ENOMEM); /* the pool may be full */
    }
    return rc;
}

static void op_prefill_end(void)
{
    int i = pick(1);
    if (i < 0 || SH[i].ended)
        return;
    if (policy_call(kv_seq_prefill_end, SH[i].id) == 0) {
        SH[i].ended = 1;
        check_budget(&SH[i], 0);
    }
}

/* One decode token on every layer, attention over a batch with it, then
 * kv_seq_step_end. */
static void op_decode(void)
{
    int i = pick(1);
    if (i < 0)
        return;
    sseq_t *q = &SH[i];
    if (!room_for(q, 1))
        return;
    float qr[3 * NQ * HD], out[3 * NQ * HD];
    for (uint32_t l = 0; l < NL; l++) {
        if (append(q, l, 1))
            return;
        kv_seq_id_t batch[3] = {q->id};
        uint32_t nb = 1;
        for (int t = 0; t < 2; t++) { /* others with every list non-empty */
            int j = pick(1);
            int ok = j >= 0;
            for (uint32_t h = 0; h < NKV && ok; h++)
                ok = len_of(&SH[j], l, h) > 0;
            if (ok)
                batch[nb++] = SH[j].id;
        }
        for (uint32_t j = 0; j < nb * NQ * HD; j++)
            qr[j] = kv_test_randf(&rng) * 2.0f;
        int empty = 0;
        for (uint32_t h = 0; h < NKV; h++)
            empty |= len_of(q, l, h) == 0; /* compacted to nothing */
        kv_decode_t d = {.layer = l, .batch = nb, .seqs = batch, .q = qr, .out = out};
        int rc = kv_attn_decode(S, &d);
        EXPECT(empty ? rc == KV_ESTATE : rc == 0);
        for (uint32_t b = 0; b < nb && rc == 0; b++)
            check_row(batch[b], l, UINT32_MAX / 2, qr + b * NQ * HD, out + b * NQ * HD);
    }
    if (policy_call(kv_seq_step_end, q->id) == 0) {
        q->ended = 1; /* step_end runs prefill_end first */
        check_budget(q, 1);
    }
}

static void op_fork(void)
{
    int p = pick(1), c = pick(0);
    if (p < 0 || c < 0)
        return;
    kv_seq_id_t id;
    arm_maybe();
    if (finish(kv_seq_fork(S, SH[p].id, &id)))
        return;
    SH[c] = SH[p];
    SH[c].id = id;
}

static void op_free(void)
{
    int i = pick(1);
    if (i < 0)
        return;
    EXPECT(kv_seq_free(S, SH[i].id) == 0);
    SH[i].live = 0;
}

/* Compact one list behind the policy's back: keep a random subset with the
 * newest token. */
static void op_compact(void)
{
    int i = pick(1);
    if (i < 0)
        return;
    uint32_t l = rnd(NL), h = rnd(NKV), n = len_of(&SH[i], l, h);
    if (n == 0)
        return;
    if (SH[i].spec >= 0 && POL[SH[i].spec]->mc)
        return; /* see the file comment */
    uint32_t *keep = xmalloc((size_t)n * 4), m = 0;
    for (uint32_t t = 0; t + 1 < n; t++)
        if (rnd(4))
            keep[m++] = t;
    keep[m++] = n - 1;
    arm_maybe();
    int rc = finish(kv_compact(S, SH[i].id, l, h, keep, m));
    EXPECT(len_of(&SH[i], l, h) == (rc == 0 ? m : n));
    free(keep);
}

/* ---- driver ------------------------------------------------------------------------- */

static void run_seed(uint64_t seed, const char *ladder, uint32_t reserve, long n_op)
{
    rng = seed;
    failed = 0;
    memset(SH, 0, sizeof SH);
    memset(n_ops, 0, sizeof n_ops);
    n_enomem = n_fired = n_attn = n_budget = 0;
    uint64_t base = kv_mem_live_bytes();
    kv_config_t c = kv_config_default();
    c.n_layers = NL, c.n_kv_heads = NKV, c.n_q_heads = NQ, c.head_dim = HD;
    c.host_pages = POOL, c.n_threads = 1, c.residual = RES, c.max_seqs = 16;
    c.pressure = ladder;
    c.pressure_reserve = reserve;
    CHECK_OK(kv_store_create(&c, &S));
    if (!S)
        return;
    for (op_no = 0; op_no < n_op && !failed; op_no++) {
        uint32_t r = rnd(100);
        int op = r < 8 ? 0 : r < 40 ? 1 : r < 48 ? 2 : r < 80 ? 3 : r < 86 ? 4 : r < 92 ? 5 : 6;
        kv_stats_t st = {.struct_size = sizeof st};
        CHECK_OK(kv_store_stats(S, &st));
        if (st.pages_free < 8 && rnd(3) == 0)
            op = 5; /* make room now and then */
        n_ops[op]++;
        cur_op = op;
        switch (op) {
        case 0: op_create(); break;
        case 1: op_prefill(); break;
        case 2: op_prefill_end(); break;
        case 3: op_decode(); break;
        case 4: op_fork(); break;
        case 5: op_free(); break;
        default: op_compact(); break;
        }
        verify_all();
    }
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(S, &st));
    printf("seed %llu (%s, reserve %u): %ld ops (create %ld prefill %ld end %ld decode %ld "
           "fork %ld free %ld compact %ld), %ld ENOMEM (%ld injected), %ld attention rows "
           "checked, %ld budget checks; ladder runs %llu, pages freed %llu, converted %llu, "
           "evicted %llu\n",
           (unsigned long long)seed, ladder ? ladder : "no ladder", reserve, op_no,
           n_ops[0], n_ops[1], n_ops[2], n_ops[3], n_ops[4], n_ops[5], n_ops[6], n_enomem,
           n_fired, n_attn, n_budget, (unsigned long long)st.pressure_runs,
           (unsigned long long)st.pressure_pages_freed,
           (unsigned long long)st.pressure_converted_tokens,
           (unsigned long long)st.pressure_evicted_tokens);
    CHECK(n_attn > 0 && n_budget > 0 && n_fired > 0);
    for (int i = 0; i < MAX_SEQS; i++)
        if (SH[i].live) {
            CHECK_OK(kv_seq_free(S, SH[i].id));
            SH[i].live = 0;
        }
    CHECK_OK(kv_store_stats(S, &st));
    CHECK_EQ(st.pages_used, 0);
    CHECK_EQ(st.tokens, 0);
    CHECK_OK(kv_store_check(S));
    kv_store_destroy(S);
    S = NULL;
    CHECK_EQ(kv_mem_live_bytes(), base);
}

int main(void)
{
    for (int i = 0; i < N_SPECS; i++) {
        char err[256];
        int rc = kv_policy_parse(specs[i], &POL[i], err, sizeof err);
        if (rc)
            fprintf(stderr, "%s: %s\n", specs[i], err);
        CHECK_OK(rc);
        if (rc)
            return kv_test_end();
    }
    const char *env = getenv("KV_STRESS_OPS");
    long n_op = env ? atol(env) : 10000;
    run_seed(1, NULL, 0, n_op);
    run_seed(2, "int4,int2,evict:sink=4,recent=32", 0, n_op);
    run_seed(3, "int2,evict:sink=2,recent=24", 8, n_op);
    for (int i = 0; i < N_SPECS; i++)
        kv_policy_destroy(POL[i]);
    return kv_test_end();
}
