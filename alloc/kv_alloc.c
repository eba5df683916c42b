/* SPDX-License-Identifier: MIT */
/*
 * kv_alloc.c — fixed-size page pools with refcounts (see kv_alloc.h).
 *
 * Where every free page is, at any moment (the conservation law
 * used + shared_n + sum(cache counts) == capacity):
 *   - on the pool's shared LIFO stack of page ids (stack[0..shared_n), top last), under
 *     pool->lock; or
 *   - in exactly one per-thread cache bound to the pool (ids[0..count), top
 *     last), owned by that thread; or
 *   - held (refcount >= 1).
 *
 * Per-thread caches: each thread has KV_ALLOC_TSLOTS cache slots in
 * _Thread_local storage, each bound to at most one pool, keyed by the pool's
 * 64-bit serial (never reused, unlike addresses). Binding, unbinding and the
 * per-pool list of bound caches are under one process-wide registry mutex;
 * lock order is registry -> pool->lock, never the reverse. A pool destroyed
 * while other threads still have caches bound to it walks its list under the
 * registry mutex and unbinds them (serial = 0) without touching the pool
 * again; a thread's exit (pthread key destructor) flushes its caches back
 * under the same mutex. A thread using more than KV_ALLOC_TSLOTS pools evicts
 * (flushes) one of its slots round-robin.
 *
 * Hot path (the thread's "hot" slot -- the one it used last -- is bound to
 * this pool, fault injection disarmed, low flag clear): an alloc pops the
 * cache, a free pushes it: relaxed loads and stores on the thread's own
 * cache and the page's refcount, no lock, no atomic read-modify-write. It is
 * inline in the caller (kv_alloc.h: kv_alloc_page, kv_alloc_page_mem,
 * kv_alloc_release, kv_alloc_page_ptr); everything else is in out-of-line
 * functions here (kv_alloc_page_other, kv_alloc_release_other).
 * A hot slot naming a destroyed pool never matches again (serials are never
 * reused), so destroy has nothing to clear there. A thread goes to the
 * shared stack ("a trip") when its cache is empty (refill KV_ALLOC_TCACHE_MAX/2
 * ids) or full (flush the coldest half).
 *
 * Low watermark: low_mark = min(capacity, 2 * KV_ALLOC_TCACHE_MAX * bound
 * caches), i.e. room for every bound cache to be full twice over. At every
 * trip the pool sets pool->low = (shared_n < low_mark), and while low it
 * sets cache_key to a value no hot slot matches, so the hot path's one
 * compare also sees "low". A thread that sees it set flushes its whole cache
 * at its next call and then works on the shared stack only, until a trip
 * finds the stack back above the mark. With one
 * thread, allocation therefore fails only when used == capacity.
 *
 * Peak: sampled at every trip and in kv_alloc_stats. Each cache remembers
 * `synced` (its count at its last trip; pool->cached_synced is their sum) and
 * `lo` (its lowest count since then): at a trip the pool knows its used count
 * up to other threads' unsynced cache traffic, and this thread's highest
 * point since its last trip is used + (count - lo). So peak is exact with one
 * thread (and with NO_TCACHE), and otherwise misses at most other threads'
 * cache traffic between their trips.
 *
 * Page memory (HOST tier): one block of capacity * page_bytes per pool,
 * mapped anonymously (mmap; page-aligned, zero-filled on first touch) and
 * unmapped at destroy, so a destroyed pool gives its memory straight back to
 * the OS. No general-purpose allocator is involved: the library links no
 * malloc replacement and loads with dlopen into any process. In the
 * sanitizer build (KV_MEM_SYSTEM) the block comes from posix_memalign
 * instead, so ASan sees overruns past the last page and LSan sees a leaked
 * block.
 *
 * Ownership: the pool owns its page block, refcount array, stack and struct
 * (metadata through kv_mem_*). Threads own their cache slots.
 */
#include "alloc/kv_alloc.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_fault_fast.h"
#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"

#ifndef KV_MEM_SYSTEM
#include <sys/mman.h>
#endif

#define KV_ALLOC_TAG_SHIFT  26u
#define KV_ALLOC_INDEX_MASK ((1u << KV_ALLOC_TAG_SHIFT) - 1u)
#define KV_ALLOC_TAG_MAX    63u
#define KV_ALLOC_HALF       (KV_ALLOC_TCACHE_MAX / 2u)
#define KV_ALLOC_TSLOTS     4u    /* pools with a cache, per thread */
#define KV_ALLOC_BLOCK_ALIGN 4096u
#define KV_ALLOC_KEY_NONE   UINT64_MAX /* a cache_key no slot ever has */

