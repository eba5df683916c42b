/* SPDX-License-Identifier: MIT */
/*
 * kvbench_alloc.c — page pool alloc+free pairs against general allocators.
 *
 * One "pair" is: get a block of `bytes`, write one byte of it through a
 * volatile pointer and read it back, give the block back. Implementations,
 * all measured in the same run:
 *   kvpage          kv_alloc_page_mem (the page and its address, as malloc
 *                   gives) + kv_alloc_release (per-thread caches on: the
 *                   lock-free hot path)
 *   kvpage-id       the same in three calls: kv_alloc_page, then
 *                   kv_alloc_page_ptr (checks the id again), kv_alloc_release
 *   kvpage-notcache kvpage on a KV_ALLOC_NO_TCACHE pool (mutex every op)
 *   jemalloc        mallocx(bytes, 0) + sdallocx(p, bytes, 0)
 *   glibc           __libc_malloc + __libc_free (called by name: this
 *                   benchmark links jemalloc for the row above, and its
 *                   malloc replaces glibc's in the whole process; the
 *                   library itself links no allocator)
 *   lifo-floor      not an allocator: the least a LIFO per-thread cache
 *                   can do -- pop/push on a thread-local array of 32 page
 *                   indices with an atomic count (kvpage's caches keep one,
 *                   which other threads' stats read) and a refcount store
 *                   each way, no pool, no checks. kvpage's hot path is this
 *                   plus validation; the gap between the two rows is what
 *                   the checks cost, the floor what the design can reach.
 * for bytes 4096 and 65536, threads 1 and 2. With 2 threads each thread
 * runs its own pairs on the same pool / allocator at the same time.
 *
 * Timing: each repetition is calibrated to about ms_per_rep; repetitions run
 * round-robin over the impls (load drift on a shared machine hits them
 * alike). Per repetition and thread: wall time (CLOCK_MONOTONIC) and CPU
 * time (CLOCK_THREAD_CPUTIME_ID, which leaves out time the thread was
 * preempted; but also time it slept on a contended lock), divided by that
 * thread's pairs; the slowest thread counts. Reported:
 *   ns_per_pair      median wall ns per pair per thread
 *   ns_per_pair_min  fastest repetition (wall)
 *   ns_per_pair_cpu  median CPU ns per pair per thread
 *   ratio_vs_jemalloc, ratio_vs_jemalloc_cpu: jemalloc / impl at the same
 *   bytes and threads, from the medians (> 1: faster than jemalloc).
 *
 * Usage: kvbench-alloc [--json] [--quick]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jemalloc/jemalloc.h>

#include "alloc/kv_alloc.h"
#include "kvpage/kvpage.h"

/* glibc's own allocator, whatever malloc resolves to in this process. */
extern void *__libc_malloc(size_t n);
extern void __libc_free(void *p);

typedef enum bench_impl {
    IMPL_KVPAGE = 0,
    IMPL_KVPAGE_ID,
    IMPL_KVPAGE_NOTCACHE,
    IMPL_JEMALLOC,
    IMPL_GLIBC,
    IMPL_FLOOR,
    IMPL_COUNT,
} bench_impl_t;

static const char *const bench_impl_name[IMPL_COUNT] = {
    [IMPL_KVPAGE] = "kvpage",
    [IMPL_KVPAGE_ID] = "kvpage-id",
    [IMPL_KVPAGE_NOTCACHE] = "kvpage-notcache",
    [IMPL_JEMALLOC] = "jemalloc",
    [IMPL_GLIBC] = "glibc",
    [IMPL_FLOOR] = "lifo-floor",
};

#define FLOOR_PAGES 32u

/* IMPL_FLOOR's per-thread cache (see the file comment). */
typedef struct floor_cache {
    _Atomic uint32_t n;                 /* indices held              */
    uint32_t ids[FLOOR_PAGES];          /* page indices, top = n - 1 */
    _Atomic uint32_t refs[FLOOR_PAGES]; /* per page: 0 free, 1 held  */
} floor_cache_t;

static _Thread_local floor_cache_t floor_tc;

/* ns per pair for one thread, or one repetition (slowest thread). */
typedef struct bench_time {
    double wall;
    double cpu;
} bench_time_t;

