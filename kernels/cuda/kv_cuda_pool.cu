/* SPDX-License-Identifier: MIT */
/*
 * kv_cuda_pool.cu — the device page tier: one cudaMalloc arena carved into
 * pages, page ids from a KV_TIER_DEVICE id-only kv_alloc pool (page i of
 * the arena is the page with kv_alloc_page_index(id) == i), and pinned
 * staging for host -> device page copies.
 *
 * Copies (kv_cuda_pool_write): each page goes host -> a pinned staging slot
 * (memcpy) -> its device page (cudaMemcpyAsync on the pool's stream); after
 * the batch an event is recorded on every slot used. A slot is reused only
 * after its event completed (waited for when the ring comes round), and a
 * page remembers the slot of its last write: freeing a page whose copy is
 * still in flight puts it on a deferred list, and it goes back to the id
 * pool only when that event completed (checked by alloc and sync). A newer
 * record of the same slot's event happens only after the older copy
 * completed, so querying the slot's current event is conservative.
 * Kernels reading pages run on the same stream (kv_cuda_pool_stream), so
 * stream order covers them. One caller at a time (not thread-safe).
 */
#include <stdlib.h>
#include <string.h>

#include "kv_cuda_int.cuh"

extern "C" {
#include "alloc/kv_mem.h"
}

#define NO_SLOT 0xffffffffu

struct kv_cuda_pool {
    uint32_t page_bytes, capacity, n_slots;
    uint8_t *arena;         /* device, capacity * page_bytes           */
    uint8_t *staging;       /* pinned host, n_slots * page_bytes       */
    cudaEvent_t *slot_ev;   /* [n_slots] last copy out of each slot    */
    uint8_t *slot_used;     /* [n_slots] an event was recorded         */
    uint32_t next_slot;     /* ring position                           */
    uint32_t *page_slot;    /* [capacity] slot of the last write       */
    kv_page_id_t *deferred; /* [capacity] freed while in flight        */
    uint8_t *is_deferred;   /* [capacity] 1: on the deferred list      */
    uint32_t n_deferred;
    kv_alloc_pool_t *ids;
    cudaStream_t stream;
    int own_stream;
};

static int busy(const kv_cuda_pool_t *p, uint32_t idx)
{
    const uint32_t s = p->page_slot[idx];
    return s != NO_SLOT && cudaEventQuery(p->slot_ev[s]) == cudaErrorNotReady;
}

/* 1 if id is a page the caller holds (not free, not waiting on a copy). */
static int held(const kv_cuda_pool_t *p, kv_page_id_t id)
{
    return kv_alloc_refcount(p->ids, id) > 0 &&
           !p->is_deferred[kv_alloc_page_index(id)];
}

/* Release deferred pages whose copies completed. */
static void reap(kv_cuda_pool_t *p)
{
    uint32_t keep = 0;
    for (uint32_t i = 0; i < p->n_deferred; i++) {
        const kv_page_id_t id = p->deferred[i];
        if (busy(p, kv_alloc_page_index(id))) {
            p->deferred[keep++] = id;
            continue;
        }
        p->page_slot[kv_alloc_page_index(id)] = NO_SLOT;
        p->is_deferred[kv_alloc_page_index(id)] = 0;
        kv_alloc_release(p->ids, id);
    }
    p->n_deferred = keep;
}

extern "C" void kv_cuda_pool_destroy(kv_cuda_pool_t *p)
{
    if (!p)
        return;
    if (p->stream || p->own_stream)
        cudaStreamSynchronize(p->stream);
    for (uint32_t i = 0; p->slot_ev && i < p->n_slots; i++)
        if (p->slot_ev[i])
            cudaEventDestroy(p->slot_ev[i]);
    if (p->own_stream)
        cudaStreamDestroy(p->stream);
    cudaFree(p->arena);
    cudaFreeHost(p->staging);
    kv_alloc_pool_destroy(p->ids);
    kv_mem_free(p->slot_ev, p->n_slots * sizeof(cudaEvent_t));
    kv_mem_free(p->slot_used, p->n_slots);
    kv_mem_free(p->page_slot, (size_t)p->capacity * sizeof(uint32_t));
    kv_mem_free(p->deferred, (size_t)p->capacity * sizeof(kv_page_id_t));
    kv_mem_free(p->is_deferred, p->capacity);
    kv_mem_free(p, sizeof *p);
}

