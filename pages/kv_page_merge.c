/* SPDX-License-Identifier: MIT */
/*
 * kv_page_merge.c — kv_page_merge_layers: MiniCache merge of the layer pair
 * (layer-1, layer) of one sequence, every kv_head (docs/design.md).
 *
 * Per head, lists A (layer-1) and B (layer): their residuals (trailing
 * unflagged FP16 runs) must hold the same number of tokens with the same
 * positions. The first m = residual - keep_fp16 of them are merged:
 *   1. select (backend kernel): which tokens are retained unmerged;
 *   2. merge (backend kernel): merged tokens -> fresh MERGED pages (filled
 *      to the direction format's capacity, in token order), retained
 *      tokens' originals -> fresh FP16 pages of each layer;
 *   3. both lists: the m tokens' FP16 entries are replaced by
 *        [MERGED entries][RETAINED FP16 entries]
 *      (B's MERGED entries carry KV_PAGE_ENT_UPPER: they read the page as
 *      layer l), the entry holding the first unmerged token keeps the rest
 *      (moved to its page's front, or to a fresh page when shared), and the
 *      positions of those m tokens are permuted the same way: merged ones
 *      first, then retained ones, each in their old order. Attention does
 *      not depend on token order (keys carry RoPE; positions live in pos).
 *   Each MERGED page is named by both lists: refcount 2 per sequence.
 * The residual after the merged segment is the same unmerged tail as
 * before; a later merge of new tokens appends another [MERGED][RETAINED]
 * segment after this one.
 *
 * Packing: without it every decode merge would leave a partly filled
 * MERGED page and a partly filled FP16 page per layer behind (docs/plan.md).
 * The previous segment's partly filled pages just before the residual
 * (both lists alike) join the call and are rewritten to fresh pages with
 * the new tokens; the old pages are released (never written: they may be
 * shared):
 *   - `pre`: a partly filled RETAINED entry right before the residual, when
 *     this merge retains a token (or packs the MERGED page before it): its
 *     tokens join as leading tokens marked retained, read as a kernel
 *     source;
 *   - `pm`: a partly filled MERGED entry right before that (or right before
 *     the residual), with this merge's direction format, when this merge
 *     merges a token: its page is copied into the first fresh MERGED page
 *     and the kernel writes the new merged tokens from slot pm on
 *     (kv_merge_params_t.dst_off); its tokens are not re-merged.
 * The segment becomes
 *   [pm + new MERGED][pre + new RETAINED]
 * so positions are permuted over all pm + pre + m tokens (merged first,
 * each group in its old order). A merge that retains every token and packs
 * no MERGED page keeps the order.
 *
 * All-or-nothing: validation, selection (scratch only), then every entry
 * array, position array and page is allocated before the first write.
 */
#include <assert.h>
#include <string.h>

#include "formats/kv_fmt_merged.h"
#include "kv_page_int.h"

#define PLAN_STACK 8u

/* One list's part of a head's plan. */
typedef struct side {
    kv_page_list_t *l;
    uint32_t res;        /* residual tokens                           */
    kv_page_cut_t cut;   /* at m                                      */
    kv_page_ent_t *ents; /* replacement entry array, or NULL          */
    uint32_t cap_ents;
    int32_t *pos;        /* new position array (was NULL), or NULL    */
    uint32_t cap_pos;
} side_t;

/* What one head needs. */
typedef struct merge_plan {
    side_t s[2];       /* A (layer-1), B (layer)                      */
    uint32_t m;        /* tokens merged or retained; 0: nothing       */
    uint32_t pre;      /* leading tokens of a previous RETAINED page  */
                       /* repacked with them (0: none)                */
    uint32_t pm;       /* tokens of a previous MERGED page repacked   */
                       /* before those (0: none); its entry is the    */
                       /* cut's first, not a kernel source            */
    uint32_t n_ret;    /* retained, pre included                      */
    uint32_t n_mp;     /* MERGED pages                                */
    uint32_t n_rp;     /* FP16 retained pages per layer               */
    uint32_t ret0;     /* retain[] slot of this head's first new      */
                       /* token (pm + pre slots precede it)           */
    uint32_t id0;      /* ids: [n_mp][n_rp A][n_rp B][fresh A][fresh B] */
} merge_plan_t;

