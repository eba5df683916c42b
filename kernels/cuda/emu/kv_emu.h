/* SPDX-License-Identifier: MIT */
/*
 * kv_emu.h — the device side of the CUDA emulation (docs/gpu.md,
 * "Emulation"): what a kernel source of kernels/cuda/ needs beyond the
 * toolkit's host headers when it is compiled as host C++ (g++/clang++)
 * instead of by nvcc. Force-included (-include) before every emulated .cu,
 * so the kernel sources are unchanged but for KV_CUDA_LAUNCH and
 * KV_CUDA_DYN_SMEM (kv_cuda_int.cuh), which expand to <<<>>> and extern
 * __shared__ under nvcc.
 *
 * Execution model (kv_emu_runtime.cpp): one block at a time on the calling
 * host thread, its threads as fibers; threadIdx/blockIdx/blockDim/gridDim
 * are globals the scheduler sets on every fiber switch (the emulated device
 * runs one block at a time, process-wide, under one lock). __shared__ is
 * `static`: one instance per kernel, reused by every block (blocks never
 * overlap); ASan sees its bounds like any global's. Dynamic shared memory
 * is a fresh heap block per block, filled with 0xff (initcheck).
 * __syncthreads, __syncwarp and the shuffles are real barriers over the
 * block's (warp's) fibers; a barrier that not every thread reaches, or that
 * threads reach from different call sites, is reported (synccheck) and
 * fails the launch. cp.async copies run when the issuing thread waits for
 * their group (the latest moment the hardware may complete them).
 */
#ifndef KV_EMU_H
#define KV_EMU_H

#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <utility>

#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

/* Set by the scheduler before a fiber runs (kv_emu_runtime.cpp). */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

extern "C++" {

/* A kernel's host-side identity: registered by the emulation's wrapper
 * sources (kv_emu_kernels.cpp) with what cudaFuncGetAttributes reports for
 * it on sm_90; launching or querying an unregistered kernel fails with
 * cudaErrorInvalidDeviceFunction, as for a kernel not built for the
 * device. */
void kv_emu_register(const void *func, const char *name, size_t static_smem,
                     int max_threads);

/* Runs (or queues on stream s) one launch; fn(arg) is one thread's body;
 * copy(arg) / drop(arg) duplicate and free the launch's arguments, which
 * are captured by value at the launch as in CUDA. */
cudaError_t kv_emu_launch_raw(const void *func, dim3 grid, dim3 block,
                              size_t smem, cudaStream_t s, void (*fn)(void *),
                              void *arg, void (*drop)(void *));

template <typename... P> struct kv_emu_call {
    void (*k)(P...);
    std::tuple<P...> args;
    static void run(void *p)
    {
        kv_emu_call *c = (kv_emu_call *)p;
        std::apply(c->k, c->args); /* a copy of the arguments per thread */
    }
    static void drop(void *p) { delete (kv_emu_call *)p; }
};

template <typename... P, typename... A>
cudaError_t kv_emu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t s, A &&...a)
{
    auto *c = new kv_emu_call<P...>{k, std::tuple<P...>(std::forward<A>(a)...)};
    return kv_emu_launch_raw((const void *)k, grid, block, smem, s,
                             kv_emu_call<P...>::run, c, kv_emu_call<P...>::drop);
}

void *kv_emu_dyn_smem(void);
/* Test hook (tests/cuda/emu/test_cuda_emu_runtime.cpp): forget the sticky
 * error of a failed launch, which on a device lasts as long as the
 * process's context. */
void kv_emu_reset_sticky(void);
struct kv_emu_site {
    const char *file;
    int line;
};
void kv_emu_syncthreads(kv_emu_site at);
void kv_emu_syncwarp(kv_emu_site at, unsigned mask = 0xffffffffu);
uint64_t kv_emu_shfl_xor(kv_emu_site at, unsigned mask, uint64_t v,
                         int lane_mask, int width);
void kv_emu_cp_async(void *dst, const void *src, size_t n);
void kv_emu_cp_commit(void);
void kv_emu_cp_wait(size_t prior);

} /* extern "C++" */

/* The C++ overloads cuda_runtime.h declares only under nvcc. */
template <typename F>
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F *f)
{
    return ::cudaFuncGetAttributes(a, (const void *)f);
}
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *f, cudaFuncAttribute at,
                                               int v)
{
    return ::cudaFuncSetAttribute((const void *)f, at, v);
}

/* Barriers and shuffles carry their source line (kernels/cuda/ sources):
 * threads arriving at one barrier from different lines are divergent
 * (synccheck). Source lines, not return addresses: the compiler may
 * duplicate one barrier call into several paths. */
#define KV_EMU_SITE (kv_emu_site{__FILE__, __LINE__})
#define __syncthreads() kv_emu_syncthreads(KV_EMU_SITE)
#define __syncwarp(...) kv_emu_syncwarp_at{KV_EMU_SITE}(__VA_ARGS__)

/* __syncwarp() and __syncwarp(mask) */
struct kv_emu_syncwarp_at {
    kv_emu_site at;
    void operator()(unsigned mask = 0xffffffffu) const
    {
        kv_emu_syncwarp(at, mask);
    }
};
#define __shfl_xor_sync(...) kv_emu_shfl_xor_sync(KV_EMU_SITE, __VA_ARGS__)

template <typename V>
static inline V kv_emu_shfl_xor_sync(kv_emu_site at, unsigned mask, V v,
                                     int lane_mask, int width = 32)
{
    static_assert(sizeof(V) <= 8, "a shuffled value fits 64 bits");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = kv_emu_shfl_xor(at, mask, b, lane_mask, width);
    memcpy(&v, &b, sizeof v);
    return v;
}

#endif /* KV_EMU_H */
