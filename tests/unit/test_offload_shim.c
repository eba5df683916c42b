/* SPDX-License-Identifier: MIT */
/*
 * test_offload_shim.c — the fault-injection shim (offload/kv_offload_shim.h):
 * rates near the configured ppm, kinds that cannot apply to an op inject
 * nothing, shortened and torn lengths stay aligned and below the asked
 * length, a write flip changes exactly one bit, and the same seed gives
 * the same decisions.
 */
#include <string.h>

#include "kv_test.h"
#include "offload/kv_offload_ioq.h"
#include "offload/kv_offload_shim.h"

static int popcount_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += __builtin_popcount((unsigned)(a[i] ^ b[i]));
    return c;
}

int main(void)
{
    kv_offload_fault_t f;
    memset(&f, 0, sizeof f);
    f.seed = 5;
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++)
        f.ppm[k] = 100000; /* 10% each, 70% in all */
    CHECK_OK(kv_offload_shim_check(&f));
    kv_offload_shim_t s;
    memset(&s, 0, sizeof s);
    kv_offload_shim_init(&s, &f, 512);

    enum { N = 60000, LEN = 4096 };
    static uint8_t buf[LEN], ref[LEN];
    long bad = 0, flips = 0;
    for (int i = 0; i < N; i++) {
        int op = i & 1 ? KV_OFFLOAD_OP_WRITE : KV_OFFLOAD_OP_READ;
        memcpy(ref, buf, LEN);
        kv_offload_shim_act_t a;
        kv_offload_shim_issue(&s, op, buf, LEN, &a);
        int d = popcount_diff(buf, ref, LEN);
        if (a.kind == KV_OFFLOAD_FAULT_FLIP && op == KV_OFFLOAD_OP_WRITE) {
            bad += d != 1;
            flips++;
        } else {
            bad += d != 0;
        }
        if (op == KV_OFFLOAD_OP_READ)
            bad += a.kind == KV_OFFLOAD_FAULT_ENOSPC || a.kind == KV_OFFLOAD_FAULT_TORN || a.lie;
        if (a.kind == KV_OFFLOAD_FAULT_SHORT)
            bad += a.len == 0 || a.len >= LEN || a.len % 512;
        else if (a.kind == KV_OFFLOAD_FAULT_TORN)
            bad += !a.lie || a.len >= LEN || a.len % 512;
        else
            bad += a.len != LEN;
        if (a.kind == KV_OFFLOAD_FAULT_EIO)
            bad += a.err != -5;
        if (a.kind == -1)
            bad += a.err != 0 || a.lie || a.flip_read;
    }
    CHECK_EQ(bad, 0);
    CHECK(flips > 0);
    /* per kind: 10% of the ops it applies to (+-10% relative) */
    for (int k = 0; k < KV_OFFLOAD_FAULT_COUNT; k++) {
        double applicable = (k == KV_OFFLOAD_FAULT_ENOSPC || k == KV_OFFLOAD_FAULT_TORN) ? N / 2 : N;
        double rate = (double)s.count[k] / applicable;
        if (rate < 0.09 || rate > 0.11)
            fprintf(stderr, "kind %d rate %.4f\n", k, rate);
        CHECK(rate > 0.09 && rate < 0.11);
    }
    /* SHORT cannot shorten a single unit */
    kv_offload_fault_t only = {.seed = 1};
    only.ppm[KV_OFFLOAD_FAULT_SHORT] = 1000000;
    kv_offload_shim_init(&s, &only, 512);
    uint64_t before = s.count[KV_OFFLOAD_FAULT_SHORT];
    kv_offload_shim_act_t a;
    kv_offload_shim_issue(&s, KV_OFFLOAD_OP_READ, buf, 512, &a);
    CHECK_EQ(a.kind, -1);
    CHECK_EQ(a.len, 512);
    CHECK_EQ(s.count[KV_OFFLOAD_FAULT_SHORT], before);
    kv_offload_shim_issue(&s, KV_OFFLOAD_OP_READ, buf, 1024, &a);
    CHECK_EQ(a.kind, KV_OFFLOAD_FAULT_SHORT);
    CHECK_EQ(a.len, 512);

    /* determinism: same seed, same decisions */
    kv_offload_shim_t s1, s2;
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    kv_offload_shim_init(&s1, &f, 512);
    kv_offload_shim_init(&s2, &f, 512);
    bad = 0;
    for (int i = 0; i < 1000; i++) {
        kv_offload_shim_act_t a1, a2;
        kv_offload_shim_issue(&s1, KV_OFFLOAD_OP_READ, buf, LEN, &a1);
        kv_offload_shim_issue(&s2, KV_OFFLOAD_OP_READ, buf, LEN, &a2);
        bad += memcmp(&a1, &a2, sizeof a1) != 0;
    }
    CHECK_EQ(bad, 0);
    f.ppm[0] = 500000;
    CHECK_EQ(kv_offload_shim_check(&f), KV_EINVAL);
    return kv_test_end();
}
