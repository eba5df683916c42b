/* SPDX-License-Identifier: MIT */
/*
 * plan_report.c — the table, JSON and Markdown renderings of a plan, and
 * the pieces every rendering shares (see plan_report.h; HTML is in
 * plan_html.c).
 */
#include "plan_report.h"
#include "kv_cli.h"

#include <errno.h>
#include <math.h>
#include <string.h>

const char *plan_report_ctx_method(plan_ctx_method_t m)
{
    switch (m) {
    case PLAN_CTX_EXACT:
        return "exact";
    case PLAN_CTX_EXTRAPOLATED:
        return "extrapolated";
    default:
        return "none";
    }
}

void plan_report_quality(const plan_quality_t *q, char *buf, size_t len)
{
    if (!q->have) {
        snprintf(buf, len, "n/a");
        return;
    }
    size_t n = 0;
    buf[0] = 0;
    if (q->have_ppl)
        n += (size_t)snprintf(buf, len, "dPPL %+.2f (ctx %.0f)", q->delta_ppl, q->ppl_ctx);
    for (int t = 0; t < PLAN_EVALQ_TASKS && n < len; t++)
        if (q->have_acc[t])
            n += (size_t)snprintf(buf + n, len - n, "%s%s %.2f", n ? ", " : "",
                                  plan_evalq_tasks[t], q->acc[t]);
}

char *plan_report_ctx(const plan_t *p, const plan_result_t *r, int seqs, char buf[32])
{
    if (seqs)
        snprintf(buf, 32, p->in->model.ctx_len ? "%llu" : "-",
                 (unsigned long long)r->seqs_at_ctx);
    else
        snprintf(buf, 32, "%llu%s", (unsigned long long)r->max_ctx,
                 r->ctx_capped ? " (cap)" : "");
    return buf;
}

/* ratio a / b, 0 when b is 0 */
static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

static double diff_pct(const plan_result_t *r)
{
    return isfinite(r->closed_bytes_per_token) && r->closed_bytes_per_token > 0
               ? 100.0 * (r->bytes_per_token / r->closed_bytes_per_token - 1.0)
               : NAN;
}

void plan_report_setup(FILE *f, const plan_t *p, const char *prefix)
{
    const plan_in_t *in = p->in;
    const plan_model_t *m = &in->model;
    fprintf(f, "%smodel %s: %u layers, %u query / %u kv heads, head_dim %u, "
            "weights %.2f GB\n", prefix, m->name, m->layers, m->q_heads, m->kv_heads,
            m->head_dim, in->weights_bytes / 1e9);
    fprintf(f, "%sGPU %s: %.2f GiB x (1 - %.2f reserve) - weights = KV pool %.2f GB = "
            "%llu pages of %u bytes\n", prefix, in->gpu_name, in->gpu_bytes / 1073741824.0,
            in->reserve, p->pool_bytes / 1e9, (unsigned long long)p->pool_pages,
            p->page_bytes);
    if (in->dist.kind == STRESS_DIST_FIXED)
        fprintf(f, "%sworkload %s: every sequence %u prompt + %u output tokens\n", prefix,
                in->workload, p->len[0][0], p->len[0][1]);
    else
        fprintf(f, "%sworkload %s: %u sequences drawn (seed %llu), mean %.1f prompt + %.1f "
                "output tokens\n", prefix, in->workload, p->n_samples,
                (unsigned long long)in->seed, p->mean_prompt, p->mean_out);
    fprintf(f, "%smax context: one sequence, the longest prompt that fits + %u output "
            "tokens", prefix, p->ctx_out);
    if (m->ctx_len)
        fprintf(f, ", capped at the model's trained context of %u tokens (%s: it attends no "
                "further); seqs@ctx: how many sequences of %u tokens the pool holds at once",
                m->ctx_len, in->trained_ctx_given ? "--trained-ctx" : "max_position_embeddings",
                m->ctx_len);
    fputc('\n', f);
    if (in->prefix_hit > 0) {
        fprintf(f, "%sprefix cache: %.2f of each prompt's tokens shared with a sequence before "
                "it (--prefix-hit), %u distinct shared prefix%s in the pool; hit = prompt "
                "tokens the store matched (its nodes and the policy's rule); pfx pages/seq = "
                "a sequence's pages beyond the shared ones; pfx seqs = floor((pool pages - "
                "%u x shared prefix pages) / pfx pages/seq); prefill = prompt tokens computed "
                "per request (%.1f without the cache)", prefix, in->prefix_hit,
                in->prefix_groups, in->prefix_groups == 1 ? "" : "es", in->prefix_groups,
                p->mean_prompt);
        if (in->prefix_ctx)
            fprintf(f, "; the shared prefixes are compressed contexts (--prefix-compressed): "
                    "cached as the policy compressed them at their end");
        if (in->rate > 0)
            fprintf(f, "; at --rate %g: %.0f prompt tokens/s to prefill without the cache",
                    in->rate, in->rate * p->mean_prompt);
        fputc('\n', f);
    }
    if (p->target > 0)
        fprintf(f, "%starget: %.1f concurrent sequences (%s)\n", prefix, p->target,
                in->concurrency ? "--concurrency"
                                : "Little's law: --rate x mean output / --decode-tps");
}

