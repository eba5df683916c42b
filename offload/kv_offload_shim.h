/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_shim.h — fault injection between the page file's I/O core and
 * its I/O queue (hence between the I/O queue and the kernel): every transfer is
 * shown to the shim before it is queued, and may be failed, shortened, torn
 * or have a bit flipped (see kv_offload_fault_kind_t in kv_offload.h).
 *
 * Deterministic: one splitmix64 stream per shim, seeded from the config, one
 * draw per decision; the same sequence of transfers gets the same faults.
 * Counts only faults actually applied. Owned by one file, used under its
 * mutex; no locking here.
 */
#ifndef KV_OFFLOAD_SHIM_H
#define KV_OFFLOAD_SHIM_H

#include <stdint.h>

#include "offload/kv_offload.h"

typedef struct kv_offload_shim {
    kv_offload_fault_t cfg;
    uint64_t rng;                            /* splitmix64 state          */
    uint32_t align;                          /* transfer granularity      */
    int on;                                  /* any ppm non-zero          */
    uint64_t count[KV_OFFLOAD_FAULT_COUNT];  /* faults applied, by kind   */
} kv_offload_shim_t;

typedef struct kv_offload_shim_act {
    int kind;        /* kv_offload_fault_kind_t applied, or -1           */
    int err;         /* != 0: do not issue; complete with this -errno    */
    uint32_t len;    /* bytes to issue (<= asked; 0 with lie: nothing)   */
    int lie;         /* on success report the asked length (torn write)  */
    int flip_read;   /* flip a bit in the bytes read, once they arrive   */
} kv_offload_shim_act_t;

/* 0, or KV_EINVAL when the rates sum above 1e6. */
int kv_offload_shim_check(const kv_offload_fault_t *f);
void kv_offload_shim_init(kv_offload_shim_t *s, const kv_offload_fault_t *f,
                          uint32_t align);
/* Decide the fate of a transfer of len bytes (a multiple of align) of buf.
 * A write's bit flip is applied to buf here. */
void kv_offload_shim_issue(kv_offload_shim_t *s, int op, uint8_t *buf, uint32_t len,
                           kv_offload_shim_act_t *act);
/* Flip one random bit among the n bytes at buf (a read's flip). */
void kv_offload_shim_flip(kv_offload_shim_t *s, uint8_t *buf, uint32_t n);

#endif /* KV_OFFLOAD_SHIM_H */
