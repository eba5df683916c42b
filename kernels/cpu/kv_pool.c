/*
 * kv_pool.c — worker threads: the CPU backend's attention calls and the
 * reference model engine's matmuls and row loops (public: kvpage.h).
 *
 * A job is n independent units claimed one at a time from an atomic
 * counter. The calling thread always works on its own job (worker 0); up to
 * max_workers - 1 helper threads join it if they get a CPU while units are
 * left. The caller never waits for a helper that has not started: once it
 * finds no unit left it closes the job to newcomers and waits only for the
 * helpers inside it, each finishing the unit it holds. So on a machine with
 * more runnable threads than cores a call degrades to about single-thread
 * speed instead of waiting for a descheduled helper to reach a barrier, as
 * a fork-join team does (docs/results/benchmarks.md has what that cost).
 *
 * One job at a time per pool: a call made while another call's job is open
 * (concurrent attention calls on one store, engine sessions sharing the
 * model's pool) runs entirely on its caller.
 * Invariants (under mu): pool->job is the open job or NULL; job->inside
 * counts the helpers between entering and leaving that job, and its caller
 * returns (its job leaves the stack) only once it is 0 after the close; a
 * helper enters each generation at most once, and only if its worker index
 * is at most job->helpers. Units' writes happen-before the caller's return
 * through mu. The pool and its helper records are kv_mem blocks it owns.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kv_cpu.h"

#define KV_CPU_POOL_MAX 1024u /* workers per pool, the caller included */

typedef struct kv_cpu_job {
    kv_pool_unit_fn fn;
    void *arg;
    size_t n_units;
    _Atomic size_t next; /* next unit to claim                 */
    uint32_t helpers;    /* workers 1 .. helpers may join      */
    uint32_t inside;     /* helpers working on it (under mu)   */
} kv_cpu_job_t;

typedef struct kv_cpu_helper {
    kv_pool_t *pool;
    uint32_t worker; /* 1 .. n_helpers */
    pthread_t thread;
} kv_cpu_helper_t;

struct kv_pool {
    pthread_mutex_t mu;
    pthread_cond_t wake;        /* helpers: a job opened, or stop   */
    pthread_cond_t idle;        /* callers: a job's inside hit 0    */
    kv_cpu_job_t *job;     /* open job or NULL                 */
    uint64_t gen;               /* generation of the last open job  */
    int stop;
    uint32_t n_helpers;
    kv_cpu_helper_t *helpers; /* [n_helpers] */
};

static void work(kv_cpu_job_t *job, uint32_t worker)
{
    size_t u;
    while ((u = atomic_fetch_add_explicit(&job->next, 1,
                                          memory_order_relaxed)) <
           job->n_units)
        job->fn(job->arg, u, worker);
}

static void *helper_main(void *p)
{
    kv_cpu_helper_t *h = p;
    kv_pool_t *pool = h->pool;
    pthread_mutex_lock(&pool->mu);
    uint64_t seen = pool->gen;
    for (;;) {
        while (!pool->stop && (!pool->job || pool->gen == seen ||
                               h->worker > pool->job->helpers))
            pthread_cond_wait(&pool->wake, &pool->mu);
        if (pool->stop)
            break;
        kv_cpu_job_t *job = pool->job;
        seen = pool->gen;
        job->inside++;
        pthread_mutex_unlock(&pool->mu);
        work(job, h->worker);
        pthread_mutex_lock(&pool->mu);
        if (--job->inside == 0) /* last touch of job: its caller may go */
            pthread_cond_broadcast(&pool->idle);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void pool_stop(kv_pool_t *pool, uint32_t started)
{
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(pool->helpers[i].thread, NULL);
}

/* made: how many of mu, wake, idle (in that order) were initialized. */
static void pool_free(kv_pool_t *pool, int made)
{
    if (made > 2)
        pthread_cond_destroy(&pool->idle);
    if (made > 1)
        pthread_cond_destroy(&pool->wake);
    if (made > 0)
        pthread_mutex_destroy(&pool->mu);
    kv_mem_free(pool->helpers, pool->n_helpers * sizeof *pool->helpers);
    kv_mem_free(pool, sizeof *pool);
}

int kv_pool_create(uint32_t n_threads, kv_pool_t **out)
{
    if (!out)
        return KV_EINVAL;
    if (n_threads > KV_CPU_POOL_MAX)
        return KV_ERANGE;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1u : n > KV_CPU_POOL_MAX ? KV_CPU_POOL_MAX : (uint32_t)n;
    }
    kv_pool_t *pool = kv_mem_calloc(1, sizeof *pool);
    if (!pool)
        return KV_ENOMEM;
    pool->n_helpers = n_threads - 1;
    if (pool->n_helpers &&
        !(pool->helpers = kv_mem_calloc(pool->n_helpers, sizeof *pool->helpers))) {
        pool_free(pool, 0);
        return KV_ENOMEM;
    }
    int made = !pthread_mutex_init(&pool->mu, NULL);
    made += made == 1 && !pthread_cond_init(&pool->wake, NULL);
    made += made == 2 && !pthread_cond_init(&pool->idle, NULL);
    if (made < 3) {
        pool_free(pool, made);
        return KV_ENOMEM;
    }
    for (uint32_t i = 0; i < pool->n_helpers; i++) {
        pool->helpers[i].pool = pool;
        pool->helpers[i].worker = i + 1;
        if (pthread_create(&pool->helpers[i].thread, NULL, helper_main,
                           &pool->helpers[i])) {
            pool_stop(pool, i);
            pool_free(pool, 3);
            return KV_ENOMEM;
        }
    }
    *out = pool;
    return 0;
}

void kv_pool_destroy(kv_pool_t *pool)
{
    if (!pool)
        return;
    pool_stop(pool, pool->n_helpers);
    pool_free(pool, 3);
}

uint32_t kv_pool_size(const kv_pool_t *pool)
{
    return pool ? pool->n_helpers + 1 : 1;
}

int kv_pool_run(kv_pool_t *pool, uint32_t max_workers,
                         size_t n_units, kv_pool_unit_fn fn, void *arg)
{
    if (!fn)
        return n_units ? KV_EINVAL : 0;
    kv_cpu_job_t job = {.fn = fn, .arg = arg, .n_units = n_units};
    atomic_init(&job.next, 0);
    job.helpers = pool ? pool->n_helpers : 0;
    if (max_workers && max_workers - 1 < job.helpers)
        job.helpers = max_workers - 1;
    int shared = 0;
    if (job.helpers && n_units > 1) {
        pthread_mutex_lock(&pool->mu);
        if (!pool->job) {
            pool->job = &job;
            pool->gen++;
            shared = 1;
            pthread_cond_broadcast(&pool->wake);
        }
        pthread_mutex_unlock(&pool->mu);
    }
    work(&job, 0);
    if (!shared)
        return 0;
    pthread_mutex_lock(&pool->mu);
    pool->job = NULL; /* closed: late helpers go back to sleep */
    while (job.inside)
        pthread_cond_wait(&pool->idle, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    return 0;
}
