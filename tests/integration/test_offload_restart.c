/* SPDX-License-Identifier: MIT */
/*
 * test_offload_restart.c — a page file outlives its process.
 *
 * Checks, for every I/O queue: close + reopen lists exactly the pages held at
 * close (key, generation, bytes, tokens, format) and every one reads back
 * byte-exact, also through the other I/O queue; a crash (no index write) after
 * sync restores the synced set, and a slot rewritten after the last index
 * reads as KV_ECORRUPT, never as the new page's bytes under the old name;
 * a torn write that "succeeded" before a restart reads as KV_ECORRUPT; a
 * damaged superblock or index, a missing index, an index of another file,
 * a truncated file are refused (KV_ECORRUPT), a wrong page_bytes is
 * KV_ERANGE; a leftover temporary index is ignored and removed.
 */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include "alloc/kv_mem.h"
#include "test_offload_util.h"

enum { PB = 4096, CAP = 256 };

typedef struct pg {
    uint64_t key, gen;
    uint32_t bytes, tokens, format;
    kv_offload_slot_t slot;
    int live;
} pg_t;

static uint8_t g_buf[64][PB], g_scratch[PB];

static kv_offload_config_t cfg_for(uint32_t ioq)
{
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = CAP;
    c.ioq = ioq;
    c.queue_depth = 16;
    return c;
}

/* Write pages p[0..n) (n <= 64) in one batch; statuses into status. */
static int put(kv_offload_file_t *f, pg_t *p, uint32_t n, int *status)
{
    kv_offload_wpage_t w[64];
    kv_offload_slot_t s[64];
    for (uint32_t i = 0; i < n; i++) {
        kvt_fill(g_buf[i], p[i].bytes, p[i].key, p[i].gen);
        w[i] = (kv_offload_wpage_t){.key = p[i].key, .generation = p[i].gen,
                                    .data = g_buf[i], .bytes = p[i].bytes,
                                    .tokens = p[i].tokens, .format = p[i].format};
    }
    int r = kv_offload_write(f, w, n, s, status);
    for (uint32_t i = 0; i < n; i++) {
        p[i].slot = s[i];
        p[i].live = status[i] == 0;
    }
    return r;
}

/* Read one page: its status (data checked when 0: mismatch -> 1000). */
static int get(kv_offload_file_t *f, const pg_t *p)
{
    kv_offload_rpage_t q = {.slot = p->slot, .key = p->key, .generation = p->gen,
                            .data = g_buf[0]};
    int st = -1;
    int r = kv_offload_read(f, &q, 1, &st);
    if (r != st)
        return 2000;
    if (st == 0 && !kvt_same(g_buf[0], p->bytes, p->key, p->gen, g_scratch))
        return 1000;
    return st;
}

static void make(pg_t *p, uint32_t n, uint64_t key0, uint64_t *s)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (pg_t){.key = key0 + i, .gen = 1 + kv_test_rand(s) % 9,
                      .bytes = 1 + (uint32_t)(kv_test_rand(s) % PB),
                      .tokens = i % 16, .format = i % KV_FMT_COUNT};
}

/* The listed entries equal the live pages of p (matched by key). */
static int list_matches(kv_offload_file_t *f, pg_t *p, uint32_t n)
{
    uint64_t total = 0, live = 0;
    for (uint32_t i = 0; i < n; i++)
        live += p[i].live;
    kv_offload_entry_t e[CAP];
    if (kv_offload_list(f, e, CAP, &total) || total != live)
        return 0;
    for (uint64_t k = 0; k < total; k++) {
        int found = 0;
        for (uint32_t i = 0; i < n; i++)
            if (p[i].live && p[i].key == e[k].key) {
                found = p[i].gen == e[k].generation && p[i].bytes == e[k].bytes &&
                        p[i].tokens == e[k].tokens && p[i].format == e[k].format;
                p[i].slot = e[k].slot; /* slot ids change across a reopen */
            }
        if (!found)
            return 0;
    }
    return 1;
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    if (pread(fd, &b, 1, off) == 1) {
        b ^= 0x10;
        CHECK(pwrite(fd, &b, 1, off) == 1);
    }
    close(fd);
}

