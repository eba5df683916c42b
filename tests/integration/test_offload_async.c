/* SPDX-License-Identifier: MIT */
/*
 * test_offload_async.c — asynchronous page-in while other work runs.
 *
 * Checks, for every I/O queue: (1) a prefetch submitted by one thread and
 * driven by kv_offload_poll while a second thread computes an "attention"
 * reduction: the batch is still running after submit (poll says 1), then
 * completes with every page byte-exact, and the computation's result equals
 * the one computed alone; (2) the prefetch running in its own thread
 * (submit + wait) while the main thread computes; (3) several batches in
 * flight at once (writes and reads mixed), waited in another order than
 * submitted; (4) io_uring only: a completion queue far smaller than the
 * I/Os in flight overflows (counted) and every page still arrives intact.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "alloc/kv_mem.h"
#include "test_offload_util.h"

enum { PB = 4096, N = 1024 };

static uint8_t *g_out;           /* [N][PB] */
static uint8_t g_scratch[PB];
static float *g_x;               /* attention stand-in inputs */
enum { XN = 1 << 20 };

typedef struct pgd {
    uint64_t key, gen;
    kv_offload_slot_t slot;
} pgd_t;

/* A deterministic CPU-bound reduction (a stand-in for attention). */
static double compute(void)
{
    double acc = 0;
    for (int rep = 0; rep < 6; rep++)
        for (int i = 0; i < XN; i++)
            acc += (double)g_x[i] * g_x[(i * 7 + rep) & (XN - 1)];
    return acc;
}

static void *compute_thread(void *arg)
{
    *(double *)arg = compute();
    return NULL;
}

/* Write N pages, then free every other one, so reads are scattered. */
static void setup(kv_offload_file_t *f, pgd_t *keep)
{
    static uint8_t data[64][PB];
    static pgd_t all[N];
    for (uint32_t i = 0; i < N; i += 64) {
        kv_offload_wpage_t w[64];
        kv_offload_slot_t s[64];
        for (uint32_t j = 0; j < 64; j++) {
            all[i + j].key = 10 * (i + j);
            all[i + j].gen = 3;
            kvt_fill(data[j], PB, all[i + j].key, 3);
            w[j] = (kv_offload_wpage_t){.key = all[i + j].key, .generation = 3,
                                        .data = data[j], .bytes = PB};
        }
        CHECK_OK(kv_offload_write(f, w, 64, s, NULL));
        for (uint32_t j = 0; j < 64; j++)
            all[i + j].slot = s[j];
    }
    for (uint32_t i = 0; i < N / 2; i++) {
        CHECK_OK(kv_offload_free(f, &all[2 * i].slot, 1));
        keep[i] = all[2 * i + 1];
    }
}

static void make_reqs(const pgd_t *p, uint32_t n, kv_offload_rpage_t *q)
{
    for (uint32_t i = 0; i < n; i++)
        q[i] = (kv_offload_rpage_t){.slot = p[i].slot, .key = p[i].key,
                                    .generation = p[i].gen, .data = g_out + (size_t)i * PB};
}

static long count_bad(const pgd_t *p, uint32_t n, const int *status)
{
    long bad = 0;
    for (uint32_t i = 0; i < n; i++)
        bad += status[i] != 0 ||
               !kvt_same(g_out + (size_t)i * PB, PB, p[i].key, p[i].gen, g_scratch);
    return bad;
}

typedef struct prefetch_arg {
    kv_offload_file_t *f;
    const kv_offload_rpage_t *q;
    uint32_t n;
    int *status;
    int result;
} prefetch_arg_t;

static void *prefetch_thread(void *arg)
{
    prefetch_arg_t *a = arg;
    kv_offload_ticket_t t;
    a->result = kv_offload_read_submit(a->f, a->q, a->n, a->status, &t);
    if (a->result == 0)
        a->result = kv_offload_wait(a->f, t);
    return NULL;
}

