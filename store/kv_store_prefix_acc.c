/* SPDX-License-Identifier: MIT */
/*
 * kv_store_prefix_acc.c — statistics snapshots of prefix-cache nodes, for
 * the policies whose prefill-end decision reads attention summed over every
 * prompt row (the "ACC" policies: H2O, MiniKV, and CaM's merge mask;
 * kv_policy_int.h, kv_pol_seq_t.acc). The rows of a cached prefix are not
 * computed again by a sequence that matches it, so their sums must come
 * with the pages (docs/prefix.md, "Statistics snapshots").
 *
 * A snapshot at node end b is every list's acc vector for tokens [0, b)
 * after query rows [0, b): [n_lists][b] floats, list li = layer *
 * n_kv_heads + head. It is taken by kv_seq_prefix_publish when the
 * publisher's prefill has processed exactly b rows (every list b tokens long
 * and every acc vector b entries: attention ran after the last append), b a
 * node boundary, before kv_seq_prefill_end. The whole vector, not a delta
 * from the parent's snapshot: every row adds to every earlier token's sum,
 * so all b entries change between two snapshots, and acc(a) + (acc(b) -
 * acc(a)) is not acc(b) in floating point. A match under an ACC policy
 * stops at the last node of its chain that has a snapshot and installs it
 * as the new sequence's acc vectors (kv_pol_acc_stage/commit): the rest of
 * the prompt then adds the same row sums in the same order as in the
 * publisher when the chunks after b are the same, so the selection is
 * bit-identical.
 *
 * Ownership: a node's snapshot is one kv_mem block (x->acc, x->acc_bytes),
 * host metadata counted in the cache's bytes (kv_stats_t.meta_bytes) and in
 * prefix_snapshot_bytes, freed with its node (kv_store_prefix.c).
 */
#include <math.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"
#include "kv_store_prefix_int.h"

int kv_pfx_acc_rule(const kv_store_t *s, kv_seq_id_t seq)
{
    const kv_pol_seq_t *ps = kv_pol_get(s, seq);
    return ps && ps->acc;
}

uint32_t kv_pfx_acc_at(const kv_store_t *s, kv_seq_id_t seq, uint32_t limit)
{
    const kv_pol_seq_t *ps = kv_pol_get(s, seq);
    const uint32_t H = s->cfg.n_kv_heads, B = kv_store_fp16_tpp(s);
    if (!ps || !ps->acc || ps->decoding)
        return 0;
    const uint32_t b = kv_page_list_get(s->pt, seq, 0, 0)->n_tokens;
    if (b == 0 || b % B || b > limit)
        return 0;
    for (uint32_t li = 0; li < ps->n_lists; li++)
        if (kv_page_list_get(s->pt, seq, li / H, li % H)->n_tokens != b || ps->acc[li].n != b)
            return 0;
    return b;
}

float *kv_pfx_acc_take(const kv_store_t *s, kv_seq_id_t seq, uint32_t b, size_t *bytes)
{
    const kv_pol_seq_t *ps = kv_pol_get(s, seq);
    *bytes = (size_t)ps->n_lists * b * sizeof(float);
    float *a = kv_mem_alloc(*bytes);
    if (!a)
        return NULL;
    for (uint32_t li = 0; li < ps->n_lists; li++)
        memcpy(a + (size_t)li * b, ps->acc[li].v, (size_t)b * sizeof(float));
    return a;
}

void kv_pfx_acc_give(kv_pfx_t *p, kv_pfx_node_t *x, float *acc, size_t bytes, int linked)
{
    x->acc = acc;
    x->acc_bytes = bytes;
    if (linked) {
        p->n_acc++;
        p->acc_bytes += bytes;
        p->bytes += bytes;
    }
}

int kv_pfx_acc_stage(kv_store_t *s, kv_seq_id_t seq, const kv_pfx_node_t *last, float ***staged)
{
    return kv_pol_acc_stage(kv_pol_get(s, seq), last->acc, last->end, staged);
}

void kv_pfx_acc_commit(kv_store_t *s, kv_seq_id_t seq, float **staged, uint32_t got)
{
    kv_pol_acc_commit(s, kv_pol_get(s, seq), staged, got);
}

void kv_pfx_acc_unstage(kv_store_t *s, kv_seq_id_t seq, float **staged, uint32_t got)
{
    kv_pol_acc_unstage(kv_pol_get(s, seq), staged, got);
}

int kv_pfx_acc_check(const kv_store_t *s, const kv_pfx_node_t *x)
{
    const size_t L = (size_t)s->cfg.n_layers * s->cfg.n_kv_heads;
    if (!x->acc)
        return x->acc_bytes ? KV_ECORRUPT : 0;
    if (x->acc_bytes != L * x->end * sizeof(float))
        return KV_ECORRUPT;
    for (size_t i = 0; i < L * x->end; i++)
        if (!isfinite(x->acc[i]) || x->acc[i] < 0)
            return KV_ECORRUPT;
    return 0;
}
