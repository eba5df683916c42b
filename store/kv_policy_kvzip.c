/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_kvzip.c — KVzip (Kim et al. 2025): query-agnostic selection by
 * context reconstruction, split between the engine and the store.
 *
 * The engine runs the model; the store scores. After the prompt (T tokens)
 * is in, the engine forks the sequence, marks the fork as a scoring pass of
 * it for context tokens [t0, t1) (kv_seq_score_begin) and runs a
 * reconstruction prompt through the fork ("Repeat the previous context
 * exactly." + the chat template's turn change + tokens t0..t1-1): ordinary
 * kv_append / kv_attn_prefill calls. On each of the fork's prefill calls
 * the store computes, for every query row past T and every q head of a kv
 * head's group, the softmax of the row over the sinks (the first
 * min(sink, t0) tokens), the chunk [t0, t1) and the pass's own tokens up to
 * the row, and keeps the largest probability each chunk token received
 * (kv_pol_kvzip_observe), max-accumulated into the owner's score vectors
 * (kv_pol_seq_t.win). The engine frees the fork; more chunks, more passes.
 * At kv_seq_prefill_end the owner keeps the first `sink` tokens and its
 * top-c tokens by score, per list, or per layer with AdaKV's ada=1 (the
 * selection of kv_policy_select.c).
 *
 * Invariants: scores only grow (a max), so a call that fails and is
 * retried, or a chunk scored twice, gives the same scores. The pass reads
 * keys from its own lists, which share the owner's pages (a fork made
 * after the owner's last append); the owner must not change during the
 * pass (checked on every call: KV_ESTATE).
 * Cost: per chunk of c tokens and r reconstruction rows, r * (c + r) dot
 * products per q head and layer, on the store's backend
 * (kv_backend_zip_score: the CPU backend's worker threads).
 */
#include <math.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"

/* Every list of seq is n tokens long. */
static int lists_len(const kv_store_t *s, kv_seq_id_t seq, uint32_t n)
{
    for (uint32_t l = 0; l < s->cfg.n_layers; l++)
        for (uint32_t h = 0; h < s->cfg.n_kv_heads; h++)
            if (kv_page_list_get(s->pt, seq, l, h)->n_tokens != n)
                return 0;
    return 1;
}

int kv_seq_score_begin(kv_store_t *s, kv_seq_id_t pass, kv_seq_id_t owner, uint32_t t0,
                       uint32_t t1)
{
    if (!s)
        return KV_EINVAL;
    if (!kv_page_seq_live(s->pt, pass) || !kv_page_seq_live(s->pt, owner))
        return KV_ENOENT;
    kv_pol_seq_t *po = kv_pol_get(s, owner), *pp = kv_pol_get(s, pass);
    if (!po || po->pol.sel != KV_POL_SEL_KVZIP)
        return KV_ENOTSUP;
    if (pass == owner || !pp || pp->pol.sel != KV_POL_SEL_KVZIP || po->decoding ||
        pp->decoding || pp->zip_pass || po->zip_pass)
        return KV_ESTATE;
    const uint32_t T = kv_page_list_get(s->pt, owner, 0, 0)->n_tokens;
    if (!lists_len(s, owner, T) || !lists_len(s, pass, T))
        return KV_ESTATE;
    if (t0 >= t1 || t1 > T)
        return KV_ERANGE;
    for (uint32_t i = 0; i < po->n_lists; i++) /* zero-extended: nothing lost */
        if (po->win[i].n < T && kv_pol_vec_resize(s, &po->win[i], T))
            return KV_ENOMEM;
    pp->zip_pass = 1;
    pp->zip_owner = owner;
    pp->zip_t0 = t0;
    pp->zip_t1 = t1;
    pp->zip_len = T;
    return 0;
}

int kv_pol_kvzip_observe(kv_store_t *s, const kv_prefill_t *a, const kv_pol_seq_t *ps)
{
    const uint32_t H = s->cfg.n_kv_heads, Hq = s->cfg.n_q_heads, D = s->cfg.head_dim;
    const uint32_t T = ps->zip_len, t0 = ps->zip_t0, t1 = ps->zip_t1;
    kv_pol_seq_t *po = kv_pol_get(s, ps->zip_owner);
    if (!kv_page_seq_live(s->pt, ps->zip_owner) || !po || po->decoding ||
        po->pol.sel != KV_POL_SEL_KVZIP ||
        kv_page_list_get(s->pt, ps->zip_owner, a->layer, 0)->n_tokens != T)
        return KV_ESTATE;
    const uint32_t len = kv_page_list_get(s->pt, a->seq, a->layer, 0)->n_tokens;
    const uint32_t first = len - a->n_new; /* the call's first row */
    const uint32_t r0 = first > T ? first : T;
    if (len <= T || r0 >= len)
        return 0; /* no reconstruction row in this call */
    const uint32_t ns = ps->pol.sink < t0 ? ps->pol.sink : t0, nc = t1 - t0, nr = len - T;
    const uint32_t nk = ns + nc + nr;
    /* scratch: per kv head its keys (sinks, chunk, the pass's tokens), then
     * the score vectors' addresses */
    const size_t kb = (size_t)H * nk * D * sizeof(float), bytes = kb + H * sizeof(float *);
    float *k = kv_mem_alloc(bytes);
    if (!k)
        return KV_ENOMEM;
    float **score = (float **)(void *)((char *)k + kb);
    int rc = 0;
    for (uint32_t h = 0; h < H && !rc; h++) {
        float *kh = k + (size_t)h * nk * D;
        score[h] = po->win[a->layer * H + h].v + t0;
        if (!(rc = kv_page_read(s->pt, a->seq, a->layer, h, 0, ns, kh, NULL, NULL)) &&
            !(rc = kv_page_read(s->pt, a->seq, a->layer, h, t0, nc, kh + (size_t)ns * D, NULL,
                                NULL)))
            rc = kv_page_read(s->pt, a->seq, a->layer, h, T, nr, kh + (size_t)(ns + nc) * D,
                              NULL, NULL);
    }
    kv_zip_score_params_t zp = {
        .q = a->q + (size_t)(r0 - first) * Hq * D, .k = k, .score = score, .n_q_heads = Hq,
        .n_kv_heads = H, .head_dim = D, .n_keys = nk, .n_sink = ns, .n_chunk = nc,
        .n_rows = len - r0, .n_vis0 = ns + nc + (r0 - T + 1),
        .scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)D)};
    if (!rc)
        rc = kv_backend_zip_score(&s->backend, &zp);
    if (!rc)
        po->zip_scored = 1;
    kv_mem_free(k, bytes);
    return rc;
}

int kv_pol_kvzip_prepare(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps)
{
    const uint32_t H = s->cfg.n_kv_heads;
    for (uint32_t i = 0; i < ps->n_lists; i++) {
        uint32_t n = kv_page_list_get(s->pt, seq, i / H, i % H)->n_tokens;
        if (!ps->zip_scored && n > ps->hh_layer[i / H])
            return KV_ESTATE; /* it would evict without scores */
        if (kv_pol_vec_resize(s, &ps->win[i], n))
            return KV_ENOMEM;
        for (uint32_t t = 0; t < n && t < ps->pol.sink; t++)
            ps->win[i].v[t] = INFINITY;
    }
    return 0;
}
