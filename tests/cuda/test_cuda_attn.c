/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_attn.c — the CUDA backend's attention against the CPU reference
 * backend, on random pages of every format mixed in one list (MERGED read
 * as both variants, pages shared between lists):
 *   decode  head_dim 64 and 128; GQA groups of 1, 3, 8 and 12 heads (the
 *           4-row and 8-row kernels, two row groups); ragged batches; the
 *           default partition, a small one (split-K + reduce) and one
 *           longer than every list (single pass); statistics for some
 *           batch rows;
 *   prefill causal, with and without cached tokens before the new ones,
 *           statistics counted from row 0 and from a later row;
 *   rotated rotated INT4 / INT2 pages (variant 1): lists of only rotated
 *           pages, and rotated pages among FP16, plain INT and MERGED
 *           ones; decode (single pass and split-K) and prefill, with
 *           statistics, head_dim 64 and 128, both row-block sizes;
 *   long    one context of KV_CUDA_TEST_MAX_CTX tokens (default 8192;
 *           scripts/gpu_check.sh sets 131072);
 *   large   pages of 20480 and 24576 bytes (over 48 KiB of shared memory
 *           with the kernel's static part: the launch must opt in);
 *   device  a device-mode backend reading pages written into its pool;
 *   errors  an unsupported head_dim is KV_ENOTSUP and leaves out untouched.
 * Outputs must agree within 1e-3 of the largest reference magnitude per
 * query row, statistics within 1e-3 per list.
 *
 * KV_CUDA_TEST_QUICK=1 runs a subset that still reaches every kernel
 * (the emulator's race check, tests cuda_emu/race_attn, where every access
 * is instrumented).
 *
 * Without a GPU the program exits 77 at once. KV_CUDA_TEST_SELFCHECK=1 runs
 * it anyway with a second CPU backend in place of the CUDA one (checks the
 * test itself, not the GPU code; device-mode cases are skipped).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kv_cuda.h"
#include "kv_test.h"
#include "test_cuda_pages.h"

static kv_backend_t ref, dut;
static int selfcheck;
static int quick; /* KV_CUDA_TEST_QUICK: a subset (see above) */
static uint32_t max_ctx = 8192; /* KV_CUDA_TEST_MAX_CTX: longest list */
static uint64_t rng = 42;

static float *frand(size_t n)
{
    float *x = tcp_xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = kv_test_randf(&rng);
    return x;
}

/* Decode over lists L (batch * n_kv lists) on both backends; compare.
 * dut_pages: what the backend under test gets instead of L->pages (device
 * pages), or NULL. */
static void run_decode(const kv_page_geom_t *g, uint32_t batch, uint32_t n_q,
                       uint32_t n_kv, const tcp_lists_t *L,
                       const kv_kern_page_t *dut_pages, uint32_t part,
                       int with_stats, const char *what)
{
    const uint32_t D = g->head_dim, n_lists = batch * n_kv;
    uint32_t stride = 1;
    for (uint32_t i = 0; i < n_lists; i++)
        stride = L->seq_len[i] > stride ? L->seq_len[i] : stride;
    const size_t nq = (size_t)batch * n_q * D, ns = (size_t)n_kv * stride;
    float *q = frand(nq), *o_ref = tcp_xalloc(nq * 4),
          *o_dut = tcp_xalloc(nq * 4);
    float **s_ref = tcp_xalloc(batch * sizeof(float *));
    float **s_dut = tcp_xalloc(batch * sizeof(float *));
    for (uint32_t b = 0; b < batch; b++) {
        int on = with_stats && b % 2 == 0;
        s_ref[b] = on ? tcp_xalloc(ns * 4) : NULL;
        s_dut[b] = on ? tcp_xalloc(ns * 4) : NULL;
    }
    kv_attn_decode_params_t p = {.geom = *g,
                                 .batch = batch,
                                 .n_q_heads = n_q,
                                 .n_kv_heads = n_kv,
                                 .indptr = L->indptr,
                                 .pages = L->pages,
                                 .seq_len = L->seq_len,
                                 .q = q,
                                 .out = o_ref,
                                 .stats = with_stats ? s_ref : NULL,
                                 .stats_stride = stride,
                                 .scale = 1.0f / sqrtf((float)D),
                                 .partition_tokens = part};
    CHECK_OK(ref.ops->attn_decode(ref.ctx, &p));
    p.out = o_dut;
    p.stats = with_stats ? s_dut : NULL;
    if (dut_pages)
        p.pages = dut_pages;
    int rc = dut.ops->attn_decode(dut.ctx, &p);
    CHECK_OK(rc);
    if (rc == 0) {
        char w[160];
        for (size_t r = 0; r < (size_t)batch * n_q; r++) {
            snprintf(w, sizeof w, "%s: out row %zu", what, r);
            tcp_check_close(o_dut + r * D, o_ref + r * D, D, 1e-3, w);
        }
        for (uint32_t i = 0; with_stats && i < n_lists; i++) {
            uint32_t b = i / n_kv, h = i % n_kv;
            if (!s_ref[b])
                continue;
            snprintf(w, sizeof w, "%s: stats list %u", what, i);
            tcp_check_close(s_dut[b] + (size_t)h * stride,
                            s_ref[b] + (size_t)h * stride, L->seq_len[i], 1e-3,
                            w);
        }
    }
    for (uint32_t b = 0; b < batch; b++) {
        free(s_ref[b]);
        free(s_dut[b]);
    }
    free(s_ref);
    free(s_dut);
    free(q);
    free(o_ref);
    free(o_dut);
}

static void test_decode(void)
{
    static const struct {
        uint32_t g, n_kv, batch;
    } shapes[] = {{3, 3, 5}, {8, 2, 3}, {12, 1, 2}, {1, 4, 2}};
    for (uint32_t D = 64; D <= 128; D *= 2) {
        const kv_page_geom_t g = {D, 64 * D};
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (quick && s != (D == 64 ? 1u : 3u))
                continue;
            const uint32_t n_kv = shapes[s].n_kv, batch = shapes[s].batch;
            const uint32_t n_lists = batch * n_kv;
            const uint32_t top = max_ctx < 2500 ? max_ctx : 2500;
            uint32_t len[64];
            for (uint32_t i = 0; i < n_lists; i++)
                len[i] = 1 + (uint32_t)(kv_test_rand(&rng) %
                                        (i % 4 ? (top + 2) / 3 : top));
            /* whole pages */
            len[0] = 16 * (1 + (uint32_t)(kv_test_rand(&rng) % (top / 16)));
            tcp_lists_t L;
            tcp_make_lists(&L, &g, n_lists, len, TCP_FMT_MIX, &rng);
            char what[96];
            /* default, split-K in 64-token items, single pass */
            static const uint32_t parts[] = {0, 64, 4096};
            for (size_t pi = 0; pi < (quick ? 2u : 3u); pi++) {
                const uint32_t part = parts[pi];
                snprintf(what, sizeof what,
                         "decode D=%u G=%u kv=%u batch=%u part=%u", D,
                         shapes[s].g, n_kv, batch, part);
                run_decode(&g, batch, shapes[s].g * n_kv, n_kv, &L, NULL, part,
                           1, what);
            }
            tcp_free_lists(&L);
        }
    }
}

