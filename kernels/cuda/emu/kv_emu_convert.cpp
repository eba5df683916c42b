/* SPDX-License-Identifier: MIT */
/*
 * kv_emu_convert.cpp — kernels/cuda/kv_cuda_convert.cu compiled as host
 * C++ for the CUDA emulation (docs/gpu.md, "Emulation"), and the
 * registration of its kernels with the emulator (static shared memory: the
 * kernel's two [16][D] float arrays).
 */
#include "kernels/cuda/kv_cuda_convert.cu"

namespace {

struct convert_registration {
    convert_registration()
    {
        kv_emu_register((const void *)convert_kernel<64>, "convert_kernel<64>",
                        2 * sizeof(float) * CH * 64, KV_CUDA_THREADS);
        kv_emu_register((const void *)convert_kernel<128>,
                        "convert_kernel<128>", 2 * sizeof(float) * CH * 128,
                        KV_CUDA_THREADS);
    }
} convert_registration_;

} // namespace
