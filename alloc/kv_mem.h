/* SPDX-License-Identifier: MIT */
/*
 * kv_mem.h — metadata memory for the whole library, and fault injection.
 *
 * Every allocation the library makes for its own bookkeeping (page tables,
 * sequence records, scratch) goes through kv_mem_*, which call the process's
 * malloc/calloc/realloc/free (no allocator of the library's own: it must
 * load with dlopen anywhere), counting live bytes; in the sanitizer build
 * (KV_MEM_SYSTEM defined) each free also checks the size it is given.
 * Page memory does NOT come from here: see kv_alloc.h.
 *
 * Invariants: kv_mem_live_bytes() is the sum of the sizes of the blocks
 * currently allocated through kv_mem_*; kv_mem_free must be given the size the
 * block was allocated (or last reallocated) with.
 *
 * Fault injection (tests only, process-wide, thread-safe): kv_fault_arm(n)
 * makes the n-th allocation from now fail, counting both kv_mem_* calls and
 * page allocations from any kv_alloc pool; it then disarms itself.
 */
#ifndef KV_MEM_H
#define KV_MEM_H

#include <stddef.h>
#include <stdint.h>

/* NULL on failure (or injected failure) or when n == 0. */
void *kv_mem_alloc(size_t n);
/* Zeroed; NULL on overflow of count*size, failure, or zero size. */
void *kv_mem_calloc(size_t count, size_t size);
/* Resize a block of old_n bytes to new_n bytes. On failure returns NULL and
 * leaves p untouched. p == NULL behaves as kv_mem_alloc(new_n). */
void *kv_mem_realloc(void *p, size_t old_n, size_t new_n);
/* Free a block of n bytes; p == NULL is a no-op. */
void kv_mem_free(void *p, size_t n);

/* Bytes currently allocated through kv_mem_* (all threads). */
uint64_t kv_mem_live_bytes(void);

/* Arm: the n-th allocation (n >= 1) counted from now fails. n == 0 disarms. */
void kv_fault_arm(uint64_t n);
/* 1 if the armed fault has fired since it was last armed. */
int kv_fault_fired(void);
/* Called by every allocation site: 1 means "fail this one". Cheap when
 * disarmed (one relaxed load). */
int kv_fault_hit(void);

#endif /* KV_MEM_H */
