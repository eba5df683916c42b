/* SPDX-License-Identifier: MIT */
/*
 * kv_page_append.c — kv_page_append: add tokens to every kv_head list of one
 * (sequence, layer).
 *
 * Three phases, so that a failure leaves the table exactly as it was:
 *   1. validate: indices, every K/V value (finite, |x| <= 65504; for F16
 *      input no Inf/NaN pattern), position overflow;
 *   2. plan and allocate: per head, how many tokens fill the FP16 tail page,
 *      whether that tail is shared (copy-on-write: one fresh page to copy it
 *      to), how many fresh pages follow, and which arrays must grow (grown
 *      arrays are new blocks, so a failure just frees them); then every page
 *      of every head in one all-or-nothing kv_alloc_pages call;
 *   3. write: nothing can fail any more.
 *   4. residual conversion (kv_page_convert.c) for lists whose target
 *      format is not FP16: all-or-nothing by itself; if it cannot get its
 *      pages or memory it is deferred and the append still succeeds.
 * Only an unflagged FP16 tail is appended to (a RETAINED entry of a merged
 * pair is not residual: new tokens go to a fresh page after it).
 * Positions: a list keeps pos == NULL while its positions are 0,1,2,...; the
 * array is materialized when a non-identity position arrives.
 *
 * Input layout: k, v are [n][n_kv_heads][head_dim] of dtype, so one head's
 * rows are n_kv_heads * head_dim elements apart.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "formats/kv_fmt_fp16.h"
#include "kv_page_int.h"

/* What one head's list needs for this append. */
typedef struct append_plan {
    uint32_t fill;       /* tokens written into the existing tail page     */
    uint32_t cow;        /* 1: the tail is shared, copy it to a fresh page */
    uint32_t fresh;      /* fresh pages after the tail                      */
    uint32_t id0;        /* index in ids[] of this head's first fresh page  */
    int pos_array;       /* 1: the list has (or gets) a pos array           */
    kv_page_ent_t *ents; /* replacement entry array [cap_ents], or NULL     */
    uint32_t cap_ents;
    int32_t *pos;        /* replacement position array [cap_pos], or NULL   */
    uint32_t cap_pos;
} append_plan_t;

#define PLAN_STACK 8u   /* heads planned without a heap scratch block */
#define IDS_STACK  64u  /* page ids allocated without a heap scratch block */

/* 0 if all count values are finite and within FP16 range, else KV_ERANGE. */
static int check_values(kv_dtype_t dtype, const void *x, size_t count)
{
    if (dtype == KV_DTYPE_F32) {
        const float *f = x;
        for (size_t i = 0; i < count; i++)
            if (!(fabsf(f[i]) <= KV_HALF_MAX)) /* also rejects NaN */
                return KV_ERANGE;
    } else {
        const kv_half_t *h = x;
        for (size_t i = 0; i < count; i++)
            if ((h[i] & 0x7c00u) == 0x7c00u) /* Inf or NaN */
                return KV_ERANGE;
    }
    return KV_OK;
}

