/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_convert.c — the CUDA conversion kernel and the device page pool:
 *   convert  runs of pages of every format (MERGED both variants) from a
 *            random offset -> FP16 (from a random slot, across destination
 *            pages), INT4 and INT2 (whole groups), head_dim 64 and 128;
 *            the destination pages must equal the CPU reference's byte for
 *            byte, untouched bytes included (destinations start poisoned);
 *            staged mode and device mode (pages in the backend's pool);
 *   rotated  rotated INT sources (all of them, or mixed with every other
 *            format) to FP16 and plain INT, any sources to rotated INT
 *            (dst_variant 1), rotated to rotated: byte for byte too (the
 *            rotation is kv_fmt_rot.h on both sides);
 *   pool     alloc / write / read round trip, all-or-nothing exhaustion,
 *            bad ids refused, frees of pages still being copied deferred
 *            until their copy completes, then reusable.
 * Without a GPU the program exits 77 at once; KV_CUDA_TEST_SELFCHECK=1 runs
 * the conversions with the CPU reference in place of the CUDA backend
 * (checks the test itself; pool and device-mode cases are skipped).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kv_cuda.h"
#include "kv_test.h"
#include "test_cuda_pages.h"

static kv_backend_t dut;
static int selfcheck;
static uint64_t rng = 9;

/* Convert n tokens of list 0 of L from src_off into n_dst poisoned pages
 * of fmt (stored variant var) from dst_off, on the CPU reference and on
 * the backend under test (through dev when not NULL: device mode, pages in
 * its pool); compare. */
static void run_convert(const kv_page_geom_t *g, const tcp_lists_t *L,
                        uint32_t src_off, uint32_t n, uint32_t fmt,
                        uint32_t var, uint32_t dst_off, uint32_t n_dst,
                        kv_backend_t *dev, const char *what)
{
    const uint32_t pb = g->page_bytes;
    void **a = tcp_xalloc(n_dst * sizeof(void *)),
         **b = tcp_xalloc(n_dst * sizeof(void *));
    for (uint32_t j = 0; j < n_dst; j++) {
        a[j] = tcp_xalloc(pb);
        b[j] = tcp_xalloc(pb);
        memset(a[j], 0xa5, pb);
        memset(b[j], 0xa5, pb);
    }
    kv_convert_params_t p = {.geom = *g,
                             .src = L->pages,
                             .n_src = L->indptr[1],
                             .src_off = src_off,
                             .n_tokens = n,
                             .dst_format = fmt,
                             .dst_variant = var,
                             .dst = a,
                             .n_dst = n_dst,
                             .dst_off = dst_off};
    CHECK_OK(kv_backend_convert(NULL, &p)); /* the CPU reference */
    int rc;
    if (!dev) {
        p.dst = b;
        rc = kv_backend_convert(&dut, &p);
    } else { /* sources and destinations as pages of dev's pool */
        kv_cuda_pool_t *pool = kv_backend_cuda_pool(dev);
        const uint32_t ns = p.n_src;
        kv_page_id_t *ids = tcp_xalloc((ns + n_dst) * sizeof *ids);
        kv_kern_page_t *sp = tcp_xalloc(ns * sizeof *sp);
        void **dp = tcp_xalloc(n_dst * sizeof(void *));
        const void **up = tcp_xalloc((ns + n_dst) * sizeof(void *));
        CHECK_OK(kv_cuda_pool_alloc(pool, ns + n_dst, ids));
        for (uint32_t i = 0; i < ns; i++) {
            sp[i] = L->pages[i];
            sp[i].data = kv_cuda_pool_page_ptr(pool, ids[i]);
            up[i] = L->pages[i].data;
        }
        for (uint32_t j = 0; j < n_dst; j++) {
            dp[j] = kv_cuda_pool_page_ptr(pool, ids[ns + j]);
            up[ns + j] = b[j];
        }
        CHECK_OK(kv_cuda_pool_write(pool, ns + n_dst, ids, up));
        p.src = sp;
        p.dst = dp;
        rc = kv_backend_convert(dev, &p);
        CHECK_OK(kv_cuda_pool_read(pool, n_dst, ids + ns, b));
        CHECK_OK(kv_cuda_pool_free(pool, ns + n_dst, ids));
        free(ids);
        free(sp);
        free(dp);
        free(up);
    }
    CHECK_OK(rc);
    int same = 1;
    for (uint32_t j = 0; j < n_dst; j++)
        same &= memcmp(a[j], b[j], pb) == 0;
    if (!same)
        fprintf(stderr, "%s: destination pages differ\n", what);
    CHECK(same);
    for (uint32_t j = 0; j < n_dst; j++) {
        free(a[j]);
        free(b[j]);
    }
    free(a);
    free(b);
}

static void test_convert(void)
{
    for (uint32_t D = 64; D <= 128; D *= 2) {
        const kv_page_geom_t g = {D, 64 * D};
        uint32_t len = 700;
        tcp_lists_t L;
        tcp_make_lists(&L, &g, 1, &len, TCP_FMT_MIX, &rng);
        char what[96];
        for (uint32_t fmt = KV_FMT_FP16; fmt <= KV_FMT_INT2; fmt++) {
            const uint32_t cap = kv_format_get(fmt)->tokens_per_page(&g);
            const uint32_t n = fmt == KV_FMT_FP16 ? 301 : 320;
            const uint32_t dst_off = fmt == KV_FMT_FP16 ? 5 : 16;
            const uint32_t n_dst = (dst_off + n + cap - 1) / cap;
            snprintf(what, sizeof what, "convert D=%u -> %s", D,
                     kv_format_get(fmt)->name);
            run_convert(&g, &L, 37, n, fmt, 0, dst_off, n_dst, NULL, what);
        }
        tcp_free_lists(&L);
    }
}

/* Rotated INT pages (variant 1) as sources and as destinations. */
static void test_convert_rotated(void)
{
    static const struct {
        uint32_t mix, fmt, var;
    } cases[] = {
        {TCP_FMT_MIX | TCP_ROT_SOME, KV_FMT_FP16, 0}, /* un-rotated     */
        {TCP_FMT_MIX | TCP_ROT_SOME, KV_FMT_INT4, 1}, /* both ways      */
        {TCP_FMT_MIX, KV_FMT_INT2, 1},                /* rotated store  */
        {TCP_FMT_ONLY(KV_FMT_INT4) | TCP_ROT_ALL, KV_FMT_INT2, 0},
        {TCP_FMT_ONLY(KV_FMT_INT2) | TCP_ROT_ALL, KV_FMT_INT4, 1},
    };
    for (uint32_t D = 64; D <= 128; D *= 2) {
        const kv_page_geom_t g = {D, 64 * D};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            uint32_t len = 700;
            tcp_lists_t L;
            tcp_make_lists(&L, &g, 1, &len, cases[c].mix, &rng);
            const uint32_t fmt = cases[c].fmt;
            const uint32_t cap = kv_format_get(fmt)->tokens_per_page(&g);
            const uint32_t n = fmt == KV_FMT_FP16 ? 301 : 320;
            const uint32_t dst_off = fmt == KV_FMT_FP16 ? 5 : 16;
            char what[96];
            snprintf(what, sizeof what, "convert D=%u mix=%#x -> %s var %u",
                     D, cases[c].mix, kv_format_get(fmt)->name,
                     cases[c].var);
            run_convert(&g, &L, 37, n, fmt, cases[c].var, dst_off,
                        (dst_off + n + cap - 1) / cap, NULL, what);
            tcp_free_lists(&L);
        }
    }
}

