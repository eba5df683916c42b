/* SPDX-License-Identifier: MIT */
/*
 * kvbench_attn.c — decode attention throughput through the public API, per
 * page format, against FP16 and memcpy bandwidth measured in the same run.
 *
 * Shape: one layer of a SmolLM2-135M-like model (9 query heads, 3 kv heads,
 * head_dim 64, default page_bytes = 16 FP16 tokens). For each point (context
 * length, batch, source) four stores are filled with the same random K/V:
 * fp16 (kv_append), int4 / int2 (kv_config_t.kv_format, residual 128: the
 * store converts as it appends), merged (two correlated layers, then
 * kv_seq_merge_layers; decode alternates the pair's layers, the upper one
 * reading variant 1); and, where the CPU has AVX-512 VNNI + VBMI, int4 and
 * int2 again on stores created with KV_CONFIG_INT8_ATTN (approximate int8
 * attention). Then kv_attn_decode is timed interleaved (one call per row
 * in turn, so a busy machine slows all alike; median of many calls after a
 * warm-up). Fields of a row:
 *   format, note     the format and its kv_format_note() (bits/element)
 *   attn             "exact" (attention over the floats kv_read gives) or
 *                    "int8" (KV_CONFIG_INT8_ATTN); text rows mark it +i8
 *   source           "cache": the layers timed fit the LLC (1 layer, 2 for
 *                    merged); "memory": enough layers of that format to
 *                    hold >= memcpy_bytes of pages, called round-robin, so
 *                    every call streams its pages from DRAM
 *   kv_bytes         page bytes one call reads, from kv_store_stats (merged:
 *                    the pair's merged pages + this layer's own pages)
 *   set_bytes        page bytes of all layers of the store
 *   gbps             kv_bytes / time;  tokens_per_s  ctx * batch / time
 *   frac_of_memcpy   gbps / memcpy_gbps (memcpy of memcpy_bytes >= 2x the
 *                    LLC when the OS reports it, counting bytes READ only)
 *   speedup_vs_fp16  time of the fp16 row of the same point / this time;
 *                    speedup_best_vs_fp16 the same from the fastest calls
 *   bytes_vs_fp16    kv_bytes / kv_bytes of the fp16 row
 *   *_best           from the fastest call / copy instead of the median: on
 *                    a shared, busy machine the median measures the scheduler
 *   loadavg          1-minute load average at the start and the end
 *   clock            "wall" (default) or "cpu" (--clock cpu: every time,
 *                    memcpy's included, is the process's CPU time; with
 *                    --threads 1 that is the work of a call whatever else
 *                    the machine runs, the figure to compare code on a
 *                    busy shared machine; with more threads it sums them)
 *
 * Usage: kvbench-attn [--json] [--quick] [--threads N] [--ctx N]
 *                     [--min-time S] [--clock wall|cpu]
 *                     [--backend cpu|cuda ...]
 *   --ctx N: only that context (cache rows, and memory rows unless --quick);
 *   --min-time S: seconds of timed calls per format and point;
 *   --backend cuda: the GPU rows instead, with their own options and
 *   copy_gbps baseline (bench/kvbench_attn_cuda.cu, docs/gpu.md).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvpage/kvpage.h"
#ifdef KV_HAVE_CUDA
/* The GPU rows (kvbench_attn_cuda.cu): parses the remaining arguments,
 * prints rows (JSON with --json); returns the exit status. */
int kvbench_attn_cuda(int argc, char **argv);
#endif

/* --backend cuda: every argument goes to the CUDA bench. */
static int bench_cuda(int argc, char **argv)
{
#ifdef KV_HAVE_CUDA
    return kvbench_attn_cuda(argc, argv);
#else
    (void)argc;
    fprintf(stderr, "%s: built without CUDA\n", argv[0]);
    return 2;
#endif
}

/* The CMake build type this benchmark was built in (make bench compares
 * the default build with Release). */
#ifndef KV_BUILD_TYPE
#define KV_BUILD_TYPE "unknown"
#endif

#define N_Q      9u
#define N_KV     3u
#define HEAD_DIM 64u