static void run_prefill(const kv_page_geom_t *g, uint32_t n_q, uint32_t n_kv,
                        uint32_t n_new, uint32_t cached, uint32_t row0,
                        uint32_t mix)
{
    const uint32_t D = g->head_dim;
    uint32_t len[16];
    for (uint32_t h = 0; h < n_kv; h++)
        len[h] = cached + n_new;
    tcp_lists_t L;
    tcp_make_lists(&L, g, n_kv, len, mix, &rng);
    const uint32_t stride = cached + n_new;
    const size_t nq = (size_t)n_new * n_q * D, ns = (size_t)n_kv * stride;
    float *q = frand(nq), *o_ref = tcp_xalloc(nq * 4),
          *o_dut = tcp_xalloc(nq * 4);
    float *s_ref = tcp_xalloc(ns * 4), *s_dut = tcp_xalloc(ns * 4);
    kv_attn_prefill_params_t p = {.geom = *g,
                                  .n_q_heads = n_q,
                                  .n_kv_heads = n_kv,
                                  .indptr = L.indptr,
                                  .pages = L.pages,
                                  .seq_len = L.seq_len,
                                  .n_new = n_new,
                                  .q = q,
                                  .out = o_ref,
                                  .stats = s_ref,
                                  .stats_stride = stride,
                                  .stats_row0 = row0,
                                  .scale = 1.0f / sqrtf((float)D)};
    CHECK_OK(ref.ops->attn_prefill(ref.ctx, &p));
    p.out = o_dut;
    p.stats = s_dut;
    int rc = dut.ops->attn_prefill(dut.ctx, &p);
    CHECK_OK(rc);
    char w[160];
    for (size_t r = 0; rc == 0 && r < (size_t)n_new * n_q; r++) {
        snprintf(w, sizeof w,
                 "prefill D=%u mix=%#x new=%u cached=%u: out row %zu", D, mix,
                 n_new, cached, r);
        tcp_check_close(o_dut + r * D, o_ref + r * D, D, 1e-3, w);
    }
    for (uint32_t h = 0; rc == 0 && h < n_kv; h++) {
        snprintf(w, sizeof w,
                 "prefill D=%u mix=%#x new=%u cached=%u row0=%u: stats %u", D,
                 mix, n_new, cached, row0, h);
        tcp_check_close(s_dut + (size_t)h * stride, s_ref + (size_t)h * stride,
                        len[h], 1e-3, w);
    }
    free(q);
    free(o_ref);
    free(o_dut);
    free(s_ref);
    free(s_dut);
    tcp_free_lists(&L);
}

