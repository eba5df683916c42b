/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_eattn.c — Expected Attention (Devoto et al. 2025; NVIDIA
 * kvpress's ExpectedAttentionPress): score each prompt token by the
 * attention that *future* queries are expected to give it, from the
 * statistics of the prompt's queries, without seeing those queries.
 *
 * Model: a future query is q = R(p) x, x ~ N(mu, Sigma) the pre-RoPE
 * query of a head (mean and covariance of its prompt rows), p a position in
 * [P, P + future) (P = the position after the prompt) and R(p) RoPE. With R
 * averaged over those positions (Rbar, block diagonal 2x2), q has mean
 * mu' = Rbar mu and covariance Sigma' = Rbar Sigma Rbar^T, and for a key k
 *     E[exp(s q.k)] = exp(s mu'.k + s^2/2 k^T Sigma' k)   (s = softmax scale)
 * (the Gaussian moment generating function). Per query head these logits
 * are soft-maxed over the tokens past the first `sink`, averaged over the
 * head's query group and multiplied by ||v||; the sink tokens score +inf
 * (always kept). kv_pol_select_layer then keeps the top c per list.
 *
 * Where the queries come from: the engine's post-RoPE queries of every
 * kv_attn_prefill call on the sequence (row r of a call is list token
 * n - n_new + r; its position is the list's recorded position). RoPE is
 * undone with the policy's theta and layout (pairs (2i, 2i+1) as GGUF/ggml
 * llama, or halves (i, i + D/2) as Hugging Face): the store does not know
 * the engine's RoPE, so the policy names it. Moments are accumulated in
 * double (count, sum, upper triangle of sum x x^T) per (layer, query head)
 * in ps->qmom, allocated with the state and freed once scored: per layer
 * n_q_heads * (1 + D + D (D + 1) / 2) doubles (SmolLM2-135M, 30 layers x 9
 * heads x D 64: 4.6 MB; a 32 x 32 x 128 model: 68 MB per prefilling
 * sequence).
 */
#include <math.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"

/* Doubles of one head's moments: count, sum [D], packed upper triangle of
 * sum x x^T [D (D + 1) / 2] (row i holds columns i..D-1). */
static size_t mom_per_head(size_t D)
{
    return 1 + D + D * (D + 1) / 2;
}

size_t kv_pol_eattn_mom_len(const kv_store_t *s)
{
    return (size_t)s->cfg.n_q_heads * mom_per_head(s->cfg.head_dim);
}

/* The partner of element i in a RoPE pair and the pair's index, or -1 when
 * i is the second element (it is rotated with its partner). */
static int rope_pair(uint32_t i, uint32_t D, uint32_t layout, uint32_t *j, uint32_t *f)
{
    if (layout == KV_POL_ROPE_HALVES) {
        if (i >= D / 2)
            return -1;
        *j = i + D / 2, *f = i;
    } else {
        if (i & 1u)
            return -1;
        *j = i + 1, *f = i / 2;
    }
    return 0;
}

static double rope_freq(uint32_t f, uint32_t D, double theta)
{
    return pow(theta, -2.0 * f / D);
}

void kv_pol_rope(double *x, uint32_t D, double pos, double theta, uint32_t layout,
                 int inverse)
{
    for (uint32_t i = 0, j, f; i < D; i++) {
        if (rope_pair(i, D, layout, &j, &f))
            continue;
        double a = pos * rope_freq(f, D, theta), c = cos(a), sn = inverse ? -sin(a) : sin(a);
        double u = x[i], w = x[j];
        x[i] = u * c - w * sn;
        x[j] = u * sn + w * c;
    }
}

void kv_pol_eattn_observe(const kv_store_t *s, kv_pol_seq_t *ps, const kv_prefill_t *a)
{
    const uint32_t D = s->cfg.head_dim, Hq = s->cfg.n_q_heads;
    const size_t per = mom_per_head(D);
    const kv_policy_t *p = &ps->pol;
    const kv_page_list_t *l = kv_page_list_get(s->pt, a->seq, a->layer, 0);
    double *mom = ps->qmom + a->layer * kv_pol_eattn_mom_len(s);
    uint32_t r0 = 0;
    if (p->window) { /* the last w rows of this call replace the moments */
        memset(mom, 0, kv_pol_eattn_mom_len(s) * sizeof *mom);
        r0 = a->n_new > p->window ? a->n_new - p->window : 0;
    }
    ps->ea_scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)D);
    double x[1024];
    for (uint32_t r = r0; r < a->n_new; r++) {
        int32_t pos = kv_page_list_pos(l, l->n_tokens - a->n_new + r);
        if (pos < (int64_t)p->ea_sink)
            continue;
        for (uint32_t h = 0; h < Hq; h++) {
            const float *q = a->q + ((size_t)r * Hq + h) * D;
            for (uint32_t d = 0; d < D; d++)
                x[d] = q[d];
            kv_pol_rope(x, D, pos, p->ea_theta, p->ea_rope, 1);
            double *m = mom + h * per, *sum = m + 1, *sq = m + 1 + D;
            m[0] += 1;
            for (uint32_t i = 0; i < D; i++) {
                sum[i] += x[i];
                for (uint32_t j = i; j < D; j++)
                    *sq++ += x[i] * x[j];
            }
        }
    }
}