extern "C" int kv_cuda_pool_create(uint32_t page_bytes, uint32_t capacity,
                                   uint32_t staging_pages, void *stream,
                                   kv_cuda_pool_t **out)
{
    if (!out || staging_pages == 0)
        return KV_EINVAL;
    kv_alloc_config_t cfg = {page_bytes, capacity, KV_TIER_DEVICE, 0};
    kv_cuda_pool_t *p = (kv_cuda_pool_t *)kv_mem_calloc(1, sizeof *p);
    if (!p)
        return KV_ENOMEM;
    p->page_bytes = page_bytes;
    p->capacity = capacity;
    p->n_slots = staging_pages;
    int rc = kv_alloc_pool_create(&cfg, &p->ids);
    if (rc) {
        kv_mem_free(p, sizeof *p);
        return rc;
    }
    p->slot_ev =
        (cudaEvent_t *)kv_mem_calloc(staging_pages, sizeof(cudaEvent_t));
    p->slot_used = (uint8_t *)kv_mem_calloc(staging_pages, 1);
    p->page_slot =
        (uint32_t *)kv_mem_alloc((size_t)capacity * sizeof(uint32_t));
    p->deferred =
        (kv_page_id_t *)kv_mem_alloc((size_t)capacity * sizeof(kv_page_id_t));
    p->is_deferred = (uint8_t *)kv_mem_calloc(capacity, 1);
    if (!p->slot_ev || !p->slot_used || !p->page_slot || !p->deferred ||
        !p->is_deferred) {
        kv_cuda_pool_destroy(p);
        return KV_ENOMEM;
    }
    memset(p->page_slot, 0xff, (size_t)capacity * sizeof(uint32_t));
    if (stream) {
        p->stream = (cudaStream_t)stream;
    } else if ((rc = kv_cuda_status(cudaStreamCreateWithFlags(
                    &p->stream, cudaStreamNonBlocking)))) {
        kv_cuda_pool_destroy(p);
        return rc;
    } else {
        p->own_stream = 1;
    }
    rc = kv_cuda_status(
        cudaMalloc((void **)&p->arena, (size_t)capacity * page_bytes));
    if (!rc)
        rc = kv_cuda_status(cudaHostAlloc((void **)&p->staging,
                                          (size_t)staging_pages * page_bytes,
                                          cudaHostAllocDefault));
    for (uint32_t i = 0; !rc && i < staging_pages; i++)
        rc = kv_cuda_status(
            cudaEventCreateWithFlags(&p->slot_ev[i], cudaEventDisableTiming));
    if (rc) {
        kv_cuda_pool_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

extern "C" int kv_cuda_pool_alloc(kv_cuda_pool_t *p, uint32_t n,
                                  kv_page_id_t *ids)
{
    if (!p || !ids)
        return KV_EINVAL;
    reap(p);
    return kv_alloc_pages(p->ids, n, ids);
}

extern "C" int kv_cuda_pool_free(kv_cuda_pool_t *p, uint32_t n,
                                 const kv_page_id_t *ids)
{
    if (!p || (n && !ids))
        return KV_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!held(p, ids[i]))
            return KV_EINVAL; /* bad or free id: nothing changed */
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t idx = kv_alloc_page_index(ids[i]);
        if (!held(p, ids[i]))
            continue; /* listed twice: its last reference went already */
        if (kv_alloc_refcount(p->ids, ids[i]) == 1 && busy(p, idx)) {
            p->deferred[p->n_deferred++] = ids[i]; /* last reference */
            p->is_deferred[idx] = 1;
            continue;
        }
        if (kv_alloc_refcount(p->ids, ids[i]) == 1)
            p->page_slot[idx] = NO_SLOT;
        kv_alloc_release(p->ids, ids[i]);
    }
    return 0;
}

