/* SPDX-License-Identifier: MIT */
/*
 * fuzz_pagefile.c — libFuzzer target for what a restart reads first: the
 * page file's superblock, its index and its slot headers, through
 * kv_offload_open (offload/kv_offload.h) on real files.
 *
 * Input:
 *   byte 0        flags: bit 0 recompute the superblock's crc, bit 1 the
 *                 index's, bit 2 each slot's (so mutations get past the
 *                 checksums to the checks behind them), bit 3 give the
 *                 file the size its geometry asks for (sparse)
 *   bytes 1..64   the superblock
 *   u16 n, n bytes the index file "<path>.idx" (little-endian length)
 *   the rest      slot images, 64 + page_bytes bytes each (header +
 *                 payload), for slots 0, 1, ... at data_off + i * slot_bytes
 * The files go to a tmpfs scratch directory (fuzz_util.h); a superblock
 * that decodes to more than 4096 slots or 64 MiB is cut short (opened
 * unsized), so one input never allocates more than a few MiB.
 * Properties: open returns 0 or an error (never crashes, leaks or reads
 * outside what it allocated); an open file lists entries sorted by key,
 * generation, slot, each as kv_offload_info says, every one reads back
 * with 0 or an error (KV_ECORRUPT for a slot that fails its check) and a
 * payload only on 0; a page written into it reads back exactly; sync and
 * close succeed; and the file reopens with the same entries plus that page.
 * Build and run: fuzz/build.sh (see fuzz/README.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "kvpage/kvpage.h"
#include "util/kv_crc32c.h"
#include "offload/kv_offload.h"
#include "offload/kv_offload_disk.h"
#include "util/kv_le.h"

#define T "fuzz_pagefile"
#define MAX_SLOTS 4096u
#define MAX_FILE (64ull << 20)

static char g_path[1024], g_idx[1024];

static void crc_at(uint8_t *p, size_t n, size_t at)
{
    kv_le_put32(p + at, 0);
    kv_le_put32(p + at, kv_crc32c(0, p, n));
}

static kv_offload_config_t cfg(void)
{
    kv_offload_config_t c = kv_offload_config_default();
    c.ioq = KV_OFFLOAD_IOQ_PREAD; /* the same checks as io_uring, no ring per input */
    c.queue_depth = 4;
    c.max_io_bytes = 1; /* one slot per I/O: little staging memory to clear */
    c.flags = KV_OFFLOAD_BUFFERED;
    return c;
}

static int cmp_ent(const kv_offload_entry_t *a, const kv_offload_entry_t *b)
{
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    if (a->generation != b->generation)
        return a->generation < b->generation ? -1 : 1;
    return a->slot < b->slot ? -1 : a->slot > b->slot;
}

