/* SPDX-License-Identifier: MIT */
/*
 * plan_html.c — the HTML rendering of a plan (see plan_report.h): one
 * self-contained page (inline CSS, hand-written inline SVG, no scripts, no
 * external resources) with the setup, three charts, the table and the notes.
 *
 *   capacity   one horizontal bar per policy, length ~ max seqs
 *   quality    quality (kvpage eval's ΔPPL, else a retrieval accuracy)
 *              against capacity (max seqs), one labelled point per policy
 *   curve      KV page bytes per token (y, linear from 0) against the
 *              prompt length (x, log2), one solid line per policy with its
 *              measured points and a dashed line of its closed form
 *
 * Axes tick at round values (1, 2 or 5 x 10^k: kv_cli_axis, shared with
 * the eval SVG).
 *
 * Every text from outside (specs, names, file names) is HTML-escaped.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_cli.h"
#include "plan_report.h"

#define SVG_W 760
#define BAR_H 26
#define LEFT 190
#define CURVE_H 380
#define CURVE_L 80
#define CURVE_R 20
#define CURVE_T 20
#define CURVE_B 50

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_PALETTE (sizeof palette / sizeof palette[0])

static void html_str(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* Each line of text as an escaped <li> item. */
static void html_lines(FILE *f, const char *text)
{
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char *line = strndup(p, n);
        if (line) {
            fputs("<li>", f);
            html_str(f, line);
            fputs("</li>\n", f);
            free(line);
        }
        p += n + (e != NULL);
    }
}

static void bars(FILE *f, const plan_result_t *r, uint32_t n)
{
    double max = 1;
    for (uint32_t i = 0; i < n; i++)
        max = (double)r[i].max_seqs > max ? (double)r[i].max_seqs : max;
    int h = (int)n * BAR_H + 30, span = SVG_W - LEFT - 90;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", SVG_W, h);
    for (uint32_t i = 0; i < n; i++) {
        int y = 10 + (int)i * BAR_H;
        double w = span * (double)r[i].max_seqs / max;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", LEFT - 8, y + 16);
        html_str(f, r[i].spec->given);
        fprintf(f, "</text><rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>"
                "<text x=\"%.1f\" y=\"%d\">%llu</text>\n", LEFT, y + 3, w, BAR_H - 8,
                palette[i % N_PALETTE], LEFT + w + 6, y + 16,
                (unsigned long long)r[i].max_seqs);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#555\">max concurrent sequences at the "
            "workload's lengths</text>\n</svg>\n", LEFT, h - 6);
}

static double curve_x(uint32_t c, uint32_t lo, uint32_t hi)
{
    const int x0 = CURVE_L, x1 = SVG_W - CURVE_R;
    double span = hi > lo ? log2((double)hi / lo) : 1;
    return x0 + 10 + (x1 - x0 - 20) * log2((double)c / lo) / span;
}

static void curve_axes(FILE *f, uint32_t lo, uint32_t hi, const kv_cli_axis_t *ya)
{
    const int x0 = CURVE_L, x1 = SVG_W - CURVE_R, y0 = CURVE_H - CURVE_B, y1 = CURVE_T;
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>"
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>\n", x0, y0, x1, y0,
            x0, y0, x0, y1);
    for (uint32_t c = lo; c <= hi; c *= 2) {
        double x = curve_x(c, lo, hi);
        if (c >= 1024)
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%uK</text>\n", x,
                    y0 + 16, c / 1024);
        else
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%u</text>\n", x,
                    y0 + 16, c);
    }
    for (int k = 0; k <= ya->n; k++) {
        char lab[32];
        double y = y0 - (y0 - y1) * (double)k / ya->n;
        kv_cli_axis_label(ya, k, 1024, lab, sizeof lab);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s KiB</text>\n", x0, y, x1,
                y, x0 - 6, y + 4, lab);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">prompt tokens "
            "(then one decode step); solid: measured page bytes per token, dashed: closed "
            "form</text>\n", (x0 + x1) / 2, CURVE_H - 10);
}

