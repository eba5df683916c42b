/* SPDX-License-Identifier: MIT */
/*
 * eval_report.c — JSON, Markdown and SVG renderings of a `kvpage eval` run
 * (eval_report.h). Pure formatting: reads the report, writes the stream.
 *
 * Summary per policy (Markdown table, SVG, JSON "summary"): KV bytes and
 * ratios are those of the first perplexity cell (text 0) when perplexity
 * ran, else of the retrieval cell with the largest ctx; ΔPPL per text is
 * ppl(policy) - ppl(fp16) on that text, summarized by mean, min and max over
 * the texts; accuracy is per task over every ctx, haystack and depth, with
 * its 95% Wilson interval, and pooled over all retrieval items (the SVG's
 * accuracy).
 *
 * Two ratios per cell: `ratio` = KV bytes of the fp16 policy's cell for the
 * same task, ctx (and text) / this cell's KV bytes — what the policy saves,
 * evicted tokens included; `ratio_held` = fp16_bytes / kv_bytes, the FP16
 * size of the tokens the policy still holds over their page bytes (format
 * and packing only: about 1x for a policy that evicts but keeps FP16).
 */
#include "eval_report.h"
#include "kv_cli.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "eval_task.h"

static const char *task_label(int task)
{
    return task == EVAL_RES_PPL ? "ppl" : eval_task_name((eval_task_kind_t)task);
}

double eval_report_ratio_held(const eval_result_t *r)
{
    return r->kv_bytes ? (double)r->fp16_bytes / (double)r->kv_bytes : 0;
}

/* KV bytes of the fp16 policy (index 0) for x's task, ctx (and text or
 * haystack) over x's KV bytes; 0 when there is no such cell or no bytes. */
double eval_report_ratio(const eval_report_t *r, const eval_result_t *x)
{
    for (uint32_t i = 0; i < r->n_results; i++) {
        const eval_result_t *y = &r->results[i];
        if (y->policy == 0 && y->task == x->task && y->ctx == x->ctx &&
            (x->task == EVAL_RES_PPL ? y->text == x->text : y->hay == x->hay))
            return x->kv_bytes ? (double)y->kv_bytes / (double)x->kv_bytes : 0;
    }
    return 0;
}

/* A ratio as "4.12x", or "-" when unknown (0). */
static void put_ratio(FILE *f, double ratio)
{
    if (ratio > 0)
        fprintf(f, "%.2fx", ratio);
    else
        fputc('-', f);
}

void eval_wilson(uint32_t k, uint32_t n, double *lo, double *hi)
{
    if (!n || k > n) {
        *lo = 0;
        *hi = 1;
        return;
    }
    const double z = 1.959963984540054, p = (double)k / n, z2n = z * z / n;
    double c = (p + z2n / 2) / (1 + z2n);
    double h = z * sqrt(p * (1 - p) / n + z2n / (4.0 * n)) / (1 + z2n);
    *lo = fmax(0, c - h);
    *hi = fmin(1, c + h);
    if (k == 0)
        *lo = 0;
    if (k == n)
        *hi = 1;
}

/* ppl(x) - ppl(fp16) on x's text and ctx; NAN without an fp16 cell. */
static double dppl_of(const eval_report_t *r, const eval_result_t *x)
{
    for (uint32_t j = 0; j < r->n_results; j++) {
        const eval_result_t *y = &r->results[j];
        if (y->policy == 0 && y->task == EVAL_RES_PPL && y->text == x->text && y->ctx == x->ctx)
            return x->value - y->value;
    }
    return NAN;
}

static const char *hay_label(const eval_report_t *r, uint32_t h)
{
    const char *n = h < r->n_hays ? eval_hay_name(r->hays[h].kind) : NULL;
    return n ? n : "?";
}

static void json_ci(FILE *f, uint32_t k, uint32_t n)
{
    double lo, hi;
    eval_wilson(k, n, &lo, &hi);
    fprintf(f, ",\"ci95\":[%.4f,%.4f]", lo, hi);
}

static void json_summary(FILE *f, const eval_report_t *r);

