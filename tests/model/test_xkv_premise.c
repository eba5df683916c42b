/* SPDX-License-Identifier: MIT */
/*
 * test_xkv_premise.c — what SmolLM2's adjacent layers share, measured on
 * the real model: the premise of cross-layer shared-basis compression
 * (xKV), and the fidelity a shared basis keeps.
 *
 * The model reads `ctx` tokens of the GPL-3 text into an FP16 store; the
 * post-RoPE K and V of every (layer, kv head) are read back (kv_read). Then:
 *
 *  1. Ranks. For the rows X [ctx][F] of one layer (all kv heads side by
 *     side, F = 3 x 64, or one head, F = 64) and of g adjacent layers
 *     concatenated (F = g x ...), the smallest rank keeping 95% of
 *     ||X||_F^2 (eigenvalues of X^T X, util/kv_eig.h). "Shared" = the sum
 *     of the g layers' own ranks over the group's rank. Also the mean
 *     cosine between the same token's K in adjacent layers (what MiniCache's
 *     merging relies on).
 *  2. Fidelity. Each group's rows projected on the top-r eigenvectors of
 *     its X^T X (r = g F / c: c x fewer numbers than FP16 per token, the
 *     basis not counted) are appended to a new sequence, which a session
 *     adopts at position ctx; the next `cont` tokens of the text are then
 *     forced and their perplexity compared with the FP16 cache's. The
 *     context is compressed before any of the text that is scored arrives
 *     (query-agnostic).
 *
 * Checks: projecting at full rank gives FP16's perplexity (the harness
 * itself); the shared ranks are at least 1.5x below the sum at g = 4 for K
 * and V; perplexity rises with the compression. Usage:
 * test_xkv_premise [ctx [cont [full|extra]]] (default 384 48, what ctest runs;
 * the tables in docs/results.md: 1024 128 full, which adds groups of 1 and
 * 8, all heads together, K and V apart, ranks chosen by energy, K
 * projected before RoPE and K's basis in the metric of the context's own
 * queries (collected by the model's pre-attention hook); "extra" runs only
 * what full adds).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_model_test.h"
#include "util/kv_eig.h"

#define TEXT_PATH "/usr/share/common-licenses/GPL-3"

typedef struct premise {
    kv_model_t *m;
    kv_store_t *st;
    uint32_t L, H, D, T; /* layers, kv heads, head_dim, context tokens */
    float *kv[3];        /* [L][H][T][D] K and V as the store returns them, */
                         /* and K with RoPE undone (pre-RoPE K)             */
    float rope_theta;
    double *cq;          /* [L][H][D][D] sum of q q^T over the context's    */
                         /* query rows of the q heads of each kv head       */
    uint32_t group;      /* q heads per kv head                             */
    const int32_t *ids;  /* text ids: context then continuation */
    uint32_t cont;
} premise_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static const float *rows_of(const premise_t *P, int which, uint32_t l, uint32_t h)
{
    return P->kv[which] + (((size_t)l * P->H + h) * P->T) * P->D;
}

/* X [T][F] of layers [l0, l1) and heads [h0, h1): a row is token t's
 * vectors, layer-major then head-major. */
static float *gather(const premise_t *P, int which, uint32_t l0, uint32_t l1, uint32_t h0,
                     uint32_t h1, uint32_t *F)
{
    uint32_t f = (l1 - l0) * (h1 - h0) * P->D;
    float *x = xmalloc((size_t)P->T * f * sizeof *x);
    for (uint32_t t = 0; t < P->T; t++) {
        float *row = x + (size_t)t * f;
        for (uint32_t l = l0; l < l1; l++)
            for (uint32_t h = h0; h < h1; h++, row += P->D)
                memcpy(row, rows_of(P, which, l, h) + (size_t)t * P->D, P->D * sizeof *row);
    }
    *F = f;
    return x;
}

/* Eigen-decomposition of x^T x (f x f): vectors in rows of *vec (may be
 * NULL: values only, then the smaller of x^T x and x x^T is used). */
