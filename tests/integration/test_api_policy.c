/* SPDX-License-Identifier: MIT */
/*
 * test_api_policy.c — policies through the public API: compositions
 * (SimLayerKV + MiniKV, H2O + INT4, SnapKV + INT2, StreamingLLM + CaM,
 * Expected Attention + INT4, AdaKV budgets on H2O + CaM, SnapKV, MiniKV) run
 * end to end and keep the store consistent; fork copies the policy state
 * (parent and child then evolve alike, and independently); set_policy on a
 * non-empty sequence, detaching, zero-length prompts, budgets larger than
 * the prompt, a caller's own stats buffers during a policy; allocation
 * failure injection on kv_seq_prefill_end and kv_seq_step_end at every
 * allocation N = 1.. until one succeeds: each failure returns KV_ENOMEM,
 * kv_store_check passes, and calling again ends in exactly the state of a
 * run without faults; no metadata leaks.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "../unit/test_policy_env.h"
#include "kv_test_snap.h"

/* A sequence's lists, bit for bit (kv_test_snap.h). */
static void take(const pe_t *e, kv_seq_id_t s, kv_test_seq_t *sn)
{
    CHECK_OK(kv_test_seq_take(e->s, s, sn));
}

static const char *const specs[] = {
    "h2o:hh=6,rw=10", "h2o:hh=6,rw=10+cam:m=4,seed=3", "streamingllm:sink=4,recent=12+cam:m=4",
    "snapkv:w=8,c=20+int2:r=16", "minikv:hh=0.2,rw=0.2", "minikv:hh=0.2,rw=0.2,pyramid=7",
    "simlayerkv:w=8+minikv:hh=0.2,rw=0.2", "h2o:hh=8,rw=8+int4:r=16", "kivi2:r=16",
    "minicache:from=0.5,every=4+int4:r=16", "simlayerkv:w=8,mode=prefill+int4:r=16",
    "eattn:c=20,rw=6,sink=2+int4:r=16", "eattn:c=0.3,w=8,ada=1,rope=halves",
    "h2o:hh=6,rw=10,ada=1+cam:m=4", "snapkv:w=8,c=20,ada=1+int2:r=16",
    "minikv:hh=0.2,rw=0.2,ada=1,alpha=0.5", "snapkv:w=8,c=20,ada=2+int2:r=16",
    "eattn:c=0.3,w=8,ada=2,rope=halves",
};

static void setup(pe_t *e)
{
    CHECK_OK(pe_open(e, 2, 2, 2, 16, 512));
    e->hot[0][0] = 0, e->hot[0][1] = 1, e->hot[0][2] = 2, e->hot[0][3] = 3;
    e->hot[1][0] = 30;
    e->chunk = 24;
}

/* Reference run of spec: prompt 64, prefill end, 3 steps. */
static void reference(const char *spec, kv_test_seq_t *ref)
{
    pe_t e;
    setup(&e);
    kv_seq_id_t s;
    CHECK_OK(pe_seq(&e, spec, &s));
    CHECK_OK(pe_prefill(&e, s, 64));
    CHECK_OK(kv_seq_prefill_end(e.s, s));
    for (int i = 0; i < 3; i++)
        CHECK_OK(pe_step(&e, s, 64 + i));
    CHECK_OK(kv_store_check(e.s));
    take(&e, s, ref);
    kv_store_destroy(e.s);
}

static long n_failed; /* calls that failed by injection (all specs) */

/* Faults at allocation n of fn; returns 1 once a call succeeded with no
 * fault fired. */
static int faulty(pe_t *e, kv_seq_id_t s, int is_step, uint64_t n)
{
    kv_fault_arm(n);
    int rc = is_step ? kv_seq_step_end(e->s, s) : kv_seq_prefill_end(e->s, s);
    int fired = kv_fault_fired();
    kv_fault_arm(0);
    if (rc) {
        n_failed++;
        CHECK_EQ(rc, KV_ENOMEM);
        CHECK(fired);
        CHECK_OK(kv_store_check(e->s));
        rc = is_step ? kv_seq_step_end(e->s, s) : kv_seq_prefill_end(e->s, s);
        CHECK_OK(rc);
    }
    return !fired;
}

static void test_faults(const char *spec)
{
    kv_test_seq_t ref, got;
    reference(spec, &ref);
    for (int which = 0; which < 2; which++) {
        int done = 0;
        for (uint64_t n = 1; n < 400 && !done; n++) {
            uint64_t live0 = kv_mem_live_bytes();
            pe_t e;
            setup(&e);
            kv_seq_id_t s;
            CHECK_OK(pe_seq(&e, spec, &s));
            CHECK_OK(pe_prefill(&e, s, 64));
            if (which == 0)
                done = faulty(&e, s, 0, n);
            else
                CHECK_OK(kv_seq_prefill_end(e.s, s));
            for (int i = 0; i < 3; i++) {
                CHECK_OK(pe_decode(&e, s, 64 + i));
                if (which == 1 && i == 2)
                    done = faulty(&e, s, 1, n);
                else
                    CHECK_OK(kv_seq_step_end(e.s, s));
            }
            take(&e, s, &got);
            if (!kv_test_seq_same(&ref, &got))
                fprintf(stderr, "  %s: fault %llu in %s: state differs\n", spec,
                        (unsigned long long)n, which ? "step_end" : "prefill_end");
            CHECK(kv_test_seq_same(&ref, &got));
            kv_test_seq_free(&got);
            kv_store_destroy(e.s);
            CHECK_EQ(kv_mem_live_bytes(), live0);
        }
        CHECK(done);
    }
    kv_test_seq_free(&ref);
}