/* Device mode: pages in the backend's pool (head_dim 64, 4 KiB pages). */
static void test_device_convert(void)
{
    const kv_page_geom_t g = {64, 4096};
    kv_cuda_config_t cfg = {
        .device = 0, .page_bytes = g.page_bytes, .device_pages = 256};
    kv_backend_t dev = {0};
    CHECK_OK(kv_backend_cuda_create(&cfg, &dev));
    if (!dev.ops)
        return;
    kv_merge_params_t mp = {.geom = g};
    CHECK_EQ(dev.ops->merge(dev.ctx, &mp), KV_ENOTSUP);
    uint32_t len = 500;
    tcp_lists_t L;
    tcp_make_lists(&L, &g, 1, &len, TCP_FMT_MIX, &rng);
    run_convert(&g, &L, 3, 256, KV_FMT_INT2, 0, 0, 4, &dev,
                "convert -> int2 (device mode)");
    run_convert(&g, &L, 3, 100, KV_FMT_FP16, 0, 7, 8, &dev,
                "convert -> fp16 (device mode)");
    tcp_free_lists(&L);
    tcp_make_lists(&L, &g, 1, &len, TCP_FMT_MIX | TCP_ROT_SOME, &rng);
    run_convert(&g, &L, 3, 256, KV_FMT_INT4, 1, 0, 8, &dev,
                "convert rotated -> rotated int4 (device mode)");
    tcp_free_lists(&L);
    kv_backend_destroy(&dev);
}