static double *spectrum(const float *x, uint32_t t, uint32_t f, double **vec, uint32_t *n_out)
{
    uint32_t n = f;
    double *g;
    if (!vec && f > t) { /* same nonzero eigenvalues from x x^T */
        float *xt = xmalloc((size_t)t * f * sizeof *xt);
        for (uint32_t r = 0; r < t; r++)
            for (uint32_t c = 0; c < f; c++)
                xt[(size_t)c * t + r] = x[(size_t)r * f + c];
        n = t;
        g = xmalloc((size_t)n * n * sizeof *g);
        kv_eig_gram(xt, f, t, t, g);
        free(xt);
    } else {
        g = xmalloc((size_t)n * n * sizeof *g);
        kv_eig_gram(x, t, f, f, g);
    }
    double *w = xmalloc(n * sizeof *w), *work = xmalloc(2 * (size_t)n * sizeof *work);
    if ((vec ? kv_eig_sym : kv_eig_values)(n, g, w, work)) {
        fprintf(stderr, "kv_eig_sym failed (n = %u)\n", n);
        exit(1);
    }
    free(work);
    if (vec)
        *vec = g;
    else
        free(g);
    *n_out = n;
    return w;
}

static uint32_t rank95(const premise_t *P, int which, uint32_t l0, uint32_t l1, uint32_t h0,
                       uint32_t h1)
{
    uint32_t f, n;
    float *x = gather(P, which, l0, l1, h0, h1, &f);
    double *w = spectrum(x, P->T, f, NULL, &n);
    uint32_t r = kv_eig_rank(w, n, 0.95);
    free(x);
    free(w);
    return r;
}

/* Mean rank of single layers, and the mean of (sum of the g layers' ranks
 * / the group's rank) over full groups of g, for K or V, over all heads
 * (per_head 0) or per head. */
static void ranks(const premise_t *P, int which, int per_head, uint32_t g, double *single,
                  double *group_rank, double *shared)
{
    uint32_t nh = per_head ? P->H : 1, groups = P->L / g;
    double s1 = 0.0, sg = 0.0, ratio = 0.0;
    for (uint32_t h = 0; h < nh; h++)
        for (uint32_t q = 0; q < groups; q++) {
            uint32_t h0 = per_head ? h : 0, h1 = per_head ? h + 1 : P->H, sum = 0;
            for (uint32_t l = q * g; l < q * g + g; l++)
                sum += rank95(P, which, l, l + 1, h0, h1);
            uint32_t rg = g > 1 ? rank95(P, which, q * g, q * g + g, h0, h1) : sum;
            s1 += (double)sum / g;
            sg += rg;
            ratio += (double)sum / rg;
        }
    *single = s1 / (nh * groups);
    *group_rank = sg / (nh * groups);
    *shared = ratio / (nh * groups);
}

/* Perplexity of the continuation on sequence seq (holding the context),
 * which the session takes over. */
static double cont_ppl(premise_t *P, kv_seq_id_t seq)
{
    kv_model_session_opts_t so = {.store = P->st, .max_ctx = P->T + P->cont, .chunk = 256,
                                  .n_threads = 0};
    kv_model_session_t *s = NULL;
    CHECK_OK(kv_model_session_adopt(P->m, &so, seq, P->T, &s));
    if (!s)
        exit(1);
    uint32_t vocab = kv_model_hparams(P->m)->vocab;
    float *logits = xmalloc((size_t)P->cont * vocab * sizeof *logits);
    CHECK_OK(kv_model_forward(s, P->ids + P->T, P->cont, logits, P->cont));
    double nll = 0.0;
    for (uint32_t i = 0; i + 1 < P->cont; i++)
        nll += kv_model_nll(logits + (size_t)i * vocab, vocab, P->ids[P->T + i + 1]);
    free(logits);
    kv_model_session_free(s);
    return exp(nll / (P->cont - 1));
}

/* How a projection chooses each group's rank: r = g F / ratio when ratio
 * > 0, else the smallest rank keeping `energy` of the group's ||X||_F^2. */
typedef struct proj_rule {
    int per_head;  /* one basis per kv head (1) or for all heads (0) */
    uint32_t g;    /* adjacent layers per group */
    double ratio;  /* > 0: fixed compression of the coefficients */
    double energy; /* ratio 0: energy kept, (0, 1] */
    int mask;      /* 1: project K, 2: V, 3: both */
    int pre_rope;  /* K projected before RoPE (undone, then redone) */
    int qweight;   /* K's basis in the metric of the context's queries  */
} proj_rule_t;

