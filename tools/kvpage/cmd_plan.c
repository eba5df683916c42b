/* SPDX-License-Identifier: MIT */
/*
 * cmd_plan.c — `kvpage plan`: KV-cache capacity planning per policy.
 *
 * Given a model (a preset or its shape as flags), a GPU (a preset or its
 * memory), the weights' size, a workload and a list of policies, prints per
 * policy the bytes per token, the concurrent sequences the KV pool holds,
 * the longest context of one sequence, pages per sequence, the closed-form
 * estimate beside the measured footprint, and the quality cost measured by
 * `kvpage eval` where a report exists. Footprints come from the real store
 * (plan_sim.h, plan_calc.h); docs/plan.md describes the method.
 *
 * KV_BIN_TO_RESULTS (the installed docs/results relative to the installed
 * binary) and KV_SOURCE_RESULTS (the source tree's) come from the build.
 *
 * Uses only the public API. Exit codes: 0 ok, 1 a simulation failed, 2
 * usage error (unknown preset, bad policy or workload, no room for a pool,
 * a shape whose smallest sequence does not fit the pool: plan_fits, before
 * any simulation).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kv_cli.h"
#include "plan_calc.h"
#include "plan_report.h"

typedef struct plan_opts {
    const char *model, *gpu, *policies, *workload, *eval_dir, *html, *json, *md;
    uint64_t layers, q_heads, kv_heads, head_dim, samples, seed, chunk, ctx_base;
    uint64_t concurrency, trained_ctx;
    double gpu_gib, weights_gb, params_b, reserve, lazy_frac, retain_frac, rate, decode_tps;
    double prefix_hit;      /* --prefix-hit F (0: off)                         */
    uint64_t prefix_groups; /* --prefix-groups N                               */
    int prefix_compressed;  /* --prefix-compressed                             */
    int plain; /* stdout gets the table: neither --json nor --md is - */
} plan_opts_t;

#define PLAN_U(name, field, lo, hi, arg, help) \
    {name, KV_CLI_UINT, offsetof(plan_opts_t, field), lo, hi, 0, 0, arg, help}
#define PLAN_D(name, field, lo, hi, arg, help) \
    {name, KV_CLI_DOUBLE, offsetof(plan_opts_t, field), 0, 0, lo, hi, arg, help}
#define PLAN_S(name, field, arg, help) \
    {name, KV_CLI_STR, offsetof(plan_opts_t, field), 0, 0, 0, 0, arg, help}
#define PLAN_O(name, field, help) \
    {name, KV_CLI_OUT, offsetof(plan_opts_t, field), 0, 0, 0, 0, "FILE", help}
