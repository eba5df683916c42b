/* SPDX-License-Identifier: MIT */
/*
 * kvbench_remote.c — pipelined fetch throughput of the remote tier client
 * (remote/kv_remote.h) against Redis's own GET throughput, measured in the
 * same run on the same servers, keys and value sizes.
 *
 *   kvbench-remote [--json] [--mib N] [--reps R] [--sizes 4096,368640]
 *                  [--modes single,cluster] [--no-redis-benchmark]
 *
 * Starts its own servers on free loopback ports (scripts/kv_redis.sh): one
 * redis-server, and a cluster of 3 masters. For each mode and value size
 * (defaults: 4 KiB, one page; 368,640 B, one block of 16 tokens of all 30
 * layers x 3 kv heads of SmolLM2-135M at 4 KiB per page) it stores about N
 * MiB (default 64) of blobs, then per rep, alternating:
 *   - "kvpage": kv_remote_get over every key in batches (256 keys of 4 KiB,
 *     16 of 360 KiB; about 1 MiB-6 MiB per call): grouped per node,
 *     pipelined, every value checked (header, hash, crc32c) and copied into
 *     the caller's buffer;
 *   - "raw": plain hiredis, the same keys in the same batches: one blocking
 *     redisContext per node, every GET of the batch appended and flushed to
 *     all nodes, then the replies read (redisGetReply) and freed: the bytes
 *     Redis serves, parsed, nothing checked or copied.
 * gbps = payload bytes / s / 1e9 (raw: value bytes, i.e. payload + 64-byte
 * header). Rows give the median over R reps (default 5); "ratio" is the
 * median of the per-rep kvpage/raw ratios (issue 14's target: >= 0.5).
 * With redis-benchmark installed, single mode also gets its GET figure
 * (`redis-benchmark -t set,get -d SIZE -P 16 -c 1`, one connection, pipeline
 * 16) as a second reference. The servers are stopped at the end. Never in
 * CTest.
 */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_bench_util.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote.h"
#include "tests/kv_test_redis.h"

#define MAX_SIZES 8
#define MAX_REPS 101

typedef struct row {
    const char *mode;
    size_t value_bytes, batch, keys;
    double kv_gbps, raw_gbps, ratio, rb_gbps;
} row_t;

static const char *NS = "bench";

/* The raw baseline's connections: one per node, and the slot owners. */
typedef struct raw {
    int n;
    redisContext *c[3];
    int port[3];
    int slot_ctx[16384];
} raw_t;

static int raw_open(raw_t *w, const kv_tredis_t *t)
{
    w->n = t->n;
    for (int i = 0; i < t->n; i++) {
        w->port[i] = t->port[i];
        if (!(w->c[i] = kv_tredis_connect(t, i)))
            return -1;
    }
    for (int s = 0; s < 16384; s++)
        w->slot_ctx[s] = 0;
    if (t->n == 1)
        return 0;
    redisReply *rep = redisCommand(w->c[0], "CLUSTER SLOTS");
    if (!rep || rep->type != REDIS_REPLY_ARRAY)
        return -1;
    for (size_t e = 0; e < rep->elements; e++) {
        redisReply *x = rep->element[e];
        int port = (int)x->element[2]->element[1]->integer, ci = 0;
        for (int i = 0; i < t->n; i++)
            ci = w->port[i] == port ? i : ci;
        for (long long s = x->element[0]->integer; s <= x->element[1]->integer; s++)
            w->slot_ctx[s] = ci;
    }
    freeReplyObject(rep);
    return 0;
}

static void raw_close(raw_t *w)
{
    for (int i = 0; i < w->n; i++)
        if (w->c[i])
            redisFree(w->c[i]);
}

/* One batch of GETs through hiredis; value bytes read, or -1. */
static long long raw_batch(raw_t *w, char (*keys)[128], const int *klen, size_t n)
{
    int cnt[3] = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        int ci = w->slot_ctx[kv_remote_slot(keys[i], (size_t)klen[i])];
        redisAppendCommand(w->c[ci], "GET %b", keys[i], (size_t)klen[i]);
        cnt[ci]++;
    }
    for (int ci = 0; ci < w->n; ci++) { /* flush every node before reading */
        int done = 0;
        while (cnt[ci] && !done)
            if (redisBufferWrite(w->c[ci], &done) != REDIS_OK)
                return -1;
    }
    long long bytes = 0;
    for (int ci = 0; ci < w->n; ci++)
        for (int k = 0; k < cnt[ci]; k++) {
            redisReply *rep = NULL;
            if (redisGetReply(w->c[ci], (void **)&rep) != REDIS_OK || !rep)
                return -1;
            bytes += rep->type == REDIS_REPLY_STRING ? (long long)rep->len : 0;
            freeReplyObject(rep);
        }
    return bytes;
}

