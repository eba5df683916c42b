/* SPDX-License-Identifier: MIT */
/*
 * cmd_demo.c — `kvpage demo`: a synthetic engine-like workload.
 *
 * Several sequences prefill a prompt (append K/V layer by layer, causal
 * prefill attention), one of them is forked for parallel sampling (pages
 * shared copy-on-write), then all decode token by token (append one token per
 * layer, batched decode attention). K, V and Q are pseudo-random (a fixed
 * seed). Prints a table of pages, bytes and attention throughput; --json /
 * --md FILE write the same figures as JSON / a Markdown table (kv_cli.h).
 * Uses only the public API.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cli.h"
#include "kvpage/kvpage.h"

typedef struct demo_opts {
    uint64_t seqs, prompt, decode, layers, q_heads, kv_heads, head_dim;
    uint64_t threads, forks, seed;
    kv_cli_outs_t out; /* --json, --md */
} demo_opts_t;

typedef struct demo_timing {
    double prefill_attn_s, decode_attn_s, wall_s;
    uint64_t prefill_tokens;   /* prompt tokens x layers attended as queries */
    uint64_t decode_queries;   /* sequence-steps x layers                    */
    uint64_t decode_kv_bytes;  /* FP16-equivalent K/V bytes read by decode   */
} demo_timing_t;

#define DEMO_U(name, field, lo, hi, arg, help) \
    {name, KV_CLI_UINT, offsetof(demo_opts_t, field), lo, hi, 0, 0, arg, help}
static const kv_cli_opt_t demo_opts[] = {
    DEMO_U("--seqs", seqs, 1, 4096, "N", "sequences (default 8)"),
    DEMO_U("--prompt", prompt, 1, 1u << 20, "N", "prompt tokens per sequence (default 512)"),
    DEMO_U("--decode", decode, 0, 1u << 20, "N", "decode steps (default 128)"),
    DEMO_U("--forks", forks, 0, 4096, "N", "sequences forked after prefill (default 1)"),
    DEMO_U("--layers", layers, 1, 4096, "N", "layers (default 30, SmolLM2-135M)"),
    DEMO_U("--q-heads", q_heads, 1, 8192, "N", "query heads (default 9)"),
    DEMO_U("--kv-heads", kv_heads, 1, 1024, "N", "kv heads (default 3)"),
    DEMO_U("--head-dim", head_dim, 16, 1024, "N", "head dim (default 64)"),
    DEMO_U("--threads", threads, 0, 1024, "N", "attention threads (default: all CPUs)"),
    DEMO_U("--seed", seed, 0, UINT64_MAX, "N", "seed of the synthetic K/V/Q (default 1)"),
    KV_CLI_OUT_OPTS(demo_opts_t, out),
};

/* 0 ok, 1 help printed, 2 usage error. */
static int demo_parse(int argc, char **argv, demo_opts_t *o)
{
    *o = (demo_opts_t){.seqs = 8, .prompt = 512, .decode = 128, .layers = 30,
                       .q_heads = 9, .kv_heads = 3, .head_dim = 64,
                       .threads = 0, .forks = 1, .seed = 1};
    int rc = kv_cli_parse("demo", NULL, demo_opts, sizeof demo_opts / sizeof demo_opts[0],
                          argc, argv, o);
    if (rc)
        return rc;
    if (o->forks > o->seqs) {
        fprintf(stderr, "kvpage demo: --forks must not exceed --seqs\n");
        return 2;
    }
    return 0;
}

/* xorshift64*: values in [-1, 1). */
static void fill_random(float *x, size_t n, uint64_t *state)
{
    uint64_t s = *state;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        x[i] = (float)((s * 2685821657736338717ull) >> 40) * (1.0f / 8388608.0f) - 1.0f;
    }
    *state = s;
}

static int demo_fail(const char *what, int rc)
{
    fprintf(stderr, "\nkvpage demo: %s failed: %s (%d)\n", what, kv_strerror(rc), rc);
    return 1;
}

/* Prefill every sequence: per layer append the prompt's K/V, then prefill
 * attention over it. */
