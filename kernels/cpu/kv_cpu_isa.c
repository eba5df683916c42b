/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_isa.c — the CPU feature probe of kvpage (the only one in the
 * library) and the builds of the hot loops it allows.
 *
 * The hot loops are compiled once per build (kv_cpu.h): portable (any CPU),
 * avx2 (AVX2 + FMA + F16C) and avx512 (AVX-512F on top of those), the last
 * two on x86 only. The probe runs once (a race only repeats it) and the
 * list it yields is constant afterwards: the backend runs the last entry,
 * tests compare all of them. kv_cpu_has_i8 says whether the approximate
 * int8 INT steps (kv_cpu_fmt_i8.c, KV_CONFIG_INT8_ATTN) run here.
 */
#include <stdatomic.h>

#include "kv_cpu.h"

#ifdef KV_CPU_X86
/* The best build this CPU runs: 1 portable, 2 avx2, 3 avx512. */
static uint32_t probe(void)
{
    __builtin_cpu_init();
    uint32_t n = 1;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
#ifndef __clang__ /* older clang has no "f16c" here; AVX2 CPUs all have it */
        && __builtin_cpu_supports("f16c")
#endif
    ) {
        n = 2;
        if (__builtin_cpu_supports("avx512f"))
            n = 3;
    }
    return n;
}

static const kv_cpu_loops_t *const builds[] = {
    &kv_cpu_loops_portable,
    &kv_cpu_loops_avx2,
    &kv_cpu_loops_avx512,
};
#else
static uint32_t probe(void)
{
    return 1;
}

static const kv_cpu_loops_t *const builds[] = {&kv_cpu_loops_portable};
#endif

int kv_cpu_has_i8(void)
{
#ifdef KV_CPU_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vbmi");
#else
    return 0;
#endif
}

const kv_cpu_loops_t *const *kv_cpu_builds(uint32_t *n)
{
    static _Atomic uint32_t cached;
    uint32_t c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c == 0) {
        c = probe();
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    *n = c;
    return builds;
}
