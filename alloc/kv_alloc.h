/*
 * kv_alloc.h — fixed-size page pools (one per tier), with refcounts.
 *
 * A pool hands out page ids for pages of page_bytes each; capacity is fixed at
 * creation. Host-tier pools also own the page memory: one block from a
 * dedicated jemalloc arena (mallctl "arenas.create", mallocx with
 * MALLOCX_ARENA | MALLOCX_ALIGN(4096) | MALLOCX_TCACHE_NONE), and
 * kv_alloc_page_ptr() gives a page's address. Id-only pools (tier != HOST)
 * hand out ids for memory someone else owns (a device arena, a page file).
 *
 * Page ids: bits 31..26 hold the pool's tag (1..63, from a process-wide
 * counter), bits 25..0 the page index, so capacity <= 2^26 and an id from
 * another pool is rejected (KV_EINVAL) unless the two tags collide (pools
 * created 63 apart). Id 0 is never valid.
 *
 * Refcounts: a page is free (refcount 0) or held (>= 1). kv_alloc_page sets 1;
 * retain adds one; release drops one and frees at zero. Releasing or retaining
 * a free page returns KV_ESTATE and changes nothing. The caller must not
 * release the last reference of one page from two threads at once.
 *
 * Concurrency: every function is safe to call from many threads. Free pages
 * sit on a LIFO stack under a mutex, fronted by small per-thread caches (up to
 * KV_ALLOC_TCACHE_MAX ids per thread per pool) so that an alloc+free pair
 * takes no lock and no atomic read-modify-write. While the shared stack holds
 * fewer than a low watermark of pages, threads bypass and flush their caches,
 * so under memory pressure allocation fails only when the pool is truly
 * exhausted, apart from pages cached by threads that have not called into the
 * pool since the watermark was crossed (at most KV_ALLOC_TCACHE_MAX each).
 * KV_ALLOC_NO_TCACHE turns the caches off.
 *
 * Stats: used/free are exact at the moment of the call; peak is the
 * high-water mark of used, exact with NO_TCACHE and otherwise sampled on
 * every trip to the shared stack (so it may miss up to one cache's worth).
 */
#ifndef KV_ALLOC_H
#define KV_ALLOC_H

#include <stdint.h>

typedef uint32_t kv_page_id_t;

#define KV_PAGE_ID_INVALID   0u
#define KV_ALLOC_MAX_PAGES   (1u << 26)
#define KV_ALLOC_TCACHE_MAX  32u

typedef enum kv_tier {
    KV_TIER_HOST   = 0, /* memory owned by the pool (jemalloc arena)   */
    KV_TIER_PINNED = 1, /* id-only here; memory owned by the backend   */
    KV_TIER_DEVICE = 2, /* id-only; memory owned by the backend        */
    KV_TIER_FILE   = 3, /* id-only; slots of a page file               */
} kv_tier_t;

/* kv_alloc_config_t.flags */
#define KV_ALLOC_NO_TCACHE 0x1u

typedef struct kv_alloc_config {
    uint32_t page_bytes; /* bytes per page, a multiple of 64, >= 64  */
    uint32_t capacity;   /* pages, 1..KV_ALLOC_MAX_PAGES               */
    kv_tier_t tier;
    uint32_t flags;      /* KV_ALLOC_* */
} kv_alloc_config_t;

typedef struct kv_alloc_stats {
    uint32_t page_bytes;
    uint64_t capacity; /* pages                                         */
    uint64_t used;     /* pages held (refcount >= 1)                    */
    uint64_t free;     /* capacity - used                               */
    uint64_t peak;     /* high-water mark of used                       */
    uint64_t failed;   /* allocations refused: pool exhausted/injected  */
} kv_alloc_stats_t;

typedef struct kv_alloc_pool kv_alloc_pool_t;

/* Errors: KV_EINVAL (NULL), KV_ERANGE (page_bytes/capacity), KV_ENOMEM. */
int  kv_alloc_pool_create(const kv_alloc_config_t *cfg, kv_alloc_pool_t **out);
/* Frees the pool and its page memory, whatever is still held. NULL: no-op. */
void kv_alloc_pool_destroy(kv_alloc_pool_t *pool);

/* One page with refcount 1. Errors: KV_ENOMEM (exhausted), KV_EINVAL. */
int kv_alloc_page(kv_alloc_pool_t *pool, kv_page_id_t *id);
/* n pages, all or nothing: on KV_ENOMEM no page was taken. */
int kv_alloc_pages(kv_alloc_pool_t *pool, uint32_t n, kv_page_id_t *ids);

/* Add a reference. Errors: KV_EINVAL (bad id), KV_ESTATE (page is free). */
int kv_alloc_retain(kv_alloc_pool_t *pool, kv_page_id_t id);
/* Drop a reference: returns 1 if the page was freed, 0 if still held,
 * KV_EINVAL (bad id) or KV_ESTATE (page already free). */
int kv_alloc_release(kv_alloc_pool_t *pool, kv_page_id_t id);

/* Current refcount (0 = free); 0 for a bad id as well. */
uint32_t kv_alloc_refcount(const kv_alloc_pool_t *pool, kv_page_id_t id);
/* 1 if id could belong to this pool (tag and index in range). */
int kv_alloc_id_valid(const kv_alloc_pool_t *pool, kv_page_id_t id);
/* Address of a page of a HOST pool (page_bytes bytes, 4096-aligned if
 * page_bytes is a multiple of 4096, else 64-aligned); NULL for id-only pools
 * or a bad id. Valid whatever the refcount; meaningful while held. */
void *kv_alloc_page_ptr(const kv_alloc_pool_t *pool, kv_page_id_t id);
/* Index of a page in 0..capacity-1 (for arrays indexed by page). */
uint32_t kv_alloc_page_index(kv_page_id_t id);

void     kv_alloc_stats(const kv_alloc_pool_t *pool, kv_alloc_stats_t *out);
uint32_t kv_alloc_page_bytes(const kv_alloc_pool_t *pool);
uint32_t kv_alloc_capacity(const kv_alloc_pool_t *pool);

#endif /* KV_ALLOC_H */
