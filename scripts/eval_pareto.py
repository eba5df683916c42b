#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""eval_pareto.py — merge `kvpage eval --json` reports into the tables a user
picks a KV cache policy by: per policy, how much less KV memory it needed than
fp16 and what it cost in retrieval accuracy and perplexity, with the Pareto
frontier of each trade-off marked (docs/eval.md, "Tables across runs").

Usage: scripts/eval_pareto.py [--md OUT.md] [--svg OUT.svg]
                              [--setting agnostic|aware] [--self-test] REPORT.json...

Inputs: one or more reports as `kvpage eval --json FILE` writes them
(docs/eval.md, "Output"); `results` is what is read (`items` and
`model_sha256` only to warn about a run given twice). Older reports without
`haystack`, `ci95`, `dppl` or `ratio_held` are read too: every number below
is recomputed from `kv_bytes`, `value`, `correct` and `items`, so a report's
own `ratio` field (which meant the held ratio in old reports) is never used.

Outputs: Markdown on stdout, or in OUT.md with --md (`-` = stdout); with
--svg, two panels (retrieval accuracy, ΔPPL %) against log2 of the ratio.
Exit 0 ok; 1 a self-test failed or an output could not be written whole;
2 usage, or a report missing, not JSON or not shaped like an eval report
(one line naming the file), or an output path that cannot be opened.

Invariants:
- Policies are merged by their spec string, across reports: retrieval cells
  pool correct/items per (task, haystack, ctx); ppl pools the texts.
- Every per-result number is relative to the fp16 result of the same report
  and the same cell (ppl: text and ctx; retrieval: task, haystack and ctx):
  ratio = fp16 kv_bytes / this kv_bytes, ΔPPL = ppl / fp16 ppl - 1. A result
  whose report has no such fp16 cell has no ratio or ΔPPL (shown as `-`),
  and its policy is not placed on that frontier.
- A policy's ratio is the unweighted mean of its per-result ratios, kept
  apart for ppl and retrieval (their contexts differ).
- "vs fp16" for retrieval is the policy's pooled accuracy over fp16's, both
  over the report cells both have (the same items), not over all of fp16's.
- Frontier (F): no other policy has ratio >= and quality >= with one of the
  two strictly better (quality: pooled accuracy, or -mean ΔPPL). Ties are all
  on it. Intervals are not considered: with few items, F is only as sure as
  the intervals next to it.
