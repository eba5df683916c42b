/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_tiles.cu — the attention kernel's control logic, run on the
 * host (these are __host__ __device__ functions of kv_cuda_int.cuh; no GPU
 * needed, the test always runs):
 *   - tiles: a block's token range cut by kv_cuda_build_tile with the entry
 *     window refilled when kv_cuda_window_stale says so, exactly as the
 *     kernel does (window slots past the list's end hold poison), must
 *     give every token of the range once, in order, each from its own
 *     entry and offset, with tok_slot/start/k consistent, at most
 *     KV_CUDA_TILE tokens and ns_max pages per tile, and only whole-window
 *     reads; over random page lists, ranges, offsets and slot counts;
 *   - the staged bytes of every slot (kv_fmt_codec_ranges) stay inside the
 *     page and the stage slot;
 *   - rows: kv_cuda_row_index / kv_cuda_row_limit against the q/out layouts
 *     and causal limits of kv_backend.h, decode and prefill.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kv_cuda_int.cuh"
#include "kv_test.h"

#define POISON_PAGE 0xdeadu

static uint64_t rng = 17;

static uint32_t rnd(uint32_t n)
{
    return (uint32_t)(kv_test_rand(&rng) % n);
}

/* One block's walk over tokens [t_begin, t_begin + n) of a list of entries
 * ents[0 .. n_ents) (entry e is page e), starting at entry e0, offset off0. */
static void walk(const kv_cuda_ent_t *ents, uint32_t n_ents, uint32_t e0,
                 uint32_t off0, uint32_t n, uint32_t ns_max, uint32_t pb,
                 uint32_t d)
{
    kv_cuda_cursor_t cur = {e0, off0, n, KV_CUDA_NO_WIN};
    /* the window, and poison after it: a read past it shows as a wrong
     * page rather than undefined behaviour */
    kv_cuda_ent_t win[2 * KV_CUDA_ENT_WIN];
    for (uint32_t j = 0; j < 2 * KV_CUDA_ENT_WIN; j++)
        win[j] = kv_cuda_ent_t{POISON_PAGE, KV_CUDA_ENT_META(1, 0, 0)};
    kv_cuda_tile_t t;
    uint32_t e = e0, off = off0, seen = 0, refills = 0, bad = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        if (kv_cuda_window_stale(&cur, ns_max)) {
            for (uint32_t j = 0; j < KV_CUDA_ENT_WIN; j++)
                win[j] = cur.pe + j < n_ents
                             ? ents[cur.pe + j]
                             : kv_cuda_ent_t{POISON_PAGE,
                                             KV_CUDA_ENT_META(1, 0, 0)};
            cur.win0 = cur.pe;
            refills++;
        }
        memset(&t, 0xee, sizeof t);
        kv_cuda_build_tile(&cur, win, ns_max, &t);
        if (t.ntok == 0)
            break;
        bad += t.ntok > KV_CUDA_TILE || t.ns > ns_max || t.ns == 0;
        uint32_t pos = 0;
        for (uint32_t s = 0; s < t.ns && s < KV_CUDA_MAX_SLOTS; s++) {
            const kv_cuda_slot_t &sl = t.s[s];
            if (e >= n_ents || sl.k > KV_CUDA_TILE) { /* ran off the list */
                bad++;
                break;
            }
            bad += sl.page != e || sl.t0 != off || sl.start != pos || sl.k == 0;
            bad += sl.fmt != KV_CUDA_ENT_FMT(ents[e].meta) ||
                   sl.var != KV_CUDA_ENT_VAR(ents[e].meta);
            for (uint32_t x = 0; x < sl.k; x++)
                bad += t.tok_slot[sl.start + x] != s;
            uint32_t lo[2], hi[2];
            uint32_t nr =
                kv_fmt_codec_ranges(sl.fmt, d, pb, sl.t0, sl.k, lo, hi);
            for (uint32_t r = 0; r < nr; r++)
                bad += lo[r] >= hi[r] || hi[r] > pb || lo[r] % 16 || hi[r] % 16;
            pos += sl.k;
            off += sl.k; /* the walk itself: next token of the list */
            if (off == KV_CUDA_ENT_N(ents[e].meta)) {
                e++;
                off = 0;
            }
        }
        bad += pos != t.ntok;
        seen += t.ntok;
        if (bad || seen > n)
            break;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(seen, n);
    CHECK_EQ(cur.rem, 0);
    CHECK(refills >= 1);
}

static void test_tiles(void)
{
    const uint32_t d = 64, pb = 4096; /* FP16 16, INT4 32, INT2 64, MERGED 36 */
    static const uint32_t cap[4] = {16, 32, 64, 36};
    for (int round = 0; round < 300; round++) {
        const uint32_t n_ents = 1 + rnd(round % 10 == 0 ? 3000 : 200);
        kv_cuda_ent_t *ents =
            (kv_cuda_ent_t *)malloc(n_ents * sizeof(kv_cuda_ent_t));
        if (!ents)
            abort();
        uint64_t total = 0;
        for (uint32_t e = 0; e < n_ents; e++) {
            uint32_t fmt = rnd(4);
            uint32_t n = rnd(3) ? cap[fmt] : 1 + rnd(cap[fmt]);
            ents[e] = kv_cuda_ent_t{e, KV_CUDA_ENT_META(n, fmt, fmt == 3 ? rnd(2) : 0)};
            total += n;
        }
        /* a range: random start token and length */
        uint32_t t0 = rnd((uint32_t)total), n = 1 + rnd((uint32_t)(total - t0));
        uint32_t e0 = 0, off0 = t0;
        while (off0 >= KV_CUDA_ENT_N(ents[e0].meta))
            off0 -= KV_CUDA_ENT_N(ents[e0++].meta);
        static const uint32_t ns_choices[] = {1, 2, 4, 16};
        walk(ents, n_ents, e0, off0, n, ns_choices[round % 4], pb, d);
        free(ents);
    }
}

static void test_rows(void)
{
    kv_cuda_attn_args_t a;
    memset(&a, 0, sizeof a);
    a.n_q_heads = 12;
    a.n_kv_heads = 3; /* G = 4 */
    a.mode = KV_CUDA_DECODE;
    long bad = 0;
    for (uint32_t b = 0; b < 5; b++)
        for (uint32_t h = 0; h < 3; h++)
            for (uint32_t g = 0; g < 4; g++) {
                /* q [batch][n_q][D], head h*G + g */
                bad += kv_cuda_row_index(a, b * 3 + h, g) != (size_t)b * 12 + h * 4 + g;
                bad += kv_cuda_row_limit(a, g, 77) != 77;
            }
    a.mode = KV_CUDA_PREFILL;
    a.n_new = 10;
    for (uint32_t h = 0; h < 3; h++)
        for (uint32_t i = 0; i < 10; i++)
            for (uint32_t g = 0; g < 4; g++) {
                const uint32_t r = i * 4 + g; /* rows of a list: (i, g) */
                /* q [n_new][n_q][D]; new row i sees [0, len - n_new + i] */
                bad += kv_cuda_row_index(a, h, r) != (size_t)i * 12 + h * 4 + g;
                bad += kv_cuda_row_limit(a, r, 50) != 50 - 10 + i + 1;
            }
    CHECK_EQ(bad, 0);
}

int main(void)
{
    test_tiles();
    test_rows();
    return kv_test_end();
}