/* Collect the context's queries: cq[l][h] += q q^T for every row and q
 * head of kv head h (the model's pre-attention hook). */
static int collect_q(void *user, kv_model_layer_io_t *io)
{
    premise_t *P = user;
    uint32_t nq = P->H * P->group;
    for (uint32_t r = 0; r < io->n; r++)
        for (uint32_t qh = 0; qh < nq; qh++) {
            const float *q = io->q + ((size_t)r * nq + qh) * P->D;
            double *c = P->cq + (((size_t)io->layer * P->H + qh / P->group) * P->D) * P->D;
            for (uint32_t i = 0; i < P->D; i++)
                for (uint32_t j = 0; j < P->D; j++)
                    c[i * P->D + j] += (double)q[i] * q[j];
        }
    return 0;
}

/* S = C^(1/2) and its inverse C^(-1/2) (eigenvalues floored at 1e-6 of
 * the largest) of the query second moment of (layer l, kv head h). */
static void q_metric(const premise_t *P, uint32_t l, uint32_t h, double *S, double *Si)
{
    uint32_t D = P->D;
    double *a = xmalloc((size_t)D * D * sizeof *a), w[1024], work[2048];
    memcpy(a, P->cq + ((size_t)l * P->H + h) * D * D, (size_t)D * D * sizeof *a);
    if (kv_eig_sym(D, a, w, work))
        exit(1);
    double floor_ = 1e-6 * w[0];
    for (uint32_t i = 0; i < D; i++)
        for (uint32_t j = 0; j < D; j++) {
            double s = 0.0, si = 0.0;
            for (uint32_t k = 0; k < D; k++) {
                double lam = w[k] > floor_ ? w[k] : floor_;
                double u = a[(size_t)k * D + i] * a[(size_t)k * D + j];
                s += u * sqrt(lam);
                si += u / sqrt(lam);
            }
            S[i * D + j] = s;
            Si[i * D + j] = si;
        }
    free(a);
}

/* Rows x [T][f] (blocks of D: layer-major, head-major as gather makes
 * them) times the per-block matrices M[b] (D x D, symmetric). */
static void blocks_times(const premise_t *P, float *x, uint32_t f, double *const *M)
{
    uint32_t D = P->D;
    double tmp[1024];
    for (uint32_t t = 0; t < P->T; t++)
        for (uint32_t b = 0; b < f / D; b++) {
            float *xb = x + (size_t)t * f + (size_t)b * D;
            for (uint32_t j = 0; j < D; j++) {
                double s = 0.0;
                for (uint32_t i = 0; i < D; i++)
                    s += xb[i] * M[b][i * D + j];
                tmp[j] = s;
            }
            for (uint32_t j = 0; j < D; j++)
                xb[j] = (float)tmp[j];
        }
}

/* RoPE as the model applies it (pairs 2i, 2i+1 of a head rotate by
 * pos * theta^(-2i/D)), forward (sign 1) or undone (sign -1), in place on
 * the rows x [T][D] at positions 0 .. T-1 (row t at x + t * stride). */
static void rope_rows(const premise_t *P, float *x, size_t stride, double sign)
{
    for (uint32_t t = 0; t < P->T; t++)
        for (uint32_t i = 0; i < P->D / 2; i++) {
            double a = sign * t * pow((double)P->rope_theta, -2.0 * i / P->D);
            double c = cos(a), s = sin(a), x0 = x[t * stride + 2 * i], x1 = x[t * stride + 2 * i + 1];
            x[t * stride + 2 * i] = (float)(x0 * c - x1 * s);
            x[t * stride + 2 * i + 1] = (float)(x0 * s + x1 * c);
        }
}

/* A sequence holding the context with every group of the rule projected
 * on the top eigenvectors of its X^T X (K and V separately, those of the
 * mask; the others are copied as read). *ratio_out: FP16 numbers over stored
 * coefficients for the projected tensors (bases not counted). */
