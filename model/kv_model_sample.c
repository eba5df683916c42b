/* SPDX-License-Identifier: MIT */
/*
 * kv_model_sample.c — turning logits into tokens and scores: argmax (ties to
 * the lowest id), temperature sampling with a caller-held xorshift64* state
 * (reproducible for a seed), and the negative log-likelihood of a target.
 * Sums run in double, in index order.
 */
#include <math.h>

#include "kv_model.h"

int32_t kv_model_argmax(const float *logits, uint32_t vocab)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return (int32_t)best;
}

static double next_unit(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return (double)((x * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t kv_model_sample(const float *logits, uint32_t vocab, float temp, uint64_t *rng)
{
    if (!(temp > 0) || !rng)
        return kv_model_argmax(logits, vocab);
    float mx = logits[kv_model_argmax(logits, vocab)];
    double sum = 0;
    for (uint32_t i = 0; i < vocab; i++)
        sum += exp((double)(logits[i] - mx) / temp);
    double u = next_unit(rng) * sum, acc = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        acc += exp((double)(logits[i] - mx) / temp);
        if (acc > u)
            return (int32_t)i;
    }
    return kv_model_argmax(logits, vocab); /* u rounded to the very top */
}

double kv_model_nll(const float *logits, uint32_t vocab, int32_t target)
{
    float mx = logits[kv_model_argmax(logits, vocab)];
    double sum = 0;
    for (uint32_t i = 0; i < vocab; i++)
        sum += exp((double)(logits[i] - mx));
    return log(sum) - (double)(logits[target] - mx);
}
