/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_pread.c — the fallback I/O queue: pread(2)/pwrite(2), one transfer
 * at a time, for kernels without io_uring (or when configured).
 *
 * queue() only records the transfer; submit() performs every recorded one,
 * synchronously and in order, and keeps each result as a completion; reap()
 * hands completions out. Results are exactly what the syscall returned
 * (bytes, possibly short, or -errno): no retry here, the caller does that
 * the same way for both I/O queues. pending + done <= depth at all times.
 */
#include <assert.h>
#include <errno.h>
#include <unistd.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload_ioq.h"

typedef struct kv_pread_req {
    int op;
    void *buf;
    uint32_t len;
    uint64_t off;
    void *tag;
} kv_pread_req_t;

struct kv_offload_ioq {
    int fd;
    uint32_t depth;
    kv_pread_req_t *pending;   /* [depth] queued, not yet performed      */
    uint32_t n_pending;
    kv_offload_cqe_t *done;    /* [depth] performed, not yet reaped      */
    uint32_t n_done;
};

static void kv_pread_destroy(kv_offload_ioq_t *e)
{
    if (!e)
        return;
    kv_mem_free(e->pending, (size_t)e->depth * sizeof *e->pending);
    kv_mem_free(e->done, (size_t)e->depth * sizeof *e->done);
    kv_mem_free(e, sizeof *e);
}

static int kv_pread_create(const kv_offload_ioq_cfg_t *cfg, kv_offload_ioq_t **out)
{
    kv_offload_ioq_t *e = kv_mem_calloc(1, sizeof *e);
    if (!e)
        return KV_ENOMEM;
    e->fd = cfg->fd;
    e->depth = cfg->depth;
    e->pending = kv_mem_alloc((size_t)cfg->depth * sizeof *e->pending);
    e->done = kv_mem_alloc((size_t)cfg->depth * sizeof *e->done);
    if (!e->pending || !e->done) {
        kv_pread_destroy(e);
        return KV_ENOMEM;
    }
    *out = e;
    return 0;
}

static void kv_pread_queue(kv_offload_ioq_t *e, int op, void *buf, uint32_t len,
                           uint64_t off, void *tag)
{
    assert(e->n_pending + e->n_done < e->depth);
    e->pending[e->n_pending++] = (kv_pread_req_t){op, buf, len, off, tag};
}

static int kv_pread_submit(kv_offload_ioq_t *e)
{
    for (uint32_t i = 0; i < e->n_pending; i++) {
        const kv_pread_req_t *q = &e->pending[i];
        ssize_t r = q->op == KV_OFFLOAD_OP_READ ? pread(e->fd, q->buf, q->len, (off_t)q->off)
                                                : pwrite(e->fd, q->buf, q->len, (off_t)q->off);
        e->done[e->n_done++] = (kv_offload_cqe_t){q->tag, r < 0 ? -errno : (int)r};
    }
    e->n_pending = 0;
    return 0;
}

static int kv_pread_reap(kv_offload_ioq_t *e, int wait, kv_offload_cqe_t *out,
                         uint32_t max)
{
    (void)wait; /* nothing is ever in flight in the kernel */
    uint32_t n = e->n_done < max ? e->n_done : max;
    for (uint32_t i = 0; i < n; i++)
        out[i] = e->done[e->n_done - n + i];
    e->n_done -= n;
    return (int)n;
}

static int kv_pread_fixed(const kv_offload_ioq_t *e)
{
    (void)e;
    return 0;
}

static uint64_t kv_pread_overflows(const kv_offload_ioq_t *e)
{
    (void)e;
    return 0;
}

const kv_offload_ioq_ops_t kv_offload_ioq_pread = {
    .name = "pread",
    .create = kv_pread_create,
    .destroy = kv_pread_destroy,
    .queue = kv_pread_queue,
    .submit = kv_pread_submit,
    .reap = kv_pread_reap,
    .fixed = kv_pread_fixed,
    .cq_overflows = kv_pread_overflows,
};
