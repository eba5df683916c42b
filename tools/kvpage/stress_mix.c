/* SPDX-License-Identifier: MIT */
/*
 * stress_mix.c — parse the policy mix of `kvpage stress` and derive what
 * each policy lets the verifier expect (stress_mix.h).
 *
 * Derivation from what the library says the policy is (kv_policy_info;
 * docs/policies.md says what each method does):
 *   - the format its tokens convert to: INT2 -> bits 2 (kivi2/int2, minikv
 *     without a format), INT4 -> bits 4 (kivi4/int4; minicache+int4 makes
 *     the unpaired layers KIVI-4).
 *   - streamingllm, h2o, snapkv, minikv, simlayerkv evict -> select.
 *   - a format with per-step eviction (h2o, streamingllm, simlayerkv):
 *     every eviction decodes the list to FP16 and the policy re-quantizes
 *     it with shifted groups, so the error is not bounded by one
 *     quantization -> drift (finite, FP16 range). snapkv and minikv select
 *     once, at prefill end, before their tokens are quantized.
 *   - cam -> values change (V_j += V_e / m): values finite and in range.
 *   - minicache -> pairs (S, S+1), (S+2, S+3), ... from S = floor(L from)
 *     (merge_first, merge_pairs), as the store forms them.
 *
 * KIVI bound (stress_check_qbound): an appended element x is i/1024 in
 * [-A, A], exact in FP16. The store keeps, per group of 16, min stored as
 * FP16 rounded toward -inf (here exact: min itself, at most 2^-10 below in
 * general) and scale = (max - min_stored) / L (L = 2^b - 1) rounded up to
 * FP16 (relative error <= 2^-10, then at most a few ulps up until
 * min + L scale >= max; we allow 2^-9), and codes from the stored values:
 * |x - x^| <= scale / 2 <= (2A + 2^-10) (1 + 2^-9) / (2L). A compaction
 * stores decoded tokens as FP16: at most 2^-11 |x^| <= 2^-10 more; FP32
 * rounding of q * scale + min adds < 1e-6.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "stress_gen.h"
#include "stress_mix.h"

double stress_check_qbound(uint32_t bits)
{
    if (bits == 0)
        return 0.0;
    double levels = (double)((1u << bits) - 1u);
    return (2.0 * STRESS_VAL_A + 1.0 / 1024) * (1.0 + 1.0 / 512) / (2.0 * levels) +
           1.0 / 1024 + 1e-6;
}

int stress_check_merged(const stress_check_t *c, uint32_t layer)
{
    return layer >= c->merge_lo && layer < c->merge_hi;
}

double stress_check_vmax(const stress_check_t *c, uint32_t layer, uint32_t head_dim)
{
    if (c->drift || c->cam)
        return STRESS_FP16_MAX;
    double a = STRESS_VAL_A + stress_check_qbound(c->bits);
    if (stress_check_merged(c, layer))
        a = sqrt((double)head_dim) * a; /* merged: |component| <= norm */
    return a;
}

void stress_check_derive(const kv_policy_t *policy, uint32_t n_layers, stress_check_t *c)
{
    memset(c, 0, sizeof *c);
    kv_policy_info_t pi;
    if (!policy || kv_policy_info(policy, n_layers, 0, &pi))
        return;
    const uint32_t m = pi.methods;
    c->bits = pi.format == KV_FMT_INT2 ? 2 : pi.format == KV_FMT_INT4 ? 4 : 0;
    int per_step = (m & (KV_POLICY_H2O | KV_POLICY_STREAMINGLLM | KV_POLICY_SIMLAYERKV)) != 0;
    c->select = per_step || (m & (KV_POLICY_SNAPKV | KV_POLICY_MINIKV | KV_POLICY_EATTN));
    c->drift = per_step && c->bits != 0;
    c->cam = (m & KV_POLICY_CAM) != 0;
    if (m & KV_POLICY_MINICACHE) {
        c->merge_lo = pi.merge_first;
        c->merge_hi = pi.merge_first + 2u * pi.merge_pairs;
    }
}

void stress_mix_destroy(stress_mix_t *m)
{
    for (uint32_t i = 0; i < m->n; i++)
        kv_policy_destroy(m->pol[i].policy);
    memset(m, 0, sizeof *m);
}

int stress_mix_parse(const char *list, uint32_t n_layers, stress_mix_t *m, char *err,
                     size_t err_len)
{
    memset(m, 0, sizeof *m);
    const char *p = list;
    for (;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        char spec[1024];
        if (m->n == STRESS_MIX_MAX || len == 0 || len >= sizeof spec) {
            snprintf(err, err_len, "bad policy list '%s': 1..%d non-empty specs "
                     "separated by '|'", list, STRESS_MIX_MAX);
            stress_mix_destroy(m);
            return -1;
        }
        memcpy(spec, p, len);
        spec[len] = 0;
        stress_pol_t *pol = &m->pol[m->n];
        if (!strcmp(spec, "none")) {
            snprintf(pol->spec, sizeof pol->spec, "none");
        } else {
            char msg[256] = "";
            if (kv_policy_parse(spec, &pol->policy, msg, sizeof msg) ||
                kv_policy_describe(pol->policy, pol->spec, sizeof pol->spec)) {
                snprintf(err, err_len, "bad policy '%s': %s", spec, msg);
                m->n++;
                stress_mix_destroy(m);
                return -1;
            }
        }
        stress_check_derive(pol->policy, n_layers, &pol->chk);
        m->n++;
        if (!bar)
            return 0;
        p = bar + 1;
    }
}
