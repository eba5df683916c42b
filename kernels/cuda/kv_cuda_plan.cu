/* SPDX-License-Identifier: MIT */
/*
 * kv_cuda_plan.cu — host side of a CUDA call (no GPU needed, no CUDA API):
 * validation and the device page table a call uploads.
 *
 * Validation runs the backend-neutral checks first (kernels/
 * kv_kern_check.c: the same input gets the same error on both backends),
 * then what the kernels need: an instantiated head_dim and a stageable page
 * size (KV_ENOTSUP otherwise). Every page the CPU reads, the kernels read:
 * rotated INT pages (variant 1) included, which a plan flags (rotated) so
 * that the call runs the kernels with the rotated accumulator.
 *
 * A plan (kv_cuda_plan_t) is one kv_mem block, carved with the backends'
 * two-pass arena (kernels/kv_kern.h): entries (one per input page, in input
 * order from indptr[0]), the pages to upload (staged mode: distinct host
 * pointers, deduplicated with an open-addressing table, so a page shared
 * by several lists — CoW forks, MERGED pairs — is copied once), work items
 * (each list cut into partitions of `partition` tokens; single pass when
 * every list is one), statistics items (64 tokens) and statistics offsets.
 * Device mode maps each page pointer to its arena index and rejects
 * pointers that are not pages of the arena (KV_EINVAL).
 */
#include <string.h>

#include "kv_cuda.h"
#include "formats/kv_fmt_codec.h"

extern "C" {
#include "alloc/kv_mem.h"
#include "kernels/kv_kern.h"
}

int kv_cuda_page_bytes_ok(uint32_t page_bytes, uint32_t d)
{
    if (page_bytes == 0 || page_bytes % 64u != 0 ||
        page_bytes > KV_CUDA_MAX_PAGE_BYTES || d == 0 ||
        kv_fmt_fp16_tpp(d, page_bytes) == 0)
        return KV_ENOTSUP;
    return 0;
}

static int check_kernels(const kv_page_geom_t *g)
{
    if (!kv_cuda_head_dim_ok(g->head_dim))
        return KV_ENOTSUP;
    return kv_cuda_page_bytes_ok(g->page_bytes, g->head_dim);
}

int kv_cuda_check_decode(const kv_attn_decode_params_t *p)
{
    int rc = kv_kern_check_decode(p);
    return rc ? rc : check_kernels(&p->geom);
}

int kv_cuda_check_prefill(const kv_attn_prefill_params_t *p)
{
    int rc = kv_kern_check_prefill(p);
    if (rc)
        return rc;
    /* rows of a list: one block index per row in the reduce kernel */
    if ((uint64_t)p->n_new * (p->n_q_heads / p->n_kv_heads) > 0x7fffffffu)
        return KV_EINVAL;
    return check_kernels(&p->geom);
}

int kv_cuda_check_convert(const kv_convert_params_t *p)
{
    if (!p)
        return KV_EINVAL;
    const kv_page_geom_t *g = &p->geom;
    if (g->head_dim < 16 || g->head_dim % 16 != 0 ||
        kv_format_get(KV_FMT_FP16)->tokens_per_page(g) == 0)
        return KV_EINVAL;
    if (p->dst_format != KV_FMT_FP16 && p->dst_format != KV_FMT_INT4 &&
        p->dst_format != KV_FMT_INT2)
        return KV_ENOTSUP;
    if (p->dst_variant >= kv_format_variants(p->dst_format, g))
        return KV_EINVAL; /* as the CPU convert: rotated INT needs 2^k dims */
    if (p->dst_format != KV_FMT_FP16 &&
        (p->n_tokens % 16u != 0 || p->dst_off % 16u != 0))
        return KV_EINVAL;
    if (p->n_tokens == 0)
        return 0;
    /* pages readable by the kernels (the CPU convert's rules); need 1:
     * every page holds a token, so the run's length (src_off + n_tokens)
     * is left to kv_cuda_convert_locs, after the kernel checks */
    int rc = kv_kern_check_run(g, p->src, p->n_src, 0, 1);
    if (rc)
        return rc;
    if (!p->dst || p->n_dst == 0)
        return KV_EINVAL;
    for (uint32_t i = 0; i < p->n_dst; i++)
        if (!p->dst[i])
            return KV_EINVAL;
    return check_kernels(g);
}

