/* SPDX-License-Identifier: MIT */
/*
 * kv_emu_runtime.cpp — the CUDA emulation's runtime (docs/gpu.md,
 * "Emulation"): the CUDA execution model on the CPU for the kernels of
 * kernels/cuda/ compiled as host C++, and the subset of the CUDA runtime
 * API the backend calls, over host memory.
 *
 * Device. One emulated sm_90 device, process-wide, behind one recursive
 * lock (emu_mu): every API call and every block runs under it, so the
 * `static` __shared__ variables and the threadIdx/blockIdx globals of
 * kv_emu.h belong to the one block in flight. A block's threads are fibers
 * (x86-64: a 22-instruction stack switch, kv_emu_switch; elsewhere
 * ucontext) on the launching host thread, scheduled round robin; a thread
 * runs until it waits at a barrier (__syncthreads: the block's threads;
 * __syncwarp and shuffles: its warp's 32 lanes). Synccheck: a barrier that
 * some thread of the block (warp) never reaches leaves no fiber runnable,
 * and threads arriving at one barrier from different call sites are
 * reported; either fails the launch with a sticky cudaErrorLaunchFailure,
 * reported at the next synchronizing call, as a device fault is.
 * Fibers are ASan-annotated (__sanitizer_start/finish_switch_fiber).
 *
 * Race check (KV_EMU_RACECHECK: this file built plain, the kernels with
 * -fsanitize=thread): every emulated thread is a ThreadSanitizer fiber,
 * switched without implied ordering (__tsan_switch_to_fiber_no_sync), and
 * the only happens-before edges between a block's threads are its
 * barriers (each arrival releases the barrier, each departure acquires
 * it: __syncthreads for the block, __syncwarp and shuffles for a warp).
 * So TSan reports two threads of a block touching one address (shared or
 * global memory, through any pointer), one of them writing, with no
 * barrier between them. Blocks and launches are ordered one after another
 * (an epoch released at a block's end, acquired at the next's start).
 *
 * Streams. Work (kernels, async copies, event records) is queued per
 * stream and runs only when the host synchronizes (stream/event/device
 * synchronize, a blocking copy, cudaFree) or queries an event: the latest
 * a device may run it, so a host that reads results without waiting reads
 * stale memory. The legacy default stream orders with blocking streams.
 * An event queried before its work ran answers cudaErrorNotReady once (the
 * query lets the stream run up to it).
 *
 * Memory. cudaMalloc/cudaHostAlloc are heap blocks (ASan bounds), filled
 * with 0xff bytes (initcheck: NaN floats, huge indices); copies check that
 * device ranges lie in device allocations (cudaErrorInvalidValue).
 *
 * Launch checks as on sm_90: at most 1024 threads per block (and the
 * kernel's registered maximum), grid and block dimension limits; dynamic
 * shared memory at most cudaFuncAttributeMaxDynamicSharedMemorySize,
 * whose default is 48 KiB minus the kernel's static shared memory and
 * which cudaFuncSetAttribute may raise to 227 KiB minus it.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/emu/kv_emu.h"

#if defined(__SANITIZE_ADDRESS__)
#define KV_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KV_EMU_ASAN 1
#endif
#endif
#ifdef KV_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#ifdef KV_EMU_RACECHECK
#include <sanitizer/tsan_interface.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

constexpr size_t SMEM_DEFAULT = 48u * 1024u;   /* without the opt-in      */
constexpr size_t SMEM_OPTIN = 227u * 1024u;    /* sm_90 per block, opt-in */
constexpr int SM_COUNT = 132;                  /* H100/H200 SXM           */
#ifdef KV_EMU_ASAN
constexpr size_t STACK_BYTES = 512u * 1024u;
#else
constexpr size_t STACK_BYTES = 128u * 1024u;
#endif

std::recursive_mutex emu_mu;
thread_local cudaError_t last_error = cudaSuccess;
cudaError_t sticky = cudaSuccess; /* a failed kernel: the context is gone */

cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

/* ---- kernels ------------------------------------------------------------ */

struct kernel_info {
    const char *name;
    size_t static_smem;
    int max_threads;
    size_t max_dyn; /* cudaFuncAttributeMaxDynamicSharedMemorySize */
    uint64_t launches = 0, blocks = 0;
};

/* The registered kernels; at exit, with KV_EMU_REPORT set, how often each
 * ran (the cuda_emu tests set it: every kernel must run somewhere). */