static kv_seq_id_t projected(premise_t *P, const proj_rule_t *R, double *ratio_out)
{
    size_t per_layer = (size_t)P->T * P->H * P->D;
    float *out[2] = {xmalloc(P->L * per_layer * sizeof(float)),
                     xmalloc(P->L * per_layer * sizeof(float))};
    uint32_t nh = R->per_head ? P->H : 1;
    double fp16 = 0.0, coefs = 0.0;
    for (int which = 0; which < 2; which++) {
        if (!(R->mask & (1 << which))) { /* not projected: the FP16 rows as read */
            for (uint32_t l = 0; l < P->L; l++)
                for (uint32_t h = 0; h < P->H; h++)
                    for (uint32_t t = 0; t < P->T; t++)
                        memcpy(out[which] + l * per_layer + ((size_t)t * P->H + h) * P->D,
                               rows_of(P, which, l, h) + (size_t)t * P->D,
                               P->D * sizeof(float));
            continue;
        }
        for (uint32_t l0 = 0; l0 < P->L; l0 += R->g)
            for (uint32_t h = 0; h < nh; h++) {
                uint32_t l1 = l0 + R->g < P->L ? l0 + R->g : P->L;
                uint32_t h0 = R->per_head ? h : 0, h1 = R->per_head ? h + 1 : P->H, f, n;
                int src = which == 0 && R->pre_rope ? 2 : which;
                float *x = gather(P, src, l0, l1, h0, h1, &f);
                int qw = which == 0 && R->qweight;
                double *S[64], *Si[64]; /* per D-block of the row */
                if (qw) {
                    uint32_t b = 0;
                    for (uint32_t l = l0; l < l1; l++)
                        for (uint32_t hh = h0; hh < h1; hh++, b++) {
                            S[b] = xmalloc((size_t)P->D * P->D * sizeof(double));
                            Si[b] = xmalloc((size_t)P->D * P->D * sizeof(double));
                            q_metric(P, l, hh, S[b], Si[b]);
                        }
                    blocks_times(P, x, f, S); /* y = x C^(1/2) */
                }
                double *vec = NULL, *w = spectrum(x, P->T, f, &vec, &n);
                uint32_t r = R->ratio > 0.0 ? (uint32_t)lround(f / R->ratio)
                                            : kv_eig_rank(w, n, R->energy);
                fp16 += f;
                coefs += r;
                double *coef = xmalloc(f * sizeof *coef), *row = xmalloc(f * sizeof *row);
                for (uint32_t t = 0; t < P->T; t++) {
                    const float *xt = x + (size_t)t * f;
                    for (uint32_t j = 0; j < r; j++) {
                        double s = 0.0;
                        for (uint32_t i = 0; i < f; i++)
                            s += vec[(size_t)j * f + i] * xt[i];
                        coef[j] = s;
                    }
                    for (uint32_t i = 0; i < f; i++)
                        row[i] = 0.0;
                    for (uint32_t j = 0; j < r; j++)
                        for (uint32_t i = 0; i < f; i++)
                            row[i] += coef[j] * vec[(size_t)j * f + i];
                    if (qw) { /* back: x^ = y^ C^(-1/2) */
                        for (uint32_t b = 0; b < f / P->D; b++) {
                            double tmp[1024];
                            for (uint32_t j = 0; j < P->D; j++) {
                                double sum = 0.0;
                                for (uint32_t i = 0; i < P->D; i++)
                                    sum += row[b * P->D + i] * Si[b][i * P->D + j];
                                tmp[j] = sum;
                            }
                            memcpy(row + b * P->D, tmp, P->D * sizeof *tmp);
                        }
                    }
                    /* scatter back: layer-major, then head-major */
                    uint32_t i = 0;
                    for (uint32_t l = l0; l < l1; l++)
                        for (uint32_t hh = h0; hh < h1; hh++)
                            for (uint32_t d = 0; d < P->D; d++)
                                out[which][l * per_layer + ((size_t)t * P->H + hh) * P->D + d] =
                                    (float)row[i++];
                }
                for (uint32_t b = 0; qw && b < f / P->D; b++) {
                    free(S[b]);
                    free(Si[b]);
                }
                if (src == 2) /* back to post-RoPE */
                    for (uint32_t l = l0; l < l1; l++)
                        for (uint32_t hh = h0; hh < h1; hh++)
                            rope_rows(P, out[0] + l * per_layer + (size_t)hh * P->D,
                                      (size_t)P->H * P->D, 1.0);
                free(coef);
                free(row);
                free(vec);
                free(w);
                free(x);
            }
    }
    kv_seq_id_t seq;
    CHECK_OK(kv_seq_create(P->st, &seq));
    for (uint32_t l = 0; l < P->L; l++)
        CHECK_OK(kv_append(P->st, seq, l, P->T, KV_DTYPE_F32, out[0] + l * per_layer,
                           out[1] + l * per_layer, NULL));
    free(out[0]);
    free(out[1]);
    *ratio_out = coefs > 0.0 ? fp16 / coefs : 1.0;
    return seq;
}

