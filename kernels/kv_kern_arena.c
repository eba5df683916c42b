/* SPDX-License-Identifier: MIT */
/*
 * kv_kern_arena.c — the two-pass scratch arena of kv_kern.h, used by the
 * CPU drivers (kernels/cpu/kv_cpu_decode.c, kv_cpu_prefill.c) and the CUDA
 * planner (kernels/cuda/kv_cuda_plan.cu). No state of its own.
 */
#include <stdint.h>

#include "alloc/kv_mem.h"
#include "kernels/kv_kern.h"

void *kv_kern_arena_take(kv_kern_arena_t *a, size_t n)
{
    size_t at = a->used;
    a->used += (n + KV_KERN_ALIGN - 1) / KV_KERN_ALIGN * KV_KERN_ALIGN;
    return a->base ? a->base + at : NULL;
}

int kv_kern_arena_alloc(kv_kern_arena_t *a)
{
    a->block_bytes = a->used + KV_KERN_ALIGN;
    a->block = kv_mem_alloc(a->block_bytes);
    if (!a->block)
        return KV_ENOMEM;
    uintptr_t p = (uintptr_t)a->block;
    a->base =
        (char *)((p + KV_KERN_ALIGN - 1) & ~(uintptr_t)(KV_KERN_ALIGN - 1));
    a->used = 0;
    return 0;
}

void kv_kern_arena_free(kv_kern_arena_t *a)
{
    kv_mem_free(a->block, a->block_bytes);
    a->block = NULL;
    a->base = NULL;
}