- A result given twice (same model and policy, and the same ppl text and ctx
  or the same retrieval items by depth, answer and prompt length) with the
  same measurements (correct, items, value, kv_bytes) is counted once (fp16,
  run as every report's reference, is the usual case), with a note on stderr
  per pair of files; a repeat that measured otherwise is pooled, with a
  warning. Two runs of one cell with other depths or another seed are
  different items and pool silently.
- Retrieval results of the query-agnostic and query-aware settings (the
  report's `setting`; a report without one predates it and is query-aware)
  are never pooled: with reports of both settings, --setting says which
  retrieval results are read (the other setting's are dropped, perplexity
  is kept: it does not depend on the setting); without it that is a usage
  error.
- Standard library only; reads nothing but the named files.
"""
import argparse
import json
import math
import os
import stat
import sys
import tempfile
import xml.dom.minidom

PROG = "eval_pareto"
Z95 = 1.959963984540054
TASK_ORDER = {"passkey": 0, "needle": 1, "vt": 2}


class ReportError(Exception):
    """A report that cannot be used; str() is the one-line reason."""


def wilson(k, n):
    """95% Wilson score interval of k successes in n trials, as (lo, hi)."""
    if n <= 0 or k < 0 or k > n:
        return (0.0, 1.0)
    p = k / n
    z2n = Z95 * Z95 / n
    c = (p + z2n / 2) / (1 + z2n)
    h = Z95 * math.sqrt(p * (1 - p) / n + z2n / (4.0 * n)) / (1 + z2n)
    lo = 0.0 if k == 0 else max(0.0, c - h)
    hi = 1.0 if k == n else min(1.0, c + h)
    return (lo, hi)


# ---- reading ----------------------------------------------------------------

def _num(r, key, i, ints=False):
    v = r.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ReportError("results[%d] (%s): '%s' is not a finite non-negative number"
                          % (i, r.get("policy"), key))
    if ints and v != int(v):
        raise ReportError("results[%d] (%s): '%s' is not an integer" % (i, r.get("policy"), key))
    return int(v) if ints else float(v)


def load_report(path):
    """The report at path as {path, model, results: [normalized]}; a
    retrieval result's `sig` is its items' (depth, expect, tokens), sorted."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before open: a FIFO would block it
            raise ReportError("not a regular file")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ReportError("cannot read: %s" % (e.strerror or e))
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ReportError("not JSON: %s" % e)
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ReportError("not a kvpage eval report (no 'results' list)")
    out = []
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict):
            raise ReportError("results[%d] is not an object" % i)
        pol, task = r.get("policy"), r.get("task")
        if not isinstance(pol, str) or not pol or not isinstance(task, str) or not task:
            raise ReportError("results[%d] has no 'policy' or 'task' string" % i)
        x = {"policy": pol, "task": task, "ctx": _num(r, "ctx", i, True),
             "kv_bytes": _num(r, "kv_bytes", i)}
        if task == "ppl":
            text = r.get("text")
            if not isinstance(text, str):
                raise ReportError("results[%d] (%s): ppl without a 'text'" % (i, pol))
            x["text"] = text
            x["value"] = _num(r, "value", i)
        else:
            hay = r.get("haystack")
            if hay is not None and not isinstance(hay, str):
                raise ReportError("results[%d] (%s): 'haystack' is not a string" % (i, pol))
            x["haystack"] = hay
            x["items"] = _num(r, "items", i, True)
            x["correct"] = _num(r, "correct", i, True)
            if x["correct"] > x["items"]:
                raise ReportError("results[%d] (%s): correct > items" % (i, pol))
        out.append(x)
    if not out:
        raise ReportError("not a kvpage eval report (no results)")
    # What each retrieval result's items were (depth, expected answer, prompt
    # tokens), from `items` where the report has it: to tell a repeated run
    # from another run of the same cell (other depths or seed).
    sig = {}
    items = doc.get("items")
    for it in items if isinstance(items, list) else []:
        if isinstance(it, dict):
            k = (it.get("policy"), it.get("task"), it.get("haystack"), it.get("ctx"))
            sig.setdefault(k, []).append((str(it.get("depth")), str(it.get("expect")),
                                          str(it.get("tokens"))))
    for x in out:
        if x["task"] != "ppl":
            x["sig"] = tuple(sorted(sig.get((x["policy"], x["task"], x["haystack"], x["ctx"]), ())))
    setting = doc.get("setting", "query-aware")
    if setting not in ("query-agnostic", "query-aware"):
        raise ReportError("'setting' is neither query-agnostic nor query-aware")
    if not any(x["task"] != "ppl" for x in out):
        setting = None  # perplexity only: either setting
    return {"path": path, "model": doc.get("model_sha256"), "results": out, "setting": setting}


def select_setting(reps, want):
    """Keep the retrieval results of setting want ("query-agnostic",
    "query-aware" or None: the one setting the reports have); raises
    ReportError when the reports mix settings and want is None."""
    have = sorted({r["setting"] for r in reps if r["setting"]})
    if want is None:
        if len(have) > 1:
            raise ReportError("the reports mix query-agnostic and query-aware retrieval: "
                              "choose one with --setting agnostic|aware")
        return reps
    for r in reps:
        if r["setting"] and r["setting"] != want:
            r["results"] = [x for x in r["results"] if x["task"] == "ppl"]
    return [r for r in reps if r["results"]]


def cell_of(x):
    """The key a result is compared with fp16's under, within one report."""
    if x["task"] == "ppl":
        return ("ppl", x["text"], x["ctx"])
    return (x["task"], x["haystack"], x["ctx"])


# ---- merging ----------------------------------------------------------------

def merge(reports):
    """Per policy spec, in first-seen order: the pooled numbers (see the
    module comment). Returns (policies: list of dicts, warnings: list)."""
    pols, order, seen, dups = {}, [], {}, {}
    for rep in reports:
        ref = {cell_of(x): x for x in rep["results"] if x["policy"] == "fp16"}
        for x in rep["results"]:
            p = pols.get(x["policy"])
            if p is None:
                p = pols[x["policy"]] = {
                    "policy": x["policy"], "ppl_ratios": [], "dppl": [], "texts": 0,
                    "ret_ratios": [], "cells": {}, "correct": 0, "items": 0,
                    "both": [0, 0, 0, 0]}  # correct, items; fp16's: on cells both have
                order.append(x["policy"])
            cell = cell_of(x)
            if x["task"] == "ppl" or x["sig"]:
                dup = (rep["model"], x["policy"], cell, x.get("sig"))
                meas = tuple(x.get(k) for k in ("correct", "items", "value", "kv_bytes"))
                if dup in seen:
                    same = seen[dup][1] == meas
                    pair = (rep["path"], seen[dup][0], same)
                    dups[pair] = dups.get(pair, 0) + 1
                    if same:  # the same measurement: counted once
                        continue
                else:
                    seen[dup] = (rep["path"], meas)
            r = ref.get(cell)
            ratio = (r["kv_bytes"] / x["kv_bytes"]
                     if r and x["kv_bytes"] > 0 and r["kv_bytes"] > 0 else None)
            if x["task"] == "ppl":
                p["texts"] += 1
                if ratio is not None:
                    p["ppl_ratios"].append(ratio)
                if r and r["value"] > 0:
                    p["dppl"].append(100.0 * (x["value"] / r["value"] - 1.0))
                continue
            if ratio is not None:
                p["ret_ratios"].append(ratio)
            key = (x["task"], x["haystack"], x["ctx"])
            c = p["cells"].setdefault(key, [0, 0])
            c[0] += x["correct"]
            c[1] += x["items"]
            p["correct"] += x["correct"]
            p["items"] += x["items"]
            if r:
                b = p["both"]
                b[0], b[1] = b[0] + x["correct"], b[1] + x["items"]
                b[2], b[3] = b[2] + r["correct"], b[3] + r["items"]
    warns = ["%s repeats %d result%s of %s (same model, policy, text or retrieval items)%s"
             % (a, n, "s" * (n != 1), b,
                ", measured alike: counted once" if same else ", measured otherwise: pooled")
             for (a, b, same), n in dups.items()]
    mean = lambda v: sum(v) / len(v) if v else None
    out = []
    for name in order:
        p = pols[name]
        p["ppl_ratio"] = mean(p["ppl_ratios"])
        p["ret_ratio"] = mean(p["ret_ratios"])
        p["dppl_mean"] = mean(p["dppl"])
        p["dppl_min"] = min(p["dppl"]) if p["dppl"] else None
        p["dppl_max"] = max(p["dppl"]) if p["dppl"] else None
        p["acc"] = p["correct"] / p["items"] if p["items"] else None
        p["ci"] = wilson(p["correct"], p["items"])
        c, n, rc, rn = p["both"]
        p["vs_fp16"] = (c / n) / (rc / rn) if n and rc else None
        out.append(p)
    return out, warns


def frontier(points):
    """Names of the non-dominated points of {name: (x, y)}, both higher better."""
    on = set()
    for a, (xa, ya) in points.items():
        if not any((xb >= xa and yb >= ya and (xb > xa or yb > ya))
                   for b, (xb, yb) in points.items() if b != a):
            on.add(a)
    return on


def with_frontiers(pols):
    """Sets p['ret_f'] / p['ppl_f'] and returns (retrieval rows, ppl rows),
    each sorted by its ratio (unknown ratios last)."""
    ret = [p for p in pols if p["items"]]
    ppl = [p for p in pols if p["texts"]]
    fr = frontier({p["policy"]: (p["ret_ratio"], p["acc"])
                   for p in ret if p["ret_ratio"] is not None})
    fp = frontier({p["policy"]: (p["ppl_ratio"], -p["dppl_mean"])
                   for p in ppl if p["ppl_ratio"] is not None and p["dppl_mean"] is not None})
    for p in pols:
        p["ret_f"] = p["policy"] in fr
        p["ppl_f"] = p["policy"] in fp
    key = lambda k: (lambda p: (p[k] is None, p[k] or 0.0))
    return sorted(ret, key=key("ret_ratio")), sorted(ppl, key=key("ppl_ratio"))


# ---- Markdown ---------------------------------------------------------------

def fmt_ratio(r):
    return "-" if r is None else "%.2fx" % r


def fmt_acc(k, n):
    lo, hi = wilson(k, n)
    return "%d/%d %.2f [%.2f, %.2f]" % (k, n, k / n, lo, hi) if n else "-"


def cell_name(key):
    task, hay, ctx = key
    return " ".join([task] + ([hay] if hay else []) + [str(ctx)])


def markdown(reports, pols):
    ret, ppl = with_frontiers(pols)
    L = ["# KV cache policies across %d report%s" % (len(reports), "s" * (len(reports) != 1)),
         "", "Reports: " + ", ".join("`%s`" % r["path"] for r in reports) + ".", "",
         "Ratio: fp16's KV bytes / the policy's on the same cell of the same report, "
         "mean over the policy's results. Accuracy: correct/items, acc [95% Wilson "
         "interval], pooled over reports. ΔPPL: the policy's perplexity / fp16's on the "
         "same text of the same report - 1. **F**: on the Pareto frontier (no other policy "
         "has a ratio as high or higher and an accuracy as high or higher, or a mean ΔPPL "
         "as low or lower, one of the two strictly).", ""]
    L.append("## Retrieval")
    L.append("")
    if not ret:
        L += ["No retrieval results.", ""]
    else:
        cells = sorted({k for p in ret for k in p["cells"]},
                       key=lambda k: (TASK_ORDER.get(k[0], 9), k[0], k[1] or "", k[2]))
        L.append("| F | policy | ratio vs fp16 | " + " | ".join(cell_name(k) for k in cells)
                 + " | all retrieval | acc / fp16's (same items) |")
        L.append("|---|---|---:|" + "---:|" * len(cells) + "---:|---:|")
        for p in ret:
            row = ["**F**" if p["ret_f"] else "", p["policy"], fmt_ratio(p["ret_ratio"])]
            row += [fmt_acc(*p["cells"][k]) if k in p["cells"] else "-" for k in cells]
            row.append(fmt_acc(p["correct"], p["items"]))
            row.append("-" if p["vs_fp16"] is None else "%.2f" % p["vs_fp16"])
            L.append("| " + " | ".join(row) + " |")
        L.append("")
    L.append("## Perplexity")
    L.append("")
    if not ppl:
        L += ["No perplexity results.", ""]
    else:
        L.append("| F | policy | ratio vs fp16 | ΔPPL % vs fp16: mean [min, max] (texts) |")
        L.append("|---|---|---:|---:|")
        for p in ppl:
            if p["dppl"]:
                d = "%+.2f%% [%+.2f, %+.2f] (%d)" % (p["dppl_mean"], p["dppl_min"],
                                                     p["dppl_max"], len(p["dppl"]))
            else:
                d = "- (%d)" % p["texts"]
            L.append("| %s | %s | %s | %s |" % ("**F**" if p["ppl_f"] else "", p["policy"],
                                                 fmt_ratio(p["ppl_ratio"]), d))
        L.append("")
    return "\n".join(L)


# ---- SVG --------------------------------------------------------------------
# Two panels side by side, then a legend. A point is labelled with its
# policy's number (the same in both panels, the order policies were first
# seen in); the legend names them. Points closer than 5 px share one label.

PW, PH = 480, 380  # one panel, px
ML, MR, MT, MB = 62, 16, 34, 48  # plot margins inside a panel, px
LEG_ROW, LEG_COL = 14, 320  # legend row height and column width, px


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def nice_ticks(lo, hi, n=5):
    """Round tick values from <= lo to >= hi, about n steps."""
    span = hi - lo
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 2.5, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 10) for k in range(first, last + 1)]


