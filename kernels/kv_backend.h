/*
 * kv_backend.h — the compute backend interface (ops table + context).
 *
 * A backend computes over pages it is handed: it knows page formats (through
 * pages/kv_format.h) but not page tables, sequences or policies. The caller
 * (engine/kv_store.c) resolves each (sequence, kv_head) list into a run of
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

#include "pages/kv_format.h"

typedef struct kv_kern_page {
    const void *data;  /* page bytes (host memory for the CPU backend) */
    uint32_t n_tokens; /* tokens used in this page                     */
    uint32_t format;   /* kv_format_t                                  */
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

typedef struct kv_backend_ops {
    const char *name;
    /* 0, KV_EINVAL (inconsistent params), KV_ENOTSUP (format), KV_ENOMEM. */
    int  (*attn_decode)(void *ctx, const kv_attn_decode_params_t *p);
    int  (*attn_prefill)(void *ctx, const kv_attn_prefill_params_t *p);
    void (*destroy)(void *ctx);
} kv_backend_ops_t;

typedef struct kv_backend {
    const kv_backend_ops_t *ops;
    void *ctx;
} kv_backend_t;

/* The CPU reference backend. n_threads 0 = online CPUs. */
int kv_backend_cpu_create(uint32_t n_threads, kv_backend_t *out);
/* Destroy any backend (ops->destroy(ctx)); NULL ops is a no-op. */
void kv_backend_destroy(kv_backend_t *b);

#endif /* KV_BACKEND_H */
