/* SPDX-License-Identifier: MIT */
/*
 * kv_store_int.h — the store object, shared by the store/ files that
 * implement the public API (kv_store.c: store, sequences, attention; others:
 * formats, policies). Not part of the public API.
 *
 * Ownership: the store owns pool, page table and backend.
 */
#ifndef KV_STORE_INT_H
#define KV_STORE_INT_H

#include <pthread.h>

#include "alloc/kv_alloc.h"
#include "kernels/kv_backend.h"
#include "kvpage/kvpage.h"
#include "offload/kv_offload.h"
#include "pages/kv_page.h"

struct kv_store {
    kv_config_t cfg;       /* resolved: no zero defaults left  */
    kv_alloc_pool_t *pool; /* host tier                         */
    kv_page_table_t *pt;
    kv_backend_t backend;
    struct kv_pol_table *pol; /* policy states by seq id (kv_policy_state.c); */
                              /* NULL until the first kv_seq_set_policy      */
    uint64_t *last_use;       /* [max_seqs] tick of each seq's last use      */
                              /* (kv_store_lru.c); 0 = never used            */
    uint64_t tick;            /* last tick handed out (atomic)               */
    struct kv_press *press;   /* memory-pressure ladder and its counters     */
                              /* (kv_store_pressure.c); NULL = off           */
    struct kv_store_off *off; /* page-file tier (kv_store_offload*.c);       */
                              /* NULL without offload_path                   */
    struct kv_pfx *pfx;       /* prefix cache (kv_store_prefix.c); NULL off  */
};

#define KV_MAX_LAYERS 4096u /* kv_config_t.n_layers, at most */

/* The first kv_config_t served by size (tests/compat's frozen header ends
 * here): fields added later are appended after it, and a caller's struct
 * that ends before them gets their defaults. */
#define KV_CONFIG_SIZE_MIN (offsetof(kv_config_t, prefix_remote_mac_prev) + sizeof(const char *))

/* The page geometry kv_store_create accepts (kvpage.h, kv_config_t):
 * head_dim a multiple of 16 in 16..1024, *page_bytes (0: 64 * head_dim,
 * written back) a multiple of 64, at least one FP16 token, at most 1 MiB.
 * 0 or KV_ERANGE. */
int kv_store_geom_resolve(uint32_t head_dim, uint32_t *page_bytes);

/* kv_store.c: validate cfg and fill in defaults into *out (kv_store_create,
 * kv_config_estimate). */
int kv_store_config_resolve(const kv_config_t *cfg, kv_config_t *out);

/* kv_store_estimate.c: the memory of a resolved config (kv_config_estimate);
 * the machine's physical memory in bytes (UINT64_MAX if unknown). */
void kv_store_estimate(const kv_config_t *c, kv_estimate_t *e);
uint64_t kv_store_phys_bytes(void);

/* kv_store.c: pages free in the store's host pool now; FP16 tokens per page
 * of its geometry (kv_fmt_fp16_tpp: the prefix cache's block size). */
uint64_t kv_store_pool_free(const kv_store_t *s);
uint32_t kv_store_fp16_tpp(const kv_store_t *s);

/* Attention without policy statistics (kv_store.c): the public calls
 * validate and run these, or hand sequences with a policy to
 * kv_policy_state.c, which calls these with its own stats buffers. */
int kv_store_prefill_raw(kv_store_t *s, const kv_prefill_t *a);
int kv_store_decode_raw(kv_store_t *s, const kv_decode_t *a);

/* ---- recency of sequences (kv_store_lru.c) -------------------------------- */

int kv_store_lru_init(kv_store_t *s);       /* KV_ENOMEM                 */
void kv_store_lru_fini(kv_store_t *s);
size_t kv_store_lru_meta_bytes(const kv_store_t *s);
/* Mark seq used now (ids out of range are ignored; safe from concurrent
 * attention calls). */
void kv_store_touch(kv_store_t *s, kv_seq_id_t seq);
/* The live sequence whose last use is the oldest one after tick `after`
 * (0: the coldest of all): *seq and its *tick. Iterate coldest-first by
 * passing the returned tick back. KV_ENOENT when there is none. O(max_seqs). */
int kv_store_lru_next(const kv_store_t *s, uint64_t after, kv_seq_id_t *seq,
                      uint64_t *tick);

/* ---- prefix cache (kv_store_prefix.c) -------------------------------------- */

/* Validate the prefix_* fields of a config: 0, KV_EINVAL, KV_ERANGE. */
int kv_store_prefix_resolve(const kv_config_t *c);
/* s->pfx from s->cfg (NULL when off; the model fingerprint copied and
 * s->cfg.prefix_model pointed at the copy). KV_ENOMEM. fini: NULL-safe;
 * releases every node's pages (before the page table goes). */
