/*
 * kv_format.c — the page-format traits table (see kv_format.h).
 *
 * One entry per kv_format_t, designated initialisers, indexed by the format
 * number (which never changes). An entry with name == NULL is a format that
 * is reserved but not implemented yet: kv_format_get returns NULL for it.
 * The per-format functions live in the format's own file (fmt_<name>.c);
 * their prototypes are repeated here only to build the table (each file's
 * own kv_fmt_<name> entry checks the same signatures against the traits
 * struct). The table is constant; no state.
 */
#include "kv_format.h"
#include "fmt_int.h"
#include "fmt_merged.h"

/* fmt_fp16.c */
uint32_t kv_fmt_fp16_tokens_per_page(const kv_page_geom_t *g);
void kv_fmt_fp16_load(const void *page, const kv_page_geom_t *g, uint32_t t0,
                      uint32_t n, float *k, float *v);
void kv_fmt_fp16_store(void *page, const kv_page_geom_t *g, uint32_t t0,
                       uint32_t n, kv_dtype_t dtype, const void *k,
                       const void *v, size_t src_stride);
void kv_fmt_fp16_copy(void *dst, uint32_t d0, const void *src, uint32_t s0,
                      uint32_t n, const kv_page_geom_t *g);

const kv_format_traits_t kv_format_table[KV_FMT_COUNT] = {
    [KV_FMT_FP16] = {
        .name = "fp16",
        .bits_note = "FP16 = 16 bits/element",
        .tokens_per_page = kv_fmt_fp16_tokens_per_page,
        .load = kv_fmt_fp16_load,
        .store = kv_fmt_fp16_store,
        .copy = kv_fmt_fp16_copy,
    },
    [KV_FMT_INT4] = KV_FMT_INT4_TRAITS,
    [KV_FMT_INT2] = KV_FMT_INT2_TRAITS,
    [KV_FMT_MERGED] = KV_FMT_MERGED_TRAITS,
};

const kv_format_traits_t *kv_format_get(uint32_t f)
{
    if (f >= KV_FMT_COUNT || kv_format_table[f].name == NULL)
        return NULL;
    return &kv_format_table[f];
}
