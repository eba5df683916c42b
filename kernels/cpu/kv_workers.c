/* SPDX-License-Identifier: MIT */
/*
 * kv_workers.c — worker threads (kv_workers_*, public: kvpage.h): the CPU
 * backend's attention calls and the reference model's matmuls and row loops
 * run on them. ("Pool" in kvpage always means a pool of pages.)
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
 * One job at a time per set of workers: a call made while another call's
 * job is open (concurrent attention calls on one store, model sessions
 * sharing the model's workers) runs entirely on its caller.
 * Invariants (under mu): ws->job is the open job or NULL; job->inside
 * counts the helpers between entering and leaving that job, and its caller
 * returns (its job leaves the stack) only once it is 0 after the close; a
 * helper enters each generation at most once, and only if its worker index
 * is at most job->helpers. Units' writes happen-before the caller's return
 * through mu. The struct and its helper records are kv_mem blocks it owns.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kv_cpu.h"

#define KV_WORKERS_MAX 1024u /* workers, the caller included */

typedef struct kv_workers_job {
    kv_workers_fn fn;
    void *arg;
    size_t n_units;
    _Atomic size_t next; /* next unit to claim                 */
    uint32_t helpers;    /* workers 1 .. helpers may join      */
    uint32_t inside;     /* helpers working on it (under mu)   */
} kv_workers_job_t;

typedef struct kv_workers_helper {
    kv_workers_t *ws;
    uint32_t worker; /* 1 .. n_helpers */
    pthread_t thread;
} kv_workers_helper_t;

struct kv_workers {
    pthread_mutex_t mu;
    pthread_cond_t wake;        /* helpers: a job opened, or stop   */
    pthread_cond_t idle;        /* callers: a job's inside hit 0    */
    kv_workers_job_t *job;      /* open job or NULL                 */
    uint64_t gen;               /* generation of the last open job  */
    int stop;
    uint32_t n_helpers;
    kv_workers_helper_t *helpers; /* [n_helpers] */
};

static void work(kv_workers_job_t *job, uint32_t worker)
{
    size_t u;
    while ((u = atomic_fetch_add_explicit(&job->next, 1,
                                          memory_order_relaxed)) <
           job->n_units)
        job->fn(job->arg, u, worker);
}

static void *helper_main(void *p)
{
    kv_workers_helper_t *h = p;
    kv_workers_t *ws = h->ws;
    pthread_mutex_lock(&ws->mu);
    uint64_t seen = ws->gen;
    for (;;) {
        while (!ws->stop && (!ws->job || ws->gen == seen ||
                               h->worker > ws->job->helpers))
            pthread_cond_wait(&ws->wake, &ws->mu);
        if (ws->stop)
            break;
        kv_workers_job_t *job = ws->job;
        seen = ws->gen;
        job->inside++;
        pthread_mutex_unlock(&ws->mu);
        work(job, h->worker);
        pthread_mutex_lock(&ws->mu);
        if (--job->inside == 0) /* last touch of job: its caller may go */
            pthread_cond_broadcast(&ws->idle);
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

static void workers_stop(kv_workers_t *ws, uint32_t started)
{
    pthread_mutex_lock(&ws->mu);
    ws->stop = 1;
    pthread_cond_broadcast(&ws->wake);
    pthread_mutex_unlock(&ws->mu);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(ws->helpers[i].thread, NULL);
}

/* made: how many of mu, wake, idle (in that order) were initialized. */
static void workers_free(kv_workers_t *ws, int made)
{
    if (made > 2)
        pthread_cond_destroy(&ws->idle);
    if (made > 1)
        pthread_cond_destroy(&ws->wake);
    if (made > 0)
        pthread_mutex_destroy(&ws->mu);
    kv_mem_free(ws->helpers, ws->n_helpers * sizeof *ws->helpers);
    kv_mem_free(ws, sizeof *ws);
}

int kv_workers_create(uint32_t n_threads, kv_workers_t **out)
{
    if (!out)
        return KV_EINVAL;
    if (n_threads > KV_WORKERS_MAX)
        return KV_ERANGE;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1u : n > KV_WORKERS_MAX ? KV_WORKERS_MAX : (uint32_t)n;
    }
    kv_workers_t *ws = kv_mem_calloc(1, sizeof *ws);
    if (!ws)
        return KV_ENOMEM;
    ws->n_helpers = n_threads - 1;
    if (ws->n_helpers &&
        !(ws->helpers = kv_mem_calloc(ws->n_helpers, sizeof *ws->helpers))) {
        workers_free(ws, 0);
        return KV_ENOMEM;
    }
    int made = !pthread_mutex_init(&ws->mu, NULL);
    made += made == 1 && !pthread_cond_init(&ws->wake, NULL);
    made += made == 2 && !pthread_cond_init(&ws->idle, NULL);
    if (made < 3) {
        workers_free(ws, made);
        return KV_ENOMEM;
    }
    for (uint32_t i = 0; i < ws->n_helpers; i++) {
        ws->helpers[i].ws = ws;
        ws->helpers[i].worker = i + 1;
        if (pthread_create(&ws->helpers[i].thread, NULL, helper_main,
                           &ws->helpers[i])) {
            workers_stop(ws, i);
            workers_free(ws, 3);
            return KV_ENOMEM;
        }
    }
    *out = ws;
    return 0;
}

void kv_workers_destroy(kv_workers_t *ws)
{
    if (!ws)
        return;
    workers_stop(ws, ws->n_helpers);
    workers_free(ws, 3);
}

uint32_t kv_workers_size(const kv_workers_t *ws)
{
    return ws ? ws->n_helpers + 1 : 1;
}

int kv_workers_run(kv_workers_t *ws, uint32_t max_workers, size_t n_units,
                   kv_workers_fn fn, void *arg)
{
    if (!fn)
        return n_units ? KV_EINVAL : 0;
    kv_workers_job_t job = {.fn = fn, .arg = arg, .n_units = n_units};
    atomic_init(&job.next, 0);
    job.helpers = ws ? ws->n_helpers : 0;
    if (max_workers && max_workers - 1 < job.helpers)
        job.helpers = max_workers - 1;
    int shared = 0;
    if (job.helpers && n_units > 1) {
        pthread_mutex_lock(&ws->mu);
        if (!ws->job) {
            ws->job = &job;
            ws->gen++;
            shared = 1;
            pthread_cond_broadcast(&ws->wake);
        }
        pthread_mutex_unlock(&ws->mu);
    }
    work(&job, 0);
    if (!shared)
        return 0;
    pthread_mutex_lock(&ws->mu);
    ws->job = NULL; /* closed: late helpers go back to sleep */
    while (job.inside)
        pthread_cond_wait(&ws->idle, &ws->mu);
    pthread_mutex_unlock(&ws->mu);
    return 0;
}