static const kv_cli_opt_t plan_opts[] = {
    PLAN_S("--model", model, "NAME", "model preset (default SmolLM2-135M): SmolLM2-135M,\n"
           "Llama-2-7B, Llama-2-13B, Llama-3-8B, Llama-3-70B,\nMistral-7B, Qwen2.5-7B"),
    PLAN_U("--trained-ctx", trained_ctx, 1, UINT32_MAX, "N",
           "the model's trained context, tokens: caps max ctx\n"
           "(default the preset's max_position_embeddings)"),
    PLAN_U("--layers", layers, 1, 4096, "N", "layers (overrides the preset's)"),
    PLAN_U("--q-heads", q_heads, 1, 1u << 20, "N", "query heads"),
    PLAN_U("--kv-heads", kv_heads, 1, 1024, "N", "kv heads"),
    PLAN_U("--head-dim", head_dim, 16, 1024, "N", "head_dim (a multiple of 16)"),
    PLAN_D("--params-b", params_b, 1e-6, 1e5, "X",
           "parameters in billions (weights default to 2 bytes each)"),
    PLAN_S("--gpu", gpu, "NAME", "GPU preset (default H100-80G): H100-80G, H200-141G,\n"
           "A100-40G, A100-80G, L4-24G"),
    PLAN_D("--gpu-gib", gpu_gib, 0.001, 1e6, "X", "GPU memory in GiB (overrides --gpu)"),
    PLAN_D("--weights-gb", weights_gb, 0, 1e6, "X",
           "weights in GB (1e9 bytes; default: FP16 of the parameters)"),
    PLAN_D("--reserve", reserve, 0, 0.99, "F",
           "fraction of GPU memory kept for activations, CUDA\ncontext etc. (default 0.10)"),
    PLAN_S("--workload", workload, "DIST", "sharegpt (default; mean 161 in / 338 out),\n"
           "fixed:N,M or uniform:a-b,c-d (as kvpage stress)"),
    PLAN_U("--samples", samples, 1, PLAN_MAX_SAMPLES, "N",
           "sequences drawn from a distribution (default 16)"),
    PLAN_U("--seed", seed, 0, UINT64_MAX, "N", "seed of the draw (default 1)"),
    PLAN_D("--rate", rate, 0, 1e9, "R", "arrivals per second: target = R x mean output /\n"
           "--decode-tps (Little's law)"),
    PLAN_D("--decode-tps", decode_tps, 1e-3, 1e9, "S",
           "decode tokens per second per sequence (default 30)"),
    PLAN_U("--concurrency", concurrency, 1, UINT64_MAX, "N",
           "target concurrent sequences (overrides --rate)"),
    PLAN_S("--policies", policies, "LIST", "comma-separated policy specs (a piece starting\n"
           "with key= continues the previous spec; at most 16)\n"
           "(default fp16,kivi4,kivi2,minikv,minicache+int4,\nsimlayerkv)"),
    PLAN_D("--lazy-frac", lazy_frac, 0, 1, "F",
           "SimLayerKV: fraction of layers assumed lazy\n(default 0.55, the paper's Llama-3-8B)"),
    PLAN_D("--retain-frac", retain_frac, 0, 0.5, "F",
           "MiniCache: fraction of merged tokens assumed\nretained (default 0.05, the paper's)"),
    PLAN_D("--prefix-hit", prefix_hit, 0, 1, "F",
           "fraction of each prompt found in the prefix cache:\n"
           "also measure each sequence sharing its first F x prompt\n"
           "tokens with another (prefill saved, shared pages counted\n"
           "once; docs/plan.md)"),
    PLAN_U("--prefix-groups", prefix_groups, 1, 1u << 20, "N",
           "distinct shared prefixes in the pool at once (default 1)"),
    {"--prefix-compressed", KV_CLI_FLAG, offsetof(plan_opts_t, prefix_compressed), 0, 0, 0, 0,
     NULL, "with --prefix-hit: the shared prefixes are compressed\n"
           "contexts (compressed by the policy at their end and cached\n"
           "that way; docs/prefix.md, \"Compressed contexts\")"},
    PLAN_U("--chunk", chunk, 1, 1u << 16, "N", "prompt tokens per append (default 512)"),
    PLAN_U("--ctx-base", ctx_base, 64, 1u << 20, "N",
           "max-context probe prompt (default 2048; see docs)"),
    PLAN_S("--eval-dir", eval_dir, "DIR",
           "kvpage eval reports eval-*.json (default\n$KVPAGE_EVAL_DIR, else the installed or "
           "source\ntree's docs/results: docs/plan.md)"),
    PLAN_O("--json", json, KV_CLI_JSON_HELP),
    PLAN_O("--md", md, KV_CLI_MD_HELP),
    PLAN_S("--html", html, "FILE", "also write an HTML report with SVG charts"),
};

#define PLAN_SYNOPSIS                                                                   \
    "KV-cache capacity per policy, measured in the store: bytes per token, concurrent\n" \
    "sequences, longest context, pages per sequence, closed form, quality (docs/plan.md)"

/* 0 ok, 1 help printed, 2 usage error. */
static int plan_parse(int argc, char **argv, plan_opts_t *o)
{
    *o = (plan_opts_t){.model = "SmolLM2-135M", .gpu = "H100-80G", .workload = "sharegpt",
                       .policies = "fp16,kivi4,kivi2,minikv,minicache+int4,simlayerkv",
                       .samples = 16, .seed = 1, .chunk = 512,
                       .ctx_base = 2048, .gpu_gib = -1, .weights_gb = -1, .params_b = -1,
                       .reserve = 0.10, .lazy_frac = 0.55, .retain_frac = 0.05,
                       .decode_tps = 30, .prefix_groups = 1};
    int rc = kv_cli_parse("plan", PLAN_SYNOPSIS, plan_opts, sizeof plan_opts / sizeof plan_opts[0],
                          argc, argv, o);
    if (rc)
        return rc;
    if (o->prefix_compressed && !(o->prefix_hit > 0)) {
        fprintf(stderr, "kvpage plan: --prefix-compressed needs --prefix-hit\n");
        return 2;
    }
    return kv_cli_outs_check("plan", o->json, o->md, &o->plain);
}