int kv_cuda_convert_locs(const kv_convert_params_t *p, uint32_t *src_loc,
                         uint32_t *dst_loc)
{
    const uint32_t cap =
        kv_format_get(p->dst_format)->tokens_per_page(&p->geom);
    uint32_t si = 0, off = p->src_off, di = 0, slot = p->dst_off;
    while (si < p->n_src && off >= p->src[si].n_tokens)
        off -= p->src[si++].n_tokens;
    if (cap == 0 || slot >= cap)
        return KV_EINVAL;
    for (uint32_t t = 0; t < p->n_tokens; t++) {
        if (si >= p->n_src)
            return KV_EINVAL; /* the run holds fewer tokens */
        if (slot == cap) {
            di++;
            slot = 0;
        }
        if (di >= p->n_dst)
            return KV_EINVAL; /* not enough destination slots */
        src_loc[2 * t] = si;
        src_loc[2 * t + 1] = off;
        dst_loc[2 * t] = di;
        dst_loc[2 * t + 1] = slot++;
        if (++off == p->src[si].n_tokens) {
            si++;
            off = 0;
        }
    }
    return 0;
}

uint32_t kv_cuda_default_partition(uint64_t total_tokens, uint32_t n_rg,
                                   uint32_t n_sm)
{
    const uint64_t target = 8ull * (n_sm ? n_sm : 132u);
    uint64_t part = (total_tokens * (n_rg ? n_rg : 1u) + target - 1) / target;
    part = (part + 63u) / 64u * 64u;
    if (part < KV_CUDA_MIN_PART)
        part = KV_CUDA_MIN_PART;
    return part > 0x7fffffffu ? 0x7fffffffu : (uint32_t)part;
}

/* ---- page mapping -----------------------------------------------------------
 */

static uint32_t hash_slot(const void *p, uint32_t mask)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 29;
    x *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32) & mask;
}

/* Arena index of device page pointer p, or -1 if p is not a page of the
 * arena (dev_pages of pb bytes at base). */
static int64_t arena_index(const void *base, uint32_t dev_pages, uint64_t pb,
                           const void *p)
{
    const uintptr_t b = (uintptr_t)base, at = (uintptr_t)p;
    if (at < b || (at - b) % pb != 0 || (at - b) / pb >= dev_pages)
        return -1;
    return (int64_t)((at - b) / pb);
}

/* Entry page indices of pages[0..n): the arena index (device mode) or the
 * position in upload[] (staged mode; table: mask + 1 zeroed slots). */
static int map_pages(const void *dev_base, uint32_t dev_pages, uint64_t pb,
                     const kv_kern_page_t *pages, uint32_t n,
                     kv_cuda_ent_t *ents, const void **upload,
                     uint32_t *n_upload, uint32_t *table, uint32_t mask)
{
    for (uint32_t e = 0; e < n; e++) {
        const kv_kern_page_t *pg = &pages[e];
        uint32_t idx;
        if (dev_base) {
            const int64_t x = arena_index(dev_base, dev_pages, pb, pg->data);
            if (x < 0)
                return KV_EINVAL;
            idx = (uint32_t)x;
        } else {
            uint32_t h = hash_slot(pg->data, mask);
            while (table[h] && upload[table[h] - 1] != pg->data)
                h = (h + 1) & mask;
            if (!table[h]) {
                upload[*n_upload] = pg->data;
                table[h] = ++*n_upload;
            }
            idx = table[h] - 1;
        }
        ents[e].page = idx;
        ents[e].meta = KV_CUDA_ENT_META(pg->n_tokens, pg->format, pg->variant);
    }
    return 0;
}

/* Cut tokens [0, len) of a list (entries e0 .. e1 of ents) into items of
 * `part` tokens, written to out[] (NULL: count only). Returns the count. */
