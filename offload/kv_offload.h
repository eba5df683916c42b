/* SPDX-License-Identifier: MIT */
/*
 * kv_offload.h — the page-file tier: whole pages, in their stored
 * (compressed) form, written to and read back from a file on NVMe, with a
 * checksum on every page and an index that survives a restart.
 *
 * A page file has a fixed number of slots (capacity), each holding one page
 * of up to page_bytes payload bytes. Slot ids come from an id-only kv_alloc
 * pool (tier KV_TIER_FILE): the same allocator as every other tier.
 *
 * On disk (all integers little-endian; see kv_offload_disk.h for the bytes):
 *   [superblock, data_off bytes][slot 0][slot 1]...[slot capacity-1]
 *   slot = 64-byte header {magic, version, format, key, generation, serial,
 *          slot index, tokens, payload bytes, file id, crc32c} + payload,
 *          zero-padded to slot_bytes = round_up(64 + page_bytes, align).
 *   The crc32c covers the header (crc field zeroed) and the payload bytes.
 *   align = the file's O_DIRECT alignment: statx STATX_DIOALIGN
 *   (max of stx_dio_mem_align, stx_dio_offset_align) when reported, else 4096.
 *   "<path>.idx" = the index: every slot that holds a page, with its key,
 *   generation, serial, format, tokens and bytes; crc32c over the whole file.
 *   It is replaced atomically (write "<path>.idx.tmp", fsync, rename, fsync
 *   of the directory) by kv_offload_sync() and kv_offload_close().
 *
 * One owner: a file object holds an OFD write lock over the whole page file
 * from create/open until it is freed (close, crash, or the process's end),
 * so a second create/open of the same file -- in another process or in
 * this one -- fails with KV_EBUSY instead of allocating the same slots as
 * the first. Each create/open also draws a random owner id, writes it into
 * the superblock and stamps it on every slot it writes (recorded in the
 * index): where the filesystem has no OFD locks, a slot written by another
 * owner never passes a read's check, and a sync that finds another owner in
 * the superblock fails with KV_EBUSY instead of replacing that owner's
 * index. A child of fork() shares the lock until it exits or execs.
 *
 * Creation cannot be wedged by a crash: the file is built under
 * "<path>.new" (locked), reserved, given its superblock and index, then
 * renamed to <path> (never over an existing file); a crash leaves at most
 * "<path>.new" and "<path>.idx", which the next create replaces.
 *
 * A read checks the header against what the file recorded for the slot (key,
 * generation, serial, slot index, format, tokens, bytes, file id) and the
 * crc; a page that fails is reported as KV_ECORRUPT and its bytes are never
 * copied to the caller's buffer.
 *
 * I/O: an I/O queue behind an ops table: io_uring (registered staging buffers
 * and registered file, adjacent slots coalesced into one I/O, up to
 * queue_depth I/Os in flight, short transfers resubmitted, -EAGAIN/-EINTR
 * retried, CQ overflow reaped) or a pread/pwrite fallback with the same
 * behaviour, chosen by config or automatically when io_uring is unavailable.
 * A fault-injection shim between the I/O queue and the kernel (config.fault)
 * can inject EIO, ENOSPC, short transfers, torn writes, bit flips, EAGAIN
 * and EINTR at a seeded rate.
 *
 * Asynchrony and ownership: *_submit() queues a batch and returns a ticket
 * without waiting; kv_offload_poll()/kv_offload_wait() make progress, and the
 * batch is complete when one of them reports it (the ticket is then spent).
 * From submit until that report, the batch owns everything the caller handed
 * it: every page's data buffer (read from for writes, written to for reads),
 * the status[] and slots[] arrays. The library does not keep pointers to the
 * descriptor arrays themselves (pages[], reqs[]): it copies them at submit.
 * Progress happens only inside calls on the file (submit, poll, wait,
 * close), each doing a bounded amount of work except wait: with io_uring up
 * to queue_depth I/Os run in the kernel meanwhile, and a batch needing more
 * I/Os than that continues at the next call. The pread I/O queue does its I/O
 * synchronously inside those calls.
 *
 * Errors: 0 or a negative KV_E* code; -errno from the kernel passes through
 * unchanged (e.g. -EIO, -ENOSPC); an unexpected end of file or a transfer
 * that makes no progress is KV_EIO. Calls with bad arguments change nothing.
 * A full file (no free slot for a whole batch) is -ENOSPC, nothing written.
 *
 * Threads: every function may be called from any thread; calls on one file
 * are serialized by its mutex (kv_offload_wait holds it while it blocks).
 * Files are independent of each other.
 */
