/* SPDX-License-Identifier: MIT */
/*
 * test_offload_serial.c — a page file whose write serials near the top of
 * their range still closes into a file that reopens (offload/kv_offload.h,
 * kv_offload_write_submit; serials in offload/kv_offload_disk.h).
 *
 * Every open continues the index's next serial 2^40 further. A file whose
 * index says next serial = 2^64 - 3 * 2^40 + 5 (found by fuzz_pagefile)
 * used to open, take a page, sync and close cleanly, and then be refused
 * (KV_ECORRUPT) at its next open: the index the library had written was
 * past the bound its own reader accepts. Now serials saturate: each
 * open/write/close cycle reopens with every page, the page written in it
 * reads back, and once no serial is left a write is -ENOSPC with nothing
 * taken (the file stays readable). A batch needing more serials than are
 * left is refused whole.
 */
#include <fcntl.h>
#include <sys/stat.h>

#include "offload/kv_offload_disk.h"
#include "util/kv_le.h"
#include "test_offload_util.h"

enum { PB = 256, CAP = 16 };
#define JUMP KV_OFFLOAD_SERIAL_JUMP

static uint8_t g_in[4][PB], g_out[PB], g_scratch[PB];

static kv_offload_config_t cfg(void)
{
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = CAP;
    c.ioq = KV_OFFLOAD_IOQ_PREAD;
    c.queue_depth = 4;
    return c;
}

/* Rewrite the next serial of "<path>.idx" (crc resealed); the old value. */
static uint64_t idx_set_serial(const char *path, int set, uint64_t v)
{
    char p[4096 + 8];
    snprintf(p, sizeof p, "%s.idx", path);
    static uint8_t buf[KV_REC_PF_IDX_HDR_BYTES + CAP * KV_REC_PF_IDX_ENT_BYTES];
    int fd = open(p, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf, 0) : -1;
    CHECK(n >= (ssize_t)KV_REC_PF_IDX_HDR_BYTES);
    uint64_t old = n >= 40 ? kv_le_get64(buf + 32) : 0;
    if (set && n >= (ssize_t)KV_REC_PF_IDX_HDR_BYTES) {
        kv_le_put64(buf + 32, v);
        kv_offload_idx_seal(buf, (size_t)n);
        CHECK(pwrite(fd, buf, (size_t)n, 0) == n);
    }
    if (fd >= 0)
        close(fd);
    return old;
}

/* Write pages keys key0.. (one batch of n): the call's result. */
static int put(kv_offload_file_t *f, uint64_t key0, uint32_t n, kv_offload_slot_t *s)
{
    kv_offload_wpage_t w[4];
    for (uint32_t i = 0; i < n; i++) {
        kvt_fill(g_in[i], PB, key0 + i, 1);
        w[i] = (kv_offload_wpage_t){.key = key0 + i, .generation = 1, .data = g_in[i],
                                    .bytes = PB, .tokens = 1};
    }
    return kv_offload_write(f, w, n, s, NULL);
}

/* Every page listed reads back as written; their count. */
static uint64_t check_all(kv_offload_file_t *f)
{
    kv_offload_entry_t e[CAP];
    uint64_t n = 0;
    CHECK_OK(kv_offload_list(f, e, CAP, &n));
    for (uint64_t i = 0; i < n && i < CAP; i++) {
        kv_offload_rpage_t q = {.slot = e[i].slot, .key = e[i].key, .generation = 1,
                                .data = g_out};
        int st = 1;
        CHECK_OK(kv_offload_read(f, &q, 1, &st));
        CHECK_EQ(st, 0);
        CHECK(kvt_same(g_out, PB, e[i].key, 1, g_scratch));
    }
    return n;
}

static uint64_t used(kv_offload_file_t *f)
{
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    return st.slots_used;
}

/* The fuzz finding: open, write, close, reopen, from near the top until
 * the serials run out and beyond. */
static void cycles(const char *path)
{
    kv_offload_config_t c = cfg();
    kv_offload_file_t *f = NULL;
    kv_offload_slot_t s[4];
    CHECK_OK(kv_offload_create(path, &c, &f));
    CHECK_OK(put(f, 1, 2, s));
    CHECK_OK(kv_offload_close(f));
    idx_set_serial(path, 1, UINT64_MAX - 3 * JUMP + 5);
    uint64_t pages = 2, last = 0;
    for (int cycle = 0; cycle < 5; cycle++) {
        f = NULL;
        int r = kv_offload_open(path, &c, &f);
        CHECK_EQ(r, 0);
        if (r)
            return;
        CHECK_EQ(check_all(f), pages);
        uint64_t u = used(f);
        r = put(f, 100 + (uint64_t)cycle, 1, s);
        /* cycles 0 and 1 have 2^40 serials each; from cycle 2 none are left */
        CHECK_EQ(r, cycle < 2 ? 0 : -ENOSPC);
        pages += r == 0;
        CHECK_EQ(used(f), u + (r == 0));
        CHECK_EQ(check_all(f), pages);
        CHECK_OK(kv_offload_sync(f));
        CHECK_OK(kv_offload_close(f));
        uint64_t now = idx_set_serial(path, 0, 0);
        CHECK(now >= last); /* never back */
        last = now;
    }
    CHECK_EQ(last, UINT64_MAX);
    kv_offload_unlink(path);
}

/* A batch needing more serials than are left is refused whole. */
static void edge(const char *path)
{
    kv_offload_config_t c = cfg();
    kv_offload_file_t *f = NULL;
    kv_offload_slot_t s[4];
    CHECK_OK(kv_offload_create(path, &c, &f));
    CHECK_OK(kv_offload_close(f));
    idx_set_serial(path, 1, UINT64_MAX - JUMP - 2); /* 2 serials left after the open */
    f = NULL;
    CHECK_OK(kv_offload_open(path, &c, &f));
    if (!f)
        return;
    CHECK_EQ(put(f, 1, 3, s), -ENOSPC);
    CHECK_EQ(used(f), 0);
    CHECK_OK(put(f, 1, 2, s));
    CHECK_EQ(put(f, 3, 1, s), -ENOSPC);
    CHECK_EQ(check_all(f), 2);
    CHECK_OK(kv_offload_close(f));
    CHECK_EQ(idx_set_serial(path, 0, 0), UINT64_MAX);
    f = NULL;
    CHECK_OK(kv_offload_open(path, &c, &f));
    if (f) {
        CHECK_EQ(check_all(f), 2);
        CHECK_EQ(put(f, 3, 1, s), -ENOSPC);
        CHECK_OK(kv_offload_close(f));
    }
    kv_offload_unlink(path);
}

int main(void)
{
    kvt_dir_t d;
    char p[4096];
    kvt_dir_make(&d);
    cycles(kvt_path(&d, "cycles.kvp", p));
    edge(kvt_path(&d, "edge.kvp", p));
    kvt_dir_remove(&d);
    return kv_test_end();
}
