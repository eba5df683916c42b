/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_uring.c — the io_uring I/O queue (liburing).
 *
 * One ring per page file. The staging region is registered as one fixed
 * buffer (index 0) and the file as fixed file 0, so transfers are
 * READ_FIXED/WRITE_FIXED on IOSQE_FIXED_FILE; if either registration fails
 * (memlock limit, old kernel) plain READ/WRITE on the fd are used instead.
 *
 * Counts: `queued` SQEs are prepared but not yet submitted; `inflight` were
 * submitted and their CQEs not yet reaped; `stashed` completions were taken
 * off the CQ by queue() (to unblock a refused submit) and wait in `stash`
 * for the next reap(); queued + inflight + stashed <= depth.
 * The SQ may be smaller than depth (ring_entries): queue() submits when the
 * SQ is full. The CQ is the kernel's default, 2 x SQ; when fewer entries
 * than inflight fit (a small ring on purpose), completions overflow into the
 * kernel's backlog (IORING_FEAT_NODROP): reap() sees IORING_SQ_CQ_OVERFLOW,
 * counts it, flushes the backlog (io_uring_get_events) and keeps reaping;
 * a submit refused with -EBUSY/-EAGAIN while the backlog exists is passed
 * up so the caller reaps first.
 */
#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <string.h>
#include <sys/uio.h>

#include "alloc/kv_mem.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload_ioq.h"

struct kv_offload_ioq {
    struct io_uring ring;
    uint32_t depth;         /* transfers outstanding at most              */
    uint32_t queued;        /* SQEs prepared, not submitted               */
    uint32_t inflight;      /* submitted, CQE not reaped                  */
    uint32_t stashed;       /* completions in stash[0..stashed)           */
    kv_offload_cqe_t *stash; /* [depth]                                   */
    int fd;                 /* the file (used when not fixed)             */
    int fixed;              /* 1: buffer 0 and file 0 are registered      */
    uint64_t overflows;     /* times IORING_SQ_CQ_OVERFLOW was seen       */
};

static int kv_uring_create(const kv_offload_ioq_cfg_t *cfg, kv_offload_ioq_t **out)
{
    kv_offload_ioq_t *e = kv_mem_calloc(1, sizeof *e);
    if (!e)
        return KV_ENOMEM;
    uint32_t entries = cfg->ring_entries ? cfg->ring_entries : cfg->depth;
    if (entries > cfg->depth)
        entries = cfg->depth;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int r = io_uring_queue_init_params(entries, &e->ring, &p);
    if (r < 0) {
        kv_mem_free(e, sizeof *e);
        return r;
    }
    e->depth = cfg->depth;
    e->fd = cfg->fd;
    e->stash = kv_mem_alloc((size_t)cfg->depth * sizeof *e->stash);
    if (!e->stash) {
        io_uring_queue_exit(&e->ring);
        kv_mem_free(e, sizeof *e);
        return KV_ENOMEM;
    }
    if (cfg->fixed) {
        struct iovec iov = {.iov_base = cfg->buf, .iov_len = cfg->buf_bytes};
        if (io_uring_register_buffers(&e->ring, &iov, 1) == 0) {
            if (io_uring_register_files(&e->ring, &cfg->fd, 1) == 0)
                e->fixed = 1;
            else
                io_uring_unregister_buffers(&e->ring);
        }
    }
    *out = e;
    return 0;
}

/* Submit what is queued; the kernel's count moves from queued to inflight. */
static int kv_uring_submit(kv_offload_ioq_t *e)
{
    while (e->queued) {
        int r = io_uring_submit(&e->ring);
        if (r == -EINTR)
            continue;
        if (r < 0)
            return r == -EBUSY ? -EAGAIN : r;
        if (r == 0)
            return -EAGAIN;
        assert((uint32_t)r <= e->queued);
        e->queued -= (uint32_t)r;
        e->inflight += (uint32_t)r;
    }
    return 0;
}

static void kv_uring_drain(kv_offload_ioq_t *e);

