/* SPDX-License-Identifier: MIT */
/*
 * kv_page_update.c — kv_page_update_v: overwrite the VALUE rows of tokens
 * [t0, t0+n) of one list in place (CaM merges evicted values into kept
 * tokens). Keys, positions, formats and token order never change.
 *
 * Only FP16 entries can be written (KV_EINVAL otherwise; RETAINED FP16
 * originals of a merged pair included, MERGED/INT pages never). A page shared
 * with another list (refcount > 1, a fork) is first copied to a fresh page
 * (copy-on-write): every fresh page is allocated before anything is written,
 * so the call is all-or-nothing. When none of the touched pages is shared
 * the call allocates nothing and cannot fail on valid input.
 */
#include <math.h>
#include <string.h>

#include "formats/kv_fmt_fp16.h"
#include "kv_page_int.h"

#define UPD_STACK 16u /* CoW pages planned without a heap block */

int kv_page_update_v(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                     uint32_t head, uint32_t t0, uint32_t n, const float *v)
{
    if (n && !v)
        return KV_EINVAL;
    int rc = kv_page_check_list(pt, seq, layer, head);
    if (rc)
        return rc;
    kv_page_list_t *l = kv_page_list_at(pt, seq, layer, head);
    if (t0 > l->n_tokens || n > l->n_tokens - t0)
        return KV_ERANGE;
    if (l->n_busy)
        return KV_ENOTRES;
    const uint32_t D = pt->cfg.geom.head_dim;
    for (size_t i = 0; i < (size_t)n * D; i++)
        if (!(fabsf(v[i]) <= 65504.0f))
            return KV_ERANGE;
    /* Entries touched: [e0, e1); all FP16; count the shared ones. */
    uint32_t e0 = 0, start = 0, n_shared = 0, e1;
    while (e0 < l->n_ents && start + l->ents[e0].n_tokens <= t0)
        start += l->ents[e0++].n_tokens;
    uint32_t first_start = start;
    for (e1 = e0; e1 < l->n_ents && start < t0 + n; e1++) {
        if (l->ents[e1].format != KV_FMT_FP16)
            return KV_EINVAL;
        n_shared += kv_alloc_refcount(pt->pool, l->ents[e1].id) > 1;
        start += l->ents[e1].n_tokens;
    }
    if (n == 0)
        return 0;
    kv_page_id_t stack_ids[UPD_STACK];
    kv_page_scratch_t sc = {NULL, 0};
    kv_page_id_t *ids = NULL;
    if (n_shared) {
        ids = kv_page_scratch_get(&sc, stack_ids, sizeof stack_ids,
                                  n_shared * sizeof *ids);
        if (!ids)
            return KV_ENOMEM;
        rc = kv_alloc_pages(pt->pool, n_shared, ids);
        if (rc) {
            kv_page_scratch_put(&sc);
            return rc;
        }
    }
    const kv_format_traits_t *fp16 = &kv_fmt_fp16;
    const kv_page_geom_t *g = &pt->cfg.geom;
    uint32_t used = 0;
    start = first_start;
    for (uint32_t e = e0; e < e1; e++) {
        kv_page_ent_t *ent = &l->ents[e];
        if (kv_alloc_refcount(pt->pool, ent->id) > 1) {
            kv_page_id_t nid = ids[used++];
            fp16->copy(kv_page_addr(pt, nid), 0, kv_page_addr(pt, ent->id), 0,
                       ent->n_tokens, g);
            kv_page_unref(pt, ent->id, ent->format);
            ent->id = nid;
            pt->pages_by_format[KV_FMT_FP16]++;
        }
        uint32_t a = t0 > start ? t0 - start : 0;
        uint32_t b = t0 + n - start < ent->n_tokens ? t0 + n - start : ent->n_tokens;
        void *page = kv_page_addr(pt, ent->id);
        for (uint32_t t = a; t < b; t++)
            kv_half_from_float_n(v + (size_t)(start + t - t0) * D,
                                 kv_fp16_v(page, g, pt->fp16_tpp, t), D);
        start += ent->n_tokens;
    }
    if (n_shared)
        kv_page_scratch_put(&sc);
    return 0;
}
