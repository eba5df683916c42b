/* SPDX-License-Identifier: MIT */
/*
 * test_attn_cpu.c — the CPU backend's decode and prefill attention against a
 * naive dense implementation (double-precision softmax over the decoded K/V).
 *
 * Pages are built in test-owned buffers through the formats' traits (no
 * page table); lists, calls and their checks come from the shared fixture
 * kv_test_kern.h. Checks, for decode: one and many sequences with
 * ragged lengths (incl. 1), GQA 9/3, 8/8, 32/8, head_dim 64 and 128, last
 * pages partly filled, partly filled pages in the middle, pages larger than
 * the kernel's tile (several chunks per page), contexts long enough for many
 * partitions (default size and 16, 17, 1000), large logits (stability),
 * lists whose leading pages are INT4/INT2 (partly filled) followed by FP16
 * pages (the same loop serves every format; skipped if not built);
 * for prefill: with and without earlier pages, different list lengths per
 * head, several row blocks, n_new 1. Outputs: norm-wise relative error of
 * every row <= 1e-3. Statistics (decode: some batch rows only; prefill:
 * rows stats_row0..): each token's probability summed over the group's heads
 * (and rows) within 1e-3, the total over tokens == G * rows, entries past a
 * list's length and rows without stats untouched. Identical bits with 1 and 2
 * threads and with every build of the loops the CPU runs; identical bits
 * from several threads calling one 3-worker backend at once (the workers
 * serve one call, the others run on their callers). Bad parameters give
 * their error and leave out/stats untouched; an allocation failure gives
 * KV_ENOMEM, writes nothing and leaks nothing.
 */
#include <pthread.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kernels/cpu/kv_cpu.h"
#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "kv_test_kern.h"

/* FP16 lists with random page fills, head_dim 64, 4096-byte pages. */
static void fp16_lists(kv_test_lists_t *L, uint32_t n, const uint32_t *lens,
                       uint64_t *s)
{
    const kv_test_layout_t lo = {.d = 64, .page_bytes = 4096, .lens = lens,
                                 .fmts = "0", .ragged = 1, .kscale = 1};
    kv_test_lists_build(L, n, &lo, s);
}

static kv_backend_t be[2]; /* 1 and 2 threads */

/* ---- decode ------------------------------------------------------------- */

typedef struct dcase {
    const char *name;
    uint32_t batch, nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [batch * nkv] */
    int ragged;
    uint32_t part;
    uint32_t stats_mask;  /* bit b: batch row b wants stats */
    float qscale, kscale;
    uint32_t qfmt, qtok;  /* leading tokens of each list in format qfmt */
} dcase_t;

/* FP16 pages (ragged: random fills) after the leading qtok tokens in qfmt
 * pages; 1 thread == 2 threads. */
static void run_decode(const dcase_t *c, uint64_t seed)
{
    const kv_test_layout_t lo = {
        .d = c->d, .page_bytes = c->page_bytes, .lens = c->lens,
        .fmts = "0", .ragged = c->ragged, .kscale = c->kscale,
        .lead_fmt = c->qfmt, .lead_tok = c->qtok};
    const kv_test_decode_t run = {
        .name = c->name, .batch = c->batch, .nq = c->nq, .nkv = c->nkv,
        .part = c->part, .stats_mask = c->stats_mask, .qscale = c->qscale};
    kv_test_run_decode(be, 2, &lo, &run, seed);
}