/* y = Rbar x for the mean rotation (cbar, sbar per pair). */
static void rot_mean(double *x, uint32_t D, uint32_t layout, const double *cb,
                     const double *sb, size_t stride)
{
    for (uint32_t i = 0, j, f; i < D; i++) {
        if (rope_pair(i, D, layout, &j, &f))
            continue;
        double u = x[i * stride], w = x[j * stride];
        x[i * stride] = u * cb[f] - w * sb[f];
        x[j * stride] = u * sb[f] + w * cb[f];
    }
}

void kv_pol_eattn_stats(const double *mom, uint32_t D, double theta, uint32_t layout,
                        double p0, uint32_t future, double *mu, double *cov)
{
    double cb[512], sb[512];
    for (uint32_t f = 0; f < D / 2; f++) {
        double w = rope_freq(f, D, theta), c = 0, sn = 0;
        for (uint32_t t = 0; t < future; t++) {
            c += cos((p0 + t) * w);
            sn += sin((p0 + t) * w);
        }
        cb[f] = c / future, sb[f] = sn / future;
    }
    const double n = mom[0] > 0 ? mom[0] : 1;
    const double *sum = mom + 1, *sq = mom + 1 + D;
    for (uint32_t i = 0; i < D; i++)
        mu[i] = sum[i] / n;
    if (cov) {
        for (uint32_t i = 0; i < D; i++)
            for (uint32_t j = i; j < D; j++, sq++)
                cov[(size_t)i * D + j] = cov[(size_t)j * D + i] = *sq / n - mu[i] * mu[j];
        for (uint32_t j = 0; j < D; j++) /* Rbar Sigma: columns */
            rot_mean(cov + j, D, layout, cb, sb, D);
        for (uint32_t i = 0; i < D; i++) /* (Rbar Sigma) Rbar^T: rows */
            rot_mean(cov + (size_t)i * D, D, layout, cb, sb, 1);
    }
    rot_mean(mu, D, layout, cb, sb, 1);
}

