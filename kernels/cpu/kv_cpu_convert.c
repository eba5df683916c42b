/* SPDX-License-Identifier: MIT */
/*
 * kv_cpu_convert.c — CPU reference conversion kernels (contract in
 * kernels/kv_backend.h, "conversions"):
 *   convert       tokens of any pages -> FP16 / INT4 / INT2 pages
 *   merge_select  MiniCache retention marks of a layer pair (one kv_head)
 *   merge         the pair's merged tokens -> MERGED pages, retained
 *                 tokens' originals -> FP16 pages of each layer
 *
 * Sources are decoded 16 tokens at a time through kv_format_load (so any
 * source format and variant works; INT groups are whole chunks) into FP32
 * scratch, moved to the destination's stored variant (kv_format_to_variant:
 * rotated INT pages), then written through the destination format's store or
 * kv_fmt_merged_put. The merge math (docs/design.md), per token and separately
 * for K and V, in double precision:
 *   u0 = x0/|x0|, u1 = x1/|x1|, theta = acos(clamp(u0.u1, -1, 1));
 *   w0 = sin((1-t) theta)/sin theta, w1 = sin(t theta)/sin theta, or
 *   w0 = 1-t, w1 = t when sin theta < 1e-6; e = (w0 u0 + w1 u1)/|..|.
 *   A zero vector has no direction: if one layer's vector is zero, e is the
 *   other's direction and theta = 0 (merging it loses nothing: the zero one
 *   restores exactly as 0 * e); both zero: e = 0, theta = 0. e is
 *   normalized (SLERP of unit vectors is unit already; the linear fallback
 *   is not), and when it vanishes (antiparallel pair at t = 0.5) e = u1.
 * Retention (merge_select): d = theta/pi; token i is retained if, for K or
 * for V, d_i > d_max - gamma (d_max - d_min), min/max over the call's
 * tokens. Union of the two sets, because a retained token keeps its K and
 * V together in one FP16 slot, and MiniCache itself keeps separate K and V
 * index sets: every token it would retain for K or for V is restored
 * exactly here. gamma = 0 retains nothing, gamma = 1 all but the tokens at
 * d_min; all-equal distances retain nothing.
 *
 * Single-threaded, on the caller; ctx is unused. Nothing is written before
 * validation passes; with scratch given and valid params the calls cannot
 * fail. merge_select allocates its angle array (KV_ENOMEM).
 */
#include "kv_cpu_convert.h"

#include <math.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kernels/kv_kern.h"
#include "formats/kv_fmt_merged.h"

#define CHUNK 16u            /* tokens decoded per step (one INT group) */
#define MAX_DIM 1024u
#define KV_PI 3.14159265358979323846

/* ---- page runs ------------------------------------------------------------ */

/* A read position in a run of source pages. */
typedef struct src_cur {
    const kv_kern_page_t *pages;
    uint32_t i, off; /* current page, token in it */
} src_cur_t;

/* A write position in destination pages of one format. */
typedef struct dst_cur {
    void *const *pages;
    uint32_t i, slot, cap; /* current page, next slot, slots per page */
} dst_cur_t;

static void src_init(src_cur_t *c, const kv_kern_page_t *pages, uint32_t off)
{
    c->pages = pages;
    c->i = 0;
    c->off = off;
    while (c->off && c->off >= pages[c->i].n_tokens)
        c->off -= pages[c->i++].n_tokens;
}

/* Decode the next cnt tokens to k, v ([cnt][d]). */
static void src_read(src_cur_t *c, const kv_page_geom_t *g, uint32_t cnt,
                     float *k, float *v)
{
    const size_t d = g->head_dim;
    for (uint32_t done = 0; done < cnt;) {
        const kv_kern_page_t *pg = &c->pages[c->i];
        uint32_t w = pg->n_tokens - c->off;
        if (w > cnt - done)
            w = cnt - done;
        kv_format_load(pg->format, pg->variant, pg->data, g, c->off, w,
                       k + done * d, v + done * d);
        done += w;
        c->off += w;
        if (c->off == pg->n_tokens) {
            c->i++;
            c->off = 0;
        }
    }
}

