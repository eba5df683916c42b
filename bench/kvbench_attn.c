/*
 * kvbench_attn.c — decode attention throughput through the public API,
 * against memcpy bandwidth measured in the same run.
 *
 * Shape: one layer of a SmolLM2-135M-like model (9 query heads, 3 kv heads,
 * head_dim 64, default page_bytes = 16 FP16 tokens). For each context length
 * and batch, a store is filled with kv_append (random FP32 K/V -> FP16
 * pages), then kv_attn_decode is timed (median of many calls after a
 * warm-up). Figures:
 *   gbps            KV bytes a call reads / time: tokens * n_kv_heads * 2 (K,V)
 *                   * head_dim * 2 bytes, per call
 *   tokens_per_s    calls/s * ctx * batch (tokens attended per second)
 *   frac_of_memcpy  gbps / memcpy_gbps
 *   memcpy_gbps     memcpy of a buffer of memcpy_bytes (>= 2x the last-level
 *                   cache when the OS reports it) counting bytes READ only
 *                   (memcpy_counts: "read"), median of several copies
 *   *_best          the same from the fastest call / copy instead of the
 *                   median (frac_best = gbps_best / memcpy_gbps_best): on a
 *                   shared, busy machine the median measures the scheduler
 *   kv_bytes        KV bytes one call reads; compare with llc_bytes: a
 *                   working set that fits the LLC is served from cache.
 *   loadavg         1-minute load average at the start and the end: figures
 *                   taken on a machine busier than its core count are noise.
 *
 * Usage: kvbench-attn [--json] [--quick] [--threads N]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvpage/kvpage.h"

#define N_Q      9u
#define N_KV     3u
#define HEAD_DIM 64u

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng_state = 0x1234567u;
static float randf(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static size_t llc_bytes(void)
{
#ifdef _SC_LEVEL3_CACHE_SIZE
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0)
        return (size_t)l3;
#endif
    return 0;
}

/* memcpy GB/s (bytes read) over a buffer of `bytes`: median, and best in
 * *best. */
static double memcpy_gbps(size_t bytes, int reps, double *best)
{
    char *src = malloc(bytes), *dst = malloc(bytes);
    *best = 0.0;
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0.0;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes); /* fault every page in before timing */
    double t[16];
    reps = reps > 16 ? 16 : reps;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        memcpy(dst, src, bytes);
        t[r] = now_s() - t0;
        src[r] = dst[bytes - 1 - r]; /* keep the copies observable */
    }
    double med = median(t, (size_t)reps); /* sorts t */
    free(src);
    free(dst);
    *best = (double)bytes / t[0] / 1e9;
    return (double)bytes / med / 1e9;
}

typedef struct result {
    uint32_t ctx, batch;
    double sec, gbps, tokens_per_s, frac;
    double sec_best, gbps_best, frac_best;
    uint64_t kv_bytes;
    int err;
} result_t;

/* Fill a store with `batch` sequences of ctx tokens and time decode. */
static result_t bench_decode(uint32_t ctx, uint32_t batch, uint32_t threads,
                             double min_time, double memcpy_rate,
                             double memcpy_best)
{
    result_t r = {.ctx = ctx, .batch = batch};
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = 1;
    cfg.n_q_heads = N_Q;
    cfg.n_kv_heads = N_KV;
    cfg.head_dim = HEAD_DIM;
    cfg.n_threads = threads;
    cfg.host_pages = (uint64_t)batch * N_KV * (ctx / 16 + 2) + 16;
    kv_store_t *st = NULL;
    kv_seq_id_t seqs[64];
    const uint32_t chunk = 512;
    float *k = malloc(sizeof(float) * chunk * N_KV * HEAD_DIM);
    float *v = malloc(sizeof(float) * chunk * N_KV * HEAD_DIM);
    float *q = malloc(sizeof(float) * batch * N_Q * HEAD_DIM);
    float *out = malloc(sizeof(float) * batch * N_Q * HEAD_DIM);
    double *t = NULL;
    if (!k || !v || !q || !out || batch > 64) {
        r.err = KV_ENOMEM;
        goto done;
    }
    if ((r.err = kv_store_create(&cfg, &st)))
        goto done;
    for (uint32_t b = 0; b < batch; b++) {
        if ((r.err = kv_seq_create(st, &seqs[b])))
            goto done;
        for (uint32_t done_t = 0; done_t < ctx; done_t += chunk) {
            uint32_t n = ctx - done_t < chunk ? ctx - done_t : chunk;
            for (size_t j = 0; j < (size_t)n * N_KV * HEAD_DIM; j++) {
                k[j] = randf();
                v[j] = randf();
            }
            if ((r.err = kv_append(st, seqs[b], 0, n, KV_DTYPE_F32, k, v,
                                   NULL)))
                goto done;
        }
    }
    for (size_t j = 0; j < (size_t)batch * N_Q * HEAD_DIM; j++)
        q[j] = randf();
    kv_decode_t d = {.layer = 0, .batch = batch, .seqs = seqs, .q = q,
                     .out = out};
    for (int w = 0; w < 3; w++)
        if ((r.err = kv_attn_decode(st, &d)))
            goto done;
    size_t cap = 1 << 16, n = 0;
    t = malloc(cap * sizeof *t);
    if (!t) {
        r.err = KV_ENOMEM;
        goto done;
    }
    double start = now_s();
    while (n < cap && (n < 7 || now_s() - start < min_time)) {
        double t0 = now_s();
        if ((r.err = kv_attn_decode(st, &d)))
            goto done;
        t[n++] = now_s() - t0;
    }
    r.sec = median(t, n); /* sorts t */
    r.sec_best = t[0];
    r.kv_bytes = (uint64_t)ctx * batch * N_KV * 2 * HEAD_DIM * 2;
    r.gbps = (double)r.kv_bytes / r.sec / 1e9;
    r.gbps_best = (double)r.kv_bytes / r.sec_best / 1e9;
    r.tokens_per_s = (double)ctx * batch / r.sec;
    r.frac = memcpy_rate > 0 ? r.gbps / memcpy_rate : 0.0;
    r.frac_best = memcpy_best > 0 ? r.gbps_best / memcpy_best : 0.0;
done:
    free(t);
    free(k);
    free(v);
    free(q);
    free(out);
    kv_store_destroy(st);
    return r;
}