/* The clock every time is read from (--clock). */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *clock_name(void)
{
    return bench_clock == CLOCK_MONOTONIC ? "wall" : "cpu";
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
    uint32_t fmt;             /* kv_format_t of the pages timed            */
    int i8;                   /* 1: KV_CONFIG_INT8_ATTN (approximate)      */
    int skip;                 /* 1: i8 row on a CPU without it (no row)    */
    uint32_t ctx, batch, layers;
    int cold;                 /* 1: layers rotate, KV read from DRAM       */
    double sec, gbps, tokens_per_s, frac;
    double sec_best, gbps_best, frac_best;
    uint64_t kv_bytes;        /* page bytes one call reads (store stats)   */
    uint64_t set_bytes;       /* page bytes of every layer timed           */
    double speedup, speedup_best, bytes_ratio; /* vs the FP16 row         */
    int err;
} result_t;

static const char *fmt_name(uint32_t f)
{
    static const char *const names[] = {"fp16", "int4", "int2", "merged"};
    return f < KV_FMT_COUNT ? names[f] : "?";
}

/* The rows of a point: every format with exact attention, then INT4 and
 * INT2 with KV_CONFIG_INT8_ATTN (skipped where the CPU lacks it). */
#define N_ROWS (KV_FMT_COUNT + 2u)
static uint32_t row_fmt(uint32_t i)
{
    return i < KV_FMT_COUNT ? i : i == KV_FMT_COUNT ? KV_FMT_INT4 : KV_FMT_INT2;
}

/* K/V of one chunk of `chunk` tokens for layer l: the same random values
 * for every layer, except that an odd layer of a MERGED store adds a small
 * perturbation (layers of a pair are correlated, as MiniCache assumes). */
static void fill_chunk(float *k, float *v, const float *k0, const float *v0,
                       size_t n, uint32_t fmt, uint32_t l)
{
    for (size_t j = 0; j < n; j++) {
        float e = fmt == KV_FMT_MERGED && l % 2 ? 0.05f * randf() : 0.0f;
        k[j] = k0[j] + e;
        v[j] = v0[j] - e;
    }
}

/* One store being timed: its pages, queries and call times. */
typedef struct run {
    kv_store_t *st;
    kv_seq_id_t seqs[64];
    float *q, *out;     /* [batch][N_Q][HEAD_DIM]                      */
    double *t;          /* [cap] seconds per call                      */
    size_t n, cap;      /* calls timed                                 */
} run_t;

static void run_free(run_t *u)
{
    free(u->q);
    free(u->out);
    free(u->t);
    kv_store_destroy(u->st);
    memset(u, 0, sizeof *u);
}

/* Fill `layers` layers of a store of format fmt with `batch` sequences of
 * ctx tokens. INT4/INT2: the store converts as it appends (kv_format,
 * residual 128). MERGED: FP16 appends, then kv_seq_merge_layers on each
 * pair (layers must be even); decode reads both layers of each pair (the
 * odd one through variant 1). Sets r->kv_bytes from the store's stats. */