struct kernel_table {
    std::map<const void *, kernel_info> m;
    ~kernel_table()
    {
        if (getenv("KV_EMU_REPORT"))
            for (auto &kv : m)
                fprintf(stderr,
                        "kv_emu: kernel %s: %llu launches, %llu blocks "
                        "(emulated)\n",
                        kv.second.name, (unsigned long long)kv.second.launches,
                        (unsigned long long)kv.second.blocks);
    }
};

std::map<const void *, kernel_info> &kernels()
{
    static kernel_table k;
    return k.m;
}

/* ---- fibers ------------------------------------------------------------- */

#if defined(__x86_64__)
/* kv_emu_switch(&save_sp, new_sp): push the callee-saved registers, MXCSR
 * and the x87 control word, save rsp, load new_sp, pop the same. */
extern "C" void kv_emu_switch(void **save, void *next);
asm(".text\n"
    ".globl kv_emu_switch\n"
    ".type kv_emu_switch,@function\n"
    "kv_emu_switch:\n"
    "  pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n"
    "  pushq %r14\n pushq %r15\n"
    "  subq $8, %rsp\n stmxcsr (%rsp)\n fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n fldcw 4(%rsp)\n addq $8, %rsp\n"
    "  popq %r15\n popq %r14\n popq %r13\n popq %r12\n"
    "  popq %rbx\n popq %rbp\n ret\n"
    ".size kv_emu_switch, .-kv_emu_switch\n"
    ".section .note.GNU-stack,\"\",@progbits\n"
    ".text\n");
#endif

struct copy_op {
    void *dst;
    const void *src;
    size_t n;
};

enum { F_READY, F_WAIT, F_DONE };

struct fiber {
    char *stack = nullptr;
    void *tsan = nullptr; /* KV_EMU_RACECHECK: the thread's TSan fiber */
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t uc;
#endif
    int state = F_READY;
    const uint64_t *wait_gen = nullptr; /* F_WAIT: runnable once != gen */
    uint64_t gen = 0;
    uint3 tid{};
    uint32_t lin = 0; /* linear thread index */
    std::vector<copy_op> cp;          /* issued cp.async copies          */
    std::vector<size_t> cp_groups;    /* committed groups: ends in cp    */
    void *fake_stack = nullptr;       /* ASan */
};

struct barrier {
    uint64_t gen = 0;
    uint32_t arrived = 0, expected = 0;
    kv_emu_site site{nullptr, 0};
    uint64_t slot[2][32] = {}; /* warps: shuffle exchange, by gen parity */
};

/* The block in flight (one at a time: emu_mu). */
struct block_run {
    std::vector<fiber> f;
    uint32_t n = 0, cur = 0;
    barrier bar;
    std::vector<barrier> warp;
    void (*fn)(void *) = nullptr;
    void *arg = nullptr;
    void *dyn = nullptr;
    const char *kname = "";
    bool failed = false;
#if defined(__x86_64__)
    void *host_sp = nullptr;
#else
    ucontext_t host_uc;
#endif
    const void *host_stack_bottom = nullptr; /* ASan: the host's stack */
    size_t host_stack_size = 0;
    void *host_fake = nullptr;
    void *host_tsan = nullptr;
};

#ifdef KV_EMU_RACECHECK
char epoch; /* TSan sync address ordering blocks and launches */
#define KV_EMU_TSAN(...) __VA_ARGS__
#else
#define KV_EMU_TSAN(...)
#endif

block_run *B = nullptr;

void sync_error(const char *what, const char *detail)
{
    if (!B->failed)
        fprintf(stderr,
                "kv_emu: synccheck: kernel %s, block (%u,%u,%u), thread "
                "(%u,%u,%u): %s%s\n",
                B->kname, blockIdx.x, blockIdx.y, blockIdx.z,
                B->f[B->cur].tid.x, B->f[B->cur].tid.y, B->f[B->cur].tid.z,
                what, detail);
    B->failed = true;
}

bool runnable(const fiber &x)
{
    return x.state == F_READY ||
           (x.state == F_WAIT && *x.wait_gen != x.gen);
}

/* Switch from the running context (fiber `from`, or the host when from is
 * n) to fiber `to` (or the host when to is n). */
