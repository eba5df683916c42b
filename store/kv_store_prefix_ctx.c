/* SPDX-License-Identifier: MIT */
/*
 * kv_store_prefix_ctx.c — compressed contexts in the prefix cache
 * (kvpage.h, "compressed contexts"; docs/prefix.md): a sequence's cache as
 * its policy left it at kv_seq_prefill_end, published under the context's
 * tokens, and installed by a match into an empty sequence of the same
 * policy in exactly that state, so one compression (and one scoring pass)
 * serves every later request that starts with the same context.
 *
 * A context node is a kv_pfx_node_t of [0, n) with no parent and no
 * children, keyed by the end hash of its n tokens (prefix/kv_prefix_hash.h,
 * kind 2: distinct from every block node's key), holding per list the
 * publisher's entries (one pool reference each, like a block node's), their
 * positions (x->pos, list-major), the list's target format (x->target: a
 * KIVI residual or a policy's +int4 goes on converting) and a copy of the publisher's policy state
 * (x->pol, kv_pol_state_dup: what kv_seq_fork gives a child). A hit is the
 * publisher's state handed over as kv_seq_fork hands it to a fork: the
 * same pages (shared copy-on-write), positions and policy state, so every
 * later call computes what it computes on the publisher.
 *
 * Invariants: a context node is published only when the publisher's
 * prefill end has run and no step end yet (its policy state says so), its
 * lists hold no position >= n (nothing appended after the context), and
 * every entry is resident, unflagged and not MERGED (attach's rule; a
 * policy that merges layers has no context node). Context nodes live in
 * the pool only: eviction drops them (no page-file copy, never sent to the
 * remote tier). Ownership: the node owns its state (freed with the node,
 * kv_pfx_ctx_release); its block and references as every node's.
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"
#include "kv_store_int.h"
#include "kv_store_prefix_int.h"

void kv_pfx_ctx_release(kv_store_t *s, kv_pfx_node_t *x)
{
    kv_pol_state_free(s, x->pol);
    x->pol = NULL;
    s->pfx->ctx_nodes--;
}

/* Validate a call and compute the context's key: the end key of
 * tokens[0..n) (kv_pfx_call_begin) under seq's fingerprint and salt, with
 * seq's layer formats as they are before a prefill end (a publisher's:
 * ps->target0). */
static int ctx_key(kv_store_t *s, kv_seq_id_t seq, const int32_t *tokens, uint32_t n,
                   const void *salt, size_t salt_len, kv_prefix_hash_t *key)
{
    if (!s || !n || !tokens)
        return KV_EINVAL;
    const kv_pol_seq_t *ps = kv_page_seq_live(s->pt, seq) ? kv_pol_get(s, seq) : NULL;
    pfx_rule_t rule;
    kv_prefix_hash_t *h;
    uint32_t nb;
    size_t hb;
    int rc = kv_pfx_call_begin(s, seq, tokens, n, salt, salt_len,
                               ps && ps->decoding ? ps->target0 : NULL, &rule, &h, &nb, &hb,
                               key);
    kv_mem_free(h, hb);
    return rc;
}

