/* SPDX-License-Identifier: MIT */
/*
 * kv_format.c — the page-format traits table (see kv_format.h).
 *
 * One entry per kv_format_t, designated initialisers, indexed by the format
 * number (which never changes). An entry with name == NULL is a format that
 * is reserved but not implemented yet: kv_format_get returns NULL for it.
 * Each format's header (kv_fmt_<name>.h) declares its functions and the
 * KV_FMT_<NAME>_TRAITS initialiser that both this table and the format's
 * own kv_fmt_<name> entry use. The table is constant; no state.
 */
#include "kv_format.h"
#include "kv_fmt_fp16.h"
#include "kv_fmt_int.h"
#include "kv_fmt_merged.h"

const kv_format_traits_t kv_format_table[KV_FMT_COUNT] = {
    [KV_FMT_FP16] = KV_FMT_FP16_TRAITS,
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
