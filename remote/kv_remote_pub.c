/* SPDX-License-Identifier: MIT */
/*
 * kv_remote_pub.c — the publisher: blobs queued by the caller, stored by a
 * thread of its own through its own client, so that publishing never waits
 * for a server.
 *
 * kv_remote_pub_put copies the blob into one kv_mem block (item header and
 * payload) outside the lock, then, under the lock, appends it to a FIFO
 * list bounded by max_items and max_bytes, or drops it (counted) when that
 * would exceed a bound. The thread takes up to `batch` items at a time,
 * sends them with one kv_remote_set call (bounded by the client's timeout),
 * frees them and counts the outcome. The lock is held only to link and
 * unlink items and to read counters, never across I/O or a copy.
 *
 * Flush: every item gets a ticket (seq_in at put); seq_out counts items
 * finished; kv_remote_pub_flush waits for seq_out to reach the seq_in it saw.
 * Destroy: stop flag, wake, join (the batch in flight finishes), free what
 * is left (counted discarded).
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "remote/kv_remote_int.h"

typedef struct kv_pub_item {
    struct kv_pub_item *next;
    kv_remote_key_t key;
    uint32_t format;
    size_t len;              /* payload bytes, at data                       */
    unsigned char data[];
} kv_pub_item_t;

enum { KV_PC_QUEUED, KV_PC_DROPPED, KV_PC_PUBLISHED, KV_PC_FAILED, KV_PC_DISCARDED,
       KV_PC_COUNT };

struct kv_remote_pub {
    kv_remote_t *cli;            /* the thread's client                       */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;         /* items queued, or stop                     */
    pthread_cond_t done;         /* seq_out advanced                          */
    kv_pub_item_t *head, *tail;  /* under mu                                  */
    uint64_t items, bytes;       /* in the queue, under mu                    */
    uint64_t seq_in, seq_out;    /* items accepted / finished, under mu       */
    uint64_t max_items, max_bytes;
    uint32_t batch;
    int stop;                    /* under mu                                  */
    kv_pub_item_t **taken;       /* [batch] the thread's current batch        */
    kv_remote_set_t *sets;       /* [batch]                                   */
    struct iovec *iov;           /* [batch]                                   */
    _Atomic uint64_t c[KV_PC_COUNT];
};

static void kv_pub_count(kv_remote_pub_t *p, int i, uint64_t n)
{
    atomic_fetch_add_explicit(&p->c[i], n, memory_order_relaxed);
}

static void kv_item_free(kv_pub_item_t *it)
{
    kv_mem_free(it, sizeof *it + it->len);
}

static void *kv_pub_main(void *arg)
{
    kv_remote_pub_t *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->head)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        uint32_t k = 0;
        while (p->head && k < p->batch) {
            kv_pub_item_t *it = p->head;
            p->head = it->next;
            p->items--;
            p->bytes -= it->len;
            p->taken[k++] = it;
        }
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->mu);
        for (uint32_t i = 0; i < k; i++) {
            kv_pub_item_t *it = p->taken[i];
            p->iov[i] = (struct iovec){.iov_base = it->data, .iov_len = it->len};
            p->sets[i] = (kv_remote_set_t){.key = it->key, .format = it->format,
                                           .iov = &p->iov[i], .iovcnt = 1};
        }
        int stored = kv_remote_set(p->cli, p->sets, k);
        if (stored < 0) /* only KV_ENOMEM (the items were checked at put) */
            stored = 0;
        kv_pub_count(p, KV_PC_PUBLISHED, (uint64_t)stored);
        kv_pub_count(p, KV_PC_FAILED, k - (uint64_t)stored);
        for (uint32_t i = 0; i < k; i++)
            kv_item_free(p->taken[i]);
        pthread_mutex_lock(&p->mu);
        p->seq_out += k;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void kv_pub_free(kv_remote_pub_t *p)
{
    kv_remote_destroy(p->cli);
    kv_mem_free(p->taken, p->batch * sizeof *p->taken);
    kv_mem_free(p->sets, p->batch * sizeof *p->sets);
    kv_mem_free(p->iov, p->batch * sizeof *p->iov);
    kv_mem_free(p, sizeof *p);
}