static uint32_t split_list(const kv_cuda_ent_t *ents, uint32_t list,
                           uint32_t e0, uint32_t e1, uint32_t len,
                           uint32_t part, kv_cuda_work_t *out)
{
    uint32_t n = 0, e = e0, off = 0;
    for (uint32_t t0 = 0; t0 < len; t0 += part, n++) {
        const uint32_t cnt = len - t0 < part ? len - t0 : part;
        if (!out)
            continue;
        out[n] = kv_cuda_work_t{list, e, e1, off, t0, cnt};
        for (uint32_t adv = cnt; adv > 0;) { /* to token t0 + cnt */
            const uint32_t left = KV_CUDA_ENT_N(ents[e].meta) - off;
            if (adv < left) {
                off += adv;
                adv = 0;
            } else {
                adv -= left;
                e++;
                off = 0;
            }
        }
    }
    return n;
}

/* ---- plans
 * -------------------------------------------------------------------- */

typedef struct sizes {
    uint32_t n_ents, n_work, n_stile, table;
} sizes_t;

static void layout(const kv_cuda_plan_in_t *in, const sizes_t *z,
                   kv_cuda_plan_t *pl, kv_kern_arena_t *a)
{
    pl->ents =
        (kv_cuda_ent_t *)kv_kern_arena_take(a, z->n_ents * sizeof(kv_cuda_ent_t));
    pl->upload = (const void **)kv_kern_arena_take(
        a, in->dev_base ? 0 : z->n_ents * sizeof(void *));
    pl->work = (kv_cuda_work_t *)kv_kern_arena_take(
        a, z->n_work * sizeof(kv_cuda_work_t));
    pl->list_work = (uint32_t *)kv_kern_arena_take(a, ((size_t)in->n_lists + 1) *
                                                        sizeof(uint32_t));
    pl->stile = (kv_cuda_work_t *)kv_kern_arena_take(
        a, z->n_stile * sizeof(kv_cuda_work_t));
    pl->stats_off =
        (uint64_t *)kv_kern_arena_take(a, in->n_lists * sizeof(uint64_t));
}

int kv_cuda_plan_build(const kv_cuda_plan_in_t *in, kv_cuda_plan_t *out)
{
    if (!in || !out || in->n_lists == 0 || in->n_kv_heads == 0)
        return KV_EINVAL;
    memset(out, 0, sizeof *out);
    const uint32_t G = in->n_q_heads / in->n_kv_heads;
    const uint32_t e_base = in->indptr[0];
    out->n_rows = (in->mode == KV_CUDA_PREFILL ? in->n_new : 1u) * G;
    out->rows_blk = kv_cuda_rows_per_block(out->n_rows);
    out->n_rg = (out->n_rows + out->rows_blk - 1) / out->rows_blk;
    uint64_t total = 0, n_work = 0, n_stile = 0, n_stats = 0;
    uint32_t max_len = 0;
    for (uint32_t i = 0; i < in->n_lists; i++) {
        const uint32_t len = in->seq_len[i];
        total += len;
        max_len = len > max_len ? len : max_len;
        if (in->stats && in->stats[i]) {
            n_stile += (len + KV_CUDA_STATS_TILE - 1) / KV_CUDA_STATS_TILE;
            n_stats += len;
        }
    }
    out->partition =
        in->partition ? in->partition
                      : kv_cuda_default_partition(total, out->n_rg, in->n_sm);
    for (uint32_t i = 0; i < in->n_lists; i++)
        n_work +=
            (in->seq_len[i] + (uint64_t)out->partition - 1) / out->partition;
    if (n_work > 0x7fffffffu || n_stile > 0x7fffffffu)
        return KV_ENOMEM;
    out->single_pass = max_len <= out->partition;
    sizes_t z = {in->indptr[in->n_lists] - e_base, (uint32_t)n_work,
                 (uint32_t)n_stile, 0};
    if (!in->dev_base) { /* a power of two >= 2 * entries */
        z.table = 2;
        while (z.table < 2u * z.n_ents)
            z.table *= 2;
    }

    kv_kern_arena_t a = {};
    layout(in, &z, out, &a);
    kv_kern_arena_take(&a, (size_t)z.table * sizeof(uint32_t));
    int rc = kv_kern_arena_alloc(&a);
    if (rc)
        return rc;
    layout(in, &z, out, &a);
    uint32_t *table =
        (uint32_t *)kv_kern_arena_take(&a, (size_t)z.table * sizeof(uint32_t));
    if (table)
        memset(table, 0, (size_t)z.table * sizeof(uint32_t));
    out->block = a.block;
    out->block_bytes = a.block_bytes;
    out->n_ents = z.n_ents;
    out->n_work = z.n_work;
    out->n_stile = z.n_stile;
    out->n_stats = n_stats;

    rc = map_pages(in->dev_base, in->dev_pages, in->geom.page_bytes,
                   in->pages + e_base, z.n_ents, out->ents, out->upload,
                   &out->n_upload, table, z.table ? z.table - 1 : 0);
    if (rc) {
        kv_cuda_plan_free(out);
        return rc;
    }
    for (uint32_t e = 0; e < z.n_ents; e++) {
        const uint32_t m = out->ents[e].meta;
        out->rotated |= (uint32_t)kv_fmt_codec_rotated(KV_CUDA_ENT_FMT(m),
                                                       KV_CUDA_ENT_VAR(m));
    }
    uint32_t w = 0, s = 0;
    uint64_t so = 0;
    for (uint32_t i = 0; i < in->n_lists; i++) {
        const uint32_t e0 = in->indptr[i] - e_base,
                       e1 = in->indptr[i + 1] - e_base;
        const uint32_t len = in->seq_len[i];
        out->list_work[i] = w;
        w += split_list(out->ents, i, e0, e1, len, out->partition,
                        out->work + w);
        out->stats_off[i] = UINT64_MAX;
        if (in->stats && in->stats[i]) {
            s += split_list(out->ents, i, e0, e1, len, KV_CUDA_STATS_TILE,
                            out->stile + s);
            out->stats_off[i] = so;
            so += len;
        }
    }
    out->list_work[in->n_lists] = w;
    return 0;
}

