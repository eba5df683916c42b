/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_fmt_load.c — the CPU kernels' decoders of whole token ranges to
 * FP32 rows, for the formats the hot loops read as rows (kernels-side
 * format table, kv_cpu.h: FP16, MERGED with FP16 directions). Compiled once
 * per build (kv_cpu_simd.h): binary16 rows become FP32 with vcvtph2ps where
 * the build has F16C. They give exactly the floats kv_format_load gives
 * (binary16 -> FP32 is exact; a MERGED row is then multiplied by its
 * magnitude once, as kv_fmt_merged.c does); formats/ itself stays portable
 * C with no CPU dispatch. MERGED pages with INT4 directions go to the
 * format's own load. No state, no allocation.
 */
#include <assert.h>
#include <string.h>

#include "formats/kv_fmt_merged.h"
#include "kv_cpu.h"
#include "kv_cpu_simd.h"

void KV_CPU_SYM(kv_cpu_fp16_load)(const void *page, const kv_page_geom_t *g,
                                  uint32_t variant, uint32_t t0, uint32_t n,
                                  float *k, float *v)
{
    const uint32_t d = g->head_dim, tpp = kv_fmt_fp16_tpp(d, g->page_bytes);
    const uint8_t *p = page;
    (void)variant;
    assert((uint64_t)t0 + n <= tpp);
    if (k)
        kv_cpu_half_to_float(
            (const uint16_t *)(const void *)(p + kv_fmt_fp16_k_row(d, t0)), k,
            (size_t)n * d);
    if (v)
        kv_cpu_half_to_float(
            (const uint16_t *)(const void *)(p + kv_fmt_fp16_v_row(d, tpp, t0)),
            v, (size_t)n * d);
}

/* Rows [t0, t0+n) of one half (which 0: K, 1: V) of variant w of a MERGED
 * page with FP16 directions: e^ * magnitude. */
static inline __attribute__((always_inline)) void
merged_half(const uint8_t *p, const kv_fmt_merged_layout_t *l, uint32_t d,
            uint32_t w, uint32_t which, uint32_t t0, uint32_t n, float *out)
{
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t t = t0 + i;
        const uint16_t *e =
            (const uint16_t *)(const void *)(p + kv_fmt_merged_dir(l, which, t));
        float mag;
        memcpy(&mag, p + kv_fmt_merged_mag(l, t, 2u * which + w), sizeof mag);
        const kv_v8f m = kv_v8f_set1(mag);
        float *o = out + (size_t)i * d;
        for (uint32_t c = 0; c < d; c += 8) {
            const kv_v8f x = kv_v8f_ld_half(e + c) * m;
            kv_v8f_st(o + c, &x);
        }
    }
}

void KV_CPU_SYM(kv_cpu_merged_load)(const void *page, const kv_page_geom_t *g,
                                    uint32_t variant, uint32_t t0, uint32_t n,
                                    float *k, float *v)
{
    uint32_t dirf;
    memcpy(&dirf, page, sizeof dirf);
    if (dirf != KV_FMT_FP16) {
        kv_fmt_merged_load_variant(page, g, variant, t0, n, k, v);
        return;
    }
    const kv_fmt_merged_layout_t l =
        kv_fmt_merged_layout(g->head_dim, g->page_bytes, dirf);
    assert(variant <= 1 && (uint64_t)t0 + n <= l.cap);
    if (k)
        merged_half(page, &l, g->head_dim, variant & 1u, 0, t0, n, k);
    if (v)
        merged_half(page, &l, g->head_dim, variant & 1u, 1, t0, n, v);
}