int eval_report_json(FILE *f, const eval_report_t *r)
{
    fputs("{\"model\":", f);
    kv_cli_json_str(f, r->model);
    if (r->model_sha256) {
        fputs(",\"model_sha256\":", f);
        kv_cli_json_str(f, r->model_sha256);
    }
    fprintf(f, ",\"seed\":%llu,\"threads\":%u,\"ppl_prefill\":%u,\"ppl_gen\":%u,"
               "\"items_per_cell\":%u,\"shared_prefill\":%s,\"wall_s\":%.1f,\"policies\":[",
            (unsigned long long)r->seed, r->threads, r->ppl_prefill, r->ppl_gen,
            r->items_per_cell, r->shared ? "true" : "false", r->wall_s);
    for (uint32_t i = 0; i < r->n_policies; i++) {
        fputs(i ? "," : "", f);
        kv_cli_json_str(f, r->policies[i]);
    }
    fputc(']', f);
    if (r->setting)
        fprintf(f, ",\"setting\":\"%s\",\"questions\":%u", r->setting, r->questions);
    fputs(",\"texts\":[", f);
    for (uint32_t i = 0; i < r->n_texts; i++) {
        const eval_text_t *t = &r->texts[i];
        fputs(i ? ",{\"name\":" : "{\"name\":", f);
        kv_cli_json_str(f, t->name);
        fputs(",\"path\":", f);
        kv_cli_json_str(f, t->path);
        fprintf(f, ",\"sha256\":\"%s\",\"bytes\":%llu,\"tokens\":%u}", t->sha256,
                (unsigned long long)t->bytes, t->tokens);
    }
    fputs("],\"haystacks\":[", f);
    for (uint32_t h = 0; h < r->n_hays; h++) {
        const eval_hay_t *y = &r->hays[h];
        fprintf(f, "%s{\"name\":\"%s\",\"units\":%u,\"files\":[", h ? "," : "",
                hay_label(r, h), y->n_units);
        for (uint32_t i = 0; i < y->n_files; i++) {
            fputs(i ? ",{\"path\":" : "{\"path\":", f);
            kv_cli_json_str(f, y->files[i].path);
            fprintf(f, ",\"sha256\":\"%s\",\"bytes\":%llu}", y->files[i].sha256,
                    (unsigned long long)y->files[i].bytes);
        }
        fputs("]}", f);
    }
    fputs("],\"results\":[", f);
    for (uint32_t i = 0; i < r->n_results; i++) {
        const eval_result_t *x = &r->results[i];
        fputs(i ? ",{\"policy\":" : "{\"policy\":", f);
        kv_cli_json_str(f, r->policies[x->policy]);
        fprintf(f, ",\"task\":\"%s\",\"ctx\":%u,\"value\":%.6g", task_label(x->task), x->ctx,
                x->value);
        if (x->task == EVAL_RES_PPL) {
            fputs(",\"text\":", f);
            kv_cli_json_str(f, r->texts[x->text].name);
            fprintf(f, ",\"nll\":%.6f", x->nll);
            double d = dppl_of(r, x);
            if (!isnan(d))
                fprintf(f, ",\"dppl\":%.6g", d);
        } else {
            fprintf(f, ",\"haystack\":\"%s\",\"items\":%u,\"correct\":%u",
                    hay_label(r, x->hay), x->n_items, x->n_correct);
            json_ci(f, x->n_correct, x->n_items);
        }
        fprintf(f, ",\"kv_bytes\":%llu,\"fp16_bytes\":%llu,\"meta_bytes\":%llu,\"ratio\":%.4f,"
                   "\"ratio_held\":%.4f,\"formats\":[",
                (unsigned long long)x->kv_bytes, (unsigned long long)x->fp16_bytes,
                (unsigned long long)x->meta_bytes, eval_report_ratio(r, x),
                eval_report_ratio_held(x));
        const char *sep = "";
        for (unsigned fm = 0; fm < KV_FMT_COUNT; fm++)
            if (x->formats >> fm & 1u) {
                const char *note = kv_format_note((kv_format_t)fm);
                fputs(sep, f);
                kv_cli_json_str(f, note ? note : "?");
                sep = ",";
            }
        fputs("]}", f);
    }
    fputs("],\"items\":[", f);
    for (uint32_t i = 0; i < r->n_items; i++) {
        const eval_item_rec_t *x = &r->items[i];
        fputs(i ? ",{\"policy\":" : "{\"policy\":", f);
        kv_cli_json_str(f, r->policies[x->policy]);
        fprintf(f, ",\"task\":\"%s\",\"haystack\":\"%s\",\"ctx\":%u,\"tokens\":%u,"
                   "\"depth\":%u,\"question\":%u,\"ok\":%d,\"expect\":",
                task_label(x->task), hay_label(r, x->hay), x->ctx, x->tokens, x->depth_pct,
                x->question, x->ok);
        kv_cli_json_str(f, x->expect);
        fputs(",\"got\":", f);
        kv_cli_json_str(f, x->got);
        fputc('}', f);
    }
    fputs("],\"fidelity\":[", f);
    for (uint32_t i = 0; i < r->n_fidelity; i++) {
        const eval_fidelity_t *x = &r->fidelity[i];
        fputs(i ? ",{\"policy\":" : "{\"policy\":", f);
        kv_cli_json_str(f, r->policies[x->policy]);
        fputs(",\"text\":", f);
        kv_cli_json_str(f, r->texts[x->text].name);
        fprintf(f, ",\"rows\":%u,\"rel_err\":[", x->rows);
        for (uint32_t l = 0; l < r->n_layers; l++)
            fprintf(f, "%s%.5g", l ? "," : "", x->rel_err[l]);
        fputs("]}", f);
    }
    fputc(']', f);
    json_summary(f, r);
    fputs("}\n", f);
    return ferror(f) ? -EIO : 0;
}