static int demo_prefill(kv_store_t *st, const demo_opts_t *o, const kv_seq_id_t *seqs,
                        float *buf, uint64_t *rng, demo_timing_t *t)
{
    const size_t kv_n = o->prompt * o->kv_heads * o->head_dim;
    const size_t q_n = o->prompt * o->q_heads * o->head_dim;
    float *k = buf, *v = k + kv_n, *q = v + kv_n, *out = q + q_n;
    for (uint64_t s = 0; s < o->seqs; s++) {
        if (o->out.plain)
            fprintf(stderr, "\rprefill: sequence %llu/%llu", (unsigned long long)s + 1,
                    (unsigned long long)o->seqs);
        for (uint64_t l = 0; l < o->layers; l++) {
            fill_random(k, 2 * kv_n + q_n, rng);
            int rc = kv_append(st, seqs[s], (uint32_t)l, (uint32_t)o->prompt,
                               KV_DTYPE_F32, k, v, NULL);
            if (rc)
                return demo_fail("kv_append (prefill)", rc);
            kv_prefill_t pf = {.layer = (uint32_t)l, .seq = seqs[s],
                               .n_new = (uint32_t)o->prompt, .q = q, .out = out};
            double t0 = kv_cli_now();
            rc = kv_attn_prefill(st, &pf);
            t->prefill_attn_s += kv_cli_now() - t0;
            if (rc)
                return demo_fail("kv_attn_prefill", rc);
            t->prefill_tokens += o->prompt;
        }
    }
    if (o->out.plain)
        fprintf(stderr, "\n");
    return 0;
}

/* Decode: every step, every layer: append one token per sequence, then one
 * batched decode attention over all of them. */
static int demo_decode(kv_store_t *st, const demo_opts_t *o, const kv_seq_id_t *seqs,
                       uint32_t n_seqs, float *buf, uint64_t *rng, demo_timing_t *t)
{
    const size_t kv_row = o->kv_heads * o->head_dim;
    const size_t q_n = (size_t)n_seqs * o->q_heads * o->head_dim;
    float *k = buf, *v = k + n_seqs * kv_row, *q = v + n_seqs * kv_row, *out = q + q_n;
    for (uint64_t step = 0; step < o->decode; step++) {
        if (o->out.plain && (step % 8 == 0 || step + 1 == o->decode))
            fprintf(stderr, "\rdecode: step %llu/%llu", (unsigned long long)step + 1,
                    (unsigned long long)o->decode);
        for (uint64_t l = 0; l < o->layers; l++) {
            fill_random(k, 2 * n_seqs * kv_row + q_n, rng);
            uint64_t kv_tokens = 0;
            for (uint32_t s = 0; s < n_seqs; s++) {
                int rc = kv_append(st, seqs[s], (uint32_t)l, 1, KV_DTYPE_F32,
                                   k + s * kv_row, v + s * kv_row, NULL);
                if (rc)
                    return demo_fail("kv_append (decode)", rc);
                for (uint32_t h = 0; h < o->kv_heads; h++) {
                    uint32_t len = 0;
                    kv_seq_len(st, seqs[s], (uint32_t)l, h, &len);
                    kv_tokens += len;
                }
            }
            kv_decode_t d = {.layer = (uint32_t)l, .batch = n_seqs, .seqs = seqs,
                             .q = q, .out = out};
            double t0 = kv_cli_now();
            int rc = kv_attn_decode(st, &d);
            t->decode_attn_s += kv_cli_now() - t0;
            if (rc)
                return demo_fail("kv_attn_decode", rc);
            t->decode_queries += n_seqs;
            t->decode_kv_bytes += kv_tokens * 2u * o->head_dim * 2u;
        }
    }
    if (o->out.plain && o->decode)
        fprintf(stderr, "\n");
    return 0;
}

/* The fields of --json and --md. */
static void demo_fields(kv_cli_report_t *r, const demo_opts_t *o, const kv_stats_t *st,
                        const demo_timing_t *t, uint32_t threads, double pf_tps, double dq_ps,
                        double gbps)
{
    kv_cli_rep_s(r, "command", "demo");
    const char *const keys[] = {"seqs", "forks", "prompt", "decode", "layers", "q_heads",
                                "kv_heads", "head_dim"};
    const uint64_t vals[] = {o->seqs, o->forks, o->prompt, o->decode, o->layers, o->q_heads,
                             o->kv_heads, o->head_dim};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        kv_cli_rep_u(r, keys[i], vals[i]);
    kv_cli_rep_u(r, "threads", threads);
    kv_cli_rep_u(r, "page_bytes", st->page_bytes);
    kv_cli_rep_u(r, "pages_used", st->pages_used);
    kv_cli_rep_u(r, "pages_peak", st->pages_peak);
    kv_cli_rep_u(r, "pages_capacity", st->pages_capacity);
    kv_cli_rep_u(r, "tokens", st->tokens);
    kv_cli_rep_u(r, "kv_bytes", st->kv_bytes);
    kv_cli_rep_u(r, "fp16_bytes", st->fp16_bytes);
    kv_cli_rep_u(r, "meta_bytes", st->meta_bytes);
    kv_cli_rep_d(r, "prefill_tokens_per_s", pf_tps, 1);
    kv_cli_rep_d(r, "decode_queries_per_s", dq_ps, 1);
    kv_cli_rep_d(r, "decode_kv_gbps", gbps, 3);
    kv_cli_rep_d(r, "wall_s", t->wall_s, 3);
}

