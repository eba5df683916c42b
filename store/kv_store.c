/* SPDX-License-Identifier: MIT */
/*
 * kv_store.c — the public API (include/kvpage/kvpage.h) on top of the modules.
 *
 * A store is a host page pool (alloc/), a page table over it (pages/) and a
 * compute backend (kernels/). This file validates every argument before any
 * module is called, so a bad call changes nothing; the modules themselves are
 * all-or-nothing on allocation failure. Attention calls resolve each
 * (sequence, kv_head) page list into the backend's CSR page runs in per-call
 * scratch (so concurrent attention calls share nothing mutable).
 *
 * Ownership: the store owns pool, page table and backend; destroy frees all.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/kv_alloc.h"
#include "alloc/kv_mem.h"
#include "formats/kv_fmt_layout.h"
#include "kernels/kv_backend.h"
#include "kvpage/kvpage.h"
#include "pages/kv_page.h"
#include "kv_policy_int.h"
#include "kv_store_int.h"

#define KV_MAX_KV_HEADS   1024u
#define KV_MAX_Q_HEADS    8192u
#define KV_MAX_HEAD_DIM   1024u
#define KV_MAX_PAGE_BYTES (1u << 20)
#define KV_MAX_SEQS       (1u << 20)
#define KV_MAX_THREADS    1024u
#define KV_DEFAULT_SEQS   1024u
#define KV_DEFAULT_PAGE_TOKENS 16u /* FP16 tokens of the default page */
#define KV_DEFAULT_RESIDUAL 128u
#define KV_MAX_RESIDUAL   65536u


static kv_config_t config_defaults(void)
{
    kv_config_t c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.version = KV_CONFIG_VERSION;
    c.backend = KV_BACKEND_CPU;
    return c;
}

int kv_config_init(kv_config_t *cfg, uint32_t size)
{
    if (!cfg)
        return KV_EINVAL;
    if (size < KV_CONFIG_SIZE_MIN || size > sizeof(kv_config_t))
        return KV_EVERSION;
    kv_config_t c = config_defaults();
    c.struct_size = size;
    memcpy(cfg, &c, size);
    return 0;
}

int kv_store_geom_resolve(uint32_t head_dim, uint32_t *page_bytes)
{
    if (head_dim < 16 || head_dim > KV_MAX_HEAD_DIM || head_dim % 16 != 0)
        return KV_ERANGE;
    uint32_t pb = *page_bytes ? *page_bytes
                              : (uint32_t)kv_fmt_fp16_bytes(head_dim, KV_DEFAULT_PAGE_TOKENS);
    if (pb % 64 != 0 || kv_fmt_fp16_tpp(head_dim, pb) == 0 || pb > KV_MAX_PAGE_BYTES)
        return KV_ERANGE;
    *page_bytes = pb;
    return 0;
}

