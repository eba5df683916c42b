/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_int.h — internals of a page file shared by its sources:
 *   kv_offload.c        create/open/close, slots, free, list, stats
 *   kv_offload_io.c     batches: submit, issue, completion, verification
 *   kv_offload_index.c  the index file: atomic write, read at open
 * Nothing outside offload/kv_offload*.c includes it.
 *
 * Invariants (under f->lock):
 *   - recs[i].state != FREE  <=>  slot index i is held in f->pool;
 *     a WRITING slot has exactly one write in flight; readers counts the
 *     reads in flight on a VALID slot; free_pending slots are released when
 *     their last I/O completes and cannot be read meanwhile.
 *   - every kv_offload_io_t is on io_free, or owned by exactly one of: the
 *     I/O queue (ioq_out counts these, ioq_out <= qd), the synth list (the shim
 *     completed it without the kernel), the done list (reaped, its data not
 *     yet checked), the redo list (waiting to be (re)issued);
 *     ios_out == n_ios - length(io_free). An io owns stage units
 *     [stage, stage + count) until its completion is processed.
 *   - n_ios = 2 x qd io records (and stage units to match): while the
 *     pages of reaped I/Os are checked and copied, replacements are already
 *     in the kernel, so a slow or preempted CPU does not idle the device.
 *   - batches: every submitted batch not yet reported, in submit order;
 *     `issue` is the first one with pages not yet handed to an io (NULL if
 *     none); a batch is reported only when remaining == 0, so it is never
 *     `issue` then.
 */
#ifndef KV_OFFLOAD_INT_H
#define KV_OFFLOAD_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/kv_offload.h"
#include "offload/kv_offload_disk.h"
#include "offload/kv_offload_ioq.h"
#include "offload/kv_offload_shim.h"
#include "offload/kv_offload_stage.h"

enum { KV_SLOT_FREE = 0, KV_SLOT_WRITING = 1, KV_SLOT_VALID = 2 };

typedef struct kv_offload_slotrec {   /* what the file knows of one slot   */
    uint64_t key;
    uint64_t generation;
    uint64_t serial;                  /* stamped by the file at write      */
    uint64_t owner;                   /* owner id of the writer            */
    uint32_t bytes;                   /* payload bytes                     */
    uint32_t tokens;
    uint32_t readers;                 /* reads in flight                   */
    uint8_t format;
    uint8_t state;                    /* KV_SLOT_*                         */
    uint8_t free_pending;             /* freed while I/O was in flight     */
    uint8_t mark;                     /* scratch for duplicate checks      */
} kv_offload_slotrec_t;

typedef struct kv_offload_batch kv_offload_batch_t;

typedef struct kv_offload_io {        /* one I/O: `count` adjacent slots   */
    struct kv_offload_io *next;       /* free / synth / redo list link     */
    kv_offload_batch_t *batch;
    uint8_t *buf;                     /* staging address of byte 0         */
    uint64_t off;                     /* file offset of byte 0             */
    uint32_t len;                     /* bytes = count * slot_bytes        */
    uint32_t done;                    /* bytes transferred so far          */
    uint32_t piece;                   /* bytes asked by the current issue  */
    uint32_t first;                   /* its pages: batch->order[first..]  */
    uint32_t count;                   /* pages = slots = stage units       */
    uint32_t stage;                   /* first stage unit                  */
    int res;                          /* synthetic result (synth list)     */
    uint16_t retries;                 /* retries of the current transfer   */
    uint8_t op;                       /* KV_OFFLOAD_OP_*                   */
    uint8_t lie;                      /* shim: torn, report piece          */
    uint8_t flip;                     /* shim: flip a bit once read        */
} kv_offload_io_t;

struct kv_offload_batch {
    kv_offload_batch_t *next;         /* open batches, submit order        */
    kv_offload_ticket_t ticket;
    uint8_t op;
    uint32_t n;                       /* pages                             */
    uint32_t issued;                  /* order[0..issued) handed to ios    */
    uint32_t remaining;               /* pages not yet completed           */
    uint64_t *order;                  /* [n] slot index << 32 | page, sorted */
    kv_offload_wpage_t *w;            /* [n] copy of the pages (write)     */
    kv_offload_rpage_t *r;            /* [n] copy of the requests (read)   */
    kv_offload_slot_t *slot;          /* [n] slot of each page             */
    int *status;                      /* [n] result of each page           */
    kv_offload_slot_t *slots_out;     /* caller's [n] (write)              */
    int *status_out;                  /* caller's [n] or NULL              */
    size_t mem_bytes;                 /* this struct + arrays, one block   */
};