int kv_store_prefix_init(kv_store_t *s);
/* Bytes kv_store_prefix_init allocates for c (kv_store_estimate; nodes,
 * one header and an entry per page reference each, come on top). */
uint64_t kv_store_prefix_fixed_bytes(const kv_config_t *c);
void kv_store_prefix_fini(kv_store_t *s);
void kv_store_prefix_stats(const kv_store_t *s, kv_stats_t *out);
/* kv_page_table_check with the nodes' references, and the nodes' own
 * invariants: 0, KV_ECORRUPT, KV_ENOMEM. */
int kv_store_prefix_check(const kv_store_t *s);
/* Evict least recently used nodes (chain ends first; those whose pages no
 * sequence holds before the others) until target pool pages are free or
 * none is left. Returns the pool pages freed. 0 when the cache is off. */
uint64_t kv_store_prefix_evict(kv_store_t *s, uint64_t target);
/* Wait (at most timeout_ms) until the nodes queued for the remote tier are
 * stored (kv_store_prefix_remote.c; tests, tools). 0, or the publisher's
 * error (-ETIMEDOUT); 0 without a remote. */
int kv_store_prefix_flush(kv_store_t *s, uint32_t timeout_ms);

/* ---- memory-pressure ladder (kv_store_pressure.c) ------------------------- */

/* Validate cfg->pressure / pressure_reserve (config_resolve): 0, KV_EINVAL,
 * KV_ERANGE, KV_ENOTSUP (kvpage.h, "memory pressure"). Allocates nothing. */
int kv_store_pressure_check(const kv_config_t *cfg);
/* Parse s->cfg.pressure into s->press and point s->cfg.pressure at the
 * store's copy (NULL when off). KV_ENOMEM. fini frees it (NULL-safe). */
int kv_store_pressure_init(kv_store_t *s);
void kv_store_pressure_fini(kv_store_t *s);
/* Add the counters to *out (kv_store_stats). */
void kv_store_pressure_stats(const kv_store_t *s, kv_stats_t *out);

/* One mutating call under the ladder, as a retry loop:
 *     kv_store_press_call_t pc;
 *     kv_store_press_begin(s, &pc, seq, need);
 *     do rc = the_call(...); while (kv_store_press_retry(s, &pc, rc));
 * need: the most pool pages the call can take. retry returns 1 once, after
 * a refused page (rc KV_ENOMEM, the pool's refusals moved) if the ladder
 * freed pages; on success it tops the pool up to the reserve. A call begun
 * while another one runs (a hooked call made by a hooked call) is nested:
 * its retry never runs the ladder, the outer call's does. Every begin must
 * be followed by retries until one returns 0. Off: begin and retry do
 * nothing. */
typedef struct kv_store_press_call {
    kv_seq_id_t hot;    /* the call's sequence: never touched by the ladder */
    uint64_t need;      /* pages the call can take at most                   */
    uint64_t failed0;   /* the pool's refused allocations before the call    */
    int retried;        /* 1 after the retry                                 */
    int nested;         /* 1: inside another call under the protocol         */
} kv_store_press_call_t;

void kv_store_press_begin(kv_store_t *s, kv_store_press_call_t *pc,
                          kv_seq_id_t hot, uint64_t need);
int kv_store_press_retry(kv_store_t *s, kv_store_press_call_t *pc, int rc);
/* Most pool pages kv_page_append(seq, layer, n) can take: per kv head a
 * copy of a shared tail and the fresh pages after the tail's room. */
uint64_t kv_store_press_append_need(const kv_store_t *s, kv_seq_id_t seq,
                                    uint32_t layer, uint32_t n);
/* Most pool pages one page-table operation that rewrites lists of (seq,
 * layer) can take (a conversion, a compaction): per kv head the list's
 * tokens in FP16 pages, plus one (a copied shared or partly filled tail). */
uint64_t kv_store_press_layer_need(const kv_store_t *s, kv_seq_id_t seq,
                                   uint32_t layer);
/* kv_store_off_ready (below) before a mutating call on seq, with the ladder
 * behind it: a KV_OFFLOAD_WAIT page-in the pool refused runs the ladder for
 * the sequence's pages on the file (never touching seq) and is tried once
 * more. Not nested in a call under the protocol. */
int kv_store_press_ready(kv_store_t *s, kv_seq_id_t seq);