int main(int argc, char **argv)
{
    int json = 0, quick = 0;
    uint32_t threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--json] [--quick] [--threads N]\n",
                    argv[0]);
            return 2;
        }
    }
    double load0[1] = {-1.0}, load1[1] = {-1.0};
    if (getloadavg(load0, 1) != 1)
        load0[0] = -1.0;
    size_t llc = llc_bytes();
    size_t mbytes = (size_t)256 << 20;
    if (2 * llc > mbytes)
        mbytes = 2 * llc;
    if (mbytes > ((size_t)1 << 30))
        mbytes = (size_t)1 << 30;
    if (quick)
        mbytes = (size_t)64 << 20;
    double mc_best;
    double mc = memcpy_gbps(mbytes, quick ? 3 : 9, &mc_best);

    static const uint32_t ctxs[] = {1024, 2048, 4096, 8192, 16384, 32768};
    static const uint32_t quick_ctxs[] = {1024, 8192};
    const uint32_t *cl = quick ? quick_ctxs : ctxs;
    size_t ncl = quick ? 2 : sizeof ctxs / sizeof ctxs[0];
    double min_time = quick ? 0.05 : 0.4;
    result_t res[16];
    size_t nr = 0;
    for (size_t i = 0; i < ncl; i++)
        res[nr++] = bench_decode(cl[i], 1, threads, min_time, mc, mc_best);
    const uint32_t b4[] = {2048, 8192};
    for (size_t i = 0; i < (quick ? 1u : 2u); i++)
        res[nr++] = bench_decode(b4[i], 4, threads, min_time, mc, mc_best);

    if (getloadavg(load1, 1) != 1)
        load1[0] = -1.0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int rc = 0;
    for (size_t i = 0; i < nr; i++)
        if (res[i].err) {
            fprintf(stderr, "ctx %u batch %u: %s\n", res[i].ctx, res[i].batch,
                    kv_strerror(res[i].err));
            rc = 1;
        }
    if (json) {
        printf("{\"bench\":\"attn\",\"backend\":\"cpu\",\"threads\":%u,"
               "\"shape\":{\"n_q_heads\":%u,\"n_kv_heads\":%u,\"head_dim\":%u},"
               "\"memcpy_gbps\":%.3f,\"memcpy_gbps_best\":%.3f,"
               "\"memcpy_counts\":\"read\","
               "\"memcpy_threads\":1,\"memcpy_bytes\":%zu,\"llc_bytes\":%zu,"
               "\"cpus\":%ld,\"loadavg\":[%.2f,%.2f],\"results\":[",
               threads, N_Q, N_KV, HEAD_DIM, mc, mc_best, mbytes, llc, cpus,
               load0[0], load1[0]);
        for (size_t i = 0; i < nr; i++)
            printf("%s{\"format\":\"fp16\",\"ctx\":%u,\"batch\":%u,"
                   "\"us_per_call\":%.2f,\"kv_bytes\":%llu,\"gbps\":%.3f,"
                   "\"tokens_per_s\":%.0f,\"frac_of_memcpy\":%.3f,"
                   "\"us_best\":%.2f,\"gbps_best\":%.3f,\"frac_best\":%.3f}",
                   i ? "," : "", res[i].ctx, res[i].batch, res[i].sec * 1e6,
                   (unsigned long long)res[i].kv_bytes, res[i].gbps,
                   res[i].tokens_per_s, res[i].frac, res[i].sec_best * 1e6,
                   res[i].gbps_best, res[i].frac_best);
        printf("]}\n");
    } else {
        printf("decode attention, cpu backend, %u threads, fp16 pages\n",
               threads);
        printf("memcpy %.2f GB/s median, %.2f best (bytes read, 1 thread, "
               "%zu MiB buffer, LLC %zu MiB); load average %.2f -> %.2f on "
               "%ld cpus\n", mc, mc_best, mbytes >> 20, llc >> 20, load0[0],
               load1[0], cpus);
        printf("%8s %6s %12s %10s %10s %14s %8s %10s %8s\n", "ctx", "batch",
               "us/call", "KV MiB", "GB/s", "tokens/s", "frac", "best GB/s",
               "best fr");
        for (size_t i = 0; i < nr; i++)
            printf("%8u %6u %12.2f %10.2f %10.3f %14.0f %8.3f %10.3f %8.3f\n",
                   res[i].ctx, res[i].batch, res[i].sec * 1e6,
                   (double)res[i].kv_bytes / 1048576.0, res[i].gbps,
                   res[i].tokens_per_s, res[i].frac, res[i].gbps_best,
                   res[i].frac_best);
    }
    return rc;
}