static int setup(result_t *r, run_t *u, uint32_t threads)
{
    const uint32_t fmt = r->fmt, ctx = r->ctx, batch = r->batch;
    const uint32_t layers = r->layers;
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = layers;
    cfg.n_q_heads = N_Q;
    cfg.n_kv_heads = N_KV;
    cfg.head_dim = HEAD_DIM;
    cfg.n_threads = threads;
    cfg.host_pages = (uint64_t)layers * batch * N_KV * (ctx / 16 + 2) + 64;
    if (fmt == KV_FMT_MERGED) /* merged pages before the FP16 ones go */
        cfg.host_pages += (uint64_t)batch * N_KV * (ctx / 8 + 2);
    if (fmt == KV_FMT_INT4 || fmt == KV_FMT_INT2) {
        cfg.kv_format = fmt;
        cfg.residual = 128;
    }
    if (r->i8)
        cfg.flags |= KV_CONFIG_INT8_ATTN;
    const uint32_t chunk = 512;
    const size_t cn = (size_t)chunk * N_KV * HEAD_DIM;
    const size_t qn = (size_t)batch * N_Q * HEAD_DIM;
    float *k0 = malloc(sizeof(float) * cn), *v0 = malloc(sizeof(float) * cn);
    float *k = malloc(sizeof(float) * cn), *v = malloc(sizeof(float) * cn);
    int err = 0;
    u->cap = 1 << 16;
    u->q = malloc(sizeof(float) * qn);
    u->out = malloc(sizeof(float) * qn);
    u->t = malloc(u->cap * sizeof *u->t);
    if (!k0 || !v0 || !k || !v || !u->q || !u->out || !u->t || batch > 64 ||
        (fmt == KV_FMT_MERGED && layers % 2)) {
        err = KV_ENOMEM;
        goto done;
    }
    if ((err = kv_store_create(&cfg, &u->st)))
        goto done;
    for (size_t j = 0; j < cn; j++) {
        k0[j] = randf(); /* one chunk of values serves every append */
        v0[j] = randf();
    }
    for (uint32_t b = 0; b < batch; b++) {
        if ((err = kv_seq_create(u->st, &u->seqs[b])))
            goto done;
        for (uint32_t l = 0; l < layers; l++) {
            fill_chunk(k, v, k0, v0, cn, fmt, l);
            for (uint32_t done_t = 0; done_t < ctx; done_t += chunk) {
                uint32_t n = ctx - done_t < chunk ? ctx - done_t : chunk;
                if ((err = kv_append(u->st, u->seqs[b], l, n, KV_DTYPE_F32, k,
                                     v, NULL)))
                    goto done;
            }
            if (fmt == KV_FMT_MERGED && l % 2 &&
                (err = kv_seq_merge_layers(u->st, u->seqs[b], l, NULL)))
                goto done;
        }
    }
    kv_stats_t ss = {.struct_size = sizeof ss};
    if ((err = kv_store_stats(u->st, &ss)))
        goto done;
    r->set_bytes = ss.kv_bytes;
    if (fmt == KV_FMT_MERGED) /* a call reads the pair's merged pages and */
        r->kv_bytes = (ss.bytes_by_format[KV_FMT_MERGED] + /* its own half */
                       (ss.kv_bytes - ss.bytes_by_format[KV_FMT_MERGED]) /
                           2) /
                      (layers / 2);
    else
        r->kv_bytes = ss.kv_bytes / layers;
    for (size_t j = 0; j < qn; j++)
        u->q[j] = randf();
done:
    free(k0);
    free(v0);
    free(k);
    free(v);
    return err;
}

/* One decode call on the store's next layer (round-robin); its time is
 * recorded when `record`. */
static int call(const result_t *r, run_t *u, size_t i, int record)
{
    kv_decode_t d = {.layer = (uint32_t)(i % r->layers), .batch = r->batch,
                     .seqs = u->seqs, .q = u->q, .out = u->out};
    double t0 = now_s();
    int err = kv_attn_decode(u->st, &d);
    if (record && !err && u->n < u->cap)
        u->t[u->n++] = now_s() - t0;
    return err;
}

static void finish(result_t *r, run_t *u, double memcpy_rate,
                   double memcpy_best)
{
    r->sec = median(u->t, u->n); /* sorts t */
    r->sec_best = u->t[0];
    r->gbps = (double)r->kv_bytes / r->sec / 1e9;
    r->gbps_best = (double)r->kv_bytes / r->sec_best / 1e9;
    r->tokens_per_s = (double)r->ctx * r->batch / r->sec;
    r->frac = memcpy_rate > 0 ? r->gbps / memcpy_rate : 0.0;
    r->frac_best = memcpy_best > 0 ? r->gbps_best / memcpy_best : 0.0;
}

/* Page bytes per layer relative to FP16 at D = 64, 4 KiB pages (for
 * choosing how many layers make a cold working set; the rows report the
 * measured bytes): INT4 32 tokens/page (1 KiB unused), INT2 64, MERGED
 * about half of a pair's FP16 per layer. */
static uint32_t fp16_bytes_over(uint32_t fmt)
{
    return fmt == KV_FMT_INT2 ? 4u : fmt == KV_FMT_FP16 ? 1u : 2u;
}

/* The rows of one (ctx, batch, hot/cold) point, FP16 first. The four
 * stores are built first, then timed interleaved (one call of each format
 * in turn), so that a busy machine slows every format alike; speedups and
 * byte ratios are against the FP16 row of the same point. */
