/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_info.c — kv_policy_info: what a parsed policy resolves to for a
 * sequence's shape and prompt, in numbers, for tools that plan capacity or
 * report (kvpage plan's closed form). It uses the helpers the run itself
 * uses (kv_pol_budgets, kv_pol_merge_first), so the numbers are the store's,
 * not a second reading of the policy. No state; allocates nothing.
 */
#include <string.h>

#include "kv_policy_int.h"

int kv_policy_info(const kv_policy_t *p, uint32_t n_layers, uint32_t prompt_len,
                   kv_policy_info_t *out)
{
    if (!p || !out)
        return KV_EINVAL;
    if (n_layers == 0 || n_layers > KV_MAX_LAYERS)
        return KV_ERANGE;
    kv_policy_info_t o;
    memset(&o, 0, sizeof o);
    o.methods = p->methods;
    o.format = (kv_format_t)p->fmt;
    o.residual = p->fmt_given ? p->residual : 0;
    o.evicts = p->sel == KV_POL_SEL_STREAM || p->sel == KV_POL_SEL_H2O;
    o.budget = prompt_len;
    if (p->sel) {
        uint32_t hh, recent;
        kv_pol_budgets(p, prompt_len, &hh, &recent);
        uint64_t b = kv_pol_sel_scored(p->sel) ? hh
                     : p->sel == KV_POL_SEL_STREAM ? (uint64_t)p->sink + recent
                                                   : (uint64_t)hh + recent;
        o.budget = b < UINT32_MAX ? (uint32_t)b : UINT32_MAX;
    }
    o.kept_fraction = prompt_len == 0 || o.budget >= prompt_len
                          ? 1.0
                          : (double)o.budget / prompt_len;
    if (p->sim) {
        o.lazy_window = p->sim_sink + p->sim_w;
        o.lazy_at_prefill = p->sim_mode == KV_POL_SIM_PREFILL;
    }
    o.merge_first = n_layers;
    o.merge_dir_format = KV_FMT_FP16;
    if (p->mc) {
        o.merge_first = kv_pol_merge_first(p, n_layers);
        o.merge_pairs = o.merge_first < n_layers ? (n_layers - o.merge_first) / 2 : 0;
        o.merge_every = p->mc_every;
        o.merge_dir_format = p->fmt_given ? KV_FMT_INT4 : KV_FMT_FP16;
    }
    *out = o;
    return 0;
}