void plan_report_notes(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n,
                       const char *bullet)
{
    const plan_model_t *m = &p->in->model;
    fprintf(f, "%sbytes/token: page bytes + metadata of a sequence at its end, per token of "
            "context, measured in the store (kv_store_stats); closed form: the formats' bits "
            "per element and the policy's budgets only; diff = measured / closed - 1\n",
            bullet);
    fprintf(f, "%smax seqs = floor(pool pages / pages per sequence); x first: max seqs and "
            "page bytes per token relative to the first policy\n", bullet);
    fprintf(f, "%ssimulated with 1 and 2 kv heads and scaled to %u (pages exactly, metadata "
            "affinely); head_dim %u for FP16/INT4/INT2 (page counts do not depend on it), "
            "%u with MERGED pages\n", bullet, m->kv_heads, 16u, m->head_dim);
    if (p->in->eval_dir)
        fprintf(f, "%squality: the kvpage eval reports in %s\n", bullet, p->in->eval_dir);
    else
        fprintf(f, "%squality: no kvpage eval reports found (--eval-dir, $KVPAGE_EVAL_DIR, the "
                "installed docs/results, the source tree's)\n", bullet);
    for (uint32_t i = 0; i < n; i++) {
        fprintf(f, "%s%s = %s: simulated head_dim %u, %.2f s; peak %.1f pages/seq; max "
                "context %s", bullet, r[i].spec->given, r[i].spec->ep.spec,
                r[i].sim_head_dim, r[i].seconds, r[i].peak_pages_per_seq,
                plan_report_ctx_method(r[i].ctx_method));
        if (r[i].ctx_capped)
            fprintf(f, ", capped (the pool alone: %llu tokens)",
                    (unsigned long long)r[i].pool_ctx);
        if (!r[i].heads_exact)
            fprintf(f, "; WARNING: 2 heads did not take exactly twice the pages of 1");
        if (r[i].assumption[0])
            fprintf(f, "; ASSUMED %s", r[i].assumption);
        if (r[i].quality.have)
            fprintf(f, "; quality from %s", r[i].quality.file);
        if (p->in->prefix_hit > 0) {
            fprintf(f, "; prefix hit %.3f: shared prefix %.1f pages (counted %u x), %.1f "
                    "pages/seq beyond it, %llu seqs (%llu without sharing), %.1f prompt "
                    "tokens prefilled per request", r[i].pfx_hit, r[i].pfx_shared_pages,
                    p->in->prefix_groups, r[i].pfx_pages_per_seq,
                    (unsigned long long)r[i].pfx_max_seqs, (unsigned long long)r[i].max_seqs,
                    r[i].pfx_prefill_tokens);
            if (p->in->rate > 0)
                fprintf(f, " (%.0f tokens/s at --rate %g)", p->in->rate * r[i].pfx_prefill_tokens,
                        p->in->rate);
        }
        fputc('\n', f);
    }
}

static int done(FILE *f)
{
    return ferror(f) ? -(errno ? errno : EIO) : 0;
}

/* ---- table ------------------------------------------------------------------ */

