/* SPDX-License-Identifier: MIT */
/*
 * kv_backend.h — the compute backend interface (ops table + context).
 *
 * A backend computes over pages it is handed: it knows page formats (through
 * formats/kv_format.h) but not page tables, sequences or policies. The caller
 * (store/kv_store.c) resolves each (sequence, kv_head) list into a run of
 * kv_kern_page_t in token order, CSR-style: the pages of list i are
 * pages[indptr[i] .. indptr[i+1]).
 *
 * The CPU backend (kernels/cpu/) is always built and is the reference every
 * other backend is tested against. FP32 accumulation throughout. Long lists
 * are split into partitions whose partial results are combined with
 * (max, sum-exp) pairs (flash-decoding).
 *
 * Statistics (optional): for every token t of list (b, h), the attention
 * probability it received, summed over the counted query rows and over the
 * q heads of group h (q heads h*G .. h*G+G-1, G = n_q_heads / n_kv_heads),
 * each row normalized by its exact log-sum-exp. Written (not accumulated)
 * into stats[.. + h*stats_stride + t].
 */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include <stdint.h>

#include "formats/kv_format.h"

typedef struct kv_kern_page {
    const void *data;  /* page bytes (host memory for the CPU backend) */
    uint32_t n_tokens; /* tokens used in this page                     */
    uint32_t format;   /* kv_format_t                                  */
    uint32_t variant;  /* how this list reads a shared page: MERGED 0 = */
                       /* layer l-1 of the pair, 1 = layer l; INT4/INT2 */
                       /* 1 = rotated (kv_fmt_rot.h); else 0.           */
                       /* Decode with kv_format_load(format, variant..) */
} kv_kern_page_t;

typedef struct kv_attn_decode_params {
    kv_page_geom_t geom;
    uint32_t batch;            /* sequences                                 */
    uint32_t n_q_heads;        /* multiple of n_kv_heads                    */
    uint32_t n_kv_heads;
    const uint32_t *indptr;    /* [batch*n_kv_heads + 1] into pages         */
    const kv_kern_page_t *pages;
    const uint32_t *seq_len;   /* [batch*n_kv_heads] tokens of list, >= 1   */
    const float *q;            /* [batch][n_q_heads][head_dim]              */
    float *out;                /* [batch][n_q_heads][head_dim]              */
    float *const *stats;       /* NULL, or [batch] of NULL or               */
                               /*   [n_kv_heads][stats_stride]              */
    uint32_t stats_stride;     /* >= max seq_len of a batch row with stats  */
    float scale;               /* softmax scale, > 0                        */
    uint32_t partition_tokens; /* tokens per split-K partition; 0 = default */
} kv_attn_decode_params_t;

typedef struct kv_attn_prefill_params {
    kv_page_geom_t geom;
    uint32_t n_q_heads, n_kv_heads;
    const uint32_t *indptr;    /* [n_kv_heads + 1] into pages               */
    const kv_kern_page_t *pages;
    const uint32_t *seq_len;   /* [n_kv_heads], each >= n_new               */
    uint32_t n_new;            /* query rows = the last n_new tokens        */
    const float *q;            /* [n_new][n_q_heads][head_dim]              */
    float *out;                /* [n_new][n_q_heads][head_dim]              */
    float *stats;              /* NULL or [n_kv_heads][stats_stride]        */
    uint32_t stats_stride;
    uint32_t stats_row0;       /* rows stats_row0..n_new-1 are counted      */
    float scale;
} kv_attn_prefill_params_t;

/* ---- conversions ---------------------------------------------------------
 * Page-to-page conversions the page table runs (pages/kv_page_convert.c,
 * pages/kv_page_merge.c): FP16 residual -> INT4/INT2 (KIVI), a layer pair ->
 * MERGED + retained FP16 originals (MiniCache), any page -> FP16. Sources
 * are runs of kv_kern_page_t in token order, read through kv_format_load
 * with each page's variant: tokens [src_off, src_off + n_tokens) of the run
 * (src_off counted in src[0]). Destinations are pages the caller allocated;
 * the kernel writes only the token slots it is told to and nothing else.
 * scratch: NULL, or KV_CONVERT_SCRATCH_FLOATS(head_dim) floats the kernel
 * may use; with scratch given a valid call cannot fail (the page table calls
 * the write kernels after all its allocations, where nothing may fail). */

