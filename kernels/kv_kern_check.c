/* SPDX-License-Identifier: MIT */
/*
 * kv_kern_check.c — validation of the backend ops' parameters, the same for
 * every backend (kv_kern.h): the CPU backend runs it first thing, the CUDA
 * planner too (then adds what its kernels need), so one bad input gets one
 * error whichever backend the store runs.
 *
 * Attention: everything a kernel relies on is checked before any output or
 * scratch is touched: pointers, head counts (n_q_heads a multiple of
 * n_kv_heads), head_dim (a multiple of KV_KERN_DIM_STEP, at most
 * KV_KERN_MAX_DIM), the scale, every page of every list (data, 1 <=
 * n_tokens <= the format's tokens per page, a format with traits:
 * KV_ENOTSUP otherwise, variant 0, or 0/1 for a format read per variant
 * (MERGED) or stored rotated (INT4/INT2 at a power-of-two head_dim)), page counts summing to seq_len, and stats strides covering the
 * lists they describe. The page array length itself cannot be checked:
 * indptr is trusted to index inside it once it is monotonic.
 * Conversions: kv_kern_check_run, the source-run rules. No state.
 */
#include <math.h>

#include "kernels/kv_kern.h"

static int check_common(const kv_page_geom_t *g, uint32_t n_q, uint32_t n_kv,
                        float scale)
{
    if (n_kv == 0 || n_q == 0 || n_q % n_kv != 0)
        return KV_EINVAL;
    if (g->head_dim == 0 || g->head_dim % KV_KERN_DIM_STEP != 0 ||
        g->head_dim > KV_KERN_MAX_DIM)
        return KV_EINVAL;
    if (!(scale > 0.0f) || isinf(scale))
        return KV_EINVAL;
    return 0;
}

/* pages[0..n) each readable by the kernels (data, a known format, 1 ..
 * tokens_per_page tokens, a variant the format reads); *sum += tokens. */
static int check_pages(const kv_page_geom_t *g, const kv_kern_page_t *pages,
                       uint32_t n, uint64_t *sum)
{
    for (uint32_t i = 0; i < n; i++) {
        const kv_format_traits_t *f = kv_format_get(pages[i].format);
        if (!f)
            return KV_ENOTSUP;
        if (!pages[i].data || pages[i].n_tokens == 0 ||
            pages[i].n_tokens > f->tokens_per_page(g) ||
            pages[i].variant >= (f->variants ? f->variants(g)
                                             : f->load_variant ? 2u : 1u))
            return KV_EINVAL;
        *sum += pages[i].n_tokens;
    }
    return 0;
}

/* Lists [0, n): pages consistent with seq_len, each list >= min_len. */
static int check_lists(const kv_page_geom_t *g, const uint32_t *indptr,
                       const kv_kern_page_t *pages, const uint32_t *seq_len,
                       uint32_t n, uint32_t min_len)
{
    for (uint32_t i = 0; i < n; i++) {
        if (indptr[i + 1] < indptr[i] || seq_len[i] < min_len ||
            seq_len[i] == 0)
            return KV_EINVAL;
        uint64_t sum = 0;
        int rc = check_pages(g, pages + indptr[i], indptr[i + 1] - indptr[i],
                             &sum);
        if (rc)
            return rc;
        if (sum != seq_len[i])
            return KV_EINVAL;
    }
    return 0;
}

int kv_kern_check_decode(const kv_attn_decode_params_t *p)
{
    if (!p || !p->indptr || !p->pages || !p->seq_len || !p->q || !p->out ||
        p->batch == 0)
        return KV_EINVAL;
    int rc = check_common(&p->geom, p->n_q_heads, p->n_kv_heads, p->scale);
    if (rc)
        return rc;
    uint64_t n = (uint64_t)p->batch * p->n_kv_heads;
    if (n >= UINT32_MAX)
        return KV_EINVAL;
    rc = check_lists(&p->geom, p->indptr, p->pages, p->seq_len, (uint32_t)n, 1);
    if (rc)
        return rc;
    for (uint32_t b = 0; p->stats && b < p->batch; b++) {
        if (!p->stats[b])
            continue;
        for (uint32_t h = 0; h < p->n_kv_heads; h++)
            if (p->seq_len[(size_t)b * p->n_kv_heads + h] > p->stats_stride)
                return KV_EINVAL;
    }
    return 0;
}

int kv_kern_check_prefill(const kv_attn_prefill_params_t *p)
{
    if (!p || !p->indptr || !p->pages || !p->seq_len || !p->q || !p->out ||
        p->n_new == 0)
        return KV_EINVAL;
    int rc = check_common(&p->geom, p->n_q_heads, p->n_kv_heads, p->scale);
    if (rc)
        return rc;
    rc = check_lists(&p->geom, p->indptr, p->pages, p->seq_len,
                     p->n_kv_heads, p->n_new);
    if (rc)
        return rc;
    if (p->stats) {
        if (p->stats_row0 >= p->n_new)
            return KV_EINVAL;
        for (uint32_t h = 0; h < p->n_kv_heads; h++)
            if (p->seq_len[h] > p->stats_stride)
                return KV_EINVAL;
    }
    return 0;
}

int kv_kern_check_run(const kv_page_geom_t *g, const kv_kern_page_t *pages,
                      uint32_t n, uint32_t off, uint32_t need)
{
    if (need == 0)
        return 0;
    if (!pages || n == 0)
        return KV_EINVAL;
    uint64_t sum = 0;
    int rc = check_pages(g, pages, n, &sum);
    if (rc)
        return rc;
    return sum >= (uint64_t)off + need ? 0 : KV_EINVAL;
}