/* The input's files; 0, or -1 if they could not be written. */
static int lay_out(const uint8_t *data, size_t size)
{
    const uint8_t flags = data[0];
    uint8_t sb[KV_REC_PF_SB_BYTES];
    memcpy(sb, data + 1, sizeof sb);
    if (flags & 1)
        crc_at(sb, sizeof sb, 40);
    size_t at = 65, n = kv_le_get16(data + 65);
    at += 2;
    if (n > size - at)
        n = size - at;
    uint8_t *idx = malloc(n ? n : 1);
    if (!idx)
        return -1;
    memcpy(idx, data + at, n);
    if ((flags & 2) && n >= KV_REC_PF_IDX_HDR_BYTES)
        crc_at(idx, n, 40);
    at += n;
    int rc = fz_write(g_idx, idx, n);
    free(idx);
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (rc || fd < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    rc = pwrite(fd, sb, sizeof sb, 0) == (ssize_t)sizeof sb ? 0 : -1;
    kv_offload_sb_t g;
    if (rc == 0 && kv_offload_sb_decode(sb, &g) == 0 && g.capacity <= MAX_SLOTS &&
        g.data_off + (uint64_t)g.capacity * g.slot_bytes <= MAX_FILE) {
        if (flags & 8)
            rc = ftruncate(fd, (off_t)(g.data_off + (uint64_t)g.capacity * g.slot_bytes));
        uint8_t *slot = malloc(KV_REC_PF_SLOT_BYTES + g.page_bytes);
        const size_t one = KV_REC_PF_SLOT_BYTES + g.page_bytes;
        for (uint32_t i = 0; slot && rc == 0 && i < g.capacity && at < size; i++) {
            size_t m = size - at < one ? size - at : one;
            memset(slot, 0, one);
            memcpy(slot, data + at, m);
            at += m;
            if (flags & 4) { /* crc of header (field zeroed) + its payload */
                uint32_t b = kv_le_get32(slot + 40);
                if (b > g.page_bytes)
                    b = g.page_bytes;
                kv_le_put32(slot + 44, 0);
                kv_le_put32(slot + 44, kv_crc32c(0, slot, KV_REC_PF_SLOT_BYTES + b));
            }
            off_t off = (off_t)(g.data_off + (uint64_t)i * g.slot_bytes);
            rc = pwrite(fd, slot, one, off) == (ssize_t)one ? 0 : -1;
        }
        free(slot);
    }
    close(fd);
    return rc;
}

/* Everything an open file offers, checked; the entries into *out (malloc). */
static uint64_t walk(kv_offload_file_t *f, kv_offload_entry_t **out)
{
    uint64_t n = 0, n2 = 0;
    fz_check(kv_offload_list(f, NULL, 0, &n) == 0, T, "list counts");
    kv_offload_entry_t *e = malloc((n ? n : 1) * sizeof *e);
    fz_check(e && kv_offload_list(f, e, n, &n2) == 0 && n2 == n, T, "list");
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    uint8_t *buf = malloc(st.page_bytes);
    fz_check(buf != NULL, T, "malloc");
    for (uint64_t i = 0; i < n; i++) {
        fz_check(i == 0 || cmp_ent(&e[i - 1], &e[i]) < 0, T, "entries sorted, distinct");
        kv_offload_entry_t info;
        fz_check(kv_offload_info(f, e[i].slot, &info) == 0 && !memcmp(&info, &e[i], sizeof info),
                 T, "info = list entry");
        fz_check(e[i].bytes >= 1 && e[i].bytes <= st.page_bytes && e[i].format <= 255, T,
                 "entry within the geometry");
        kv_offload_rpage_t q = {.slot = e[i].slot, .key = e[i].key,
                                .generation = e[i].generation, .data = buf};
        int s = 1;
        memset(buf, 0xA5, st.page_bytes);
        int rc = kv_offload_read(f, &q, 1, &s);
        fz_check(s != 1 && (rc == 0 || rc == s), T, "a listed slot can be read");
        fz_check(s == 0 || s == KV_ECORRUPT || s == KV_EIO || (s < 0 && s > -1000), T,
                 "read status");
        if (s != 0)
            for (uint32_t b = 0; b < st.page_bytes; b++)
                fz_check(buf[b] == 0xA5, T, "a failed read leaves the buffer alone");
    }
    free(buf);
    *out = e;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 67 || lay_out(data, size))
        return 0;
    kv_offload_config_t c = cfg();
    kv_offload_file_t *f = NULL;
    int rc = kv_offload_open(g_path, &c, &f);
    if (rc) {
        fz_check(f == NULL && rc < 0, T, "a refused open returns an error and no file");
        kv_offload_unlink(g_path);
        return 0;
    }
    kv_offload_entry_t *e1 = NULL, *e2 = NULL;
    uint64_t n1 = walk(f, &e1);
    /* one more page, read back exactly */
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    uint8_t *pg = malloc(st.page_bytes), *back = malloc(st.page_bytes);
    fz_check(pg && back, T, "malloc");
    for (uint32_t i = 0; i < st.page_bytes; i++)
        pg[i] = (uint8_t)(i * 7 + size);
    kv_offload_wpage_t w = {.key = 0x5EED, .generation = 1, .data = pg,
                            .bytes = st.page_bytes, .tokens = 3, .format = 2};
    kv_offload_slot_t s = 0;
    int ws = 1;
    rc = kv_offload_write(f, &w, 1, &s, &ws);
    fz_check(rc == 0 || rc == -ENOSPC, T, "write: 0 or a full file");
    if (rc == 0) {
        fz_check(ws == 0, T, "the write succeeded");
        kv_offload_rpage_t q = {.slot = s, .key = 0x5EED, .generation = 1, .data = back};
        int qs = 1;
        fz_check(kv_offload_read(f, &q, 1, &qs) == 0 && qs == 0 &&
                     !memcmp(pg, back, st.page_bytes), T, "a written page reads back");
    }
    fz_check(kv_offload_sync(f) == 0, T, "sync of an open file");
    fz_check(kv_offload_close(f) == 0, T, "close");
    /* what this library wrote always reopens, with the same entries */
    f = NULL;
    fz_check(kv_offload_open(g_path, &c, &f) == 0, T, "the closed file reopens");
    uint64_t n2 = walk(f, &e2);
    fz_check(n2 == n1 + (rc == 0), T, "reopened: the same entries plus the new page");
    uint64_t k = 0;
    for (uint64_t j = 0; j < n2; j++) /* drop the new page, keep the order */
        if (!(rc == 0 && kv_alloc_page_index(e2[j].slot) == kv_alloc_page_index(s)))
            e2[k++] = e2[j];
    fz_check(k == n1, T, "reopened: as many entries");
    for (uint64_t i = 0; i < n1; i++) /* slot ids carry each open's pool tag */
        fz_check(e1[i].key == e2[i].key && e1[i].generation == e2[i].generation &&
                     e1[i].bytes == e2[i].bytes && e1[i].tokens == e2[i].tokens &&
                     e1[i].format == e2[i].format &&
                     kv_alloc_page_index(e1[i].slot) == kv_alloc_page_index(e2[i].slot),
                 T, "reopened: the same entries");
    kv_offload_close(f);
    free(e1);
    free(e2);
    free(pg);
    free(back);
    kv_offload_unlink(g_path);
    return 0;
}