int kv_remote_pub_create(const kv_remote_config_t *cfg, uint32_t max_items,
                         uint64_t max_bytes, uint32_t batch, kv_remote_pub_t **out)
{
    if (!out)
        return KV_EINVAL;
    if (max_items > (1u << 20) || batch > KV_REMOTE_MAX_BATCH)
        return KV_ERANGE;
    kv_remote_pub_t *p = kv_mem_calloc(1, sizeof *p);
    if (!p)
        return KV_ENOMEM;
    p->max_items = max_items ? max_items : 1024;
    p->max_bytes = max_bytes ? max_bytes : 256ull << 20;
    p->batch = batch ? batch : 64;
    int rc = kv_remote_create(cfg, &p->cli);
    if (!rc) {
        p->taken = kv_mem_alloc(p->batch * sizeof *p->taken);
        p->sets = kv_mem_alloc(p->batch * sizeof *p->sets);
        p->iov = kv_mem_alloc(p->batch * sizeof *p->iov);
        rc = p->taken && p->sets && p->iov ? 0 : KV_ENOMEM;
    }
    pthread_condattr_t ca;
    int sync_ok = !rc && !pthread_condattr_init(&ca);
    if (sync_ok) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        sync_ok = !pthread_mutex_init(&p->mu, NULL);
        if (sync_ok && (pthread_cond_init(&p->work, &ca) || pthread_cond_init(&p->done, &ca)))
            sync_ok = 0; /* (glibc: cannot fail with these attributes) */
        pthread_condattr_destroy(&ca);
    }
    if (!rc && (!sync_ok || pthread_create(&p->thread, NULL, kv_pub_main, p))) {
        if (sync_ok) {
            pthread_cond_destroy(&p->work);
            pthread_cond_destroy(&p->done);
            pthread_mutex_destroy(&p->mu);
        }
        rc = KV_ENOMEM;
    }
    if (rc) {
        kv_pub_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int kv_remote_pub_put(kv_remote_pub_t *p, const kv_remote_key_t *key, uint32_t format,
                      const struct iovec *iov, int iovcnt)
{
    size_t len = 0;
    if (!p || !key)
        return KV_EINVAL;
    int rc = kv_remote_iov_len(iov, iovcnt, &len);
    if (rc)
        return rc;
    kv_pub_item_t *it = kv_mem_alloc(sizeof *it + len);
    if (!it) {
        kv_pub_count(p, KV_PC_DROPPED, 1);
        return KV_ENOMEM;
    }
    it->next = NULL;
    it->key = *key;
    it->format = format;
    it->len = len;
    size_t off = 0;
    for (int i = 0; i < iovcnt; off += iov[i++].iov_len)
        if (iov[i].iov_len)
            memcpy(it->data + off, iov[i].iov_base, iov[i].iov_len);
    pthread_mutex_lock(&p->mu);
    int full = p->items + 1 > p->max_items || p->bytes + len > p->max_bytes || p->stop;
    if (!full) {
        if (p->tail)
            p->tail->next = it;
        else
            p->head = it;
        p->tail = it;
        p->items++;
        p->bytes += len;
        p->seq_in++;
        pthread_cond_signal(&p->work);
    }
    pthread_mutex_unlock(&p->mu);
    if (full) {
        kv_item_free(it);
        kv_pub_count(p, KV_PC_DROPPED, 1);
        return KV_ELIMIT;
    }
    kv_pub_count(p, KV_PC_QUEUED, 1);
    return 0;
}

int kv_remote_pub_flush(kv_remote_pub_t *p, uint32_t timeout_ms)
{
    if (!p)
        return KV_EINVAL;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    uint64_t want = p->seq_in;
    while (p->seq_out < want && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&p->done, &p->mu, &until);
    int ok = p->seq_out >= want;
    pthread_mutex_unlock(&p->mu);
    return ok ? 0 : -ETIMEDOUT;
}

int kv_remote_pub_stats(kv_remote_pub_t *p, kv_remote_pub_stats_t *o)
{
    if (!p || !o)
        return KV_EINVAL;
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&p->mu);
    o->queue_items = p->items;
    o->queue_bytes = p->bytes;
    pthread_mutex_unlock(&p->mu);
    o->queued = atomic_load(&p->c[KV_PC_QUEUED]);
    o->dropped = atomic_load(&p->c[KV_PC_DROPPED]);
    o->published = atomic_load(&p->c[KV_PC_PUBLISHED]);
    o->failed = atomic_load(&p->c[KV_PC_FAILED]);
    o->discarded = atomic_load(&p->c[KV_PC_DISCARDED]);
    return kv_remote_stats(p->cli, &o->client);
}

void kv_remote_pub_destroy(kv_remote_pub_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    uint64_t left = 0;
    for (kv_pub_item_t *it = p->head, *nx; it; it = nx, left++) {
        nx = it->next;
        kv_item_free(it);
    }
    kv_pub_count(p, KV_PC_DISCARDED, left);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    kv_pub_free(p);
}