static void test_decode(void)
{
    static const uint32_t one[] = {1, 1, 1};
    static const uint32_t short3[] = {37, 16, 5};
    static const uint32_t rag[] = {1,  17, 300, 1000, 5,   64, 2,  999,
                                   33, 16, 15,  1,    200, 7,  48, 130};
    static uint32_t long3[3] = {5000, 4999, 4097};
    static uint32_t lens8[8], lens32[4 * 8];
    uint64_t s = 5;
    for (int i = 0; i < 8; i++)
        lens8[i] = 1 + (uint32_t)(kv_test_rand(&s) % 700);
    for (int i = 0; i < 32; i++)
        lens32[i] = 1 + (uint32_t)(kv_test_rand(&s) % 400);
    const dcase_t cases[] = {
        {"len1", 1, 9, 3, 64, 4096, one, 0, 0, 1, 4, 1, 0, 0},
        {"short", 1, 9, 3, 64, 4096, short3, 0, 0, 1, 4, 1, 0, 0},
        {"ragged-batch", 4, 12, 4, 64, 4096, rag, 1, 0, 0x5, 4, 1, 0, 0},
        {"gqa9/3-long", 1, 9, 3, 64, 4096, long3, 0, 0, 1, 4, 1, 0, 0},
        {"part16", 1, 9, 3, 64, 4096, long3, 1, 16, 1, 4, 1, 0, 0},
        {"part17", 1, 9, 3, 64, 4096, long3, 0, 17, 1, 4, 1, 0, 0},
        {"part1000", 1, 9, 3, 64, 4096, long3, 1, 1000, 1, 4, 1, 0, 0},
        {"mha8/8-d128", 1, 8, 8, 128, 8192, lens8, 1, 0, 1, 4, 1, 0, 0},
        {"gqa32/8-d128", 4, 32, 8, 128, 8192, lens32, 0, 100, 0xa, 4, 1, 0,
         0},
        {"page17", 1, 9, 3, 64, 4096 + 256, short3, 1, 0, 1, 4, 1, 0, 0},
        {"bigpage", 1, 9, 3, 64, 65536, long3, 1, 0, 1, 4, 1, 0, 0},
        {"d128-bigpage", 2, 8, 2, 128, 1 << 17, lens8, 1, 333, 0x3, 4, 1, 0,
         0},
        {"big-logits", 1, 9, 3, 64, 4096, long3, 1, 0, 1, 40, 4, 0, 0},
        /* one loop for every format: quantized pages, then FP16 ones */
        {"int2+fp16", 4, 12, 4, 64, 4096, rag, 1, 0, 0x3, 4, 1,
         KV_FMT_INT2, 600},
        {"int4+fp16", 1, 9, 3, 64, 4096, long3, 1, 17, 1, 4, 1,
         KV_FMT_INT4, 4000},
        {"int2-d128", 4, 32, 8, 128, 8192, lens32, 0, 100, 0x5, 4, 1,
         KV_FMT_INT2, 300},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].qtok && !kv_format_get(cases[i].qfmt)) {
            fprintf(stderr, "note: %s: format %u not built, case skipped\n",
                    cases[i].name, cases[i].qfmt);
            continue;
        }
        run_decode(&cases[i], 100 + i);
    }
}

/* ---- prefill ------------------------------------------------------------ */

typedef struct pcase {
    const char *name;
    uint32_t nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [nkv] */
    uint32_t n_new;
    int ragged, stats;
    uint32_t row0;
    float qscale;
} pcase_t;

static void run_prefill(const pcase_t *c, uint64_t seed)
{
    const kv_test_layout_t lo = {.d = c->d, .page_bytes = c->page_bytes,
                                 .lens = c->lens, .fmts = "0",
                                 .ragged = c->ragged, .kscale = 1};
    const kv_test_prefill_t run = {
        .name = c->name, .nq = c->nq, .nkv = c->nkv, .n_new = c->n_new,
        .row0 = c->row0, .stats = c->stats, .qscale = c->qscale};
    kv_test_run_prefill(be, 2, &lo, &run, seed);
}

