/* SPDX-License-Identifier: MIT */
/*
 * test_model_eattn.c — Expected Attention (eattn) and AdaKV budgets on the
 * real model (SmolLM2-135M-Instruct), short context.
 *
 * Perplexity: the first 256 tokens of GPL-3 (Debian base-files) prefilled,
 * the next 24 teacher-forced one step at a time (tools/kvpage/eval_run.c,
 * what `kvpage eval --tasks ppl` runs), under fp16 and under eattn with the
 * model's own RoPE base (kv_model_hparams: theta) at c = 0.5, and at
 * c = 0.25 with ada=1 and +int4. Each must be finite and within a loose sanity
 * bound of fp16's (at most 2x fp16's perplexity: a broken scorer that keeps
 * arbitrary tokens at 4x is far past that on this model, see below), and
 * must hold fewer KV bytes than fp16. A budget above the prompt
 * (c=100000) must give fp16's NLL bit for bit: collecting query moments
 * changes nothing. The measured perplexities are printed, not asserted.
 * Greedy decoding of a passkey prompt under eattn:c=0.5 produces tokens.
 * Skipped (77) without the model.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_model_test.h"
#include "tools/kvpage/eval_policy.h"
#include "tools/kvpage/eval_run.h"

#define PREFILL 256u
#define STEPS 24u

typedef struct result {
    double ppl;
    uint64_t kv_bytes;
} result_t;

static result_t ppl_of(const eval_env_t *env, const char *spec, const int32_t *ids)
{
    eval_policy_t p;
    char err[320];
    result_t res = {NAN, 0};
    if (eval_policy_parse(spec, &p, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        CHECK(0);
        return res;
    }
    float *lg = malloc((size_t)kv_model_hparams(env->m)->vocab * sizeof *lg);
    CHECK(lg != NULL);
    eval_run_t r;
    CHECK_OK(eval_run_start(env, &p, ids, PREFILL, PREFILL + STEPS, NULL, NULL, 0, lg, &r));
    eval_steps_t s = {.force = ids + PREFILL, .n = STEPS, .logits = lg};
    CHECK_OK(eval_run_prefill_end(&r, &p));
    CHECK_OK(eval_run_steps(&r, &p, &s));
    CHECK_OK(kv_store_check(r.st));
    kv_stats_t st = {.struct_size = sizeof st};
    CHECK_OK(kv_store_stats(r.st, &st));
    res.ppl = exp(s.nll / STEPS);
    res.kv_bytes = st.kv_bytes;
    fprintf(stderr, "%-60s ppl %8.4f  kv %7llu bytes\n", p.spec, res.ppl,
            (unsigned long long)st.kv_bytes);
    eval_run_close(&r);
    eval_policy_destroy(&p);
    free(lg);
    return res;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        KV_TEST_SKIP("/usr/share/common-licenses/GPL-3 is not there");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

int main(void)
{
    kv_tok_t *tok;
    kv_model_t *m = kvt_load(&tok);
    const double theta = kv_model_hparams(m)->rope_theta;
    eval_env_t env = {.m = m, .threads = 2};

    const char *text = read_text("/usr/share/common-licenses/GPL-3");
    static int32_t ids[1 << 15];
    size_t n = 0;
    int rc = kv_tok_encode(tok, text, strlen(text), 0, ids, sizeof ids / sizeof ids[0], &n);
    CHECK(rc == 0 || rc == KV_ERANGE);
    CHECK(n > PREFILL + STEPS + 1);

    result_t fp = ppl_of(&env, "fp16", ids);
    CHECK(isfinite(fp.ppl) && fp.ppl > 1);
    char spec[160];
    static const char *const forms[] = {
        "eattn:c=0.5,theta=%.17g",
        "eattn:c=0.25,ada=1,theta=%.17g+int4",
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        snprintf(spec, sizeof spec, forms[i], theta);
        result_t r = ppl_of(&env, spec, ids);
        CHECK(isfinite(r.ppl) && r.ppl > 1);
        CHECK(r.ppl <= 2.0 * fp.ppl); /* loose sanity bound */
        CHECK(r.kv_bytes < fp.kv_bytes);
    }
    snprintf(spec, sizeof spec, "eattn:c=100000,theta=%.17g", theta);
    result_t all = ppl_of(&env, spec, ids); /* nothing evicted */
    CHECK(all.ppl == fp.ppl);
    CHECK_EQ(all.kv_bytes, fp.kv_bytes);

    /* greedy decoding under eattn */
    char user[4096] = "Remember the pass key. ";
    for (int i = 0; i < 6; i++)
        strcat(user, i == 3 ? "The pass key is 48213. Remember it. "
                            : "The grass is green. The sky is blue. The sun is yellow. ");
    strcat(user, "What is the pass key? Answer with the number only.");
    uint32_t np;
    int32_t *prompt = kvt_chat(tok, user, &np);
    eval_policy_t p;
    snprintf(spec, sizeof spec, "eattn:c=0.5,theta=%.17g", theta);
    CHECK_OK(eval_policy_parse(spec, &p, NULL, 0));
    float *lg = malloc((size_t)kv_model_hparams(m)->vocab * sizeof *lg);
    eval_run_t r;
    CHECK_OK(eval_run_start(&env, &p, prompt, np, np + 16, NULL, NULL, 0, lg, &r));
    eval_steps_t s = {.n = 6, .tok = tok, .logits = lg};
    CHECK_OK(eval_run_prefill_end(&r, &p));
    CHECK_OK(eval_run_steps(&r, &p, &s));
    CHECK(s.n_out > 0);
    char outs[256];
    size_t on = 0;
    if (!kv_tok_decode(tok, s.out, s.n_out, outs, sizeof outs - 1, &on))
        outs[on] = '\0';
    else
        outs[0] = '\0';
    fprintf(stderr, "eattn:c=0.5 greedy (%u tokens): \"%s\"\n", s.n_out, outs);
    CHECK_OK(kv_store_check(r.st));
    eval_run_close(&r);
    eval_policy_destroy(&p);
    free(lg);
    free(prompt);
    kv_tok_destroy(tok);
    kv_model_free(m);
    return kv_test_end();
}
