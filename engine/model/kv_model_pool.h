/*
 * kv_model_pool.h — the engine's worker threads: a parallel-for over
 * independent units.
 *
 * A job is n units claimed one at a time from an atomic counter. The caller
 * always works on its own job; up to n_threads - 1 helper threads join it if
 * they get a CPU while units are left. The caller never waits for a helper
 * that has not started: when no unit is left it closes the job to newcomers
 * and waits only for the helpers inside it. On a machine with more runnable
 * threads than cores a call degrades to single-thread speed instead of
 * stalling at a barrier for a descheduled thread (what OpenMP's join does;
 * the engine used OpenMP first and spent most of its time there under load).
 * Idle helpers sleep on a condition variable (no spinning).
 *
 * Results never depend on which thread ran a unit: callers make each unit
 * write its own outputs. One job at a time per pool: a run() while another
 * caller's job is open runs entirely on its caller (correct, just slower).
 * Ownership: the pool owns its threads; destroy joins them.
 */
#ifndef KV_MODEL_POOL_H
#define KV_MODEL_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvpage/kvpage.h"

#define KV_MODEL_POOL_MAX 256 /* threads per pool, caller included */

typedef struct kv_model_pool kv_model_pool_t;
typedef void (*kv_model_unit_fn)(void *arg, size_t unit);

/* A pool of n_threads - 1 helpers (n_threads 0: one per online CPU).
 * Errors: KV_ERANGE (n_threads > KV_MODEL_POOL_MAX), KV_ENOMEM, -errno. */
int kv_model_pool_create(uint32_t n_threads, kv_model_pool_t **out);

/* Stops and joins the helpers. NULL is a no-op. */
void kv_model_pool_destroy(kv_model_pool_t *pool);

/* Threads of the pool, caller included (1 for NULL). */
uint32_t kv_model_pool_threads(const kv_model_pool_t *pool);

/* fn(arg, u) for every u < n_units, on the caller and at most
 * max_threads - 1 helpers (0: all). Returns when every unit is done.
 * pool NULL or max_threads 1: all on the caller. */
void kv_model_pool_run(kv_model_pool_t *pool, uint32_t max_threads, size_t n_units,
                       kv_model_unit_fn fn, void *arg);

#endif /* KV_MODEL_POOL_H */