/* Store cnt rows (k, v: [cnt][d] FP32) through tr, page after page. */
static void dst_write(dst_cur_t *c, const kv_format_traits_t *tr,
                      const kv_page_geom_t *g, uint32_t cnt, const float *k,
                      const float *v)
{
    const size_t d = g->head_dim;
    for (uint32_t done = 0; done < cnt;) {
        if (c->slot == c->cap) {
            c->i++;
            c->slot = 0;
        }
        uint32_t w = c->cap - c->slot;
        if (w > cnt - done)
            w = cnt - done;
        tr->store(c->pages[c->i], g, c->slot, w, KV_DTYPE_F32, k + done * d,
                  v + done * d, d);
        c->slot += w;
        done += w;
    }
}

/* 0 if the geometry suits the kernels. */
static int check_geom(const kv_page_geom_t *g)
{
    if (g->head_dim < 16 || g->head_dim > MAX_DIM || g->head_dim % 16 != 0 ||
        kv_format_get(KV_FMT_FP16)->tokens_per_page(g) == 0)
        return KV_EINVAL;
    return 0;
}

/* 0 if pages[0..n) (non-NULL) offer >= need slots of cap from slot off. */
static int check_dst(void *const *pages, uint32_t n, uint32_t cap,
                     uint32_t off, uint32_t need)
{
    if (need == 0)
        return 0;
    if (!pages || n == 0 || cap == 0 || off >= cap ||
        (uint64_t)n * cap - off < need)
        return KV_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!pages[i])
            return KV_EINVAL;
    return 0;
}

/* Scratch: the caller's, or a kv_mem block (*heap = its bytes). */
static float *scratch_get(float *given, const kv_page_geom_t *g, size_t *heap)
{
    *heap = 0;
    if (given)
        return given;
    size_t n = (size_t)KV_CONVERT_SCRATCH_FLOATS(g->head_dim) * sizeof(float);
    float *s = kv_mem_alloc(n);
    if (s)
        *heap = n;
    return s;
}

/* ---- convert -------------------------------------------------------------- */

int kv_cpu_convert(void *ctx, const kv_convert_params_t *p)
{
    (void)ctx;
    if (!p)
        return KV_EINVAL;
    const kv_page_geom_t *g = &p->geom;
    int rc = check_geom(g);
    if (rc)
        return rc;
    const kv_format_traits_t *tr = kv_format_get(p->dst_format);
    if (!tr || !tr->store)
        return KV_ENOTSUP;
    if (p->dst_variant >= kv_format_variants(p->dst_format, g))
        return KV_EINVAL;
    const uint32_t cap = tr->tokens_per_page(g);
    const int grouped = p->dst_format != KV_FMT_FP16; /* INT: whole groups */
    if (grouped && (p->n_tokens % CHUNK || p->dst_off % CHUNK))
        return KV_EINVAL;
    if ((rc = kv_kern_check_run(g, p->src, p->n_src, p->src_off,
                                p->n_tokens)) ||
        (rc = check_dst(p->dst, p->n_dst, cap, p->dst_off, p->n_tokens)))
        return rc;
    if (p->n_tokens == 0)
        return 0;
    size_t heap;
    float *k = scratch_get(p->scratch, g, &heap);
    if (!k)
        return KV_ENOMEM;
    float *v = k + (size_t)CHUNK * g->head_dim;

    src_cur_t sc;
    dst_cur_t dc = {.pages = p->dst, .i = 0, .slot = p->dst_off, .cap = cap};
    src_init(&sc, p->src, p->src_off);
    for (uint32_t done = 0; done < p->n_tokens; done += CHUNK) {
        uint32_t cnt = p->n_tokens - done < CHUNK ? p->n_tokens - done : CHUNK;
        src_read(&sc, g, cnt, k, v);
        kv_format_to_variant(p->dst_format, p->dst_variant, g, cnt, k, v);
        dst_write(&dc, tr, g, cnt, k, v);
    }
    kv_mem_free(heap ? k : NULL, heap);
    return 0;
}

/* ---- merge ---------------------------------------------------------------- */

/* 0 if the parts of a merge call both passes read are valid. */
static int check_merge(const kv_merge_params_t *p)
{
    if (!p)
        return KV_EINVAL;
    int rc = check_geom(&p->geom);
    if (rc)
        return rc;
    if (p->n_tokens == 0 || !p->retain || !(p->t >= 0.0f && p->t <= 1.0f) ||
        !(p->gamma >= 0.0f && p->gamma <= 1.0f))
        return KV_EINVAL;
    if (kv_fmt_merged_capacity(&p->geom, p->dir_format) == 0)
        return KV_ENOTSUP;
    for (uint32_t j = 0; j < 2; j++)
        if ((rc = kv_kern_check_run(&p->geom, p->src[j], p->n_src[j],
                                    p->src_off[j], p->n_tokens)))
            return rc;
    return 0;
}

