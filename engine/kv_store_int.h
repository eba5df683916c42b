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
};

#endif /* KV_STORE_INT_H */
