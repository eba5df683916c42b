/* SPDX-License-Identifier: MIT */
/*
 * stress_gen.c — RNG, Poisson arrivals, request length distributions and
 * token values for `kvpage stress` (see stress_gen.h).
 *
 * The ShareGPT-like distribution is a log-normal per length, clipped to
 * [4, STRESS_SHAREGPT_MAX] and rounded to whole tokens; mu is solved (by
 * bisection on the closed-form mean of the clipped log-normal) so that the
 * clipped means are 161 prompt and 338 output tokens, the ShareGPT V3
 * figures serving benchmarks quote. sigma (1.0 in, 0.9 out) gives the long
 * right tail of real chat traffic.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stress_gen.h"

static uint64_t gen_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t stress_rng_next(uint64_t *s)
{
    return gen_mix(*s += 0x9E3779B97F4A7C15ull);
}

double stress_rng_unit(uint64_t *s)
{
    return (double)(stress_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

uint32_t stress_rng_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(((stress_rng_next(s) >> 32) * (uint64_t)n) >> 32);
}

uint32_t stress_rng_poisson(uint64_t *s, double lambda)
{
    const double limit = exp(-lambda); /* Knuth: multiply uniforms until < e^-lambda */
    double p = 1.0;
    uint32_t k = 0;
    for (;;) {
        p *= stress_rng_unit(s);
        if (p <= limit)
            return k;
        k++;
    }
}

static double gen_normal(uint64_t *s)
{
    double u1 = 1.0 - stress_rng_unit(s), u2 = stress_rng_unit(s); /* u1 in (0, 1] */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static double gen_phi(double x)
{
    return 0.5 * erfc(-x / sqrt(2.0));
}

/* E[clip(exp(mu + sigma Z), a, b)]. */
static double gen_clipped_mean(double mu, double sigma, double a, double b)
{
    double al = (log(a) - mu) / sigma, be = (log(b) - mu) / sigma;
    return a * gen_phi(al) + b * (1.0 - gen_phi(be)) +
           exp(mu + 0.5 * sigma * sigma) * (gen_phi(be - sigma) - gen_phi(al - sigma));
}

static double gen_solve_mu(double mean, double sigma, double a, double b)
{
    double lo = log(a) - 10.0, hi = log(b) + 10.0;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (gen_clipped_mean(mid, sigma, a, b) < mean)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* "N" or "a-b" into [lo, hi]; 0 or -1. */
static int gen_range(const char *s, const char *end, int allow_range, uint32_t *lo,
                     uint32_t *hi)
{
    char buf[64];
    size_t n = (size_t)(end - s);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *dash = allow_range ? strchr(buf, '-') : NULL;
    if (allow_range && !dash)
        return -1;
    char *parts[2] = {buf, dash ? dash + 1 : buf};
    if (dash)
        *dash = 0;
    uint32_t v[2];
    for (int i = 0; i < 2; i++) {
        char *e = NULL;
        if (parts[i][0] < '0' || parts[i][0] > '9')
            return -1;
        unsigned long x = strtoul(parts[i], &e, 10);
        if (*e || x < 1 || x > STRESS_LEN_MAX)
            return -1;
        v[i] = (uint32_t)x;
    }
    if (v[0] > v[1])
        return -1;
    *lo = v[0];
    *hi = v[1];
    return 0;
}

int stress_dist_parse(const char *spec, stress_dist_t *d, char *err, size_t err_len)
{
    memset(d, 0, sizeof *d);
    if (!spec || !strcmp(spec, "sharegpt")) {
        const double mean[2] = {STRESS_SHAREGPT_MEAN_IN, STRESS_SHAREGPT_MEAN_OUT};
        const double sigma[2] = {STRESS_SHAREGPT_SIGMA_IN, STRESS_SHAREGPT_SIGMA_OUT};
        d->kind = STRESS_DIST_SHAREGPT;
        for (int i = 0; i < 2; i++) {
            d->lo[i] = 4;
            d->hi[i] = STRESS_SHAREGPT_MAX;
            d->sigma[i] = sigma[i];
            d->mu[i] = gen_solve_mu(mean[i], sigma[i], d->lo[i], d->hi[i]);
        }
        return 0;
    }
    int uniform = !strncmp(spec, "uniform:", 8);
    if (uniform || !strncmp(spec, "fixed:", 6)) {
        const char *a = spec + (uniform ? 8 : 6), *comma = strchr(a, ',');
        d->kind = uniform ? STRESS_DIST_UNIFORM : STRESS_DIST_FIXED;
        if (comma && !gen_range(a, comma, uniform, &d->lo[0], &d->hi[0]) &&
            !gen_range(comma + 1, comma + 1 + strlen(comma + 1), uniform, &d->lo[1],
                       &d->hi[1]))
            return 0;
    }
    snprintf(err, err_len,
             "bad distribution '%s': expected sharegpt, fixed:N,M or uniform:a-b,c-d "
             "(token counts 1..%u, a <= b)",
             spec, STRESS_LEN_MAX);
    return -1;
}

void stress_dist_sample(const stress_dist_t *d, uint64_t *rng, uint32_t len[2])
{
    for (int i = 0; i < 2; i++) {
        if (d->kind == STRESS_DIST_SHAREGPT) {
            double x = exp(d->mu[i] + d->sigma[i] * gen_normal(rng));
            x = x < d->lo[i] ? d->lo[i] : x > d->hi[i] ? d->hi[i] : x;
            len[i] = (uint32_t)lround(x);
        } else {
            len[i] = d->lo[i] + stress_rng_below(rng, d->hi[i] - d->lo[i] + 1);
        }
    }
}

double stress_dist_mean(const stress_dist_t *d, int i)
{
    if (d->kind == STRESS_DIST_SHAREGPT)
        return gen_clipped_mean(d->mu[i], d->sigma[i], d->lo[i], d->hi[i]);
    return 0.5 * ((double)d->lo[i] + (double)d->hi[i]);
}

void stress_gen_token(uint64_t seed, uint64_t origin, uint32_t layer, uint32_t head,
                      int32_t pos, uint32_t head_dim, float *k, float *v)
{
    uint64_t base = gen_mix(seed ^ gen_mix(origin + 0x9E3779B97F4A7C15ull)) ^
                    gen_mix(((uint64_t)layer << 48) ^ ((uint64_t)head << 32) ^ (uint32_t)pos);
    for (uint32_t i = 0; i < 2 * head_dim; i += 4) {
        uint64_t h = gen_mix(base + i);
        for (uint32_t j = 0; j < 4; j++) {
            float x = (float)((int)((h >> (16 * j)) & 2047) - 1024) * (1.0f / 1024.0f);
            uint32_t e = i + j;
            if (e < head_dim)
                k[e] = x;
            else
                v[e - head_dim] = x;
        }
    }
}

void stress_gen_fill(uint64_t *rng, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(stress_rng_next(rng) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

uint16_t stress_gen_half(float x)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0u;
    float a = fabsf(x);
    if (a == 0.0f)
        return sign;
    int e;
    float m = frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
    int be = e + 14;          /* biased exponent of 1.f x 2^(e-1) */
    if (be <= 0)              /* subnormal: units of 2^-24 */
        return (uint16_t)(sign | (uint16_t)ldexpf(a, 24));
    return (uint16_t)(sign | (uint16_t)(be << 10) | (uint16_t)((m * 2.0f - 1.0f) * 1024.0f));
}