/* ---- per-policy summary ------------------------------------------------------ */

typedef struct summary {
    const eval_result_t *size;          /* the cell whose bytes are shown     */
    uint32_t n_dppl;                    /* texts with a ΔPPL (0: no ppl)      */
    double dppl, dppl_min, dppl_max;    /* ppl - ppl(fp16): mean, min, max    */
    uint32_t ok[EVAL_TASK_COUNT], n[EVAL_TASK_COUNT]; /* correct / items      */
    uint32_t ok_all, n_all;             /* pooled over the tasks              */
} summary_t;

static void summarize(const eval_report_t *r, uint32_t p, summary_t *s)
{
    *s = (summary_t){.size = NULL, .dppl_min = INFINITY, .dppl_max = -INFINITY};
    double d = 0;
    for (uint32_t i = 0; i < r->n_results; i++) {
        const eval_result_t *x = &r->results[i];
        if (x->policy != p)
            continue;
        if (x->task == EVAL_RES_PPL) {
            double dx = dppl_of(r, x);
            if (!isnan(dx)) {
                d += dx;
                s->n_dppl++;
                s->dppl_min = fmin(s->dppl_min, dx);
                s->dppl_max = fmax(s->dppl_max, dx);
            }
            if (!s->size || s->size->task != EVAL_RES_PPL)
                s->size = x; /* the first ppl cell: text 0 */
        } else {
            s->ok[x->task] += x->n_correct;
            s->n[x->task] += x->n_items;
            s->ok_all += x->n_correct;
            s->n_all += x->n_items;
            if (!s->size || (s->size->task != EVAL_RES_PPL && x->ctx > s->size->ctx))
                s->size = x;
        }
    }
    s->dppl = s->n_dppl ? d / s->n_dppl : NAN;
}

static void json_summary(FILE *f, const eval_report_t *r)
{
    fputs(",\"summary\":[", f);
    for (uint32_t p = 0; p < r->n_policies; p++) {
        summary_t s;
        summarize(r, p, &s);
        fputs(p ? ",{\"policy\":" : "{\"policy\":", f);
        kv_cli_json_str(f, r->policies[p]);
        if (s.size)
            fprintf(f, ",\"kv_bytes\":%llu,\"ratio\":%.4f",
                    (unsigned long long)s.size->kv_bytes, eval_report_ratio(r, s.size));
        if (s.n_dppl)
            fprintf(f, ",\"dppl\":{\"mean\":%.6g,\"min\":%.6g,\"max\":%.6g,\"texts\":%u}", s.dppl,
                    s.dppl_min, s.dppl_max, s.n_dppl);
        for (unsigned k = 0; k <= EVAL_TASK_COUNT; k++) {
            uint32_t ok = k < EVAL_TASK_COUNT ? s.ok[k] : s.ok_all;
            uint32_t n = k < EVAL_TASK_COUNT ? s.n[k] : s.n_all;
            if (!n)
                continue;
            fprintf(f, ",\"%s\":{\"correct\":%u,\"items\":%u,\"acc\":%.4f",
                    k < EVAL_TASK_COUNT ? eval_task_name((eval_task_kind_t)k) : "retrieval", ok,
                    n, (double)ok / n);
            json_ci(f, ok, n);
            fputc('}', f);
        }
        fputc('}', f);
    }
    fputc(']', f);
}

/* "0.85 [0.64, 0.95]" */
static void put_acc(FILE *f, uint32_t ok, uint32_t n)
{
    double lo, hi;
    eval_wilson(ok, n, &lo, &hi);
    fprintf(f, "%.2f [%.2f, %.2f]", (double)ok / n, lo, hi);
}

static void notes(FILE *f, uint32_t formats)
{
    const char *sep = "";
    for (unsigned fm = 0; fm < KV_FMT_COUNT; fm++)
        if (formats >> fm & 1u) {
            const char *note = kv_format_note((kv_format_t)fm);
            fprintf(f, "%s%s", sep, note ? note : "?");
            sep = "; ";
        }
}

