/* SPDX-License-Identifier: MIT */
/*
 * kv_model_gen.c — prompt + sampling loop shared by `kvpage run`, the tests
 * and the benchmark: prefill the prompt, then sample, report, feed back, one
 * token at a time. Times the two phases separately (wall clock).
 */
#include <stdlib.h>
#include <time.h>

#include "kv_model_int.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int is_stop(const kv_model_gen_opts_t *o, int32_t id)
{
    for (uint32_t i = 0; i < o->n_stop; i++)
        if (o->stop[i] == id)
            return 1;
    return 0;
}

int kv_model_generate(kv_model_session_t *s, const int32_t *prompt, uint32_t n_prompt,
                      const kv_model_gen_opts_t *o, int32_t *out, kv_model_gen_result_t *res)
{
    if (!s || !prompt || !n_prompt || !o || (o->max_new && !out) || !res ||
        (o->n_stop && !o->stop))
        return KV_EINVAL;
    *res = (kv_model_gen_result_t){.n_prompt = n_prompt};
    const uint32_t V = s->m->hp.vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!logits)
        return KV_ENOMEM;
    uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    double t0 = now_s();
    int rc = kv_model_forward(s, prompt, n_prompt, logits, 1);
    res->prefill_s = now_s() - t0;
    t0 = now_s();
    while (!rc && res->n_new < o->max_new) {
        int32_t id = kv_model_sample(logits, V, o->temp, &rng);
        out[res->n_new++] = id;
        if (is_stop(o, id) || (o->on_token && o->on_token(o->user, id))) {
            res->stopped = 1;
            break;
        }
        if (res->n_new == o->max_new)
            break;
        if ((rc = kv_model_decode(s, id, logits)))
            break;
        res->n_decoded++;
    }
    res->decode_s = now_s() - t0;
    free(logits);
    return rc;
}
