/*
 * eval_report.c — JSON, Markdown and SVG renderings of a `kvpage eval` run
 * (eval_report.h). Pure formatting: reads the report, writes the stream.
 *
 * Summary per policy (Markdown table, SVG): KV bytes and ratios are those of
 * the first perplexity cell (text 0) when perplexity ran, else of the
 * retrieval cell with the largest ctx; ΔPPL is the mean over texts of
 * ppl(policy) - ppl(fp16); accuracy is per task, over every ctx and depth.
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

double eval_report_ratio(const eval_report_t *r, const eval_result_t *x)
{
    for (uint32_t i = 0; i < r->n_results; i++) {
        const eval_result_t *y = &r->results[i];
        if (y->policy == 0 && y->task == x->task && y->ctx == x->ctx &&
            (x->task != EVAL_RES_PPL || y->text == x->text))
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

int eval_report_json(FILE *f, const eval_report_t *r)
{
    fputs("{\"model\":", f);
    kv_cli_json_str(f, r->model);
    if (r->model_sha256) {
        fputs(",\"model_sha256\":", f);
        kv_cli_json_str(f, r->model_sha256);
    }
    fprintf(f, ",\"seed\":%llu,\"threads\":%u,\"ppl_prefill\":%u,\"ppl_gen\":%u,"
               "\"wall_s\":%.1f,\"policies\":[",
            (unsigned long long)r->seed, r->threads, r->ppl_prefill, r->ppl_gen, r->wall_s);
    for (uint32_t i = 0; i < r->n_policies; i++) {
        fputs(i ? "," : "", f);
        kv_cli_json_str(f, r->policies[i]);
    }
    fputs("],\"texts\":[", f);
    for (uint32_t i = 0; i < r->n_texts; i++) {
        const eval_text_t *t = &r->texts[i];
        fputs(i ? ",{\"name\":" : "{\"name\":", f);
        kv_cli_json_str(f, t->name);
        fputs(",\"path\":", f);
        kv_cli_json_str(f, t->path);
        fprintf(f, ",\"sha256\":\"%s\",\"bytes\":%llu,\"tokens\":%u}", t->sha256,
                (unsigned long long)t->bytes, t->tokens);
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
        } else {
            fprintf(f, ",\"items\":%u,\"correct\":%u", x->n_items, x->n_correct);
        }
        fprintf(f, ",\"kv_bytes\":%llu,\"fp16_bytes\":%llu,\"meta_bytes\":%llu,\"ratio\":%.4f,"
                   "\"ratio_held\":%.4f,\"formats\":[",
                (unsigned long long)x->kv_bytes, (unsigned long long)x->fp16_bytes,
                (unsigned long long)x->meta_bytes, eval_report_ratio(r, x), eval_report_ratio_held(x));
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
        fprintf(f, ",\"task\":\"%s\",\"ctx\":%u,\"tokens\":%u,\"depth\":%u,\"ok\":%d,"
                   "\"expect\":",
                task_label(x->task), x->ctx, x->tokens, x->depth_pct, x->ok);
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
    fputs("]}\n", f);
    return ferror(f) ? -EIO : 0;
}

/* ---- per-policy summary ------------------------------------------------------ */

typedef struct summary {
    const eval_result_t *size;          /* the cell whose bytes are shown     */
    double dppl;                        /* mean ppl - ppl(fp16); NAN: no ppl  */
    double acc[EVAL_TASK_COUNT];        /* NAN: task not run                  */
    double acc_mean;                    /* over the tasks run; NAN: none      */
} summary_t;

