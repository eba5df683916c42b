/* SPDX-License-Identifier: MIT */
/*
 * kv_cli_axis.c — round chart axes for the tool's SVG charts (the eval
 * plots, eval_report.c; the plan's HTML report, plan_html.c): ticks at
 * multiples of 1, 2 or 5 x 10^k, the range widened outward to whole ticks
 * (see kv_cli.h). Pure functions, no state.
 */
#include <math.h>
#include <stdio.h>

#include "kv_cli.h"

kv_cli_axis_t kv_cli_axis(double lo, double hi, int max_steps)
{
    if (!isfinite(lo) || !isfinite(hi) || max_steps < 1)
        lo = 0, hi = 1, max_steps = 1;
    if (hi < lo) {
        double t = lo;
        lo = hi;
        hi = t;
    }
    if (hi - lo < 1e-12 * fmax(1.0, fabs(hi)))
        hi = lo + (lo ? fabs(lo) : 1.0);
    static const double mant[] = {1, 2, 5};
    double raw = (hi - lo) / max_steps, mag = pow(10, floor(log10(raw)));
    kv_cli_axis_t a = {0};
    for (int k = 0;; k++) { /* the smallest 1-2-5 step giving at most max_steps */
        a.step = mant[k % 3] * mag * pow(10, k / 3);
        a.lo = floor(lo / a.step + 1e-9) * a.step;
        a.hi = ceil(hi / a.step - 1e-9) * a.step;
        a.n = (int)llround((a.hi - a.lo) / a.step);
        if (a.step >= raw * (1 - 1e-9) && a.n <= max_steps)
            break;
    }
    return a;
}

double kv_cli_axis_tick(const kv_cli_axis_t *a, int i)
{
    double v = a->lo + a->step * i;
    return fabs(v) < a->step * 1e-9 ? 0.0 : v; /* no "-0" */
}

void kv_cli_axis_label(const kv_cli_axis_t *a, int i, double scale, char *buf, size_t len)
{
    double v = kv_cli_axis_tick(a, i) / scale, s = a->step / scale;
    double d = -floor(log10(s) + 1e-9);
    snprintf(buf, len, "%.*f", d > 0 ? (int)d : 0, v);
}