extern "C" void *kv_cuda_pool_page_ptr(const kv_cuda_pool_t *p, kv_page_id_t id)
{
    if (!p || !kv_alloc_id_valid(p->ids, id))
        return NULL;
    return p->arena + (size_t)kv_alloc_page_index(id) * p->page_bytes;
}

extern "C" int kv_cuda_pool_write(kv_cuda_pool_t *p, uint32_t n,
                                  const kv_page_id_t *ids,
                                  const void *const *src)
{
    if (!p || (n && (!ids || !src)))
        return KV_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!held(p, ids[i]) || !src[i])
            return KV_EINVAL;
    const size_t pb = p->page_bytes;
    for (uint32_t i0 = 0; i0 < n;) {
        /* a batch: as many slots as the ring has left before it wraps */
        uint32_t cnt = p->n_slots - p->next_slot;
        cnt = cnt < n - i0 ? cnt : n - i0;
        for (uint32_t j = 0; j < cnt; j++) {
            const uint32_t s = p->next_slot + j;
            if (p->slot_used[s]) { /* the slot's previous copy must be done */
                int rc = kv_cuda_status(cudaEventSynchronize(p->slot_ev[s]));
                if (rc)
                    return rc;
            }
            memcpy(p->staging + s * pb, src[i0 + j], pb);
            const uint32_t idx = kv_alloc_page_index(ids[i0 + j]);
            int rc = kv_cuda_status(
                cudaMemcpyAsync(p->arena + idx * pb, p->staging + s * pb, pb,
                                cudaMemcpyHostToDevice, p->stream));
            if (rc)
                return rc;
            p->page_slot[idx] = s;
        }
        for (uint32_t j = 0; j < cnt; j++) {
            const uint32_t s = p->next_slot + j;
            int rc = kv_cuda_status(cudaEventRecord(p->slot_ev[s], p->stream));
            if (rc)
                return rc;
            p->slot_used[s] = 1;
        }
        p->next_slot = (p->next_slot + cnt) % p->n_slots;
        i0 += cnt;
    }
    return 0;
}

extern "C" int kv_cuda_pool_read(kv_cuda_pool_t *p, uint32_t n,
                                 const kv_page_id_t *ids, void *const *dst)
{
    if (!p || (n && (!ids || !dst)))
        return KV_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!kv_alloc_id_valid(p->ids, ids[i]) || !dst[i])
            return KV_EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        const size_t idx = kv_alloc_page_index(ids[i]);
        int rc = kv_cuda_status(
            cudaMemcpyAsync(dst[i], p->arena + idx * p->page_bytes,
                            p->page_bytes, cudaMemcpyDeviceToHost, p->stream));
        if (rc)
            return rc;
    }
    return kv_cuda_status(cudaStreamSynchronize(p->stream));
}

extern "C" int kv_cuda_pool_sync(kv_cuda_pool_t *p)
{
    if (!p)
        return KV_EINVAL;
    int rc = kv_cuda_status(cudaStreamSynchronize(p->stream));
    reap(p);
    return rc;
}

extern "C" const void *kv_cuda_pool_base(const kv_cuda_pool_t *p)
{
    return p ? p->arena : NULL;
}

extern "C" uint32_t kv_cuda_pool_page_bytes(const kv_cuda_pool_t *p)
{
    return p ? p->page_bytes : 0;
}

extern "C" uint32_t kv_cuda_pool_capacity(const kv_cuda_pool_t *p)
{
    return p ? p->capacity : 0;
}

extern "C" void *kv_cuda_pool_stream(const kv_cuda_pool_t *p)
{
    return p ? (void *)p->stream : NULL;
}

extern "C" uint32_t kv_cuda_pool_deferred(const kv_cuda_pool_t *p)
{
    return p ? p->n_deferred : 0;
}