int plan_report_table(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n)
{
    int w = 6;
    for (uint32_t i = 0; i < n; i++) {
        int l = (int)strlen(r[i].spec->given);
        w = l > w ? l : w;
    }
    fprintf(f, "kvpage plan\n");
    plan_report_setup(f, p, "  ");
    const int pfx = p->in->prefix_hit > 0;
    fprintf(f, "\n%-*s %11s %11s %7s %10s %9s %7s %7s %11s %9s", w, "policy", "bytes/tok",
            "closed", "diff", "pages/seq", "max seqs", "seqs x", "B/tok x", "max ctx",
            "seqs@ctx");
    if (pfx)
        fprintf(f, " %6s %10s %9s %8s", "hit", "pfx pg/seq", "pfx seqs", "prefill");
    fprintf(f, "  %s\n", "quality (kvpage eval)");
    for (uint32_t i = 0; i < n; i++) {
        char q[160], c0[32], c1[32];
        plan_report_quality(&r[i].quality, q, sizeof q);
        fprintf(f, "%-*s %11.1f %11.1f %+6.1f%% %10.1f %9llu %6.2fx %6.2fx %11s %9s",
                w, r[i].spec->given, r[i].bytes_per_token, r[i].closed_bytes_per_token,
                diff_pct(&r[i]), r[i].pages_per_seq, (unsigned long long)r[i].max_seqs,
                ratio((double)r[i].max_seqs, (double)r[0].max_seqs),
                ratio(r[0].kv_bytes_per_token, r[i].kv_bytes_per_token),
                plan_report_ctx(p, &r[i], 0, c0), plan_report_ctx(p, &r[i], 1, c1));
        if (pfx)
            fprintf(f, " %6.3f %10.1f %9llu %8.1f", r[i].pfx_hit, r[i].pfx_pages_per_seq,
                    (unsigned long long)r[i].pfx_max_seqs, r[i].pfx_prefill_tokens);
        fprintf(f, "  %s%s\n", q, r[i].fits == 0 ? "  [below target]" : "");
    }
    fputc('\n', f);
    plan_report_notes(f, p, r, n, "- ");
    return done(f);
}

/* ---- JSON ------------------------------------------------------------------- */

/* A finite number, or null. */
static void json_num(FILE *f, const char *key, double v, const char *fmt)
{
    fprintf(f, "\"%s\":", key);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f);
}

static void json_quality(FILE *f, const plan_quality_t *q)
{
    if (!q->have) {
        fputs("\"n/a\"", f);
        return;
    }
    fputs("{\"file\":", f);
    kv_cli_json_str(f, q->file);
    if (q->have_ppl) {
        fprintf(f, ",\"ppl_ctx\":%.0f,", q->ppl_ctx);
        json_num(f, "ppl", q->ppl, "%.4f");
        fputc(',', f);
        json_num(f, "delta_ppl", q->delta_ppl, "%.4f");
    }
    for (int t = 0; t < PLAN_EVALQ_TASKS; t++)
        if (q->have_acc[t])
            fprintf(f, ",\"%s\":%.4f", plan_evalq_tasks[t], q->acc[t]);
    fputc('}', f);
}

static void json_result(FILE *f, const plan_result_t *r, const plan_result_t *first, int prefix)
{
    fputs("{\"policy\":", f);
    kv_cli_json_str(f, r->spec->given);
    fputs(",\"spec\":", f);
    kv_cli_json_str(f, r->spec->ep.spec);
    fprintf(f, ",\"bytes_per_token\":%.1f,\"kv_bytes_per_token\":%.1f,"
            "\"meta_bytes_per_token\":%.1f,", r->bytes_per_token, r->kv_bytes_per_token,
            r->meta_bytes_per_token);
    json_num(f, "closed_form_bytes_per_token", r->closed_bytes_per_token, "%.1f");
    fputc(',', f);
    json_num(f, "diff_pct", diff_pct(r), "%.2f");
    fprintf(f, ",\"pages_per_seq\":%.2f,\"peak_pages_per_seq\":%.2f,\"max_seqs\":%llu,"
            "\"max_ctx\":%llu,\"max_ctx_method\":\"%s\",\"max_ctx_capped\":%s,"
            "\"pool_max_ctx\":%llu,\"seqs_at_ctx\":%llu,\"seqs_vs_first\":%.4f,"
            "\"bytes_vs_first\":%.4f,", r->pages_per_seq, r->peak_pages_per_seq,
            (unsigned long long)r->max_seqs, (unsigned long long)r->max_ctx,
            plan_report_ctx_method(r->ctx_method), r->ctx_capped ? "true" : "false",
            (unsigned long long)r->pool_ctx, (unsigned long long)r->seqs_at_ctx,
            ratio((double)r->max_seqs, (double)first->max_seqs),
            ratio(first->kv_bytes_per_token, r->kv_bytes_per_token));
    fprintf(f, "\"fits_target\":%s,\"sim_head_dim\":%u,\"heads_exact\":%s,\"seconds\":%.3f,"
            "\"assumption\":", r->fits < 0 ? "null" : r->fits ? "true" : "false",
            r->sim_head_dim, r->heads_exact ? "true" : "false", r->seconds);
    if (r->assumption[0])
        kv_cli_json_str(f, r->assumption);
    else
        fputs("null", f);
    fputs(",\"quality\":", f);
    json_quality(f, &r->quality);
    if (prefix)
        fprintf(f, ",\"prefix\":{\"hit\":%.4f,\"shared_pages\":%.2f,\"pages_per_seq\":%.2f,"
                "\"max_seqs\":%llu,\"prefill_tokens\":%.2f}", r->pfx_hit, r->pfx_shared_pages,
                r->pfx_pages_per_seq, (unsigned long long)r->pfx_max_seqs,
                r->pfx_prefill_tokens);
    if (r->n_curve) {
        fputs(",\"curve\":[", f);
        for (uint32_t k = 0; k < r->n_curve; k++) {
            fprintf(f, "%s{\"ctx\":%u,\"bytes_per_token\":%.1f,", k ? "," : "", r->curve[k].ctx,
                    r->curve[k].bytes_per_token);
            json_num(f, "closed_form_bytes_per_token", r->curve[k].closed_bytes_per_token,
                     "%.1f");
            fputc('}', f);
        }
        fputc(']', f);
    }
    fputc('}', f);
}

