/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_emu_runtime.cpp — the CUDA emulator itself (kernels/cuda/emu/,
 * docs/gpu.md "Emulation"), with small kernels written for it:
 *   barriers  __syncthreads orders every thread's shared writes before any
 *             read after it; shuffles and __syncwarp exchange within a warp;
 *   synccheck a barrier some threads skip, reach from another line, or
 *             exit before, fails the launch (cudaErrorLaunchFailure at the
 *             next synchronizing call), as does a warp op with a partial
 *             mask;
 *   limits    dynamic shared memory over 48 KiB minus the static part
 *             without the opt-in, or an opt-in over 227 KiB minus it, fails
 *             as on sm_90 (cudaErrorInvalidValue); unregistered kernels and
 *             bad configurations fail at launch;
 *   ordering  stream work runs when the host waits, not before; events;
 *             cp.async groups complete at __pipeline_wait_prior;
 *   memory    fresh device memory is 0xff bytes (initcheck), copies check
 *             their device ranges.
 * Compiled with kv_emu.h force-included, as the emulated kernels are.
 */
#include <cuda_pipeline.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/kv_cuda_int.cuh"
#include "kv_test.h"

namespace {

constexpr uint32_t N = 128;

__global__ void rotate_kernel(const int *in, int *out)
{
    __shared__ int sh[N];
    const uint32_t t = threadIdx.x;
    sh[t] = in[blockIdx.x * N + t] * 2;
    __syncthreads();
    out[blockIdx.x * N + t] = sh[(t + 1) % N];
}

__global__ void shfl_kernel(float *out)
{
    float x = (float)threadIdx.x;
    for (int o = 16; o > 0; o /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    __shared__ float w[N];
    w[threadIdx.x] = (float)threadIdx.x;
    __syncwarp();
    out[threadIdx.x] = x + w[threadIdx.x ^ 1] * 1000.0f;
}

__global__ void skip_barrier_kernel(int *out)
{
    if (threadIdx.x < 64)
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void divergent_kernel(int *out)
{
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void exit_early_kernel(int *out)
{
    if (threadIdx.x == 5)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void partial_mask_kernel(int *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0xffffu, (int)threadIdx.x, 1);
}

__global__ void dyn_kernel(int *out, uint32_t n)
{
    KV_CUDA_DYN_SMEM(int, d);
    __shared__ int st[2048]; /* 8 KiB static */
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        d[i] = (int)i;
    st[threadIdx.x] = 0;
    __syncthreads();
    if (threadIdx.x == 0)
        out[0] = d[n - 1] + st[0];
}

__global__ void cp_kernel(const int *src, int *out)
{
    __shared__ __align__(16) int buf[4];
    if (threadIdx.x == 0) {
        buf[0] = -1;
        __pipeline_memcpy_async(buf, src, 16);
        __pipeline_commit();
        out[0] = buf[0]; /* not yet waited for: the old value */
        __pipeline_wait_prior(0);
        out[1] = buf[0];
    }
}

__global__ void unregistered_kernel(int *out) { out[0] = 1; }

struct registration {
    registration()
    {
        kv_emu_register((const void *)rotate_kernel, "rotate_kernel",
                        N * sizeof(int), (int)N);
        kv_emu_register((const void *)shfl_kernel, "shfl_kernel",
                        N * sizeof(float), (int)N);
        kv_emu_register((const void *)skip_barrier_kernel,
                        "skip_barrier_kernel", 0, (int)N);
        kv_emu_register((const void *)divergent_kernel, "divergent_kernel", 0,
                        (int)N);
        kv_emu_register((const void *)exit_early_kernel, "exit_early_kernel",
                        0, (int)N);
        kv_emu_register((const void *)partial_mask_kernel,
                        "partial_mask_kernel", 0, (int)N);
        kv_emu_register((const void *)dyn_kernel, "dyn_kernel",
                        2048 * sizeof(int), 1024);
        kv_emu_register((const void *)cp_kernel, "cp_kernel",
                        4 * sizeof(int), 32);
    }
} registration_;

void test_barrier_and_streams(void)
{
    const uint32_t blocks = 3, n = blocks * N;
    int h_in[blocks * N], h_out[blocks * N];
    for (uint32_t i = 0; i < n; i++) {
        h_in[i] = (int)i;
        h_out[i] = 7;
    }
    int *d_in = nullptr, *d_out = nullptr;
    CHECK_EQ(cudaMalloc((void **)&d_in, sizeof h_in), cudaSuccess);
    CHECK_EQ(cudaMalloc((void **)&d_out, sizeof h_out), cudaSuccess);
    if (!d_in || !d_out)
        return;
    const unsigned char *raw = (const unsigned char *)d_out;
    CHECK(raw[0] == 0xff && raw[sizeof h_out - 1] == 0xff); /* initcheck */
    cudaStream_t s;
    CHECK_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
             cudaSuccess);
    cudaEvent_t ev;
    CHECK_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
             cudaSuccess);
    CHECK_EQ(cudaMemcpyAsync(d_in, h_in, sizeof h_in, cudaMemcpyHostToDevice,
                             s),
             cudaSuccess);
    KV_CUDA_LAUNCH(rotate_kernel, blocks, N, 0, s, d_in, d_out);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_EQ(cudaMemcpyAsync(h_out, d_out, sizeof h_out,
                             cudaMemcpyDeviceToHost, s),
             cudaSuccess);
    CHECK_EQ(cudaEventRecord(ev, s), cudaSuccess);
    CHECK_EQ(h_out[0], 7); /* queued: nothing ran yet */
    CHECK_EQ(cudaEventQuery(ev), cudaErrorNotReady);
    CHECK_EQ(cudaEventQuery(ev), cudaSuccess);
    CHECK_EQ(cudaStreamSynchronize(s), cudaSuccess);
    int bad = 0;
    for (uint32_t b = 0; b < blocks; b++)
        for (uint32_t t = 0; t < N; t++)
            bad += h_out[b * N + t] != (int)(b * N + (t + 1) % N) * 2;
    CHECK_EQ(bad, 0);
    /* a host pointer where a device range is due */
    CHECK_EQ(cudaMemcpyAsync(h_out, h_in, 16, cudaMemcpyHostToDevice, s),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaMemcpyAsync(d_out, h_in, sizeof h_out + 4,
                             cudaMemcpyHostToDevice, s),
             cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CHECK_EQ(cudaEventDestroy(ev), cudaSuccess);
    CHECK_EQ(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ(cudaFree(d_in), cudaSuccess);
    CHECK_EQ(cudaFree(d_out), cudaSuccess);
}

void test_shfl(void)
{
    float *d = nullptr, h[N];
    CHECK_EQ(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
    KV_CUDA_LAUNCH(shfl_kernel, 1, N, 0, (cudaStream_t) nullptr, d);
    CHECK_EQ(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    int bad = 0;
    for (uint32_t t = 0; t < N; t++) {
        const uint32_t w0 = t / 32 * 32;
        const float sum = (float)(32 * w0 + 31 * 32 / 2);
        bad += h[t] != sum + (float)(t ^ 1) * 1000.0f;
    }
    CHECK_EQ(bad, 0);
    cudaFree(d);
}

void test_limits(void)
{
    int *d = nullptr, h = 0;
    CHECK_EQ(cudaMalloc((void **)&d, 4), cudaSuccess);
    cudaStream_t s0 = nullptr;
    cudaFuncAttributes fa;
    CHECK_EQ(cudaFuncGetAttributes(&fa, dyn_kernel), cudaSuccess);
    CHECK_EQ(fa.sharedSizeBytes, 8192u);
    CHECK_EQ(fa.maxDynamicSharedSizeBytes, 48 * 1024 - 8192);
    /* 40 KiB + 8 KiB static: the default limit, fits */
    KV_CUDA_LAUNCH(dyn_kernel, 1, 128, 40 * 1024, s0, d, 10240u);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_EQ(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK_EQ(h, 10239);
    /* 4 bytes more: over 48 KiB without the opt-in */
    KV_CUDA_LAUNCH(dyn_kernel, 1, 128, 40 * 1024 + 4, s0, d, 10241u);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    /* opt in to 219 KiB (227 KiB with the static part): fits */
    CHECK_EQ(cudaFuncSetAttribute(dyn_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  219 * 1024),
             cudaSuccess);
    KV_CUDA_LAUNCH(dyn_kernel, 1, 128, 219 * 1024, s0, d, 219u * 256u);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_EQ(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK_EQ(h, 219 * 256 - 1);
    KV_CUDA_LAUNCH(dyn_kernel, 1, 128, 219 * 1024 + 16, s0, d, 16u);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    /* an opt-in past 227 KiB in all is refused */
    CHECK_EQ(cudaFuncSetAttribute(dyn_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  219 * 1024 + 4),
             cudaErrorInvalidValue);
    (void)cudaGetLastError();
    /* configurations */
    KV_CUDA_LAUNCH(dyn_kernel, 1, 1025, 0, s0, d, 1u);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    KV_CUDA_LAUNCH(dyn_kernel, 0, 128, 0, s0, d, 1u);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    KV_CUDA_LAUNCH(rotate_kernel, 1, 256, 0, s0, (const int *)d, d);
    CHECK_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources); /* bounds */
    KV_CUDA_LAUNCH(unregistered_kernel, 1, 32, 0, s0, d);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
    CHECK_EQ(cudaFuncGetAttributes(&fa, unregistered_kernel),
             cudaErrorInvalidDeviceFunction);
    (void)cudaGetLastError();
    CHECK_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(d);
}

void test_cp_async(void)
{
    int *src = nullptr, *out = nullptr, h[2] = {0, 0};
    const int v[4] = {41, 42, 43, 44};
    CHECK_EQ(cudaMalloc((void **)&src, sizeof v), cudaSuccess);
    CHECK_EQ(cudaMalloc((void **)&out, sizeof h), cudaSuccess);
    CHECK_EQ(cudaMemcpy(src, v, sizeof v, cudaMemcpyHostToDevice),
             cudaSuccess);
    KV_CUDA_LAUNCH(cp_kernel, 1, 32, 0, (cudaStream_t) nullptr, src, out);
    CHECK_EQ(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost),
             cudaSuccess);
    CHECK_EQ(h[0], -1);
    CHECK_EQ(h[1], 41);
    cudaFree(src);
    cudaFree(out);
}

/* A kernel that must fail synccheck: the launch is accepted, the failure
 * comes at the next synchronizing call. */
void expect_sync_failure(void (*k)(int *), const char *what)
{
    int *d = nullptr;
    CHECK_EQ(cudaMalloc((void **)&d, N * sizeof(int)), cudaSuccess);
    KV_CUDA_LAUNCH(k, 2, N, 0, (cudaStream_t) nullptr, d);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaErrorLaunchFailure)
        fprintf(stderr, "%s: synccheck did not fail the launch\n", what);
    CHECK_EQ(e, cudaErrorLaunchFailure);
    kv_emu_reset_sticky();
    (void)cudaGetLastError();
    cudaFree(d);
}

} // namespace

int main(void)
{
    printf("test_cuda_emu_runtime: the CUDA emulator (emulated, no GPU); "
           "the synccheck reports below are expected\n");
    test_barrier_and_streams();
    test_shfl();
    test_limits();
    test_cp_async();
    expect_sync_failure(skip_barrier_kernel, "a barrier half the block skips");
    expect_sync_failure(divergent_kernel, "two barrier lines");
    expect_sync_failure(exit_early_kernel, "a thread exits before a barrier");
    expect_sync_failure(partial_mask_kernel, "a partial shuffle mask");
    test_barrier_and_streams(); /* the emulator works on after a failure */
    return kv_test_end();
}
