/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_run.c — what a sequence's policy does at prefill end and after
 * every decode step (kv_seq_prefill_end, kv_seq_step_end), in this order:
 *
 *   prefill end: resolve budgets against the prompt length T (fractions of
 *   T; MiniKV pyramid per layer); SimLayerKV (prefill mode) marks lazy
 *   layers; Expected Attention scores every list (kv_policy_eattn.c), KVzip
 *   checks its scores (kv_policy_kvzip.c); with ada=2 the sequence's
 *   budget is split over all its lists once (kv_pol_select_split); per
 *   (layer, kv_head): lazy -> trim to sink + last w, else the selection
 *   (StreamingLLM, H2O, SnapKV, MiniKV, Expected Attention, KVzip; per
 *   list, per layer with AdaKV's ada=1, or each list's share with ada=2;
 *   CaM on evictions); then
 *   the kept tokens' format (set_format + quantize, all but the last T mod R
 *   tokens); MiniCache merges its layer pairs.
 *   step end: SimLayerKV (decode mode) decides after the first step; lazy
 *   layers trim, StreamingLLM/H2O evict (+CaM); a list whose residual
 *   reached R after a compaction is re-quantized; MiniCache merges a pair's
 *   new tokens once `every` of them are in both layers.
 *
 * Failure: these touch many lists one after another and are not
 * all-or-nothing as a whole. On an error (KV_ENOMEM) every list is either
 * done or untouched, the store is consistent (kv_store_check passes) and
 * the policy state matches the lists; calling the same function again
 * finishes the job with the same result (each step is idempotent: a list
 * already at its budget is left alone, the phase only advances on success).
 *
 * Both are mutating calls on the sequence, like kv_append: with a policy,
 * the sequence is made resident first (kv_store_press_ready: its I/O in
 * flight finished, then KV_ENOTRES, or with KV_OFFLOAD_WAIT a page-in), and
 * the work runs under the memory-pressure ladder's retry protocol
 * (kv_store_int.h): a refused page runs the ladder on the other sequences,
 * then the call runs once more, which is safe because it is idempotent. The
 * conversions and merges it makes through kv_seq_* are nested in it. Its
 * need is one operation's: the largest layer rewritten (twice under
 * MiniCache: a merge rewrites a pair, see kv_seq_merge_layers), since every
 * operation before the refused one gave back about what it took.
 */
#include "alloc/kv_mem.h"
#include "kv_policy_int.h"

/* Tokens in the trailing run of plain (unflagged) FP16 entries of a list. */
static uint32_t residual_tokens(const kv_page_list_t *l)
{
    uint32_t n = 0;
    for (uint32_t e = l->n_ents; e > 0; e--) {
        const kv_page_ent_t *ent = &l->ents[e - 1];
        if (ent->format != KV_FMT_FP16 || ent->flags)
            break;
        n += ent->n_tokens;
    }
    return n;
}

static uint32_t mc_first(const kv_store_t *s, const kv_policy_t *p)
{
    return kv_pol_merge_first(p, s->cfg.n_layers) + 1; /* upper layer of 1st pair */
}

static int mc_merge(kv_store_t *s, kv_seq_id_t seq, const kv_policy_t *p, uint32_t min_new)
{
    kv_merge_opts_t o = kv_merge_opts_default();
    o.t = (float)p->mc_t;
    o.gamma = (float)p->mc_gamma;
    o.dir_format = p->fmt_given ? KV_FMT_INT4 : KV_FMT_FP16;
    for (uint32_t l = mc_first(s, p); l < s->cfg.n_layers; l += 2) {
        int ready = 1; /* every head: both layers hold the same new tokens */
        for (uint32_t h = 0; h < s->cfg.n_kv_heads && ready; h++) {
            uint32_t r0 = residual_tokens(kv_page_list_get(s->pt, seq, l - 1, h));
            uint32_t r1 = residual_tokens(kv_page_list_get(s->pt, seq, l, h));
            ready = r0 != 0 && r0 == r1 && r0 >= min_new;
        }
        if (!ready)
            continue;
        int rc = kv_seq_merge_layers(s, seq, l, &o);
        if (rc == KV_ESTATE) /* positions differ (the caller compacted): */
            continue;        /* this pair stays unmerged                 */
        if (rc)
            return rc;
    }
    return 0;
}

/* Re-quantize layers whose residual reached R (after compaction). */
static int requantize(kv_store_t *s, kv_seq_id_t seq, const kv_policy_t *p)
{
    if (p->mc || (!p->sel && !p->sim) || p->fmt == KV_FMT_FP16)
        return 0;
    const uint32_t R = s->cfg.residual;
    for (uint32_t l = 0; l < s->cfg.n_layers; l++) {
        uint32_t r = residual_tokens(kv_page_list_get(s->pt, seq, l, 0));
        if (r < R)
            continue;
        int rc = kv_seq_set_format(s, seq, l, (kv_format_t)kv_pol_target(p));
        if (!rc)
            rc = kv_seq_quantize(s, seq, l, r % R);
        if (rc)
            return rc;
    }
    return 0;
}

static void sim_decide(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps)
{
    const kv_policy_t *p = &ps->pol;
    for (uint32_t l = 0; l < s->cfg.n_layers; l++) {
        uint32_t n = kv_page_list_get(s->pt, seq, l, 0)->n_tokens;
        ps->lazy[l] = ps->sim_mass[l] > p->sim_delta && n > p->sim_sink + p->sim_w;
    }
    ps->sim_decided = 1;
}