#define KV_LIKELY(x)   __builtin_expect(!!(x), 1)
#define KV_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define KV_SLOW        __attribute__((noinline, cold))

/* Everything else a thread keeps (in _Thread_local storage). */
typedef struct kv_alloc_thread {
    kv_alloc_tcache_t slot[KV_ALLOC_TSLOTS];
    uint32_t victim; /* round-robin eviction cursor                   */
    int keyed;       /* pthread_setspecific done (exit flush armed)   */
} kv_alloc_thread_t;

/* The external definitions of kv_alloc.h's inline functions. */
extern inline uint32_t kv_alloc_count(const kv_alloc_tcache_t *c);
extern inline void kv_alloc_set_count(kv_alloc_tcache_t *c, uint32_t n);
extern inline int kv_alloc_valid(const kv_alloc_pool_t *pool, kv_page_id_t id);
extern inline void kv_alloc_hand_out(kv_alloc_pool_t *pool, kv_page_id_t v,
                                     kv_page_id_t *id);
extern inline kv_alloc_tcache_t *kv_alloc_hot(const kv_alloc_pool_t *pool);
extern inline int kv_alloc_cache_pop(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c,
                                     kv_page_id_t *id);
extern inline int kv_alloc_cache_push(kv_alloc_tcache_t *c, kv_page_id_t id);
extern inline int kv_alloc_page(kv_alloc_pool_t *pool, kv_page_id_t *id);
extern inline void *kv_alloc_addr(const kv_alloc_pool_t *pool, uint32_t idx);
extern inline int kv_alloc_page_mem(kv_alloc_pool_t *pool, kv_page_id_t *id, void **mem);
extern inline int kv_alloc_release(kv_alloc_pool_t *pool, kv_page_id_t id);
extern inline void *kv_alloc_page_ptr(const kv_alloc_pool_t *pool, kv_page_id_t id);

static pthread_once_t kv_alloc_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t kv_alloc_registry = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t kv_alloc_key; /* value: the thread's kv_alloc_thread_t */
static int kv_alloc_key_ok;
/* The hot fields fit their 64-byte line (kv_alloc.h). */
_Static_assert(offsetof(kv_alloc_pool_t, stack) - offsetof(kv_alloc_pool_t, cache_key) == 64,
               "kv_alloc_pool: the hot fields outgrew their cache line");

static _Atomic uint32_t kv_alloc_next_tag;
static _Atomic uint64_t kv_alloc_next_serial;
static _Thread_local kv_alloc_thread_t kv_alloc_tls;
/* Declared in kv_alloc.h (the inline hot path reads it). initial-exec: no
 * __tls_get_addr call even in PIC code (the shared library); 16 bytes of
 * static TLS. */
_Thread_local kv_alloc_hot_t kv_alloc_hot_tls
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

static void kv_alloc_thread_exit(void *arg);

static void kv_alloc_init_once(void)
{
    kv_alloc_key_ok = pthread_key_create(&kv_alloc_key, kv_alloc_thread_exit) == 0;
}

/* ---- page block ---------------------------------------------------------- */

static void *kv_alloc_block_alloc(size_t bytes)
{
    if (kv_fault_hit_fast())
        return NULL;
#ifdef KV_MEM_SYSTEM
    void *p = NULL;
    return posix_memalign(&p, KV_ALLOC_BLOCK_ALIGN, bytes) == 0 ? p : NULL;
#else
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
#endif
}

static void kv_alloc_block_free(void *p, size_t bytes)
{
    if (!p)
        return;
#ifdef KV_MEM_SYSTEM
    (void)bytes;
    free(p);
#else
    munmap(p, bytes);
#endif
}

/* ---- shared stack bookkeeping (pool->lock held) -------------------------- */

static uint32_t kv_alloc_shared_n(const kv_alloc_pool_t *pool)
{
    return atomic_load_explicit(&pool->shared_n, memory_order_relaxed);
}

static void kv_alloc_set_shared_n(kv_alloc_pool_t *pool, uint32_t n)
{
    atomic_store_explicit(&pool->shared_n, n, memory_order_relaxed);
}

