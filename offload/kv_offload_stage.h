/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_stage.h — the staging region of a page file: aligned memory
 * cut into units of slot_bytes, handed out as contiguous runs, so that a
 * run of adjacent slots on disk is one transfer from one run of units.
 *
 * With io_uring the whole region is one registered (fixed) buffer. A unit
 * is owned by at most one I/O at a time, from allocation until that I/O's
 * completion has been processed. Memory from kv_mem (counted, leak-checked),
 * over-allocated by `align` and aligned by hand. Not thread-safe: the
 * owning file serializes.
 */
#ifndef KV_OFFLOAD_STAGE_H
#define KV_OFFLOAD_STAGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_offload_stage {
    uint8_t *base;        /* aligned start: [units][unit_bytes]            */
    void *raw;            /* the kv_mem block holding it                   */
    size_t raw_bytes;
    uint32_t unit_bytes;  /* = slot_bytes                                  */
    uint32_t units;
    uint64_t *used;       /* bitmap [(units + 63) / 64], 1 = owned         */
    uint32_t n_used;      /* units owned                                   */
    uint32_t cursor;      /* where the next search starts                  */
} kv_offload_stage_t;

/* Errors: KV_ENOMEM. */
int  kv_offload_stage_init(kv_offload_stage_t *st, uint32_t unit_bytes,
                           uint32_t units, uint32_t align);
void kv_offload_stage_fini(kv_offload_stage_t *st);
/* A run of up to want (>= 1) contiguous free units: the first fit of want
 * units, else the longest free run found. Returns the first unit and sets
 * *got (1..want), or returns -1 when no unit is free. */
int64_t kv_offload_stage_alloc(kv_offload_stage_t *st, uint32_t want, uint32_t *got);
void kv_offload_stage_free(kv_offload_stage_t *st, uint32_t first, uint32_t n);
static inline uint8_t *kv_offload_stage_ptr(const kv_offload_stage_t *st, uint32_t unit)
{
    return st->base + (size_t)unit * st->unit_bytes;
}

#endif /* KV_OFFLOAD_STAGE_H */