/* Scratch a conversion kernel may need (floats): K and V of 16 tokens of
 * both layers plus per-token temporaries. */
#define KV_CONVERT_SCRATCH_FLOATS(d) (4u * 16u * (d) + 4u * (d))

typedef struct kv_convert_params {
    kv_page_geom_t geom;
    const kv_kern_page_t *src; /* [n_src] source pages, token order        */
    uint32_t n_src;
    uint32_t src_off;          /* first token: token src_off of src[0]     */
    uint32_t n_tokens;         /* tokens to convert; INT: a multiple of 16  */
    uint32_t dst_format;       /* KV_FMT_FP16, KV_FMT_INT4 or KV_FMT_INT2   */
    uint32_t dst_variant;      /* stored variant of the dst pages: 0, or   */
                               /* 1 = rotated INT (kv_format_to_variant)   */
    void *const *dst;          /* [n_dst] destination pages of dst_format   */
    uint32_t n_dst;
    uint32_t dst_off;          /* first slot in dst[0] (INT: multiple of    */
                               /* 16); each dst page is filled to capacity  */
                               /* before the next one starts at slot 0      */
    float *scratch;            /* NULL or KV_CONVERT_SCRATCH_FLOATS floats  */
} kv_convert_params_t;

/* MiniCache merge of one kv_head of a layer pair (docs/design.md). Token i of
 * src[0] (layer l-1) pairs with token i of src[1] (layer l). Two passes:
 * merge_select writes retain[i] (1: token i stays unmerged), merge reads it
 * and writes merged tokens (retain[i] == 0, in order) into dst slots
 * 0, 1, .. (page after page, each filled to kv_fmt_merged_capacity for
 * dir_format, header included) and the retained tokens' original K/V of
 * layer j, in order, into FP16 pages ret[j] from slot 0. Retention, per
 * call: d_i = theta_i / pi for K and V separately (theta: angle between the
 * two layers' vectors), token i is retained when d_i > d_max - gamma *
 * (d_max - d_min) for K or for V (d_min, d_max over the call's tokens). */
typedef struct kv_merge_params {
    kv_page_geom_t geom;
    const kv_kern_page_t *src[2]; /* [2][n_src[j]] layer l-1, layer l     */
    uint32_t n_src[2];
    uint32_t src_off[2];
    uint32_t n_tokens;            /* tokens of each layer, >= 1           */
    float t;                      /* SLERP toward layer l, [0, 1]         */
    float gamma;                  /* retention threshold, [0, 1]          */
    uint32_t dir_format;          /* KV_FMT_FP16 or KV_FMT_INT4           */
    uint8_t *retain;              /* [n_tokens] (select writes it)        */
    void *const *dst;             /* [n_dst] MERGED pages (merge)         */
    uint32_t n_dst;
    uint32_t dst_off;             /* slots dst[0] already holds (its      */
                                  /* header written): merged tokens go to */
                                  /* slot dst_off on; 0 = a fresh page    */
    void *const *ret[2];          /* [n_ret[j]] FP16 pages (merge)        */
    uint32_t n_ret[2];
    float *scratch;               /* NULL or KV_CONVERT_SCRATCH_FLOATS    */
} kv_merge_params_t;

/* KVzip's scoring of one prefill call of a reconstruction pass at one layer
 * (store/kv_policy_kvzip.c): for every row i < n_rows and q head g, the
 * softmax of scale * q.k over the first n_vis0 + i keys of kv head g / G
 * (the sinks, the chunk, the pass's tokens up to the row), and for every
 * chunk key j (key n_sink + j) score[h][j] = max(score[h][j], its
 * probability). Maxima only: the result does not depend on how rows are
 * split over threads, and a call repeated gives the same scores. Each
 * probability is exp(l - m) / z with l the logit, m the row's largest, z
 * the sum of exp(l - m) in key order (double), the logit an FP32 dot
 * product in a fixed order (kv_cpu_score.c) times scale. */