int kv_cuda_plan_convert(const kv_convert_params_t *p, const void *dev_base,
                         uint32_t dev_pages, kv_cuda_plan_t *out)
{
    if (!p || !out || p->n_tokens == 0)
        return KV_EINVAL;
    memset(out, 0, sizeof *out);
    uint32_t table_n = 2;
    while (table_n < 2u * p->n_src)
        table_n *= 2;
    if (dev_base)
        table_n = 0;
    kv_kern_arena_t a = {};
    for (int pass = 0; pass < 2; pass++) {
        out->ents = (kv_cuda_ent_t *)kv_kern_arena_take(
            &a, (size_t)p->n_src * sizeof(kv_cuda_ent_t));
        out->upload = (const void **)kv_kern_arena_take(
            &a, dev_base ? 0 : (size_t)p->n_src * sizeof(void *));
        out->src_loc = (uint32_t *)kv_kern_arena_take(
            &a, (size_t)p->n_tokens * 2u * sizeof(uint32_t));
        out->dst_loc = (uint32_t *)kv_kern_arena_take(
            &a, (size_t)p->n_tokens * 2u * sizeof(uint32_t));
        uint32_t *table = (uint32_t *)kv_kern_arena_take(
            &a, (size_t)table_n * sizeof(uint32_t));
        if (pass == 0) {
            int rc = kv_kern_arena_alloc(&a);
            if (rc)
                return rc;
            continue;
        }
        out->block = a.block;
        out->block_bytes = a.block_bytes;
        out->n_ents = p->n_src;
        if (table)
            memset(table, 0, (size_t)table_n * sizeof(uint32_t));
        int rc = map_pages(dev_base, dev_pages, p->geom.page_bytes, p->src,
                           p->n_src, out->ents, out->upload, &out->n_upload,
                           table, table_n ? table_n - 1 : 0);
        if (!rc)
            rc = kv_cuda_convert_locs(p, out->src_loc, out->dst_loc);
        for (uint32_t t = 0; !rc && dev_base && t < p->n_tokens; t++) {
            const int64_t x =
                arena_index(dev_base, dev_pages, p->geom.page_bytes,
                            p->dst[out->dst_loc[2 * t]]);
            if (x < 0)
                rc = KV_EINVAL;
            else
                out->dst_loc[2 * t] = (uint32_t)x;
        }
        if (rc) {
            kv_cuda_plan_free(out);
            return rc;
        }
    }
    return 0;
}

void kv_cuda_plan_free(kv_cuda_plan_t *p)
{
    if (!p)
        return;
    kv_mem_free(p->block, p->block_bytes);
    memset(p, 0, sizeof *p);
}
