/* SPDX-License-Identifier: MIT */
/*
 * kv_kern.h — what every backend shares (kernels/, backend-neutral; each
 * backend's own code lives in kernels/cpu/ and kernels/cuda/):
 *
 *   kv_kern_check.c   validation of the ops' parameters: the same bad input
 *                     gets the same error from every backend, and nothing is
 *                     written before it passes
 *   kv_kern_arena.c   per-call scratch carved from one kv_mem block in two
 *                     passes (sizing, then handing out)
 *
 * Limits every backend accepts (a backend may accept less and say
 * KV_ENOTSUP: CUDA instantiates head_dim 64 and 128 only).
 */
#ifndef KV_KERN_H
#define KV_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kv_backend.h"

#define KV_KERN_DIM_STEP 8u    /* head_dim is a multiple of this   */
#define KV_KERN_MAX_DIM  4096u /* and at most this                 */
#define KV_KERN_ALIGN    64u   /* alignment of arena sub-blocks    */

/* ---- validation (kv_kern_check.c): 0, KV_EINVAL or KV_ENOTSUP ---------- */

int kv_kern_check_decode(const kv_attn_decode_params_t *p);
int kv_kern_check_prefill(const kv_attn_prefill_params_t *p);

/* The source-run check of every backend's conversions: 0 if need == 0, or
 * if pages[0..n) (n >= 1) each have data, a known format (else KV_ENOTSUP),
 * 1 .. its tokens_per_page tokens and a variant it reads (0, or 1 with
 * load_variant), and hold >= off + need tokens in all; else KV_EINVAL. */
int kv_kern_check_run(const kv_page_geom_t *g, const kv_kern_page_t *pages,
                      uint32_t n, uint32_t off, uint32_t need);

/* ---- the two-pass arena (kv_kern_arena.c) ------------------------------- */

/* Scratch carving: run the carving code once with base NULL (sizing: every
 * take returns NULL and only counts), allocate, run it again (handing
 * out), so sizes and addresses cannot disagree. One kv_mem block per call,
 * so failure injection and leak accounting see it. */
typedef struct kv_kern_arena {
    char *base;         /* KV_KERN_ALIGN-aligned start; NULL while sizing */
    size_t used;        /* bytes handed out (or reserved while sizing)    */
    void *block;        /* the kv_mem block and its size                  */
    size_t block_bytes;
} kv_kern_arena_t;

/* Reserve n bytes (rounded up to KV_KERN_ALIGN) in a sizing pass, or hand
 * them out. */
void *kv_kern_arena_take(kv_kern_arena_t *a, size_t n);
/* After a sizing pass: allocate a->used bytes (KV_ENOMEM on failure) and
 * start handing out from the beginning. */
int kv_kern_arena_alloc(kv_kern_arena_t *a);
void kv_kern_arena_free(kv_kern_arena_t *a);

#endif /* KV_KERN_H */