int plan_report_json(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n)
{
    const plan_in_t *in = p->in;
    const plan_model_t *m = &in->model;
    fputs("{\"model\":", f);
    kv_cli_json_str(f, m->name);
    fprintf(f, ",\"shape\":{\"layers\":%u,\"q_heads\":%u,\"kv_heads\":%u,\"head_dim\":%u},"
            "\"weights_bytes\":%.0f,\"gpu\":", m->layers, m->q_heads, m->kv_heads,
            m->head_dim, in->weights_bytes);
    kv_cli_json_str(f, in->gpu_name);
    fprintf(f, ",\"gpu_bytes\":%.0f,\"reserve\":%.4f,\"pool_bytes\":%.0f,\"page_bytes\":%u,"
            "\"pool_pages\":%llu,\"workload\":", in->gpu_bytes, in->reserve, p->pool_bytes,
            p->page_bytes, (unsigned long long)p->pool_pages);
    kv_cli_json_str(f, in->workload);
    fprintf(f, ",\"samples\":%u,\"seed\":%llu,\"mean_prompt\":%.2f,\"mean_output\":%.2f,"
            "\"ctx_output\":%u,\"trained_ctx\":%u,\"target_seqs\":%.2f,\"lazy_frac\":%.4f,"
            "\"retain_frac\":%.4f,\"chunk\":%u,\"prefix_hit\":%.4f,\"prefix_groups\":%u,"
            "\"prefix_compressed\":%s,\"results\":[", p->n_samples,
            (unsigned long long)in->seed, p->mean_prompt, p->mean_out, p->ctx_out,
            m->ctx_len, p->target, in->lazy_frac,
            in->retain_frac, in->chunk, in->prefix_hit, in->prefix_groups,
            in->prefix_ctx ? "true" : "false");
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            fputc(',', f);
        json_result(f, &r[i], &r[0], in->prefix_hit > 0);
    }
    fputs("]}\n", f);
    return done(f);
}

/* ---- Markdown --------------------------------------------------------------- */

int plan_report_md(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n)
{
    fprintf(f, "## kvpage plan: %s on %s\n\n", p->in->model.name, p->in->gpu_name);
    plan_report_setup(f, p, "- ");
    const int pfx = p->in->prefix_hit > 0;
    fprintf(f, "\n| policy | bytes/token | closed form | diff | pages/seq | max seqs | seqs x | "
            "B/tok x | max ctx | seqs@ctx |%s quality (kvpage eval) |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|%s---|\n",
            pfx ? " hit | pfx pages/seq | pfx seqs | prefill |" : "",
            pfx ? "---:|---:|---:|---:|" : "");
    for (uint32_t i = 0; i < n; i++) {
        char q[160], c0[32], c1[32];
        plan_report_quality(&r[i].quality, q, sizeof q);
        fprintf(f, "| `%s` | %.1f | %.1f | %+.1f%% | %.1f | %llu | %.2fx | %.2fx | %s | %s |",
                r[i].spec->given, r[i].bytes_per_token, r[i].closed_bytes_per_token,
                diff_pct(&r[i]), r[i].pages_per_seq, (unsigned long long)r[i].max_seqs,
                ratio((double)r[i].max_seqs, (double)r[0].max_seqs),
                ratio(r[0].kv_bytes_per_token, r[i].kv_bytes_per_token),
                plan_report_ctx(p, &r[i], 0, c0), plan_report_ctx(p, &r[i], 1, c1));
        if (pfx)
            fprintf(f, " %.3f | %.1f | %llu | %.1f |", r[i].pfx_hit, r[i].pfx_pages_per_seq,
                    (unsigned long long)r[i].pfx_max_seqs, r[i].pfx_prefill_tokens);
        fprintf(f, " %s |\n", q);
    }
    fputc('\n', f);
    plan_report_notes(f, p, r, n, "- ");
    return done(f);
}