/* Project under rule R, print its row, return the perplexity. */
static double fidelity_row(premise_t *P, const proj_rule_t *R, double ppl0)
{
    double ratio;
    double ppl = cont_ppl(P, projected(P, R, &ratio));
    char rule[32];
    if (R->ratio > 0.0)
        snprintf(rule, sizeof rule, "ratio %g", R->ratio);
    else
        snprintf(rule, sizeof rule, "energy %g", R->energy);
    printf("%-9s %2u %-6s %-13s %7.2fx %10.4f %+8.2f%%\n", R->per_head ? "head" : "all heads",
           R->g,
           R->mask == 3 ? (R->pre_rope ? "K'+V" : "K+V")
           : R->mask == 1 ? (R->pre_rope ? "K'" : R->qweight ? "K(q)" : "K")
                          : "V",
           rule, ratio, ppl,
           100.0 * (ppl / ppl0 - 1.0));
    fflush(stdout);
    return ppl;
}

static int32_t *text_ids(const kv_tok_t *tok, size_t *n)
{
    FILE *f = fopen(TEXT_PATH, "rb");
    if (!f)
        KV_TEST_SKIP(TEXT_PATH " is not there");
    static char text[1 << 17];
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    size_t cap = len + 16;
    int32_t *ids = xmalloc(cap * sizeof *ids);
    if (kv_tok_encode(tok, text, len, 0, ids, cap, n))
        exit(1);
    return ids;
}