static size_t bench_point(result_t *res, uint32_t ctx, uint32_t batch,
                          int cold, size_t mbytes, uint32_t threads,
                          double min_time, double mc, double mc_best)
{
    run_t runs[N_ROWS];
    memset(runs, 0, sizeof runs);
    int err = 0;
    for (uint32_t i = 0; i < N_ROWS; i++) {
        const uint32_t f = row_fmt(i);
        uint32_t layers = f == KV_FMT_MERGED ? 2 : 1;
        if (cold) { /* KV of all layers >= the memcpy buffer */
            uint64_t per = (uint64_t)ctx * batch * N_KV * 2 * HEAD_DIM * 2 /
                           fp16_bytes_over(f);
            layers = (uint32_t)((mbytes + per - 1) / per);
            layers += f == KV_FMT_MERGED && layers % 2;
        }
        res[i] = (result_t){.fmt = f, .i8 = i >= KV_FMT_COUNT, .ctx = ctx,
                            .batch = batch, .layers = layers, .cold = cold};
        if (!err)
            err = res[i].err = setup(&res[i], &runs[i], threads);
        if (err == KV_ENOTSUP && res[i].i8) { /* this CPU: no int8 path */
            res[i].skip = 1;
            res[i].err = err = 0;
            run_free(&runs[i]);
        }
    }
    size_t warm = 0;
    for (uint32_t i = 0; i < N_ROWS; i++)
        warm = res[i].layers > warm ? res[i].layers : warm;
    for (size_t c = 0; !err && c < (warm > 3 ? warm : 3); c++)
        for (uint32_t i = 0; !err && i < N_ROWS; i++)
            if (!res[i].skip)
                err = res[i].err = call(&res[i], &runs[i], c, 0);
    double start = now_s();
    for (size_t c = 0; !err && (c < 7 || now_s() - start <
                                              min_time * N_ROWS);
         c++)
        for (uint32_t i = 0; !err && i < N_ROWS; i++)
            if (!res[i].skip)
                err = res[i].err = call(&res[i], &runs[i], c, 1);
    for (uint32_t i = 0; i < N_ROWS; i++) {
        if (!err && !res[i].skip)
            finish(&res[i], &runs[i], mc, mc_best);
        run_free(&runs[i]);
    }
    for (uint32_t i = 0; !err && i < N_ROWS; i++) {
        res[i].speedup = res[0].sec / res[i].sec;
        res[i].speedup_best = res[0].sec_best / res[i].sec_best;
        res[i].bytes_ratio = (double)res[i].kv_bytes / (double)res[0].kv_bytes;
    }
    return N_ROWS;
}