static void test_prefill(void)
{
    for (uint32_t D = 64; D <= 128; D *= 2) {
        const kv_page_geom_t g = {D, 64 * D};
        if (quick) {
            if (D == 64)
                run_prefill(&g, 16, 2, 64, 40, 63, TCP_FMT_MIX); /* G = 8 */
            else
                run_prefill(&g, 6, 2, 17, 0, 0, TCP_FMT_ONLY(KV_FMT_FP16));
            continue;
        }
        run_prefill(&g, 6, 2, 1, 0, 0, TCP_FMT_MIX);
        run_prefill(&g, 6, 2, 17, 0, 0, TCP_FMT_ONLY(KV_FMT_FP16));
        run_prefill(&g, 6, 2, 100, 300, 50, TCP_FMT_MIX);
        run_prefill(&g, 4, 4, 33, 1000, 0, TCP_FMT_MIX); /* G = 1 */
        run_prefill(&g, 16, 2, 64, 40, 63, TCP_FMT_MIX); /* G = 8 */
    }
}

/* Rotated INT pages: the kernels' ROT build (R q scores, the second
 * accumulator un-rotated before out or partials; statistics over un-rotated
 * keys) against the CPU's per-chunk rotation. */
static void test_rotated(void)
{
    static const struct {
        uint32_t d, g, n_kv, batch, mix, part;
    } dec[] = {
        {64, 4, 2, 3, TCP_FMT_ONLY(KV_FMT_INT4) | TCP_ROT_ALL, 0},
        {128, 8, 2, 2, TCP_FMT_ONLY(KV_FMT_INT2) | TCP_ROT_ALL, 64},
        {64, 3, 3, 2, TCP_FMT_MIX | TCP_ROT_SOME, 64},
        {128, 12, 1, 2, TCP_FMT_MIX | TCP_ROT_SOME, 0},
        {128, 1, 4, 2, TCP_FMT_MIX | TCP_ROT_ALL, 4096},
    };
    for (size_t c = 0; c < sizeof dec / sizeof dec[0]; c++) {
        if (quick && c != 1 && c != 2 && c != 4)
            continue;
        const uint32_t D = dec[c].d, n_kv = dec[c].n_kv, batch = dec[c].batch;
        const kv_page_geom_t g = {D, 64 * D};
        const uint32_t top = max_ctx < 1500 ? max_ctx : 1500;
        uint32_t len[16];
        for (uint32_t i = 0; i < batch * n_kv; i++)
            len[i] = 1 + (uint32_t)(kv_test_rand(&rng) % top);
        tcp_lists_t L;
        tcp_make_lists(&L, &g, batch * n_kv, len, dec[c].mix, &rng);
        char what[112];
        snprintf(what, sizeof what,
                 "decode rotated D=%u G=%u kv=%u batch=%u mix=%#x part=%u", D,
                 dec[c].g, n_kv, batch, dec[c].mix, dec[c].part);
        run_decode(&g, batch, dec[c].g * n_kv, n_kv, &L, NULL, dec[c].part, 1,
                   what);
        tcp_free_lists(&L);
    }
    static const struct {
        uint32_t d, n_q, n_kv, n_new, cached, row0, mix;
    } pre[] = {
        {64, 6, 2, 17, 0, 0, TCP_FMT_ONLY(KV_FMT_INT4) | TCP_ROT_ALL},
        {128, 6, 2, 100, 300, 50, TCP_FMT_MIX | TCP_ROT_SOME},
        {64, 16, 2, 64, 40, 63, TCP_FMT_ONLY(KV_FMT_INT2) | TCP_ROT_ALL},
        {128, 4, 4, 33, 1000, 0, TCP_FMT_MIX | TCP_ROT_ALL},
    };
    for (size_t c = 0; c < sizeof pre / sizeof pre[0]; c++) {
        if (quick && c != 0)
            continue;
        const kv_page_geom_t g = {pre[c].d, 64 * pre[c].d};
        run_prefill(&g, pre[c].n_q, pre[c].n_kv, pre[c].n_new, pre[c].cached,
                    pre[c].row0, pre[c].mix);
    }
}