/* ---- page-file tier (kv_store_offload*.c) ---------------------------------
 * kv_store_offload.c         config, life (create/open, destroy), stats,
 *                            check, kv_store_seqs
 * kv_store_offload_io.c      batches: submit page-outs/page-ins, completions
 * kv_store_offload_api.c     kv_seq_offload/prefetch/wait/residency, free
 * kv_store_offload_access.c  non-resident pages met by attention, kv_read
 *                            and mutating calls (KV_ENOTRES or WAIT)
 * kv_store_offload_balance.c watermarks
 * kv_store_offload_record.c  sequence records: sync, restore at open
 *
 * Invariants (under off->lock): per sequence, the counters below equal the
 * entries of its lists in each residency state (kv_page.h); every entry
 * with PAGING is a page of exactly one batch in `batches`, and a batch's
 * pages are entries of its sequence (lists are not mutated while busy, so
 * (li, e) stays valid); an OFFLOADED entry (not PAGING) names a held slot
 * whose key is kv_store_off_key(seq, li, e) and generation slot_gen[slot];
 * a record's slots are held and named by seqs[seq].rec. Write completions
 * are processed only in mutating calls (they free pool pages that
 * attention may be reading); read completions anywhere (their pages are not
 * readable until then). */
#define KV_STORE_OFF_PENDING 1 /* a batch status not yet reported        */
#define KV_STORE_OFF_ALL UINT32_MAX /* "every sequence" for settle       */

typedef struct kv_store_off_seq {  /* one sequence id (all 0 when free)   */
    uint32_t on_file;   /* entries OFFLOADED, not being read (lost incl.) */
    uint32_t lost;      /* of those, LOST                                  */
    uint32_t writing;   /* entries PAGING (write in flight)                */
    uint32_t reading;   /* entries OFFLOADED|PAGING (read in flight)       */
    uint32_t batches;   /* its batches in flight                           */
    uint32_t n_rec;     /* slots of its record on the file (0: none)       */
    uint32_t rec_new;   /* 1: the record was written by the running sync   */
    kv_offload_slot_t *rec; /* [n_rec] (kv_mem)                           */
    int err;            /* first I/O error since the last kv_seq_wait      */
    int lost_err;       /* error of the last failed read (lost > 0)        */
} kv_store_off_seq_t;

typedef struct kv_store_off_pg {   /* one page of a batch                 */
    uint32_t li, e;          /* list (layer * n_kv_heads + head), entry    */
    kv_page_id_t page;       /* pool page written from / read into         */
    kv_offload_slot_t slot;  /* read: its slot (write: batch->slots)       */
    uint64_t gen;            /* generation written / expected              */
} kv_store_off_pg_t;

typedef struct kv_store_off_batch {  /* one submitted page-out or page-in */
    struct kv_store_off_batch *next;
    kv_offload_ticket_t ticket;
    kv_seq_id_t seq;
    uint32_t n;                /* pages                                    */
    uint32_t write;            /* 1: page-out, 0: page-in                  */
    kv_store_off_pg_t *pg;     /* [n]                                      */
    kv_offload_slot_t *slots;  /* [n] write: set by the file at submit     */
    int *status;               /* [n] KV_STORE_OFF_PENDING until reported  */
    size_t bytes;              /* this one kv_mem block                    */
} kv_store_off_batch_t;

typedef struct kv_store_off {
    pthread_mutex_t lock;      /* all below and every residency change     */
    kv_offload_file_t *file;
    char *path;                /* the store's copy of offload_path         */
    size_t path_bytes;
    uint32_t capacity;         /* slots                                    */
    uint32_t open_ok;          /* init finished: destroy persists          */
    uint64_t *slot_gen;        /* [capacity] generation of each slot's page */
    kv_store_off_seq_t *seqs;  /* [max_seqs]                               */
    kv_store_off_batch_t *batches; /* in flight, newest first              */
    uint64_t held_bytes;       /* batches and record arrays (meta_bytes)   */
    uint64_t next_gen;         /* never reused within a file               */
    uint64_t on_file, lost, in_flight, rec_slots; /* sums over sequences  */
    uint64_t pages_out, pages_in, bytes_out, bytes_in, io_errors, seqs_dropped;
} kv_store_off_t;

/* kv_store_offload.c: the store's side of create/destroy/stats/check. */
int kv_store_off_resolve(kv_config_t *c);  /* validate, defaults          */
int kv_store_off_init(kv_store_t *s);      /* after pool, pt, lru         */
void kv_store_off_fini(kv_store_t *s);     /* NULL-safe; first in destroy */
size_t kv_store_off_meta_bytes(const kv_store_t *s);
void kv_store_off_stats(const kv_store_t *s, kv_stats_t *out);
int kv_store_off_check(const kv_store_t *s);
/* Tests: the store's page file (NULL without), and its fault settings. */
kv_offload_file_t *kv_store_off_file(const kv_store_t *s);
int kv_store_off_set_fault(kv_store_t *s, const kv_offload_fault_t *fault);