static void summarize(const eval_report_t *r, uint32_t p, summary_t *s)
{
    *s = (summary_t){.size = NULL, .dppl = NAN, .acc_mean = NAN};
    double d = 0, ok[EVAL_TASK_COUNT] = {0}, n[EVAL_TASK_COUNT] = {0};
    uint32_t nd = 0;
    for (uint32_t i = 0; i < r->n_results; i++) {
        const eval_result_t *x = &r->results[i];
        if (x->policy != p)
            continue;
        if (x->task == EVAL_RES_PPL) {
            for (uint32_t j = 0; j < r->n_results; j++) {
                const eval_result_t *y = &r->results[j];
                if (y->policy == 0 && y->task == EVAL_RES_PPL && y->text == x->text) {
                    d += x->value - y->value;
                    nd++;
                }
            }
            if (!s->size || s->size->task != EVAL_RES_PPL)
                s->size = x; /* the first ppl cell: text 0 */
        } else {
            ok[x->task] += x->n_correct;
            n[x->task] += x->n_items;
            if (!s->size || (s->size->task != EVAL_RES_PPL && x->ctx > s->size->ctx))
                s->size = x;
        }
    }
    if (nd)
        s->dppl = d / nd;
    double sum = 0;
    uint32_t nt = 0;
    for (unsigned k = 0; k < EVAL_TASK_COUNT; k++) {
        s->acc[k] = n[k] > 0 ? ok[k] / n[k] : NAN;
        if (n[k] > 0) {
            sum += s->acc[k];
            nt++;
        }
    }
    if (nt)
        s->acc_mean = sum / nt;
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
    fprintf(f, "| policy | KV bytes | ratio vs fp16 | held ratio (formats held) | ΔPPL vs fp16 |");
    for (unsigned k = 0; k < EVAL_TASK_COUNT; k++)
        fprintf(f, " %s acc |", eval_task_name((eval_task_kind_t)k));
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
        if (isnan(s.dppl))
            fputs(" - |", f);
        else
            fprintf(f, " %+.4f |", s.dppl);
        for (unsigned k = 0; k < EVAL_TASK_COUNT; k++)
            if (isnan(s.acc[k]))
                fputs(" - |", f);
            else
                fprintf(f, " %.2f |", s.acc[k]);
        fputc('\n', f);
    }
    if (r->n_texts) {
        fprintf(f, "\nPerplexity (prefill %u, then %u teacher-forced decode tokens):\n\n"
                   "| policy | text | sha256 | PPL | mean NLL | KV bytes | fp16 bytes | ratio "
                   "vs fp16 |\n|---|---|---|---:|---:|---:|---:|---:|\n",
                r->ppl_prefill, r->ppl_gen);
        for (uint32_t i = 0; i < r->n_results; i++) {
            const eval_result_t *x = &r->results[i];
            if (x->task != EVAL_RES_PPL)
                continue;
            fprintf(f, "| %s | %s | %.12s… | %.4f | %.5f | %llu | %llu | ",
                    r->policies[x->policy], r->texts[x->text].path,
                    r->texts[x->text].sha256, x->value, x->nll,
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
            fprintf(f, "\nRetrieval (exact match, greedy):\n\n"
                       "| policy | task | ctx | correct / items | KV bytes | ratio vs fp16 | "
                       "held ratio |\n|---|---|---:|---:|---:|---:|---:|\n");
        fprintf(f, "| %s | %s | %u | %u / %u | %llu | ", r->policies[x->policy],
                task_label(x->task), x->ctx, x->n_correct, x->n_items,
                (unsigned long long)x->kv_bytes);
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

/* One panel at x0: x = KV bytes (0..xmax), y from y0 to y1. */
static void svg_panel(FILE *f, const eval_report_t *r, const summary_t *s, int which, double x0,
                      double xmax)
{
    double lo = 0, hi = 1;
    if (which == 0) { /* ΔPPL: 0..max, at least a small span */
        hi = 1e-3;
        for (uint32_t p = 0; p < r->n_policies; p++)
            if (!isnan(s[p].dppl)) {
                hi = fmax(hi, s[p].dppl);
                lo = fmin(lo, s[p].dppl);
            }
        hi *= 1.15;
    }
    double px = x0 + SVG_M, py = 30, w = SVG_PW - SVG_M - 20, h = SVG_PH - 30 - SVG_M;
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"#444\"/>\n", px, py, w, h);
    svg_text(f, x0 + SVG_PW / 2.0, 18, "middle",
             which == 0 ? "ΔPPL vs fp16 (lower is better)"
                        : "retrieval accuracy, mean over tasks");
    svg_text(f, px + w / 2, py + h + 40, "middle", "KV bytes held (MB)");
    char lab[64];
    for (int i = 0; i <= 4; i++) {
        double yv = lo + (hi - lo) * i / 4, yy = py + h - h * i / 4;
        double xv = xmax * i / 4, xx = px + w * i / 4;
        snprintf(lab, sizeof lab, which == 0 ? "%.3g" : "%.2f", yv);
        svg_text(f, px - 6, yy + 4, "end", lab);
        snprintf(lab, sizeof lab, "%.2f", xv / 1e6);
        svg_text(f, xx, py + h + 18, "middle", lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                px, yy, px + w, yy);
    }
    for (uint32_t p = 0; p < r->n_policies; p++) {
        double v = which == 0 ? s[p].dppl : s[p].acc_mean;
        if (!s[p].size || isnan(v))
            continue;
        double cx = px + w * (double)s[p].size->kv_bytes / xmax;
        double cy = py + h - h * (v - lo) / (hi - lo);
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