/* redis-benchmark's GET throughput for values of size bytes, in GB/s; 0 if
 * it is not installed or did not report. */
static double redis_benchmark_gbps(int port, size_t size)
{
    if (system("command -v redis-benchmark >/dev/null 2>&1") != 0)
        return 0;
    size_t n = (size_t)(256u << 20) / size;
    n = n < 200 ? 200 : n > 100000 ? 100000 : n;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "redis-benchmark -h 127.0.0.1 -p %d -t set,get -d %zu -P 16 -c 1 -n %zu --csv "
             "2>/dev/null", port, size, n);
    FILE *f = popen(cmd, "r");
    if (!f)
        return 0;
    char line[512];
    double rps = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "\"GET\",\"", 7))
            rps = atof(line + 7);
    pclose(f);
    return rps * (double)size / 1e9;
}

static int bench_mode(const char *mode, const size_t *sizes, int n_sizes, size_t mib, int reps,
                      int use_rb, row_t *rows, int *n_rows)
{
    kv_tredis_t t;
    kv_tredis_start(&t, mode);
    kv_remote_config_t cfg = {.url = t.url, .ns = NS, .timeout_ms = 30000};
    kv_remote_t *r = NULL;
    raw_t w;
    memset(&w, 0, sizeof w);
    if (kv_remote_create(&cfg, &r) || raw_open(&w, &t)) {
        fprintf(stderr, "kvbench-remote: cannot reach the %s servers\n", mode);
        return 1;
    }
    for (int si = 0; si < n_sizes; si++) {
        size_t size = sizes[si], batch = size <= 16384 ? 256 : 16;
        size_t keys = (mib << 20) / size;
        keys = (keys + batch - 1) / batch * batch;
        uint8_t *buf = malloc(batch * size);
        char (*kstr)[128] = malloc(keys * sizeof *kstr);
        int *klen = malloc(keys * sizeof *klen);
        kv_remote_get_t *g = malloc(batch * sizeof *g);
        kv_remote_set_t *s = malloc(batch * sizeof *s);
        struct iovec *iv = malloc(batch * sizeof *iv);
        uint64_t seed = 1;
        for (size_t j = 0; j < batch * size; j++)
            buf[j] = (uint8_t)kv_bench_rand(&seed);
        /* store every key (batch at a time) */
        for (size_t k0 = 0; k0 < keys; k0 += batch) {
            for (size_t i = 0; i < batch; i++) {
                kv_remote_key_t key;
                uint64_t ks = (k0 + i) * 1000003u + size;
                for (int b = 0; b < 32; b += 8) {
                    uint64_t v = kv_bench_rand(&ks);
                    memcpy(key.hash + b, &v, 8);
                }
                klen[k0 + i] = kv_remote_key_string(NS, &key, kstr[k0 + i], 128);
                iv[i] = (struct iovec){buf + i * size, size};
                s[i] = (kv_remote_set_t){.key = key, .format = 1, .iov = &iv[i], .iovcnt = 1};
                g[i].key = key; /* (unused here) */
            }
            if (kv_remote_set(r, s, batch) != (int)batch) {
                fprintf(stderr, "kvbench-remote: storing failed\n");
                return 1;
            }
        }
        double kv[MAX_REPS], raw[MAX_REPS], ratio[MAX_REPS];
        int bad = 0;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = kv_bench_now();
            for (size_t k0 = 0; k0 < keys; k0 += batch) {
                for (size_t i = 0; i < batch; i++) {
                    uint64_t ks = (k0 + i) * 1000003u + size;
                    for (int b = 0; b < 32; b += 8) {
                        uint64_t v = kv_bench_rand(&ks);
                        memcpy(g[i].key.hash + b, &v, 8);
                    }
                    g[i].dst = buf + i * size;
                    g[i].cap = size;
                }
                bad |= kv_remote_get(r, g, batch) != (int)batch;
            }
            double t1 = kv_bench_now();
            long long got = 0;
            for (size_t k0 = 0; k0 < keys; k0 += batch) {
                long long b = raw_batch(&w, kstr + k0, klen + k0, batch);
                bad |= b < 0;
                got += b;
            }
            double t2 = kv_bench_now();
            kv[rep] = (double)(keys * size) / (t1 - t0) / 1e9;
            raw[rep] = (double)got / (t2 - t1) / 1e9;
            ratio[rep] = kv[rep] / raw[rep];
        }
        if (bad) {
            fprintf(stderr, "kvbench-remote: a fetch failed\n");
            return 1;
        }
        row_t *row = &rows[(*n_rows)++];
        *row = (row_t){.mode = mode, .value_bytes = size, .batch = batch, .keys = keys,
                       .kv_gbps = kv_bench_median(kv, (size_t)reps),
                       .raw_gbps = kv_bench_median(raw, (size_t)reps),
                       .ratio = kv_bench_median(ratio, (size_t)reps)};
        if (use_rb && t.n == 1)
            row->rb_gbps = redis_benchmark_gbps(t.port[0], size);
        fprintf(stderr, "kvbench-remote: %s %zu B: kvpage %.3f GB/s, raw %.3f GB/s\n", mode,
                size, row->kv_gbps, row->raw_gbps);
        free(buf);
        free(kstr);
        free(klen);
        free(g);
        free(s);
        free(iv);
    }
    raw_close(&w);
    kv_remote_destroy(r);
    kv_tredis_stop(&t);
    return 0;
}