static void test_long(void)
{
    const kv_page_geom_t g = {128, 8192};
    uint32_t len[4] = {max_ctx, max_ctx - 1, max_ctx / 2 + 3, 17};
    tcp_lists_t L;
    tcp_make_lists(&L, &g, 4, len, TCP_FMT_MIX, &rng);
    char what[64];
    snprintf(what, sizeof what, "decode long ctx=%u", max_ctx);
    run_decode(&g, 2, 8, 2, &L, NULL, 0, 1, what);
    tcp_free_lists(&L);
    const kv_page_geom_t g64 = {64, 4096};
    tcp_make_lists(&L, &g64, 4, len, TCP_FMT_ONLY(KV_FMT_INT2), &rng);
    run_decode(&g64, 4, 12, 1, &L, NULL, 0, 0, "decode long INT2 D=64");
    tcp_free_lists(&L);
}

/* Pages of 20480 and 24576 bytes: 40-48 KiB of dynamic shared memory, under
 * the 48 KiB default alone but over it with the kernel's static shared
 * memory; the launch must opt in to more (else it fails: KV_EIO). */
static void test_large_pages(void)
{
    static const struct {
        uint32_t pb, mix;
    } cases[] = {{20480, TCP_FMT_ONLY(KV_FMT_FP16)}, {24576, TCP_FMT_MIX}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (quick && c == 0)
            continue;
        const kv_page_geom_t g = {128, cases[c].pb};
        uint32_t len[4] = {1000, 517, 48, 1};
        tcp_lists_t L;
        tcp_make_lists(&L, &g, 4, len, cases[c].mix, &rng);
        char what[64];
        snprintf(what, sizeof what, "decode D=128 page_bytes=%u", g.page_bytes);
        run_decode(&g, 2, 8, 2, &L, NULL, 0, 1, what);
        snprintf(what, sizeof what, "decode D=128 page_bytes=%u part=64",
                 g.page_bytes);
        run_decode(&g, 2, 8, 2, &L, NULL, 64, 1, what);
        tcp_free_lists(&L);
        if (!quick)
            run_prefill(&g, 8, 2, 33, 400, 0, cases[c].mix);
    }
}

