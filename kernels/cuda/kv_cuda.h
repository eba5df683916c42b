/* SPDX-License-Identifier: MIT */
/*
 * kv_cuda.h — the CUDA backend (kernels/cuda/): its C interface.
 *
 *   kv_cuda_backend.cu  kv_backend_cuda_create: the kv_backend_t ops (decode,
 *                       prefill, convert) over kv_kern_page_t runs
 *   kv_cuda_plan.cu     host side of a call: validation, the device page
 *                       table (entries, work items, statistics tiles)
 *   kv_cuda_pool.cu     device page pool (one cudaMalloc arena, ids from a
 *                       KV_TIER_DEVICE id-only kv_alloc pool), pinned
 *                       staging, asynchronous page copies with events
 *   kv_cuda_attn.cu     attention kernels: decode and prefill (one kernel,
 *                       split-K partials + reduce), exact statistics
 *   kv_cuda_convert.cu  conversion kernel: any pages -> FP16/INT4/INT2
 *
 * Launchers are extern "C", take one args struct of DEVICE pointers and a
 * stream (void *: a cudaStream_t, NULL = the default stream), and return 0
 * or a KV_E* code: KV_ENOTSUP for a head_dim / page size no kernel was
 * instantiated for (the dispatch switch ends in that error), KV_EINVAL for
 * inconsistent arguments, KV_ENOMEM / KV_EIO for CUDA failures (allocation,
 * anything else). This header needs no CUDA header: C tests include it.
 *
 * Where pages live (docs/gpu.md): a backend is created in one of two modes.
 * Staged (device_pages 0): kv_kern_page_t.data are host pages, uploaded for
 * every call through pinned memory (correct, not fast: no page cache, see
 * docs/gpu.md for why pointer identity is not a cache key). Device
 * (device_pages > 0): .data are device addresses of pages of the backend's
 * pool (kv_backend_cuda_pool + kv_cuda_pool_page_ptr), nothing is copied
 * but q, out and statistics. In both, q/out/stats of the ops are host
 * memory, as for the CPU backend.
 */