static void curve(FILE *f, const plan_result_t *r, uint32_t n)
{
    uint32_t lo = 0, hi = 0;
    double ymax = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < r[i].n_curve; k++) {
            const plan_curve_pt_t *pt = &r[i].curve[k];
            lo = !lo || pt->ctx < lo ? pt->ctx : lo;
            hi = pt->ctx > hi ? pt->ctx : hi;
            ymax = fmax(ymax, pt->bytes_per_token);
            if (isfinite(pt->closed_bytes_per_token))
                ymax = fmax(ymax, pt->closed_bytes_per_token);
        }
    if (!lo || ymax <= 0) {
        fputs("<p>No curve points: no policy fits 256 prompt tokens.</p>\n", f);
        return;
    }
    /* the y axis: from 0, round steps (1, 2 or 5 x 10^k KiB) over the highest point */
    kv_cli_axis_t ya = kv_cli_axis(0, ymax / 1024, 5);
    ya.lo *= 1024, ya.hi *= 1024, ya.step *= 1024;
    ymax = ya.hi;
    const double y0 = CURVE_H - CURVE_B, y1 = CURVE_T;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", SVG_W, CURVE_H + 22 * (int)n);
    curve_axes(f, lo, hi, &ya);
    for (uint32_t i = 0; i < n; i++) {
        const char *col = palette[i % N_PALETTE];
        for (int closed = 0; closed < 2; closed++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
                    col, closed ? " stroke-dasharray=\"5,4\" stroke-opacity=\"0.6\"" : "");
            for (uint32_t k = 0; k < r[i].n_curve; k++) {
                const plan_curve_pt_t *pt = &r[i].curve[k];
                double v = closed ? pt->closed_bytes_per_token : pt->bytes_per_token;
                if (isfinite(v))
                    fprintf(f, "%.1f,%.1f ", curve_x(pt->ctx, lo, hi),
                            y0 - (y0 - y1) * v / ymax);
            }
            fputs("\"/>\n", f);
        }
        for (uint32_t k = 0; k < r[i].n_curve; k++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    curve_x(r[i].curve[k].ctx, lo, hi),
                    y0 - (y0 - y1) * r[i].curve[k].bytes_per_token / ymax, col);
        int ly = CURVE_H + 22 * (int)i + 8;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                "stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">", CURVE_L, ly, CURVE_L + 30, ly,
                col, CURVE_L + 38, ly + 4);
        html_str(f, r[i].spec->given);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
}

/* The quality metric the chart plots for r: ΔPPL when any policy has one
 * (metric -1), else the accuracy of retrieval task `metric`; NAN if r has
 * none. */
static double quality_value(const plan_result_t *r, int metric)
{
    const plan_quality_t *q = &r->quality;
    if (metric < 0)
        return q->have && q->have_ppl ? q->delta_ppl : NAN;
    return q->have && q->have_acc[metric] ? q->acc[metric] : NAN;
}

/* Quality against capacity: one labelled point per policy with a quality
 * result, x = max seqs, y = ΔPPL (or a retrieval accuracy when no policy
 * has a perplexity); round axes. */
static void quality_chart(FILE *f, const plan_result_t *r, uint32_t n)
{
    int metric = -2;
    for (uint32_t i = 0; i < n && metric != -1; i++)
        for (int t = -1; t < PLAN_EVALQ_TASKS; t++)
            if (!isnan(quality_value(&r[i], t)) && (metric == -2 || t < metric)) {
                metric = t;
                break;
            }
    if (metric == -2) {
        fputs("<p>No quality results for these policies: no <code>kvpage eval</code> report "
              "on this model (docs/plan.md, \"Quality\").</p>\n", f);
        return;
    }
    double xmax = 1, ylo = 0, yhi = metric < 0 ? 0 : 1;
    for (uint32_t i = 0; i < n; i++) {
        double v = quality_value(&r[i], metric);
        if (isnan(v))
            continue;
        xmax = fmax(xmax, (double)r[i].max_seqs);
        ylo = fmin(ylo, v), yhi = fmax(yhi, v);
    }
    kv_cli_axis_t xa = kv_cli_axis(0, xmax, 6), ya = kv_cli_axis(ylo, yhi, 5);
    const int x0 = CURVE_L, x1 = SVG_W - CURVE_R - 60, y0 = CURVE_H - CURVE_B, y1 = CURVE_T;
#define QX(v) (x0 + (x1 - x0) * ((v) - xa.lo) / (xa.hi - xa.lo))
#define QY(v) (y0 - (y0 - y1) * ((v) - ya.lo) / (ya.hi - ya.lo))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", SVG_W, CURVE_H);
    char lab[32];
    for (int k = 0; k <= xa.n; k++) {
        double x = QX(kv_cli_axis_tick(&xa, k));
        kv_cli_axis_label(&xa, k, 1, lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>"
                "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x, y0, x, y1,
                x, y0 + 16, lab);
    }
    for (int k = 0; k <= ya.n; k++) {
        double y = QY(kv_cli_axis_tick(&ya, k));
        kv_cli_axis_label(&ya, k, 1, lab, sizeof lab);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", x0, y, x1, y,
                x0 - 6, y + 4, lab);
    }
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>"
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>\n", x0, y0, x1,
            y0, x0, y0, x0, y1);
    for (uint32_t i = 0; i < n; i++) {
        double v = quality_value(&r[i], metric);
        if (isnan(v))
            continue;
        double cx = QX((double)r[i].max_seqs), cy = QY(v);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>"
                "<text x=\"%.1f\" y=\"%.1f\">", cx, cy, palette[i % N_PALETTE], cx + 6, cy - 6);
        html_str(f, r[i].spec->given);
        fputs("</text>\n", f);
    }
