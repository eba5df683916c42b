/* SPDX-License-Identifier: MIT */
/*
 * test_attn_mixed.c — CPU backend attention over page lists that mix the
 * FP16, INT4 and INT2 formats (kernel level, no page table).
 *
 * Pages are built in test-owned buffers through each format's traits from
 * random data; a list's pages take formats at random ("?") or in a fixed
 * pattern ("012": page j has format j % 3, "120", "201"), INT pages
 * sometimes with a partly used last group. The
 * reference is dense attention in double precision over the DECODED values
 * (each page decoded with its own format's load), so quantization error does
 * not enter the comparison. Checks, for decode (GQA 9/3 and 8/2, head_dim 64
 * and 128, the default partition size and small ones that start partitions
 * inside pages and inside 16-token groups, a batch with ragged lengths incl.
 * 1) and prefill (with history, several row blocks): norm-wise relative
 * error of every output row <= 1e-3; statistics per token (summed over the
 * group's q heads and the counted rows) within 1e-3 relative, their total ==
 * G * rows, entries past a list untouched. A control (decode and
 * prefill): the same lists read as the original (unquantized) data differ
 * from the output by at least 1e-2, so the INT pages really were decoded
 * as INT. The "rot" cases store the INT pages rotated (variant 1): the
 * kernels score R q against rotated keys and un-rotate the value sums, and
 * the statistics pass (prefill rows beyond what a thread's scratch holds)
 * rotates q in blocks that fit it. Lists, calls and checks: the shared fixture kv_test_kern.h.
 *
 * Needs KV_FMT_INT4 / KV_FMT_INT2 in kv_format_table (the backend finds a
 * page's load through kv_format_get): otherwise the backend answers
 * KV_ENOTSUP and the test fails.
 */
#include "kernels/kv_backend.h"
#include "kv_test.h"
#include "kv_test_kern.h"

static kv_backend_t be;

/* ---- decode ------------------------------------------------------------- */

typedef struct dcase {
    const char *name;
    uint32_t batch, nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [batch * nkv] */
    int ragged;           /* page fill: full, or 1..T tokens at random */
    const char *fmts;     /* page j's format: fmts[j % len], '?' random */
    uint32_t part;        /* partition_tokens (0 = default) */
    uint32_t stats_mask;  /* bit b: batch row b wants stats */
    int rot;              /* INT pages rotated (variant 1) */
} dcase_t;

/* Lists of mixed-format pages (K scaled by 4) with their original values
 * (the control); they do mix the three formats. */
static void run_decode(const dcase_t *c, uint64_t seed)
{
    const kv_test_layout_t lo = {
        .d = c->d, .page_bytes = c->page_bytes, .lens = c->lens,
        .fmts = c->fmts, .ragged = c->ragged, .kscale = 4, .originals = 1,
        .rot = c->rot};
    const kv_test_decode_t run = {
        .name = c->name, .batch = c->batch, .nq = c->nq, .nkv = c->nkv,
        .part = c->part, .stats_mask = c->stats_mask, .qscale = 1};
    kv_test_run_decode(&be, 1, &lo, &run, seed);
}

static void test_decode(void)
{
    static const uint32_t l3[] = {700, 333, 1001};
    static const uint32_t rag[] = {1, 250, 64, 17, 900, 130};
    static const uint32_t l4[] = {1500, 47, 640, 1111};
    const dcase_t cases[] = {
        /* name, batch, nq, nkv, d, page, lens, ragged, fmts, part, stats,
         * rot */
        {"gqa9/3-full", 1, 9, 3, 64, 4096, l3, 0, "012", 0, 0x1, 0},
        {"gqa9/3-random", 1, 9, 3, 64, 4096, l3, 1, "?", 0, 0x1, 0},
        {"part17", 1, 9, 3, 64, 4096, l3, 1, "?", 17, 0x1, 0},
        {"part100", 1, 9, 3, 64, 12288, l3, 0, "120", 100, 0x1, 0},
        {"batch2-ragged", 2, 9, 3, 64, 4096, rag, 1, "?", 0, 0x2, 0},
        {"d128-gqa8/2", 2, 8, 2, 128, 8192, l4, 1, "?", 50, 0x3, 0},
        {"rot-gqa9/3", 1, 9, 3, 64, 4096, l3, 1, "?", 0, 0x1, 1},
        {"rot-d128-part50", 2, 8, 2, 128, 8192, l4, 1, "?", 50, 0x3, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_decode(&cases[i], 300 + i);
}

/* ---- prefill ------------------------------------------------------------ */

typedef struct pcase {
    const char *name;
    uint32_t nq, nkv, d, page_bytes;
    const uint32_t *lens; /* [nkv] */
    uint32_t n_new;
    int ragged;
    const char *fmts;
    uint32_t row0;
    int rot; /* INT pages rotated (variant 1) */
} pcase_t;

static void run_prefill(const pcase_t *c, uint64_t seed)
{
    const kv_test_layout_t lo = {
        .d = c->d, .page_bytes = c->page_bytes, .lens = c->lens,
        .fmts = c->fmts, .ragged = c->ragged, .kscale = 4, .originals = 1,
        .rot = c->rot};
    const kv_test_prefill_t run = {
        .name = c->name, .nq = c->nq, .nkv = c->nkv, .n_new = c->n_new,
        .row0 = c->row0, .stats = 1, .qscale = 1};
    kv_test_run_prefill(&be, 1, &lo, &run, seed);
}

static void test_prefill(void)
{
    static const uint32_t l3[] = {400, 257, 330};
    static const uint32_t l2[] = {300, 300};
    const pcase_t cases[] = {
        /* name, nq, nkv, d, page, lens, n_new, ragged, fmts, row0, rot */
        {"history", 9, 3, 64, 4096, l3, 70, 1, "?", 0, 0},
        {"blocks", 9, 3, 64, 4096, l3, 200, 0, "201", 150, 0},
        {"d128", 8, 2, 128, 8192, l2, 33, 1, "?", 32, 0},
        /* statistics over more rows than the thread scratch holds */
        {"rot-blocks", 9, 3, 64, 4096, l3, 200, 1, "?", 0, 1},
        {"rot-d128", 8, 2, 128, 8192, l2, 150, 0, "201", 20, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_prefill(&cases[i], 400 + i);
}

int main(void)
{
    if (kv_backend_cpu_create(2, 0, &be)) {
        fprintf(stderr, "cannot create the CPU backend\n");
        return 1;
    }
    /* the backend reads a page through kv_format_get(format)->load */
    CHECK(kv_format_get(KV_FMT_INT4) != NULL);
    CHECK(kv_format_get(KV_FMT_INT2) != NULL);
    test_decode();
    test_prefill();
    kv_backend_destroy(&be);
    return kv_test_end();
}