int main(int argc, char **argv)
{
    int json = 0, reps = 5, use_rb = 1, n_sizes = 2, single = 1, cluster = 1;
    size_t mib = 64, sizes[MAX_SIZES] = {4096, 368640};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--no-redis-benchmark")) {
            use_rb = 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--mib")) {
            mib = (size_t)atol(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--reps")) {
            reps = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--modes")) {
            const char *m = argv[++i];
            single = strstr(m, "single") != NULL;
            cluster = strstr(m, "cluster") != NULL;
        } else if (i + 1 < argc && !strcmp(argv[i], "--sizes")) {
            n_sizes = 0;
            for (char *p = argv[++i]; *p && n_sizes < MAX_SIZES; p += *p == ',')
                sizes[n_sizes++] = strtoul(p, &p, 10);
        } else {
            fprintf(stderr, "usage: %s [--json] [--mib N] [--reps R] [--sizes A,B] "
                            "[--modes single,cluster] [--no-redis-benchmark]\n", argv[0]);
            return 2;
        }
    }
    int ok_sizes = n_sizes > 0;
    for (int i = 0; i < n_sizes; i++)
        ok_sizes &= sizes[i] >= 1 && sizes[i] <= (64u << 20);
    if (!ok_sizes || mib < 1 || mib > 4096 || reps < 1 || reps > MAX_REPS ||
        (!single && !cluster)) {
        fprintf(stderr, "kvbench-remote: bad --sizes/--mib/--reps/--modes\n");
        return 2;
    }
    row_t rows[2 * MAX_SIZES];
    int n_rows = 0;
    if ((single && bench_mode("single", sizes, n_sizes, mib, reps, use_rb, rows, &n_rows)) ||
        (cluster && bench_mode("cluster", sizes, n_sizes, mib, reps, 0, rows, &n_rows)))
        return 1;
    if (json) {
        printf("{\"bench\":\"remote\",\"mib\":%zu,\"reps\":%d,\"results\":[", mib, reps);
        for (int i = 0; i < n_rows; i++)
            printf("%s{\"mode\":\"%s\",\"value_bytes\":%zu,\"batch\":%zu,\"keys\":%zu,"
                   "\"fetch_gbps\":%.4f,\"raw_get_gbps\":%.4f,\"ratio\":%.3f,"
                   "\"redis_benchmark_get_gbps\":%.4f}",
                   i ? "," : "", rows[i].mode, rows[i].value_bytes, rows[i].batch,
                   rows[i].keys, rows[i].kv_gbps, rows[i].raw_gbps, rows[i].ratio,
                   rows[i].rb_gbps);
        printf("]}\n");
    } else {
        printf("%-8s %10s %6s %7s %12s %12s %7s %14s\n", "mode", "value_B", "batch", "keys",
               "kvpage_GB/s", "raw_GB/s", "ratio", "redis-bench");
        for (int i = 0; i < n_rows; i++)
            printf("%-8s %10zu %6zu %7zu %12.3f %12.3f %7.2f %14.3f\n", rows[i].mode,
                   rows[i].value_bytes, rows[i].batch, rows[i].keys, rows[i].kv_gbps,
                   rows[i].raw_gbps, rows[i].ratio, rows[i].rb_gbps);
    }
    return 0;
}