#undef QX
#undef QY
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">capacity: max "
            "concurrent sequences at the workload's lengths; y: %s%s (kvpage eval)</text>\n"
            "</svg>\n", (x0 + x1) / 2, CURVE_H - 10,
            metric < 0 ? "perplexity minus fp16's" : plan_evalq_tasks[metric],
            metric < 0 ? ", lower is better" : " accuracy, higher is better");
}

static void table(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n)
{
    const int pfx = p->in->prefix_hit > 0;
    fprintf(f, "<table>\n<tr><th>policy</th><th>bytes/token</th><th>closed form</th>"
            "<th>pages/seq</th><th>max seqs</th><th>max ctx</th><th>seqs@ctx</th>%s"
            "<th>quality (kvpage eval)</th></tr>\n",
            pfx ? "<th>prefix hit</th><th>pfx pages/seq</th><th>pfx seqs</th><th>prefill</th>"
                : "");
    for (uint32_t i = 0; i < n; i++) {
        char q[160], c0[32], c1[32];
        plan_report_quality(&r[i].quality, q, sizeof q);
        fputs("<tr><td class=\"l\"><code>", f);
        html_str(f, r[i].spec->given);
        fprintf(f, "</code></td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%llu</td>"
                "<td>%s</td><td>%s</td>", r[i].bytes_per_token,
                r[i].closed_bytes_per_token, r[i].pages_per_seq,
                (unsigned long long)r[i].max_seqs, plan_report_ctx(p, &r[i], 0, c0),
                plan_report_ctx(p, &r[i], 1, c1));
        if (pfx)
            fprintf(f, "<td>%.3f</td><td>%.1f</td><td>%llu</td><td>%.1f</td>", r[i].pfx_hit,
                    r[i].pfx_pages_per_seq, (unsigned long long)r[i].pfx_max_seqs,
                    r[i].pfx_prefill_tokens);
        fputs("<td class=\"l\">", f);
        html_str(f, q);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

int plan_report_html(FILE *f, const plan_t *p, const plan_result_t *r, uint32_t n)
{
    char *setup = NULL, *notes = NULL;
    size_t sn = 0, nn = 0;
    FILE *m1 = open_memstream(&setup, &sn), *m2 = m1 ? open_memstream(&notes, &nn) : NULL;
    if (!m1 || !m2) {
        if (m1)
            fclose(m1);
        free(setup);
        return -ENOMEM;
    }
    plan_report_setup(m1, p, "");
    plan_report_notes(m2, p, r, n, "");
    fclose(m1);
    fclose(m2);
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>kvpage plan: ", f);
    html_str(f, p->in->model.name);
    fputs("</title>\n<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;"
          "color:#222}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px "
          "8px;text-align:right}td.l{text-align:left}li{margin:.2em 0}</style></head><body>\n"
          "<h1>kvpage plan: ", f);
    html_str(f, p->in->model.name);
    fputs(" on ", f);
    html_str(f, p->in->gpu_name);
    fputs("</h1>\n<ul>\n", f);
    html_lines(f, setup);
    fputs("</ul>\n<h2>Capacity per policy</h2>\n", f);
    bars(f, r, n);
    fputs("<h2>Quality against capacity</h2>\n", f);
    quality_chart(f, r, n);
    fputs("<h2>KV bytes per token against context</h2>\n", f);
    curve(f, r, n);
    fputs("<h2>Table</h2>\n", f);
    table(f, p, r, n);
    fputs("<h2>Notes</h2>\n<ul>\n", f);
    html_lines(f, notes);
    fputs("</ul>\n</body></html>\n", f);
    free(setup);
    free(notes);
    return ferror(f) ? -(errno ? errno : EIO) : 0;
}