int eval_report_md(FILE *f, const eval_report_t *r)
{
    fprintf(f, "| policy | KV bytes | ratio vs fp16 | held ratio (formats held) | ΔPPL vs fp16: "
               "mean [min, max] over texts |");
    for (unsigned k = 0; k < EVAL_TASK_COUNT; k++)
        fprintf(f, " %s acc [95%% CI] |", eval_task_name((eval_task_kind_t)k));
    fputs("\n|---|---:|---:|---|---:|", f);
    for (unsigned k = 0; k < EVAL_TASK_COUNT; k++)
        fputs("---:|", f);
    fputc('\n', f);
    for (uint32_t p = 0; p < r->n_policies; p++) {
        summary_t s;
        summarize(r, p, &s);
        fprintf(f, "| %s | ", r->policies[p]);
        if (s.size) {
            fprintf(f, "%llu | ", (unsigned long long)s.size->kv_bytes);
            put_ratio(f, eval_report_ratio(r, s.size));
            fputs(" | ", f);
            put_ratio(f, eval_report_ratio_held(s.size));
            fputs(" (", f);
            notes(f, s.size->formats);
            fputs(") |", f);
        } else {
            fputs("- | - | - |", f);
        }
        if (!s.n_dppl)
            fputs(" - |", f);
        else
            fprintf(f, " %+.4f [%+.4f, %+.4f] (%u) |", s.dppl, s.dppl_min, s.dppl_max, s.n_dppl);
        for (unsigned k = 0; k < EVAL_TASK_COUNT; k++) {
            fputc(' ', f);
            if (s.n[k])
                put_acc(f, s.ok[k], s.n[k]);
            else
                fputc('-', f);
            fputs(" |", f);
        }
        fputc('\n', f);
    }
    if (r->n_texts) {
        fprintf(f, "\nPerplexity (prefill %u, then %u teacher-forced decode tokens):\n\n"
                   "| policy | text | sha256 | PPL | ΔPPL | mean NLL | KV bytes | fp16 bytes | "
                   "ratio vs fp16 |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n",
                r->ppl_prefill, r->ppl_gen);
        for (uint32_t i = 0; i < r->n_results; i++) {
            const eval_result_t *x = &r->results[i];
            if (x->task != EVAL_RES_PPL)
                continue;
            fprintf(f, "| %s | %s | %.12s… | %.4f | %+.4f | %.5f | %llu | %llu | ",
                    r->policies[x->policy], r->texts[x->text].path,
                    r->texts[x->text].sha256, x->value, dppl_of(r, x), x->nll,
                    (unsigned long long)x->kv_bytes, (unsigned long long)x->fp16_bytes);
            put_ratio(f, eval_report_ratio(r, x));
            fputs(" |\n", f);
        }
    }
    int any = 0;
    for (uint32_t i = 0; i < r->n_results; i++) {
        const eval_result_t *x = &r->results[i];
        if (x->task == EVAL_RES_PPL)
            continue;
        if (!any++)
            fprintf(f, "\nRetrieval (exact match, greedy; 95%% Wilson intervals; %s, %u "
                       "question%s per context):\n\n"
                       "| policy | task | haystack | ctx | correct / items | acc [95%% CI] | "
                       "KV bytes | ratio vs fp16 | held ratio |\n"
                       "|---|---|---|---:|---:|---:|---:|---:|---:|\n",
                    r->setting ? r->setting : "query-aware", r->questions ? r->questions : 1,
                    r->questions > 1 ? "s" : "");
        fprintf(f, "| %s | %s | %s | %u | %u / %u | ", r->policies[x->policy],
                task_label(x->task), hay_label(r, x->hay), x->ctx, x->n_correct, x->n_items);
        if (x->n_items)
            put_acc(f, x->n_correct, x->n_items);
        else
            fputc('-', f);
        fprintf(f, " | %llu | ", (unsigned long long)x->kv_bytes);
        put_ratio(f, eval_report_ratio(r, x));
        fputs(" | ", f);
        put_ratio(f, eval_report_ratio_held(x));
        fputs(" |\n", f);
    }
    if (r->n_fidelity) {
        fprintf(f, "\nAttention-output relative error vs fp16, per layer (last %u decode rows "
                   "of the ppl run):\n\n| layer |",
                r->fidelity[0].rows);
        for (uint32_t i = 0; i < r->n_fidelity; i++)
            fprintf(f, " %s (%s) |", r->policies[r->fidelity[i].policy],
                    r->texts[r->fidelity[i].text].name);
        fputs("\n|---:|", f);
        for (uint32_t i = 0; i < r->n_fidelity; i++)
            fputs("---:|", f);
        fputc('\n', f);
        for (uint32_t l = 0; l < r->n_layers; l++) {
            fprintf(f, "| %u |", l);
            for (uint32_t i = 0; i < r->n_fidelity; i++)
                fprintf(f, " %.4f |", r->fidelity[i].rel_err[l]);
            fputc('\n', f);
        }
    }
    return ferror(f) ? -EIO : 0;
}

