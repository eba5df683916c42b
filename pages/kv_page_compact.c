/* SPDX-License-Identifier: MIT */
/*
 * kv_page_compact.c — kv_page_compact: keep tokens keep[0..n_keep) of one
 * list, in order with their positions, packed densely into
 * ceil(n_keep / T) FP16 pages (T = FP16 tokens per page).
 *
 * Destination page j (tokens j*T ..) is, in this order of preference:
 *   KEEP    the old entry j unchanged (FP16, starts at token j*T, and every
 *           token it keeps is kept in place: keep[k] == k) — not written, so
 *           it may be shared; such pages form a prefix;
 *   INPLACE the old entry j's page, written in place: FP16, refcount 1,
 *           starting at token j*T. Safe because destination token k
 *           overwrites old token k, and every source still to be read is
 *           keep[k'] > keep[k] >= k (copies go forward; src == dst overlap is
 *           handled by the format's copy);
 *   FRESH   a new page (old page shared, not FP16, or misaligned).
 * Fresh pages, a bigger entry array and a position array are all allocated
 * before anything is written (all-or-nothing); pages no longer referenced are
 * released only after all copying is done. Non-FP16 sources are decoded with
 * kv_format_load (a MERGED entry restored as its own layer, by its variant)
 * and written with the FP16 store: compaction leaves a list all FP16 and
 * unflagged (converted tokens re-convert, from their decoded values, once
 * the list's residual reaches R again; merged tokens of this layer become
 * plain FP16 while the pair's other layer keeps the merged page). Pages
 * of the old list are released per entry, so a merged page loses only this
 * list's reference.
 */
#include <assert.h>
#include <string.h>

#include "formats/kv_fmt_fp16.h"
#include "kv_page_int.h"

enum { DST_KEEP = 0, DST_INPLACE = 1, DST_FRESH = 2 };

#define DST_STACK 64u /* destination pages planned without a heap block */

/* Per destination page: its id and how it is obtained. */
typedef struct dst_page {
    kv_page_id_t id;
    uint32_t mode; /* DST_* */
} dst_page_t;

/* 0, KV_ERANGE (index >= n_tokens) or KV_EINVAL (not increasing). */
static int check_keep(const uint32_t *keep, uint32_t n_keep, uint32_t n_tokens)
{
    for (uint32_t i = 0; i < n_keep; i++) {
        if (keep[i] >= n_tokens)
            return KV_ERANGE;
        if (i && keep[i] <= keep[i - 1])
            return KV_EINVAL;
    }
    return KV_OK;
}

/* Choose the mode of each destination page; returns fresh pages needed. */
static uint32_t plan_dst(const kv_page_table_t *pt, const kv_page_list_t *l,
                         const uint32_t *keep, uint32_t n_keep, dst_page_t *dst,
                         uint32_t n_dst)
{
    uint32_t T = pt->fp16_tpp, fresh = 0, start = 0;
    for (uint32_t j = 0; j < n_dst; j++) {
        uint32_t t0 = j * T, cnt = n_keep - t0 < T ? n_keep - t0 : T;
        dst[j].mode = DST_FRESH;
        dst[j].id = KV_PAGE_ID_INVALID;
        if (j < l->n_ents) {
            const kv_page_ent_t *e = &l->ents[j];
            if (e->format == KV_FMT_FP16 && start == t0) {
                dst[j].id = e->id;
                /* keep increasing: keep[last] == last means all in place. */
                if (e->n_tokens >= cnt && keep[t0 + cnt - 1] == t0 + cnt - 1)
                    dst[j].mode = DST_KEEP;
                else if (kv_alloc_refcount(pt->pool, e->id) == 1)
                    dst[j].mode = DST_INPLACE;
                else
                    dst[j].id = KV_PAGE_ID_INVALID;
            }
            start += e->n_tokens;
        }
        fresh += dst[j].mode == DST_FRESH;
    }
    return fresh;
}

/* Copy kept tokens into the destination pages. fk, fv: scratch of T rows
 * each for non-FP16 sources (NULL if there are none). */
static void copy_tokens(const kv_page_table_t *pt, const kv_page_list_t *l,
                        const uint32_t *keep, uint32_t n_keep,
                        const dst_page_t *dst, float *fk, float *fv)
{
    const kv_page_geom_t *g = &pt->cfg.geom;
    const kv_format_traits_t *fp16 = &kv_fmt_fp16;
    uint32_t T = pt->fp16_tpp;
    uint32_t e = 0, es = 0; /* source entry holding keep[k], its first token */
    uint32_t k = 0;
    while (k < n_keep) {
        uint32_t j = k / T, s = k % T;
        if (dst[j].mode == DST_KEEP) {
            k = (j + 1) * T;
            continue;
        }
        uint32_t i = keep[k];
        while (i >= es + l->ents[e].n_tokens)
            es += l->ents[e++].n_tokens;
        const kv_page_ent_t *src = &l->ents[e];
        /* A run: consecutive sources in one source page, one destination. */
        uint32_t run = 1;
        while (k + run < n_keep && s + run < T && keep[k + run] == i + run &&
               i + run < es + src->n_tokens)
            run++;
        void *dp = kv_page_addr(pt, dst[j].id);
        const void *sp = kv_page_addr(pt, src->id);
        if (src->format == KV_FMT_FP16) {
            fp16->copy(dp, s, sp, i - es, run, g);
        } else {
            assert(kv_format_get(src->format) && fk && fv);
            kv_format_load(src->format, kv_page_ent_variant(src), sp, g,
                           i - es, run, fk, fv);
            fp16->store(dp, g, s, run, KV_DTYPE_F32, fk, fv, g->head_dim);
        }
        k += run;
    }
}