static void run(const kvt_dir_t *dir, uint32_t ioq, double ref)
{
    char path[4096];
    kvt_path(dir, "as.kvp", path);
    kv_offload_config_t c = kv_offload_config_default();
    c.page_bytes = PB;
    c.capacity = N + 64;
    c.ioq = ioq;
    c.queue_depth = 8;
    kv_offload_file_t *f;
    CHECK_OK(kv_offload_create(path, &c, &f));
    static pgd_t keep[N / 2];
    setup(f, keep);
    static kv_offload_rpage_t q[N / 2];
    static int status[N / 2];
    make_reqs(keep, N / 2, q);

    /* (1) submit, compute in another thread, poll meanwhile */
    memset(g_out, 0, (size_t)N / 2 * PB);
    kv_offload_ticket_t t;
    CHECK_OK(kv_offload_read_submit(f, q, N / 2, status, &t));
    double got = 0;
    pthread_t th;
    pthread_create(&th, NULL, compute_thread, &got);
    int r, polls = 0, pending = 0;
    while ((r = kv_offload_poll(f, t)) == 1) {
        pending = 1;
        polls++;
    }
    pthread_join(th, NULL);
    CHECK_EQ(r, 0);
    CHECK(pending); /* 512 scattered pages, 8 in flight: not done at submit */
    CHECK(got == ref);
    CHECK_EQ(count_bad(keep, N / 2, status), 0);
    CHECK_EQ(kv_offload_poll(f, t), KV_ENOENT);

    /* (2) the prefetch in its own thread, compute here */
    memset(g_out, 0, (size_t)N / 2 * PB);
    prefetch_arg_t pa = {.f = f, .q = q, .n = N / 2, .status = status, .result = -1};
    pthread_create(&th, NULL, prefetch_thread, &pa);
    got = compute();
    pthread_join(th, NULL);
    CHECK_OK(pa.result);
    CHECK(got == ref);
    CHECK_EQ(count_bad(keep, N / 2, status), 0);

    /* (3) batches in flight together, waited out of order */
    static uint8_t wdata[32][PB];
    kv_offload_wpage_t w[32];
    kv_offload_slot_t ws[32];
    int wst[32];
    for (int i = 0; i < 32; i++) {
        kvt_fill(wdata[i], PB, 777000 + (uint64_t)i, 1);
        w[i] = (kv_offload_wpage_t){.key = 777000 + (uint64_t)i, .generation = 1,
                                    .data = wdata[i], .bytes = PB};
    }
    memset(g_out, 0, (size_t)N / 2 * PB);
    kv_offload_ticket_t t1, t2, t3;
    CHECK_OK(kv_offload_read_submit(f, q, 100, status, &t1));
    CHECK_OK(kv_offload_write_submit(f, w, 32, ws, wst, &t2));
    CHECK_OK(kv_offload_read_submit(f, q + 100, N / 2 - 100, status + 100, &t3));
    CHECK_OK(kv_offload_wait(f, t3));
    CHECK_OK(kv_offload_wait(f, t2));
    CHECK_OK(kv_offload_wait(f, t1));
    CHECK_EQ(count_bad(keep, N / 2, status), 0);
    pgd_t wp[32];
    kv_offload_rpage_t wq[32];
    for (int i = 0; i < 32; i++) {
        CHECK_EQ(wst[i], 0);
        wp[i] = (pgd_t){.key = w[i].key, .gen = 1, .slot = ws[i]};
    }
    make_reqs(wp, 32, wq);
    CHECK_OK(kv_offload_read(f, wq, 32, status));
    CHECK_EQ(count_bad(wp, 32, status), 0);
    CHECK(kvt_idle(f));
    CHECK_OK(kv_offload_close(f));
    CHECK_OK(kv_offload_unlink(path));

    /* (4) io_uring: 64 I/Os in flight over a CQ of 8 entries */
    if (ioq != KV_OFFLOAD_IOQ_URING)
        return;
    c.queue_depth = 64;
    c.ring_entries = 4; /* SQ 4, CQ 8 */
    CHECK_OK(kv_offload_create(path, &c, &f));
    setup(f, keep);
    make_reqs(keep, N / 2, q);
    memset(g_out, 0, (size_t)N / 2 * PB);
    CHECK_OK(kv_offload_read_submit(f, q, N / 2, status, &t));
    kv_offload_stats_t st;
    for (int rounds = 0; rounds < 4; rounds++) {
        struct timespec ts = {0, 20 * 1000 * 1000}; /* let all 64 complete */
        nanosleep(&ts, NULL);
        kv_offload_poll(f, t); /* ticket spent if this finished it */
    }
    kv_offload_poll(f, t);
    kv_offload_wait(f, t);
    kv_offload_stats(f, &st);
    CHECK(st.cq_overflows > 0);
    CHECK_EQ(st.ios_peak, 64);
    CHECK_EQ(st.pages_read, N / 2);
    CHECK_EQ(count_bad(keep, N / 2, status), 0);
    CHECK(kvt_idle(f));
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
    g_out = malloc((size_t)N * PB);
    g_x = malloc(XN * sizeof *g_x);
    uint64_t s = 5;
    for (int i = 0; i < XN; i++)
        g_x[i] = kv_test_randf(&s);
    double ref = compute();
    for (int e = 0; e < ne; e++)
        run(&dir, ioqs[e], ref);
    free(g_out);
    free(g_x);
    kvt_dir_remove(&dir);
    CHECK_EQ(kv_mem_live_bytes(), live0);
    return kv_test_end();
}
