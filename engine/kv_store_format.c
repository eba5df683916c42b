/*
 * kv_store_format.c — the public API of compressed formats (kvpage.h,
 * "compressed formats"): per-layer target format, quantize on demand,
 * MiniCache layer merging, and the bits-per-element notes.
 *
 * Like kv_store.c, this file validates every argument before the page table
 * is called, so a bad call changes nothing; the page table's operations are
 * all-or-nothing on allocation failure. The store's own config supplies the
 * defaults (kv_format, residual: kv_store.c resolves them at create).
 */
#include <string.h>

#include "kv_store_int.h"
#include "pages/kv_format.h"
#include "pages/kv_page.h"

int kv_seq_set_format(kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                      kv_format_t fmt)
{
    if (!s)
        return KV_EINVAL;
    return kv_page_set_format(s->pt, seq, layer, (uint32_t)fmt);
}

int kv_seq_quantize(kv_store_t *s, kv_seq_id_t seq, uint32_t layer,
                    uint32_t keep_fp16)
{
    if (!s)
        return KV_EINVAL;
    return kv_page_quantize(s->pt, seq, layer, keep_fp16);
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
    if (!kv_page_seq_live(s->pt, seq))
        return KV_ENOENT;
    if (layer == 0 || layer >= s->cfg.n_layers)
        return KV_ERANGE;
    kv_page_merge_opts_t po = {.t = o.t, .gamma = o.gamma,
                               .dir_format = o.dir_format,
                               .keep_fp16 = o.keep_fp16};
    return kv_page_merge_layers(s->pt, seq, layer, &po);
}

const char *kv_format_note(kv_format_t fmt)
{
    const kv_format_traits_t *tr = kv_format_get((uint32_t)fmt);
    return tr ? tr->bits_note : NULL;
}
