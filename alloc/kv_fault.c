/* SPDX-License-Identifier: MIT */
/*
 * kv_fault.c — process-wide allocation fault injection (see kv_mem.h).
 *
 * kv_fault_countdown is 0 when disarmed; armed with n, each allocation site
 * calling kv_fault_hit() takes one off it, and the one that takes it from 1
 * to 0 fails (and so disarms it). The decrement is a CAS, so exactly one
 * caller among many threads sees the 1 -> 0 step. Disarmed, kv_fault_hit()
 * is one relaxed load (inlined into the page allocator's hot path through
 * kv_fault_fast.h).
 */
#include "alloc/kv_mem.h"

#include <stdatomic.h>

#include "alloc/kv_fault_fast.h"

_Atomic uint64_t kv_fault_countdown; /* allocations left until the failing one; 0 = off */
static _Atomic int kv_fault_did_fire;       /* 1 once the armed fault fired */

void kv_fault_arm(uint64_t n)
{
    atomic_store(&kv_fault_did_fire, 0);
    atomic_store(&kv_fault_countdown, n);
}

int kv_fault_fired(void)
{
    return atomic_load(&kv_fault_did_fire);
}

int kv_fault_hit_armed(void)
{
    uint64_t v = atomic_load(&kv_fault_countdown);
    while (v != 0) {
        if (atomic_compare_exchange_weak(&kv_fault_countdown, &v, v - 1)) {
            if (v == 1) {
                atomic_store(&kv_fault_did_fire, 1);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

int kv_fault_hit(void)
{
    return kv_fault_hit_fast();
}
