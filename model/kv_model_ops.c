/* SPDX-License-Identifier: MIT */
/*
 * kv_model_ops.c — the elementwise pieces of the forward pass: RMSNorm,
 * RoPE, SwiGLU, residual add. Rows are independent; a row is one work unit
 * computed in a fixed order, so results do not depend on the thread count.
 */
#include <math.h>

#include "kv_model_int.h"

typedef struct rms_job {
    const float *x, *w;
    float *y;
    uint32_t d;
    float eps;
} rms_job_t;

static void rms_unit(void *arg, size_t t, uint32_t worker)
{
    const rms_job_t *j = arg;
    const float *xr = j->x + t * j->d;
    float *yr = j->y + t * j->d;
    double ss = 0;
    for (uint32_t i = 0; i < j->d; i++)
        ss += (double)xr[i] * xr[i];
    float r = (float)(1.0 / sqrt(ss / j->d + j->eps));
    for (uint32_t i = 0; i < j->d; i++)
        yr[i] = xr[i] * r * j->w[i];
}

/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for n rows of d values. */
void kv_model_rmsnorm(const float *x, const float *w, float *y, uint32_t n, uint32_t d,
                      float eps, kv_workers_t *workers, uint32_t n_threads)
{
    rms_job_t j = {.x = x, .w = w, .y = y, .d = d, .eps = eps};
    kv_workers_run(workers, n_threads, n, rms_unit, &j);
}

/* The rotation of each row's position: cos then sin of pos * inv_freq[i]
 * (computed in double, rounded once), i < hd / 2, for n rows; shared by q,
 * k and every layer of a step. */
void kv_model_rope_table(const int32_t *pos, uint32_t n, uint32_t hd, const double *inv_freq,
                         float *tab)
{
    for (uint32_t t = 0; t < n; t++, tab += hd)
        for (uint32_t i = 0; i < hd / 2; i++) {
            double a = (double)pos[t] * inv_freq[i];
            tab[i] = (float)cos(a);
            tab[hd / 2 + i] = (float)sin(a);
        }
}

typedef struct rope_job {
    float *x;
    uint32_t heads, hd;
    const float *tab;
} rope_job_t;

static void rope_unit(void *arg, size_t t, uint32_t worker)
{
    (void)worker;
    const rope_job_t *j = arg;
    const float *cs = j->tab + t * j->hd, *sn = cs + j->hd / 2;
    for (uint32_t h = 0; h < j->heads; h++) {
        float *v = j->x + (t * j->heads + h) * j->hd;
        for (uint32_t i = 0; i < j->hd / 2; i++) {
            float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * cs[i] - b * sn[i];
            v[2 * i + 1] = a * sn[i] + b * cs[i];
        }
    }
}

/* RoPE as ggml applies it for llama ("normal" mode): within each head,
 * the pairs (2i, 2i+1) rotate by pos * theta^(-2i/hd). x: [n][heads][hd];
 * tab: kv_model_rope_table of the rows' positions. */
void kv_model_rope(float *x, uint32_t n, uint32_t heads, uint32_t hd, const float *tab,
                   kv_workers_t *workers, uint32_t n_threads)
{
    rope_job_t j = {.x = x, .heads = heads, .hd = hd, .tab = tab};
    kv_workers_run(workers, n_threads, n, rope_unit, &j);
}

typedef struct glu_job {
    float *gate;
    const float *up;
    size_t d;
} glu_job_t;

static void glu_unit(void *arg, size_t t, uint32_t worker)
{
    const glu_job_t *j = arg;
    float *g = j->gate + t * j->d;
    const float *u = j->up + t * j->d;
    for (size_t i = 0; i < j->d; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* gate = silu(gate) * up, elementwise, n rows of d. */
void kv_model_swiglu(float *gate, const float *up, uint32_t n, size_t d,
                     kv_workers_t *workers, uint32_t n_threads)
{
    glu_job_t j = {.gate = gate, .up = up, .d = d};
    kv_workers_run(workers, n_threads, n, glu_unit, &j);
}

void kv_model_add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}