typedef struct bench_job {
    bench_impl_t impl;
    uint32_t bytes;          /* block size                          */
    uint64_t pairs;          /* pairs for this thread               */
    kv_alloc_pool_t *pool;   /* kvpage impls                        */
    unsigned char *block;    /* lifo-floor: [FLOOR_PAGES][bytes]    */
    pthread_barrier_t *start;
    unsigned sink;           /* defeats dead-code elimination       */
    bench_time_t t;          /* this thread's ns per pair           */
    int err;
} bench_job_t;

static double bench_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* One function per impl, each 64-byte aligned (BENCH_LOOP): at a few ns per
 * pair the code layout of a loop can move its time by 10%, so no impl's loop
 * may shift because another impl's code changed. */
#define BENCH_LOOP __attribute__((noinline, aligned(64)))

/* kvpage pairs: the page and its address from kv_alloc_page_mem, or (by_id)
 * from kv_alloc_page and then kv_alloc_page_ptr. */
static inline __attribute__((always_inline)) unsigned
bench_kvpage_pairs(bench_job_t *j, int by_id)
{
    unsigned sink = 0;
    kv_alloc_pool_t *pool = j->pool;
    for (uint64_t i = 0, n = j->pairs; i < n; i++) {
        kv_page_id_t id;
        void *m = NULL;
        int rc = by_id ? kv_alloc_page(pool, &id) : kv_alloc_page_mem(pool, &id, &m);
        if (rc != 0) {
            j->err = 1;
            break;
        }
        volatile unsigned char *p = by_id ? kv_alloc_page_ptr(pool, id) : m;
        p[0] = (unsigned char)i;
        sink += p[0];
        kv_alloc_release(pool, id);
    }
    return sink;
}

BENCH_LOOP static unsigned bench_loop_kvpage(bench_job_t *j)
{
    return bench_kvpage_pairs(j, 0);
}

BENCH_LOOP static unsigned bench_loop_kvpage_id(bench_job_t *j)
{
    return bench_kvpage_pairs(j, 1);
}

BENCH_LOOP static unsigned bench_loop_jemalloc(bench_job_t *j)
{
    unsigned sink = 0;
    const size_t bytes = j->bytes;
    for (uint64_t i = 0, n = j->pairs; i < n; i++) {
        volatile unsigned char *p = mallocx(bytes, 0);
        p[0] = (unsigned char)i;
        sink += p[0];
        sdallocx((void *)p, bytes, 0);
    }
    return sink;
}

BENCH_LOOP static unsigned bench_loop_glibc(bench_job_t *j)
{
    unsigned sink = 0;
    const size_t bytes = j->bytes;
    for (uint64_t i = 0, n = j->pairs; i < n; i++) {
        volatile unsigned char *p = __libc_malloc(bytes);
        p[0] = (unsigned char)i;
        sink += p[0];
        __libc_free((void *)p);
    }
    return sink;
}

BENCH_LOOP static unsigned bench_loop_floor(bench_job_t *j)
{
    unsigned sink = 0;
    const size_t bytes = j->bytes;
    floor_cache_t *c = &floor_tc;
    for (uint32_t k = 0; k < FLOOR_PAGES; k++)
        c->ids[k] = k;
    atomic_store_explicit(&c->n, FLOOR_PAGES, memory_order_relaxed);
    for (uint64_t i = 0, n = j->pairs; i < n; i++) {
        uint32_t m = atomic_load_explicit(&c->n, memory_order_relaxed);
        if (m == 0) {
            j->err = 1;
            break;
        }
        uint32_t idx = c->ids[m - 1];
        atomic_store_explicit(&c->refs[idx], 1, memory_order_relaxed);
        atomic_store_explicit(&c->n, m - 1, memory_order_relaxed);
        volatile unsigned char *p = j->block + (size_t)idx * bytes;
        p[0] = (unsigned char)i;
        sink += p[0];
        m = atomic_load_explicit(&c->n, memory_order_relaxed);
        if (atomic_load_explicit(&c->refs[idx], memory_order_relaxed) != 1 ||
            m >= FLOOR_PAGES) {
            j->err = 1;
            break;
        }
        atomic_store_explicit(&c->refs[idx], 0, memory_order_relaxed);
        c->ids[m] = idx;
        atomic_store_explicit(&c->n, m + 1, memory_order_relaxed);
    }
    return sink;
}