typedef struct kv_zip_score_params {
    const float *q;        /* [n_rows][n_q_heads][head_dim] query rows     */
    const float *k;        /* [n_kv_heads][n_keys][head_dim]              */
    float *const *score;   /* [n_kv_heads] -> [n_chunk] probabilities      */
    uint32_t n_q_heads, n_kv_heads, head_dim;
    uint32_t n_keys;       /* keys per kv head                            */
    uint32_t n_sink;       /* the first n_sink keys are not scored         */
    uint32_t n_chunk;      /* keys [n_sink, n_sink + n_chunk) are          */
    uint32_t n_rows;       /* query rows                                  */
    uint32_t n_vis0;       /* keys row 0 sees (row i: n_vis0 + i); >=     */
                           /* n_sink + n_chunk, n_vis0 + n_rows - 1 <=     */
                           /* n_keys                                      */
    float scale;           /* softmax scale (> 0)                         */
} kv_zip_score_params_t;

typedef struct kv_backend_ops {
    const char *name;
    /* 0, KV_EINVAL (inconsistent params), KV_ENOTSUP (format), KV_ENOMEM. */
    int  (*attn_decode)(void *ctx, const kv_attn_decode_params_t *p);
    int  (*attn_prefill)(void *ctx, const kv_attn_prefill_params_t *p);
    void (*destroy)(void *ctx);
    /* Conversions (above). 0, KV_EINVAL, KV_ENOTSUP (format), KV_ENOMEM
     * (only without scratch). NULL: not offered by this backend; callers
     * go through kv_backend_convert & co, which then run the CPU
     * reference. */
    int  (*convert)(void *ctx, const kv_convert_params_t *p);
    int  (*merge_select)(void *ctx, const kv_merge_params_t *p);
    int  (*merge)(void *ctx, const kv_merge_params_t *p);
    /* KVzip scoring (above): 0, KV_EINVAL, KV_ENOMEM. NULL: the CPU
     * reference through kv_backend_zip_score, on the calling thread. */
    int  (*zip_score)(void *ctx, const kv_zip_score_params_t *p);
} kv_backend_ops_t;

typedef struct kv_backend {
    const kv_backend_ops_t *ops;
    void *ctx;
} kv_backend_t;

/* kv_backend_cpu_create flags */
#define KV_BACKEND_INT8 0x1u /* INT4/INT2 attention with int8 dot products */
                             /* (approximate: kernels/cpu/kv_cpu_fmt_i8.c) */

/* The CPU reference backend. n_threads 0 = online CPUs; flags KV_BACKEND_*
 * (KV_ENOTSUP: KV_BACKEND_INT8 on a CPU without AVX-512 VNNI and VBMI;
 * KV_EINVAL: unknown bits). */
int kv_backend_cpu_create(uint32_t n_threads, uint32_t flags,
                          kv_backend_t *out);
/* The CUDA backend (kernels/cuda/kv_cuda.h defines the config; only in
 * builds with CUDA, library kvpage_cuda). KV_ENOTSUP without a usable GPU,
 * KV_EINVAL for a bad config. */
typedef struct kv_cuda_config kv_cuda_config_t;
int kv_backend_cuda_create(const kv_cuda_config_t *cfg, kv_backend_t *out);
/* Destroy any backend (ops->destroy(ctx)); NULL ops is a no-op. */
void kv_backend_destroy(kv_backend_t *b);

/* Run a conversion on backend b (kernels/kv_backend_convert.c): its op when
 * it has one, else the CPU reference (also when b is NULL). */
int kv_backend_convert(const kv_backend_t *b, const kv_convert_params_t *p);
int kv_backend_merge_select(const kv_backend_t *b, const kv_merge_params_t *p);
int kv_backend_merge(const kv_backend_t *b, const kv_merge_params_t *p);
/* KVzip scoring on backend b: its op, else the CPU reference (one thread). */
int kv_backend_zip_score(const kv_backend_t *b, const kv_zip_score_params_t *p);

#endif /* KV_BACKEND_H */