#ifndef KV_OFFLOAD_H
#define KV_OFFLOAD_H

#include <stdint.h>

#include "alloc/kv_alloc.h"
#include "util/kv_rec.h" /* KV_REC_PF_SLOT_BYTES: the slot header on disk */

typedef struct kv_offload_file kv_offload_file_t;
typedef kv_page_id_t kv_offload_slot_t; /* from the file's pool; 0 = none     */
typedef uint64_t kv_offload_ticket_t;   /* one submitted batch; never 0       */

#define KV_OFFLOAD_MAX_PAGE_BYTES (16u << 20)  /* largest page_bytes          */
#define KV_OFFLOAD_MAX_QD 4096u                /* largest queue_depth         */

typedef enum kv_offload_ioq_kind {
    KV_OFFLOAD_IOQ_AUTO  = 0, /* io_uring if it initialises (any error:    */
                                 /* -ENOSYS, -EPERM, memlock...), else pread */
    KV_OFFLOAD_IOQ_URING = 1, /* io_uring only (error if unavailable)      */
    KV_OFFLOAD_IOQ_PREAD = 2, /* pread/pwrite fallback                     */
} kv_offload_ioq_kind_t;

/* Injected faults. Each I/O the queue is about to hand the kernel draws one
 * number; kind k is injected with probability ppm[k] / 1e6 (the sum of all
 * ppm must be <= 1e6); a kind that does not apply (ENOSPC or TORN on a read,
 * SHORT on an I/O of one alignment unit) injects nothing. */
typedef enum kv_offload_fault_kind {
    KV_OFFLOAD_FAULT_EIO    = 0, /* fails with -EIO, nothing transferred        */
    KV_OFFLOAD_FAULT_ENOSPC = 1, /* a write fails with -ENOSPC                  */
    KV_OFFLOAD_FAULT_SHORT  = 2, /* transfers an aligned prefix, reports it     */
    KV_OFFLOAD_FAULT_TORN   = 3, /* a write stores an aligned prefix (maybe     */
                                 /* empty) yet reports success: a crash         */
    KV_OFFLOAD_FAULT_FLIP   = 4, /* one bit flipped in the bytes written/read   */
    KV_OFFLOAD_FAULT_EAGAIN = 5, /* transient -EAGAIN (retried)                 */
    KV_OFFLOAD_FAULT_EINTR  = 6, /* transient -EINTR (retried)                  */
    KV_OFFLOAD_FAULT_COUNT  = 7,
} kv_offload_fault_kind_t;

typedef struct kv_offload_fault {
    uint64_t seed;                           /* PRNG seed (0 is a valid seed) */
    uint32_t ppm[KV_OFFLOAD_FAULT_COUNT];    /* per-I/O rate, parts/million   */
} kv_offload_fault_t;

/* kv_offload_config_t.flags */
#define KV_OFFLOAD_BUFFERED 0x1u /* do not use O_DIRECT                        */
#define KV_OFFLOAD_NO_FIXED 0x2u /* io_uring: no registered buffers / file     */
#define KV_OFFLOAD_NO_LOCK  0x4u /* testing: take no owner lock, as on a       */
                                 /* filesystem without OFD locks               */

/* The name a page file is built under before kv_offload_create renames it. */
#define KV_OFFLOAD_NEW_SUFFIX ".new"