static void kv_alloc_peak_note(kv_alloc_pool_t *pool, int64_t used)
{
    if (used < 0)
        used = 0;
    if ((uint64_t)used > atomic_load_explicit(&pool->peak, memory_order_relaxed))
        atomic_store_explicit(&pool->peak, (uint64_t)used, memory_order_relaxed);
}

/* Used pages as the pool sees them: exact but for other threads' cache
 * traffic since their last trip. */
static int64_t kv_alloc_used_est(const kv_alloc_pool_t *pool)
{
    return (int64_t)pool->capacity - (int64_t)kv_alloc_shared_n(pool) -
           (int64_t)pool->cached_synced;
}

/* Start of a trip: bring c's count into the pool's view and record the
 * highest used level this thread reached since its last trip. */
static void kv_alloc_trip_begin(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c)
{
    if (!c)
        return;
    uint32_t n = kv_alloc_count(c);
    pool->cached_synced = pool->cached_synced - c->synced + n;
    c->synced = n;
    kv_alloc_peak_note(pool, kv_alloc_used_est(pool) + (int64_t)(n - c->lo));
}

/* End of a trip: resync c, note the peak, recompute the low flag. */
static void kv_alloc_trip_end(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c)
{
    if (c) {
        uint32_t n = kv_alloc_count(c);
        pool->cached_synced = pool->cached_synced - c->synced + n;
        c->synced = n;
        c->lo = n;
    }
    kv_alloc_peak_note(pool, kv_alloc_used_est(pool));
    int low = kv_alloc_shared_n(pool) <
              atomic_load_explicit(&pool->low_mark, memory_order_relaxed);
    if (low != atomic_load_explicit(&pool->low, memory_order_relaxed)) {
        atomic_store_explicit(&pool->low, low, memory_order_relaxed);
        if (!(pool->flags & KV_ALLOC_NO_TCACHE))
            atomic_store_explicit(&pool->cache_key,
                                  low ? KV_ALLOC_KEY_NONE : pool->serial,
                                  memory_order_relaxed);
    }
}

/* Move the k coldest ids of c (ids[0..k)) onto the shared stack. */
static void kv_alloc_flush_bottom(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c,
                                  uint32_t k)
{
    uint32_t n = kv_alloc_count(c), s = kv_alloc_shared_n(pool);
    assert(k <= n && s + k <= pool->capacity);
    memcpy(pool->stack + s, c->ids, k * sizeof c->ids[0]);
    memmove(c->ids, c->ids + k, (n - k) * sizeof c->ids[0]);
    kv_alloc_set_shared_n(pool, s + k);
    kv_alloc_set_count(c, n - k);
}

/* Move up to k ids from the top of the shared stack into an empty-ish c. */
static void kv_alloc_refill(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c,
                            uint32_t k)
{
    uint32_t n = kv_alloc_count(c), s = kv_alloc_shared_n(pool);
    if (k > s)
        k = s;
    assert(n + k <= KV_ALLOC_TCACHE_MAX);
    memcpy(c->ids + n, pool->stack + s - k, k * sizeof c->ids[0]);
    kv_alloc_set_shared_n(pool, s - k);
    kv_alloc_set_count(c, n + k);
}

static void kv_alloc_update_low_mark(kv_alloc_pool_t *pool)
{
    uint64_t m = 2ull * KV_ALLOC_TCACHE_MAX * pool->n_bound;
    if (m > pool->capacity)
        m = pool->capacity;
    atomic_store_explicit(&pool->low_mark, (uint32_t)m, memory_order_relaxed);
}

/* ---- per-thread cache binding (registry mutex held) ---------------------- */

/* Detach c from its pool. flush: give its ids back first (the pool is alive);
 * otherwise the pool is being destroyed and its ids are simply dropped. */