static void bench_loop(bench_job_t *j)
{
    switch (j->impl) {
    case IMPL_KVPAGE:
    case IMPL_KVPAGE_NOTCACHE: j->sink = bench_loop_kvpage(j); break;
    case IMPL_KVPAGE_ID:       j->sink = bench_loop_kvpage_id(j); break;
    case IMPL_JEMALLOC:        j->sink = bench_loop_jemalloc(j); break;
    case IMPL_GLIBC:           j->sink = bench_loop_glibc(j); break;
    case IMPL_FLOOR:           j->sink = bench_loop_floor(j); break;
    default:                   j->err = 1;
    }
}

static void *bench_thread(void *arg)
{
    bench_job_t *j = arg;
    pthread_barrier_wait(j->start);
    double w0 = bench_clock(CLOCK_MONOTONIC);
    double c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
    bench_loop(j);
    j->t.cpu = (bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)j->pairs;
    j->t.wall = (bench_clock(CLOCK_MONOTONIC) - w0) / (double)j->pairs;
    return NULL;
}

/* One repetition; 0, or -1 on error (a failed pthread_create aborts the
 * whole benchmark: the barrier would never open). */
static int bench_rep(bench_impl_t impl, uint32_t bytes, uint32_t threads,
                     uint64_t pairs, kv_alloc_pool_t *pool, unsigned char *block,
                     bench_time_t *out)
{
    bench_job_t jobs[2];
    pthread_t th[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads + 1);
    for (uint32_t t = 0; t < threads; t++) {
        jobs[t] = (bench_job_t){ .impl = impl, .bytes = bytes, .pairs = pairs,
                                 .pool = pool, .start = &start };
        if (block)
            jobs[t].block = block + (size_t)t * FLOOR_PAGES * bytes;
        if (pthread_create(&th[t], NULL, bench_thread, &jobs[t]) != 0) {
            fprintf(stderr, "kvbench-alloc: pthread_create failed\n");
            exit(1);
        }
    }
    pthread_barrier_wait(&start);
    int err = 0;
    *out = (bench_time_t){ 0, 0 };
    for (uint32_t t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        err |= jobs[t].err;
        if (jobs[t].t.wall > out->wall)
            out->wall = jobs[t].t.wall;
        if (jobs[t].t.cpu > out->cpu)
            out->cpu = jobs[t].t.cpu;
    }
    pthread_barrier_destroy(&start);
    return err ? -1 : 0;
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], bench_cmp);
    return v[n / 2];
}

#define BENCH_MAX_REPS 31

typedef struct bench_row {
    bench_impl_t impl;
    uint32_t bytes, threads;
    double wall;     /* median */
    double wall_min; /* fastest repetition */
    double cpu;      /* median */
} bench_row_t;

static int bench_is_kvpage(bench_impl_t impl)
{
    return impl == IMPL_KVPAGE || impl == IMPL_KVPAGE_ID ||
           impl == IMPL_KVPAGE_NOTCACHE;
}