int kv_store_config_resolve(const kv_config_t *cfg, kv_config_t *out)
{
    if (!cfg)
        return KV_EINVAL;
    if (cfg->struct_size < KV_CONFIG_SIZE_MIN || cfg->struct_size > sizeof(kv_config_t) ||
        cfg->version != KV_CONFIG_VERSION)
        return KV_EVERSION;
    kv_config_t c = config_defaults(); /* a shorter caller's struct: its fields */
    memcpy(&c, cfg, cfg->struct_size);
    c.struct_size = sizeof c;
    if (c.n_layers == 0 || c.n_layers > KV_MAX_LAYERS)
        return KV_ERANGE;
    if (c.n_kv_heads == 0 || c.n_kv_heads > KV_MAX_KV_HEADS)
        return KV_ERANGE;
    if (c.n_q_heads == 0 || c.n_q_heads > KV_MAX_Q_HEADS)
        return KV_ERANGE;
    if (c.n_q_heads % c.n_kv_heads != 0)
        return KV_EINVAL;
    if (kv_store_geom_resolve(c.head_dim, &c.page_bytes))
        return KV_ERANGE;
    if (c.host_pages == 0 || c.host_pages > KV_ALLOC_MAX_PAGES)
        return KV_ERANGE;
    if (c.max_seqs == 0)
        c.max_seqs = KV_DEFAULT_SEQS;
    if (c.max_seqs > KV_MAX_SEQS)
        return KV_ERANGE;
    if (c.n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c.n_threads = n > 0 ? (uint32_t)n : 1u;
    }
    if (c.n_threads > KV_MAX_THREADS)
        return KV_ERANGE;
    if (c.flags & ~(KV_CONFIG_NO_TCACHE | KV_CONFIG_INT8_ATTN))
        return KV_EINVAL;
    if (c.kv_format != KV_FMT_FP16 && c.kv_format != KV_FMT_INT4 &&
        c.kv_format != KV_FMT_INT2)
        return KV_EINVAL;
    if (c.residual == 0)
        c.residual = KV_DEFAULT_RESIDUAL;
    if (c.residual % 16 != 0 || c.residual > KV_MAX_RESIDUAL)
        return KV_ERANGE;
    int rc = kv_store_pressure_check(&c);
    if (rc || (rc = kv_store_off_resolve(&c)) || (rc = kv_store_prefix_resolve(&c)))
        return rc;
    if (c.backend == KV_BACKEND_CUDA)
        return KV_ENOTSUP;
    if (c.backend != KV_BACKEND_CPU)
        return KV_EINVAL;
    *out = c;
    return 0;
}