def place_labels(marks, box):
    """marks: [(x, y, text)]; returns [(lx, ly, text)] (text baseline at ly,
    start-anchored), each inside box (x0, y0, x1, y1) where a place is found,
    overlapping no other label and no mark."""
    taken = [(x - 4, y - 4, x + 4, y + 4) for x, y, _ in marks]
    out = []
    for x, y, t in marks:
        w, h = 6 * len(t) + 2, 11
        best = None
        for rad in (6, 14, 24, 36):
            for dx, dy in ((1, -1), (1, 1), (-1, -1), (-1, 1), (0, -1.4), (0, 1.4), (1.4, 0),
                           (-1.4, 0)):
                cx, cy = x + dx * rad, y + dy * rad  # the corner nearest the mark
                r = (cx if dx >= 0 else cx - w) if dx else cx - w / 2
                top = cy - h if dy <= 0 else cy
                if dy == 0:
                    top = cy - h / 2
                rect = (r, top, r + w, top + h)
                if (rect[0] < box[0] or rect[2] > box[2] or rect[1] < box[1] or rect[3] > box[3]):
                    continue
                if any(rect[0] < q[2] and q[0] < rect[2] and rect[1] < q[3] and q[1] < rect[3]
                       for q in taken):
                    continue
                best = rect
                break
            if best:
                break
        if best is None:  # crowded: to the right, overlapping if it must
            best = (min(x + 6, box[2] - w), y - h, min(x + 6, box[2] - w) + w, y)
        taken.append(best)
        out.append((best[0] + 1, best[3] - 2, t))
    return out