void switch_to(uint32_t from, uint32_t to)
{
    const uint32_t n = B->n;
#ifdef KV_EMU_ASAN
    void **fake = from == n                     ? &B->host_fake
                  : B->f[from].state != F_DONE ? &B->f[from].fake_stack
                                               : nullptr;
    if (to < n)
        __sanitizer_start_switch_fiber(fake, B->f[to].stack, STACK_BYTES);
    else
        __sanitizer_start_switch_fiber(fake, B->host_stack_bottom,
                                       B->host_stack_size);
#endif
    if (to < n) {
        B->cur = to;
        threadIdx = B->f[to].tid;
        if (B->f[to].state == F_WAIT)
            B->f[to].state = F_READY;
    }
    KV_EMU_TSAN(__tsan_switch_to_fiber(to < n ? B->f[to].tsan : B->host_tsan,
                                       __tsan_switch_to_fiber_no_sync));
#if defined(__x86_64__)
    void **save = from < n ? &B->f[from].sp : &B->host_sp;
    kv_emu_switch(save, to < n ? B->f[to].sp : B->host_sp);
#else
    swapcontext(from < n ? &B->f[from].uc : &B->host_uc,
                to < n ? &B->f[to].uc : &B->host_uc);
#endif
#ifdef KV_EMU_ASAN
    /* back in `from` */
    if (from < n)
        __sanitizer_finish_switch_fiber(B->f[from].fake_stack, nullptr,
                                        nullptr);
    else
        __sanitizer_finish_switch_fiber(B->host_fake, nullptr, nullptr);
#endif
}

/* The running fiber gives way: to the next runnable fiber after it, else to
 * the host (block done, or deadlocked). */
void yield(void)
{
    const uint32_t n = B->n, me = B->cur;
    for (uint32_t k = 1; k <= n; k++) {
        const uint32_t j = (me + k) % n;
        if (runnable(B->f[j])) {
            if (j != me)
                switch_to(me, j);
            else
                B->f[j].state = F_READY;
            return;
        }
    }
    switch_to(me, n);
}

void cp_run(fiber &x, size_t upto)
{
    for (size_t i = 0; i < upto; i++)
        memcpy(x.cp[i].dst, x.cp[i].src, x.cp[i].n);
    x.cp.erase(x.cp.begin(), x.cp.begin() + (ptrdiff_t)upto);
}

extern "C" void kv_emu_fiber_main(void)
{
#ifdef KV_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &B->host_stack_bottom,
                                    &B->host_stack_size);
#endif
    KV_EMU_TSAN(__tsan_acquire(&epoch));
    B->fn(B->arg);
    KV_EMU_TSAN(__tsan_release(&epoch));
    fiber &me = B->f[B->cur];
    me.state = F_DONE;
    me.cp.clear(); /* copies never waited for: the block is gone */
    me.cp_groups.clear();
    yield(); /* never returns: a done fiber is never resumed */
    abort();
}

#if !defined(__x86_64__)
void fiber_entry_uc(void) { kv_emu_fiber_main(); }
#endif

/* Arrive at barrier b (the block's or a warp's) and wait for the rest. */
void arrive(barrier &b, kv_emu_site site, const char *kind)
{
    if (B->failed) /* a reported failure: let every thread run out */
        return;
    if (b.arrived == 0) {
        b.site = site;
    } else if (b.site.line != site.line ||
               (b.site.file != site.file && strcmp(b.site.file, site.file))) {
        char d[512];
        snprintf(d, sizeof d,
                 " reached from different lines (divergent): %s:%d, and "
                 "%s:%d by a thread before",
                 site.file, site.line, b.site.file, b.site.line);
        sync_error(kind, d);
    }
    KV_EMU_TSAN(__tsan_release(&b));
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        b.gen++;
        KV_EMU_TSAN(__tsan_acquire(&b));
        return;
    }
    fiber &me = B->f[B->cur];
    me.state = F_WAIT;
    me.wait_gen = &b.gen;
    me.gen = b.gen;
    yield();
    KV_EMU_TSAN(__tsan_acquire(&b));
}

/* Run one block of a launch (emu_mu held). Returns false on a sync
 * failure. */