static void test_prefill(void)
{
    static const uint32_t l100[] = {100, 100, 100};
    static const uint32_t l300[] = {300, 300, 300};
    static const uint32_t diff[] = {200, 150, 181};
    static const uint32_t l130[8] = {130, 130, 130, 130, 130, 130, 130, 130};
    static const uint32_t l90[8] = {90, 95, 100, 90, 91, 92, 93, 94};
    static const uint32_t one[] = {1, 1, 1};
    static const uint32_t l40[] = {40, 41, 42};
    const pcase_t cases[] = {
        {"no-history", 9, 3, 64, 4096, l100, 100, 0, 1, 0, 4},
        {"history", 9, 3, 64, 4096, l300, 70, 1, 1, 0, 4},
        {"diff-lens", 9, 3, 64, 4096, diff, 50, 1, 1, 17, 4},
        {"mha-blocks", 8, 8, 64, 4096, l130, 130, 0, 1, 100, 4},
        {"gqa32/8-d128", 32, 8, 128, 8192, l90, 40, 1, 1, 39, 4},
        {"one", 9, 3, 64, 4096, one, 1, 0, 1, 0, 4},
        {"n_new1", 9, 3, 64, 4096, l300, 1, 1, 1, 0, 4},
        {"no-stats", 9, 3, 64, 4096, l300, 64, 0, 0, 0, 4},
        {"page17-bigq", 9, 3, 64, 4096 + 256, l40, 40, 1, 1, 5, 30},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_prefill(&cases[i], 200 + i);
}

/* ---- bad parameters, allocation failure, loop builds -------------------- */

enum { E_OUT = 9 * 64, E_ST = 3 * 41 }; /* test_errors' out and stats */

static void fill(float *x, size_t n, float val)
{
    for (size_t j = 0; j < n; j++)
        x[j] = val;
}

/* What a call wrote: 1 if out[E_OUT] differs from keep, plus the
 * statistics entries st[E_ST] that no longer hold the sentinel. */
static long writes(const float *out, const float *keep, const float *st)
{
    long n = memcmp(out, keep, E_OUT * sizeof *out) != 0;
    for (int j = 0; j < E_ST; j++)
        n += st[j] != KV_TEST_SENTINEL;
    return n;
}

static void test_errors(void)
{
    static const uint32_t lens[] = {40, 33, 1};
    uint64_t s = 77;
    kv_test_lists_t f;
    fp16_lists(&f, 3, lens, &s);
    float q[E_OUT], out[E_OUT], keep[E_OUT];
    for (int j = 0; j < E_OUT; j++)
        q[j] = kv_test_randf(&s);
    fill(out, E_OUT, KV_TEST_SENTINEL);
    fill(keep, E_OUT, KV_TEST_SENTINEL);
    float st[E_ST], *sp[1] = {st};
    fill(st, E_ST, KV_TEST_SENTINEL);
    const kv_attn_decode_params_t good = {
        .geom = f.geom, .batch = 1, .n_q_heads = 9, .n_kv_heads = 3,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len,
        .q = q, .out = out, .stats = sp, .stats_stride = 41, .scale = 0.125f,
    };
    kv_attn_decode_params_t p;
    uint32_t bad_len[3] = {40, 34, 1}, zero_len[3] = {40, 33, 0};
    uint32_t bad_ind[4] = {f.indptr[0], f.indptr[2], f.indptr[1], f.indptr[3]};
    kv_kern_page_t *pg = kv_test_xcalloc(f.indptr[3], sizeof *pg);
    long changed = 0;
#define EXPECT(rc_want, setup)                                               \
    do {                                                                     \
        p = good;                                                            \
        memcpy(pg, f.pages, f.indptr[3] * sizeof *pg);                       \
        p.pages = pg;                                                        \
        setup;                                                               \
        CHECK_EQ(be[1].ops->attn_decode(be[1].ctx, &p), rc_want);            \
        changed += writes(out, keep, st);                                    \
    } while (0)
    EXPECT(KV_EINVAL, p.q = NULL);
    EXPECT(KV_EINVAL, p.out = NULL);
    EXPECT(KV_EINVAL, p.indptr = NULL);
    EXPECT(KV_EINVAL, p.pages = NULL);
    EXPECT(KV_EINVAL, p.seq_len = NULL);
    EXPECT(KV_EINVAL, p.batch = 0);
    EXPECT(KV_EINVAL, p.n_q_heads = 8);
    EXPECT(KV_EINVAL, p.n_kv_heads = 0);
    EXPECT(KV_EINVAL, p.geom.head_dim = 60);
    EXPECT(KV_EINVAL, p.geom.page_bytes = 256); /* 1 token per page */
    EXPECT(KV_EINVAL, p.scale = 0.0f);
    EXPECT(KV_EINVAL, p.scale = NAN);
    EXPECT(KV_EINVAL, p.scale = INFINITY);
    EXPECT(KV_EINVAL, p.seq_len = bad_len);
    EXPECT(KV_EINVAL, p.seq_len = zero_len);
    EXPECT(KV_EINVAL, p.indptr = bad_ind);
    EXPECT(KV_EINVAL, pg[1].n_tokens = 0);
    EXPECT(KV_EINVAL, pg[1].n_tokens = 17);
    EXPECT(KV_EINVAL, pg[2].data = NULL);
    EXPECT(KV_EINVAL, pg[2].variant = 1); /* FP16 pages have no variants */
    EXPECT(KV_EINVAL, pg[2].variant = 2);
    for (uint32_t fm = 0; fm < KV_FMT_COUNT; fm++) /* not implemented yet */
        if (!kv_format_get(fm))
            EXPECT(KV_ENOTSUP, pg[3].format = fm);
    EXPECT(KV_ENOTSUP, pg[0].format = 99);
    EXPECT(KV_EINVAL, p.stats_stride = 39);
    EXPECT(0, p.stats_stride = 39; p.stats = NULL); /* no stats: fine */
    CHECK_EQ(changed, 1); /* only the last (valid) call wrote out */
    CHECK(kv_backend_cpu_create(0, 0, NULL) == KV_EINVAL);

    /* allocation failure: ENOMEM, nothing written, nothing leaked */
    fill(out, E_OUT, KV_TEST_SENTINEL);
    uint64_t live = kv_mem_live_bytes();
    kv_fault_arm(1);
    p = good;
    CHECK_EQ(be[1].ops->attn_decode(be[1].ctx, &p), KV_ENOMEM);
    CHECK(kv_fault_fired());
    kv_fault_arm(0);
    CHECK(memcmp(out, keep, sizeof out) == 0);
    for (int j = 0; j < E_ST; j++)
        CHECK(st[j] == KV_TEST_SENTINEL);
    CHECK_EQ(kv_mem_live_bytes(), live);
    CHECK_OK(be[1].ops->attn_decode(be[1].ctx, &p));
    CHECK_EQ(kv_mem_live_bytes(), live);

    /* prefill */
    const kv_attn_prefill_params_t pgood = {
        .geom = f.geom, .n_q_heads = 9, .n_kv_heads = 3, .indptr = f.indptr,
        .pages = f.pages, .seq_len = f.seq_len, .n_new = 1, .q = q,
        .out = out, .stats = st, .stats_stride = 41, .stats_row0 = 0,
        .scale = 0.125f,
    };
    kv_attn_prefill_params_t pp;
    fill(out, E_OUT, KV_TEST_SENTINEL);
    fill(st, E_ST, KV_TEST_SENTINEL);
    changed = 0;
#define PEXPECT(rc_want, setup)                                              \
    do {                                                                     \
        pp = pgood;                                                          \
        setup;                                                               \
        CHECK_EQ(be[1].ops->attn_prefill(be[1].ctx, &pp), rc_want);          \
        changed += writes(out, keep, st);                                    \
    } while (0)
    PEXPECT(KV_EINVAL, pp.n_new = 0);
    PEXPECT(KV_EINVAL, pp.n_new = 2); /* list 2 has 1 token */
    PEXPECT(KV_EINVAL, pp.stats_row0 = 1);
    PEXPECT(KV_EINVAL, pp.stats_stride = 20);
    PEXPECT(KV_EINVAL, pp.q = NULL);
    PEXPECT(KV_EINVAL, pp.n_q_heads = 10);
    PEXPECT(KV_EINVAL, pp.seq_len = bad_len);
    CHECK_EQ(changed, 0);
    kv_fault_arm(1);
    PEXPECT(KV_ENOMEM, (void)0);
    kv_fault_arm(0);
    CHECK_EQ(changed, 0);
    CHECK_EQ(kv_mem_live_bytes(), live);
#undef EXPECT
#undef PEXPECT
    free(pg);
    kv_test_lists_free(&f);
}

/* Every build of the loops the CPU runs gives the same bits (FP16 lists,
 * decode with statistics). */
static void test_loop_builds(void)
{
    kv_cpu_t *cx = be[1].ctx;
    uint32_t nb = 0;
    const kv_cpu_loops_t *const *b = kv_cpu_builds(&nb);
    CHECK(cx->loops == b[nb - 1]);
    if (nb < 2) {
        fprintf(stderr, "note: only the portable build runs on this CPU\n");
        return;
    }
    static const uint32_t lens[] = {1000, 77, 513};
    uint64_t s = 31;
    kv_test_lists_t f;
    fp16_lists(&f, 3, lens, &s);
    float q[9 * 64], o1[9 * 64], o2[9 * 64], s1[3 * 1000], s2[3 * 1000];
    float *sp1[1] = {s1}, *sp2[1] = {s2};
    for (int j = 0; j < 9 * 64; j++)
        q[j] = kv_test_randf(&s) * 4;
    kv_attn_decode_params_t p = {
        .geom = f.geom, .batch = 1, .n_q_heads = 9, .n_kv_heads = 3,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len, .q = q,
        .out = o1, .stats = sp1, .stats_stride = 1000, .scale = 0.125f,
    };
    fill(s1, 3 * 1000, KV_TEST_SENTINEL);
    CHECK_OK(be[1].ops->attn_decode(be[1].ctx, &p));
    const kv_cpu_loops_t *best = cx->loops;
    for (uint32_t i = 0; i + 1 < nb; i++) {
        cx->loops = b[i];
        p.out = o2;
        p.stats = sp2;
        fill(s2, 3 * 1000, KV_TEST_SENTINEL);
        CHECK_OK(be[1].ops->attn_decode(be[1].ctx, &p));
        CHECK(memcmp(o1, o2, sizeof o1) == 0);
        CHECK(memcmp(s1, s2, sizeof s1) == 0);
    }
    cx->loops = best;
    kv_test_lists_free(&f);
}

/* Several threads decode on one backend at once; every result must equal
 * the single-threaded one bit for bit. */
typedef struct conc_arg {
    const kv_backend_t *be;
    kv_attn_decode_params_t p; /* out points to this thread's buffer */
    const float *want;
    size_t n;
    int bad;
} conc_arg_t;

static void *conc_main(void *a_)
{
    conc_arg_t *a = a_;
    for (int it = 0; it < 40; it++) {
        memset(a->p.out, 0, a->n * sizeof(float));
        if (a->be->ops->attn_decode(a->be->ctx, &a->p) != 0 ||
            memcmp(a->p.out, a->want, a->n * sizeof(float)) != 0)
            a->bad++;
    }
    return NULL;
}

static void test_concurrent(void)
{
    enum { NT = 3 };
    static const uint32_t lens[] = {3000, 1, 700, 1500, 64, 2};
    uint64_t s = 57;
    kv_test_lists_t f;
    fp16_lists(&f, 6, lens, &s);
    kv_backend_t be3;
    CHECK_OK(kv_backend_cpu_create(3, 0, &be3));
    size_t n = 2 * 9 * 64;
    float q[2 * 9 * 64], want[2 * 9 * 64], out[NT][2 * 9 * 64];
    for (size_t j = 0; j < n; j++)
        q[j] = kv_test_randf(&s) * 4;
    kv_attn_decode_params_t p = {
        .geom = f.geom, .batch = 2, .n_q_heads = 9, .n_kv_heads = 3,
        .indptr = f.indptr, .pages = f.pages, .seq_len = f.seq_len, .q = q,
        .out = want, .scale = 0.125f, .partition_tokens = 100,
    };
    CHECK_OK(be[0].ops->attn_decode(be[0].ctx, &p));
    conc_arg_t args[NT];
    pthread_t th[NT];
    int started = 0;
    for (int i = 0; i < NT; i++) {
        args[i] = (conc_arg_t){.be = &be3, .p = p, .want = want, .n = n};
        args[i].p.out = out[i];
        if (pthread_create(&th[i], NULL, conc_main, &args[i]) == 0)
            started++;
    }
    CHECK_EQ(started, NT);
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(args[i].bad, 0);
    }
    kv_backend_destroy(&be3);
    kv_test_lists_free(&f);
}

int main(void)
{
    if (kv_backend_cpu_create(1, 0, &be[0]) ||
        kv_backend_cpu_create(2, 0, &be[1])) {
        fprintf(stderr, "cannot create the CPU backend\n");
        return 1;
    }
    CHECK(strcmp(be[0].ops->name, "cpu") == 0);
    test_decode();
    test_prefill();
    test_errors();
    test_loop_builds();
    test_concurrent();
    kv_backend_destroy(&be[0]);
    kv_backend_destroy(&be[1]);
    CHECK(be[0].ops == NULL);
    kv_backend_destroy(&be[0]); /* twice: no-op */
    return kv_test_end();
}
