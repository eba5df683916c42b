/* SPDX-License-Identifier: MIT */
/*
 * kv_store_lru.c — recency of sequences, for the memory-pressure escalation
 * and the offload policy ("coldest sequences first").
 *
 * The store keeps a tick counter and, per sequence id, the tick of the
 * sequence's last use: create, fork, append and attention touch it
 * (kv_store_touch; a decode step appends, so it touches). Ticks come from one atomic counter, so
 * no two touches share a tick and the order of sequences by last use is a
 * total order; attention calls, which may run concurrently, touch with
 * relaxed atomics (recency is a hint, never a correctness condition).
 *
 * Ownership: last_use[max_seqs] belongs to the store (counted in meta_bytes).
 */
#include "store/kv_store_int.h"

#include "alloc/kv_mem.h"

int kv_store_lru_init(kv_store_t *s)
{
    s->last_use = kv_mem_calloc(s->cfg.max_seqs, sizeof *s->last_use);
    return s->last_use ? 0 : KV_ENOMEM;
}

void kv_store_lru_fini(kv_store_t *s)
{
    kv_mem_free(s->last_use, (size_t)s->cfg.max_seqs * sizeof *s->last_use);
    s->last_use = NULL;
}

size_t kv_store_lru_meta_bytes(const kv_store_t *s)
{
    return (size_t)s->cfg.max_seqs * sizeof *s->last_use;
}

void kv_store_touch(kv_store_t *s, kv_seq_id_t seq)
{
    if (seq >= s->cfg.max_seqs)
        return;
    uint64_t t = __atomic_add_fetch(&s->tick, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&s->last_use[seq], t, __ATOMIC_RELAXED);
}

int kv_store_lru_next(const kv_store_t *s, uint64_t after, kv_seq_id_t *seq,
                      uint64_t *tick)
{
    uint64_t best = UINT64_MAX;
    kv_seq_id_t best_id = 0;
    for (kv_seq_id_t id = 0; id < s->cfg.max_seqs; id++) {
        uint64_t t = __atomic_load_n(&s->last_use[id], __ATOMIC_RELAXED);
        if (t > after && t < best && kv_page_seq_live(s->pt, id)) {
            best = t;
            best_id = id;
        }
    }
    if (best == UINT64_MAX)
        return KV_ENOENT;
    *seq = best_id;
    *tick = best;
    return 0;
}