/* The table on stdout. */
static void demo_table(const demo_opts_t *o, const kv_stats_t *st, const demo_timing_t *t,
                       uint32_t threads, double pf_tps, double dq_ps, double gbps)
{
    printf("\nkvpage demo: %llu sequences (+%llu forked) x %llu prompt + %llu decode tokens, "
           "%llu layers, %llu q / %llu kv heads x %llu, %u threads, CPU backend\n\n",
           (unsigned long long)o->seqs, (unsigned long long)o->forks,
           (unsigned long long)o->prompt, (unsigned long long)o->decode,
           (unsigned long long)o->layers, (unsigned long long)o->q_heads,
           (unsigned long long)o->kv_heads, (unsigned long long)o->head_dim, threads);
    printf("  %-34s %16s\n", "metric", "value");
    printf("  %-34s %16u\n", "page bytes", st->page_bytes);
    printf("  %-34s %16llu\n", "pages used", (unsigned long long)st->pages_used);
    printf("  %-34s %16llu\n", "pages peak", (unsigned long long)st->pages_peak);
    printf("  %-34s %16llu\n", "pages capacity", (unsigned long long)st->pages_capacity);
    printf("  %-34s %16llu\n", "tokens held (seq x layer x head)", (unsigned long long)st->tokens);
    printf("  %-34s %16llu\n", "KV bytes in pages", (unsigned long long)st->kv_bytes);
    printf("  %-34s %16llu\n", "FP16 bytes, unpaged (same tokens)", (unsigned long long)st->fp16_bytes);
    printf("  %-34s %16.3f\n", "pages / unpaged FP16",
           st->fp16_bytes ? (double)st->kv_bytes / (double)st->fp16_bytes : 0.0);
    printf("  %-34s %16llu\n", "metadata bytes", (unsigned long long)st->meta_bytes);
    printf("  %-34s %16.0f\n", "prefill attention tokens/s", pf_tps);
    printf("  %-34s %16.0f\n", "decode attention queries/s", dq_ps);
    printf("  %-34s %16.2f\n", "decode attention KV GB/s", gbps);
    printf("  %-34s %16.2f\n", "wall seconds", t->wall_s);
    printf("\n(forked sequences share their prompt pages copy-on-write: "
           "pages / unpaged FP16 < 1 counts that saving)\n");
}

/* The table on stdout (unless --json or --md is -), then --json and --md:
 * 0, or 1 after a message (a write failed). */
static int demo_report(demo_opts_t *o, const kv_stats_t *st, const demo_timing_t *t,
                       uint32_t threads)
{
    double pf_tps = t->prefill_attn_s > 0 ? t->prefill_tokens / t->prefill_attn_s : 0;
    double dq_ps = t->decode_attn_s > 0 ? t->decode_queries / t->decode_attn_s : 0;
    double gbps = t->decode_attn_s > 0 ? t->decode_kv_bytes / t->decode_attn_s / 1e9 : 0;
    kv_cli_report_t r = {.cmd = "demo"};
    demo_fields(&r, o, st, t, threads, pf_tps, dq_ps, gbps);
    if (o->out.plain)
        demo_table(o, st, t, threads, pf_tps, dq_ps, gbps);
    return kv_cli_outs_finish("demo", &o->out, &r) ? 1 : 0;
}
static double gib(uint64_t b)
{
    return (double)b / (double)(1ull << 30);
}

/* The shape and sizes make a store this machine can hold (every pool page
 * of the demo gets used): else a message and 1 (a usage error). */
