/* SPDX-License-Identifier: MIT */
/*
 * kv_spec.c — "key=value" settings against a key table (see kv_spec.h).
 *
 * Values are checked strictly: integers are decimal digits only (no sign,
 * no space), reals and amounts are one strtod number with nothing before or
 * after it. A value is written into the object only once it passed every
 * check, so a failed kv_spec_set leaves the object as it was.
 */
#include "kv_spec.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX_VALUE 64u    /* bytes of a value, with the NUL            */
#define SPEC_MAX_AMOUNT 1e9   /* tokens                                    */

int kv_spec_err(int code, char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

uint32_t kv_spec_lookup(const char *const *names, uint32_t n, const char *name,
                        size_t len)
{
    for (uint32_t i = 0; i < n; i++)
        if (names[i] && strlen(names[i]) == len && !memcmp(names[i], name, len))
            return i;
    return n;
}

const kv_spec_key_t *kv_spec_find(kv_spec_table_t t, uint32_t part, const char *name,
                                  size_t len)
{
    for (uint32_t i = 0; i < t.n; i++)
        if (t.keys[i].part == part && strlen(t.keys[i].name) == len &&
            !memcmp(t.keys[i].name, name, len))
            return &t.keys[i];
    return NULL;
}

/* ---- fields ------------------------------------------------------------------ */

static void put_uint(const kv_spec_key_t *k, void *obj, uint64_t v)
{
    char *f = (char *)obj + k->off;
    if (k->size == sizeof(uint64_t)) {
        memcpy(f, &v, sizeof v);
    } else {
        uint32_t v32 = (uint32_t)v;
        memcpy(f, &v32, sizeof v32);
    }
}

static void put_real(const kv_spec_key_t *k, void *obj, double v)
{
    memcpy((char *)obj + k->off, &v, sizeof v);
}

static void put_amount(const kv_spec_key_t *k, void *obj, double v)
{
    kv_spec_amount_t a;
    memset(&a, 0, sizeof a); /* padding too: parsed objects compare bytewise */
    a.v = v;
    a.is_ratio = v < 1.0;
    memcpy((char *)obj + k->off, &a, sizeof a);
}

static uint64_t get_uint(const kv_spec_key_t *k, const void *obj)
{
    const char *f = (const char *)obj + k->off;
    if (k->size == sizeof(uint64_t)) {
        uint64_t v;
        memcpy(&v, f, sizeof v);
        return v;
    }
    uint32_t v32;
    memcpy(&v32, f, sizeof v32);
    return v32;
}

double kv_spec_value(const kv_spec_key_t *k, const void *obj)
{
    const char *f = (const char *)obj + k->off;
    switch (k->kind) {
    case KV_SPEC_UINT:
    case KV_SPEC_ENUM:
        return (double)get_uint(k, obj);
    case KV_SPEC_REAL: {
        double v;
        memcpy(&v, f, sizeof v);
        return v;
    }
    case KV_SPEC_AMOUNT: {
        kv_spec_amount_t a;
        memcpy(&a, f, sizeof a);
        return a.v;
    }
    }
    return NAN;
}

void kv_spec_defaults(kv_spec_table_t t, uint32_t part, void *obj)
{
    for (uint32_t i = 0; i < t.n; i++) {
        const kv_spec_key_t *k = &t.keys[i];
        if (k->part != part)
            continue;
        if (k->kind == KV_SPEC_REAL)
            put_real(k, obj, k->dflt);
        else if (k->kind == KV_SPEC_AMOUNT)
            put_amount(k, obj, k->dflt);
        else
            put_uint(k, obj, (uint64_t)k->dflt);
    }
}

/* ---- values ------------------------------------------------------------------ */

/* Decimal digits only: 0, KV_EINVAL (not digits), KV_ERANGE (> UINT64_MAX). */
static int digits(const char *v, uint64_t *out)
{
    if (!*v)
        return KV_EINVAL;
    uint64_t x = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9')
            return KV_EINVAL;
        uint64_t d = (uint64_t)(*c - '0');
        if (x > (UINT64_MAX - d) / 10)
            return KV_ERANGE;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

/* One number with nothing around it: 0 or KV_EINVAL. */
static int number(const char *v, double *out)
{
    if (!*v || *v == ' ' || *v == '+' || (*v >= '\t' && *v <= '\r'))
        return KV_EINVAL;
    char *end = NULL;
    double x = strtod(v, &end);
    if (*end || isnan(x))
        return KV_EINVAL;
    *out = x;
    return 0;
}

/* "a, b or c" of an ENUM's names. */
static void enum_names(const kv_spec_key_t *k, kv_spec_buf_t *b)
{
    for (uint32_t i = 0; k->names[i]; i++)
        kv_spec_printf(b, "%s%s", i == 0 ? "" : k->names[i + 1] ? ", " : " or ",
                       k->names[i]);
}

/* Parse value v of key k into obj (message prefix "<part>: <k>=<v>: "). */
static int set_value(const kv_spec_key_t *k, const char *part, const char *v, void *obj,
                     char *err, size_t len)
{
    uint64_t u = 0;
    double x = 0;
    int rc;
    switch (k->kind) {
    case KV_SPEC_UINT:
        rc = digits(v, &u);
        if (!rc && (u < k->lo || u > k->hi))
            rc = KV_ERANGE;
        if (rc)
            return kv_spec_err(rc, err, len, "%s: %s=%s: expected an integer in [%llu, %llu]",
                               part, k->name, v, (unsigned long long)k->lo,
                               (unsigned long long)k->hi);
        if (k->mult && u % k->mult != k->rem) {
            if (k->mult == 2 && k->rem == 1)
                return kv_spec_err(KV_EINVAL, err, len, "%s: %s=%s: must be odd", part,
                                   k->name, v);
            return kv_spec_err(KV_EINVAL, err, len, "%s: %s=%s: must be a multiple of %u",
                               part, k->name, v, k->mult);
        }
        put_uint(k, obj, u);
        return 0;
    case KV_SPEC_REAL:
        rc = number(v, &x);
        if (!rc && !(x >= k->rlo && x <= k->rhi))
            rc = KV_ERANGE;
        if (rc)
            return kv_spec_err(rc, err, len, "%s: %s=%s: expected a number in [%g, %g]", part,
                               k->name, v, k->rlo, k->rhi);
        put_real(k, obj, x);
        return 0;
    case KV_SPEC_AMOUNT:
        rc = number(v, &x);
        if (!rc && !(x >= 0.0 && x <= SPEC_MAX_AMOUNT))
            rc = KV_ERANGE;
        if (!rc && x >= 1.0 && x != floor(x))
            rc = KV_EINVAL;
        if (rc)
            return kv_spec_err(rc, err, len, "%s: %s=%s: expected a fraction of the prompt "
                               "in [0, 1) or a whole number of tokens >= 1", part,
                               k->name, v);
        put_amount(k, obj, x);
        return 0;
    case KV_SPEC_ENUM:
        for (uint32_t i = 0; k->names[i]; i++)
            if (!strcmp(k->names[i], v)) {
                put_uint(k, obj, i);
                return 0;
            }
        {
            char names[128];
            kv_spec_buf_t b = {names, sizeof names, 0, 0};
            enum_names(k, &b);
            return kv_spec_err(KV_EINVAL, err, len, "%s: %s=%s: expected %s", part,
                               k->name, v, names);
        }
    }
    return KV_EINVAL;
}

int kv_spec_set(kv_spec_table_t t, uint32_t part, const char *part_name, const char *s,
                size_t len, void *obj, uint64_t *seen, char *err, size_t err_len)
{
    if (len == 0)
        return kv_spec_err(KV_EINVAL, err, err_len, "%s: empty key=value", part_name);
    const char *eq = memchr(s, '=', len);
    if (!eq || eq == s)
        return kv_spec_err(KV_EINVAL, err, err_len, "%s: '%.*s' is not key=value",
                           part_name, (int)len, s);
    size_t kn = (size_t)(eq - s), vn = len - kn - 1;
    const kv_spec_key_t *k = kv_spec_find(t, part, s, kn);
    if (!k) {
        char names[256];
        kv_spec_buf_t b = {names, sizeof names, 0, 0};
        kv_spec_key_names(t, part, &b);
        if (b.at == 0)
            return kv_spec_err(KV_EINVAL, err, err_len, "%s: unknown key '%.*s' (%s takes "
                               "no keys)", part_name, (int)kn, s, part_name);
        return kv_spec_err(KV_EINVAL, err, err_len, "%s: unknown key '%.*s' (valid: %s)",
                           part_name, (int)kn, s, names);
    }
    uint64_t bit = 1ull << (uint32_t)(k - t.keys);
    if (*seen & bit)
        return kv_spec_err(KV_EINVAL, err, err_len, "%s: key '%s' given twice", part_name,
                           k->name);
    char v[SPEC_MAX_VALUE];
    if (vn >= sizeof v)
        return kv_spec_err(KV_EINVAL, err, err_len, "%s: %s=%.20s...: value longer than "
                           "%u bytes", part_name, k->name, eq + 1, SPEC_MAX_VALUE - 1);
    memcpy(v, eq + 1, vn);
    v[vn] = '\0';
    int rc = set_value(k, part_name, v, obj, err, err_len);
    if (!rc)
        *seen |= bit;
    return rc;
}

/* ---- text ---------------------------------------------------------------------- */

void kv_spec_printf(kv_spec_buf_t *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = s->at < s->len ? s->len - s->at : 0;
    int w = vsnprintf(room ? s->b + s->at : NULL, room, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= room)
        s->over = 1;
    s->at += w > 0 ? (size_t)w : 0;
}

/* The shortest decimal that reads back (strtod, as the parser reads it) as
 * exactly v: "0.2", not "0.20000000000000001"; "10000", not "1e+04". */
static void spec_print_real(kv_spec_buf_t *out, double v)
{
    char b[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v)
            break;
    }
    /* no "1e+04": '+' joins a policy's parts; large values in full */
    for (int prec = 0; strstr(b, "e+") && prec <= 17; prec++)
        snprintf(b, sizeof b, "%.*f", prec, v);
    kv_spec_printf(out, "%s", b);
}

uint32_t kv_spec_describe(kv_spec_table_t t, uint32_t part, const void *obj,
                          kv_spec_buf_t *out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t.n; i++) {
        const kv_spec_key_t *k = &t.keys[i];
        if (k->part != part)
            continue;
        double v = kv_spec_value(k, obj);
        if (k->quiet && v == k->dflt)
            continue;
        kv_spec_printf(out, "%s%s=", n++ ? "," : "", k->name);
        if (k->kind == KV_SPEC_ENUM)
            kv_spec_printf(out, "%s", k->names[get_uint(k, obj)]);
        else if (k->kind == KV_SPEC_UINT)
            kv_spec_printf(out, "%llu", (unsigned long long)get_uint(k, obj));
        else if (k->kind == KV_SPEC_AMOUNT && v >= 1.0)
            kv_spec_printf(out, "%.0f", v);
        else
            spec_print_real(out, v);
    }
    return n;
}

void kv_spec_key_names(kv_spec_table_t t, uint32_t part, kv_spec_buf_t *out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t.n; i++)
        if (t.keys[i].part == part)
            kv_spec_printf(out, "%s%s", n++ ? ", " : "", t.keys[i].name);
}