/* The model and GPU of the options into in; 2 after a message. */
static int plan_setup(const plan_opts_t *o, plan_in_t *in, char *name, size_t name_len)
{
    const plan_model_t *m = plan_model_find(o->model);
    if (!m) {
        fprintf(stderr, "kvpage plan: unknown model '%s' (kvpage plan --help lists them)\n",
                o->model);
        return 2;
    }
    in->model = *m;
    if (o->layers || o->q_heads || o->kv_heads || o->head_dim) {
        in->model.layers = o->layers ? (uint32_t)o->layers : m->layers;
        in->model.q_heads = o->q_heads ? (uint32_t)o->q_heads : m->q_heads;
        in->model.kv_heads = o->kv_heads ? (uint32_t)o->kv_heads : m->kv_heads;
        in->model.head_dim = o->head_dim ? (uint32_t)o->head_dim : m->head_dim;
        snprintf(name, name_len, "%s (shape changed)", m->name);
        in->model.name = name;
    }
    if (o->trained_ctx)
        in->model.ctx_len = (uint32_t)o->trained_ctx;
    in->trained_ctx_given = o->trained_ctx != 0;
    if (o->params_b > 0)
        in->model.params = (uint64_t)llround(o->params_b * 1e9);
    const plan_gpu_t *g = plan_gpu_find(o->gpu);
    if (!g && o->gpu_gib < 0) {
        fprintf(stderr, "kvpage plan: unknown GPU '%s' (kvpage plan --help lists them)\n",
                o->gpu);
        return 2;
    }
    in->gpu_name = o->gpu_gib >= 0 ? "custom" : g->name;
    in->gpu_bytes = (o->gpu_gib >= 0 ? o->gpu_gib : g->gib) * 1073741824.0;
    in->weights_bytes = o->weights_gb >= 0 ? o->weights_gb * 1e9 : 2.0 * in->model.params;
    return 0;
}

/* Where the quality reports are, into buf (docs/plan.md, "Quality"):
 * --eval-dir, else $KVPAGE_EVAL_DIR — either must be a directory (2 after
 * a message otherwise) —, else the installed docs beside the executable
 * (<bin>/KV_BIN_TO_RESULTS), else the source tree the binary was built from
 * (KV_SOURCE_RESULTS); never the current directory. buf = "" when none
 * exists (quality n/a). */
static int plan_eval_dir(const char *given, char *buf, size_t len)
{
    const char *env = getenv("KVPAGE_EVAL_DIR");
    const char *dir = given ? given : env && *env ? env : NULL;
    struct stat st;
    buf[0] = 0;
    if (dir) {
        if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "kvpage plan: %s '%s' is not a directory\n",
                    given ? "--eval-dir" : "$KVPAGE_EVAL_DIR", dir);
            return 2;
        }
        snprintf(buf, len, "%s", dir);
        return 0;
    }
    if (!kv_cli_exe_path(KV_BIN_TO_RESULTS, buf, len) && !stat(buf, &st) && S_ISDIR(st.st_mode))
        return 0;
    if (!stat(KV_SOURCE_RESULTS, &st) && S_ISDIR(st.st_mode))
        snprintf(buf, len, "%s", KV_SOURCE_RESULTS);
    else
        buf[0] = 0;
    return 0;
}

/* The smallest sequence of the model's store -- one token, so one page in
 * each of its layers x kv heads lists, and its metadata (kv_config_estimate
 * of a one-sequence store holding exactly those pages) -- fits the KV pool:
 * 0, else a message with the bytes it needs and 2. Nothing is allocated. */
static int plan_fits(const plan_t *p)
{
    const plan_model_t *m = &p->in->model;
    kv_config_t cfg = kv_config_default();
    cfg.n_layers = m->layers;
    cfg.n_q_heads = m->q_heads;
    cfg.n_kv_heads = m->kv_heads;
    cfg.head_dim = m->head_dim;
    cfg.page_bytes = p->page_bytes;
    cfg.max_seqs = 1;
    cfg.host_pages = (uint64_t)m->layers * m->kv_heads;
    kv_estimate_t e;
    int rc = kv_config_estimate(&cfg, &e);
    if (rc) {
        fprintf(stderr, "kvpage plan: no store of this shape: %s\n", kv_strerror(rc));
        return 2;
    }
    double need = (double)e.kv_max + (double)e.meta_max;
    if (need <= p->pool_bytes)
        return 0;
    fprintf(stderr, "kvpage plan: the model cannot hold one sequence: a 1-token sequence "
            "takes a page in each of its %llu lists (layers x kv heads): %llu bytes of pages "
            "(%llu x %u) and %llu bytes of metadata, %.0f bytes (%.1f GiB) in all; the KV pool "
            "has %.0f bytes (%.1f GiB: GPU memory less --reserve and the weights)\n",
            (unsigned long long)cfg.host_pages, (unsigned long long)e.kv_max,
            (unsigned long long)cfg.host_pages, p->page_bytes, (unsigned long long)e.meta_max,
            need, need / 1073741824.0, p->pool_bytes, p->pool_bytes / 1073741824.0);
    return 2;
}