static void copy_file(const char *from, const char *to)
{
    static uint8_t buf[1 << 16];
    int a = open(from, O_RDONLY), b = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ssize_t n;
    while ((n = read(a, buf, sizeof buf)) > 0)
        CHECK(write(b, buf, (size_t)n) == n);
    close(a);
    close(b);
}

static void run(const kvt_dir_t *dir, uint32_t ioq, uint32_t other)
{
    char path[4096], idx[4096], tmp[4096];
    kvt_path(dir, "rs.kvp", path);
    kvt_path(dir, "rs.kvp.idx", idx);
    kvt_path(dir, "rs.kvp.idx.tmp", tmp);
    kv_offload_config_t c = cfg_for(ioq);
    kv_offload_file_t *f;
    uint64_t s = 1234 + ioq;
    enum { N = 150 };
    pg_t p[N];
    int status[64];
    make(p, N, 100, &s);
    CHECK_OK(kv_offload_create(path, &c, &f));
    for (uint32_t i = 0; i < N; i += 50)
        CHECK_OK(put(f, p + i, 50, status));
    /* drop a few before closing */
    for (uint32_t i = 0; i < N; i += 7) {
        CHECK_OK(kv_offload_free(f, &p[i].slot, 1));
        p[i].live = 0;
    }
    CHECK_OK(kv_offload_close(f));

    /* 1. reopen: same pages, same bytes; through the other I/O queue too */
    for (int pass = 0; pass < 2; pass++) {
        kv_offload_config_t oc = cfg_for(pass ? other : ioq);
        oc.page_bytes = 0; /* from the file */
        CHECK_OK(kv_offload_open(path, &oc, &f));
        CHECK(list_matches(f, p, N));
        long bad = 0;
        for (uint32_t i = 0; i < N; i++)
            if (p[i].live)
                bad += get(f, &p[i]) != 0;
        CHECK_EQ(bad, 0);
        CHECK_OK(kv_offload_close(f));
    }

    /* 2. sync, more work, crash: the synced state comes back; a slot that
     *    was freed and rewritten after it reads as corrupt, never as data */
    CHECK_OK(kv_offload_open(path, &c, &f));
    CHECK(list_matches(f, p, N));
    pg_t q[20];
    make(q, 20, 900000, &s);
    CHECK_OK(put(f, q, 20, status));
    CHECK_OK(kv_offload_sync(f));
    for (int i = 0; i < 20; i++)
        q[i].live = 1;
    /* after the sync: free 10 old pages, write 10 new (they take those
     * slots: the free stack is LIFO), then crash */
    pg_t *victims[10];
    int nv = 0;
    kv_offload_slot_t fr[10];
    for (uint32_t i = 1; i < N && nv < 10; i += 3)
        if (p[i].live) {
            victims[nv] = &p[i];
            fr[nv++] = p[i].slot;
        }
    CHECK_OK(kv_offload_free(f, fr, 10));
    pg_t r10[10];
    make(r10, 10, 5000000, &s);
    for (int i = 0; i < 10; i++)
        r10[i].bytes = PB; /* overwrite the whole payload area */
    CHECK_OK(put(f, r10, 10, status));
    int reused = 0;
    for (int i = 0; i < 10; i++)
        for (int j = 0; j < 10; j++)
            reused += kv_alloc_page_index(r10[i].slot) == kv_alloc_page_index(fr[j]);
    CHECK_EQ(reused, 10);
    kv_offload_crash(f);
    CHECK_OK(kv_offload_open(path, &c, &f));
    pg_t all[N + 20];
    memcpy(all, p, sizeof p);
    memcpy(all + N, q, sizeof q);
    CHECK(list_matches(f, all, N + 20));
    long bad = 0, corrupt = 0;
    for (uint32_t i = 0; i < N + 20; i++) {
        if (!all[i].live)
            continue;
        int is_victim = 0;
        for (int v = 0; v < 10; v++)
            is_victim |= victims[v]->key == all[i].key;
        int st = get(f, &all[i]);
        if (is_victim)
            corrupt += st == KV_ECORRUPT;
        else
            bad += st != 0;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(corrupt, 10);
    /* the stale pages are the caller's to drop */
    for (int v = 0; v < 10; v++) {
        for (uint32_t i = 0; i < N + 20; i++)
            if (all[i].live && all[i].key == victims[v]->key) {
                CHECK_OK(kv_offload_free(f, &all[i].slot, 1));
                all[i].live = 0;
            }
    }

    /* 3. torn writes that reported success, then a restart */
    kv_offload_fault_t torn = {.seed = 77};
    torn.ppm[KV_OFFLOAD_FAULT_TORN] = 1000000;
    CHECK_OK(kv_offload_set_fault(f, &torn));
    pg_t t[8];
    make(t, 8, 7000000, &s);
    for (int i = 0; i < 8; i++) {
        t[i].bytes = PB;
        CHECK_OK(put(f, &t[i], 1, status)); /* one page per I/O */
    }
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    CHECK_EQ(st.faults[KV_OFFLOAD_FAULT_TORN], 8);
    kv_offload_fault_t none = {0};
    CHECK_OK(kv_offload_set_fault(f, &none));
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_open(path, &c, &f));
    corrupt = 0;
    for (int i = 0; i < 8; i++) {
        kv_offload_entry_t e[CAP];
        uint64_t n = 0;
        kv_offload_list(f, e, CAP, &n);
        for (uint64_t k = 0; k < n; k++)
            if (e[k].key == t[i].key)
                t[i].slot = e[k].slot;
        corrupt += get(f, &t[i]) == KV_ECORRUPT;
        CHECK_OK(kv_offload_free(f, &t[i].slot, 1)); /* dropped by the caller */
    }
    CHECK_EQ(corrupt, 8);
    CHECK_OK(kv_offload_close(f));

    /* 4. damage: each refused at open, nothing leaked */
    uint64_t live0 = kv_mem_live_bytes();
    char saved[4096];
    kvt_path(dir, "saved.idx", saved);
    copy_file(idx, saved);
    flip_byte(idx, 70);
    CHECK_EQ(kv_offload_open(path, &c, &f), KV_ECORRUPT);
    copy_file(saved, idx);
    CHECK(truncate(idx, 64 + 48) == 0);
    CHECK_EQ(kv_offload_open(path, &c, &f), KV_ECORRUPT);
    unlink(idx);
    CHECK_EQ(kv_offload_open(path, &c, &f), KV_ECORRUPT);
    /* another file's index */
    char other_path[4096], other_idx[4096];
    kvt_path(dir, "other.kvp", other_path);
    kvt_path(dir, "other.kvp.idx", other_idx);
    kv_offload_file_t *g;
    CHECK_OK(kv_offload_create(other_path, &c, &g));
    CHECK_OK(kv_offload_close(g));
    copy_file(other_idx, idx);
    CHECK_EQ(kv_offload_open(path, &c, &f), KV_ECORRUPT);
    CHECK_OK(kv_offload_unlink(other_path));
    copy_file(saved, idx);
    kv_offload_config_t wrong = c;
    wrong.page_bytes = 2 * PB;
    CHECK_EQ(kv_offload_open(path, &wrong, &f), KV_ERANGE);
    flip_byte(path, 9); /* superblock: page_bytes */
    CHECK_EQ(kv_offload_open(path, &c, &f), KV_ECORRUPT);
    flip_byte(path, 9);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    CHECK(truncate(path, sb.st_size - 4096) == 0);
    CHECK_EQ(kv_offload_open(path, &c, &f), KV_ECORRUPT);
    CHECK(truncate(path, sb.st_size) == 0);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    /* a leftover temporary index (a crash mid-write) is ignored */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(write(fd, "garbage", 7) == 7);
    close(fd);
    CHECK_OK(kv_offload_open(path, &c, &f));
    CHECK(access(tmp, F_OK) != 0);
    CHECK(list_matches(f, all, N + 20));
    bad = 0;
    for (uint32_t i = 0; i < N + 20; i++)
        if (all[i].live)
            bad += get(f, &all[i]) != 0;
    CHECK_EQ(bad, 0);
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_unlink(path));
    unlink(saved);
}

int main(void)
{
    uint64_t live0 = kv_mem_live_bytes();
    kvt_dir_t dir;
    kvt_dir_make(&dir);
    uint32_t ioqs[2];
    int ne = kvt_ioqs(&dir, ioqs);
    for (int e = 0; e < ne; e++)
        run(&dir, ioqs[e], ioqs[(e + 1) % ne]);
    kvt_dir_remove(&dir);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
