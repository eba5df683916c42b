/* SPDX-License-Identifier: MIT */
/*
 * stress_gen.h — the workload generator of `kvpage stress`: a seeded RNG,
 * Poisson arrivals, request lengths (a ShareGPT-like log-normal, fixed, or
 * uniform), and the K/V values of every token.
 *
 * Values are never stored by the stress tool: the K and V of the token at
 * position `pos` of (layer, head) first appended by the sequence incarnation
 * `origin` are a pure function of (seed, origin, layer, head, pos), so the
 * shadow of a sequence is a few integers and the verifier regenerates what
 * kv_read must return. Every element is i / 1024 for an integer i in
 * [-1024, 1023]: inside [-A, A] with A = STRESS_VAL_A = 1 and exact in FP16
 * (and FP32), so FP16 pages must return them bit for bit.
 *
 * Everything here is deterministic given the seed; nothing allocates.
 */
#ifndef STRESS_GEN_H
#define STRESS_GEN_H

#include <stddef.h>
#include <stdint.h>

#define STRESS_VAL_A 1.0   /* |generated element| <= A               */
#define STRESS_LEN_MAX 8192u /* longest prompt or output a dist makes  */

/* splitmix64 step: the next 64 random bits of *s. */
uint64_t stress_rng_next(uint64_t *s);
/* Uniform in [0, 1). */
double stress_rng_unit(uint64_t *s);
/* Uniform integer in [0, n), n >= 1. */
uint32_t stress_rng_below(uint64_t *s, uint32_t n);
/* Poisson-distributed count with mean lambda (0 <= lambda <= 64). */
uint32_t stress_rng_poisson(uint64_t *s, double lambda);

typedef enum stress_dist_kind {
    STRESS_DIST_SHAREGPT = 0, /* log-normal, clipped, means 161 in / 338 out */
    STRESS_DIST_FIXED = 1,    /* fixed:N,M                                   */
    STRESS_DIST_UNIFORM = 2,  /* uniform:a-b,c-d (inclusive)                 */
} stress_dist_kind_t;

/* Request length distribution; index 0 = prompt tokens, 1 = output tokens. */
typedef struct stress_dist {
    stress_dist_kind_t kind;
    uint32_t lo[2], hi[2]; /* tokens: clip range (SHAREGPT), range (UNIFORM), */
                           /* lo == hi (FIXED); 1 <= lo <= hi <= LEN_MAX     */
    double mu[2], sigma[2]; /* SHAREGPT: log-normal of ln(tokens)            */
} stress_dist_t;

/* The ShareGPT-like distribution's target means and shapes. */
#define STRESS_SHAREGPT_MEAN_IN 161.0
#define STRESS_SHAREGPT_MEAN_OUT 338.0
#define STRESS_SHAREGPT_SIGMA_IN 1.0
#define STRESS_SHAREGPT_SIGMA_OUT 0.9
#define STRESS_SHAREGPT_MAX 1024u /* clip: prompt and output each in [4, 1024] */

/* Parse "sharegpt", "fixed:N,M" or "uniform:a-b,c-d". Returns 0, or -1 with
 * a message in err. */
int stress_dist_parse(const char *spec, stress_dist_t *d, char *err, size_t err_len);
/* Draw one request: len[0] prompt tokens, len[1] output tokens. */
void stress_dist_sample(const stress_dist_t *d, uint64_t *rng, uint32_t len[2]);
/* The analytic mean of len[i] (SHAREGPT: of the clipped log-normal). */
double stress_dist_mean(const stress_dist_t *d, int i);

/* The K and V rows ([head_dim] each) of one token; see the top comment. */
void stress_gen_token(uint64_t seed, uint64_t origin, uint32_t layer, uint32_t head,
                      int32_t pos, uint32_t head_dim, float *k, float *v);
/* Uniform values in [-1, 1) for queries (not verified, only attended). */
void stress_gen_fill(uint64_t *rng, float *x, size_t n);
/* IEEE binary16 bits of x, which must be exactly representable (as every
 * generated element is). */
uint16_t stress_gen_half(float x);

#endif /* STRESS_GEN_H */