#ifndef KV_CUDA_H
#define KV_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the C headers below have C linkage in .cu files too */
extern "C" {
#endif

#include "alloc/kv_alloc.h"
#include "kernels/kv_backend.h"

/* ---- kernel limits ------------------------------------------------------- */
#define KV_CUDA_THREADS     128u   /* threads per block, every kernel         */
#define KV_CUDA_ROWS        8u     /* most query rows per attention block     */
#define KV_CUDA_TILE        64u    /* tokens per attention tile               */
#define KV_CUDA_STAGE_BYTES 16384u /* page bytes staged per tile (>= 1 page)  */
#define KV_CUDA_MAX_SLOTS   16u    /* pages per tile                          */
#define KV_CUDA_ENT_WIN     64u    /* page entries held in shared memory      */
#define KV_CUDA_STATS_TILE  64u    /* tokens per statistics block             */
#define KV_CUDA_MAX_PAGE_BYTES 32768u
#define KV_CUDA_MIN_PART    256u   /* smallest default split-K partition      */

/* Query rows per attention block for lists of n_rows rows: 4 or
 * KV_CUDA_ROWS (both are instantiated; 4 keeps small GQA groups' registers
 * low). */
static inline uint32_t kv_cuda_rows_per_block(uint32_t n_rows)
{
    return n_rows <= 4u ? 4u : KV_CUDA_ROWS;
}

/* 1 if kernels were instantiated for head_dim d (64, 128), else 0. */
int kv_cuda_head_dim_ok(uint32_t d);

/* 0 if pages of page_bytes can be staged (a multiple of 64, at most
 * KV_CUDA_MAX_PAGE_BYTES, and holding >= 1 FP16 token of head_dim d), else
 * KV_ENOTSUP. */
int kv_cuda_page_bytes_ok(uint32_t page_bytes, uint32_t d);

/* ---- the device page table ----------------------------------------------- */

/* One page of a list, as the kernels read it (8 bytes). */
typedef struct kv_cuda_ent {
    uint32_t page; /* page index: bytes at pages + page * page_bytes      */
    uint32_t meta; /* KV_CUDA_ENT_META(tokens used, format, variant)      */
} kv_cuda_ent_t;

#define KV_CUDA_ENT_META(n, fmt, var)                                       \
    ((uint32_t)(n) | ((uint32_t)(fmt) << 24) | ((uint32_t)(var) << 28))
#define KV_CUDA_ENT_N(m)   ((m) & 0xffffffu)
#define KV_CUDA_ENT_FMT(m) (((m) >> 24) & 0xfu)
#define KV_CUDA_ENT_VAR(m) (((m) >> 28) & 0x1u)

/* A token range of one list: one attention block (times row groups) or one
 * statistics block. Token t_begin is token off0 of entry ent0; the range
 * never reads entries at or past ent_end. */
typedef struct kv_cuda_work {
    uint32_t list;    /* decode: b * n_kv_heads + h; prefill: h          */
    uint32_t ent0;    /* first entry (index into the call's entries)     */
    uint32_t ent_end; /* one past the list's last entry                  */
    uint32_t off0;    /* token offset in entry ent0                      */
    uint32_t t_begin; /* list token of the first token                   */
    uint32_t n_tok;   /* tokens, >= 1                                    */
} kv_cuda_work_t;

enum { KV_CUDA_DECODE = 0, KV_CUDA_PREFILL = 1 };

/* One attention call (decode or prefill), device pointers.
 * Rows: a list has n_rows query rows, row r = (position i, head g) with
 * i = r / G, g = r % G (G = n_q_heads / n_kv_heads; decode: n_new 1, so
 * rows are the group's heads). Row r of list L reads
 *   decode:  q[(b * n_q + h * G + g) * D], b = L / n_kv, h = L % n_kv,
 *   prefill: q[(i * n_q + h * G + g) * D], h = L,
 * sees list tokens t < limit (decode: all; prefill: seq_len - n_new + i +
 * 1), and writes out at the same index as q and lse[L * n_rows + r].
 * Blocks: n_work * n_rg; block w * n_rg + rg serves rows rg * rows_blk ..
 * of list work[w].list over the work item's tokens. part == NULL: every
 * list is exactly one work item (single pass) and blocks write out and
 * lse; else blocks write partials (part: kv_cuda_part_floats floats) and a
 * reduce kernel combines them. Statistics (stats != NULL): a second pass
 * over the stile items writes stats[stats_off[L] + t] = sum over counted
 * rows r >= stats_row0 that see t of exp(q_r . k_t * scale - lse_r); needs
 * lse. Rotated INT pages (kv_fmt_codec_rotated entries) are read by the
 * kernels built with the rotated accumulator, which rotated != 0 selects:
 * it must be set when any entry is one (kv_cuda_plan_t.rotated). */
typedef struct kv_cuda_attn_args {
    uint32_t mode;          /* KV_CUDA_DECODE or KV_CUDA_PREFILL          */
    uint32_t head_dim, page_bytes;
    uint32_t n_q_heads, n_kv_heads;
    uint32_t n_lists;
    uint32_t n_new;         /* prefill: new tokens (query positions)       */
    uint32_t n_rows;        /* rows per list: G (decode), n_new * G        */
    uint32_t rows_blk;      /* kv_cuda_rows_per_block(n_rows)              */
    uint32_t n_rg;          /* row groups: ceil(n_rows / rows_blk)         */
    float scale;            /* softmax scale, > 0                          */
    const void *pages;      /* page i at pages + i * page_bytes            */
    const kv_cuda_ent_t *ents;
    const kv_cuda_work_t *work;
    uint32_t n_work;
    const uint32_t *list_work; /* [n_lists + 1]: items of a list, in order */
    const uint32_t *seq_len;   /* [n_lists]                                */
    const float *q;
    float *out;
    float *part;            /* NULL (single pass) or partials              */
    float *lse;             /* [n_lists * n_rows] or NULL (no statistics)  */
    const kv_cuda_work_t *stile; /* statistics items (n_tok <= STATS_TILE) */
    uint32_t n_stile;
    const uint64_t *stats_off;   /* [n_lists]; UINT64_MAX: list has none   */
    uint32_t stats_row0;    /* first counted row of each list              */
    float *stats;           /* NULL: no statistics                         */
    uint32_t rotated;       /* 1: some entry is a rotated INT page         */
} kv_cuda_attn_args_t;

/* Floats of partials for n_work items x n_rg row groups of rows_blk rows
 * at head_dim d. */
size_t kv_cuda_part_floats(uint32_t n_work, uint32_t n_rg, uint32_t rows_blk,
                           uint32_t d);

/* Dynamic shared memory (bytes) of the attention kernel for a call. */
size_t kv_cuda_attn_smem(uint32_t head_dim, uint32_t page_bytes);

/* Launch the kernels of one call on stream (asynchronous). */
int kv_cuda_attn_launch(const kv_cuda_attn_args_t *a, void *stream);

/* One conversion: n_tokens tokens, token i read from entry src_loc[2i]
 * (its token src_loc[2i+1]) of src_pages and written to dst page
 * dst_loc[2i] (index into dst_pages, page_bytes each), slot dst_loc[2i+1],
 * in dst_format (KV_FMT_FP16, INT4 or INT2; INT: n_tokens a multiple of 16
 * and each aligned group of 16 tokens in one page at slots 16k..16k+15),
 * stored variant dst_variant (1: rotated INT). Rotated source pages are
 * un-rotated first. Encodes as the CPU reference does, bit for bit. */
typedef struct kv_cuda_convert_args {
    uint32_t head_dim, page_bytes, dst_format, n_tokens;
    uint32_t dst_variant;    /* 0, or 1 = rotated INT (rows times R)     */
    const void *src_pages;
    const kv_cuda_ent_t *src_ents;
    const uint32_t *src_loc; /* [n_tokens][2] */
    void *dst_pages;
    const uint32_t *dst_loc; /* [n_tokens][2] */
} kv_cuda_convert_args_t;

int kv_cuda_convert_launch(const kv_cuda_convert_args_t *a, void *stream);

/* ---- host planning (kv_cuda_plan.cu; no GPU needed) ---------------------- */

/* Validation of the backend ops' params: the backend-neutral checks
 * (same errors for the same bad input), then what the kernels need
 * (head_dim, page_bytes: KV_ENOTSUP). */
int kv_cuda_check_decode(const kv_attn_decode_params_t *p);
int kv_cuda_check_prefill(const kv_attn_prefill_params_t *p);
int kv_cuda_check_convert(const kv_convert_params_t *p);

/* Default split-K partition (tokens) for total_tokens over lists with
 * n_rg row groups each on n_sm multiprocessors: enough blocks for about
 * eight per SM, never below KV_CUDA_MIN_PART, a multiple of 64. */
uint32_t kv_cuda_default_partition(uint64_t total_tokens, uint32_t n_rg,
                                   uint32_t n_sm);

/* What a call's page table is built from. */
typedef struct kv_cuda_plan_in {
    uint32_t mode;            /* KV_CUDA_DECODE / KV_CUDA_PREFILL          */
    kv_page_geom_t geom;
    uint32_t n_q_heads, n_kv_heads;
    uint32_t n_lists, n_new;  /* decode: n_new 1                           */
    const uint32_t *indptr;   /* [n_lists + 1] into pages                  */
    const kv_kern_page_t *pages;
    const uint32_t *seq_len;  /* [n_lists]                                 */
    const uint8_t *stats;     /* NULL or [n_lists]: 1 = list wants stats   */
    uint32_t partition;       /* tokens per work item; 0 = default         */
    uint32_t n_sm;            /* multiprocessors (default partition)       */
    const void *dev_base;     /* device mode: pages must be pages of this  */
    uint32_t dev_pages;       /*   arena (dev_pages of page_bytes); NULL:  */
                              /*   staged mode, .data are host pages       */
} kv_cuda_plan_in_t;

/* The host arrays of a call (one kv_mem block). Entry e is page
 * indptr[0] + e of the input. Staged mode: entry pages index upload[],
 * the distinct host pages in first-use order; device mode: the arena. */
typedef struct kv_cuda_plan {
    uint32_t n_ents, n_upload, n_work, n_stile;
    uint32_t n_rows, rows_blk, n_rg, partition, single_pass;
    uint32_t rotated;          /* 1: some entry is a rotated INT page      */
    uint64_t n_stats;          /* floats of statistics                     */
    kv_cuda_ent_t *ents;       /* [n_ents]                                 */
    const void **upload;       /* [n_upload] (staged mode)                 */
    kv_cuda_work_t *work;      /* [n_work]                                 */
    uint32_t *list_work;       /* [n_lists + 1]                            */
    kv_cuda_work_t *stile;     /* [n_stile]                                */
    uint64_t *stats_off;       /* [n_lists]                                */
    uint32_t *src_loc, *dst_loc; /* conversions: [n_tokens][2] each        */
    void *block;               /* the kv_mem block and its size            */
    size_t block_bytes;
} kv_cuda_plan_t;

/* Build a plan. Inputs must have passed the checks above. Errors:
 * KV_EINVAL (device mode: a page that is not a page of the arena),
 * KV_ENOMEM. */
int kv_cuda_plan_build(const kv_cuda_plan_in_t *in, kv_cuda_plan_t *out);
void kv_cuda_plan_free(kv_cuda_plan_t *p);

/* Where each token of a conversion comes from and goes to (the
 * kv_cuda_convert_args_t loc arrays): src_loc entries index the run
 * p->src (entry i = p->src[i]); dst_loc pages index p->dst. KV_EINVAL when
 * the run holds too few tokens or the destinations too few slots. */
int kv_cuda_convert_locs(const kv_convert_params_t *p, uint32_t *src_loc,
                         uint32_t *dst_loc);

/* The plan of a conversion (p checked by kv_cuda_check_convert, n_tokens
 * > 0): ents (one per source page), upload (staged mode: the distinct
 * source pages), src_loc and dst_loc. Device mode (dev_base): entries and
 * dst_loc pages are arena indices (KV_EINVAL for a pointer that is not a
 * page of the arena); staged: dst_loc pages index p->dst. */
int kv_cuda_plan_convert(const kv_convert_params_t *p, const void *dev_base,
                         uint32_t dev_pages, kv_cuda_plan_t *out);

/* ---- device page pool (kv_cuda_pool.cu) ---------------------------------- */

typedef struct kv_cuda_pool kv_cuda_pool_t;

/* capacity pages of page_bytes in one cudaMalloc arena, ids from a
 * KV_TIER_DEVICE id-only kv_alloc pool; staging_pages pinned host slots
 * (cudaHostAlloc) for writes; copies run on `stream` (NULL: the pool
 * creates its own). Errors: KV_EINVAL, KV_ERANGE, KV_ENOMEM, KV_ENOTSUP
 * (no GPU), KV_EIO. */
int kv_cuda_pool_create(uint32_t page_bytes, uint32_t capacity,
                        uint32_t staging_pages, void *stream,
                        kv_cuda_pool_t **out);
/* Waits for the pool's copies, then frees everything. NULL: no-op. */
void kv_cuda_pool_destroy(kv_cuda_pool_t *pool);

/* n pages, all or nothing (KV_ENOMEM). Pages freed while a copy into them
 * was in flight come back only once their copy's event completed. */
int kv_cuda_pool_alloc(kv_cuda_pool_t *pool, uint32_t n, kv_page_id_t *ids);
/* Drop the pool's reference of each page; a page still being copied into
 * is freed when its copy completes (kv_cuda_pool_alloc/sync reap it). */
int kv_cuda_pool_free(kv_cuda_pool_t *pool, uint32_t n,
                      const kv_page_id_t *ids);
/* Device address of a page (page_bytes bytes, 256-aligned); NULL for a bad
 * id. */
void *kv_cuda_pool_page_ptr(const kv_cuda_pool_t *pool, kv_page_id_t id);
/* Copy host pages src[i] (page_bytes each) into pages ids[i],
 * asynchronously: each goes through a pinned staging slot; a slot and the
 * destination page are in flight until the event recorded after the copy
 * completes (a slot is reused only then; a freed page is recycled only
 * then). src may be reused as soon as this returns. */
int kv_cuda_pool_write(kv_cuda_pool_t *pool, uint32_t n,
                       const kv_page_id_t *ids, const void *const *src);
/* Copy pages ids[i] back to host memory dst[i] (synchronous). */
int kv_cuda_pool_read(kv_cuda_pool_t *pool, uint32_t n,
                      const kv_page_id_t *ids, void *const *dst);
/* Wait for every copy of the pool and recycle deferred pages. */
int kv_cuda_pool_sync(kv_cuda_pool_t *pool);
const void *kv_cuda_pool_base(const kv_cuda_pool_t *pool);
uint32_t kv_cuda_pool_page_bytes(const kv_cuda_pool_t *pool);
uint32_t kv_cuda_pool_capacity(const kv_cuda_pool_t *pool);
void *kv_cuda_pool_stream(const kv_cuda_pool_t *pool);
/* Pages whose free waits on a copy (for tests). */
uint32_t kv_cuda_pool_deferred(const kv_cuda_pool_t *pool);

/* ---- the backend (kv_cuda_backend.cu) ------------------------------------ */

struct kv_cuda_config {
    int device;             /* CUDA device ordinal                          */
    uint32_t page_bytes;    /* device mode: the pool's page size            */
    uint32_t device_pages;  /* 0: staged mode; else device mode with a pool */
                            /* of this many pages                           */
    uint32_t staging_pages; /* device mode: pinned write slots; 0 = 64      */
};

/* The pool of a device-mode backend (NULL in staged mode or for another
 * backend). */
kv_cuda_pool_t *kv_backend_cuda_pool(const kv_backend_t *b);

/* Devices visible to the CUDA runtime; 0 when none (or no driver). */
int kv_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* KV_CUDA_H */
