/* SPDX-License-Identifier: MIT */
/*
 * kvbench_model.c — SmolLM2-135M prefill and decode speed with its KV cache
 * in kvpage pages, against the model's dense-attention path (K/V in a
 * plain array) measured in the same run.
 *
 * For each context length (default 512 and 4096) and each page format
 * (fp16, int4, int2 via kv_config_t.kv_format): a fresh store and session prefill `ctx`
 * prompt tokens in chunks of 256 (kv_attn_prefill per layer per chunk),
 * then decode --decode tokens greedily (kv_attn_decode per layer). The same
 * is done with a dense session. Figures:
 *   prefill_tokens_per_s   ctx / prefill wall time
 *   decode_tokens_per_s    decode steps / decode wall time, at ctx..ctx+N
 *   batch_decode_tokens_per_s  --batch B sessions forked from the prefilled
 *                          one (copy-on-write: they share the prompt's
 *                          pages) decoding together through
 *                          kv_model_decode_batch for --decode steps:
 *                          B * steps / wall time (0 with --batch 0 or 1)
 *   *_vs_dense             paged / dense (1.0 = no overhead from paging)
 *   decode_bound_tokens_per_s  the weight-streaming bound of a decode step
 *                          measured in the same run: read_gb_per_s (the
 *                          best of a few passes of a --threads-thread
 *                          streaming read over a 256 MiB buffer, far larger
 *                          than the LLC, before and after the runs) /
 *                          weight_bytes_per_token (kv_model_decode_weight_bytes)
 *   decode_vs_bound        decode_tokens_per_s / that bound
 *   batch_decode_vs_bound  batched steps per second / that bound (a step
 *                          reads the weights once for all B sessions)
 *   kv_bytes, fp16_bytes   store statistics after decoding
 *   loadavg                1-minute load average before and after: figures
 *                          from a machine busier than its cores are noise.
 * The prompt is a fixed pseudo-random sequence of ordinary token ids (the
 * speed does not depend on the text).
 *
 * Usage: kvbench-model [--json] [--threads N] [--ctx N[,N...]] [--decode N]
 *                      [--batch B] [--model FILE] [--no-dense]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_model.h"
#include "kvpage/kvpage.h"

#define MAX_CTX_ARGS 8
#define MAX_BATCH 64 /* --batch: sessions decoded together */

typedef struct bench_opts {
    int json, dense;
    int threads;
    uint32_t ctx[MAX_CTX_ARGS], n_ctx, decode, batch;
    const char *model;
} bench_opts_t;

typedef struct bench_res {
    double prefill_tps, decode_tps, batch_tps;
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

/* ---- read bandwidth: n_threads workers each sum one slice of a buffer --- */

#define BW_BYTES ((size_t)256 << 20)

typedef struct bw_job {
    const uint64_t *buf;
    size_t words_per_unit;
    uint64_t sums[64]; /* per unit, so the reads are not optimized away */
} bw_job_t;

static void bw_unit(void *arg, size_t u, uint32_t worker)
{
    (void)worker;
    bw_job_t *j = arg;
    const uint64_t *p = j->buf + u * j->words_per_unit;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < j->words_per_unit; i += 4) {
        a += p[i], b += p[i + 1], c += p[i + 2], d += p[i + 3];
    }
    j->sums[u % 64] = a + b + c + d;
}

/* GB/s (1e9 bytes) of the best of 5 passes, 0 on failure. */
static double read_bandwidth(kv_workers_t *ws, uint32_t threads)
{
    uint64_t *buf = malloc(BW_BYTES);
    if (!buf)
        return 0;
    memset(buf, 1, BW_BYTES); /* fault the pages in */
    const uint32_t units = threads ? threads : kv_workers_size(ws);
    bw_job_t j = {.buf = buf, .words_per_unit = BW_BYTES / 8 / units / 4 * 4};
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now_s();
        kv_workers_run(ws, threads, units, bw_unit, &j);
        double gbs = (double)(j.words_per_unit * 8 * units) / (now_s() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    free(buf);
    return best;
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
    *o = (bench_opts_t){.dense = 1, .ctx = {512, 4096}, .n_ctx = 2, .decode = 32, .batch = 4};
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
        } else if (!strcmp(a, "--batch") && v && !parse_u32(v, 0, MAX_BATCH, &u)) {
            o->batch = u;
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
                            "[--decode N] [--batch B] [--model FILE] [--no-dense]\n");
            return -1;
        }
    }
    return 0;
}

/* Decode o->decode steps greedily for the nb sessions sess[0..nb) together,
 * each from the token `first`: r->batch_tps. */
static int run_batch(kv_model_session_t *const *sess, uint32_t nb, const bench_opts_t *o,
                     uint32_t V, int32_t first, bench_res_t *r)
{
    float *lg = malloc((size_t)nb * V * sizeof *lg);
    int32_t tok[MAX_BATCH];
    if (!lg)
        return KV_ENOMEM;
    for (uint32_t b = 0; b < nb; b++)
        tok[b] = first;
    int rc = 0;
    const double t0 = now_s();
    for (uint32_t i = 0; i < o->decode && !rc; i++) {
        rc = kv_model_decode_batch(sess, nb, tok, lg);
        for (uint32_t b = 0; b < nb && !rc; b++)
            tok[b] = kv_model_argmax(lg + (size_t)b * V, V);
    }
    r->batch_tps = (double)nb * o->decode / (now_s() - t0);
    free(lg);
    return rc;
}

/* Prefill ctx tokens then decode n greedily, alone and (--batch B > 1) as B
 * forks of the prefilled session decoding together. fmt: the store's
 * kv_format (full residual groups convert to it), or -1 for the dense path. */
