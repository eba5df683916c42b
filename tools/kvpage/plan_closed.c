/* SPDX-License-Identifier: MIT */
/*
 * plan_closed.c — closed-form KV bytes per policy (see plan_closed.h).
 */
#include "plan_closed.h"

#include <math.h>

#define CLOSED_DEFAULT_R 128.0 /* kv_config_t.residual's default */

double plan_closed_bits(kv_format_t fmt, int int4_dirs, uint32_t d)
{
    kv_format_info_t fi;
    if (kv_format_info(fmt, int4_dirs ? KV_FMT_INT4 : KV_FMT_FP16, d, 0, &fi))
        return NAN;
    return fi.bits_per_element;
}

/* Bytes of `held` tokens of a list: KIVI-converted at `bits` except the
 * newest held mod R (FP16); all FP16 when bits is 16. tok16: FP16 bytes of
 * one token of a list. */
static double list_bytes(double held, double bits, double R, double tok16)
{
    if (bits >= 16)
        return held * tok16;
    double resid = fmod(held, R);
    return (held - resid) * tok16 * bits / 16 + resid * tok16;
}

/* A non-lazy, non-MiniCache list: selection and/or format. h2o and
 * streamingllm evict every step down to the budget; the others select
 * once, at prefill end, and keep every decoded token. */
static double plain_list(const kv_policy_info_t *pi, uint32_t P, uint32_t G, double bits,
                         double R, double tok16)
{
    double budget = pi->budget;
    double held = pi->evicts ? fmin((double)P + G, budget) : fmin(P, budget) + G;
    return list_bytes(held, bits, R, tok16);
}

double plan_closed_bytes(const plan_closed_in_t *in, const kv_policy_t *policy,
                         uint32_t prompt, uint32_t out)
{
    const uint32_t L = in->layers, D = in->head_dim;
    const double tok16 = 4.0 * D; /* K and V, 2 bytes each */
    kv_policy_info_t pi;
    if (kv_policy_info(policy, L, prompt, &pi))
        return NAN;
    const double R = pi.residual ? pi.residual : CLOSED_DEFAULT_R;
    const double bits = plan_closed_bits(pi.format, 0, D); /* kept tokens */
    double per_head = 0;
    if (pi.methods & KV_POLICY_MINICACHE) {
        double every = pi.merge_every;
        double tail = out - every * floor(out / every), merged = prompt + (out - tail);
        double mbits = plan_closed_bits(KV_FMT_MERGED, pi.merge_dir_format == KV_FMT_INT4, D);
        double pair = (1 - in->retain_frac) * merged * 2 * tok16 * mbits / 16 +
                      2 * (in->retain_frac * merged + tail) * tok16;
        per_head = pi.merge_pairs * pair +
                   (L - 2 * pi.merge_pairs) * list_bytes(prompt + out, bits, R, tok16);
    } else if (pi.methods & KV_POLICY_SIMLAYERKV) {
        double n_at = prompt + (pi.lazy_at_prefill ? 0 : 1);
        int decided = n_at > pi.lazy_window && (pi.lazy_at_prefill || out > 0);
        uint32_t lazy = decided ? (uint32_t)llround(in->lazy_frac * L) : 0;
        per_head = lazy * list_bytes(pi.lazy_window, bits, R, tok16) +
                   (L - lazy) * plain_list(&pi, prompt, out, bits, R, tok16);
    } else {
        per_head = L * plain_list(&pi, prompt, out, bits, R, tok16);
    }
    return per_head * in->kv_heads;
}
