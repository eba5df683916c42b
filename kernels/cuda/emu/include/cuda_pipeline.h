/* SPDX-License-Identifier: MIT */
/*
 * cuda_pipeline.h (emulation) — stands in for the toolkit's header of the
 * same name in the emulation build only (this folder comes first on its
 * include path): the cp.async primitives the kernels use, over
 * kv_emu_runtime.cpp's per-thread copy groups (kv_emu.h).
 */
#ifndef KV_EMU_CUDA_PIPELINE_H
#define KV_EMU_CUDA_PIPELINE_H

#include "kernels/cuda/emu/kv_emu.h"

static inline void __pipeline_memcpy_async(void *dst, const void *src,
                                           size_t n)
{
    kv_emu_cp_async(dst, src, n);
}
static inline void __pipeline_commit(void) { kv_emu_cp_commit(); }
static inline void __pipeline_wait_prior(size_t prior)
{
    kv_emu_cp_wait(prior);
}

#endif /* KV_EMU_CUDA_PIPELINE_H */