static int run_one(const kv_model_t *m, const bench_opts_t *o, uint32_t ctx, int fmt,
                   const int32_t *prompt, bench_res_t *r)
{
    const int paged = fmt >= 0;
    const uint32_t total = ctx + o->decode, V = kv_model_hparams(m)->vocab;
    const uint32_t nb = o->batch > 1 ? o->batch : 0;
    kv_store_t *st = NULL;
    kv_config_t cfg;
    int rc = 0;
    if (paged && ((rc = kv_model_store_config(m, total, 1 + nb, (uint32_t)o->threads, &cfg)) ||
                  (cfg.kv_format = (uint32_t)fmt, rc = kv_store_create(&cfg, &st))))
        return rc;
    kv_model_session_opts_t so = {.store = st, .max_ctx = total, .n_threads = o->threads};
    kv_model_session_t *s = NULL, *forks[MAX_BATCH] = {NULL};
    float *lg = malloc((size_t)V * sizeof *lg);
    if (!lg || (rc = kv_model_session_create(m, &so, &s)))
        goto done;
    double t0 = now_s();
    if ((rc = kv_model_forward(s, prompt, ctx, lg, 1)))
        goto done;
    r->prefill_tps = ctx / (now_s() - t0);
    for (uint32_t b = 0; b < nb && !rc; b++)
        rc = kv_model_session_fork(s, &forks[b]);
    const int32_t first = kv_model_argmax(lg, V);
    t0 = now_s();
    for (uint32_t i = 0; i < o->decode && !rc; i++)
        rc = kv_model_decode(s, kv_model_argmax(lg, V), lg);
    r->decode_tps = o->decode / (now_s() - t0);
    if (!rc && nb)
        rc = run_batch(forks, nb, o, V, first, r);
    if (st) {
        kv_stats_t ss = {.struct_size = sizeof ss};
        kv_store_stats(st, &ss);
        r->kv_bytes = ss.kv_bytes;
        r->fp16_bytes = ss.fp16_bytes;
        r->pages_used = ss.pages_used;
    }
done:
    for (uint32_t b = 0; b < nb; b++)
        kv_model_session_free(forks[b]);
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
    kv_workers_t *bw_ws = NULL;
    if (kv_workers_create((uint32_t)o.threads, &bw_ws))
        return 1;
    const double bw0 = read_bandwidth(bw_ws, (uint32_t)o.threads);
    const double wbytes = (double)kv_model_decode_weight_bytes(m);
    if (o.json)
        printf("{\"bench\":\"model\",\"model\":\"%s\",\"threads\":%d,\"decode_steps\":%u,"
               "\"batch\":%u,\"weight_bytes_per_token\":%.0f,\"results\":[", KV_MODEL_FILE_NAME,
               o.threads, o.decode, o.batch > 1 ? o.batch : 0, wbytes);
    else
        printf("%-6s %6s %14s %14s %12s %12s %14s %12s %14s %12s\n", "format", "ctx",
               "prefill tok/s", "decode tok/s", "prefill/dense", "decode/dense", "kv_bytes",
               "decode/bound", "batch tok/s", "batch/bound");
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
            const double bound = bw0 * 1e9 / wbytes;
            const double bsteps = o.batch > 1 ? r.batch_tps / o.batch : 0;
            if (o.json)
                printf("%s{\"format\":\"%s\",\"ctx\":%u,\"prefill_tokens_per_s\":%.2f,"
                       "\"decode_tokens_per_s\":%.2f,\"decode_bound_tokens_per_s\":%.2f,"
                       "\"decode_vs_bound\":%.3f,\"batch_decode_tokens_per_s\":%.2f,"
                       "\"batch_decode_vs_bound\":%.3f,\"dense_prefill_tokens_per_s\":%.2f,"
                       "\"dense_decode_tokens_per_s\":%.2f,\"prefill_vs_dense\":%.3f,"
                       "\"decode_vs_dense\":%.3f,\"kv_bytes\":%llu,\"fp16_bytes\":%llu,"
                       "\"pages_used\":%llu}",
                       first ? "" : ",", formats[f].name, o.ctx[c], r.prefill_tps, r.decode_tps,
                       bound, r.decode_tps / bound, r.batch_tps, bsteps / bound,
                       dense.prefill_tps, dense.decode_tps, pr, dr,
                       (unsigned long long)r.kv_bytes, (unsigned long long)r.fp16_bytes,
                       (unsigned long long)r.pages_used);
            else
                printf("%-6s %6u %14.1f %14.1f %12.3f %12.3f %14llu %12.3f %14.1f %12.3f\n",
                       formats[f].name, o.ctx[c], r.prefill_tps, r.decode_tps, pr, dr,
                       (unsigned long long)r.kv_bytes, r.decode_tps / bound, r.batch_tps,
                       bsteps / bound);
            first = 0;
        }
    }
    const double bw1 = read_bandwidth(bw_ws, (uint32_t)o.threads);
    kv_workers_destroy(bw_ws);
    if (o.json)
        printf("],\"read_gb_per_s\":[%.2f,%.2f],\"loadavg\":[%.2f,%.2f]}\n", bw0, bw1, load0,
               loadavg());
    else
        printf("(weights %.1f MB per decode token; read bandwidth %.2f GB/s before, %.2f after: "
               "bound %.1f tok/s; loadavg %.2f -> %.2f)\n", wbytes / 1e6, bw0, bw1,
               bw0 * 1e9 / wbytes, load0, loadavg());
    free(prompt);
    kv_model_free(m);
    return ret;
}