static void kv_alloc_unbind(kv_alloc_tcache_t *c, int flush)
{
    kv_alloc_pool_t *pool = c->pool;
    if (flush) {
        pthread_mutex_lock(&pool->lock);
        kv_alloc_trip_begin(pool, c);
        kv_alloc_flush_bottom(pool, c, kv_alloc_count(c));
        kv_alloc_trip_end(pool, c); /* c->synced is 0 again */
        pthread_mutex_unlock(&pool->lock);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        pool->caches = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    pool->n_bound--;
    kv_alloc_update_low_mark(pool);
    c->pool = NULL;
    kv_alloc_set_count(c, 0);
    atomic_store_explicit(&c->serial, 0, memory_order_relaxed);
}

static void kv_alloc_thread_exit(void *arg)
{
    kv_alloc_thread_t *t = arg;
    pthread_mutex_lock(&kv_alloc_registry);
    for (uint32_t i = 0; i < KV_ALLOC_TSLOTS; i++)
        if (atomic_load_explicit(&t->slot[i].serial, memory_order_relaxed))
            kv_alloc_unbind(&t->slot[i], 1);
    t->keyed = 0;
    pthread_mutex_unlock(&kv_alloc_registry);
    /* The slots are unbound but their pools live on: the hot slot must not
     * match them should this thread call in again (from a later destructor). */
    kv_alloc_hot_tls.serial = 0;
}

/* The calling thread's cache for pool, binding a slot if needed; NULL when
 * the thread cannot get one (no pthread key). */
KV_SLOW static kv_alloc_tcache_t *kv_alloc_tc_bind(kv_alloc_pool_t *pool)
{
    if (pool->flags & KV_ALLOC_NO_TCACHE)
        return NULL;
    kv_alloc_thread_t *t = &kv_alloc_tls;
    for (uint32_t i = 0; i < KV_ALLOC_TSLOTS; i++) {
        if (atomic_load_explicit(&t->slot[i].serial, memory_order_relaxed) ==
            pool->serial) {
            kv_alloc_hot_tls.c = &t->slot[i];
            kv_alloc_hot_tls.serial = pool->serial;
            return &t->slot[i];
        }
    }
    if (!kv_alloc_key_ok)
        return NULL;
    pthread_mutex_lock(&kv_alloc_registry);
    if (!t->keyed) {
        if (pthread_setspecific(kv_alloc_key, t) != 0) {
            pthread_mutex_unlock(&kv_alloc_registry);
            return NULL;
        }
        t->keyed = 1;
    }
    uint32_t i = 0;
    while (i < KV_ALLOC_TSLOTS &&
           atomic_load_explicit(&t->slot[i].serial, memory_order_relaxed))
        i++;
    if (i == KV_ALLOC_TSLOTS) {
        i = t->victim++ % KV_ALLOC_TSLOTS;
        kv_alloc_unbind(&t->slot[i], 1);
    }
    kv_alloc_tcache_t *c = &t->slot[i];
    c->pool = pool;
    c->lo = c->synced = 0;
    kv_alloc_set_count(c, 0);
    c->prev = NULL;
    c->next = pool->caches;
    if (pool->caches)
        pool->caches->prev = c;
    pool->caches = c;
    pool->n_bound++;
    kv_alloc_update_low_mark(pool);
    atomic_store_explicit(&c->serial, pool->serial, memory_order_relaxed);
    kv_alloc_hot_tls.c = c;
    kv_alloc_hot_tls.serial = pool->serial;
    pthread_mutex_unlock(&kv_alloc_registry);
    return c;
}

/* The calling thread's cache for pool (bound now if need be), or NULL if
 * caching is off; the caller checks the low flag. */
static inline kv_alloc_tcache_t *kv_alloc_tc(kv_alloc_pool_t *pool)
{
    kv_alloc_tcache_t *c = kv_alloc_hot(pool);
    return KV_LIKELY(c != NULL) ? c : kv_alloc_tc_bind(pool);
}

static inline int kv_alloc_is_low(const kv_alloc_pool_t *pool)
{
    return atomic_load_explicit(&pool->low, memory_order_relaxed);
}

/* ---- create / destroy ---------------------------------------------------- */

int kv_alloc_pool_create(const kv_alloc_config_t *cfg, kv_alloc_pool_t **out)
{
    if (!cfg || !out)
        return KV_EINVAL;
    if (cfg->page_bytes == 0 || cfg->page_bytes % 64u != 0 ||
        cfg->capacity == 0 || cfg->capacity > KV_ALLOC_MAX_PAGES)
        return KV_ERANGE;
    if ((unsigned)cfg->tier > (unsigned)KV_TIER_FILE ||
        (cfg->flags & ~KV_ALLOC_NO_TCACHE) != 0)
        return KV_EINVAL;
    pthread_once(&kv_alloc_once, kv_alloc_init_once);

    kv_alloc_pool_t *pool = kv_mem_calloc(1, sizeof *pool);
    if (!pool)
        return KV_ENOMEM;
    pool->capacity = cfg->capacity;
    pool->page_bytes = cfg->page_bytes;
    pool->flags = cfg->flags;
    pool->tier = cfg->tier;
    pool->refs = kv_mem_calloc(cfg->capacity, sizeof pool->refs[0]);
    pool->stack = pool->refs ? kv_mem_alloc((size_t)cfg->capacity *
                                            sizeof pool->stack[0])
                             : NULL;
    if (pool->stack && cfg->tier == KV_TIER_HOST) {
        pool->block_bytes = (size_t)cfg->capacity * cfg->page_bytes;
        pool->base = kv_alloc_block_alloc(pool->block_bytes);
    }
    if (!pool->stack || (cfg->tier == KV_TIER_HOST && !pool->base) ||
        pthread_mutex_init(&pool->lock, NULL) != 0) {
        kv_alloc_block_free(pool->base, pool->block_bytes);
        kv_mem_free(pool->stack, (size_t)cfg->capacity * sizeof pool->stack[0]);
        kv_mem_free(pool->refs, (size_t)cfg->capacity * sizeof pool->refs[0]);
        kv_mem_free(pool, sizeof *pool);
        return KV_ENOMEM;
    }
    uint32_t tag = atomic_fetch_add(&kv_alloc_next_tag, 1) % KV_ALLOC_TAG_MAX + 1u;
    pool->tag_bits = tag << KV_ALLOC_TAG_SHIFT;
    pool->host_pages = pool->base ? pool->capacity : 0;
    /* Stack top is index 0, so a fresh pool hands out 0, 1, 2, ... */
    for (uint32_t i = 0; i < cfg->capacity; i++)
        pool->stack[i] = pool->tag_bits | (cfg->capacity - 1u - i);
    atomic_store(&pool->shared_n, cfg->capacity);
    pool->serial = atomic_fetch_add(&kv_alloc_next_serial, 1) + 1u;
    atomic_init(&pool->cache_key, (cfg->flags & KV_ALLOC_NO_TCACHE)
                                      ? KV_ALLOC_KEY_NONE : pool->serial);
    *out = pool;
    return 0;
}

void kv_alloc_pool_destroy(kv_alloc_pool_t *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&kv_alloc_registry);
    while (pool->caches)
        kv_alloc_unbind(pool->caches, 0);
    pthread_mutex_unlock(&kv_alloc_registry);
    pthread_mutex_destroy(&pool->lock);
    kv_alloc_block_free(pool->base, pool->block_bytes);
    kv_mem_free(pool->stack, (size_t)pool->capacity * sizeof pool->stack[0]);
    kv_mem_free(pool->refs, (size_t)pool->capacity * sizeof pool->refs[0]);
    kv_mem_free(pool, sizeof *pool);
}