bool run_block(block_run &r, dim3 bidx)
{
    blockIdx = uint3{bidx.x, bidx.y, bidx.z};
    r.bar = barrier{};
    r.bar.expected = r.n;
    for (size_t w = 0; w < r.warp.size(); w++) {
        r.warp[w] = barrier{};
        const uint32_t lo = (uint32_t)w * 32;
        r.warp[w].expected = r.n - lo < 32 ? r.n - lo : 32;
    }
    r.failed = false;
    for (uint32_t i = 0; i < r.n; i++) {
        fiber &x = r.f[i];
        x.state = F_READY;
        x.cp.clear();
        x.cp_groups.clear();
        x.fake_stack = nullptr;
#ifdef KV_EMU_ASAN
        __asan_unpoison_memory_region(x.stack, STACK_BYTES);
#endif
#if defined(__x86_64__)
        uintptr_t top = ((uintptr_t)x.stack + STACK_BYTES) & ~(uintptr_t)15;
        uint64_t *sp = (uint64_t *)top;
        *--sp = 0;                                /* entry's return slot */
        *--sp = (uint64_t)(uintptr_t)kv_emu_fiber_main;
        for (int k = 0; k < 6; k++)
            *--sp = 0;                            /* rbp rbx r12-r15     */
        *--sp = 0x1f80ull | (0x037full << 32);    /* mxcsr, x87 cw       */
        x.sp = sp;
#else
        getcontext(&x.uc);
        x.uc.uc_stack.ss_sp = x.stack;
        x.uc.uc_stack.ss_size = STACK_BYTES;
        x.uc.uc_link = nullptr;
        makecontext(&x.uc, fiber_entry_uc, 0);
#endif
    }
    KV_EMU_TSAN(r.host_tsan = __tsan_get_current_fiber());
    KV_EMU_TSAN(__tsan_release(&epoch));
    switch_to(r.n, 0);
    KV_EMU_TSAN(__tsan_acquire(&epoch));
    bool ok = !r.failed;
    for (uint32_t i = 0; i < r.n; i++)
        if (r.f[i].state != F_DONE) {
            if (ok) {
                r.cur = i;
                sync_error(r.f[i].state == F_WAIT ? "waits at a barrier"
                                                  : "never finished",
                           " that other threads of its block (warp) never "
                           "reach (exited or waiting elsewhere)");
            }
            ok = false;
        }
    return ok;
}

/* ---- streams and events ------------------------------------------------- */

struct stream_state {
    bool blocking = true;
    std::deque<std::function<void()>> q;
    uint64_t enq = 0, done = 0;
    void run(uint64_t upto)
    {
        while (done < upto && !q.empty()) {
            auto op = std::move(q.front());
            q.pop_front();
            op();
            done++;
        }
    }
    void flush() { run(enq); }
};

std::shared_ptr<stream_state> &legacy()
{
    static std::shared_ptr<stream_state> s = std::make_shared<stream_state>();
    return s;
}

std::map<cudaStream_t, std::shared_ptr<stream_state>> &streams()
{
    static std::map<cudaStream_t, std::shared_ptr<stream_state>> m;
    return m;
}

std::shared_ptr<stream_state> stream_of(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return legacy();
    auto it = streams().find(s);
    return it == streams().end() ? nullptr : it->second;
}

void flush_all(void)
{
    legacy()->flush();
    for (auto &kv : streams())
        kv.second->flush();
}

/* Queue op on stream s, ordered as CUDA orders it against the legacy
 * stream. */
void enqueue(const std::shared_ptr<stream_state> &st,
             std::function<void()> op)
{
    if (st == legacy()) {
        for (auto &kv : streams())
            if (kv.second->blocking)
                kv.second->flush();
    } else if (st->blocking) {
        legacy()->flush();
    }
    st->q.push_back(std::move(op));
    st->enq++;
}

struct event_state {
    std::shared_ptr<stream_state> st;
    uint64_t target = 0;
};

/* ---- memory ------------------------------------------------------------- */

std::map<uintptr_t, size_t> &dev_allocs()
{
    static std::map<uintptr_t, size_t> m;
    return m;
}
std::map<uintptr_t, size_t> &host_allocs()
{
    static std::map<uintptr_t, size_t> m;
    return m;
}

bool in_device(const void *p, size_t n)
{
    auto &m = dev_allocs();
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin())
        return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

void *fresh(size_t n)
{
    void *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (p)
        memset(p, 0xff, n); /* initcheck: never-written bytes are 0xff */
    return p;
}

cudaError_t copy_check(void *dst, const void *src, size_t n,
                       cudaMemcpyKind k)
{
    if (n == 0)
        return cudaSuccess;
    if (!dst || !src)
        return cudaErrorInvalidValue;
    const bool dd = in_device(dst, n), sd = in_device(src, n);
    switch (k) {
    case cudaMemcpyHostToDevice:
        return dd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
        return sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
        return dd && sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
        return cudaSuccess;
    default:
        return cudaErrorInvalidMemcpyDirection;
    }
}

