/* SPDX-License-Identifier: MIT */
/*
 * kv_offload_shim.c — the fault-injection shim (see kv_offload_shim.h).
 *
 * One draw r in [0, 1e6) per transfer picks the kind whose band
 * [sum of earlier ppm, + ppm[k]) holds r; kinds that cannot apply to this
 * transfer inject nothing (and are not counted).
 */
#include "offload/kv_offload_shim.h"

#include <errno.h>
#include <string.h>

#include "kvpage/kvpage.h"
#include "offload/kv_offload_ioq.h"

static uint64_t kv_shim_next(kv_offload_shim_t *s)
{
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int kv_offload_shim_check(const kv_offload_fault_t *f)
{
    uint64_t sum = 0;
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++)
        sum += f->ppm[k];
    return sum <= 1000000u ? 0 : KV_EINVAL;
}

void kv_offload_shim_init(kv_offload_shim_t *s, const kv_offload_fault_t *f,
                          uint32_t align)
{
    uint64_t keep[KV_OFFLOAD_FAULT_COUNT];
    memcpy(keep, s->count, sizeof keep); /* counts survive a re-init */
    memset(s, 0, sizeof *s);
    memcpy(s->count, keep, sizeof keep);
    s->cfg = *f;
    s->rng = f->seed;
    s->align = align;
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++)
        s->on |= f->ppm[k] != 0;
}

void kv_offload_shim_flip(kv_offload_shim_t *s, uint8_t *buf, uint32_t n)
{
    if (n == 0)
        return;
    uint64_t bit = kv_shim_next(s) % ((uint64_t)n * 8u);
    buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
}

void kv_offload_shim_issue(kv_offload_shim_t *s, int op, uint8_t *buf, uint32_t len,
                           kv_offload_shim_act_t *act)
{
    *act = (kv_offload_shim_act_t){.kind = -1, .len = len};
    if (!s->on)
        return;
    uint64_t r = kv_shim_next(s) % 1000000u, lo = 0;
    int kind = -1;
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++) {
        if (r < lo + s->cfg.ppm[k]) {
            kind = k;
            break;
        }
        lo += s->cfg.ppm[k];
    }
    int write = op == KV_OFFLOAD_OP_WRITE;
    uint32_t units = len / s->align;
    switch (kind) {
    case KV_OFFLOAD_FAULT_EIO:
        act->err = -EIO;
        break;
    case KV_OFFLOAD_FAULT_ENOSPC:
        if (!write)
            return;
        act->err = -ENOSPC;
        break;
    case KV_OFFLOAD_FAULT_SHORT: /* a real shorter transfer, 1..units-1 units */
        if (units < 2)
            return;
        act->len = s->align * (uint32_t)(1u + kv_shim_next(s) % (units - 1u));
        break;
    case KV_OFFLOAD_FAULT_TORN: /* 0..units-1 units stored, all reported */
        if (!write || units < 1)
            return;
        act->len = s->align * (uint32_t)(kv_shim_next(s) % units);
        act->lie = 1;
        break;
    case KV_OFFLOAD_FAULT_FLIP:
        if (write)
            kv_offload_shim_flip(s, buf, len);
        else
            act->flip_read = 1;
        break;
    case KV_OFFLOAD_FAULT_EAGAIN:
        act->err = -EAGAIN;
        break;
    case KV_OFFLOAD_FAULT_EINTR:
        act->err = -EINTR;
        break;
    default:
        return;
    }
    act->kind = kind;
    s->count[kind]++;
}