/* ---- ids ----------------------------------------------------------------- */

int kv_alloc_id_valid(const kv_alloc_pool_t *pool, kv_page_id_t id)
{
    return pool && kv_alloc_valid(pool, id);
}

uint32_t kv_alloc_page_index(kv_page_id_t id)
{
    return id & KV_ALLOC_INDEX_MASK;
}

uint32_t kv_alloc_refcount(const kv_alloc_pool_t *pool, kv_page_id_t id)
{
    if (!pool || !kv_alloc_valid(pool, id))
        return 0;
    return atomic_load_explicit(&pool->refs[id & KV_ALLOC_INDEX_MASK],
                                memory_order_relaxed);
}

/* ---- allocation ---------------------------------------------------------- */

KV_SLOW static int kv_alloc_refuse(kv_alloc_pool_t *pool)
{
    atomic_fetch_add_explicit(&pool->failed, 1, memory_order_relaxed);
    return KV_ENOMEM;
}

KV_SLOW static int kv_alloc_page_slow(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c,
                              kv_page_id_t *id)
{
    kv_page_id_t v = KV_PAGE_ID_INVALID;
    int ok = 1;
    pthread_mutex_lock(&pool->lock);
    kv_alloc_trip_begin(pool, c);
    int low = kv_alloc_shared_n(pool) <
              atomic_load_explicit(&pool->low_mark, memory_order_relaxed);
    if (c && !low) {
        if (kv_alloc_count(c) == 0)
            kv_alloc_refill(pool, c, KV_ALLOC_HALF);
        uint32_t n = kv_alloc_count(c);
        if (n > 0) {
            v = c->ids[n - 1];
            kv_alloc_set_count(c, n - 1);
        } else {
            ok = 0;
        }
    } else {
        if (c)
            kv_alloc_flush_bottom(pool, c, kv_alloc_count(c));
        uint32_t s = kv_alloc_shared_n(pool);
        if (s > 0) {
            v = pool->stack[s - 1];
            kv_alloc_set_shared_n(pool, s - 1);
        } else {
            ok = 0;
        }
    }
    if (ok)
        kv_alloc_hand_out(pool, v, id);
    kv_alloc_trip_end(pool, c);
    pthread_mutex_unlock(&pool->lock);
    return ok ? 0 : kv_alloc_refuse(pool);
}