/* ---- SVG ------------------------------------------------------------------ */

#define SVG_PW 420 /* panel width, px  */
#define SVG_PH 300 /* panel height, px */
#define SVG_M 56   /* margin, px       */

static void svg_text(FILE *f, double x, double y, const char *anchor, const char *s)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">", x, y, anchor);
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else
            fputc(*s, f);
    }
    fputs("</text>\n", f);
}

/* One panel at x0: x = KV bytes (0..xmax), y = ΔPPL (which 0) or accuracy;
 * both axes tick at round values (kv_cli_axis). */
static void svg_panel(FILE *f, const eval_report_t *r, const summary_t *s, int which, double x0,
                      double xmax)
{
    double lo = 0, hi = 1;
    if (which == 0) { /* ΔPPL: 0..max over the texts, at least a small span */
        hi = 1e-3;
        for (uint32_t p = 0; p < r->n_policies; p++)
            if (s[p].n_dppl) {
                hi = fmax(hi, s[p].dppl_max);
                lo = fmin(lo, s[p].dppl_min);
            }
    }
    const kv_cli_axis_t xa = kv_cli_axis(0, xmax, 4), ya = kv_cli_axis(lo, hi, 5);
    lo = ya.lo, hi = ya.hi, xmax = xa.hi;
    double px = x0 + SVG_M, py = 30, w = SVG_PW - SVG_M - 20, h = SVG_PH - 30 - SVG_M;
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"#444\"/>\n", px, py, w, h);
    svg_text(f, x0 + SVG_PW / 2.0, 18, "middle",
             which == 0 ? "ΔPPL vs fp16: mean, bar min..max over texts"
                        : "retrieval accuracy, all items: bar 95% Wilson");
    svg_text(f, px + w / 2, py + h + 40, "middle", "KV bytes held (MB)");
    char lab[64];
    for (int i = 0; i <= ya.n; i++) {
        double yy = py + h - h * i / ya.n;
        kv_cli_axis_label(&ya, i, 1, lab, sizeof lab);
        svg_text(f, px - 6, yy + 4, "end", lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                px, yy, px + w, yy);
    }
    for (int i = 0; i <= xa.n; i++) {
        kv_cli_axis_label(&xa, i, 1e6, lab, sizeof lab);
        svg_text(f, px + w * i / xa.n, py + h + 18, "middle", lab);
    }
    for (uint32_t p = 0; p < r->n_policies; p++) {
        double v, b0, b1;
        if (which == 0) {
            v = s[p].n_dppl ? s[p].dppl : NAN;
            b0 = s[p].dppl_min;
            b1 = s[p].dppl_max;
        } else {
            v = s[p].n_all ? (double)s[p].ok_all / s[p].n_all : NAN;
            eval_wilson(s[p].ok_all, s[p].n_all, &b0, &b1);
        }
        if (!s[p].size || isnan(v))
            continue;
        double cx = px + w * (double)s[p].size->kv_bytes / xmax;
        double cy = py + h - h * (v - lo) / (hi - lo);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f6fb4\"/>\n",
                cx, py + h - h * (b0 - lo) / (hi - lo), cx, py + h - h * (b1 - lo) / (hi - lo));
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#1f6fb4\"/>\n", cx, cy);
        svg_text(f, cx + 6, cy - 6, "start", r->policies[p]);
    }
}

int eval_report_svg(FILE *f, const eval_report_t *r)
{
    summary_t s[64];
    uint32_t n = r->n_policies < 64 ? r->n_policies : 64;
    double xmax = 1;
    for (uint32_t p = 0; p < n; p++) {
        summarize(r, p, &s[p]);
        if (s[p].size)
            xmax = fmax(xmax, (double)s[p].size->kv_bytes * 1.1);
    }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            2 * SVG_PW, SVG_PH);
    eval_report_t rr = *r;
    rr.n_policies = n;
    svg_panel(f, &rr, s, 0, 0, xmax);
    svg_panel(f, &rr, s, 1, SVG_PW, xmax);
    fputs("</svg>\n", f);
    return ferror(f) ? -EIO : 0;
}
