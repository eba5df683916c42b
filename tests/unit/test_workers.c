/* SPDX-License-Identifier: MIT */
/*
 * test_workers.c — the worker threads (kv_workers_*, kvpage.h) that the
 * CPU attention backend and the reference model run on.
 *
 * Checks: create errors (out NULL: KV_EINVAL; more than 1024 threads:
 * KV_ERANGE) and sizes (n_threads 0 = online CPUs, 1 = the caller alone,
 * NULL workers = 1); every unit of a job runs exactly once and its writes are
 * visible when run returns, for 0, 1, 2, 7 and 1000 units and every
 * max_workers from 0 (all) to past the workers size; worker indices stay below
 * min(max_workers, workers size), no two units run on one worker at once, and
 * max_workers 1 or a NULL workers runs everything as worker 0; helpers do join
 * (some unit ran on a worker other than 0, with units that sleep so the
 * caller yields its CPU); fn NULL is KV_EINVAL when there are units and
 * nothing runs; four threads running jobs on one workers at once each get all
 * their units done exactly once; an injected allocation failure in create
 * returns KV_ENOMEM and leaks nothing, and create + destroy leaves the
 * metadata memory as it was.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kv_test.h"

#define MAX_UNITS 1000
#define MAX_WORKERS 16

typedef struct job {
    _Atomic uint32_t runs[MAX_UNITS]; /* times each unit ran             */
    _Atomic int busy[MAX_WORKERS];    /* 1 while a unit runs on worker  */
    uint64_t out[MAX_UNITS];          /* written by unit u (plain)      */
    _Atomic uint32_t top_worker;      /* highest worker index seen      */
    _Atomic int overlap;              /* a worker ran two units at once */
    _Atomic int bad_worker;           /* index >= MAX_WORKERS           */
    unsigned sleep_us;                /* per unit                       */
} job_t;

static void unit(void *arg, size_t u, uint32_t worker)
{
    job_t *j = arg;
    if (worker >= MAX_WORKERS) {
        atomic_store(&j->bad_worker, 1);
        return;
    }
    if (atomic_exchange(&j->busy[worker], 1))
        atomic_store(&j->overlap, 1);
    uint32_t top = atomic_load(&j->top_worker);
    while (worker > top && !atomic_compare_exchange_weak(&j->top_worker, &top, worker))
        ;
    if (j->sleep_us)
        usleep(j->sleep_us);
    j->out[u] = (uint64_t)u * u + 1;
    atomic_fetch_add(&j->runs[u], 1);
    atomic_store(&j->busy[worker], 0);
}

static void job_reset(job_t *j, unsigned sleep_us)
{
    memset(j, 0, sizeof *j);
    j->sleep_us = sleep_us;
}

/* 1 if units [0, n) each ran once and wrote their value, and nothing else ran. */
static int all_once(job_t *j, size_t n)
{
    for (size_t u = 0; u < MAX_UNITS; u++) {
        uint32_t want = u < n;
        if (atomic_load(&j->runs[u]) != want || j->out[u] != (want ? (uint64_t)u * u + 1 : 0))
            return 0;
    }
    return !atomic_load(&j->overlap) && !atomic_load(&j->bad_worker);
}

static void test_create(void)
{
    kv_workers_t *p = NULL;
    CHECK_EQ(kv_workers_create(2, NULL), KV_EINVAL);
    CHECK_EQ(kv_workers_create(1025, &p), KV_ERANGE);
    CHECK(p == NULL);
    CHECK_EQ(kv_workers_size(NULL), 1);
    CHECK_OK(kv_workers_create(1, &p));
    CHECK_EQ(kv_workers_size(p), 1);
    kv_workers_destroy(p);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK_OK(kv_workers_create(0, &p));
    CHECK_EQ(kv_workers_size(p), cpus < 1 ? 1 : cpus > 1024 ? 1024 : cpus);
    kv_workers_destroy(p);
    kv_workers_destroy(NULL);
}