/* Everything kv_alloc_page's inline hot path does not handle. */
KV_SLOW kv_alloc_got_t kv_alloc_page_other(kv_alloc_pool_t *pool)
{
    kv_alloc_got_t g = { KV_EINVAL, KV_PAGE_ID_INVALID };
    if (!pool)
        return g;
    if (kv_fault_hit_fast()) {
        g.rc = kv_alloc_refuse(pool);
        return g;
    }
    kv_alloc_tcache_t *c = kv_alloc_tc(pool);
    if (c && !kv_alloc_is_low(pool) && kv_alloc_cache_pop(pool, c, &g.id))
        g.rc = 0;
    else
        g.rc = kv_alloc_page_slow(pool, c, &g.id);
    return g;
}

int kv_alloc_pages(kv_alloc_pool_t *pool, uint32_t n, kv_page_id_t *ids)
{
    if (!pool || (n > 0 && !ids))
        return KV_EINVAL;
    if (n == 0)
        return 0;
    if (kv_fault_hit_fast() || n > pool->capacity)
        return kv_alloc_refuse(pool);
    kv_alloc_tcache_t *c = kv_alloc_tc(pool);
    if (c && !kv_alloc_is_low(pool) && kv_alloc_count(c) >= n) {
        uint32_t k = kv_alloc_count(c);
        for (uint32_t j = 0; j < n; j++)
            kv_alloc_hand_out(pool, c->ids[--k], &ids[j]);
        kv_alloc_set_count(c, k);
        if (k < c->lo)
            c->lo = k;
        return 0;
    }
    pthread_mutex_lock(&pool->lock);
    kv_alloc_trip_begin(pool, c);
    int low = kv_alloc_shared_n(pool) <
              atomic_load_explicit(&pool->low_mark, memory_order_relaxed);
    if (c && low)
        kv_alloc_flush_bottom(pool, c, kv_alloc_count(c));
    uint32_t from_c = c ? kv_alloc_count(c) : 0;
    if (from_c > n)
        from_c = n;
    uint32_t need = n - from_c, s = kv_alloc_shared_n(pool);
    int ok = s >= need;
    if (ok) {
        uint32_t k = from_c ? kv_alloc_count(c) : 0;
        for (uint32_t j = 0; j < from_c; j++)
            kv_alloc_hand_out(pool, c->ids[--k], &ids[j]);
        if (from_c)
            kv_alloc_set_count(c, k);
        for (uint32_t j = from_c; j < n; j++)
            kv_alloc_hand_out(pool, pool->stack[--s], &ids[j]);
        kv_alloc_set_shared_n(pool, s);
    }
    kv_alloc_trip_end(pool, c);
    pthread_mutex_unlock(&pool->lock);
    return ok ? 0 : kv_alloc_refuse(pool);
}

/* ---- refcounts ----------------------------------------------------------- */

int kv_alloc_retain(kv_alloc_pool_t *pool, kv_page_id_t id)
{
    if (!pool || !kv_alloc_valid(pool, id))
        return KV_EINVAL;
    _Atomic uint32_t *r = &pool->refs[id & KV_ALLOC_INDEX_MASK];
    uint32_t v = atomic_load_explicit(r, memory_order_relaxed);
    do {
        if (v == 0)
            return KV_ESTATE;
        if (v == UINT32_MAX)
            return KV_ERANGE; /* 2^32-1 references: refuse, change nothing */
    } while (!atomic_compare_exchange_weak_explicit(
        r, &v, v + 1, memory_order_relaxed, memory_order_relaxed));
    return 0;
}