static int opts_ok(const kv_page_merge_opts_t *o)
{
    return o && o->t >= 0.0f && o->t <= 1.0f && o->gamma >= 0.0f &&
           o->gamma <= 1.0f &&
           (o->dir_format == KV_FMT_FP16 || o->dir_format == KV_FMT_INT4);
}

/* Plan the residual check and cut of one head; KV_ESTATE if the two
 * residuals differ. */
static int plan_head(const kv_page_table_t *pt, kv_page_list_t *a,
                     kv_page_list_t *b, uint32_t keep, merge_plan_t *p)
{
    memset(p, 0, sizeof *p);
    p->s[0].l = a;
    p->s[1].l = b;
    uint32_t r0[2];
    for (uint32_t j = 0; j < 2; j++)
        p->s[j].res = kv_page_residual(p->s[j].l, &r0[j]);
    uint32_t res = p->s[0].res;
    if (res != p->s[1].res)
        return KV_ESTATE;
    for (uint32_t i = 0; i < res; i++)
        if (kv_page_list_pos(a, a->n_tokens - res + i) !=
            kv_page_list_pos(b, b->n_tokens - res + i))
            return KV_ESTATE;
    p->m = res > keep ? res - keep : 0;
    if (p->m)
        for (uint32_t j = 0; j < 2; j++)
            kv_page_cut_plan(pt, p->s[j].l, r0[j], p->m, &p->s[j].cut);
    return KV_OK;
}

/* 1 if the merged-first order of the m tokens differs from the old one
 * (some retained token precedes a merged one). */
static int reorders(const uint8_t *ret, uint32_t m)
{
    for (uint32_t i = 1; i < m; i++)
        if (ret[i - 1] && !ret[i])
            return 1;
    return 0;
}

/* Allocate one side's arrays; 0 or KV_ENOMEM (nothing kept). */
static int side_arrays(kv_page_table_t *pt, side_t *s, uint32_t n_ins,
                       int reorder)
{
    const kv_page_list_t *l = s->l;
    uint32_t need = s->cut.r0 + n_ins + (l->n_ents - s->cut.e_s);
    if (need > l->cap_ents) {
        s->cap_ents = kv_page_grow_cap(l->cap_ents, need);
        s->ents = kv_page_meta_alloc(pt, (size_t)s->cap_ents * sizeof *s->ents);
        if (!s->ents)
            return KV_ENOMEM;
    }
    if (reorder && !l->pos) {
        s->cap_pos = l->n_tokens;
        s->pos = kv_page_meta_alloc(pt, (size_t)s->cap_pos * sizeof *s->pos);
        if (!s->pos) {
            kv_page_meta_free(pt, s->ents, (size_t)s->cap_ents * sizeof *s->ents);
            s->ents = NULL;
            return KV_ENOMEM;
        }
    }
    return KV_OK;
}

static void side_free(kv_page_table_t *pt, side_t *s)
{
    kv_page_meta_free(pt, s->ents, (size_t)s->cap_ents * sizeof *s->ents);
    kv_page_meta_free(pt, s->pos, (size_t)s->cap_pos * sizeof *s->pos);
    s->ents = NULL;
    s->pos = NULL;
}

/* Per-call scratch, carved from one block. */
typedef struct work {
    float *fl;            /* KV_CONVERT_SCRATCH_FLOATS(head_dim)          */
    kv_kern_page_t *src;  /* [max n_src A + n_src B]                      */
    void **ptrs;          /* [max n_mp + 2 n_rp]                          */
    int32_t *pos;         /* [max m]                                      */
} work_t;

