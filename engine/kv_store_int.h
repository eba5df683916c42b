/*
 * kv_store_int.h — the store object, shared by the engine/ files that
 * implement the public API (kv_store.c: store, sequences, attention; others:
 * formats, policies). Not part of the public API.
 *
 * Ownership: the store owns pool, page table and backend.
 */
#ifndef KV_STORE_INT_H
#define KV_STORE_INT_H

#include "alloc/kv_alloc.h"
#include "kernels/kv_backend.h"
#include "kvpage/kvpage.h"
#include "pages/kv_page.h"

struct kv_store {
    kv_config_t cfg;       /* resolved: no zero defaults left  */
    kv_alloc_pool_t *pool; /* host tier                         */
    kv_page_table_t *pt;
    kv_backend_t backend;
    struct kv_pol_table *pol; /* policy states by seq id (kv_policy_state.c); */
                              /* NULL until the first kv_seq_set_policy      */
    uint64_t *last_use;       /* [max_seqs] tick of each seq's last use      */
                              /* (kv_store_lru.c); 0 = never used            */
    uint64_t tick;            /* last tick handed out (atomic)               */
};

/* Attention without policy statistics (kv_store.c): the public calls
 * validate and run these, or hand sequences with a policy to
 * kv_policy_state.c, which calls these with its own stats buffers. */
int kv_store_prefill_raw(kv_store_t *s, const kv_prefill_t *a);
int kv_store_decode_raw(kv_store_t *s, const kv_decode_t *a);

/* ---- recency of sequences (kv_store_lru.c) -------------------------------- */

int kv_store_lru_init(kv_store_t *s);       /* KV_ENOMEM                 */
void kv_store_lru_fini(kv_store_t *s);
size_t kv_store_lru_meta_bytes(const kv_store_t *s);
/* Mark seq used now (ids out of range are ignored; safe from concurrent
 * attention calls). */
void kv_store_touch(kv_store_t *s, kv_seq_id_t seq);
/* The live sequence whose last use is the oldest one after tick `after`
 * (0: the coldest of all): *seq and its *tick. Iterate coldest-first by
 * passing the returned tick back. KV_ENOENT when there is none. O(max_seqs). */
int kv_store_lru_next(const kv_store_t *s, uint64_t after, kv_seq_id_t *seq,
                      uint64_t *tick);

#endif /* KV_STORE_INT_H */
