/* SPDX-License-Identifier: MIT */
/*
 * kv_emu_attn.cpp — kernels/cuda/kv_cuda_attn.cu compiled as host C++ for
 * the CUDA emulation (docs/gpu.md, "Emulation"; kv_emu.h is force-included
 * before it), and the registration of its kernels with the emulator: what
 * cudaFuncGetAttributes answers for each (static shared memory, the
 * __launch_bounds__ thread count), as sm_90 would up to alignment padding.
 */
#include "kernels/cuda/kv_cuda_attn.cu"

namespace {

/* stats_kernel<D>'s __shared__ arrays, as declared there */
constexpr size_t stats_smem(uint32_t d)
{
    return sizeof(float) * (ST * (d + 1) + QROWS * d + QROWS + 2 * ST) +
           sizeof(uint32_t) * (QROWS + 2 * ST);
}

#define KV_EMU_REG_ATTN(D, R, ROT)                                          \
    kv_emu_register((const void *)attn_kernel<D, R, ROT>,                   \
                    "attn_kernel<" #D "," #R "," #ROT ">",                  \
                    sizeof(attn_smem<D, R, ROT>), KV_CUDA_THREADS)

struct attn_registration {
    attn_registration()
    {
        KV_EMU_REG_ATTN(64, 4, false);
        KV_EMU_REG_ATTN(64, 8, false);
        KV_EMU_REG_ATTN(64, 4, true);
        KV_EMU_REG_ATTN(64, 8, true);
        KV_EMU_REG_ATTN(128, 4, false);
        KV_EMU_REG_ATTN(128, 8, false);
        KV_EMU_REG_ATTN(128, 4, true);
        KV_EMU_REG_ATTN(128, 8, true);
        kv_emu_register((const void *)reduce_kernel, "reduce_kernel", 0,
                        KV_CUDA_THREADS);
        kv_emu_register((const void *)stats_kernel<64>, "stats_kernel<64>",
                        stats_smem(64), KV_CUDA_THREADS);
        kv_emu_register((const void *)stats_kernel<128>, "stats_kernel<128>",
                        stats_smem(128), KV_CUDA_THREADS);
    }
} attn_registration_;

} // namespace