def svg_panel(ox, title, ylabel, pts, ylo, yhi, yticks, yfmt):
    """One panel at x offset ox. pts: [(number, ratio, y, bar_lo, bar_hi, on_f)]."""
    pw, ph = PW - ML - MR, PH - MT - MB
    o = ['<g transform="translate(%d,0)">' % ox,
         '<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>' % (ML, esc(title)),
         '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>'
         % (ML, MT, pw, ph)]
    if not pts:
        o.append('<text x="%d" y="%d" font-size="12" fill="#666">no results</text>'
                 % (ML + 10, MT + ph // 2))
        return o + ["</g>"]
    xs = [math.log2(p[1]) for p in pts]
    x0, x1 = math.floor(min(xs)), math.ceil(max(xs))
    if x1 - x0 < 1:
        x1 = x0 + 1
    X = lambda r: ML + (math.log2(r) - x0) / (x1 - x0) * pw
    Y = lambda v: MT + ph - (v - ylo) / (yhi - ylo) * ph
    for k in range(x0, x1 + 1):
        x = ML + (k - x0) / (x1 - x0) * pw
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (x, MT, x, MT + ph))
        o.append('<text x="%.1f" y="%d" font-size="11" text-anchor="middle">%gx</text>'
                 % (x, MT + ph + 15, 2.0 ** k))
    for t in yticks:
        y = Y(t)
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>' % (ML, y, ML + pw, y))
        o.append('<text x="%d" y="%.1f" font-size="11" text-anchor="end">%s</text>'
                 % (ML - 4, y + 4, yfmt(t)))
    o.append('<text x="%d" y="%d" font-size="12" text-anchor="middle">'
             'KV bytes ratio vs fp16 (log2 scale)</text>' % (ML + pw // 2, PH - 10))
    o.append('<text x="14" y="%d" font-size="12" text-anchor="middle" '
             'transform="rotate(-90 14 %d)">%s</text>' % (MT + ph // 2, MT + ph // 2, esc(ylabel)))
    fr = sorted((p for p in pts if p[5]), key=lambda p: (p[1], -p[2]))
    if len(fr) > 1:
        o.append('<polyline fill="none" stroke="#d62728" stroke-width="1.5" '
                 'stroke-dasharray="4 3" points="%s"/>'
                 % " ".join("%.1f,%.1f" % (X(p[1]), Y(p[2])) for p in fr))
    groups = []  # [x, y, [numbers]]: points within 5 px share a label
    for num, r, y, blo, bhi, on_f in pts:
        cx, cy = X(r), Y(y)
        if blo is not None:
            a, b = Y(blo), Y(bhi)
            o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>'
                     % (cx, a, cx, b))
            for e in (a, b):
                o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>'
                         % (cx - 3, e, cx + 3, e))
        o.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>'
                 % (cx, cy, "#d62728" if on_f else "#1f77b4"))
        for g in groups:
            if abs(g[0] - cx) < 5 and abs(g[1] - cy) < 5:
                g[2].append(num)
                break
        else:
            groups.append([cx, cy, [num]])
    marks = [(g[0], g[1], ",".join(map(str, g[2]))) for g in groups]
    for lx, ly, t in place_labels(marks, (ML + 1, MT + 1, ML + pw - 1, MT + ph - 1)):
        o.append('<text x="%.1f" y="%.1f" font-size="10">%s</text>' % (lx, ly, t))
    return o + ["</g>"]


def svg(pols):
    ret, ppl = with_frontiers(pols)
    num = {p["policy"]: i + 1 for i, p in enumerate(pols)}
    rp = [(num[p["policy"]], p["ret_ratio"], p["acc"], p["ci"][0], p["ci"][1], p["ret_f"])
          for p in ret if p["ret_ratio"]]
    pp = [(num[p["policy"]], p["ppl_ratio"], p["dppl_mean"], p["dppl_min"], p["dppl_max"],
           p["ppl_f"]) for p in ppl if p["ppl_ratio"] and p["dppl"]]
    lo = min([0.0] + [p[3] for p in pp])
    hi = max([0.0] + [p[4] for p in pp])
    if hi - lo < 1e-9:
        hi = lo + 1.0
    pad = (hi - lo) * 0.08
    yt = nice_ticks(lo - pad, hi + pad)
    cols = 3
    rows = (len(pols) + cols - 1) // cols
    H = PH + 24 + LEG_ROW * (rows + 1)
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'viewBox="0 0 %d %d" font-family="sans-serif">' % (2 * PW, H, 2 * PW, H),
         '<rect width="%d" height="%d" fill="white"/>' % (2 * PW, H)]
    o += svg_panel(0, "Retrieval accuracy (pooled; bar: 95% Wilson)", "accuracy",
                   rp, 0.0, 1.0, [0, 0.25, 0.5, 0.75, 1.0], lambda t: "%.2f" % t)
    o += svg_panel(PW, "Perplexity (point: mean ΔPPL; bar: min..max)", "ΔPPL vs fp16 (%)",
                   pp, yt[0], yt[-1], yt, lambda t: "%+g%%" % t)
    y0 = PH + 16
    o.append('<text x="%d" y="%d" font-size="11" fill="#444">red, dashed: on the Pareto '
             'frontier (F) of that panel</text>' % (ML, y0))
    for i, p in enumerate(pols):
        f = [w for w, k in (("retrieval", "ret_f"), ("ppl", "ppl_f")) if p[k]]
        o.append('<text x="%d" y="%d" font-size="11">%d  %s%s</text>'
                 % (ML + (i // rows) * LEG_COL, y0 + LEG_ROW * (1 + i % rows), i + 1,
                    esc(p["policy"]), " (F: %s)" % ", ".join(f) if f else ""))
    o.append("</svg>")
    return "\n".join(o) + "\n"


# ---- self-test --------------------------------------------------------------

def _synthetic(d):
    """Two small reports in directory d; returns their paths."""
    def ppl(pol, text, value, kv):
        return {"policy": pol, "task": "ppl", "ctx": 576, "text": text, "value": value,
                "kv_bytes": kv, "fp16_bytes": kv, "meta_bytes": 1, "ratio": 0}

    def ret(pol, task, hay, ok, n, kv):
        return {"policy": pol, "task": task, "ctx": 1024, "haystack": hay, "items": n,
                "correct": ok, "value": ok / n, "kv_bytes": kv, "fp16_bytes": kv,
                "meta_bytes": 1, "ratio": 0}

    a = {"seed": 1, "model_sha256": "m", "results": [
        ppl("fp16", "T1", 20.0, 1000), ppl("snap", "T1", 21.0, 250), ppl("h2o", "T1", 22.0, 200),
        ppl("kivi2", "T1", 20.5, 125),
        ret("fp16", "passkey", "lic", 1, 1, 4000), ret("snap", "passkey", "lic", 1, 1, 1000),
        ret("h2o", "passkey", "lic", 0, 1, 800), ret("kivi2", "passkey", "lic", 0, 1, 500)],
        "items": [{"policy": p, "task": "passkey", "haystack": "lic", "ctx": 1024,
                   "tokens": 1000, "depth": 50, "ok": 1, "expect": "12345", "got": "x"}
                  for p in ("fp16", "snap", "h2o", "kivi2")]}
    b = {"seed": 2, "model_sha256": "m", "results": [
        ppl("fp16", "T2", 10.0, 2000), ppl("snap", "T2", 11.0, 1000),
        ret("fp16", "needle", None, 20, 20, 8000), ret("snap", "needle", None, 10, 20, 2000)]}
    paths = []
    for name, doc in (("a.json", a), ("b.json", b)):
        paths.append(os.path.join(d, name))
        with open(paths[-1], "w") as f:
            json.dump(doc, f)
    return paths


def self_test():
    bad = []

    def check(what, ok):
        if not ok:
            bad.append(what)

    def near(a, b, eps=5e-3):
        return a is not None and abs(a - b) < eps

    lo, hi = wilson(1, 1)
    check("wilson 1/1 = [0.21, 1.00]", near(lo, 0.2065) and hi == 1.0)
    lo, hi = wilson(0, 1)
    check("wilson 0/1 = [0.00, 0.79]", lo == 0.0 and near(hi, 0.7935))
    check("wilson 20/20 lo = 0.84", near(wilson(20, 20)[0], 0.8389))
    lo, hi = wilson(19, 20)
    check("wilson 19/20 = [0.76, 0.99]", near(lo, 0.7639) and near(hi, 0.9911))
    with tempfile.TemporaryDirectory() as d:
        paths = _synthetic(d)
        reps = [load_report(p) for p in paths]
        pols, warns = merge(reps)
        P = {p["policy"]: p for p in pols}
        check("policies in first-seen order", [p["policy"] for p in pols]
              == ["fp16", "snap", "h2o", "kivi2"])
        check("no duplicate warning", not warns)
        s = P["snap"]
        check("snap pools 11/21 items", (s["correct"], s["items"]) == (11, 21))
        check("snap cells", s["cells"] == {("passkey", "lic", 1024): [1, 1],
                                           ("needle", None, 1024): [10, 20]})
        check("snap ppl texts 2", s["texts"] == 2 and len(s["dppl"]) == 2)
        check("snap dppl each report's fp16: +5%, +10%",
              near(s["dppl_min"], 5.0) and near(s["dppl_max"], 10.0) and near(s["dppl_mean"], 7.5))
        check("snap ppl ratio mean(4, 2) = 3", near(s["ppl_ratio"], 3.0))
        check("snap ret ratio mean(4, 4) = 4", near(s["ret_ratio"], 4.0))
        check("snap vs fp16 on same items (11/21)/(21/21)", near(s["vs_fp16"], 11 / 21))
        check("fp16 ratio 1, dppl 0", near(P["fp16"]["ppl_ratio"], 1.0)
              and near(P["fp16"]["dppl_mean"], 0.0) and near(P["fp16"]["vs_fp16"], 1.0))
        check("h2o ret ratio 5, ppl +10%", near(P["h2o"]["ret_ratio"], 5.0)
              and near(P["h2o"]["dppl_mean"], 10.0))
        ret, ppl = with_frontiers(pols)
        check("retrieval sorted by ratio", [p["policy"] for p in ret]
              == ["fp16", "snap", "h2o", "kivi2"])
        # retrieval: fp16 (1, 1.0), snap (4, .52), h2o (5, 0), kivi2 (8, 0):
        # h2o is dominated by kivi2 (more ratio, same accuracy).
        check("retrieval frontier fp16, snap, kivi2",
              {p["policy"] for p in pols if p["ret_f"]} == {"fp16", "snap", "kivi2"})
        # ppl: fp16 (1, 0%), snap (3, 7.5%), h2o (5, 10%), kivi2 (8, 2.5%):
        # kivi2 dominates snap and h2o.
        check("ppl frontier fp16, kivi2",
              {p["policy"] for p in pols if p["ppl_f"]} == {"fp16", "kivi2"})
        md = markdown(reps, pols)
        check("markdown snap retrieval row",
              "| **F** | snap | 4.00x | 1/1 1.00 [0.21, 1.00] | 10/20 0.50 [0.30, 0.70] | "
              "11/21 0.52 [0.32, 0.72] | 0.52 |" in md)
        check("markdown kivi2 ppl row",
              "| **F** | kivi2 | 8.00x | +2.50% [+2.50, +2.50] (1) |" in md)
        try:
            doc = xml.dom.minidom.parseString(svg(pols).encode("utf-8"))
            check("svg has 2 frontier polylines",
                  len(doc.getElementsByTagName("polyline")) == 2)
            check("svg has a point per policy per panel",
                  len(doc.getElementsByTagName("circle")) == 8)
        except Exception as e:  # a parse error is a failure, reported below
            check("svg parses as XML (%s)" % e, False)
        # The same report twice: counted once, with a note; a repeat measured
        # otherwise: pooled, with a warning; a broken one: ReportError naming why.
        twice, w = merge([reps[0], dict(load_report(paths[0]), path="x")])
        once = merge([reps[0]])[0]
        check("a report given twice: one note, 8 results, counted once",
              len(w) == 1 and " 8 results" in w[0] and "counted once" in w[0]
              and [(p["correct"], p["items"], p["texts"]) for p in twice]
              == [(p["correct"], p["items"], p["texts"]) for p in once])
        moved = dict(load_report(paths[0]), path="x2")
        moved["results"] = [dict(x, kv_bytes=x["kv_bytes"] + 1) for x in moved["results"]]
        w = merge([reps[0], moved])[1]
        check("a repeat measured otherwise: pooled, warned",
              len(w) == 1 and "pooled" in w[0])
        other = dict(reps[0], path="y", results=[dict(x, sig=(("0", "1", "1"),))
                                                 for x in reps[0]["results"] if "sig" in x])
        check("other items of the same cell: no warning", not merge([reps[0], other])[1])
        # A policy whose report has no fp16: no ratio, ΔPPL or frontier.
        orphan = {"path": "z", "model": "m", "results": [
            {"policy": "lone", "task": "ppl", "ctx": 1, "text": "T1", "value": 5.0,
             "kv_bytes": 10.0},
            {"policy": "lone", "task": "vt", "ctx": 1, "haystack": None, "items": 4,
             "correct": 4, "kv_bytes": 10.0, "sig": ()}]}
        pols = merge(reps + [orphan])[0]
        md = markdown(reps + [orphan], pols)
        lone = [p for p in pols if p["policy"] == "lone"][0]
        check("no fp16: no ratio, no ΔPPL, not F", lone["ppl_ratio"] is None
              and lone["ret_ratio"] is None and not lone["dppl"] and lone["vs_fp16"] is None
              and not lone["ret_f"] and not lone["ppl_f"])
        check("no fp16: rows with -", "|  | lone | - | - | - | 4/4 1.00 [0.51, 1.00] | "
              "4/4 1.00 [0.51, 1.00] | - |" in md and "|  | lone | - | - (1) |" in md)
        check("no fp16: the others' frontier unchanged",
              {p["policy"] for p in pols if p["ret_f"]} == {"fp16", "snap", "kivi2"})
        svg(pols)
        # Settings: an agnostic report beside the (older, aware) ones.
        ag_path = os.path.join(d, "ag.json")
        with open(ag_path, "w") as f:
            json.dump({"model_sha256": "m", "setting": "query-agnostic", "results": [
                {"policy": "fp16", "task": "passkey", "ctx": 1024, "haystack": "lic",
                 "items": 2, "correct": 2, "kv_bytes": 4000},
                {"policy": "snap", "task": "passkey", "ctx": 1024, "haystack": "lic",
                 "items": 2, "correct": 0, "kv_bytes": 1000},
                {"policy": "snap", "task": "ppl", "ctx": 576, "text": "T3", "value": 1.0,
                 "kv_bytes": 1}]}, f)
        ag = load_report(ag_path)
        check("setting read; old reports are query-aware",
              ag["setting"] == "query-agnostic" and reps[0]["setting"] == "query-aware")
        try:
            select_setting([dict(r) for r in reps] + [dict(ag)], None)
            check("mixed settings refused without --setting", False)
        except ReportError:
            pass
        only = select_setting([dict(r) for r in reps] + [dict(ag)], "query-agnostic")
        P2 = {p["policy"]: p for p in merge(only)[0]}
        check("agnostic: snap 0/2 retrieval, ppl of every report kept",
              (P2["snap"]["correct"], P2["snap"]["items"]) == (0, 2)
              and P2["snap"]["texts"] == 3)
        for name, text in (("bad.json", "{"), ("shape.json", '{"results": [{"policy": 1}]}'),
                           ("neg.json", '{"results": [{"policy": "p", "task": "vt", "ctx": 1,'
                                        ' "kv_bytes": 1, "items": 1, "correct": 2}]}')):
            p = os.path.join(d, name)
            with open(p, "w") as f:
                f.write(text)
            try:
                load_report(p)
                check("%s refused" % name, False)
            except ReportError:
                pass
        try:
            load_report(os.path.join(d, "missing.json"))
            check("missing file refused", False)
        except ReportError:
            pass
    if bad:
        print("%s: self-test FAILED: %s" % (PROG, "; ".join(bad)), file=sys.stderr)
        return 1
    print("%s: self-test ok" % PROG)
    return 0


# ---- main -------------------------------------------------------------------

def write_out(path, text):
    """Writes text to path ('-' = stdout); returns an exit code."""
    if path == "-":
        sys.stdout.write(text)
        return 0
    try:
        f = open(path, "w", encoding="utf-8")
    except OSError as e:
        print("%s: %s: cannot open: %s" % (PROG, path, e.strerror or e), file=sys.stderr)
        return 2
    try:
        with f:
            f.write(text)
    except OSError as e:
        print("%s: %s: cannot write: %s" % (PROG, path, e.strerror or e), file=sys.stderr)
        return 1
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="eval_pareto.py", description="Merge kvpage eval "
                                 "--json reports into per-policy tables with Pareto frontiers.")
    ap.add_argument("--md", metavar="OUT.md", help="write the Markdown here ('-' = stdout)")
    ap.add_argument("--svg", metavar="OUT.svg", help="write the two-panel SVG here")
    ap.add_argument("--setting", choices=("agnostic", "aware"),
                    help="the retrieval setting to read when the reports have both")
    ap.add_argument("--self-test", action="store_true", help="check this script, then exit")
    ap.add_argument("reports", nargs="*", metavar="REPORT.json")
    a = ap.parse_args(argv)
    if a.self_test:
        if a.reports or a.md or a.svg:
            ap.error("--self-test takes no reports or outputs")
        return self_test()
    if not a.reports:
        ap.error("no REPORT.json given")
    if a.md == "" or a.svg == "":
        ap.error("empty output path")
    reps = []
    for path in a.reports:
        try:
            reps.append(load_report(path))
        except ReportError as e:
            print("%s: %s: %s" % (PROG, path, e), file=sys.stderr)
            return 2
    try:
        reps = select_setting(reps, a.setting and "query-" + a.setting)
    except ReportError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    if not reps:
        print("%s: no report has results of the query-%s setting" % (PROG, a.setting),
              file=sys.stderr)
        return 2
    pols, warns = merge(reps)
    for w in warns:
        print("%s: %s: %s" % (PROG, "note" if w.endswith("counted once") else "warning", w),
              file=sys.stderr)
    rc = write_out(a.md or "-", markdown(reps, pols))
    if not rc and a.svg:
        rc = write_out(a.svg, svg(pols))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