static void test_workers(void)
{
    const uint32_t pb = 4096, cap = 12;
    kv_cuda_pool_t *pool = NULL;
    CHECK_OK(kv_cuda_pool_create(pb, cap, 3, NULL, &pool));
    if (!pool)
        return;
    CHECK_EQ(kv_cuda_pool_capacity(pool), cap);
    CHECK_EQ(kv_cuda_pool_page_bytes(pool), pb);
    kv_page_id_t ids[12], more[2];
    CHECK_OK(kv_cuda_pool_alloc(pool, 10, ids));
    CHECK_EQ(kv_cuda_pool_alloc(pool, 3, more), KV_ENOMEM); /* 2 left */
    CHECK_OK(kv_cuda_pool_alloc(pool, 2, ids + 10));
    uint8_t *src[12], *dst[12];
    for (int i = 0; i < 12; i++) {
        src[i] = tcp_xalloc(pb);
        dst[i] = tcp_xalloc(pb);
        for (uint32_t j = 0; j < pb; j++)
            src[i][j] = (uint8_t)(kv_test_rand(&rng) >> 11);
        CHECK(kv_cuda_pool_page_ptr(pool, ids[i]) != NULL);
        CHECK((uintptr_t)kv_cuda_pool_page_ptr(pool, ids[i]) % 256 == 0);
    }
    /* 12 pages through 3 staging slots: the ring comes round 4 times */
    CHECK_OK(kv_cuda_pool_write(pool, 12, ids, (const void *const *)src));
    /* freeing right after the write: deferred while a copy is in flight */
    CHECK_OK(kv_cuda_pool_free(pool, 1, ids + 11));
    CHECK(kv_cuda_pool_deferred(pool) <= 1);
    CHECK_EQ(kv_cuda_pool_free(pool, 1, ids + 11), KV_EINVAL); /* twice */
    CHECK_OK(kv_cuda_pool_read(pool, 11, ids, (void *const *)dst));
    int same = 1;
    for (int i = 0; i < 11; i++)
        same &= memcmp(src[i], dst[i], pb) == 0;
    CHECK(same);
    CHECK_OK(kv_cuda_pool_sync(pool));
    CHECK_EQ(kv_cuda_pool_deferred(pool), 0);
    CHECK_OK(kv_cuda_pool_alloc(pool, 1, more)); /* the freed page is back */
    CHECK_EQ(kv_cuda_pool_write(pool, 1, &(kv_page_id_t){0},
                                (const void *const *)src),
             KV_EINVAL);
    CHECK_OK(kv_cuda_pool_free(pool, 11, ids));
    CHECK_OK(kv_cuda_pool_free(pool, 1, more));
    for (int i = 0; i < 12; i++) {
        free(src[i]);
        free(dst[i]);
    }
    kv_cuda_pool_destroy(pool);
}

int main(void)
{
    selfcheck = getenv("KV_CUDA_TEST_SELFCHECK") != NULL;
    if (!selfcheck && kv_cuda_device_count() == 0)
        KV_TEST_SKIP("no CUDA device");
    if (selfcheck) {
        CHECK_OK(kv_backend_cpu_create(1, 0, &dut));
    } else {
        kv_cuda_config_t cfg = {.device = 0};
        CHECK_OK(kv_backend_cuda_create(&cfg, &dut));
    }
    if (!dut.ops)
        return kv_test_end();
    test_convert();
    test_convert_rotated();
    if (!selfcheck) {
        test_device_convert();
        test_workers();
    }
    kv_backend_destroy(&dut);
    printf("test_cuda_convert: CUDA backend %s; destination pages compared "
           "byte for byte with the CPU backend's\n",
           selfcheck ? "replaced by the CPU backend (selfcheck)"
                     : TCP_CUDA_KIND);
    return kv_test_end();
}