static void test_fork(void)
{
    pe_t e;
    setup(&e);
    kv_seq_id_t p, c, solo;
    CHECK_OK(pe_seq(&e, "h2o:hh=6,rw=10+cam:m=4", &p));
    CHECK_OK(pe_seq(&e, "h2o:hh=6,rw=10+cam:m=4", &solo));
    CHECK_OK(pe_prefill(&e, p, 64));
    CHECK_OK(pe_prefill(&e, solo, 64));
    CHECK_OK(kv_seq_prefill_end(e.s, p));
    CHECK_OK(kv_seq_prefill_end(e.s, solo));
    CHECK_OK(pe_step(&e, p, 64));
    CHECK_OK(pe_step(&e, solo, 64));
    CHECK_OK(kv_seq_fork(e.s, p, &c)); /* child gets the scores and the rng */
    for (int i = 1; i < 4; i++) {
        CHECK_OK(pe_step(&e, c, 64 + i));
        CHECK_OK(pe_step(&e, solo, 64 + i));
    }
    kv_test_seq_t a, b;
    take(&e, c, &a);
    take(&e, solo, &b);
    CHECK(kv_test_seq_same(&a, &b));
    kv_test_seq_free(&a);
    kv_test_seq_free(&b);
    CHECK_EQ(pe_len(&e, p, 0, 0), 16); /* parent untouched by the child's steps */
    CHECK(pe_has(&e, p, 0, 0, 64) && !pe_has(&e, p, 0, 0, 65));
    CHECK_OK(kv_seq_free(e.s, p));
    CHECK_OK(pe_step(&e, c, 68));
    CHECK_EQ(pe_len(&e, c, 0, 0), 16);
    CHECK_OK(kv_store_check(e.s));
    kv_store_destroy(e.s);
}

static void test_edges(void)
{
    pe_t e;
    setup(&e);
    kv_policy_t *pol;
    CHECK_OK(kv_policy_parse("h2o:hh=0.1,rw=0.1", &pol, NULL, 0));
    kv_seq_id_t s, z, big;
    CHECK_OK(kv_seq_create(e.s, &s));
    CHECK_EQ(kv_seq_set_policy(e.s, 999, pol), KV_ENOENT);
    CHECK_EQ(kv_seq_set_policy(NULL, s, pol), KV_EINVAL);
    CHECK_EQ(kv_seq_prefill_end(e.s, 999), KV_ENOENT);
    CHECK_EQ(kv_seq_step_end(e.s, 999), KV_ENOENT);
    CHECK_OK(pe_prefill(&e, s, 10));
    CHECK_EQ(kv_seq_set_policy(e.s, s, pol), KV_ESTATE); /* not empty */
    CHECK_OK(kv_seq_prefill_end(e.s, s));                /* no policy: no-op */
    CHECK_EQ(pe_len(&e, s, 0, 0), 10);
    /* Zero-length prompt: prefill end is a no-op, decoding works. */
    CHECK_OK(kv_seq_create(e.s, &z));
    CHECK_OK(kv_seq_set_policy(e.s, z, pol));
    CHECK_OK(kv_seq_prefill_end(e.s, z));
    for (int i = 0; i < 3; i++)
        CHECK_OK(pe_step(&e, z, i));
    CHECK(pe_len(&e, z, 0, 0) >= 1);
    /* Budgets larger than the prompt: keep everything. */
    CHECK_OK(pe_seq(&e, "h2o:hh=500,rw=500", &big));
    CHECK_OK(pe_prefill(&e, big, 40));
    CHECK_OK(kv_seq_prefill_end(e.s, big));
    CHECK_OK(pe_step(&e, big, 40));
    CHECK_EQ(pe_len(&e, big, 1, 1), 41);
    /* A caller's own stats still come back with a policy attached. */
    float q[4 * PE_D], out[4 * PE_D], st[2][64], st2[2][64];
    float k[2 * PE_D], v[2 * PE_D];
    pe_token(&e, 0, 41, k, v);
    int32_t p41 = 41;
    CHECK_OK(kv_append(e.s, big, 0, 1, KV_DTYPE_F32, k, v, &p41));
    pe_query(&e, 0, 41, q);
    float *sp[1] = {&st[0][0]};
    kv_decode_t d = {.layer = 0, .batch = 1, .seqs = &big, .q = q, .out = out,
                     .stats = sp, .stats_stride = 64};
    CHECK_OK(kv_attn_decode(e.s, &d));
    CHECK_OK(kv_seq_set_policy(e.s, big, NULL)); /* detach: plain attention */
    sp[0] = &st2[0][0];
    CHECK_OK(kv_attn_decode(e.s, &d));
    double sum = 0;
    for (int i = 0; i < 42; i++) {
        CHECK(fabsf(st[0][i] - st2[0][i]) < 1e-6f);
        sum += st[0][i];
    }
    CHECK(fabs(sum - 2.0) < 1e-4); /* two q heads, each sums to 1 */
    d.stats_stride = 8;
    CHECK_EQ(kv_attn_decode(e.s, &d), KV_ERANGE);
    kv_policy_destroy(pol);
    CHECK_OK(kv_store_check(e.s));
    kv_store_destroy(e.s);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        test_faults(specs[i]);
    CHECK(n_failed > 50); /* the injection reached the policy code */
    fprintf(stderr, "%ld injected failures survived\n", n_failed);
    test_fork();
    test_edges();
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