/* The two layers' source runs of a merge call, read CHUNK tokens at a time:
 * k[j], v[j] ([CHUNK][d] in the scratch, in the order k0, v0, k1, v1) hold
 * layer j's current chunk. */
typedef struct pair_cur {
    src_cur_t src[2];
    float *k[2], *v[2];
} pair_cur_t;

static void pair_init(pair_cur_t *c, const kv_merge_params_t *p, float *s)
{
    const size_t cd = (size_t)CHUNK * p->geom.head_dim;
    for (uint32_t j = 0; j < 2; j++) {
        c->k[j] = s + 2 * j * cd;
        c->v[j] = c->k[j] + cd;
        src_init(&c->src[j], p->src[j], p->src_off[j]);
    }
}

/* Decode the next chunk of both layers, at most `left` tokens; returns its
 * token count. */
static uint32_t pair_read(pair_cur_t *c, const kv_page_geom_t *g,
                          uint32_t left)
{
    const uint32_t cnt = left < CHUNK ? left : CHUNK;
    for (uint32_t j = 0; j < 2; j++)
        src_read(&c->src[j], g, cnt, c->k[j], c->v[j]);
    return cnt;
}

/* Angle between x0 and x1 ([d]); 0 if either is zero. */
static double pair_angle(const float *x0, const float *x1, uint32_t d,
                         double *n0, double *n1)
{
    double s00 = 0.0, s11 = 0.0, s01 = 0.0;
    for (uint32_t c = 0; c < d; c++) {
        s00 += (double)x0[c] * x0[c];
        s11 += (double)x1[c] * x1[c];
        s01 += (double)x0[c] * x1[c];
    }
    *n0 = sqrt(s00);
    *n1 = sqrt(s11);
    if (*n0 == 0.0 || *n1 == 0.0)
        return 0.0;
    double cs = s01 / (*n0 * *n1);
    cs = cs < -1.0 ? -1.0 : (cs > 1.0 ? 1.0 : cs);
    return acos(cs);
}

/* The merged direction of x0, x1 into e ([d], unit or zero); norms out. */
static void slerp_dir(const float *x0, const float *x1, uint32_t d, double t,
                      float *e, double *n0, double *n1)
{
    double th = pair_angle(x0, x1, d, n0, n1);
    double w0, w1; /* weights of x0 and x1 themselves (u = x / |x|) */
    if (*n0 == 0.0 && *n1 == 0.0) {
        memset(e, 0, (size_t)d * sizeof *e);
        return;
    }
    if (*n0 == 0.0 || *n1 == 0.0) {
        w0 = *n0 > 0.0 ? 1.0 / *n0 : 0.0;
        w1 = *n1 > 0.0 ? 1.0 / *n1 : 0.0;
    } else {
        double s = sin(th);
        if (s < 1e-6) {
            w0 = 1.0 - t;
            w1 = t;
        } else {
            w0 = sin((1.0 - t) * th) / s;
            w1 = sin(t * th) / s;
        }
        w0 /= *n0;
        w1 /= *n1;
    }
    double ss = 0.0;
    for (uint32_t c = 0; c < d; c++) {
        double x = w0 * x0[c] + w1 * x1[c];
        ss += x * x;
    }
    double ne = sqrt(ss);
    if (ne < 1e-6) { /* antiparallel at t = 0.5: take the deeper layer's */
        w0 = 0.0;
        w1 = 1.0 / *n1;
        ne = 1.0;
    }
    for (uint32_t c = 0; c < d; c++)
        e[c] = (float)((w0 * x0[c] + w1 * x1[c]) / ne);
}