struct kv_offload_file {
    pthread_mutex_t lock;
    int lock_fd;                      /* page file, buffered, holding its  */
                                      /* OFD write lock for f's whole life */
    int fd;                           /* page file, for the engine         */
    int direct;                       /* fd has O_DIRECT                   */
    char *path;                       /* page file path (kv_mem)           */
    size_t path_bytes;
    kv_offload_sb_t sb;               /* geometry, file id, owner (= ours) */
    kv_alloc_pool_t *pool;            /* slot ids, tier FILE, no tcache    */
    uint32_t id_base;                 /* slot id = id_base | index         */
    kv_offload_slotrec_t *recs;       /* [capacity]                        */
    uint64_t next_serial;
    uint32_t qd;                      /* transfers in the kernel at most   */
    uint32_t n_ios;                   /* io records, 2 x qd                */
    uint32_t max_run;                 /* slots per io at most              */
    kv_offload_stage_t stage;
    const kv_offload_ioq_ops_t *ops;
    kv_offload_ioq_t *ioq;
    kv_offload_shim_t shim;
    kv_offload_io_t *ios;             /* [n_ios]                           */
    kv_offload_io_t *io_free;
    uint32_t ios_out;
    uint32_t ioq_out;                 /* transfers the I/O queue owns      */
    uint32_t eng_queued;              /* queued since the last submit      */
    kv_offload_io_t *synth_head, *synth_tail;
    kv_offload_io_t *redo_head, *redo_tail;
    kv_offload_io_t *done_head, *done_tail; /* reaped; res in io->res      */
    kv_offload_batch_t *batches, *batches_tail;
    kv_offload_batch_t *issue;
    kv_offload_ticket_t next_ticket;
    uint64_t n_batches;
    kv_offload_stats_t st;            /* counters (the rest filled on demand) */
};

static inline uint32_t kv_offload_slot_index(kv_offload_slot_t s)
{
    return kv_alloc_page_index(s);
}

/* The on-disk identity of slot idx, from its record. */
static inline kv_offload_meta_t kv_offload_rec_meta(const kv_offload_file_t *f, uint32_t idx)
{
    const kv_offload_slotrec_t *rec = &f->recs[idx];
    return (kv_offload_meta_t){.key = rec->key, .generation = rec->generation,
                               .serial = rec->serial, .slot = idx, .tokens = rec->tokens,
                               .bytes = rec->bytes, .format = rec->format,
                               .owner = rec->owner};
}

/* kv_offload_io.c */
int  kv_offload_io_init(kv_offload_file_t *f);   /* ios array, free list */
void kv_offload_io_fini(kv_offload_file_t *f);
/* Finish every open batch and free them all (close/crash). */
void kv_offload_io_drain(kv_offload_file_t *f);
/* Hand a slot back to the pool and clear its record. */
void kv_offload_slot_release(kv_offload_file_t *f, uint32_t idx);

/* kv_offload.c: KV_EBUSY unless the superblock on disk still names f as
 * its owner (another store took the file over where locks do not work);
 * KV_ECORRUPT if it no longer reads; -errno. */
int kv_offload_owner_check(kv_offload_file_t *f);

/* kv_offload_index.c: write checks the owner first (KV_EBUSY). */
int kv_offload_index_write(kv_offload_file_t *f);
int kv_offload_index_read(kv_offload_file_t *f);
/* fsync the directory holding path: 0, -errno, KV_ENOMEM. */
int kv_offload_fsync_dir(const char *path);
/* "<path><suffix>" in a kv_mem block of *bytes bytes (NULL: KV_ENOMEM). */
char *kv_offload_path_with(const char *path, const char *suffix, size_t *bytes);

#endif /* KV_OFFLOAD_INT_H */