/* Split and parse --policies into sp; the count, or -1 after a message
 * (nothing left to destroy). */
static int plan_specs(const char *policies, plan_spec_t *sp)
{
    char list[4096], *specs[PLAN_MAX_POLICIES], err[512];
    int n = -1;
    if (strlen(policies) >= sizeof list)
        fprintf(stderr, "kvpage plan: --policies: longer than %zu bytes\n", sizeof list - 1);
    else if (snprintf(list, sizeof list, "%s", policies) >= 0 &&
             (n = kv_cli_split_specs("--policies", list, specs, PLAN_MAX_POLICIES)) == 0)
        fprintf(stderr, "kvpage plan: --policies is empty\n");
    for (int i = 0; i < n; i++)
        if (plan_spec_parse(specs[i], &sp[i], err, sizeof err)) {
            fprintf(stderr, "kvpage plan: %s\n", err);
            while (i > 0)
                plan_spec_destroy(&sp[--i]);
            return -1;
        }
    return n > 0 ? n : -1;
}

int kv_cmd_plan(int argc, char **argv)
{
    plan_opts_t o;
    int prc = plan_parse(argc, argv, &o);
    if (prc)
        return prc == 1 ? 0 : 2;
    char err[512] = "", name[96], eval_dir[4096];
    if (plan_eval_dir(o.eval_dir, eval_dir, sizeof eval_dir))
        return 2;
    plan_in_t in = {.workload = o.workload, .samples = (uint32_t)o.samples, .seed = o.seed,
                    .chunk = (uint32_t)o.chunk, .ctx_base = (uint32_t)o.ctx_base,
                    .lazy_frac = o.lazy_frac, .retain_frac = o.retain_frac, .rate = o.rate,
                    .decode_tps = o.decode_tps, .concurrency = o.concurrency,
                    .reserve = o.reserve, .curves = o.html != NULL,
                    .prefix_hit = o.prefix_hit, .prefix_groups = (uint32_t)o.prefix_groups,
                    .prefix_ctx = o.prefix_compressed,
                    .eval_dir = eval_dir[0] ? eval_dir : NULL};
    if (plan_setup(&o, &in, name, sizeof name))
        return 2;
    if (stress_dist_parse(o.workload, &in.dist, err, sizeof err)) {
        fprintf(stderr, "kvpage plan: --workload: %s\n", err);
        return 2;
    }
    plan_t p;
    int rc = plan_init(&in, &p);
    if (rc) {
        fprintf(stderr, "kvpage plan: %s\n",
                rc == KV_ERANGE ? "no KV pool left: weights and --reserve take the whole GPU"
                                : "the model shape is not one the store takes (query heads a "
                                  "multiple of kv heads, head_dim a multiple of 16)");
        return 2;
    }
    if (plan_fits(&p))
        return 2;
    plan_spec_t sp[PLAN_MAX_POLICIES];
    plan_result_t res[PLAN_MAX_POLICIES];
    int n = plan_specs(o.policies, sp);
    if (n < 0)
        return 2;
    /* outputs, opened before the work: --json, --md, --html */
    typedef int (*plan_writer_t)(FILE *, const plan_t *, const plan_result_t *, uint32_t);
    const char *paths[3] = {o.json, o.md, o.html};
    const char *names[3] = {"--json", "--md", "--html"};
    const plan_writer_t writers[3] = {plan_report_json, plan_report_md, plan_report_html};
    FILE *outs[3] = {NULL, NULL, NULL};
    int ret = 0;
    for (int k = 0; k < 3 && !ret; k++)
        if (paths[k] && !(outs[k] = kv_cli_out_open("plan", names[k], paths[k])))
            ret = 2;
    for (int i = 0; !ret && i < n; i++)
        if ((rc = plan_policy(&p, &sp[i], &res[i]))) {
            fprintf(stderr, "kvpage plan: simulating '%s' failed: %s\n", sp[i].given,
                    kv_strerror(rc));
            ret = 1;
        }
    if (!ret && o.plain && plan_report_table(stdout, &p, res, (uint32_t)n))
        ret = 1;
    for (int k = 0; k < 3; k++) {
        if (outs[k] && !ret && (writers[k](outs[k], &p, res, (uint32_t)n) |
                                kv_cli_out_close("plan", paths[k], outs[k])))
            ret = 1;
        else if (outs[k] && outs[k] != stdout && ret)
            fclose(outs[k]); /* the work failed: nothing written */
        outs[k] = NULL;
    }
    for (int i = 0; i < n; i++)
        plan_spec_destroy(&sp[i]);
    return ret;
}