/* kv_store_offload_io.c (off->lock held). */
uint64_t kv_store_off_key(const kv_store_t *s, kv_seq_id_t seq, uint32_t li,
                          uint32_t e);
/* Submit a page-out of every eligible page of seq / a page-in of every
 * page of seq on the file; *n = pages (0: nothing to do, nothing done).
 * Errors: nothing changed. */
int kv_store_off_write_seq(kv_store_t *s, kv_seq_id_t seq, uint32_t *n);
int kv_store_off_read_seq(kv_store_t *s, kv_seq_id_t seq, uint32_t *n);
/* Process the completed batches of seq (or KV_STORE_OFF_ALL): reads only
 * unless `writes`; waiting for each when `block`. 0, or the file's progress
 * error (those batches stay in flight). */
int kv_store_off_settle(kv_store_t *s, kv_seq_id_t seq, int writes, int block);
/* Page in every page of seq on the file and wait: 0, or the error of a page
 * that could not be read (it stays on the file, lost). */
int kv_store_off_page_in(kv_store_t *s, kv_seq_id_t seq);
/* Drop every batch after the file was closed (its I/O is over): entries
 * back to what they were before the batch. */
void kv_store_off_abandon(kv_store_t *s);

/* kv_store_offload_api.c: the start of a public call of the tier on *seq
 * (NULL: the whole store): KV_EINVAL, KV_ENOTSUP (no file), KV_ENOENT; or
 * 0 with off->lock held and completed I/O of seq (or all) taken in. */
int kv_store_off_enter(kv_store_t *s, const kv_seq_id_t *seq);

/* kv_store_offload_access.c. ready: before a mutating call on seq (waits
 * for its I/O; then KV_ENOTRES, or with WAIT pages it in). access: before
 * reading the lists of seqs[0..n) at layer (head, or UINT32_MAX: every
 * head): 0 when every entry is readable. drop: before kv_page_seq_free of a
 * live seq (waits for its I/O, frees its slots and record). */
int kv_store_off_ready(kv_store_t *s, kv_seq_id_t seq);
int kv_store_off_access(const kv_store_t *s, const kv_seq_id_t *seqs, uint32_t n,
                        uint32_t layer, uint32_t head);
int kv_store_off_seq_drop(kv_store_t *s, kv_seq_id_t seq);

/* kv_store_offload_record.c (off->lock held). */
int kv_store_off_records_write(kv_store_t *s); /* every seq wholly on file */
void kv_store_off_record_free(kv_store_t *s, kv_seq_id_t seq);
int kv_store_off_restore(kv_store_t *s);       /* at init with OPEN        */
/* Restore helpers shared with the prefix cache's records: the index of
 * (key, gen) in sorted entries (n: none); read one record chunk (retried);
 * 1 if a page of format fmt with shape flags may hold `tokens`. */
uint64_t kv_store_off_rec_find(const kv_offload_entry_t *ents, uint64_t n, uint64_t key,
                               uint64_t gen);
int kv_store_off_rec_read(kv_store_t *s, const kv_offload_entry_t *e, uint8_t *dst);
int kv_store_off_page_ok(const kv_page_table_t *pt, uint32_t fmt, uint32_t flags,
                         uint32_t tokens);
/* The 40 bytes every record header starts with (sequence and prefix node
 * records): u32 magic, version, id, n_layers, n_kv_heads, head_dim,
 * page_bytes, chunks; u64 bytes. check: 0; KV_ECORRUPT: another magic,
 * version or id; KV_EINVAL: another store shape. */
void kv_store_off_rec_head_put(uint8_t *p, uint32_t magic, uint32_t version, uint32_t id,
                               const kv_config_t *c, uint32_t chunks, uint64_t bytes);
int kv_store_off_rec_head_check(const uint8_t *p, uint32_t magic, uint32_t version,
                                uint32_t id, const kv_config_t *c);

/* store/kv_store_prefix_file.c (off->lock held): the prefix cache's nodes
 * on the page file. key: 1 if a file key is the prefix tier's. sync: write
 * a copy of every host node that has none (at kv_store_offload_sync and
 * destroy; best effort). restore: at open, the nodes recorded in ents[n]
 * (claiming their slots in claimed[]; without a cache they stay orphans).
 * room: free slots (host nodes' copies, then the coldest nodes on the
 * file) until `need` are free; 1 if they are. slots: slots its copies
 * hold. */
int kv_pfx_file_key(uint64_t key);
void kv_pfx_file_sync(kv_store_t *s);
int kv_pfx_file_restore(kv_store_t *s, const kv_offload_entry_t *ents, uint64_t n,
                        uint8_t *claimed);
int kv_pfx_file_room(kv_store_t *s, uint32_t need);
uint64_t kv_pfx_file_slots(const kv_store_t *s);

#endif /* KV_STORE_INT_H */