int kv_cpu_merge_select(void *ctx, const kv_merge_params_t *p)
{
    (void)ctx;
    int rc = check_merge(p);
    if (rc)
        return rc;
    const kv_page_geom_t *g = &p->geom;
    const uint32_t d = g->head_dim, n = p->n_tokens;
    size_t heap, th_n = (size_t)2 * n * sizeof(double);
    double *th = kv_mem_alloc(th_n); /* [2][n]: K angles, V angles */
    float *s = th ? scratch_get(p->scratch, g, &heap) : NULL;
    if (!s) {
        kv_mem_free(th, th ? th_n : 0);
        return KV_ENOMEM;
    }
    pair_cur_t pc;
    pair_init(&pc, p, s);
    for (uint32_t done = 0, cnt; done < n; done += cnt) {
        cnt = pair_read(&pc, g, n - done);
        for (uint32_t i = 0; i < cnt; i++) {
            double a, b;
            size_t r = (size_t)i * d;
            th[done + i] = pair_angle(pc.k[0] + r, pc.k[1] + r, d, &a, &b);
            th[n + done + i] =
                pair_angle(pc.v[0] + r, pc.v[1] + r, d, &a, &b);
        }
    }
    double lim[2];
    for (uint32_t h = 0; h < 2; h++) {
        double lo = th[(size_t)h * n] / KV_PI, hi = lo;
        for (uint32_t i = 1; i < n; i++) {
            double x = th[(size_t)h * n + i] / KV_PI;
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        lim[h] = hi - (double)p->gamma * (hi - lo);
    }
    for (uint32_t i = 0; i < n; i++)
        p->retain[i] = th[i] / KV_PI > lim[0] || th[n + i] / KV_PI > lim[1];
    kv_mem_free(heap ? s : NULL, heap);
    kv_mem_free(th, th_n);
    return 0;
}

int kv_cpu_merge(void *ctx, const kv_merge_params_t *p)
{
    (void)ctx;
    int rc = check_merge(p);
    if (rc)
        return rc;
    const kv_page_geom_t *g = &p->geom;
    const uint32_t d = g->head_dim, n = p->n_tokens;
    const uint32_t mcap = kv_fmt_merged_capacity(g, p->dir_format);
    const kv_format_traits_t *fp16 = kv_format_get(KV_FMT_FP16);
    const uint32_t tcap = fp16->tokens_per_page(g);
    uint32_t n_ret = 0;
    for (uint32_t i = 0; i < n; i++)
        n_ret += p->retain[i] != 0;
    if ((rc = check_dst(p->dst, p->n_dst, mcap, p->dst_off, n - n_ret)) ||
        (rc = check_dst(p->ret[0], p->n_ret[0], tcap, 0, n_ret)) ||
        (rc = check_dst(p->ret[1], p->n_ret[1], tcap, 0, n_ret)))
        return rc;
    size_t heap;
    float *s = scratch_get(p->scratch, g, &heap);
    if (!s)
        return KV_ENOMEM;
    float *ek = s + 4 * (size_t)CHUNK * d, *ev = ek + d; /* after pc.k, v */
    pair_cur_t pc;
    dst_cur_t r0 = {.pages = p->ret[0], .cap = tcap};
    dst_cur_t r1 = {.pages = p->ret[1], .cap = tcap};
    uint32_t mi = p->dst_off; /* slots of dst written so far */
    pair_init(&pc, p, s);
    for (uint32_t done = 0, cnt; done < n; done += cnt) {
        cnt = pair_read(&pc, g, n - done);
        for (uint32_t i = 0; i < cnt; i++) {
            size_t r = (size_t)i * d;
            const float *k0 = pc.k[0] + r, *v0 = pc.v[0] + r;
            const float *k1 = pc.k[1] + r, *v1 = pc.v[1] + r;
            if (p->retain[done + i]) {
                dst_write(&r0, fp16, g, 1, k0, v0);
                dst_write(&r1, fp16, g, 1, k1, v1);
                continue;
            }
            double nk0, nk1, nv0, nv1;
            slerp_dir(k0, k1, d, p->t, ek, &nk0, &nk1);
            slerp_dir(v0, v1, d, p->t, ev, &nv0, &nv1);
            const float norms[4] = {(float)nk0, (float)nk1, (float)nv0,
                                    (float)nv1};
            void *page = p->dst[mi / mcap];
            if (mi % mcap == 0)
                kv_fmt_merged_init(page, g, p->dir_format);
            kv_fmt_merged_put(page, g, mi % mcap, ek, ev, norms);
            mi++;
        }
    }
    kv_mem_free(heap ? s : NULL, heap);
    return 0;
}