int main(int argc, char **argv)
{
    int json = 0, quick = 0;
    uint32_t threads = 2, only_ctx = 0;
    double min_time_arg = 0.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc)
            min_time_arg = strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "wall") || !strcmp(argv[i + 1], "cpu")))
            bench_clock = !strcmp(argv[++i], "cpu") ? CLOCK_PROCESS_CPUTIME_ID
                                                     : CLOCK_MONOTONIC;
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            only_ctx = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc &&
                 !strcmp(argv[i + 1], "cuda"))
            return bench_cuda(argc, argv);
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc &&
                 !strcmp(argv[i + 1], "cpu"))
            i++;
        else {
            fprintf(stderr,
                    "usage: %s [--json] [--quick] [--threads N] [--ctx N] "
                    "[--min-time S] [--clock wall|cpu] [--backend cpu|cuda]\n",
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

    static const uint32_t ctxs[] = {1024, 4096, 16384, 32768};
    static const uint32_t quick_ctxs[] = {1024, 16384};
    const uint32_t *cl = quick ? quick_ctxs : ctxs;
    size_t ncl = quick ? 2 : sizeof ctxs / sizeof ctxs[0];
    if (only_ctx) {
        cl = &only_ctx;
        ncl = 1;
    }
    double min_time = min_time_arg > 0 ? min_time_arg : quick ? 0.05 : 0.4;
    result_t res[8 * N_ROWS];
    size_t nr = 0;
    for (size_t i = 0; i < ncl; i++)
        nr += bench_point(res + nr, cl[i], 1, 0, mbytes, threads, min_time, mc,
                          mc_best);
    if (!only_ctx && !quick)
        nr += bench_point(res + nr, 8192, 4, 0, mbytes, threads, min_time, mc,
                          mc_best);
    /* from memory: KV of all layers >= the memcpy buffer, read round-robin */
    if (!quick)
        nr += bench_point(res + nr, only_ctx ? only_ctx : 16384, 1, 1, mbytes,
                          threads, min_time, mc, mc_best);

    if (getloadavg(load1, 1) != 1)
        load1[0] = -1.0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int rc = 0;
    for (size_t i = 0; i < nr; i++)
        if (res[i].err) {
            fprintf(stderr, "%s ctx %u batch %u: %s\n", fmt_name(res[i].fmt),
                    res[i].ctx, res[i].batch, kv_strerror(res[i].err));
            rc = 1;
        }
    if (json) {
        printf("{\"bench\":\"attn\",\"backend\":\"cpu\",\"build\":\"%s\","
               "\"clock\":\"%s\",\"threads\":%u,"
               "\"shape\":{\"n_q_heads\":%u,\"n_kv_heads\":%u,\"head_dim\":%u},"
               "\"memcpy_gbps\":%.3f,\"memcpy_gbps_best\":%.3f,"
               "\"memcpy_counts\":\"read\","
               "\"memcpy_threads\":1,\"memcpy_bytes\":%zu,\"llc_bytes\":%zu,"
               "\"cpus\":%ld,\"loadavg\":[%.2f,%.2f],\"results\":[",
               KV_BUILD_TYPE, clock_name(), threads, N_Q, N_KV, HEAD_DIM, mc, mc_best, mbytes,
               llc, cpus, load0[0], load1[0]);
        for (size_t i = 0, first = 1; i < nr; i++) {
            if (res[i].skip)
                continue;
            printf("%s{\"format\":\"%s\",\"attn\":\"%s\","
                   "\"note\":\"%s\",\"ctx\":%u,"
                   "\"batch\":%u,\"layers\":%u,\"source\":\"%s\","
                   "\"us_per_call\":%.2f,\"kv_bytes\":%llu,"
                   "\"set_bytes\":%llu,\"gbps\":%.3f,"
                   "\"tokens_per_s\":%.0f,\"frac_of_memcpy\":%.3f,"
                   "\"us_best\":%.2f,\"gbps_best\":%.3f,\"frac_best\":%.3f,"
                   "\"speedup_vs_fp16\":%.3f,\"speedup_best_vs_fp16\":%.3f,"
                   "\"bytes_vs_fp16\":%.4f}",
                   first ? "" : ",", fmt_name(res[i].fmt),
                   res[i].i8 ? "int8" : "exact", kv_format_note((kv_format_t)res[i].fmt), res[i].ctx,
                   res[i].batch, res[i].layers,
                   res[i].cold ? "memory" : "cache", res[i].sec * 1e6,
                   (unsigned long long)res[i].kv_bytes,
                   (unsigned long long)res[i].set_bytes, res[i].gbps,
                   res[i].tokens_per_s, res[i].frac, res[i].sec_best * 1e6,
                   res[i].gbps_best, res[i].frac_best, res[i].speedup,
                   res[i].speedup_best, res[i].bytes_ratio);
            first = 0;
        }
        printf("]}\n");
    } else {
        printf("decode attention, cpu backend, %u threads, %s clock\n",
               threads, clock_name());
        printf("memcpy %.2f GB/s median, %.2f best (bytes read, 1 thread, "
               "%zu MiB buffer, LLC %zu MiB); load average %.2f -> %.2f on "
               "%ld cpus\n", mc, mc_best, mbytes >> 20, llc >> 20, load0[0],
               load1[0], cpus);
        printf("source: cache = the layers timed fit the LLC; memory = layers "
               "rotate over >= %zu MiB of pages\n", mbytes >> 20);
        for (uint32_t f = 0; f < KV_FMT_COUNT; f++)
            printf("  %-6s %s\n", fmt_name(f), kv_format_note((kv_format_t)f));
        printf("  %-6s INT4/INT2 with int8 dot products (KV_CONFIG_INT8_ATTN, "
               "approximate)\n", "+i8");
        printf("%-7s %6s %5s %6s %6s %10s %9s %8s %13s %8s %7s %7s %7s\n",
               "format", "ctx", "batch", "layers", "source", "us/call",
               "KV MiB", "GB/s", "tokens/s", "frac", "x fp16", "best x",
               "bytes");
        for (size_t i = 0; i < nr; i++) {
            if (res[i].skip)
                continue;
            printf("%-4s%-3s %6u %5u %6u %6s %10.2f %9.2f %8.3f %13.0f %8.3f "
                   "%7.2f %7.2f %7.3f\n",
                   fmt_name(res[i].fmt), res[i].i8 ? "+i8" : "", res[i].ctx, res[i].batch,
                   res[i].layers, res[i].cold ? "memory" : "cache",
                   res[i].sec * 1e6, (double)res[i].kv_bytes / 1048576.0,
                   res[i].gbps, res[i].tokens_per_s, res[i].frac,
                   res[i].speedup, res[i].speedup_best, res[i].bytes_ratio);
        }
    }
    return rc;
}
