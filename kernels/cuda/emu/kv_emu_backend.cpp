/* SPDX-License-Identifier: MIT */
/*
 * kv_emu_backend.cpp — kernels/cuda/kv_cuda_backend.cu compiled as host C++ for the
 * CUDA emulation (docs/gpu.md, "Emulation"), unchanged: its CUDA runtime
 * calls go to kv_emu_runtime.cpp.
 */
#include "kernels/cuda/kv_cuda_backend.cu"
