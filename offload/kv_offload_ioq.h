/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_ioq.h — the I/O queues of the page file: an ops table with
 * two implementations (io_uring, pread/pwrite), and nothing else.
 *
 * An I/O queue moves bytes between a staging region (fixed at create; with
 * io_uring it is registered as fixed buffers) and one file descriptor (with
 * io_uring, registered as a fixed file). It knows nothing of pages, slots or
 * checksums: the caller (kv_offload_io.c) queues transfers, submits them,
 * and reaps completions, each carrying the tag it was queued with and the
 * kernel's result: bytes transferred (possibly fewer than asked) or -errno.
 * Retrying, resubmitting the rest of a short transfer and fault injection
 * are the caller's business, the same for both I/O queues.
 *
 * Contract: at most `depth` transfers are outstanding (queued + submitted
 * and not reaped) at any time; queue() beyond that is a caller bug (assert).
 * reap(wait=1) with nothing outstanding returns 0 at once. Not thread-safe:
 * the owning file serializes calls.
 */
#ifndef KV_OFFLOAD_IOQ_H
#define KV_OFFLOAD_IOQ_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_offload_ioq kv_offload_ioq_t; /* ioq-private state */

enum { KV_OFFLOAD_OP_READ = 0, KV_OFFLOAD_OP_WRITE = 1 };

typedef struct kv_offload_ioq_cfg {
    int fd;                 /* the page file                               */
    void *buf;              /* staging region (every transfer lies in it)  */
    size_t buf_bytes;
    uint32_t depth;         /* transfers outstanding at most               */
    uint32_t ring_entries;  /* io_uring SQ entries (<= depth), 0 = depth   */
    int fixed;              /* io_uring: try registered buffers + file     */
} kv_offload_ioq_cfg_t;

typedef struct kv_offload_cqe {
    void *tag;              /* as given to queue()                         */
    int res;                /* bytes transferred, or -errno                */
} kv_offload_cqe_t;

typedef struct kv_offload_ioq_ops {
    const char *name;       /* "uring", "pread"                            */
    /* -ENOSYS/-EPERM etc. when the I/O queue cannot run here, KV_ENOMEM. */
    int (*create)(const kv_offload_ioq_cfg_t *cfg, kv_offload_ioq_t **out);
    /* Waits for (and drops) whatever is still outstanding, then frees. */
    void (*destroy)(kv_offload_ioq_t *e);
    /* Queue one transfer of len bytes at file offset off, from/to buf. */
    void (*queue)(kv_offload_ioq_t *e, int op, void *buf, uint32_t len,
                  uint64_t off, void *tag);
    /* Hand every queued transfer to the kernel: 0, or -EAGAIN/-EBUSY (reap
     * some completions, then submit again), or another -errno. */
    int (*submit)(kv_offload_ioq_t *e);
    /* Up to max completions into out; with wait, block until at least one
     * when anything is outstanding. Returns the count or -errno. */
    int (*reap)(kv_offload_ioq_t *e, int wait, kv_offload_cqe_t *out, uint32_t max);
    /* 1 if registered buffers and file are in use. */
    int (*fixed)(const kv_offload_ioq_t *e);
    /* Times the completion queue was found overflowed. */
    uint64_t (*cq_overflows)(const kv_offload_ioq_t *e);
} kv_offload_ioq_ops_t;

extern const kv_offload_ioq_ops_t kv_offload_ioq_uring;
extern const kv_offload_ioq_ops_t kv_offload_ioq_pread;

#endif /* KV_OFFLOAD_IOQ_H */
