/* SPDX-License-Identifier: MIT */
/*
 * test_offload_util.h — helpers shared by the offload test programs
 * (test_offload_*.c under tests/): a scratch directory where O_DIRECT works,
 * reproducible page contents, and the list of I/O queues this machine runs.
 *
 * Scratch directory: $KV_OFFLOAD_TEST_DIR if set, else the current
 * directory (CTest runs tests in the build directory, on a real filesystem;
 * /tmp may be tmpfs, which refuses O_DIRECT). Each program makes its own
 * mkdtemp() directory there and removes it (and the files in it) at the end.
 *
 * Page contents are a function of (key, generation, bytes), so a test can
 * re-derive what any page must hold without keeping a copy.
 */
#ifndef TEST_OFFLOAD_UTIL_H
#define TEST_OFFLOAD_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_test.h"
#include "offload/kv_offload.h"

typedef struct kvt_dir {
    char path[1024];
} kvt_dir_t;

static inline void kvt_dir_make(kvt_dir_t *d)
{
    const char *base = getenv("KV_OFFLOAD_TEST_DIR");
    int n = snprintf(d->path, sizeof d->path, "%s/offload-test-XXXXXX",
                     base && *base ? base : ".");
    if (n < 0 || (size_t)n >= sizeof d->path || !mkdtemp(d->path)) {
        perror("mkdtemp");
        exit(1);
    }
}

/* d/name into out (a buffer of 4096). */
static inline const char *kvt_path(const kvt_dir_t *d, const char *name, char *out)
{
    snprintf(out, 4096, "%s/%s", d->path, name);
    return out;
}

static inline void kvt_dir_remove(kvt_dir_t *d)
{
    DIR *dir = opendir(d->path);
    if (dir) {
        struct dirent *e;
        char p[1024 + 256];
        while ((e = readdir(dir))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(p, sizeof p, "%s/%s", d->path, e->d_name);
            unlink(p);
        }
        closedir(dir);
    }
    rmdir(d->path);
}

/* The bytes of page (key, generation): bytes pseudo-random bytes. */
static inline void kvt_fill(uint8_t *p, uint32_t bytes, uint64_t key, uint64_t gen)
{
    uint64_t s = key * 0x9E3779B97F4A7C15ull ^ (gen + 0x632BE59BD9B4E019ull);
    uint32_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t v = kv_test_rand(&s);
        memcpy(p + i, &v, 8);
    }
    for (; i < bytes; i++)
        p[i] = (uint8_t)kv_test_rand(&s);
}

/* 1 if p holds exactly page (key, gen) of `bytes` bytes. */
static inline int kvt_same(const uint8_t *p, uint32_t bytes, uint64_t key, uint64_t gen,
                           uint8_t *scratch)
{
    kvt_fill(scratch, bytes, key, gen);
    return memcmp(p, scratch, bytes) == 0;
}

/* Engines that run here: uring only when io_uring initialises. */
static inline int kvt_ioqs(const kvt_dir_t *d, uint32_t out[2])
{
    int n = 0;
    char p[4096];
    kvt_path(d, "probe.kvp", p);
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = 64;
    c.capacity = 1;
    c.ioq = KV_OFFLOAD_IOQ_URING;
    kv_offload_file_t *f;
    int r = kv_offload_create(p, &c, &f);
    if (r == 0) {
        kv_offload_close(f);
        kv_offload_unlink(p);
        out[n++] = KV_OFFLOAD_IOQ_URING;
    } else {
        fprintf(stderr, "note: io_uring I/O queue unavailable here (%s)\n", kv_strerror(r));
    }
    out[n++] = KV_OFFLOAD_IOQ_PREAD;
    return n;
}

static inline const char *kvt_ioq_name(uint32_t e)
{
    return e == KV_OFFLOAD_IOQ_URING ? "uring" : "pread";
}

/* Nothing owned by I/O: no staging unit, no io, no open batch. */
static inline int kvt_idle(kv_offload_file_t *f)
{
    kv_offload_stats_t st;
    kv_offload_stats(f, &st);
    return st.staging_used == 0 && st.ios_inflight == 0 && st.batches_open == 0;
}

#endif /* TEST_OFFLOAD_UTIL_H */