int kv_store_create(const kv_config_t *cfg, kv_store_t **out)
{
    if (!out)
        return KV_EINVAL;
    kv_config_t c;
    int rc = kv_store_config_resolve(cfg, &c);
    if (rc)
        return rc;
    kv_estimate_t est;
    kv_store_estimate(&c, &est);
    if (est.meta_max > est.meta_cap)
        return KV_ENOMEM; /* before any allocation (kv_store_estimate.c) */
    kv_store_t *s = kv_mem_calloc(1, sizeof *s);
    if (!s)
        return KV_ENOMEM;
    s->cfg = c;
    kv_alloc_config_t ac = {
        .page_bytes = c.page_bytes,
        .capacity = (uint32_t)c.host_pages,
        .tier = KV_TIER_HOST,
        .flags = (c.flags & KV_CONFIG_NO_TCACHE) ? KV_ALLOC_NO_TCACHE : 0,
    };
    kv_page_table_config_t pc = {
        .geom = {.head_dim = c.head_dim, .page_bytes = c.page_bytes},
        .n_layers = c.n_layers,
        .n_kv_heads = c.n_kv_heads,
        .max_seqs = c.max_seqs,
        .default_format = c.kv_format,
        .residual = c.residual,
        .backend = &s->backend, /* created below; used only after create */
    };
    if ((rc = kv_alloc_pool_create(&ac, &s->pool)) ||
        (rc = kv_page_table_create(&pc, s->pool, &s->pt)) ||
        (rc = kv_store_lru_init(s)) ||
        (rc = kv_store_prefix_init(s)) ||
        (rc = kv_store_pressure_init(s)) ||
        (rc = kv_backend_cpu_create(c.n_threads,
                                    (c.flags & KV_CONFIG_INT8_ATTN)
                                        ? KV_BACKEND_INT8 : 0,
                                    &s->backend)) ||
        (rc = kv_store_off_init(s))) {
        kv_store_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void kv_store_destroy(kv_store_t *s)
{
    if (!s)
        return;
    kv_store_off_fini(s); /* first: finishes I/O that owns pages */
    kv_store_prefix_fini(s); /* its page references, before the table */
    kv_pol_table_destroy(s);
    kv_backend_destroy(&s->backend);
    kv_page_table_destroy(s->pt);
    kv_alloc_pool_destroy(s->pool);
    kv_store_lru_fini(s);
    kv_store_pressure_fini(s);
    kv_mem_free(s, sizeof *s);
}

int kv_store_config_into(const kv_store_t *s, kv_config_t *out, uint32_t size)
{
    if (!s || !out)
        return KV_EINVAL;
    if (size < KV_CONFIG_SIZE_MIN || size > sizeof(kv_config_t))
        return KV_EVERSION;
    kv_config_t c = s->cfg;
    c.struct_size = size;
    memcpy(out, &c, size);
    return 0;
}

/* All of kv_stats_t into *out (struct_size included). */
uint64_t kv_store_pool_free(const kv_store_t *s)
{
    kv_alloc_stats_t as;
    kv_alloc_stats(s->pool, &as);
    return as.free;
}

uint32_t kv_store_fp16_tpp(const kv_store_t *s)
{
    return kv_fmt_fp16_tpp(s->cfg.head_dim, s->cfg.page_bytes);
}

static void store_stats_full(const kv_store_t *s, kv_stats_t *out)
{
    kv_alloc_stats_t as;
    kv_page_totals_t pt;
    kv_alloc_stats(s->pool, &as);
    kv_page_table_totals(s->pt, &pt);
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->page_bytes = s->cfg.page_bytes;
    out->fp16_tokens_per_page = kv_store_fp16_tpp(s);
    out->pages_capacity = as.capacity;
    out->pages_used = as.used;
    out->pages_free = as.free;
    out->pages_peak = as.peak;
    out->alloc_failures = as.failed;
    out->n_seqs = kv_page_seq_count(s->pt);
    out->tokens = pt.tokens;
    for (int f = 0; f < KV_FMT_COUNT; f++) {
        out->pages_by_format[f] = pt.pages_by_format[f];
        out->bytes_by_format[f] = pt.pages_by_format[f] * s->cfg.page_bytes;
        out->kv_bytes += out->bytes_by_format[f];
    }
    out->meta_bytes = pt.meta_bytes + sizeof *s + kv_pol_meta_bytes(s) +
                      kv_store_lru_meta_bytes(s) + kv_store_off_meta_bytes(s);
    out->fp16_bytes = kv_fmt_fp16_bytes(s->cfg.head_dim, pt.tokens);
    kv_store_pressure_stats(s, out);
    kv_store_off_stats(s, out);
    kv_store_prefix_stats(s, out);
}

/* The caller's struct may be older and smaller (kvpage.h): the bytes after
 * struct_size up to it are copied from the full statistics. */
int kv_store_stats(const kv_store_t *s, kv_stats_t *out)
{
    if (!s || !out)
        return KV_EINVAL;
    const uint32_t size = out->struct_size;
    if (size < 2 * sizeof(uint32_t) || size > sizeof(kv_stats_t))
        return KV_EVERSION;
    kv_stats_t full;
    store_stats_full(s, &full);
    const size_t skip = sizeof full.struct_size;
    memcpy((char *)out + skip, (const char *)&full + skip, size - skip);
    return 0;
}

int kv_store_check(const kv_store_t *s)
{
    if (!s)
        return KV_EINVAL;
    int rc = kv_store_prefix_check(s); /* the page table, nodes counted */
    return rc ? rc : kv_store_off_check(s);
}

/* ---- sequences ------------------------------------------------------------ */

int kv_seq_create(kv_store_t *s, kv_seq_id_t *out)
{
    if (!s || !out)
        return KV_EINVAL;
    int rc = kv_page_seq_create(s->pt, out);
    if (rc == 0)
        kv_store_touch(s, *out);
    return rc;
}

int kv_seq_free(kv_store_t *s, kv_seq_id_t seq)
{
    if (!s)
        return KV_EINVAL;
    int rc = kv_store_off_seq_drop(s, seq); /* its I/O, slots (offload) */
    if (rc == 0)
        rc = kv_page_seq_free(s->pt, seq);
    if (rc == 0) {
        kv_pol_seq_drop(s, seq);
        s->last_use[seq] = 0;
    }
    return rc;
}

int kv_seq_fork(kv_store_t *s, kv_seq_id_t parent, kv_seq_id_t *child)
{
    if (!s || !child)
        return KV_EINVAL;
    kv_seq_id_t c;
    int rc = kv_store_press_ready(s, parent); /* resident (offload, ladder) */
    if (rc || (rc = kv_page_seq_fork(s->pt, parent, &c)))
        return rc;
    if ((rc = kv_pol_seq_fork(s, parent, c))) {
        kv_page_seq_free(s->pt, c); /* all-or-nothing */
        return rc;
    }
    kv_store_touch(s, parent);
    kv_store_touch(s, c);
    *child = c;
    return 0;
}

/* The list of (seq, layer, head) after validating all three; *rc tells why
 * not when NULL is returned. */
static const kv_page_list_t *list_lookup(const kv_store_t *s, kv_seq_id_t seq,
                                         uint32_t layer, uint32_t head, int *rc)
{
    if (!kv_page_seq_live(s->pt, seq)) {
        *rc = KV_ENOENT;
        return NULL;
    }
    if (layer >= s->cfg.n_layers || head >= s->cfg.n_kv_heads) {
        *rc = KV_ERANGE;
        return NULL;
    }
    *rc = 0;
    return kv_page_list_get(s->pt, seq, layer, head);
}

int kv_seq_len(const kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
               uint32_t kv_head, uint32_t *len)
{
    if (!s || !len)
        return KV_EINVAL;
    int rc;
    const kv_page_list_t *l = list_lookup(s, seq, layer, kv_head, &rc);
    if (!l)
        return rc;
    *len = l->n_tokens;
    return 0;
}

int kv_append(kv_store_t *s, kv_seq_id_t seq, uint32_t layer, uint32_t n_tokens,
              kv_dtype_t dtype, const void *k, const void *v, const int32_t *pos)
{
    if (!s)
        return KV_EINVAL;
    if (!kv_page_seq_live(s->pt, seq))
        return KV_ENOENT;
    if (layer >= s->cfg.n_layers)
        return KV_ERANGE;
    if (n_tokens == 0)
        return 0;
    if (!k || !v || (dtype != KV_DTYPE_F32 && dtype != KV_DTYPE_F16))
        return KV_EINVAL;
    int rc = kv_store_press_ready(s, seq); /* its pages resident (offload) */
    if (rc)
        return rc;
    kv_store_touch(s, seq);
    kv_store_press_call_t pc; /* memory-pressure ladder (kv_store_pressure.c) */
    kv_store_press_begin(s, &pc, seq,
                         s->press ? kv_store_press_append_need(s, seq, layer, n_tokens) : 0);
    do
        rc = kv_page_append(s->pt, seq, layer, n_tokens, dtype, k, v, pos);
    while (kv_store_press_retry(s, &pc, rc));
    return rc;
}

int kv_read(const kv_store_t *s, kv_seq_id_t seq, uint32_t layer, uint32_t kv_head,
            uint32_t t0, uint32_t n, float *k, float *v, int32_t *pos)
{
    if (!s)
        return KV_EINVAL;
    int rc;
    const kv_page_list_t *l = list_lookup(s, seq, layer, kv_head, &rc);
    if (!l)
        return rc;
    if (t0 > l->n_tokens || n > l->n_tokens - t0)
        return KV_ERANGE;
    rc = kv_page_read(s->pt, seq, layer, kv_head, t0, n, k, v, pos);
    if (rc == KV_ENOTRES && !(rc = kv_store_off_access(s, &seq, 1, layer, kv_head)))
        rc = kv_page_read(s->pt, seq, layer, kv_head, t0, n, k, v, pos); /* paged in */
    return rc;
}

int kv_compact(kv_store_t *s, kv_seq_id_t seq, uint32_t layer, uint32_t kv_head,
               const uint32_t *keep, uint32_t n_keep)
{
    if (!s || (n_keep && !keep))
        return KV_EINVAL;
    int rc;
    if (!list_lookup(s, seq, layer, kv_head, &rc) || (rc = kv_store_press_ready(s, seq)))
        return rc;
    const uint32_t T = kv_store_fp16_tpp(s);
    kv_store_press_call_t pc; /* fresh pages: at most one per kept page */
    kv_store_press_begin(s, &pc, seq, ((uint64_t)n_keep + T - 1) / T);
    do
        rc = kv_page_compact(s->pt, seq, layer, kv_head, keep, n_keep);
    while (kv_store_press_retry(s, &pc, rc));
    return rc;
}

/* ---- attention ------------------------------------------------------------ */

/* Page runs of n_lists lists in the backend's CSR form, in one scratch block. */
typedef struct runs {
    uint32_t *indptr;      /* [n_lists + 1]   */
    uint32_t *seq_len;     /* [n_lists]       */
    kv_kern_page_t *pages; /* [indptr[n]]     */
    size_t bytes;          /* scratch size    */
    void *mem;
} runs_t;

/* Validate the list of every kv head of seqs[0..n_seqs) at layer and
 * resolve them into runs, sequence-major. A list must hold at least min_len
 * tokens (an empty one is KV_ESTATE, a shorter one KV_ERANGE) and, where
 * stats && stats[b], fit stats_stride (KV_ERANGE). Nothing is allocated
 * unless every list is valid. */
static int runs_for_seqs(const kv_store_t *s, uint32_t layer, const kv_seq_id_t *seqs,
                         uint32_t n_seqs, uint32_t min_len, float *const *stats,
                         uint32_t stats_stride, runs_t *r)
{
    const uint32_t H = s->cfg.n_kv_heads;
    if ((uint64_t)n_seqs * H > UINT32_MAX / 2)
        return KV_ERANGE;
    const uint32_t n = n_seqs * H;
    size_t n_pages = 0;
    for (uint32_t i = 0; i < n; i++) {
        int rc;
        const kv_page_list_t *l = list_lookup(s, seqs[i / H], layer, i % H, &rc);
        if (!l)
            return rc;
        if (l->n_tokens == 0)
            return KV_ESTATE;
        if (l->n_tokens < min_len ||
            (stats && stats[i / H] && stats_stride < l->n_tokens))
            return KV_ERANGE;
        n_pages += l->n_ents;
    }
    int orc = kv_store_off_access(s, seqs, n_seqs, layer, UINT32_MAX); /* offload */
    if (orc)
        return orc;
    size_t head = ((size_t)2 * n + 1) * sizeof(uint32_t);
    head = (head + 15) & ~(size_t)15;
    r->bytes = head + n_pages * sizeof(kv_kern_page_t);
    r->mem = kv_mem_alloc(r->bytes);
    if (!r->mem)
        return KV_ENOMEM;
    r->indptr = r->mem;
    r->seq_len = r->indptr + n + 1;
    r->pages = (kv_kern_page_t *)((char *)r->mem + head);
    uint32_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seqs[i / H], layer, i % H);
        r->indptr[i] = at;
        r->seq_len[i] = l->n_tokens;
        for (uint32_t e = 0; e < l->n_ents; e++, at++) {
            r->pages[at].data = kv_page_addr(s->pt, l->ents[e].id);
            r->pages[at].n_tokens = l->ents[e].n_tokens;
            r->pages[at].format = l->ents[e].format;
            r->pages[at].variant = kv_page_ent_variant(&l->ents[e]);
        }
    }
    r->indptr[n] = at;
    return 0;
}

