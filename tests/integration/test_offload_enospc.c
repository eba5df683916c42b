/* SPDX-License-Identifier: MIT */
/*
 * test_offload_enospc.c — a full page file, two ways.
 *
 * Checks, for every I/O queue: (1) slots exhausted: a batch needing more slots
 * than are free fails with -ENOSPC and takes none (used count, statuses and
 * slot array untouched), single-page writes fail the same way at exactly
 * capacity, and freeing makes room again; (2) the device says -ENOSPC (the
 * shim, on every write): each page's status is -ENOSPC, its slot id is
 * reset to 0 and the slot is back in the pool, nothing is listed, the pages
 * written before are intact, and writes succeed again once space returns.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "test_offload_util.h"

enum { PB = 1024, CAP = 64 };

static uint8_t g_data[CAP][PB], g_out[PB], g_scratch[PB];

static void pages(kv_offload_wpage_t *w, uint32_t n, uint64_t key0)
{
    for (uint32_t i = 0; i < n; i++) {
        kvt_fill(g_data[i], PB, key0 + i, 1);
        w[i] = (kv_offload_wpage_t){.key = key0 + i, .generation = 1, .data = g_data[i],
                                    .bytes = PB};
    }
}

static uint64_t used(kv_offload_file_t *f)
{
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    return st.slots_used;
}

static void run(const kvt_dir_t *dir, uint32_t ioq)
{
    char path[4096];
    kvt_path(dir, "ns.kvp", path);
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = CAP;
    c.ioq = ioq;
    kv_offload_file_t *f;
    CHECK_OK(kv_offload_create(path, &c, &f));
    kv_offload_wpage_t w[CAP];
    kv_offload_slot_t s[CAP], first[CAP];
    int status[CAP];

    /* (1) slots exhausted */
    pages(w, CAP - 5, 0);
    CHECK_OK(kv_offload_write(f, w, CAP - 5, first, status));
    pages(w, 10, 1000);
    for (int i = 0; i < 10; i++) {
        s[i] = 12345;
        status[i] = 99;
    }
    kv_offload_ticket_t t = 0;
    CHECK_EQ(kv_offload_write_submit(f, w, 10, s, status, &t), -ENOSPC);
    CHECK_EQ(used(f), CAP - 5);
    CHECK_EQ(s[0], 12345);
    CHECK_EQ(status[9], 99);
    CHECK_EQ(t, 0);
    CHECK_OK(kv_offload_write(f, w, 5, s, status));
    CHECK_EQ(used(f), CAP);
    CHECK_EQ(kv_offload_write(f, w + 5, 1, s + 5, status + 5), -ENOSPC);
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    CHECK_EQ(st.slots_free, 0);
    CHECK_OK(kv_offload_free(f, first, 10));
    CHECK_OK(kv_offload_write(f, w, 10, s, status));
    CHECK_EQ(used(f), CAP);
    /* everything held reads back */
    long bad = 0;
    for (int i = 0; i < 10; i++) {
        kv_offload_rpage_t q = {.slot = s[i], .key = 1000 + (uint64_t)i, .generation = 1,
                                .data = g_out};
        bad += kv_offload_read(f, &q, 1, NULL) != 0 ||
               !kvt_same(g_out, PB, 1000 + (uint64_t)i, 1, g_scratch);
    }
    CHECK_EQ(bad, 0);
    kv_offload_slot_t all[CAP];
    uint64_t n = 0;
    kv_offload_entry_t e[CAP];
    CHECK_OK(kv_offload_list(f, e, CAP, &n));
    CHECK_EQ(n, CAP);
    for (uint64_t i = 0; i < n; i++)
        all[i] = e[i].slot;
    CHECK_OK(kv_offload_free(f, all, (uint32_t)n));
    CHECK_EQ(used(f), 0);

    /* (2) the device is full: every write fails with -ENOSPC */
    pages(w, 20, 2000);
    CHECK_OK(kv_offload_write(f, w, 20, first, status)); /* before */
    kv_offload_fault_t full = {.seed = 3};
    full.ppm[KV_OFFLOAD_FAULT_ENOSPC] = 1000000;
    CHECK_OK(kv_offload_set_fault(f, &full));
    pages(w, 30, 3000);
    CHECK_EQ(kv_offload_write(f, w, 30, s, status), -ENOSPC);
    bad = 0;
    for (int i = 0; i < 30; i++)
        bad += status[i] != -ENOSPC || s[i] != KV_PAGE_ID_INVALID;
    CHECK_EQ(bad, 0);
    CHECK_EQ(used(f), 20);
    CHECK_OK(kv_offload_list(f, NULL, 0, &n));
    CHECK_EQ(n, 20);
    kv_offload_stats(f, &st);
    CHECK(st.faults[KV_OFFLOAD_FAULT_ENOSPC] >= 1);
    CHECK_EQ(st.pages_failed, 30);
    CHECK(kvt_idle(f));
    /* reads are not writes: they still work */
    bad = 0;
    for (int i = 0; i < 20; i++) {
        kv_offload_rpage_t q = {.slot = first[i], .key = 2000 + (uint64_t)i,
                                .generation = 1, .data = g_out};
        bad += kv_offload_read(f, &q, 1, NULL) != 0 ||
               !kvt_same(g_out, PB, 2000 + (uint64_t)i, 1, g_scratch);
    }
    CHECK_EQ(bad, 0);
    kv_offload_fault_t none = {0};
    CHECK_OK(kv_offload_set_fault(f, &none));
    CHECK_OK(kv_offload_write(f, w, 30, s, status));
    CHECK_EQ(used(f), 50);
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_unlink(path));
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    kvt_dir_t dir;
    kvt_dir_make(&dir);
    uint32_t ioqs[2];
    int ne = kvt_ioqs(&dir, ioqs);
    for (int e = 0; e < ne; e++)
        run(&dir, ioqs[e]);
    kvt_dir_remove(&dir);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