static void kv_uring_queue(kv_offload_ioq_t *e, int op, void *buf, uint32_t len,
                           uint64_t off, void *tag)
{
    assert(e->queued + e->inflight + e->stashed < e->depth);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    while (!sqe) {
        /* The SQ is full of prepared entries: hand them over. A submit
         * refused while completions back up is unblocked by moving CQEs to
         * the stash (they are returned by the next reap). */
        if (kv_uring_submit(e) < 0) {
            struct io_uring_cqe *cqe;
            if (e->inflight)
                io_uring_wait_cqe(&e->ring, &cqe);
            kv_uring_drain(e);
        }
        sqe = io_uring_get_sqe(&e->ring);
    }
    int fd = e->fixed ? 0 : e->fd;
    if (op == KV_OFFLOAD_OP_READ) {
        if (e->fixed)
            io_uring_prep_read_fixed(sqe, fd, buf, len, off, 0);
        else
            io_uring_prep_read(sqe, fd, buf, len, off);
    } else {
        if (e->fixed)
            io_uring_prep_write_fixed(sqe, fd, buf, len, off, 0);
        else
            io_uring_prep_write(sqe, fd, buf, len, off);
    }
    if (e->fixed)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, tag);
    e->queued++;
}

/* Take completions off the CQ (flushing an overflow backlog first):
 * into out[0..max), returning how many. */
static uint32_t kv_uring_take(kv_offload_ioq_t *e, kv_offload_cqe_t *out, uint32_t max)
{
    struct io_uring_cqe *cqes[64];
    if (max > 64)
        max = 64;
    if (io_uring_cq_has_overflow(&e->ring)) {
        e->overflows++;
        io_uring_get_events(&e->ring);
    }
    unsigned n = io_uring_peek_batch_cqe(&e->ring, cqes, max);
    for (unsigned i = 0; i < n; i++) {
        out[i].tag = io_uring_cqe_get_data(cqes[i]);
        out[i].res = cqes[i]->res;
    }
    io_uring_cq_advance(&e->ring, n);
    assert(n <= e->inflight);
    e->inflight -= n;
    return n;
}

/* Move every completion now in the CQ to the stash (room: see counts). */
static void kv_uring_drain(kv_offload_ioq_t *e)
{
    uint32_t n;
    do {
        n = kv_uring_take(e, e->stash + e->stashed, e->depth - e->stashed);
        e->stashed += n;
    } while (n && e->stashed < e->depth);
}

static int kv_uring_reap(kv_offload_ioq_t *e, int wait, kv_offload_cqe_t *out,
                         uint32_t max)
{
    if (max == 0)
        return 0;
    if (e->stashed) {
        uint32_t n = e->stashed < max ? e->stashed : max;
        memcpy(out, e->stash + (e->stashed - n), n * sizeof *out);
        e->stashed -= n;
        return (int)n;
    }
    if (e->inflight == 0)
        return 0;
    for (;;) {
        uint32_t n = kv_uring_take(e, out, max);
        if (n)
            return (int)n;
        if (!wait)
            return 0;
        struct io_uring_cqe *cqe;
        int r = io_uring_wait_cqe(&e->ring, &cqe);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -ETIME)
            return r;
    }
}

static void kv_uring_destroy(kv_offload_ioq_t *e)
{
    if (!e)
        return;
    kv_offload_cqe_t c[64];
    while (e->queued && kv_uring_submit(e) == 0)
        ;
    while (e->inflight || e->stashed) {
        if (kv_uring_reap(e, 1, c, 64) < 0)
            break;
    }
    io_uring_queue_exit(&e->ring);
    kv_mem_free(e->stash, (size_t)e->depth * sizeof *e->stash);
    kv_mem_free(e, sizeof *e);
}

static int kv_uring_fixed(const kv_offload_ioq_t *e)
{
    return e->fixed;
}

static uint64_t kv_uring_overflows(const kv_offload_ioq_t *e)
{
    return e->overflows;
}

const kv_offload_ioq_ops_t kv_offload_ioq_uring = {
    .name = "uring",
    .create = kv_uring_create,
    .destroy = kv_uring_destroy,
    .queue = kv_uring_queue,
    .submit = kv_uring_submit,
    .reap = kv_uring_reap,
    .fixed = kv_uring_fixed,
    .cq_overflows = kv_uring_overflows,
};