static void runs_free(runs_t *r)
{
    kv_mem_free(r->mem, r->bytes);
}

static int scale_resolve(const kv_store_t *s, float scale, float *out)
{
    if (scale == 0.0f)
        scale = 1.0f / sqrtf((float)s->cfg.head_dim);
    if (!(scale > 0.0f) || isinf(scale))
        return KV_EINVAL;
    *out = scale;
    return 0;
}

int kv_store_decode_raw(kv_store_t *s, const kv_decode_t *a)
{
    if (!s || !a || !a->seqs || !a->q || !a->out || a->batch == 0)
        return KV_EINVAL;
    if (a->layer >= s->cfg.n_layers)
        return KV_ERANGE;
    float scale;
    int rc = scale_resolve(s, a->scale, &scale);
    if (rc)
        return rc;
    runs_t r = {0};
    rc = runs_for_seqs(s, a->layer, a->seqs, a->batch, 1, a->stats, a->stats_stride, &r);
    if (rc)
        return rc;
    kv_attn_decode_params_t p = {
        .geom = *kv_page_table_geom(s->pt),
        .batch = a->batch,
        .n_q_heads = s->cfg.n_q_heads,
        .n_kv_heads = s->cfg.n_kv_heads,
        .indptr = r.indptr,
        .pages = r.pages,
        .seq_len = r.seq_len,
        .q = a->q,
        .out = a->out,
        .stats = a->stats,
        .stats_stride = a->stats_stride,
        .scale = scale,
    };
    rc = s->backend.ops->attn_decode(s->backend.ctx, &p);
    runs_free(&r);
    return rc;
}