/* Capacity for at least need elements, growing geometrically from cap. */
static uint32_t grow_cap(uint32_t cap, uint32_t need)
{
    uint64_t c = cap ? (uint64_t)cap * 2 : 4;
    if (c < need)
        c = need;
    return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

/* Plan one list; KV_ERANGE if its positions would overflow int32. */
static int plan_list(const kv_page_table_t *pt, const kv_page_list_t *l,
                     uint32_t n, const int32_t *pos, append_plan_t *p)
{
    uint32_t tpp = pt->fp16_tpp;
    memset(p, 0, sizeof *p);
    if (l->n_ents) {
        const kv_page_ent_t *tail = &l->ents[l->n_ents - 1];
        if (tail->format == KV_FMT_FP16 && tail->flags == 0 &&
            tail->n_tokens < tpp) {
            p->fill = tpp - tail->n_tokens < n ? tpp - tail->n_tokens : n;
            p->cow = kv_alloc_refcount(pt->pool, tail->id) > 1;
        }
    }
    p->fresh = (n - p->fill + tpp - 1) / tpp;

    /* Positions: does the list need an array after this append? */
    if (l->pos) {
        p->pos_array = 1;
        if (!pos && l->pos_next + n - 1 > INT32_MAX)
            return KV_ERANGE;
    } else if (pos) {
        for (uint32_t i = 0; i < n; i++)
            if ((int64_t)pos[i] != (int64_t)l->n_tokens + i) {
                p->pos_array = 1;
                break;
            }
    }
    return KV_OK;
}

/* Free the arrays a plan allocated. */
static void plan_free(kv_page_table_t *pt, append_plan_t *p)
{
    kv_page_meta_free(pt, p->ents, (size_t)p->cap_ents * sizeof *p->ents);
    kv_page_meta_free(pt, p->pos, (size_t)p->cap_pos * sizeof *p->pos);
    p->ents = NULL;
    p->pos = NULL;
}

/* Allocate the arrays a plan needs; on failure nothing stays allocated. */
static int plan_arrays(kv_page_table_t *pt, const kv_page_list_t *l,
                       uint32_t n, append_plan_t *p)
{
    uint32_t need_ents = l->n_ents + p->fresh;
    if (need_ents > l->cap_ents) {
        p->cap_ents = grow_cap(l->cap_ents, need_ents);
        p->ents = kv_page_meta_alloc(pt, (size_t)p->cap_ents * sizeof *p->ents);
        if (!p->ents)
            return KV_ENOMEM;
    }
    uint32_t need_pos = l->n_tokens + n;
    if (p->pos_array && need_pos > l->cap_pos) {
        p->cap_pos = grow_cap(l->cap_pos, need_pos);
        p->pos = kv_page_meta_alloc(pt, (size_t)p->cap_pos * sizeof *p->pos);
        if (!p->pos) {
            plan_free(pt, p);
            return KV_ENOMEM;
        }
    }
    return KV_OK;
}

/* Install a plan's arrays and positions into the list (cannot fail). */
static void apply_arrays(kv_page_table_t *pt, kv_page_list_t *l, uint32_t n,
                         const int32_t *pos, append_plan_t *p)
{
    if (p->ents) {
        if (l->n_ents)
            memcpy(p->ents, l->ents, (size_t)l->n_ents * sizeof *l->ents);
        kv_page_meta_free(pt, l->ents, (size_t)l->cap_ents * sizeof *l->ents);
        l->ents = p->ents;
        l->cap_ents = p->cap_ents;
    }
    int64_t next = kv_page_list_pos_next(l);
    if (p->pos) {
        for (uint32_t i = 0; i < l->n_tokens; i++)
            p->pos[i] = kv_page_list_pos(l, i);
        kv_page_meta_free(pt, l->pos, (size_t)l->cap_pos * sizeof *l->pos);
        l->pos = p->pos;
        l->cap_pos = p->cap_pos;
    }
    if (p->pos_array) {
        l->pos_next = next;
        for (uint32_t i = 0; i < n; i++) {
            int32_t q = pos ? pos[i] : (int32_t)(next + i);
            l->pos[l->n_tokens + i] = q;
            if (q >= l->pos_next)
                l->pos_next = (int64_t)q + 1;
        }
    }
}

/* Write one head's tokens; ids: its fresh pages (CoW page first). */
static void write_list(kv_page_table_t *pt, kv_page_list_t *l, uint32_t n,
                       kv_dtype_t dtype, const char *k, const char *v,
                       size_t stride, const append_plan_t *p,
                       const kv_page_id_t *ids)
{
    const kv_format_traits_t *fp16 = &kv_fmt_fp16;
    const kv_page_geom_t *g = &pt->cfg.geom;
    size_t esz = dtype == KV_DTYPE_F32 ? sizeof(float) : sizeof(kv_half_t);
    size_t row_bytes = stride * esz;
    uint32_t done = 0;
    if (p->fill) {
        kv_page_ent_t *tail = &l->ents[l->n_ents - 1];
        if (p->cow) {
            kv_page_id_t nid = *ids++;
            fp16->copy(kv_page_addr(pt, nid), 0, kv_page_addr(pt, tail->id), 0,
                       tail->n_tokens, g);
            kv_page_unref(pt, tail->id, tail->format);
            tail->id = nid;
            pt->pages_by_format[KV_FMT_FP16]++;
        }
        fp16->store(kv_page_addr(pt, tail->id), g, tail->n_tokens, p->fill,
                    dtype, k, v, stride);
        tail->n_tokens = (uint16_t)(tail->n_tokens + p->fill);
        done = p->fill;
    }
    for (uint32_t i = 0; i < p->fresh; i++) {
        kv_page_id_t nid = ids[i];
        uint32_t cnt = n - done < pt->fp16_tpp ? n - done : pt->fp16_tpp;
        fp16->store(kv_page_addr(pt, nid), g, 0, cnt, dtype,
                    k + done * row_bytes, v + done * row_bytes, stride);
        l->ents[l->n_ents++] = (kv_page_ent_t){
            .id = nid, .format = KV_FMT_FP16, .flags = 0,
            .n_tokens = (uint16_t)cnt};
        pt->pages_by_format[KV_FMT_FP16]++;
        done += cnt;
    }
    assert(done == n);
    l->n_tokens += n;
}

int kv_page_append(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                   uint32_t n, kv_dtype_t dtype, const void *k, const void *v,
                   const int32_t *pos)
{
    int rc = kv_page_check_layer(pt, seq, layer);
    if (rc)
        return rc;
    if (dtype != KV_DTYPE_F32 && dtype != KV_DTYPE_F16)
        return KV_EINVAL;
    if (n == 0)
        return KV_OK;
    if (!k || !v)
        return KV_EINVAL;
    if (kv_page_layer_busy(pt, seq, layer))
        return KV_ENOTRES;

    uint32_t H = pt->cfg.n_kv_heads;
    size_t stride = (size_t)H * pt->cfg.geom.head_dim; /* elements per token */
    size_t esz = dtype == KV_DTYPE_F32 ? sizeof(float) : sizeof(kv_half_t);
    if ((rc = check_values(dtype, k, (size_t)n * stride)) ||
        (rc = check_values(dtype, v, (size_t)n * stride)))
        return rc;
    for (uint32_t h = 0; h < H; h++)
        if ((uint64_t)kv_page_list_at(pt, seq, layer, h)->n_tokens + n >
            INT32_MAX)
            return KV_ELIMIT;

    /* Plan every head. */
    append_plan_t plan_buf[PLAN_STACK];
    kv_page_scratch_t plan_s;
    append_plan_t *plans = kv_page_scratch_get(
        &plan_s, plan_buf, sizeof plan_buf, (size_t)H * sizeof *plans);
    if (!plans)
        return KV_ENOMEM;
    uint32_t total = 0;
    for (uint32_t h = 0; h < H; h++) {
        rc = plan_list(pt, kv_page_list_at(pt, seq, layer, h), n, pos,
                       &plans[h]);
        if (rc) {
            kv_page_scratch_put(&plan_s);
            return rc;
        }
        plans[h].id0 = total;
        total += plans[h].cow + plans[h].fresh;
    }

    /* Allocate arrays, then every page at once. */
    kv_page_id_t ids_buf[IDS_STACK];
    kv_page_scratch_t ids_s = {0};
    kv_page_id_t *ids = NULL;
    uint32_t h_ok = 0;
    for (; h_ok < H; h_ok++)
        if ((rc = plan_arrays(pt, kv_page_list_at(pt, seq, layer, h_ok), n,
                              &plans[h_ok])))
            break;
    if (!rc && total) {
        ids = kv_page_scratch_get(&ids_s, ids_buf, sizeof ids_buf,
                                  (size_t)total * sizeof *ids);
        rc = ids ? kv_alloc_pages(pt->pool, total, ids) : KV_ENOMEM;
    }
    if (rc) {
        for (uint32_t h = 0; h < h_ok; h++)
            plan_free(pt, &plans[h]);
        kv_page_scratch_put(&ids_s);
        kv_page_scratch_put(&plan_s);
        return rc;
    }

    /* Write: nothing fails from here on. */
    for (uint32_t h = 0; h < H; h++) {
        kv_page_list_t *l = kv_page_list_at(pt, seq, layer, h);
        size_t off = (size_t)h * pt->cfg.geom.head_dim * esz;
        apply_arrays(pt, l, n, pos, &plans[h]);
        write_list(pt, l, n, dtype, (const char *)k + off,
                   (const char *)v + off, stride, &plans[h],
                   ids ? ids + plans[h].id0 : NULL);
    }
    pt->tokens += (uint64_t)n * H;
    kv_page_scratch_put(&ids_s);
    kv_page_scratch_put(&plan_s);
    /* Residual conversion (KIVI); on KV_ENOMEM it is deferred, the append
     * stands (kv_page.h). */
    rc = kv_page_convert_residual(pt, seq, layer, UINT32_MAX);
    assert(rc == KV_OK || rc == KV_ENOMEM);
    return KV_OK;
}