/* Rewrite positions of tokens [s0, s0+m) of l merged-first, where s0 is
 * `pre` tokens before the residual and ret[0..m) their marks. */
static void side_positions(side_t *s, uint32_t pre, uint32_t m,
                           const uint8_t *ret, int32_t *tmp)
{
    kv_page_list_t *l = s->l;
    uint32_t s0 = l->n_tokens - s->res - pre, k = 0;
    for (uint32_t pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < m; i++)
            if ((ret[i] != 0) == (pass == 1))
                tmp[k++] = kv_page_list_pos(l, s0 + i);
    if (s->pos) { /* materialize the identity first */
        for (uint32_t i = 0; i < l->n_tokens; i++)
            s->pos[i] = (int32_t)i;
        l->pos = s->pos;
        l->cap_pos = s->cap_pos;
        l->pos_next = l->n_tokens;
        s->pos = NULL;
    }
    if (l->pos)
        memcpy(l->pos + s0, tmp, (size_t)m * sizeof *tmp);
}

/* Tokens of the partly filled RETAINED entry just before the residual,
 * if both lists have one with the same fill; else 0. */
static uint32_t pack_prev(const merge_plan_t *p, uint32_t T)
{
    uint32_t n = 0;
    for (uint32_t j = 0; j < 2; j++) {
        const kv_page_list_t *l = p->s[j].l;
        uint32_t r0 = p->s[j].cut.r0;
        if (r0 == 0)
            return 0;
        const kv_page_ent_t *e = &l->ents[r0 - 1];
        if (e->format != KV_FMT_FP16 || e->flags != KV_PAGE_ENT_RETAINED ||
            e->n_tokens >= T || (j && e->n_tokens != n))
            return 0;
        n = e->n_tokens;
    }
    return n;
}

/* Tokens of the partly filled MERGED entry `back` entries before the
 * residual, if it is the same page in both lists (A reads it as layer l-1,
 * B as layer l) with directions of dir_format; else 0. */
static uint32_t pack_prev_merged(const kv_page_table_t *pt, const merge_plan_t *p,
                                 uint32_t back, uint32_t dir_format, uint32_t mcap)
{
    const kv_page_ent_t *e[2];
    for (uint32_t j = 0; j < 2; j++) {
        uint32_t r0 = p->s[j].cut.r0;
        if (r0 <= back)
            return 0;
        e[j] = &p->s[j].l->ents[r0 - 1 - back];
    }
    if (e[0]->format != KV_FMT_MERGED || e[0]->flags != 0 ||
        e[1]->format != KV_FMT_MERGED || e[1]->flags != KV_PAGE_ENT_UPPER ||
        e[0]->id != e[1]->id || e[0]->n_tokens != e[1]->n_tokens ||
        e[0]->n_tokens >= mcap ||
        kv_fmt_merged_dir_format(kv_page_addr(pt, e[0]->id), &pt->cfg.geom) != dir_format)
        return 0;
    return e[0]->n_tokens;
}

/* Merge one head as planned (nothing fails). ret: the new tokens' marks,
 * preceded by p->pre marks of 1, preceded by p->pm marks of 0. */
