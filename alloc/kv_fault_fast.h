/* SPDX-License-Identifier: MIT */
/*
 * kv_fault_fast.h — internal to alloc/: an inlinable kv_fault_hit() for the
 * page allocator's hot path (kv_alloc.c). Same semantics as kv_fault_hit()
 * in kv_mem.h (which is what everyone else calls): one relaxed load while
 * disarmed; when armed, kv_fault_hit_armed() (kv_fault.c) does the counting.
 */
#ifndef KV_FAULT_FAST_H
#define KV_FAULT_FAST_H

#include <stdatomic.h>
#include <stdint.h>

/* Allocations left until the failing one; 0 = disarmed. Owned by kv_fault.c.
 * Hidden: internal to the library, and read PC-relative (no GOT) in PIC. */
extern _Atomic uint64_t kv_fault_countdown __attribute__((visibility("hidden")));

/* The armed case of kv_fault_hit(): 1 means "fail this allocation". */
int kv_fault_hit_armed(void);

static inline int kv_fault_hit_fast(void)
{
    if (__builtin_expect(
            atomic_load_explicit(&kv_fault_countdown, memory_order_relaxed) == 0, 1))
        return 0;
    return kv_fault_hit_armed();
}

#endif /* KV_FAULT_FAST_H */
