/* SPDX-License-Identifier: MIT */
/*
 * kv_store_format.c — the public API of compressed formats (kvpage.h,
 * "compressed formats"): per-layer target format, quantize on demand,
 * MiniCache layer merging, and what formats cost (kv_format_note for
 * people, kv_format_info in numbers: the traits' cost, from the layouts).
 *
 * Like kv_store.c, this file validates every argument before the page table
 * is called, so a bad call changes nothing; the page table's operations are
 * all-or-nothing on allocation failure. The store's own config supplies the
 * defaults (kv_format, residual: kv_store.c resolves them at create).
 *
 * Mutating calls, like kv_append: the sequence is made resident first
 * (kv_store_press_ready: its I/O in flight finished, then KV_ENOTRES or with
 * KV_OFFLOAD_WAIT a page-in; set_format asks only when the page table
 * refused a busy layer, so that its own validation comes first); quantize
 * and merge, which take pages, run under the memory-pressure ladder's retry
 * protocol (kv_store_int.h): each is all-or-nothing, so retrying after a
 * refused page is safe. Called from the policy run (kv_policy_run.c) they
 * are nested in its call: residency is already there, and a refusal is left
 * to the outer call.
 */
#include <string.h>

#include "kv_store_int.h"
#include "formats/kv_format.h"
#include "pages/kv_page.h"

/* seq live and layer in range: 0, KV_ENOENT or KV_ERANGE. */
static int seq_layer_check(const kv_store_t *s, kv_seq_id_t seq, uint32_t layer)
{
    if (!kv_page_seq_live(s->pt, seq))
        return KV_ENOENT;
    return layer < s->cfg.n_layers ? 0 : KV_ERANGE;
}

int kv_seq_set_format(kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                      kv_format_t fmt)
{
    if (!s)
        return KV_EINVAL;
    int rc = kv_page_set_format(s->pt, seq, layer, (uint32_t)fmt);
    if (rc == KV_ENOTRES && !(rc = kv_store_press_ready(s, seq)))
        rc = kv_page_set_format(s->pt, seq, layer, (uint32_t)fmt); /* resident */
    return rc;
}

int kv_seq_quantize(kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                    uint32_t keep_fp16)
{
    if (!s)
        return KV_EINVAL;
    int rc = seq_layer_check(s, seq, layer);
    if (rc || (rc = kv_store_press_ready(s, seq)))
        return rc;
    kv_store_press_call_t pc; /* a conversion writes at most the layer again */
    kv_store_press_begin(s, &pc, seq,
                         s->press ? kv_store_press_layer_need(s, seq, layer) : 0);
    do
        rc = kv_page_quantize(s->pt, seq, layer, keep_fp16);
    while (kv_store_press_retry(s, &pc, rc));
    return rc;
}

kv_merge_opts_t kv_merge_opts_default(void)
{
    kv_merge_opts_t o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.t = 0.6f;
    o.gamma = 0.05f;
    o.dir_format = KV_FMT_FP16;
    o.keep_fp16 = 0;
    return o;
}

int kv_seq_merge_layers(kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                        const kv_merge_opts_t *opts)
{
    if (!s)
        return KV_EINVAL;
    kv_merge_opts_t o = opts ? *opts : kv_merge_opts_default();
    if (o.struct_size != sizeof o)
        return KV_EVERSION;
    if (!(o.t >= 0.0f && o.t <= 1.0f) || !(o.gamma >= 0.0f && o.gamma <= 1.0f) ||
        (o.dir_format != KV_FMT_FP16 && o.dir_format != KV_FMT_INT4))
        return KV_EINVAL;
    int rc = seq_layer_check(s, seq, layer);
    if (rc || layer == 0)
        return rc ? rc : KV_ERANGE;
    if ((rc = kv_store_press_ready(s, seq)))
        return rc;
    kv_page_merge_opts_t po = {.t = o.t, .gamma = o.gamma,
                               .dir_format = o.dir_format,
                               .keep_fp16 = o.keep_fp16};
    /* MERGED pages plus each layer's retained originals, about both layers
     * rewritten once (a token is merged or retained; a MERGED token takes
     * 4 * head_dim + 16 bytes for two layers, an FP16 one 4 * head_dim) */
    kv_store_press_call_t pc;
    kv_store_press_begin(s, &pc, seq,
                         s->press ? kv_store_press_layer_need(s, seq, layer - 1) +
                                        kv_store_press_layer_need(s, seq, layer)
                                  : 0);
    do
        rc = kv_page_merge_layers(s->pt, seq, layer, &po);
    while (kv_store_press_retry(s, &pc, rc));
    return rc;
}

const char *kv_format_note(kv_format_t fmt)
{
    const kv_format_traits_t *tr = kv_format_get((uint32_t)fmt);
    return tr ? tr->bits_note : NULL;
}

int kv_format_info(kv_format_t fmt, kv_format_t dir_format, uint32_t head_dim,
                   uint32_t page_bytes, kv_format_info_t *out)
{
    const kv_format_traits_t *tr = kv_format_get((uint32_t)fmt);
    if (!tr || !out)
        return KV_EINVAL;
    if (kv_store_geom_resolve(head_dim, &page_bytes))
        return KV_ERANGE;
    kv_page_geom_t g = {.head_dim = head_dim, .page_bytes = page_bytes};
    kv_format_cost_t c;
    if (tr->cost(&g, (uint32_t)dir_format, &c))
        return KV_EINVAL;
    *out = (kv_format_info_t){.name = tr->name, .note = tr->bits_note,
                              .bits_per_element = c.bits, .group_size = c.group,
                              .tokens_per_page = c.tokens_per_page};
    return 0;
}
