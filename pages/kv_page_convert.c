/* SPDX-License-Identifier: MIT */
/*
 * kv_page_convert.c — residual conversion (KIVI/MiniKV): the oldest tokens
 * of a list's FP16 residual become pages of the list's target format
 * (INT4/INT2), R at a time after an append or on demand
 * (kv_page_quantize); plus kv_page_set_format and the residual/cut/entry
 * helpers kv_page_merge.c shares (kv_page_int.h).
 *
 * Rule (kv_page.h): the residual is the list's trailing run of unflagged
 * FP16 entries; c tokens convert (a multiple of 16; after an append
 * floor(residual / R) * R), in order, into
 *   1. the INT page just before the residual, if it is of the target
 *      format and has room (room is whole groups: INT entries hold whole
 *      groups), copied to a fresh page first when it is shared;
 *   2. fresh target pages, filled one after the other.
 * The FP16 entries whose tokens all converted are released; the entry
 * holding the first unconverted token (if split) keeps its remaining tokens,
 * moved to the front of its page (or to a fresh page when it is shared).
 * Token order and positions do not change.
 *
 * Phases, for all kv_head lists of the layer at once: plan (no change),
 * allocate (entry arrays, scratch, every page in one kv_alloc_pages call:
 * all-or-nothing), write (the backend's convert kernel with scratch given,
 * then cuts and entries; nothing can fail). An append calls this after its
 * own write and ignores KV_ENOMEM (the conversion is deferred: kv_page.h).
 */
#include <assert.h>
#include <string.h>

#include "formats/kv_fmt_fp16.h"
#include "kv_page_int.h"

#define PLAN_STACK 8u /* heads planned without a heap scratch block */

/* ---- helpers shared with kv_page_merge.c --------------------------------- */

uint32_t kv_page_residual(const kv_page_list_t *l, uint32_t *r0)
{
    uint32_t e = l->n_ents, t = 0;
    while (e > 0 && l->ents[e - 1].format == KV_FMT_FP16 &&
           l->ents[e - 1].flags == 0)
        t += l->ents[--e].n_tokens;
    *r0 = e;
    return t;
}