int kv_store_prefill_raw(kv_store_t *s, const kv_prefill_t *a)
{
    if (!s || !a || !a->q || !a->out || a->n_new == 0)
        return KV_EINVAL;
    if (a->layer >= s->cfg.n_layers)
        return KV_ERANGE;
    float scale;
    int rc = scale_resolve(s, a->scale, &scale);
    if (rc)
        return rc;
    if (a->stats && a->stats_row0 >= a->n_new)
        return KV_ERANGE;
    runs_t r = {0};
    float *const stats_one[1] = {a->stats};
    rc = runs_for_seqs(s, a->layer, &a->seq, 1, a->n_new, stats_one, a->stats_stride, &r);
    if (rc)
        return rc;
    kv_attn_prefill_params_t p = {
        .geom = *kv_page_table_geom(s->pt),
        .n_q_heads = s->cfg.n_q_heads,
        .n_kv_heads = s->cfg.n_kv_heads,
        .indptr = r.indptr,
        .pages = r.pages,
        .seq_len = r.seq_len,
        .n_new = a->n_new,
        .q = a->q,
        .out = a->out,
        .stats = a->stats,
        .stats_stride = a->stats_stride,
        .stats_row0 = a->stats_row0,
        .scale = scale,
    };
    rc = s->backend.ops->attn_prefill(s->backend.ctx, &p);
    runs_free(&r);
    return rc;
}

/* Sequences with a policy that wants statistics go through the policy
 * module (kv_policy_state.c); everything else straight to the backend. */
int kv_attn_decode(kv_store_t *s, const kv_decode_t *a)
{
    if (!s || !a)
        return KV_EINVAL;
    for (uint32_t b = 0; a->seqs && b < a->batch; b++)
        kv_store_touch(s, a->seqs[b]);
    for (uint32_t b = 0; s->pol && a->seqs && b < a->batch; b++) {
        kv_pol_seq_t *ps = kv_pol_get(s, a->seqs[b]);
        if (ps && kv_pol_wants(ps))
            return kv_pol_attn_decode(s, a);
    }
    return kv_store_decode_raw(s, a);
}

int kv_attn_prefill(kv_store_t *s, const kv_prefill_t *a)
{
    if (!s || !a)
        return KV_EINVAL;
    kv_store_touch(s, a->seq);
    kv_pol_seq_t *ps = kv_pol_get(s, a->seq);
    if (ps && kv_pol_wants(ps))
        return kv_pol_attn_prefill(s, a, ps);
    return kv_store_prefill_raw(s, a);
}