static void test_units(void)
{
    static job_t j;
    kv_workers_t *p = NULL;
    CHECK_OK(kv_workers_create(4, &p));
    CHECK_EQ(kv_workers_size(p), 4);
    const size_t counts[] = {0, 1, 2, 7, MAX_UNITS};
    int ok = 1, below = 1;
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (uint32_t mw = 0; mw <= 6; mw++)
            for (int rep = 0; rep < 20; rep++) {
                job_reset(&j, 0);
                CHECK_OK(kv_workers_run(p, mw, counts[c], unit, &j));
                ok &= all_once(&j, counts[c]);
                uint32_t limit = mw && mw < 4 ? mw : 4;
                below &= atomic_load(&j.top_worker) < limit;
            }
    CHECK(ok);
    CHECK(below);
    /* Caller alone: max_workers 1, or no workers. */
    job_reset(&j, 20);
    CHECK_OK(kv_workers_run(p, 1, 50, unit, &j));
    CHECK(all_once(&j, 50));
    CHECK_EQ(atomic_load(&j.top_worker), 0);
    job_reset(&j, 0);
    CHECK_OK(kv_workers_run(NULL, 0, MAX_UNITS, unit, &j));
    CHECK(all_once(&j, MAX_UNITS));
    CHECK_EQ(atomic_load(&j.top_worker), 0);
    /* Helpers join: units sleep, so the caller leaves its CPU to them. */
    int joined = 0, limited = 1;
    for (int rep = 0; rep < 20 && !joined; rep++) {
        job_reset(&j, 200);
        CHECK_OK(kv_workers_run(p, 0, 100, unit, &j));
        joined = all_once(&j, 100) && atomic_load(&j.top_worker) > 0;
        job_reset(&j, 200);
        CHECK_OK(kv_workers_run(p, 2, 100, unit, &j));
        limited &= all_once(&j, 100) && atomic_load(&j.top_worker) <= 1;
    }
    CHECK(joined);
    CHECK(limited);
    /* fn NULL: an error when there is work, nothing otherwise. */
    CHECK_EQ(kv_workers_run(p, 0, 3, NULL, &j), KV_EINVAL);
    CHECK_OK(kv_workers_run(p, 0, 0, NULL, &j));
    kv_workers_destroy(p);
}

typedef struct caller {
    kv_workers_t *workers;
    job_t job;
    int ok;
} caller_t;

static void *caller_main(void *arg)
{
    caller_t *c = arg;
    c->ok = 1;
    for (int rep = 0; rep < 200; rep++) {
        size_t n = 1 + (size_t)(rep * 37) % MAX_UNITS;
        job_reset(&c->job, rep % 10 == 0 ? 5 : 0);
        c->ok &= kv_workers_run(c->workers, 0, n, unit, &c->job) == 0 &&
                 all_once(&c->job, n);
    }
    return NULL;
}

/* Several callers on one workers: one job is shared at a time, the others run
 * on their callers; every job completes exactly. */
static void test_concurrent(void)
{
    enum { NC = 4 };
    static caller_t c[NC];
    kv_workers_t *p = NULL;
    CHECK_OK(kv_workers_create(3, &p));
    pthread_t th[NC];
    int started[NC];
    for (int i = 0; i < NC; i++) {
        c[i].workers = p;
        started[i] = pthread_create(&th[i], NULL, caller_main, &c[i]) == 0;
        CHECK(started[i]);
    }
    for (int i = 0; i < NC; i++)
        if (started[i]) {
            pthread_join(th[i], NULL);
            CHECK(c[i].ok);
        }
    kv_workers_destroy(p);
}

static void test_faults(void)
{
    uint64_t live = kv_mem_live_bytes();
    for (uint64_t n = 1; n <= 2; n++) {
        kv_workers_t *p = NULL;
        kv_fault_arm(n);
        CHECK_EQ(kv_workers_create(3, &p), KV_ENOMEM);
        CHECK(kv_fault_fired());
        kv_fault_arm(0);
        CHECK(p == NULL);
        CHECK_EQ(kv_mem_live_bytes(), live);
    }
    kv_workers_t *p = NULL;
    CHECK_OK(kv_workers_create(3, &p));
    CHECK(kv_mem_live_bytes() > live);
    kv_workers_destroy(p);
    CHECK_EQ(kv_mem_live_bytes(), live);
}

int main(void)
{
    test_create();
    test_units();
    test_concurrent();
    test_faults();
    return kv_test_end();
}