typedef struct kv_offload_config {
    uint32_t page_bytes;    /* create: payload bytes per slot, a multiple of  */
                            /* 64, 64..KV_OFFLOAD_MAX_PAGE_BYTES; open: 0 or   */
                            /* the file's value                               */
    uint32_t capacity;      /* create: slots, 1..KV_ALLOC_MAX_PAGES; open: -   */
    uint32_t ioq;           /* kv_offload_ioq_kind_t                          */
    uint32_t queue_depth;   /* I/Os in flight, 1..KV_OFFLOAD_MAX_QD; 0 = 64    */
    uint32_t ring_entries;  /* io_uring SQ entries; 0 = queue_depth. Smaller   */
                            /* than queue_depth/2 lets the CQ overflow (tests) */
    uint32_t max_io_bytes;  /* largest coalesced I/O, bytes; 0 = 256 KiB;     */
                            /* never less than one slot                       */
    uint64_t staging_bytes; /* registered staging memory; 0 = 2 x queue_depth  */
                            /* I/Os of max_io_bytes, at most 64 MiB            */
    uint32_t align;         /* create: 0 = from statx, else a power of two     */
                            /* 512..65536 (raised to the device's if smaller)  */
    uint32_t flags;         /* KV_OFFLOAD_*                                   */
    kv_offload_fault_t fault; /* all ppm 0: no injection                      */
} kv_offload_config_t;

/* Defaults: I/O queue AUTO, queue_depth 64, everything else 0 (auto/none). */
kv_offload_config_t kv_offload_config_default(void);

/* ---- files ------------------------------------------------------------------ */

/* Create a page file at path (it must not exist: -EEXIST, or -EISDIR for a
 * directory) with cfg->capacity slots of cfg->page_bytes, its full size
 * reserved (fallocate), and an empty index; built under "<path>.new" and
 * renamed (above), the owner lock held from the start. A "<path>.new" left
 * by a crash is replaced. O_DIRECT is used unless the filesystem refuses it
 * (then buffered: stats.direct == 0) or KV_OFFLOAD_BUFFERED is set. On
 * error nothing is left behind. Errors: KV_EINVAL, KV_ERANGE (a config
 * field), KV_EBUSY (another create of path is at work), KV_ENOTSUP
 * (IOQ_URING without io_uring), KV_ENOMEM, -errno. */
int kv_offload_create(const char *path, const kv_offload_config_t *cfg,
                      kv_offload_file_t **out);

/* Open an existing page file and its index; every slot named by the index
 * is held (listed by kv_offload_list), every other slot is free. Geometry
 * comes from the file; cfg gives the I/O queue, its depth and the faults. Takes
 * the owner lock before reading anything, and writes a new owner id into
 * the superblock as its last step (a failed open leaves the file as it was).
 * Errors: KV_EBUSY (another file object, in this process or another, owns
 * it), KV_ECORRUPT (superblock or index fails its checks, index missing,
 * file shorter than its geometry), KV_EINVAL (also: not a regular file),
 * KV_ERANGE (cfg->page_bytes differs from the file's), KV_ENOTSUP,
 * KV_ENOMEM, -errno (-ENOENT, -EISDIR, ...). */
int kv_offload_open(const char *path, const kv_offload_config_t *cfg,
                    kv_offload_file_t **out);

/* Finish every outstanding batch (their results are discarded; tickets not
 * yet reported become invalid), write the index (kv_offload_sync), and free
 * the file. NULL: no-op, 0. Returns the sync's error; the file is freed in
 * every case. */
int kv_offload_close(kv_offload_file_t *f);

/* Like close but without writing the index: the file is left as a crash
 * would leave it after the last completed I/O (tests, and callers that will
 * delete the file). NULL: no-op. */
void kv_offload_crash(kv_offload_file_t *f);

/* Make every page whose write has completed durable: fdatasync the page
 * file, then replace the index atomically. Pages whose writes are still in
 * flight are not in the new index. Errors (the old index stays): KV_EBUSY
 * (the superblock names another owner: the file was taken over),
 * KV_ECORRUPT (the superblock no longer reads), -errno. */
int kv_offload_sync(kv_offload_file_t *f);

/* Remove a page file and its index (and a leftover temporary index or
 * "<path>.new"). Errors: -errno of the page file's unlink. */
int kv_offload_unlink(const char *path);

/* ---- pages -------------------------------------------------------------- */