/* A device-mode backend: the same lists copied into its pool. */
static void test_device_mode(void)
{
    const kv_page_geom_t g = {64, 4096};
    uint32_t len[6] = {700, 33, 1200, 5, 64, 300};
    tcp_lists_t L;
    tcp_make_lists(&L, &g, 6, len, TCP_FMT_MIX, &rng);
    kv_cuda_config_t cfg = {.device = 0,
                            .page_bytes = g.page_bytes,
                            .device_pages = L.n_pages + 8,
                            .staging_pages = 7};
    kv_backend_t dev = {0};
    CHECK_OK(kv_backend_cuda_create(&cfg, &dev));
    kv_cuda_pool_t *pool = kv_backend_cuda_pool(&dev);
    CHECK(pool != NULL);
    if (!pool) {
        tcp_free_lists(&L);
        return;
    }
    /* one device page per distinct host page */
    kv_page_id_t *ids = tcp_xalloc(L.n_pages * sizeof *ids);
    const void **src = tcp_xalloc(L.n_pages * sizeof *src);
    kv_kern_page_t *dp = tcp_xalloc(L.n_pages * sizeof *dp);
    uint32_t n_ids = 0;
    for (uint32_t e = 0; e < L.n_pages; e++) {
        uint32_t f = 0;
        while (f < e && L.pages[f].data != L.pages[e].data)
            f++;
        dp[e] = L.pages[e];
        if (f < e) {
            dp[e].data = dp[f].data;
            continue;
        }
        CHECK_OK(kv_cuda_pool_alloc(pool, 1, &ids[n_ids]));
        src[n_ids] = L.pages[e].data;
        dp[e].data = kv_cuda_pool_page_ptr(pool, ids[n_ids]);
        n_ids++;
    }
    CHECK_OK(kv_cuda_pool_write(pool, n_ids, ids, src));
    kv_backend_t keep = dut;
    dut = dev;
    run_decode(&g, 3, 6, 2, &L, dp, 0, 1, "device-mode decode");
    run_decode(&g, 3, 6, 2, &L, dp, 64, 1, "device-mode decode, split");
    dut = keep;
    /* a page that is not a pool page is refused, nothing written */
    float q[6 * 64], out[6 * 64];
    memset(q, 0, sizeof q);
    for (size_t i = 0; i < 6 * 64; i++)
        out[i] = 7.0f;
    uint32_t ip[2] = {0, 1}, one = L.pages[0].n_tokens;
    kv_attn_decode_params_t p = {.geom = g,
                                 .batch = 1,
                                 .n_q_heads = 6,
                                 .n_kv_heads = 1,
                                 .indptr = ip,
                                 .pages = L.pages,
                                 .seq_len = &one,
                                 .q = q,
                                 .out = out,
                                 .scale = 0.125f};
    CHECK_EQ(dev.ops->attn_decode(dev.ctx, &p), KV_EINVAL);
    CHECK(out[0] == 7.0f && out[6 * 64 - 1] == 7.0f);
    CHECK_OK(kv_cuda_pool_free(pool, n_ids, ids));
    CHECK_OK(kv_cuda_pool_sync(pool));
    CHECK_EQ(kv_cuda_pool_deferred(pool), 0);
    kv_backend_destroy(&dev);
    free(ids);
    free(src);
    free(dp);
    tcp_free_lists(&L);
}

static void test_errors(void)
{
    const kv_page_geom_t g = {96, 96 * 64};
    uint32_t len[1] = {40};
    tcp_lists_t L;
    tcp_make_lists(&L, &g, 1, len, TCP_FMT_ONLY(KV_FMT_FP16), &rng);
    float q[2 * 96], out[2 * 96];
    memset(q, 0, sizeof q);
    for (int i = 0; i < 2 * 96; i++)
        out[i] = -3.0f;
    kv_attn_decode_params_t p = {.geom = g,
                                 .batch = 1,
                                 .n_q_heads = 2,
                                 .n_kv_heads = 1,
                                 .indptr = L.indptr,
                                 .pages = L.pages,
                                 .seq_len = L.seq_len,
                                 .q = q,
                                 .out = out,
                                 .scale = 0.1f};
    CHECK_OK(ref.ops->attn_decode(ref.ctx, &p)); /* the CPU takes it */
    for (int i = 0; i < 2 * 96; i++)
        out[i] = -3.0f;
    CHECK_EQ(dut.ops->attn_decode(dut.ctx, &p), KV_ENOTSUP);
    CHECK(out[0] == -3.0f && out[2 * 96 - 1] == -3.0f);
    tcp_free_lists(&L);
}

int main(void)
{
    selfcheck = getenv("KV_CUDA_TEST_SELFCHECK") != NULL;
    quick = getenv("KV_CUDA_TEST_QUICK") != NULL;
    if (!selfcheck && kv_cuda_device_count() == 0)
        KV_TEST_SKIP("no CUDA device");
    const char *mc = getenv("KV_CUDA_TEST_MAX_CTX");
    if (mc)
        max_ctx = (uint32_t)strtoul(mc, NULL, 10);
    if (max_ctx < 64)
        max_ctx = 64;
    CHECK_OK(kv_backend_cpu_create(2, 0, &ref));
    if (selfcheck) {
        CHECK_OK(kv_backend_cpu_create(2, 0, &dut));
    } else {
        kv_cuda_config_t cfg = {.device = 0};
        CHECK_OK(kv_backend_cuda_create(&cfg, &dut));
    }
    if (!ref.ops || !dut.ops)
        return kv_test_end();
    test_decode();
    test_prefill();
    test_rotated();
    if (!quick)
        test_long();
    test_large_pages();
    if (!selfcheck) {
        test_device_mode();
        test_errors();
    }
    kv_backend_destroy(&dut);
    kv_backend_destroy(&ref);
    tcp_report("test_cuda_attn", selfcheck);
    return kv_test_end();
}