int kv_seq_prefix_publish_compressed(kv_store_t *s, kv_seq_id_t seq, const int32_t *tokens,
                                     uint32_t n, const void *salt, size_t salt_len)
{
    kv_prefix_hash_t key;
    int rc = ctx_key(s, seq, tokens, n, salt, salt_len, &key);
    if (rc)
        return rc;
    const kv_pol_seq_t *ps = kv_pol_get(s, seq);
    if (!ps || !ps->decoding || ps->steps || ps->zip_pass || ps->prompt_len != n)
        return KV_ESTATE;
    const uint32_t H = s->cfg.n_kv_heads, L = s->cfg.n_layers * H;
    if ((rc = kv_store_press_ready(s, seq))) /* resident (offload, ladder) */
        return rc;
    uint32_t n_ents = 0, n_pos = 0;
    for (uint32_t li = 0; li < L; li++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, li / H, li % H);
        if ((l->pos ? l->pos_next : (int64_t)l->n_tokens) > (int64_t)n)
            return KV_ESTATE; /* tokens appended after the context */
        for (uint32_t e = 0; e < l->n_ents; e++)
            if (l->ents[e].flags || l->ents[e].format == KV_FMT_MERGED ||
                (l->ents[e].format != KV_FMT_FP16 && l->ents[e].n_tokens % 16))
                return KV_ENOTSUP; /* a state attach cannot install */
        n_ents += l->n_ents;
        n_pos += l->n_tokens;
    }
    kv_pfx_t *p = s->pfx;
    kv_pfx_node_t *x = kv_pfx_lookup(p, &key);
    if (x) /* published before: the same state (the key names it) */
        return 0;
    if (!(x = kv_pfx_node_alloc(L, n_ents, n_pos)))
        return KV_ENOMEM;
    if (!(x->pol = kv_pol_state_dup(s, ps)) || (rc = kv_pfx_reserve(p, 1))) {
        kv_pol_state_free(s, x->pol);
        kv_mem_free(x, x->bytes);
        return KV_ENOMEM;
    }
    x->key = key;
    x->end = n;
    uint32_t at = 0, pat = 0;
    for (uint32_t li = 0; li < L; li++) {
        const kv_page_list_t *l = kv_page_list_get(s->pt, seq, li / H, li % H);
        x->off[li] = at;
        x->target[li] = l->target;
        memcpy(x->ents + at, l->ents, (size_t)l->n_ents * sizeof *x->ents);
        at += l->n_ents;
        for (uint32_t t = 0; t < l->n_tokens; t++)
            x->pos[pat + t] = l->pos ? l->pos[t] : (int32_t)t;
        pat += l->n_tokens;
    }
    x->off[L] = at;
    kv_pfx_link(s, x, 1);
    p->ctx_nodes++;
    p->ctx_published++;
    kv_store_touch(s, seq);
    return 0;
}

int kv_seq_prefix_match_compressed(kv_store_t *s, kv_seq_id_t seq, const int32_t *tokens,
                                   uint32_t n, const void *salt, size_t salt_len,
                                   uint32_t *matched)
{
    if (!matched)
        return KV_EINVAL;
    kv_prefix_hash_t key;
    int rc = ctx_key(s, seq, tokens, n, salt, salt_len, &key);
    if (rc)
        return rc;
    *matched = 0;
    const kv_pol_seq_t *ps = kv_pol_get(s, seq);
    if (!ps || ps->decoding || ps->zip_pass)
        return KV_ESTATE;
    const uint32_t H = s->cfg.n_kv_heads, L = s->cfg.n_layers * H;
    for (uint32_t li = 0; li < L; li++)
        if (kv_page_list_get(s->pt, seq, li / H, li % H)->n_tokens)
            return KV_ESTATE;
    kv_pfx_t *p = s->pfx;
    kv_pfx_node_t *x = kv_pfx_lookup(p, &key);
    if (!x || !x->pol) {
        p->ctx_misses++;
        return 0;
    }
    kv_pol_seq_t *st = kv_pol_state_dup(s, x->pol);
    if (!st)
        return KV_ENOMEM;
    uint32_t *cnt = kv_mem_alloc((size_t)L * sizeof *cnt);
    if (!cnt) {
        kv_pol_state_free(s, st);
        return KV_ENOMEM;
    }
    for (uint32_t li = 0; li < L; li++)
        cnt[li] = x->off[li + 1] - x->off[li];
    rc = kv_page_seq_attach(s->pt, seq, x->ents, cnt, x->pos, x->target);
    kv_mem_free(cnt, (size_t)L * sizeof *cnt);
    if (rc) {
        kv_pol_state_free(s, st);
        return rc;
    }
    kv_pol_state_put(s, seq, st);
    /* to the hot end of the LRU */
    kv_pfx_touch(p, x);
    p->ctx_hits++;
    p->reused += n;
    *matched = n;
    kv_store_touch(s, seq);
    return 0;
}