/* Fiber stacks (and TSan fibers), reused by every block; freed at exit. */
struct fiber_mem {
    char *stack;
    void *tsan;
};
struct stack_list {
    std::vector<fiber_mem> v;
    ~stack_list()
    {
        for (fiber_mem &m : v) {
            free(m.stack);
            KV_EMU_TSAN(__tsan_destroy_fiber(m.tsan));
        }
    }
};

std::vector<fiber_mem> &stack_pool()
{
    static stack_list s;
    return s.v;
}

/* Execute one launch (from a stream queue, emu_mu held). */
void execute(const void *func, dim3 grid, dim3 block, size_t smem,
             void (*fn)(void *), void *arg)
{
    if (sticky != cudaSuccess)
        return;
    kernel_info &ki = kernels()[func];
    block_run r;
    r.n = block.x * block.y * block.z;
    r.f.resize(r.n);
    r.warp.resize((r.n + 31) / 32);
    r.fn = fn;
    r.arg = arg;
    r.kname = ki.name;
    auto &pool = stack_pool();
    for (uint32_t i = 0; i < r.n; i++) {
        if (pool.empty()) {
            char *s = (char *)aligned_alloc(64, STACK_BYTES);
            if (!s) {
                sticky = cudaErrorLaunchOutOfResources;
                for (uint32_t j = 0; j < i; j++)
                    pool.push_back(fiber_mem{r.f[j].stack, r.f[j].tsan});
                return;
            }
            void *ts = nullptr;
            KV_EMU_TSAN(ts = __tsan_create_fiber(0));
            KV_EMU_TSAN(__tsan_set_fiber_name(ts, "kv_emu thread"));
            pool.push_back(fiber_mem{s, ts});
        }
        r.f[i].stack = pool.back().stack;
        r.f[i].tsan = pool.back().tsan;
        pool.pop_back();
        r.f[i].lin = i;
        r.f[i].tid = uint3{i % block.x, i / block.x % block.y,
                           i / (block.x * block.y)};
    }
    block_run *outer = B;
    B = &r;
    blockDim = block;
    gridDim = grid;
    ki.launches++;
    for (uint32_t z = 0; z < grid.z && sticky == cudaSuccess; z++)
        for (uint32_t y = 0; y < grid.y && sticky == cudaSuccess; y++)
            for (uint32_t x = 0; x < grid.x; x++) {
                r.dyn = fresh(smem ? smem : 1);
                if (!r.dyn) {
                    sticky = cudaErrorLaunchOutOfResources;
                    break;
                }
                const bool ok = run_block(r, dim3(x, y, z));
                free(r.dyn);
                r.dyn = nullptr;
                ki.blocks++;
                if (!ok) {
                    sticky = cudaErrorLaunchFailure;
                    break;
                }
            }
    B = outer;
    for (uint32_t i = 0; i < r.n; i++)
        pool.push_back(fiber_mem{r.f[i].stack, r.f[i].tsan});
}

} // namespace

/* ---- the device side (kv_emu.h) ----------------------------------------- */

void kv_emu_register(const void *func, const char *name, size_t static_smem,
                     int max_threads)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    kernel_info ki;
    ki.name = name;
    ki.static_smem = static_smem;
    ki.max_threads = max_threads;
    ki.max_dyn = SMEM_DEFAULT - static_smem;
    kernels()[func] = ki;
}

cudaError_t kv_emu_launch_raw(const void *func, dim3 grid, dim3 block,
                              size_t smem, cudaStream_t s, void (*fn)(void *),
                              void *arg, void (*drop)(void *))
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    auto it = kernels().find(func);
    cudaError_t e = cudaSuccess;
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    std::shared_ptr<stream_state> st = stream_of(s);
    if (it == kernels().end())
        e = cudaErrorInvalidDeviceFunction;
    else if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
             threads > 1024 || block.z > 64 || grid.x > 0x7fffffffu ||
             grid.y > 65535 || grid.z > 65535)
        e = cudaErrorInvalidConfiguration;
    else if (threads > (uint64_t)it->second.max_threads)
        e = cudaErrorLaunchOutOfResources; /* over __launch_bounds__ */
    else if (smem > it->second.max_dyn)
        e = cudaErrorInvalidValue; /* as the driver: "invalid argument" */
    else if (!st)
        e = cudaErrorInvalidResourceHandle;
    if (e != cudaSuccess) {
        drop(arg);
        return ret(e);
    }
    enqueue(st, [=]() {
        execute(func, grid, block, smem, fn, arg);
        drop(arg);
    });
    return cudaSuccess;
}

