/* SPDX-License-Identifier: MIT */
/*
 * kv_store_estimate.c — kv_config_estimate(): the memory a configuration
 * can take, computed before anything is allocated, and the cap
 * kv_store_create holds it to (kvpage.h, "store").
 *
 * Metadata is what the store allocates besides pages: fixed at create
 * (the pool's refcount and free-id arrays, the sequence tables, the page
 * file's slot arrays) plus, per live sequence, one list header per
 * (layer, kv_head) -- n_layers * n_kv_heads of them, allocated when the
 * sequence is created -- plus one entry per page reference. meta_max adds
 * max_seqs sequences and one reference per pool page: what a full store
 * holds before forks share pages or compaction keeps positions. The cap is
 * the machine's physical memory: a configuration whose meta_max exceeds it
 * could only end in the OOM killer, so kv_store_create answers KV_ENOMEM
 * at once. Pages (kv_max) are not held to it: the pool's pages are
 * reserved as address space and touched only as they are used, and the
 * pool is the caller's cap on them.
 */
#include <string.h>
#include <unistd.h>

#include "kv_policy_int.h"
#include "kv_store_int.h"

uint64_t kv_store_phys_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX;
}

void kv_store_estimate(const kv_config_t *c, kv_estimate_t *e)
{
    const uint64_t S = c->max_seqs, P = c->host_pages;
    memset(e, 0, sizeof *e);
    e->meta_fixed = sizeof(kv_store_t) + sizeof(kv_alloc_pool_t) +
                    P * (sizeof(_Atomic uint32_t) + sizeof(kv_page_id_t)) +
                    S * (sizeof(kv_page_list_t *) + sizeof(uint32_t)) /* page table */ +
                    S * sizeof(uint64_t)                           /* recency */ +
                    sizeof(kv_pol_table_t) + S * sizeof(void *);   /* policies */
    if (c->offload_path)
        e->meta_fixed += sizeof(kv_store_off_t) + S * sizeof(kv_store_off_seq_t) +
                         (uint64_t)c->offload_pages * sizeof(uint64_t) +
                         kv_offload_meta_bytes(c->offload_pages);
    e->meta_fixed += kv_store_prefix_fixed_bytes(c);
    e->meta_per_seq = (uint64_t)c->n_layers * c->n_kv_heads * sizeof(kv_page_list_t);
    e->meta_per_page = sizeof(kv_page_ent_t);
    e->meta_max = e->meta_fixed + S * e->meta_per_seq + P * e->meta_per_page;
    e->kv_max = P * c->page_bytes;
    e->meta_cap = kv_store_phys_bytes();
}

int kv_config_estimate(const kv_config_t *cfg, kv_estimate_t *out)
{
    if (!out)
        return KV_EINVAL;
    kv_config_t c;
    int rc = kv_store_config_resolve(cfg, &c);
    if (rc)
        return rc;
    kv_store_estimate(&c, out);
    return 0;
}