KV_SLOW static void kv_alloc_put_slow(kv_alloc_pool_t *pool, kv_alloc_tcache_t *c,
                              kv_page_id_t id)
{
    pthread_mutex_lock(&pool->lock);
    kv_alloc_trip_begin(pool, c);
    int low = kv_alloc_shared_n(pool) <
              atomic_load_explicit(&pool->low_mark, memory_order_relaxed);
    if (c && !low) {
        if (kv_alloc_count(c) == KV_ALLOC_TCACHE_MAX)
            kv_alloc_flush_bottom(pool, c, KV_ALLOC_HALF);
        uint32_t n = kv_alloc_count(c);
        c->ids[n] = id;
        kv_alloc_set_count(c, n + 1);
    } else {
        if (c)
            kv_alloc_flush_bottom(pool, c, kv_alloc_count(c));
        uint32_t s = kv_alloc_shared_n(pool);
        assert(s < pool->capacity);
        pool->stack[s] = id;
        kv_alloc_set_shared_n(pool, s + 1);
    }
    kv_alloc_trip_end(pool, c);
    pthread_mutex_unlock(&pool->lock);
}

/* Everything kv_alloc_release's inline hot path does not handle: bad ids,
 * shared pages, a hot slot that is not this pool's or is full, low pools. */
KV_SLOW int kv_alloc_release_other(kv_alloc_pool_t *pool, kv_page_id_t id)
{
    if (!pool || !kv_alloc_valid(pool, id))
        return KV_EINVAL;
    uint32_t idx = id - pool->tag_bits;
    _Atomic uint32_t *r = &pool->refs[idx];
    uint32_t v = atomic_load_explicit(r, memory_order_acquire);
    if (v == 1) {
        /* The caller holds the only reference: nobody else may touch it. */
        atomic_store_explicit(r, 0, memory_order_relaxed);
    } else {
        do {
            if (v == 0)
                return KV_ESTATE;
        } while (!atomic_compare_exchange_weak_explicit(
            r, &v, v - 1, memory_order_acq_rel, memory_order_acquire));
        if (v != 1)
            return 0;
    }
    /* That was the last reference: back to this thread's cache or the
     * shared stack. */
    kv_alloc_tcache_t *c = kv_alloc_tc(pool);
    if (!c || kv_alloc_is_low(pool) || !kv_alloc_cache_push(c, id))
        kv_alloc_put_slow(pool, c, id);
    return 1;
}

/* ---- stats --------------------------------------------------------------- */

void kv_alloc_stats(const kv_alloc_pool_t *pool, kv_alloc_stats_t *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!pool)
        return;
    /* The mutexes are logically mutable: stats changes no pool state. */
    kv_alloc_pool_t *p = (kv_alloc_pool_t *)pool;
    pthread_mutex_lock(&kv_alloc_registry);
    pthread_mutex_lock(&p->lock);
    uint64_t cached = 0;
    for (const kv_alloc_tcache_t *c = p->caches; c; c = c->next)
        cached += kv_alloc_count(c);
    uint64_t used = (uint64_t)p->capacity - kv_alloc_shared_n(p) - cached;
    uint64_t peak = atomic_load_explicit(&p->peak, memory_order_relaxed);
    if (used > peak)
        peak = used;
    /* This thread's highest point since its last trip (see file comment). */
    const kv_alloc_thread_t *t = &kv_alloc_tls;
    for (uint32_t i = 0; i < KV_ALLOC_TSLOTS; i++) {
        const kv_alloc_tcache_t *c = &t->slot[i];
        if (atomic_load_explicit(&c->serial, memory_order_relaxed) == p->serial) {
            uint32_t n = kv_alloc_count(c);
            if (n > c->lo && used + (n - c->lo) > peak)
                peak = used + (n - c->lo);
        }
    }
    out->page_bytes = p->page_bytes;
    out->capacity = p->capacity;
    out->used = used;
    out->free = p->capacity - used;
    out->peak = peak;
    out->failed = atomic_load_explicit(&p->failed, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&kv_alloc_registry);
}

uint32_t kv_alloc_page_bytes(const kv_alloc_pool_t *pool)
{
    return pool ? pool->page_bytes : 0;
}

uint32_t kv_alloc_capacity(const kv_alloc_pool_t *pool)
{
    return pool ? pool->capacity : 0;
}
