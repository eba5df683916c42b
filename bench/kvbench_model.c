/* SPDX-License-Identifier: MIT */
/*
 * kvbench_model.c — SmolLM2-135M prefill and decode speed with its KV cache
 * in kvpage pages, against the model's dense-attention path (K/V in a
 * plain array) measured in the same run.
 *
 * For each context length (default 1024 and 4096) and each page format
 * (fp16, int4, int2 via kv_config_t.kv_format): a fresh store and session prefill `ctx`
 * prompt tokens in chunks of 256 (kv_attn_prefill per layer per chunk),
 * then decode --decode tokens greedily (kv_attn_decode per layer). The same
 * is done with a dense session. Figures:
 *   prefill_tokens_per_s   ctx / prefill wall time
 *   decode_tokens_per_s    decode steps / decode wall time, at ctx..ctx+N
 *   *_vs_dense             paged / dense (1.0 = no overhead from paging)
 *   kv_bytes, fp16_bytes   store statistics after decoding
 *   loadavg                1-minute load average before and after: figures
 *                          from a machine busier than its cores are noise.
 * The prompt is a fixed pseudo-random sequence of ordinary token ids (the
 * speed does not depend on the text).
 *
 * Usage: kvbench-model [--json] [--threads N] [--ctx N[,N...]] [--decode N]
 *                      [--model FILE] [--no-dense]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_model.h"
#include "kvpage/kvpage.h"

#define MAX_CTX_ARGS 8

typedef struct bench_opts {
    int json, dense;
    int threads;
    uint32_t ctx[MAX_CTX_ARGS], n_ctx, decode;
    const char *model;
} bench_opts_t;

typedef struct bench_res {
    double prefill_tps, decode_tps;
    uint64_t kv_bytes, fp16_bytes, pages_used;
} bench_res_t;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || (*end && *end != ',') || v < lo || v > hi)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse(int argc, char **argv, bench_opts_t *o)
{
    *o = (bench_opts_t){.dense = 1, .ctx = {1024, 4096}, .n_ctx = 2, .decode = 32};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t u;
        if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--no-dense")) {
            o->dense = 0;
        } else if (!strcmp(a, "--threads") && v && !parse_u32(v, 0, 1024, &u)) {
            o->threads = (int)u;
            i++;
        } else if (!strcmp(a, "--decode") && v && !parse_u32(v, 1, 4096, &u)) {
            o->decode = u;
            i++;
        } else if (!strcmp(a, "--model") && v) {
            o->model = v;
            i++;
        } else if (!strcmp(a, "--ctx") && v) {
            o->n_ctx = 0;
            for (const char *p = v; p && *p && o->n_ctx < MAX_CTX_ARGS;) {
                if (parse_u32(p, 1, 8000, &o->ctx[o->n_ctx++]))
                    return -1;
                p = strchr(p, ',');
                p = p ? p + 1 : NULL;
            }
            i++;
        } else {
            fprintf(stderr, "usage: kvbench-model [--json] [--threads N] [--ctx N[,N...]] "
                            "[--decode N] [--model FILE] [--no-dense]\n");
            return -1;
        }
    }
    return 0;
}

/* Prefill ctx tokens then decode n greedily. fmt: the store's kv_format
 * (full residual groups convert to it), or -1 for the dense path. */
static int run_one(const kv_model_t *m, const bench_opts_t *o, uint32_t ctx, int fmt,
                   const int32_t *prompt, bench_res_t *r)
{
    const int paged = fmt >= 0;
    const uint32_t total = ctx + o->decode, V = kv_model_hparams(m)->vocab;
    kv_store_t *st = NULL;
    kv_config_t cfg;
    int rc = 0;
    if (paged && ((rc = kv_model_store_config(m, total, 1, (uint32_t)o->threads, &cfg)) ||
                  (cfg.kv_format = (uint32_t)fmt, rc = kv_store_create(&cfg, &st))))
        return rc;
    kv_model_session_opts_t so = {.store = st, .max_ctx = total, .n_threads = o->threads};
    kv_model_session_t *s = NULL;
    float *lg = malloc((size_t)V * sizeof *lg);
    if (!lg || (rc = kv_model_session_create(m, &so, &s)))
        goto done;
    double t0 = now_s();
    if ((rc = kv_model_forward(s, prompt, ctx, lg, 1)))
        goto done;
    r->prefill_tps = ctx / (now_s() - t0);
    t0 = now_s();
    for (uint32_t i = 0; i < o->decode && !rc; i++)
        rc = kv_model_decode(s, kv_model_argmax(lg, V), lg);
    r->decode_tps = o->decode / (now_s() - t0);
    if (st) {
        kv_stats_t ss;
        kv_store_stats(st, &ss);
        r->kv_bytes = ss.kv_bytes;
        r->fp16_bytes = ss.fp16_bytes;
        r->pages_used = ss.pages_used;
    }
done:
    kv_model_session_free(s);
    kv_store_destroy(st);
    free(lg);
    return rc ? rc : (lg ? 0 : KV_ENOMEM);
}