int kv_page_compact(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                    uint32_t head, const uint32_t *keep, uint32_t n_keep)
{
    int rc = kv_page_check_list(pt, seq, layer, head);
    if (rc)
        return rc;
    if (n_keep && !keep)
        return KV_EINVAL;
    kv_page_list_t *l = kv_page_list_at(pt, seq, layer, head);
    rc = check_keep(keep, n_keep, l->n_tokens);
    if (rc)
        return rc;
    if (l->n_busy)
        return KV_ENOTRES;

    uint32_t T = pt->fp16_tpp, D = pt->cfg.geom.head_dim;
    uint32_t n_dst = (n_keep + T - 1) / T;
    int identity = 1; /* result positions are 0..n_keep-1 */
    for (uint32_t k = 0; k < n_keep && identity; k++)
        identity = kv_page_list_pos(l, keep[k]) == (int32_t)k;
    int foreign = 0; /* a source entry is not FP16 */
    for (uint32_t e = 0; e < l->n_ents; e++)
        foreign |= l->ents[e].format != KV_FMT_FP16;

    /* Scratch: destination pages, fresh ids, FP32 rows for foreign pages. */
    dst_page_t dst_buf[DST_STACK];
    kv_page_scratch_t dst_s, ids_s = {0}, f_s = {0};
    dst_page_t *dst = kv_page_scratch_get(&dst_s, dst_buf, sizeof dst_buf,
                                          (size_t)n_dst * sizeof *dst);
    kv_page_ent_t *ents = NULL; /* replacement entry array */
    int32_t *pos = NULL;        /* replacement position array */
    size_t ents_n = 0, pos_n = 0;
    kv_page_id_t *ids = NULL;
    float *fk = NULL;
    if (!dst && n_dst)
        return KV_ENOMEM;
    uint32_t fresh = plan_dst(pt, l, keep, n_keep, dst, n_dst);
    rc = KV_ENOMEM;
    if (n_dst > l->cap_ents) {
        ents_n = (size_t)n_dst * sizeof *ents;
        if (!(ents = kv_page_meta_alloc(pt, ents_n)))
            goto fail;
    }
    if (!identity && n_keep > l->cap_pos) {
        pos_n = (size_t)n_keep * sizeof *pos;
        if (!(pos = kv_page_meta_alloc(pt, pos_n)))
            goto fail;
    }
    if (foreign && n_keep) {
        if (!(fk = kv_page_scratch_get(&f_s, NULL, 0,
                                       (size_t)2 * T * D * sizeof(float))))
            goto fail;
    }
    if (fresh) {
        if (!(ids = kv_page_scratch_get(&ids_s, NULL, 0,
                                        (size_t)fresh * sizeof *ids)))
            goto fail;
        if ((rc = kv_alloc_pages(pt->pool, fresh, ids)))
            goto fail;
        for (uint32_t j = 0, f = 0; j < n_dst; j++)
            if (dst[j].mode == DST_FRESH)
                dst[j].id = ids[f++];
        pt->pages_by_format[KV_FMT_FP16] += fresh;
    }

    /* Nothing fails from here on. Copy, then positions, then entries. */
    copy_tokens(pt, l, keep, n_keep, dst, fk, fk ? fk + (size_t)T * D : NULL);
    if (!identity) {
        int32_t *out = pos ? pos : l->pos;
        /* Forward in place is safe: keep[k] >= k. */
        for (uint32_t k = 0; k < n_keep; k++)
            out[k] = kv_page_list_pos(l, keep[k]);
        if (pos) {
            kv_page_meta_free(pt, l->pos, (size_t)l->cap_pos * sizeof *l->pos);
            l->pos = pos;
            l->cap_pos = n_keep;
        }
    } else {
        kv_page_meta_free(pt, l->pos, (size_t)l->cap_pos * sizeof *l->pos);
        l->pos = NULL;
        l->cap_pos = 0;
    }
    /* Release every old page that is not a destination in KEEP/INPLACE mode
     * (a destination page j reuses old entry j exactly when the ids match). */
    for (uint32_t e = 0; e < l->n_ents; e++)
        if (!(e < n_dst && dst[e].id == l->ents[e].id))
            kv_page_unref(pt, l->ents[e].id, l->ents[e].format);
    if (ents) {
        kv_page_meta_free(pt, l->ents, (size_t)l->cap_ents * sizeof *l->ents);
        l->ents = ents;
        l->cap_ents = n_dst;
    }
    for (uint32_t j = 0; j < n_dst; j++) {
        uint32_t cnt = n_keep - j * T < T ? n_keep - j * T : T;
        l->ents[j] = (kv_page_ent_t){.id = dst[j].id, .format = KV_FMT_FP16,
                                     .flags = 0, .n_tokens = (uint16_t)cnt};
    }
    l->n_ents = n_dst;
    pt->tokens -= l->n_tokens - n_keep;
    l->n_tokens = n_keep;
    if (l->pos)
        kv_page_list_pos_rescan(l);
    kv_page_scratch_put(&f_s);
    kv_page_scratch_put(&ids_s);
    kv_page_scratch_put(&dst_s);
    return KV_OK;

fail:
    kv_page_meta_free(pt, ents, ents_n);
    kv_page_meta_free(pt, pos, pos_n);
    kv_page_scratch_put(&f_s);
    kv_page_scratch_put(&ids_s);
    kv_page_scratch_put(&dst_s);
    return rc;
}