uint32_t kv_page_grow_cap(uint32_t cap, uint32_t need)
{
    uint64_t c = cap ? (uint64_t)cap * 2 : 4;
    if (c < need)
        c = need;
    return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

void kv_page_cut_plan(const kv_page_table_t *pt, const kv_page_list_t *l,
                      uint32_t r0, uint32_t c, kv_page_cut_t *cut)
{
    uint32_t e = r0, at = 0;
    while (e < l->n_ents && at + l->ents[e].n_tokens <= c)
        at += l->ents[e++].n_tokens;
    cut->r0 = r0;
    cut->e_s = e;
    cut->a = c - at;
    assert(cut->a == 0 || e < l->n_ents);
    cut->fresh = cut->a > 0 && kv_alloc_refcount(pt->pool, l->ents[e].id) > 1;
}

void kv_page_kern_pages(const kv_page_table_t *pt, const kv_page_list_t *l,
                        uint32_t e0, uint32_t n, kv_kern_page_t *out)
{
    for (uint32_t i = 0; i < n; i++) {
        const kv_page_ent_t *e = &l->ents[e0 + i];
        out[i] = (kv_kern_page_t){.data = kv_page_addr(pt, e->id),
                                  .n_tokens = e->n_tokens,
                                  .format = e->format,
                                  .variant = kv_page_ent_variant(e)};
    }
}

void kv_page_cut_apply(kv_page_table_t *pt, kv_page_list_t *l,
                       const kv_page_cut_t *cut, kv_page_id_t fid)
{
    const kv_format_traits_t *fp16 = &kv_fmt_fp16;
    if (cut->a) {
        kv_page_ent_t *e = &l->ents[cut->e_s];
        uint32_t rest = e->n_tokens - cut->a;
        assert(e->format == KV_FMT_FP16);
        if (cut->fresh) {
            fp16->copy(kv_page_addr(pt, fid), 0, kv_page_addr(pt, e->id),
                       cut->a, rest, &pt->cfg.geom);
            kv_page_unref(pt, e->id, e->format);
            e->id = fid;
            pt->pages_by_format[KV_FMT_FP16]++;
        } else {
            void *p = kv_page_addr(pt, e->id); /* in place: d0 < s0 */
            fp16->copy(p, 0, p, cut->a, rest, &pt->cfg.geom);
        }
        e->n_tokens = (uint16_t)rest;
    }
    for (uint32_t i = cut->r0; i < cut->e_s; i++)
        kv_page_unref(pt, l->ents[i].id, l->ents[i].format);
}

kv_page_ent_t *kv_page_ents_open(kv_page_table_t *pt, kv_page_list_t *l,
                                 uint32_t r0, uint32_t e_s, uint32_t n_ins,
                                 kv_page_ent_t *new_arr, uint32_t new_cap)
{
    uint32_t tail = l->n_ents - e_s;
    if (new_arr) {
        memcpy(new_arr, l->ents, (size_t)r0 * sizeof *new_arr);
        memcpy(new_arr + r0 + n_ins, l->ents + e_s,
               (size_t)tail * sizeof *new_arr);
        kv_page_meta_free(pt, l->ents, (size_t)l->cap_ents * sizeof *l->ents);
        l->ents = new_arr;
        l->cap_ents = new_cap;
    } else {
        assert(r0 + n_ins + tail <= l->cap_ents);
        memmove(l->ents + r0 + n_ins, l->ents + e_s,
                (size_t)tail * sizeof *l->ents);
    }
    l->n_ents = r0 + n_ins + tail;
    return l->ents + r0;
}

/* ---- the conversion ------------------------------------------------------- */

/* What one head's list needs. */
typedef struct conv_plan {
    uint32_t c;          /* tokens converted; 0: nothing to do          */
    uint32_t b_fill;     /* tokens added to the boundary entry r0 - 1   */
    uint32_t b_cow;      /* 1: the boundary page is shared: copy it     */
    uint32_t n_int;      /* fresh target pages                          */
    kv_page_cut_t cut;
    uint32_t id0;        /* this head's ids: [b_cow][n_int][cut.fresh]  */
    kv_page_ent_t *ents; /* replacement entry array [cap_ents], or NULL */
    uint32_t cap_ents;
} conv_plan_t;

/* Plan one list: tokens to convert by the rule (keep, as for
 * kv_page_convert_residual), and what that takes. */
static void plan_list(const kv_page_table_t *pt, const kv_page_list_t *l,
                      uint32_t keep, conv_plan_t *p)
{
    memset(p, 0, sizeof *p);
    const uint32_t tgt = kv_page_target_format(l->target);
    uint32_t tpp = kv_page_fmt_tpp(pt, tgt);
    if (tgt == KV_FMT_FP16 || tpp == 0)
        return;
    uint32_t r0, res = kv_page_residual(l, &r0);
    if (keep == UINT32_MAX)
        p->c = res / pt->residual * pt->residual;
    else
        p->c = res > keep ? (res - keep) / 16u * 16u : 0;
    if (p->c == 0)
        return;
    if (r0 > 0) {
        const kv_page_ent_t *b = &l->ents[r0 - 1];
        if (b->format == tgt && b->flags == kv_page_target_variant(l->target) &&
            b->n_tokens < tpp) {
            p->b_fill = tpp - b->n_tokens < p->c ? tpp - b->n_tokens : p->c;
            p->b_cow = kv_alloc_refcount(pt->pool, b->id) > 1;
        }
    }
    p->n_int = (p->c - p->b_fill + tpp - 1) / tpp;
    kv_page_cut_plan(pt, l, r0, p->c, &p->cut);
}

/* Convert one list as planned (pages in ids; nothing fails). */
static void write_list(kv_page_table_t *pt, kv_page_list_t *l,
                       const conv_plan_t *p, const kv_page_id_t *ids,
                       kv_kern_page_t *src, void **dst, float *scratch)
{
    const kv_page_geom_t *g = &pt->cfg.geom;
    const uint32_t tgt = kv_page_target_format(l->target);
    const uint32_t var = kv_page_target_variant(l->target);
    const uint32_t tpp = kv_page_fmt_tpp(pt, tgt);
    const kv_page_cut_t *cut = &p->cut;
    uint32_t n_dst = 0, dst_off = 0;
    if (p->b_fill) {
        kv_page_ent_t *b = &l->ents[cut->r0 - 1];
        if (p->b_cow) {
            kv_page_id_t nid = *ids++;
            memcpy(kv_page_addr(pt, nid), kv_page_addr(pt, b->id), g->page_bytes);
            kv_page_unref(pt, b->id, b->format);
            b->id = nid;
            pt->pages_by_format[tgt]++;
        }
        dst[n_dst++] = kv_page_addr(pt, b->id);
        dst_off = b->n_tokens;
    }
    for (uint32_t i = 0; i < p->n_int; i++)
        dst[n_dst++] = kv_page_addr(pt, ids[i]);
    uint32_t n_src = kv_page_cut_n_src(cut);
    kv_page_kern_pages(pt, l, cut->r0, n_src, src);
    kv_convert_params_t cp = {
        .geom = *g, .src = src, .n_src = n_src, .src_off = 0,
        .n_tokens = p->c, .dst_format = tgt, .dst_variant = var,
        .dst = dst, .n_dst = n_dst,
        .dst_off = dst_off, .scratch = scratch,
    };
    int rc = kv_backend_convert(pt->cfg.backend, &cp);
    assert(rc == 0 && "convert kernel failed on a planned call");
    (void)rc;
    if (p->b_fill)
        l->ents[cut->r0 - 1].n_tokens =
            (uint16_t)(l->ents[cut->r0 - 1].n_tokens + p->b_fill);
    kv_page_cut_apply(pt, l, cut, cut->fresh ? ids[p->n_int] : 0);
    kv_page_ent_t *ins = kv_page_ents_open(pt, l, cut->r0,
                                           cut->e_s, p->n_int, p->ents,
                                           p->cap_ents);
    uint32_t left = p->c - p->b_fill;
    for (uint32_t i = 0; i < p->n_int; i++) {
        uint32_t cnt = left < tpp ? left : tpp;
        ins[i] = (kv_page_ent_t){.id = ids[i], .format = (uint8_t)tgt,
                                 .flags = (uint8_t)var, .n_tokens = (uint16_t)cnt};
        left -= cnt;
    }
    pt->pages_by_format[tgt] += p->n_int;
}

int kv_page_convert_residual(kv_page_table_t *pt, uint32_t seq,
                             uint32_t layer, uint32_t keep)
{
    const uint32_t H = pt->cfg.n_kv_heads;
    uint32_t any = 0; /* fast path: no head converts, nothing allocated */
    for (uint32_t h = 0; h < H && !any; h++) {
        conv_plan_t tmp;
        plan_list(pt, kv_page_list_at(pt, seq, layer, h), keep, &tmp);
        any = tmp.c != 0;
    }
    if (!any)
        return KV_OK;
    conv_plan_t plan_buf[PLAN_STACK];
    kv_page_scratch_t plan_s, ids_s = {0}, work_s = {0};
    conv_plan_t *plans = kv_page_scratch_get(&plan_s, plan_buf,
                                             sizeof plan_buf,
                                             (size_t)H * sizeof *plans);
    if (!plans)
        return KV_ENOMEM;
    uint32_t total = 0, max_src = 0, max_dst = 0, busy = 0;
    for (uint32_t h = 0; h < H; h++) {
        conv_plan_t *p = &plans[h];
        plan_list(pt, kv_page_list_at(pt, seq, layer, h), keep, p);
        if (!p->c)
            continue;
        busy++;
        p->id0 = total;
        total += p->b_cow + p->n_int + p->cut.fresh;
        uint32_t ns = kv_page_cut_n_src(&p->cut), nd = p->n_int + 1;
        max_src = ns > max_src ? ns : max_src;
        max_dst = nd > max_dst ? nd : max_dst;
    }
    if (!busy) {
        kv_page_scratch_put(&plan_s);
        return KV_OK;
    }

    /* Allocate: entry arrays, scratch (kernel pages, dst pointers, floats),
     * then every page at once. */
    int rc = KV_OK;
    uint32_t h_ok = 0;
    for (; h_ok < H; h_ok++) {
        conv_plan_t *p = &plans[h_ok];
        const kv_page_list_t *l = kv_page_list_at(pt, seq, layer, h_ok);
        if (!p->c)
            continue;
        uint32_t need = p->cut.r0 + p->n_int + (l->n_ents - p->cut.e_s);
        if (need > l->cap_ents) {
            p->cap_ents = kv_page_grow_cap(l->cap_ents, need);
            p->ents = kv_page_meta_alloc(pt, (size_t)p->cap_ents *
                                                 sizeof *p->ents);
            if (!p->ents) {
                rc = KV_ENOMEM;
                break;
            }
        }
    }
    size_t src_n = (size_t)max_src * sizeof(kv_kern_page_t);
    size_t dst_n = (size_t)max_dst * sizeof(void *);
    size_t fl_n = (size_t)KV_CONVERT_SCRATCH_FLOATS(pt->cfg.geom.head_dim) *
                  sizeof(float);
    char *work = NULL;
    kv_page_id_t *ids = NULL;
    if (!rc) {
        /* floats first (alignment), then kernel pages, then pointers */
        work = kv_page_scratch_get(&work_s, NULL, 0, fl_n + src_n + dst_n);
        ids = work ? kv_page_scratch_get(&ids_s, NULL, 0,
                                         (size_t)total * sizeof *ids)
                   : NULL;
        rc = !work || (total && !ids)           ? KV_ENOMEM
             : total ? kv_alloc_pages(pt->pool, total, ids)
                     : KV_OK;
    }
    if (rc) {
        for (uint32_t h = 0; h < h_ok; h++)
            kv_page_meta_free(pt, plans[h].ents,
                              (size_t)plans[h].cap_ents * sizeof *plans[h].ents);
        kv_page_scratch_put(&ids_s);
        kv_page_scratch_put(&work_s);
        kv_page_scratch_put(&plan_s);
        return rc;
    }

    /* Write: nothing fails from here on. */
    float *scratch = (float *)(void *)work;
    kv_kern_page_t *src = (kv_kern_page_t *)(void *)(work + fl_n);
    void **dst = (void **)(void *)(work + fl_n + src_n);
    for (uint32_t h = 0; h < H; h++)
        if (plans[h].c)
            write_list(pt, kv_page_list_at(pt, seq, layer, h), &plans[h],
                       ids ? ids + plans[h].id0 : NULL, src, dst, scratch); /* no pages: NULL */
    kv_page_scratch_put(&ids_s);
    kv_page_scratch_put(&work_s);
    kv_page_scratch_put(&plan_s);
    return KV_OK;
}

/* ---- the entry points ---------------------------------------------------- */

/* 0 if target (a format, INT ones possibly | KV_FMT_ROT) is one this
 * table's pages can hold; rotation needs a power-of-two head_dim
 * (KV_EINVAL otherwise). */
static int check_target(const kv_page_table_t *pt, uint32_t target)
{
    const uint32_t fmt = kv_page_target_format(target);
    if (fmt != KV_FMT_FP16 && fmt != KV_FMT_INT4 && fmt != KV_FMT_INT2)
        return KV_EINVAL;
    if (kv_page_target_variant(target) &&
        (fmt == KV_FMT_FP16 ||
         kv_format_variants(fmt, &pt->cfg.geom) < 2u))
        return KV_EINVAL;
    return kv_page_fmt_tpp(pt, fmt) ? KV_OK : KV_ENOTSUP;
}

int kv_page_set_format(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                       uint32_t fmt)
{
    int rc = kv_page_check_layer(pt, seq, layer);
    if (!rc)
        rc = check_target(pt, fmt);
    if (rc)
        return rc;
    if (kv_page_layer_busy(pt, seq, layer))
        return KV_ENOTRES;
    for (uint32_t h = 0; h < pt->cfg.n_kv_heads; h++)
        kv_page_list_at(pt, seq, layer, h)->target = fmt;
    return KV_OK;
}

int kv_page_quantize(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                     uint32_t keep_fp16)
{
    int rc = kv_page_check_layer(pt, seq, layer);
    if (rc)
        return rc;
    if (kv_page_layer_busy(pt, seq, layer))
        return KV_ENOTRES;
    if (keep_fp16 == UINT32_MAX) /* the append rule's marker */
        keep_fp16--;
    return kv_page_convert_residual(pt, seq, layer, keep_fp16);
}