void *kv_emu_dyn_smem(void) { return B->dyn; }

void kv_emu_reset_sticky(void)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    sticky = cudaSuccess;
}

void kv_emu_syncthreads(kv_emu_site at)
{
    arrive(B->bar, at, "__syncthreads");
}

void kv_emu_syncwarp(kv_emu_site at, unsigned mask)
{
    barrier &w = B->warp[B->cur / 32];
    const unsigned full =
        w.expected == 32 ? 0xffffffffu : (1u << w.expected) - 1u;
    if (mask != full)
        sync_error("__syncwarp", " with a partial mask (not emulated)");
    arrive(w, at, "__syncwarp");
}

uint64_t kv_emu_shfl_xor(kv_emu_site at, unsigned mask, uint64_t v,
                         int lane_mask, int width)
{
    barrier &w = B->warp[B->cur / 32];
    const uint32_t lane = B->cur % 32;
    const unsigned full =
        w.expected == 32 ? 0xffffffffu : (1u << w.expected) - 1u;
    if (mask != full)
        sync_error("__shfl_xor_sync", " with a partial mask (not emulated)");
    const uint32_t par = (uint32_t)(w.gen & 1u);
    w.slot[par][lane] = v;
    arrive(w, at, "__shfl_xor_sync");
    if (B->failed)
        return v;
    /* the source lane, within the caller's width-lane segment */
    uint32_t src = lane ^ (uint32_t)lane_mask;
    if (width < 32 && (src / (uint32_t)width) != lane / (uint32_t)width)
        src = lane;
    if (src >= w.expected)
        src = lane;
    return w.slot[par][src];
}

void kv_emu_cp_async(void *dst, const void *src, size_t n)
{
    B->f[B->cur].cp.push_back(copy_op{dst, src, n});
}

void kv_emu_cp_commit(void)
{
    fiber &x = B->f[B->cur];
    x.cp_groups.push_back(x.cp.size());
}

void kv_emu_cp_wait(size_t prior)
{
    fiber &x = B->f[B->cur];
    const size_t g = x.cp_groups.size();
    if (g <= prior)
        return;
    const size_t upto = x.cp_groups[g - prior - 1];
    cp_run(x, upto);
    x.cp_groups.erase(x.cp_groups.begin(),
                      x.cp_groups.begin() + (ptrdiff_t)(g - prior));
    for (size_t &e : x.cp_groups)
        e -= upto;
}

/* ---- the runtime API (the subset kernels/cuda/ calls) ------------------- */

extern "C" {

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e != cudaSuccess ? e : sticky;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error != cudaSuccess ? last_error : sticky;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error (emulated)";
    case cudaErrorInvalidValue:
        return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation:
        return "out of memory (emulated)";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure (emulated)";
    default:
        return "CUDA error (emulated)";
    }
}

cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n)
        return ret(cudaErrorInvalidValue);
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *d)
{
    if (!d)
        return ret(cudaErrorInvalidValue);
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    if (d != 0)
        return ret(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMultiProcessorCount:
        *v = SM_COUNT;
        return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
        *v = 9;
        return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
        *v = 0;
        return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *v = (int)SMEM_OPTIN;
        return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
        *v = (int)SMEM_DEFAULT;
        return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
        *v = 1024;
        return cudaSuccess;
    case cudaDevAttrWarpSize:
        *v = 32;
        return cudaSuccess;
    default:
        return ret(cudaErrorInvalidValue);
    }
}