static void write_head(kv_page_table_t *pt, merge_plan_t *p,
                       const kv_page_merge_opts_t *o, const uint8_t *ret,
                       const kv_page_id_t *ids, work_t *w)
{
    const kv_page_geom_t *g = &pt->cfg.geom;
    const uint32_t mcap = kv_fmt_merged_capacity(g, o->dir_format);
    const uint32_t T = pt->fp16_tpp, nm = p->pm + p->pre + p->m - p->n_ret;
    const uint32_t skip = p->pm > 0; /* the repacked MERGED entry: no source */
    const kv_page_id_t *mids = ids, *rids[2] = {ids + p->n_mp,
                                                ids + p->n_mp + p->n_rp};
    const kv_page_id_t *fids = ids + p->n_mp + 2 * p->n_rp;

    /* kernel */
    uint32_t ns0 = kv_page_cut_n_src(&p->s[0].cut) - skip;
    uint32_t ns1 = kv_page_cut_n_src(&p->s[1].cut) - skip;
    kv_page_kern_pages(pt, p->s[0].l, p->s[0].cut.r0 + skip, ns0, w->src);
    kv_page_kern_pages(pt, p->s[1].l, p->s[1].cut.r0 + skip, ns1, w->src + ns0);
    for (uint32_t i = 0; i < p->n_mp; i++)
        w->ptrs[i] = kv_page_addr(pt, mids[i]);
    if (skip) /* the old MERGED page's slots lead the first fresh one */
        memcpy(w->ptrs[0], kv_page_addr(pt, p->s[0].l->ents[p->s[0].cut.r0].id),
               g->page_bytes);
    for (uint32_t j = 0; j < 2; j++)
        for (uint32_t i = 0; i < p->n_rp; i++)
            w->ptrs[p->n_mp + j * p->n_rp + i] = kv_page_addr(pt, rids[j][i]);
    kv_merge_params_t mp = {
        .geom = *g,
        .src = {w->src, w->src + ns0}, .n_src = {ns0, ns1}, .src_off = {0, 0},
        .n_tokens = p->pre + p->m, .t = o->t, .gamma = o->gamma,
        .dir_format = o->dir_format, .retain = (uint8_t *)ret - p->pre,
        .dst = w->ptrs, .n_dst = p->n_mp, .dst_off = p->pm,
        .ret = {w->ptrs + p->n_mp, w->ptrs + p->n_mp + p->n_rp},
        .n_ret = {p->n_rp, p->n_rp}, .scratch = w->fl,
    };
    int rc = kv_backend_merge(pt->cfg.backend, &mp);
    assert(rc == 0 && "merge kernel failed on a planned call");
    (void)rc;
    for (uint32_t i = 0; i < p->n_mp; i++) { /* the second layer's ref */
        rc = kv_alloc_retain(pt->pool, mids[i]);
        assert(rc == 0);
    }
    pt->pages_by_format[KV_FMT_MERGED] += p->n_mp;
    pt->pages_by_format[KV_FMT_FP16] += 2u * p->n_rp;

    /* both lists */
    for (uint32_t j = 0; j < 2; j++) {
        side_t *s = &p->s[j];
        side_positions(s, p->pm + p->pre, p->pm + p->pre + p->m,
                       ret - p->pm - p->pre, w->pos);
        kv_page_cut_apply(pt, s->l, &s->cut, s->cut.fresh ? *fids++ : 0);
        kv_page_ent_t *ins =
            kv_page_ents_open(pt, s->l, s->cut.r0, s->cut.e_s,
                              p->n_mp + p->n_rp, s->ents, s->cap_ents);
        s->ents = NULL;
        uint32_t left = nm; /* merged pages: full but the last */
        for (uint32_t i = 0; i < p->n_mp; i++) {
            uint32_t cnt = left < mcap ? left : mcap;
            *ins++ = (kv_page_ent_t){
                .id = mids[i], .format = KV_FMT_MERGED,
                .flags = (uint8_t)(j ? KV_PAGE_ENT_UPPER : 0),
                .n_tokens = (uint16_t)cnt};
            left -= cnt;
        }
        left = p->n_ret; /* this layer's retained pages, likewise */
        for (uint32_t i = 0; i < p->n_rp; i++) {
            uint32_t cnt = left < T ? left : T;
            *ins++ = (kv_page_ent_t){.id = rids[j][i], .format = KV_FMT_FP16,
                                     .flags = KV_PAGE_ENT_RETAINED,
                                     .n_tokens = (uint16_t)cnt};
            left -= cnt;
        }
    }
}

