/*
 * kv_model_pool.c — worker threads for the engine (see kv_model_pool.h).
 *
 * Invariants (under mu): pool->job is the open job or NULL; a job lives on
 * its caller's stack and its caller returns only after closing it (job =
 * NULL) and seeing job->inside == 0, so no helper touches a finished job;
 * a helper enters each generation at most once, and only if its index is
 * below the job's max_threads - 1. Writes made by units happen-before the
 * caller's return through mu.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "kv_model_pool.h"

typedef struct pool_job {
    kv_model_unit_fn fn;
    void *arg;
    size_t n_units;
    _Atomic size_t next;  /* next unit to claim                  */
    uint32_t helpers;     /* helpers allowed in (max_threads - 1) */
    uint32_t inside;      /* helpers working on it (under mu)     */
} pool_job_t;

typedef struct pool_helper {
    kv_model_pool_t *pool;
    uint32_t index;       /* 0 .. n_helpers - 1 */
    pthread_t thread;
} pool_helper_t;

struct kv_model_pool {
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job was posted, or stop          */
    pthread_cond_t done;  /* a job's inside dropped to 0        */
    pool_job_t *job;      /* the open job or NULL               */
    uint64_t gen;         /* jobs posted so far                 */
    int stop;
    uint32_t n_helpers;
    pool_helper_t *helpers;  /* [n_helpers]                     */
};

static void drain(pool_job_t *j)
{
    for (;;) {
        size_t u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (u >= j->n_units)
            return;
        j->fn(j->arg, u);
    }
}

static void *helper_main(void *p)
{
    pool_helper_t *h = p;
    kv_model_pool_t *pool = h->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop &&
               (!pool->job || pool->gen == seen || h->index >= pool->job->helpers))
            pthread_cond_wait(&pool->work, &pool->mu);
        if (pool->stop)
            break;
        pool_job_t *j = pool->job;
        seen = pool->gen;
        j->inside++;
        pthread_mutex_unlock(&pool->mu);
        drain(j);
        pthread_mutex_lock(&pool->mu);
        if (--j->inside == 0)
            pthread_cond_broadcast(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

int kv_model_pool_create(uint32_t n_threads, kv_model_pool_t **out)
{
    if (!out)
        return KV_EINVAL;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1u : n > KV_MODEL_POOL_MAX ? KV_MODEL_POOL_MAX : (uint32_t)n;
    }
    if (n_threads > KV_MODEL_POOL_MAX)
        return KV_ERANGE;
    kv_model_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return KV_ENOMEM;
    p->helpers = calloc(n_threads, sizeof *p->helpers);
    if (!p->helpers) {
        free(p);
        return KV_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    int rc = 0;
    for (uint32_t i = 0; i + 1 < n_threads; i++) {
        p->helpers[i] = (pool_helper_t){.pool = p, .index = i};
        int e = pthread_create(&p->helpers[i].thread, NULL, helper_main, &p->helpers[i]);
        if (e) {
            rc = -e;
            break;
        }
        p->n_helpers++;
    }
    if (rc) {
        kv_model_pool_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void kv_model_pool_destroy(kv_model_pool_t *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    for (uint32_t i = 0; i < pool->n_helpers; i++)
        pthread_join(pool->helpers[i].thread, NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->work);
    pthread_mutex_destroy(&pool->mu);
    free(pool->helpers);
    free(pool);
}

uint32_t kv_model_pool_threads(const kv_model_pool_t *pool)
{
    return pool ? pool->n_helpers + 1 : 1;
}

void kv_model_pool_run(kv_model_pool_t *pool, uint32_t max_threads, size_t n_units,
                       kv_model_unit_fn fn, void *arg)
{
    pool_job_t j = {.fn = fn, .arg = arg, .n_units = n_units};
    atomic_init(&j.next, 0);
    uint32_t helpers = pool ? pool->n_helpers : 0;
    if (max_threads && max_threads - 1 < helpers)
        helpers = max_threads - 1;
    if (n_units < 2 || !helpers) {
        drain(&j);
        return;
    }
    j.helpers = helpers;
    pthread_mutex_lock(&pool->mu);
    if (pool->job) { /* another caller's job is open: do ours alone */
        pthread_mutex_unlock(&pool->mu);
        drain(&j);
        return;
    }
    pool->job = &j;
    pool->gen++;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    drain(&j);
    pthread_mutex_lock(&pool->mu);
    pool->job = NULL; /* closed: late helpers stay out */
    while (j.inside)
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}