int main(int argc, char **argv)
{
    bench_opts_t o;
    if (parse(argc, argv, &o))
        return 2;
    char path[4096], err[512];
    int pinned;
    kv_model_t *m = NULL;
    if (kv_model_find(o.model, path, sizeof path, &pinned, err, sizeof err) ||
        kv_model_load(path, &m, err, sizeof err)) {
        fprintf(stderr, "kvbench-model: %s\n", err);
        return 1;
    }
    uint32_t max_ctx = 0;
    for (uint32_t i = 0; i < o.n_ctx; i++)
        max_ctx = o.ctx[i] > max_ctx ? o.ctx[i] : max_ctx;
    int32_t *prompt = malloc((size_t)max_ctx * sizeof *prompt);
    if (!prompt)
        return 1;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint32_t i = 0; i < max_ctx; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        prompt[i] = 200 + (int32_t)((x * 2685821657736338717ull >> 33) % 20000);
    }
    static const struct {
        const char *name;
        int fmt;
    } formats[] = {{"fp16", KV_FMT_FP16}, {"int4", KV_FMT_INT4}, {"int2", KV_FMT_INT2}};
    const double load0 = loadavg();
    if (o.json)
        printf("{\"bench\":\"model\",\"model\":\"%s\",\"threads\":%d,\"decode_steps\":%u,"
               "\"results\":[", KV_MODEL_FILE_NAME, o.threads, o.decode);
    else
        printf("%-6s %6s %14s %14s %12s %12s %14s\n", "format", "ctx", "prefill tok/s",
               "decode tok/s", "prefill/dense", "decode/dense", "kv_bytes");
    int first = 1, ret = 0;
    for (uint32_t c = 0; c < o.n_ctx; c++) {
        bench_res_t dense = {0};
        if (o.dense) {
            fprintf(stderr, "kvbench-model: ctx %u dense...\n", o.ctx[c]);
            int rc = run_one(m, &o, o.ctx[c], -1, prompt, &dense);
            if (rc) {
                fprintf(stderr, "kvbench-model: dense run failed: %s\n", kv_strerror(rc));
                ret = 1;
                break;
            }
        }
        for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
            bench_res_t r = {0};
            fprintf(stderr, "kvbench-model: ctx %u %s...\n", o.ctx[c], formats[f].name);
            int rc = run_one(m, &o, o.ctx[c], formats[f].fmt, prompt, &r);
            if (rc) {
                fprintf(stderr, "kvbench-model: %s run failed: %s\n", formats[f].name,
                        kv_strerror(rc));
                ret = 1;
                break;
            }
            double pr = dense.prefill_tps > 0 ? r.prefill_tps / dense.prefill_tps : 0;
            double dr = dense.decode_tps > 0 ? r.decode_tps / dense.decode_tps : 0;
            if (o.json)
                printf("%s{\"format\":\"%s\",\"ctx\":%u,\"prefill_tokens_per_s\":%.2f,"
                       "\"decode_tokens_per_s\":%.2f,\"dense_prefill_tokens_per_s\":%.2f,"
                       "\"dense_decode_tokens_per_s\":%.2f,\"prefill_vs_dense\":%.3f,"
                       "\"decode_vs_dense\":%.3f,\"kv_bytes\":%llu,\"fp16_bytes\":%llu,"
                       "\"pages_used\":%llu}",
                       first ? "" : ",", formats[f].name, o.ctx[c], r.prefill_tps, r.decode_tps,
                       dense.prefill_tps, dense.decode_tps, pr, dr,
                       (unsigned long long)r.kv_bytes, (unsigned long long)r.fp16_bytes,
                       (unsigned long long)r.pages_used);
            else
                printf("%-6s %6u %14.1f %14.1f %12.3f %12.3f %14llu\n", formats[f].name, o.ctx[c],
                       r.prefill_tps, r.decode_tps, pr, dr, (unsigned long long)r.kv_bytes);
            first = 0;
        }
    }
    if (o.json)
        printf("],\"loadavg\":[%.2f,%.2f]}\n", load0, loadavg());
    else
        printf("(loadavg %.2f -> %.2f)\n", load0, loadavg());
    free(prompt);
    kv_model_free(m);
    return ret;
}