void kv_pol_eattn_score(const float *k, const float *v, uint32_t n, uint32_t D, uint32_t G,
                        const double *mu, const double *cov, double scale, uint32_t sink,
                        int vnorm, float *out, double *lg)
{
    for (uint32_t t = 0; t < n; t++)
        out[t] = 0.0f;
    for (uint32_t g = 0; g < G; g++) {
        const double *m = mu + (size_t)g * D, *C = cov ? cov + (size_t)g * D * D : NULL;
        double mx = -INFINITY;
        for (uint32_t t = sink; t < n; t++) {
            const float *kt = k + (size_t)t * D;
            double a = 0, b = 0;
            for (uint32_t i = 0; i < D; i++) {
                a += m[i] * kt[i];
                if (C) {
                    double ci = 0;
                    for (uint32_t j = 0; j < D; j++)
                        ci += C[(size_t)i * D + j] * kt[j];
                    b += kt[i] * ci;
                }
            }
            lg[t] = scale * a + 0.5 * scale * scale * b;
            mx = lg[t] > mx ? lg[t] : mx;
        }
        double z = 0;
        for (uint32_t t = sink; t < n; t++)
            z += (lg[t] = exp(lg[t] - mx));
        for (uint32_t t = sink; t < n; t++)
            out[t] += (float)(lg[t] / z / G);
    }
    for (uint32_t t = 0; t < n; t++) {
        if (t < sink) {
            out[t] = INFINITY;
        } else if (vnorm) {
            double s2 = 0;
            for (uint32_t d = 0; d < D; d++)
                s2 += (double)v[(size_t)t * D + d] * v[(size_t)t * D + d];
            out[t] = (float)(out[t] * sqrt(s2));
        }
    }
}

int kv_pol_eattn_prepare(kv_store_t *s, kv_seq_id_t seq, kv_pol_seq_t *ps)
{
    if (ps->ea_scored)
        return 0;
    const kv_policy_t *p = &ps->pol;
    const uint32_t D = s->cfg.head_dim, H = s->cfg.n_kv_heads, G = s->cfg.n_q_heads / H;
    const size_t per = mom_per_head(D);
    uint32_t nmax = 0;
    for (uint32_t l = 0; l < s->cfg.n_layers; l++)
        for (uint32_t h = 0; h < H; h++) {
            uint32_t n = kv_page_list_get(s->pt, seq, l, h)->n_tokens;
            nmax = n > nmax ? n : nmax;
        }
    for (uint32_t i = 0; i < ps->n_lists; i++) /* all vectors first: no failure later */
        if (kv_pol_vec_resize(s, &ps->win[i],
                              kv_page_list_get(s->pt, seq, i / H, i % H)->n_tokens))
            return KV_ENOMEM;
    size_t stat_n = (size_t)G * D * (1 + (p->ea_cov ? D : 0));
    size_t bytes = ((size_t)2 * nmax * D) * sizeof(float) + (stat_n + nmax) * sizeof(double);
    char *mem = kv_mem_alloc(bytes ? bytes : 1);
    if (!mem)
        return KV_ENOMEM;
    float *K = (float *)(void *)mem, *V = K + (size_t)nmax * D;
    double *mu = (double *)(void *)(V + (size_t)nmax * D);
    double *cov = p->ea_cov ? mu + (size_t)G * D : NULL, *lg = mu + stat_n;
    int rc = 0;
    const float scale = ps->ea_scale > 0 ? ps->ea_scale : 1.0f / sqrtf((float)D);
    for (uint32_t l = 0; l < s->cfg.n_layers && !rc; l++)
        for (uint32_t h = 0; h < H && !rc; h++) {
            const kv_page_list_t *li = kv_page_list_get(s->pt, seq, l, h);
            const uint32_t n = li->n_tokens;
            if (n == 0)
                continue;
            double p0 = (double)kv_page_list_pos(li, n - 1) + 1.0;
            for (uint32_t g = 0; g < G; g++)
                kv_pol_eattn_stats(ps->qmom + l * kv_pol_eattn_mom_len(s) +
                                       (size_t)(h * G + g) * per,
                                   D, p->ea_theta, p->ea_rope, p0, p->ea_future,
                                   mu + (size_t)g * D, cov ? cov + (size_t)g * D * D : NULL);
            if ((rc = kv_page_read(s->pt, seq, l, h, 0, n, K, V, NULL)))
                break;
            kv_pol_eattn_score(K, V, n, D, G, mu, cov, scale, p->ea_sink < n ? p->ea_sink : n,
                               p->ea_vnorm, ps->win[l * H + h].v, lg);
        }
    kv_mem_free(mem, bytes ? bytes : 1);
    if (rc)
        return rc;
    ps->ea_scored = 1;
    return 0;
}