typedef struct kv_offload_wpage {  /* one page to write                     */
    uint64_t key;        /* the caller's name for the page (opaque)          */
    uint64_t generation; /* the caller's version of it (opaque)              */
    const void *data;    /* [bytes] the page as stored (compressed form)     */
    uint32_t bytes;      /* payload bytes, 1..page_bytes                     */
    uint32_t tokens;     /* tokens in the page (stored, not interpreted)     */
    uint32_t format;     /* kv_format_t tag, 0..255 (stored, not interpreted)*/
} kv_offload_wpage_t;

typedef struct kv_offload_rpage {  /* one page to read                      */
    kv_offload_slot_t slot; /* a held slot whose write has completed         */
    uint64_t key;           /* must equal the slot's key                     */
    uint64_t generation;    /* must equal the slot's generation              */
    void *data;             /* receives the payload ([page_bytes] suffices)  */
} kv_offload_rpage_t;

typedef struct kv_offload_entry {  /* what a slot holds                     */
    kv_offload_slot_t slot;
    uint32_t bytes;         /* payload bytes                                 */
    uint64_t key;
    uint64_t generation;
    uint32_t tokens;
    uint32_t format;
} kv_offload_entry_t;

/* Write n pages (1..2^24) into n newly allocated slots, all or nothing for
 * the allocation: -ENOSPC if fewer than n slots are free, or fewer than n
 * write serials are left (kv_offload_disk.h; nothing taken).
 * slots[n] (required) receives the slot ids at once; status[n] (or NULL)
 * receives each page's result at completion: 0, or an error, in which case
 * the slot was freed again and slots[i] is set to 0. A slot whose write
 * succeeded is held until kv_offload_free. *ticket names the batch.
 * Errors (nothing queued): KV_EINVAL (NULL, bytes 0 or > page_bytes,
 * format > 255), KV_ERANGE (n), -ENOSPC, KV_ENOMEM. */
int kv_offload_write_submit(kv_offload_file_t *f, const kv_offload_wpage_t *pages,
                            uint32_t n, kv_offload_slot_t *slots, int *status,
                            kv_offload_ticket_t *ticket);

/* Read n pages (1..2^24). status[n] (or NULL) receives each page's result:
 * 0 (payload copied to data), KV_ECORRUPT (the check failed: data untouched),
 * or an I/O error (data untouched). Errors (nothing queued): KV_EINVAL (NULL
 * or a bad slot id), KV_ERANGE (n), KV_ESTATE (a slot not holding a completed
 * page, being freed, or key/generation not the slot's), KV_ENOMEM. */
int kv_offload_read_submit(kv_offload_file_t *f, const kv_offload_rpage_t *reqs,
                           uint32_t n, int *status, kv_offload_ticket_t *ticket);

/* Progress without blocking. Returns 1 while the batch is still running;
 * once it is complete, spends the ticket and returns what kv_offload_wait
 * would. KV_ENOENT: unknown or spent ticket. */
int kv_offload_poll(kv_offload_file_t *f, kv_offload_ticket_t ticket);

/* Block until the batch is complete; spend the ticket. Returns 0 if every
 * page succeeded, else the first failing page's status (in page order).
 * KV_ENOENT: unknown or spent ticket. */
int kv_offload_wait(kv_offload_file_t *f, kv_offload_ticket_t ticket);

/* Synchronous forms: submit + wait. */
int kv_offload_write(kv_offload_file_t *f, const kv_offload_wpage_t *pages,
                     uint32_t n, kv_offload_slot_t *slots, int *status);
int kv_offload_read(kv_offload_file_t *f, const kv_offload_rpage_t *reqs,
                    uint32_t n, int *status);

/* Free n held slots. All ids are checked first (KV_EINVAL: not this file's;
 * KV_ESTATE: not held, already being freed, or listed twice; nothing is
 * freed then). A slot with an I/O in flight is freed when its last I/O
 * completes; until then it cannot be read. */
int kv_offload_free(kv_offload_file_t *f, const kv_offload_slot_t *slots,
                    uint32_t n);

/* What a held, completed slot holds. KV_EINVAL (bad id), KV_ESTATE (free,
 * being written or being freed). */
int kv_offload_info(kv_offload_file_t *f, kv_offload_slot_t slot,
                    kv_offload_entry_t *out);

/* Every held slot with a completed write, sorted by key then generation
 * then slot: up to cap entries into out (out may be NULL when cap is 0);
 * *n = how many there are in all. */