int main(int argc, char **argv)
{
    premise_t P = {0};
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress: a row as it is measured */
    P.T = argc > 1 ? (uint32_t)atoi(argv[1]) : 384;
    P.cont = argc > 2 ? (uint32_t)atoi(argv[2]) : 48;
    /* extra: only what full adds to the default (all heads in groups of 8,
     * K and V apart, energy ranks, pre-RoPE K) */
    int extra = argc > 3 && !strcmp(argv[3], "extra");
    int full = extra || (argc > 3 && !strcmp(argv[3], "full"));
    if (P.T < 64 || P.cont < 2 || (argc > 3 && !full)) {
        fprintf(stderr, "usage: test_xkv_premise [ctx >= 64 [cont >= 2 [full|extra]]]\n");
        return 2;
    }
    kv_tok_t *tok = NULL;
    P.m = kvt_load(&tok);
    const kv_model_hparams_t *hp = kv_model_hparams(P.m);
    P.L = hp->n_layers;
    P.H = hp->n_kv_heads;
    P.D = hp->head_dim;
    size_t n_ids;
    int32_t *ids = text_ids(tok, &n_ids);
    if (n_ids < (size_t)P.T + P.cont) {
        fprintf(stderr, "the text has %zu tokens, fewer than %u\n", n_ids, P.T + P.cont);
        return 1;
    }
    P.ids = ids;

    kv_config_t cfg;
    CHECK_OK(kv_model_store_config(P.m, P.T + P.cont, 3, 0, &cfg));
    CHECK_OK(kv_store_create(&cfg, &P.st));
    if (!P.st)
        return 1;

    /* the context through the model, its K/V read back */
    double t0 = now();
    kv_model_session_opts_t so = {.store = P.st, .max_ctx = P.T + P.cont, .chunk = 256};
    kv_model_session_t *a = NULL;
    CHECK_OK(kv_model_session_create(P.m, &so, &a));
    P.group = hp->n_q_heads / hp->n_kv_heads;
    P.cq = calloc((size_t)P.L * P.H * P.D * P.D, sizeof *P.cq);
    if (!P.cq)
        return 1;
    kv_model_hook_t hook = {.pre_attn = collect_q, .user = &P};
    if (full)
        kv_model_session_set_hook(a, &hook);
    CHECK_OK(kv_model_forward(a, ids, P.T, NULL, 0));
    kv_seq_id_t sa;
    CHECK_OK(kv_model_session_seq(a, &sa));
    for (int w = 0; w < 2; w++)
        P.kv[w] = xmalloc((size_t)P.L * P.H * P.T * P.D * sizeof(float));
    for (uint32_t l = 0; l < P.L; l++)
        for (uint32_t h = 0; h < P.H; h++)
            CHECK_OK(kv_read(P.st, sa, l, h, 0, P.T, (float *)rows_of(&P, 0, l, h),
                             (float *)rows_of(&P, 1, l, h), NULL));
    kv_model_session_free(a);
    P.rope_theta = hp->rope_theta;
    P.kv[2] = xmalloc((size_t)P.L * P.H * P.T * P.D * sizeof(float));
    memcpy(P.kv[2], P.kv[0], (size_t)P.L * P.H * P.T * P.D * sizeof(float));
    for (uint32_t l = 0; l < P.L; l++)
        for (uint32_t h = 0; h < P.H; h++)
            rope_rows(&P, (float *)rows_of(&P, 2, l, h), P.D, -1.0);
    printf("xkv premise: SmolLM2-135M, %u tokens of GPL-3 (context), %u scored after it; "
           "%u layers x %u kv heads x %u (post-RoPE K)\n", P.T, P.cont, P.L, P.H, P.D);

    double cos_sum = 0.0;
    for (uint32_t l = 1; l < P.L; l++)
        for (uint32_t h = 0; h < P.H; h++)
            for (uint32_t t = 0; t < P.T; t++) {
                const float *x = rows_of(&P, 0, l - 1, h) + (size_t)t * P.D,
                            *y = rows_of(&P, 0, l, h) + (size_t)t * P.D;
                double xy = 0.0, xx = 0.0, yy = 0.0;
                for (uint32_t d = 0; d < P.D; d++) {
                    xy += (double)x[d] * y[d];
                    xx += (double)x[d] * x[d];
                    yy += (double)y[d] * y[d];
                }
                cos_sum += xx > 0.0 && yy > 0.0 ? xy / sqrt(xx * yy) : 0.0;
            }
    printf("mean cosine of a token's K in adjacent layers (same head): %.3f\n",
           cos_sum / ((P.L - 1) * P.H * P.T));

    /* 1. ranks at 95% energy */
    printf("\nrank keeping 95%% of the energy: one layer, and a group of g adjacent layers\n");
    printf("%-3s %-9s %2s %9s %12s %10s %8s\n", "kv", "features", "g", "one layer", "g layers sum",
           "group", "shared");
    static const uint32_t gs[] = {2, 4, 8};
    double shared4[2] = {0};
    static const char *const names[3] = {"K", "V", "K'"};
    for (int which = 0; which < 3; which++)
        for (int per_head = 1; per_head >= 0; per_head--)
            for (size_t gi = 0; gi < 3; gi++) {
                if (gs[gi] == 8 && !per_head ? !full : extra)
                    continue;
                double single, grp, shared;
                ranks(&P, which, per_head, gs[gi], &single, &grp, &shared);
                printf("%-3s %-9s %2u %9.1f %12.1f %10.1f %7.2fx\n", names[which],
                       per_head ? "head" : "all heads", gs[gi], single, single * gs[gi], grp,
                       shared);
                if (gs[gi] == 4 && !per_head && which < 2)
                    shared4[which] = shared;
            }
    CHECK(extra || shared4[0] >= 1.5);
    CHECK(extra || shared4[1] >= 1.5);
    printf("(%.1f s so far)\n", now() - t0);

    /* 2. fidelity of the projection */
    kv_seq_id_t base;
    CHECK_OK(kv_seq_create(P.st, &base));
    for (uint32_t l = 0; l < P.L; l++) { /* the FP16 context again, [T][H][D] */
        float *k = xmalloc((size_t)P.T * P.H * P.D * sizeof *k),
              *v = xmalloc((size_t)P.T * P.H * P.D * sizeof *v);
        for (uint32_t h = 0; h < P.H; h++)
            for (uint32_t t = 0; t < P.T; t++) {
                memcpy(k + ((size_t)t * P.H + h) * P.D, rows_of(&P, 0, l, h) + (size_t)t * P.D,
                       P.D * sizeof *k);
                memcpy(v + ((size_t)t * P.H + h) * P.D, rows_of(&P, 1, l, h) + (size_t)t * P.D,
                       P.D * sizeof *v);
            }
        CHECK_OK(kv_append(P.st, base, l, P.T, KV_DTYPE_F32, k, v, NULL));
        free(k);
        free(v);
    }
    double ppl0 = cont_ppl(&P, base);
    printf("\nperplexity of the %u tokens after the context: FP16 %.4f\n", P.cont, ppl0);
    printf("%-9s %2s %-6s %-13s %8s %10s %9s\n", "features", "g", "kv", "rank rule",
           "ratio", "ppl", "dppl");
    proj_rule_t exact = {.per_head = 1, .g = 4, .ratio = 1.0, .mask = 3};
    CHECK(fabs(fidelity_row(&P, &exact, ppl0) / ppl0 - 1.0) < 1e-3); /* = FP16 */
    static const double ratios[] = {2.0, 4.0, 8.0};
    for (int per_head = 1; per_head >= 0; per_head--)
        for (uint32_t g = 1; g <= 8; g *= 2) {
            if (g == 2 || (!full && (g != 4 || !per_head)) || (extra && (g != 8 || per_head)))
                continue;
            double prev = 0.0;
            for (size_t ri = 0; ri < 3; ri++) {
                proj_rule_t R = {.per_head = per_head, .g = g, .ratio = ratios[ri], .mask = 3};
                double ppl = fidelity_row(&P, &R, ppl0);
                CHECK(ppl >= prev * 0.99); /* more compression, not better */
                prev = ppl;
            }
        }
    if (full) { /* K and V apart, ranks by energy, K before RoPE */
        static const double energies[] = {0.99, 0.999};
        for (int mask = 1; mask <= 3; mask++)
            for (size_t ei = 0; ei < 2; ei++) {
                proj_rule_t R = {.per_head = 1, .g = 4, .energy = energies[ei], .mask = mask};
                fidelity_row(&P, &R, ppl0);
            }
        for (int mask = 1; mask <= 2; mask++)
            for (size_t ri = 0; ri < 2; ri++) {
                proj_rule_t R = {.per_head = 1, .g = 4, .ratio = ratios[ri], .mask = mask};
                fidelity_row(&P, &R, ppl0);
            }
        proj_rule_t pre = {.per_head = 1, .g = 4, .ratio = 1.0, .mask = 1, .pre_rope = 1};
        CHECK(fabs(fidelity_row(&P, &pre, ppl0) / ppl0 - 1.0) < 1e-3); /* RoPE undone/redone */
        for (size_t ri = 0; ri < 3; ri++) { /* K before RoPE */
            proj_rule_t R = {.per_head = 1, .g = 4, .ratio = ratios[ri], .mask = 1,
                             .pre_rope = 1};
            fidelity_row(&P, &R, ppl0);
        }
        proj_rule_t qwx = {.per_head = 1, .g = 4, .ratio = 1.0, .mask = 1, .qweight = 1};
        CHECK(fabs(fidelity_row(&P, &qwx, ppl0) / ppl0 - 1.0) < 1e-3); /* metric undone */
        for (int per_head = 1; per_head >= 0; per_head--)
            for (size_t ri = 0; ri < 3; ri++) { /* K in the queries' metric */
                proj_rule_t R = {.per_head = per_head, .g = per_head ? 4 : 8,
                                 .ratio = ratios[ri], .mask = 1, .qweight = 1};
                fidelity_row(&P, &R, ppl0);
            }
    }
    printf("(%.1f s in all)\n", now() - t0);

    for (int w = 0; w < 3; w++)
        free(P.kv[w]);
    free(P.cq);
    free(ids);
    kv_store_destroy(P.st);
    kv_tok_destroy(tok);
    kv_model_free(P.m);
    return kv_test_end();
}