int kv_page_merge_layers(kv_page_table_t *pt, uint32_t seq, uint32_t layer,
                         const kv_page_merge_opts_t *o)
{
    if (!opts_ok(o))
        return KV_EINVAL;
    int rc = kv_page_check_layer(pt, seq, layer);
    if (rc)
        return rc;
    if (layer == 0)
        return KV_ERANGE;
    if (kv_page_layer_busy(pt, seq, layer - 1) || kv_page_layer_busy(pt, seq, layer))
        return KV_ENOTRES;
    const kv_page_geom_t *g = &pt->cfg.geom;
    const uint32_t mcap = kv_fmt_merged_capacity(g, o->dir_format);
    if (mcap == 0)
        return KV_ENOTSUP;
    const uint32_t H = pt->cfg.n_kv_heads, T = pt->fp16_tpp;

    merge_plan_t plan_buf[PLAN_STACK];
    kv_page_scratch_t plan_s, ret_s = {0}, work_s = {0}, ids_s = {0};
    merge_plan_t *plans = kv_page_scratch_get(&plan_s, plan_buf,
                                              sizeof plan_buf,
                                              (size_t)H * sizeof *plans);
    if (!plans)
        return KV_ENOMEM;
    rc = KV_OK;
    uint64_t sum_m = 0, sum_r = 0;
    uint32_t max_m = 0, max_src = 0;
    for (uint32_t h = 0; h < H && !rc; h++) {
        merge_plan_t *p = &plans[h];
        rc = plan_head(pt, kv_page_list_at(pt, seq, layer - 1, h),
                       kv_page_list_at(pt, seq, layer, h), o->keep_fp16, p);
        p->ret0 = (uint32_t)sum_r + mcap + T; /* [mcap + T slots][m] per head */
        sum_m += p->m;
        sum_r += (uint64_t)mcap + T + p->m;
        max_m = p->m > max_m ? p->m : max_m;
        uint32_t ns = p->m ? kv_page_cut_n_src(&p->s[0].cut) +
                                 kv_page_cut_n_src(&p->s[1].cut)
                           : 0;
        max_src = ns > max_src ? ns : max_src;
    }
    if (rc || sum_m == 0) {
        kv_page_scratch_put(&plan_s);
        return rc;
    }

    /* Scratch: retain marks, then one work block; sized for the worst
     * head (pointers: every token its own page, bounded by max_m), with
     * room for repacked previous pages (a RETAINED source of < T tokens,
     * a MERGED page of < mcap). */
    max_src += 2;
    uint32_t max_t = max_m + T + mcap;
    size_t fl_n = (size_t)KV_CONVERT_SCRATCH_FLOATS(g->head_dim) * sizeof(float);
    size_t src_n = (size_t)max_src * sizeof(kv_kern_page_t);
    size_t ptr_n = ((size_t)max_t / mcap + 2u * ((size_t)max_t / T) + 3u) *
                   sizeof(void *);
    size_t pos_n = (size_t)max_t * sizeof(int32_t); /* pre + m tokens */
    uint8_t *ret = kv_page_scratch_get(&ret_s, NULL, 0, (size_t)sum_r);
    char *wb = ret ? kv_page_scratch_get(&work_s, NULL, 0,
                                         fl_n + src_n + ptr_n + pos_n)
                   : NULL;
    if (!wb) {
        kv_page_scratch_put(&ret_s);
        kv_page_scratch_put(&plan_s);
        return KV_ENOMEM;
    }
    work_t w = {.fl = (float *)(void *)wb,
                .src = (kv_kern_page_t *)(void *)(wb + fl_n),
                .ptrs = (void **)(void *)(wb + fl_n + src_n),
                .pos = (int32_t *)(void *)(wb + fl_n + src_n + ptr_n)};

    /* 1. select */
    for (uint32_t h = 0; h < H && !rc; h++) {
        merge_plan_t *p = &plans[h];
        if (!p->m)
            continue;
        uint32_t ns0 = kv_page_cut_n_src(&p->s[0].cut);
        uint32_t ns1 = kv_page_cut_n_src(&p->s[1].cut);
        kv_page_kern_pages(pt, p->s[0].l, p->s[0].cut.r0, ns0, w.src);
        kv_page_kern_pages(pt, p->s[1].l, p->s[1].cut.r0, ns1, w.src + ns0);
        kv_merge_params_t sp = {
            .geom = *g,
            .src = {w.src, w.src + ns0}, .n_src = {ns0, ns1},
            .n_tokens = p->m, .t = o->t, .gamma = o->gamma,
            .dir_format = o->dir_format, .retain = ret + p->ret0,
            .scratch = w.fl,
        };
        if ((rc = kv_backend_merge_select(pt->cfg.backend, &sp)))
            break;
        for (uint32_t i = 0; i < p->m; i++)
            p->n_ret += ret[p->ret0 + i] != 0;
        /* packing (file comment) */
        uint32_t pre = pack_prev(p, T);
        if (p->m > p->n_ret)
            p->pm = pack_prev_merged(pt, p, pre > 0, o->dir_format, mcap);
        if (p->n_ret > 0 || p->pm)
            p->pre = pre;
        if (p->pre) {
            memset(ret + p->ret0 - p->pre, 1, p->pre);
            p->n_ret += p->pre;
            p->s[0].cut.r0--;
            p->s[1].cut.r0--;
        }
        if (p->pm) {
            memset(ret + p->ret0 - p->pre - p->pm, 0, p->pm);
            p->s[0].cut.r0--;
            p->s[1].cut.r0--;
        }
        p->n_mp = (p->pm + p->pre + p->m - p->n_ret + mcap - 1) / mcap;
        p->n_rp = (p->n_ret + T - 1) / T;
    }

    /* 2. arrays and pages */
    uint32_t h_ok = 0, total = 0;
    for (; h_ok < H && !rc; h_ok++) {
        merge_plan_t *p = &plans[h_ok];
        if (!p->m)
            continue;
        int ro = reorders(ret + p->ret0 - p->pre - p->pm, p->pm + p->pre + p->m);
        if ((rc = side_arrays(pt, &p->s[0], p->n_mp + p->n_rp, ro)))
            break;
        if ((rc = side_arrays(pt, &p->s[1], p->n_mp + p->n_rp, ro))) {
            side_free(pt, &p->s[0]);
            break;
        }
        p->id0 = total;
        total += p->n_mp + 2 * p->n_rp + p->s[0].cut.fresh + p->s[1].cut.fresh;
    }
    kv_page_id_t *ids = NULL;
    if (!rc) {
        ids = kv_page_scratch_get(&ids_s, NULL, 0, (size_t)total * sizeof *ids);
        rc = !ids ? KV_ENOMEM : kv_alloc_pages(pt->pool, total, ids);
    }
    if (rc) {
        for (uint32_t h = 0; h < h_ok; h++) {
            side_free(pt, &plans[h].s[0]);
            side_free(pt, &plans[h].s[1]);
        }
        kv_page_scratch_put(&ids_s);
        kv_page_scratch_put(&work_s);
        kv_page_scratch_put(&ret_s);
        kv_page_scratch_put(&plan_s);
        return rc;
    }

    /* 3. write: nothing fails from here on */
    for (uint32_t h = 0; h < H; h++)
        if (plans[h].m)
            write_head(pt, &plans[h], o, ret + plans[h].ret0,
                       ids + plans[h].id0, &w);
    kv_page_scratch_put(&ids_s);
    kv_page_scratch_put(&work_s);
    kv_page_scratch_put(&ret_s);
    kv_page_scratch_put(&plan_s);
    return KV_OK;
}