int kv_offload_list(kv_offload_file_t *f, kv_offload_entry_t *out, uint64_t cap,
                    uint64_t *n);

/* Replace the fault-injection settings (e.g. write clean, then read with
 * faults). KV_EINVAL: ppm sum > 1e6. */
int kv_offload_set_fault(kv_offload_file_t *f, const kv_offload_fault_t *fault);

/* Coalesce at most max_io_bytes per I/O from now on (at least one slot, at
 * most the staging memory): I/Os already built keep their size. Fault runs
 * use one slot per I/O so that every page meets the shim. KV_EINVAL: NULL. */
int kv_offload_set_max_io(kv_offload_file_t *f, uint32_t max_io_bytes);

/* ---- statistics ---------------------------------------------------------- */

typedef struct kv_offload_stats {
    const char *ioq;          /* "uring" or "pread"                           */
    uint32_t direct;          /* 1: O_DIRECT; 0: buffered (fallback or flag)  */
    uint32_t fixed;           /* io_uring: registered buffers + file in use   */
    uint32_t page_bytes;      /* payload bytes per slot                       */
    uint32_t slot_bytes;      /* bytes per slot on disk                       */
    uint32_t align;           /* alignment of offsets/lengths/buffers, bytes  */
    uint32_t queue_depth;     /* I/Os in flight at most                       */
    uint32_t max_run;         /* slots per coalesced I/O at most              */
    uint32_t staging_units;   /* staging buffers, slot_bytes each             */
    uint64_t data_off;        /* file offset of slot 0, bytes                 */
    uint64_t owner;           /* this file object's owner id (superblock)     */
    uint64_t capacity;        /* slots                                        */
    uint64_t slots_used;      /* held slots (incl. being written / freed)     */
    uint64_t slots_free;      /* capacity - slots_used                        */
    uint64_t staging_used;    /* staging units owned by I/Os now              */
    uint64_t ios_inflight;    /* I/Os started and not yet finished            */
    uint64_t ios_peak;        /* high-water mark of transfers in the kernel   */
    uint64_t batches_open;    /* submitted batches not yet reported           */
    uint64_t pages_written;   /* page writes completed OK                     */
    uint64_t pages_read;      /* page reads completed and verified            */
    uint64_t pages_corrupt;   /* page reads that failed verification          */
    uint64_t pages_failed;    /* page reads/writes failed with an I/O error   */
    uint64_t ios;             /* transfers handed to the queue (incl. rest)    */
    uint64_t ios_coalesced;   /* I/Os covering more than one slot             */
    uint64_t bytes_written;   /* bytes transferred to the file                */
    uint64_t bytes_read;      /* bytes transferred from the file              */
    uint64_t short_resubmits; /* short transfers whose rest was resubmitted   */
    uint64_t retries;         /* -EAGAIN / -EINTR / no-progress retries       */
    uint64_t cq_overflows;    /* times the CQ had overflowed when reaped      */
    uint64_t faults[KV_OFFLOAD_FAULT_COUNT]; /* injected, by kind             */
} kv_offload_stats_t;

void kv_offload_stats(kv_offload_file_t *f, kv_offload_stats_t *out);

/* Metadata bytes a file of `capacity` slots holds (slot records, slot
 * pool), staging buffers aside: for estimates before creating one. */
uint64_t kv_offload_meta_bytes(uint32_t capacity);

/* The file's slot pool (read-only use: stats, id checks). */
const kv_alloc_pool_t *kv_offload_pool(const kv_offload_file_t *f);

/* A key for a page of the page table: sequence (24 bits), layer (12),
 * kv_head (10), index of the page in its list (18). Callers may use any
 * other key scheme; the file does not interpret keys. */
static inline uint64_t kv_offload_key(uint32_t seq, uint32_t layer,
                                      uint32_t head, uint32_t index)
{
    return ((uint64_t)(seq & 0xFFFFFFu) << 40) | ((uint64_t)(layer & 0xFFFu) << 28) |
           ((uint64_t)(head & 0x3FFu) << 18) | (uint64_t)(index & 0x3FFFFu);
}

#endif /* KV_OFFLOAD_H */
