/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_emu_tiles.cpp — tests/cuda/test_cuda_tiles.cu compiled as host
 * C++ for the CUDA emulation build (docs/gpu.md, "Emulation"): the
 * attention kernel's tile, window and row helpers of kv_cuda_int.cuh as the
 * emulated kernels compile them.
 */
#include "cuda/test_cuda_tiles.cu"