/* ---- seeds: real files, as inputs ------------------------------------------- */

static size_t file_to_input(uint8_t *out, size_t cap)
{
    int fd = open(g_path, O_RDONLY);
    kv_offload_sb_t g;
    uint8_t sb[64];
    if (fd < 0 || pread(fd, sb, 64, 0) != 64 || kv_offload_sb_decode(sb, &g))
        exit(1);
    size_t at = 0;
    out[at++] = 0x0f;
    memcpy(out + at, sb, 64);
    at += 64;
    FILE *fi = fopen(g_idx, "rb");
    size_t n = fi ? fread(out + at + 2, 1, cap - at - 2, fi) : 0;
    if (fi)
        fclose(fi);
    kv_le_put16(out + at, (uint32_t)n);
    at += 2 + n;
    const size_t one = KV_REC_PF_SLOT_BYTES + g.page_bytes; /* header + payload */
    for (uint32_t i = 0; i < g.capacity && at + one <= cap; i++) {
        if (pread(fd, out + at, one, (off_t)(g.data_off + (uint64_t)i * g.slot_bytes)) !=
            (ssize_t)one)
            exit(1);
        at += one;
    }
    close(fd);
    return at;
}

static void write_seeds(const char *dir)
{
    static uint8_t in[16384], pg[256];
    kv_offload_config_t c = cfg();
    for (int variant = 0; variant < 3; variant++) {
        c.page_bytes = 256;
        c.capacity = 6;
        kv_offload_file_t *f;
        kv_offload_unlink(g_path);
        if (kv_offload_create(g_path, &c, &f))
            exit(1);
        for (int i = 0; i < variant * 2; i++) {
            for (int b = 0; b < 256; b++)
                pg[b] = (uint8_t)(b * (i + 3));
            kv_offload_wpage_t w = {.key = 100u + (uint64_t)i, .generation = 2, .data = pg,
                                    .bytes = 200u + 28u * (uint32_t)(i & 1), .tokens = 16,
                                    .format = (uint32_t)i % 3};
            kv_offload_slot_t s;
            if (kv_offload_write(f, &w, 1, &s, NULL))
                exit(1);
            if (variant == 2 && i == 1)
                kv_offload_free(f, &s, 1);
        }
        if (kv_offload_close(f))
            exit(1);
        if (variant == 2) { /* reopened once: an owner id in the superblock */
            if (kv_offload_open(g_path, &c, &f) || kv_offload_close(f))
                exit(1);
        }
        char name[32];
        snprintf(name, sizeof name, "file%d", variant);
        fz_seed(dir, name, in, file_to_input(in, sizeof in));
    }
    kv_offload_unlink(g_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_dir_make("pagefile");
    fz_path("f.kvp", g_path);
    fz_path("f.kvp.idx", g_idx);
    const char *seeds = fz_seed_dir();
    if (seeds) {
        write_seeds(seeds);
        exit(0);
    }
    return 0;
}