/* Per list: lazy trim or selection. */
static int lists_apply(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps, int at_prefill)
{
    for (uint32_t l = 0; l < s->cfg.n_layers; l++) {
        int rc = 0;
        if (!(ps->lazy && ps->lazy[l]))
            rc = kv_pol_select_layer(s, seq, ps, l, at_prefill);
        for (uint32_t h = 0; h < s->cfg.n_kv_heads && !rc && ps->lazy && ps->lazy[l]; h++)
            rc = kv_pol_sim_trim(s, seq, ps, l, h);
        if (rc)
            return rc;
    }
    return 0;
}

/* Pages the retry protocol frees for one policy call on seq (file comment). */
static uint64_t run_need(const kv_store_t *s, kv_seq_id_t seq, const kv_policy_t *p)
{
    uint64_t need = 0;
    for (uint32_t l = 0; s->press && l < s->cfg.n_layers; l++) {
        uint64_t n = kv_store_press_layer_need(s, seq, l);
        need = n > need ? n : need;
    }
    return p->mc ? 2 * need : need;
}

static int prefill_run(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps)
{
    const kv_policy_t *p = &ps->pol;
    uint32_t T = ps->prompt_len;
    if (T == 0) { /* first attempt (a retry keeps the budgets) */
        T = kv_page_list_get(s->pt, seq, 0, 0)->n_tokens;
        ps->prompt_len = T;
        for (uint32_t l = 0; l < s->cfg.n_layers; l++)
            ps->target0[l] = (uint8_t)kv_page_list_get(s->pt, seq, l, 0)->target;
        uint32_t hh;
        kv_pol_budgets(p, T, &hh, &ps->recent);
        for (uint32_t l = 0; l < s->cfg.n_layers; l++)
            ps->hh_layer[l] = p->sel == KV_POL_SEL_MINIKV
                                  ? kv_pol_pyramid(hh, p->pyramid, l, s->cfg.n_layers)
                                  : hh;
    }
    if (T == 0) {
        kv_pol_qmom_free(s, ps); /* eattn: nothing to score */
        ps->decoding = 1;
        return 0;
    }
    if (p->sim && p->sim_mode == KV_POL_SIM_PREFILL && !ps->sim_decided)
        sim_decide(s, seq, ps);
    int rc = 0;
    if (p->sel == KV_POL_SEL_EATTN && !(rc = kv_pol_eattn_prepare(s, seq, ps)))
        kv_pol_qmom_free(s, ps);
    if (p->sel == KV_POL_SEL_KVZIP)
        rc = kv_pol_kvzip_prepare(s, seq, ps);
    if (!rc)
        rc = kv_pol_select_split(s, seq, ps);
    if (!rc)
        rc = lists_apply(s, seq, ps, 1);
    if (!rc && p->sel && p->fmt != KV_FMT_FP16) {
        const uint32_t R = s->cfg.residual;
        for (uint32_t l = 0; l < s->cfg.n_layers && !rc; l++) {
            uint32_t r = residual_tokens(kv_page_list_get(s->pt, seq, l, 0));
            rc = kv_seq_set_format(s, seq, l, (kv_format_t)kv_pol_target(p));
            if (!rc && r)
                rc = kv_seq_quantize(s, seq, l, r % R);
        }
    }
    if (!rc && p->mc)
        rc = mc_merge(s, seq, p, 1);
    if (!rc)
        ps->decoding = 1;
    return rc;
}

static int step_run(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps)
{
    int rc;
    if (!ps->decoding && (rc = prefill_run(s, seq, ps)))
        return rc;
    const kv_policy_t *p = &ps->pol;
    if (p->sim && p->sim_mode == KV_POL_SIM_DECODE && !ps->sim_decided)
        sim_decide(s, seq, ps);
    rc = 0;
    if (p->sel == KV_POL_SEL_STREAM || p->sel == KV_POL_SEL_H2O || p->sim)
        rc = lists_apply(s, seq, ps, 0);
    if (!rc)
        rc = requantize(s, seq, p);
    if (!rc && p->mc)
        rc = mc_merge(s, seq, p, p->mc_every);
    if (!rc)
        ps->steps++;
    return rc;
}

/* A public policy call: validate, make seq resident, run under the ladder. */
static int policy_call(kv_store_t *s, kv_seq_id_t seq, int at_step)
{
    if (!s)
        return KV_EINVAL;
    if (!kv_page_seq_live(s->pt, seq))
        return KV_ENOENT;
    kv_pol_seq_t *ps = kv_pol_get(s, seq);
    if (!ps || (!at_step && ps->decoding))
        return 0; /* nothing to do */
    int rc = kv_store_press_ready(s, seq);
    if (rc)
        return rc;
    kv_store_press_call_t pc;
    kv_store_press_begin(s, &pc, seq, run_need(s, seq, &ps->pol));
    do
        rc = at_step ? step_run(s, seq, ps) : prefill_run(s, seq, ps);
    while (kv_store_press_retry(s, &pc, rc));
    return rc;
}

int kv_seq_prefill_end(kv_store_t *s, kv_seq_id_t seq)
{
    return policy_call(s, seq, 0);
}

int kv_seq_step_end(kv_store_t *s, kv_seq_id_t seq)
{
    return policy_call(s, seq, 1);
}