static int demo_fits(const demo_opts_t *o, const kv_config_t *cfg)
{
    kv_estimate_t e;
    int rc = kv_config_estimate(cfg, &e);
    if (rc == KV_EINVAL && o->q_heads % o->kv_heads) {
        fprintf(stderr, "kvpage demo: --q-heads (%llu) must be a multiple of --kv-heads "
                "(%llu)\n", (unsigned long long)o->q_heads, (unsigned long long)o->kv_heads);
        return 1;
    }
    if (rc) {
        fprintf(stderr, "kvpage demo: no store of this shape: %s; the pool needs %llu pages "
                "(sequences x layers x kv heads x pages per list; at most %u)\n",
                kv_strerror(rc), (unsigned long long)cfg->host_pages, 1u << 26);
        return 1;
    }
    if (e.kv_max > e.meta_cap || e.meta_max > e.meta_cap - e.kv_max) {
        fprintf(stderr, "kvpage demo: this run needs %.1f GiB of pages (%llu pages of %u "
                "bytes) and %.1f GiB of metadata; this machine has %.1f GiB of memory: "
                "use fewer --seqs, --prompt, --decode, --layers or --kv-heads, or a smaller "
                "--head-dim\n", gib(e.kv_max), (unsigned long long)cfg->host_pages,
                64u * cfg->head_dim, gib(e.meta_max), gib(e.meta_cap));
        return 1;
    }
    return 0;
}

int kv_cmd_demo(int argc, char **argv)
{
    demo_opts_t o;
    int prc = demo_parse(argc, argv, &o);
    if (prc)
        return prc == 1 ? 0 : 2;
    double wall0 = kv_cli_now();
    const uint32_t n_seqs = (uint32_t)(o.seqs + o.forks);
    const uint64_t tpp = 16; /* default page: 16 FP16 tokens */
    const uint64_t pages_per_list = (o.prompt + o.decode + tpp - 1) / tpp + 1;
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = (uint32_t)o.layers;
    cfg.n_q_heads = (uint32_t)o.q_heads;
    cfg.n_kv_heads = (uint32_t)o.kv_heads;
    cfg.head_dim = (uint32_t)o.head_dim;
    cfg.n_threads = (uint32_t)o.threads;
    cfg.max_seqs = n_seqs;
    cfg.host_pages = (uint64_t)n_seqs * o.layers * o.kv_heads * pages_per_list;
    if (demo_fits(&o, &cfg) || kv_cli_outs_open("demo", &o.out)) /* outputs before the work */
        return 2;
    kv_store_t *st = NULL;
    int rc = kv_store_create(&cfg, &st);
    if (rc) {
        kv_cli_outs_finish("demo", &o.out, NULL);
        return demo_fail("kv_store_create", rc);
    }
    kv_store_config(st, &cfg);

    size_t rows = o.prompt > n_seqs ? o.prompt : n_seqs;
    size_t buf_n = rows * (2 * o.kv_heads + 2 * o.q_heads) * o.head_dim;
    float *buf = malloc(buf_n * sizeof *buf);
    kv_seq_id_t *seqs = malloc(n_seqs * sizeof *seqs);
    demo_timing_t t = {0};
    uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull + 1;
    int ret = 1;
    if (!buf || !seqs) {
        fprintf(stderr, "kvpage demo: out of memory\n");
        goto done;
    }
    for (uint64_t s = 0; s < o.seqs; s++)
        if ((rc = kv_seq_create(st, &seqs[s]))) {
            demo_fail("kv_seq_create", rc);
            goto done;
        }
    if (demo_prefill(st, &o, seqs, buf, &rng, &t))
        goto done;
    for (uint64_t f = 0; f < o.forks; f++)
        if ((rc = kv_seq_fork(st, seqs[f], &seqs[o.seqs + f]))) {
            demo_fail("kv_seq_fork", rc);
            goto done;
        }
    if (demo_decode(st, &o, seqs, n_seqs, buf, &rng, &t))
        goto done;
    if ((rc = kv_store_check(st))) {
        demo_fail("kv_store_check", rc);
        goto done;
    }
    kv_stats_t stats = {.struct_size = sizeof stats};
    kv_store_stats(st, &stats);
    t.wall_s = kv_cli_now() - wall0;
    ret = demo_report(&o, &stats, &t, cfg.n_threads);
done:
    kv_cli_outs_finish("demo", &o.out, NULL); /* a failure: close what was opened */
    free(buf);
    free(seqs);
    kv_store_destroy(st);
    return ret;
}