/* All impls at one (bytes, threads): rows[IMPL_COUNT]. */
static int bench_config(uint32_t bytes, uint32_t threads, int reps,
                        double target_ns, bench_row_t *rows)
{
    kv_alloc_pool_t *pools[IMPL_COUNT] = { 0 };
    /* lifo-floor's pages: FLOOR_PAGES per thread, 2 threads at most */
    unsigned char *block = aligned_alloc(4096, 2 * (size_t)FLOOR_PAGES * bytes);
    if (!block)
        return -1;
    uint64_t pairs[IMPL_COUNT];
    double wall[IMPL_COUNT][BENCH_MAX_REPS], cpu[IMPL_COUNT][BENCH_MAX_REPS];
    bench_time_t t;
    int rc = 0;
    for (int im = 0; im < IMPL_COUNT && rc == 0; im++) {
        if (bench_is_kvpage((bench_impl_t)im)) {
            kv_alloc_config_t cfg = {
                .page_bytes = bytes, .capacity = 1024, .tier = KV_TIER_HOST,
                .flags = im == IMPL_KVPAGE_NOTCACHE ? KV_ALLOC_NO_TCACHE : 0 };
            rc = kv_alloc_pool_create(&cfg, &pools[im]);
            if (rc)
                break;
        }
        /* warm-up, then calibrate on a second short run */
        rc = bench_rep((bench_impl_t)im, bytes, threads, 20000, pools[im], block, &t);
        if (rc == 0)
            rc = bench_rep((bench_impl_t)im, bytes, threads, 20000, pools[im], block, &t);
        if (rc == 0) {
            double p = target_ns / (t.wall > 0.1 ? t.wall : 0.1);
            pairs[im] = p < 1000 ? 1000 : p > 5e7 ? 50000000 : (uint64_t)p;
        }
    }
    for (int r = 0; r < reps && rc == 0; r++)
        for (int im = 0; im < IMPL_COUNT && rc == 0; im++) {
            rc = bench_rep((bench_impl_t)im, bytes, threads, pairs[im], pools[im], block, &t);
            wall[im][r] = t.wall;
            cpu[im][r] = t.cpu;
        }
    free(block);
    for (int im = 0; im < IMPL_COUNT; im++) {
        kv_alloc_pool_destroy(pools[im]);
        if (rc != 0)
            continue;
        rows[im] = (bench_row_t){ .impl = (bench_impl_t)im, .bytes = bytes,
                                  .threads = threads };
        rows[im].wall = bench_median(wall[im], reps);
        rows[im].wall_min = wall[im][0]; /* sorted by bench_median */
        rows[im].cpu = bench_median(cpu[im], reps);
    }
    return rc;
}

int main(int argc, char **argv)
{
    int json = 0, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else {
            fprintf(stderr, "usage: %s [--json] [--quick]\n", argv[0]);
            return 2;
        }
    }
    const double target_ns = quick ? 2e6 : 10e6; /* per repetition */
    const int reps = quick ? 5 : 21;
    const uint32_t sizes[] = { 4096, 65536 };
    const uint32_t nthreads[] = { 1, 2 };
    bench_row_t rows[2 * 2 * IMPL_COUNT];
    int n = 0;
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 2; t++) {
            if (bench_config(sizes[s], nthreads[t], reps, target_ns, rows + n) != 0) {
                fprintf(stderr, "kvbench-alloc: %u bytes %u threads failed\n",
                        sizes[s], nthreads[t]);
                return 1;
            }
            n += IMPL_COUNT;
        }
    if (json)
        printf("{\"bench\":\"alloc\",\"reps\":%d,\"ms_per_rep\":%.0f,\"results\":[",
               reps, target_ns / 1e6);
    else
        printf("%-16s %6s %7s %9s %9s %9s %11s %9s\n", "impl", "bytes", "threads",
               "ns/pair", "min", "cpu", "x jemalloc", "x je cpu");
    for (int i = 0; i < n; i++) {
        const bench_row_t *je = &rows[i - (int)rows[i].impl + IMPL_JEMALLOC];
        double ratio = je->wall / rows[i].wall, ratio_cpu = je->cpu / rows[i].cpu;
        if (json)
            printf("%s{\"impl\":\"%s\",\"bytes\":%u,\"threads\":%u,"
                   "\"ns_per_pair\":%.3f,\"ns_per_pair_min\":%.3f,"
                   "\"ns_per_pair_cpu\":%.3f,\"ratio_vs_jemalloc\":%.2f,"
                   "\"ratio_vs_jemalloc_cpu\":%.2f}",
                   i ? "," : "", bench_impl_name[rows[i].impl], rows[i].bytes,
                   rows[i].threads, rows[i].wall, rows[i].wall_min, rows[i].cpu,
                   ratio, ratio_cpu);
        else
            printf("%-16s %6u %7u %9.2f %9.2f %9.2f %11.2f %9.2f\n",
                   bench_impl_name[rows[i].impl], rows[i].bytes, rows[i].threads,
                   rows[i].wall, rows[i].wall_min, rows[i].cpu, ratio, ratio_cpu);
    }
    if (json)
        printf("]}\n");
    return 0;
}
