/* SPDX-License-Identifier: MIT */
/*
 * test_offload_stage.c — the staging-run allocator of a page file
 * (offload/kv_offload_stage.h): alignment, first fit, the longest-run
 * fallback under fragmentation, exhaustion, and that every unit is handed
 * to one owner at a time (random alloc/free against a shadow map).
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"
#include "offload/kv_offload_stage.h"

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    kv_offload_stage_t st;
    CHECK_OK(kv_offload_stage_init(&st, 4608, 100, 4096));
    CHECK(((uintptr_t)st.base % 4096) == 0);
    CHECK(kv_offload_stage_ptr(&st, 3) == st.base + 3 * 4608);

    uint32_t got;
    CHECK_EQ(kv_offload_stage_alloc(&st, 10, &got), 0);
    CHECK_EQ(got, 10);
    CHECK_EQ(kv_offload_stage_alloc(&st, 10, &got), 10);
    CHECK_EQ(got, 10);
    kv_offload_stage_free(&st, 0, 10);
    CHECK_EQ(st.n_used, 10);
    /* 80 free at the end, 10 at the start: a run of 50 comes from the end */
    int64_t u = kv_offload_stage_alloc(&st, 50, &got);
    CHECK_EQ(u, 20);
    CHECK_EQ(got, 50);
    /* 30 left at the end, 10 at the start: want 40 -> the longest, 30 */
    u = kv_offload_stage_alloc(&st, 40, &got);
    CHECK_EQ(got, 30);
    CHECK_EQ(u, 70);
    u = kv_offload_stage_alloc(&st, 40, &got);
    CHECK_EQ(u, 0);
    CHECK_EQ(got, 10);
    CHECK_EQ(st.n_used, 100);
    CHECK_EQ(kv_offload_stage_alloc(&st, 1, &got), -1);
    kv_offload_stage_free(&st, 0, 10);
    kv_offload_stage_free(&st, 10, 10);
    kv_offload_stage_free(&st, 20, 50);
    kv_offload_stage_free(&st, 70, 30);
    CHECK_EQ(st.n_used, 0);

    /* random traffic against a shadow owner map */
    int owner[100];
    struct { int64_t first; uint32_t n; } runs[100];
    int nr = 0;
    memset(owner, 0, sizeof owner);
    uint64_t s = 11;
    long bad = 0;
    for (int it = 0; it < 20000; it++) {
        if (nr && (kv_test_rand(&s) % 2 || nr == 100)) {
            int k = (int)(kv_test_rand(&s) % (uint64_t)nr);
            for (uint32_t i = 0; i < runs[k].n; i++)
                owner[runs[k].first + i] = 0;
            kv_offload_stage_free(&st, (uint32_t)runs[k].first, runs[k].n);
            runs[k] = runs[--nr];
        } else {
            uint32_t want = 1 + (uint32_t)(kv_test_rand(&s) % 8);
            u = kv_offload_stage_alloc(&st, want, &got);
            if (u < 0) {
                bad += st.n_used != st.units;
                continue;
            }
            bad += got < 1 || got > want;
            for (uint32_t i = 0; i < got; i++)
                bad += owner[u + i]++ != 0;
            runs[nr].first = u;
            runs[nr++].n = got;
        }
    }
    CHECK_EQ(bad, 0);
    while (nr) {
        nr--;
        kv_offload_stage_free(&st, (uint32_t)runs[nr].first, runs[nr].n);
    }
    CHECK_EQ(st.n_used, 0);
    kv_offload_stage_fini(&st);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