cudaError_t cudaDeviceSynchronize(void)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    flush_all();
    return ret(sticky);
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *fa,
                                  const void *func)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    auto it = kernels().find(func);
    if (!fa)
        return ret(cudaErrorInvalidValue);
    if (it == kernels().end())
        return ret(cudaErrorInvalidDeviceFunction);
    memset(fa, 0, sizeof *fa);
    fa->sharedSizeBytes = it->second.static_smem;
    fa->maxThreadsPerBlock = it->second.max_threads;
    fa->maxDynamicSharedSizeBytes = (int)it->second.max_dyn;
    fa->ptxVersion = 90;
    fa->binaryVersion = 90;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute a,
                                 int v)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    auto it = kernels().find(func);
    if (it == kernels().end())
        return ret(cudaErrorInvalidDeviceFunction);
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaSuccess; /* carveout etc.: accepted, no effect */
    if (v < 0 || (size_t)v + it->second.static_smem > SMEM_OPTIN)
        return ret(cudaErrorInvalidValue);
    it->second.max_dyn = (size_t)v;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    if (!p)
        return ret(cudaErrorInvalidValue);
    *p = fresh(n ? n : 1);
    if (!*p)
        return ret(cudaErrorMemoryAllocation);
    dev_allocs()[(uintptr_t)*p] = n;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    if (!p)
        return cudaSuccess;
    flush_all(); /* cudaFree synchronizes the device */
    auto it = dev_allocs().find((uintptr_t)p);
    if (it == dev_allocs().end())
        return ret(cudaErrorInvalidValue);
    dev_allocs().erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    if (!p)
        return ret(cudaErrorInvalidValue);
    *p = fresh(n ? n : 1);
    if (!*p)
        return ret(cudaErrorMemoryAllocation);
    host_allocs()[(uintptr_t)*p] = n;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    return cudaHostAlloc(p, n, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    if (!p)
        return cudaSuccess;
    flush_all();
    auto it = host_allocs().find((uintptr_t)p);
    if (it == host_allocs().end())
        return ret(cudaErrorInvalidValue);
    host_allocs().erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                       enum cudaMemcpyKind k)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    cudaError_t e = copy_check(dst, src, n, k);
    if (e != cudaSuccess)
        return ret(e);
    flush_all(); /* a blocking copy on the legacy stream */
    if (sticky != cudaSuccess)
        return ret(sticky);
    if (n)
        memcpy(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                            enum cudaMemcpyKind k, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    cudaError_t e = copy_check(dst, src, n, k);
    std::shared_ptr<stream_state> st = stream_of(s);
    if (e == cudaSuccess && !st)
        e = cudaErrorInvalidResourceHandle;
    if (e != cudaSuccess)
        return ret(e);
    if (n)
        enqueue(st, [=]() {
            if (sticky == cudaSuccess)
                memcpy(dst, src, n);
        });
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    std::shared_ptr<stream_state> st = stream_of(s);
    if (!st)
        return ret(cudaErrorInvalidResourceHandle);
    if (n && !in_device(p, n))
        return ret(cudaErrorInvalidValue);
    if (n)
        enqueue(st, [=]() { memset(p, v, n); });
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    if (!s)
        return ret(cudaErrorInvalidValue);
    auto st = std::make_shared<stream_state>();
    st->blocking = !(flags & cudaStreamNonBlocking);
    *s = (cudaStream_t)st.get();
    streams()[*s] = st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    auto it = streams().find(s);
    if (it == streams().end())
        return ret(cudaErrorInvalidResourceHandle);
    it->second->flush(); /* queued work still completes */
    streams().erase(it);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    std::shared_ptr<stream_state> st = stream_of(s);
    if (!st)
        return ret(cudaErrorInvalidResourceHandle);
    if (st == legacy())
        flush_all();
    else
        st->flush();
    return ret(sticky);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags)
{
    (void)flags;
    if (!ev)
        return ret(cudaErrorInvalidValue);
    *ev = (cudaEvent_t)(void *)new event_state();
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *ev)
{
    return cudaEventCreateWithFlags(ev, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    delete (event_state *)(void *)ev;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    std::shared_ptr<stream_state> st = stream_of(s);
    if (!ev || !st)
        return ret(cudaErrorInvalidResourceHandle);
    event_state *e = (event_state *)(void *)ev;
    e->st = st;
    e->target = st->enq;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    event_state *e = (event_state *)(void *)ev;
    if (!e->st || e->st->done >= e->target)
        return sticky;
    e->st->run(e->target); /* in flight now; done at the next query */
    return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    std::lock_guard<std::recursive_mutex> g(emu_mu);
    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    event_state *e = (event_state *)(void *)ev;
    if (e->st)
        e->st->run(e->target);
    return ret(sticky);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    (void)a;
    (void)b;
    if (!ms)
        return ret(cudaErrorInvalidValue);
    *ms = 0.0f; /* no timing in emulation */
    return cudaSuccess;
}

} /* extern "C" */
