/* SPDX-License-Identifier: MIT */
/*
 * kv_store_offload_balance.c — kv_store_offload_balance: the watermarks.
 *
 * Writes already in flight when it is called (an earlier kv_seq_offload)
 * are waited for first, so that the pages it returns, and its KV_EIO, are
 * about its own writes only. Pool pages in use (less those whose page-out
 * is still in flight after that: a file error) above offload_high per
 * mille of host_pages starts a run: whole sequences, least recently used
 * first (kv_store_lru_next), are written until the pages in use would be
 * at most offload_low per mille; then the run waits for its writes, so
 * their pool pages are free when it returns. A sequence with nothing
 * eligible (all shared, MERGED or already on the file) is skipped. Pages
 * still referenced elsewhere do not count as freed: only refcount-1 pages
 * are written.
 *
 * Not all-or-nothing (kvpage.h): the first failure ends the run; what was
 * written stays written.
 */
#include <limits.h>

#include "kv_store_int.h"

int kv_store_offload_balance(kv_store_t *s)
{
    int rc = kv_store_off_enter(s, NULL);
    if (rc)
        return rc;
    kv_store_off_t *o = s->off;
    int wrc0 = kv_store_off_settle(s, KV_STORE_OFF_ALL, 1, 1); /* not this run's */
    kv_alloc_stats_t as;
    kv_alloc_stats(s->pool, &as);
    uint64_t writing = 0;
    for (const kv_store_off_batch_t *b = o->batches; b; b = b->next)
        writing += b->write ? b->n : 0;
    uint64_t used = as.used > writing ? as.used - writing : 0;
    uint64_t high = as.capacity * s->cfg.offload_high / 1000;
    uint64_t low = as.capacity * s->cfg.offload_low / 1000;
    uint64_t started = 0, out0 = o->pages_out;
    if (used > high) {
        uint64_t tick = 0;
        kv_seq_id_t seq;
        while (used - started > low && kv_store_lru_next(s, tick, &seq, &tick) == 0) {
            uint32_t n;
            rc = kv_store_off_write_seq(s, seq, &n);
            if (rc)
                break;
            started += n;
        }
    }
    /* wait for this run's writes (and any older ones) */
    int wrc = kv_store_off_settle(s, KV_STORE_OFF_ALL, 1, 1);
    uint64_t written = o->pages_out - out0;
    pthread_mutex_unlock(&o->lock);
    if (written)
        return written > INT_MAX ? INT_MAX : (int)written;
    if (rc || wrc || wrc0)
        return rc ? rc : wrc ? wrc : wrc0;
    return started ? KV_EIO : 0; /* every write failed: kv_seq_wait says why */
}
