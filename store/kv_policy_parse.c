/*
 * kv_policy_parse.c — policy strings to kv_policy_t and back (the grammar is
 * in docs/policies.md): parts joined by '+', each "name" or
 * "name:key=value,key=value". Every key has a range; an unknown method or
 * key, a bad value, a repeated part or an invalid composition is KV_EINVAL
 * with a message naming it. kv_policy_describe writes the canonical spec
 * (every key with its value), which parses back to the same policy.
 *
 * Ownership: kv_policy_parse allocates the policy (kv_mem); the caller
 * destroys it. A parsed policy is never modified (except by the test hook).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"

#define POL_MAX_SPEC 1024u

static int perr(char *err, size_t len, const char *fmt, ...)
{
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return KV_EINVAL;
}

/* A whole-number value in [lo, hi]. */
static int get_uint(const char *m, const char *k, const char *val, uint64_t lo,
                    uint64_t hi, uint64_t *out, char *err, size_t len)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(val, &end, 10);
    if (!*val || *end || errno || *val == '-' || x < lo || x > hi)
        return perr(err, len, "%s: %s=%s: expected an integer in [%llu, %llu]", m,
                    k, val, (unsigned long long)lo, (unsigned long long)hi);
    *out = x;
    return 0;
}

static int get_real(const char *m, const char *k, const char *val, double lo,
                    double hi, double *out, char *err, size_t len)
{
    char *end = NULL;
    double x = strtod(val, &end);
    if (!*val || *end || !(x >= lo && x <= hi))
        return perr(err, len, "%s: %s=%s: expected a number in [%g, %g]", m, k,
                    val, lo, hi);
    *out = x;
    return 0;
}

/* An amount: a fraction in [0, 1) of the prompt, or whole tokens >= 1. */
static int get_amount(const char *m, const char *k, const char *val,
                      kv_pol_amount_t *out, char *err, size_t len)
{
    char *end = NULL;
    double x = strtod(val, &end);
    if (!*val || *end || !(x >= 0.0 && x <= 1e9) || (x >= 1.0 && x != floor(x)))
        return perr(err, len, "%s: %s=%s: expected a fraction of the prompt in "
                    "[0, 1) or a whole number of tokens >= 1", m, k, val);
    out->v = x;
    out->is_ratio = x < 1.0;
    return 0;
}

static void defaults(kv_policy_t *p)
{
    memset(p, 0, sizeof *p);
    p->fmt = KV_FMT_FP16;
    p->residual = 128;
    p->sink = 4;
    p->window = 32;
    p->kernel = 7;
    p->sim_delta = 0.9;
    p->sim_w = 1024;
    p->sim_sink = 4;
    p->sim_rows = 32;
    p->mc_from = 0.5;
    p->mc_t = 0.6;
    p->mc_gamma = 0.05;
    p->mc_every = 16;
    p->cam_m = 16;
    p->cam_seed = 1;
}

/* One key=value of method m into p. */
static int set_key(kv_policy_t *p, const char *m, const char *k, const char *val,
                   char *err, size_t len)
{
    uint64_t u;
    int rc = KV_EINVAL;
    int is = 0; /* key known for this method */
#define KEY(meth, name) (!strcmp(m, meth) && !strcmp(k, name) && (is = 1))
    if (KEY("kivi2", "r") || KEY("kivi4", "r") || KEY("int2", "r") || KEY("int4", "r")) {
        if (!(rc = get_uint(m, k, val, 16, 65536, &u, err, len)) && u % 16)
            return perr(err, len, "%s: r=%s: must be a multiple of 16", m, val);
        p->residual = (uint32_t)u;
    } else if (KEY("streamingllm", "sink")) {
        rc = get_uint(m, k, val, 0, 1u << 20, &u, err, len);
        p->sink = (uint32_t)u;
    } else if (KEY("streamingllm", "recent") || KEY("h2o", "rw") || KEY("minikv", "rw")) {
        rc = get_amount(m, k, val, &p->recent, err, len);
    } else if (KEY("h2o", "hh") || KEY("minikv", "hh") || KEY("snapkv", "c")) {
        rc = get_amount(m, k, val, &p->hh, err, len);
    } else if (KEY("snapkv", "w")) {
        rc = get_uint(m, k, val, 1, 65536, &u, err, len);
        p->window = (uint32_t)u;
    } else if (KEY("snapkv", "k")) {
        if (!(rc = get_uint(m, k, val, 1, 255, &u, err, len)) && u % 2 == 0)
            return perr(err, len, "%s: k=%s: the pooling kernel must be odd", m, val);
        p->kernel = (uint32_t)u;
    } else if (KEY("minikv", "pyramid")) {
        rc = get_uint(m, k, val, 0, 1000, &u, err, len);
        p->pyramid = (uint32_t)u;
    } else if (KEY("simlayerkv", "delta")) {
        rc = get_real(m, k, val, 0.0, 1.0, &p->sim_delta, err, len);
    } else if (KEY("simlayerkv", "w")) {
        rc = get_uint(m, k, val, 1, 1u << 24, &u, err, len);
        p->sim_w = (uint32_t)u;
    } else if (KEY("simlayerkv", "sink")) {
        rc = get_uint(m, k, val, 0, 1u << 20, &u, err, len);
        p->sim_sink = (uint32_t)u;
    } else if (KEY("simlayerkv", "rows")) {
        rc = get_uint(m, k, val, 1, 65536, &u, err, len);
        p->sim_rows = (uint32_t)u;
    } else if (KEY("simlayerkv", "mode")) {
        if (!strcmp(val, "decode"))
            p->sim_mode = KV_POL_SIM_DECODE;
        else if (!strcmp(val, "prefill"))
            p->sim_mode = KV_POL_SIM_PREFILL;
        else
            return perr(err, len, "%s: mode=%s: expected decode or prefill", m, val);
        rc = 0;
    } else if (KEY("minicache", "from")) {
        rc = get_real(m, k, val, 0.0, 1.0, &p->mc_from, err, len);
    } else if (KEY("minicache", "t")) {
        rc = get_real(m, k, val, 0.0, 1.0, &p->mc_t, err, len);
    } else if (KEY("minicache", "gamma")) {
        rc = get_real(m, k, val, 0.0, 1.0, &p->mc_gamma, err, len);
    } else if (KEY("minicache", "every")) {
        rc = get_uint(m, k, val, 1, 65536, &u, err, len);
        p->mc_every = (uint32_t)u;
    } else if (KEY("cam", "m")) {
        rc = get_uint(m, k, val, 1, 4096, &u, err, len);
        p->cam_m = (uint32_t)u;
    } else if (KEY("cam", "seed")) {
        rc = get_uint(m, k, val, 0, UINT64_MAX, &u, err, len);
        p->cam_seed = u;
    }
#undef KEY
    if (!is)
        return perr(err, len, "%s: unknown key '%s'", m, k);
    return rc;
}

/* Method name -> what it turns on; 0 or KV_EINVAL (unknown or repeated). */
static int set_method(kv_policy_t *p, const char *m, uint32_t *seen, char *err,
                      size_t len)
{
    static const char *const names[] = {"fp16", "kivi2", "kivi4", "int2", "int4",
                                        "streamingllm", "h2o", "snapkv", "minikv",
                                        "simlayerkv", "minicache", "cam"};
    uint32_t i = 0, n = sizeof names / sizeof names[0];
    while (i < n && strcmp(m, names[i]))
        i++;
    if (i == n)
        return perr(err, len, "unknown method '%s' (valid: fp16, kivi2, kivi4, int2, "
                    "int4, streamingllm, h2o, snapkv, minikv, simlayerkv, "
                    "minicache, cam)", m);
    if (*seen & (1u << i))
        return perr(err, len, "method '%s' given twice", m);
    *seen |= 1u << i;
    if (i == 0) {
        p->fp16 = 1;
    } else if (i <= 4) {
        if (p->fmt_given)
            return perr(err, len, "'%s': only one of kivi2, kivi4, int2, int4", m);
        p->fmt_given = 1;
        p->fmt_kivi = i <= 2;
        p->fmt = (i == 1 || i == 3) ? KV_FMT_INT2 : KV_FMT_INT4;
    } else if (i <= 8) {
        if (p->sel)
            return perr(err, len, "'%s': only one token selection (streamingllm, h2o, "
                        "snapkv, minikv) per policy", m);
        p->sel = i - 4; /* KV_POL_SEL_STREAM .. MINIKV */
        kv_pol_amount_t r10 = {0.1, 1}, r20 = {0.2, 1}, r25 = {0.25, 1};
        if (p->sel == KV_POL_SEL_STREAM)
            p->recent = r20;
        else if (p->sel == KV_POL_SEL_H2O)
            p->hh = r10, p->recent = r10;
        else if (p->sel == KV_POL_SEL_SNAPKV)
            p->hh = r20;
        else
            p->hh = r25, p->recent = r25;
    } else if (i == 9) {
        p->sim = 1;
    } else if (i == 10) {
        p->mc = 1;
    } else {
        p->cam = 1;
    }
    return 0;
}

/* Valid compositions (docs/policies.md). */
static int check_composition(kv_policy_t *p, char *err, size_t len)
{
    if (p->fp16 && (p->sel || p->fmt_given || p->sim || p->mc || p->cam))
        return perr(err, len, "'fp16' is the whole policy: it composes with nothing");
    if (p->cam && p->sel != KV_POL_SEL_STREAM && p->sel != KV_POL_SEL_H2O)
        return perr(err, len, "'cam' merges evicted tokens: it needs streamingllm or h2o");
    if (p->cam && p->fmt_given)
        return perr(err, len, "'cam' with int2/int4/kivi: CaM writes values of FP16 "
                    "tokens; not supported with quantized formats");
    if (p->mc && (p->sel || p->sim || p->cam))
        return perr(err, len, "'minicache' composes only with int4 (layer pairs need "
                    "the same tokens in both layers; no selection, simlayerkv or cam)");
    if (p->mc && p->fmt_given && p->fmt != KV_FMT_INT4)
        return perr(err, len, "'minicache' with int2: merged directions are FP16 or "
                    "INT4 only (use +int4)");
    if (p->sel == KV_POL_SEL_MINIKV && !p->fmt_given)
        p->fmt = KV_FMT_INT2; /* MiniKV keeps its tokens INT2 */
    if (p->sel == KV_POL_SEL_SNAPKV && p->kernel > 2 * p->window + 1)
        (void)0; /* any kernel is fine: pooling clips at the edges */
    if (!p->fp16 && !p->sel && !p->fmt_given && !p->sim && !p->mc)
        p->fp16 = 1;
    return 0;
}

int kv_policy_parse(const char *spec, kv_policy_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!spec || !out)
        return perr(err, err_len, "NULL policy string or output");
    size_t n = strlen(spec);
    if (n == 0 || n >= POL_MAX_SPEC)
        return perr(err, err_len, "policy string empty or longer than %u bytes",
                    POL_MAX_SPEC - 1);
    char buf[POL_MAX_SPEC];
    memcpy(buf, spec, n + 1);
    kv_policy_t p;
    defaults(&p);
    uint32_t seen = 0;
    char *save_part = NULL;
    int n_parts = 0;
    for (char *part = buf; part; part = save_part) {
        save_part = strchr(part, '+');
        if (save_part)
            *save_part++ = '\0';
        n_parts++;
        char *colon = strchr(part, ':');
        if (colon)
            *colon = '\0';
        if (!*part)
            return perr(err, err_len, "empty method name in '%s'", spec);
        int rc = set_method(&p, part, &seen, err, err_len);
        if (rc)
            return rc;
        if (!colon)
            continue;
        char *kv = colon + 1, *next;
        if (!*kv)
            return perr(err, err_len, "%s: ':' with no key=value", part);
        for (; kv; kv = next) {
            next = strchr(kv, ',');
            if (next)
                *next++ = '\0';
            char *eq = strchr(kv, '=');
            if (!eq || eq == kv)
                return perr(err, err_len, "%s: '%s' is not key=value", part, kv);
            *eq = '\0';
            if ((rc = set_key(&p, part, kv, eq + 1, err, err_len)))
                return rc;
        }
    }
    (void)n_parts;
    int rc = check_composition(&p, err, err_len);
    if (rc)
        return rc;
    kv_policy_t *pp = kv_mem_alloc(sizeof *pp);
    if (!pp)
        return KV_ENOMEM;
    *pp = p;
    *out = pp;
    return 0;
}

void kv_policy_destroy(kv_policy_t *p)
{
    kv_mem_free(p, sizeof *p);
}

void kv_pol_test_cam_force(kv_policy_t *p, int on)
{
    p->cam_force = on != 0;
}

/* Appends to a bounded buffer; remembers overflow. */
typedef struct sbuf {
    char *b;
    size_t len, at;
    int over;
} sbuf_t;

static void sb(sbuf_t *s, const char *fmt, ...)
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

static void sb_amount(sbuf_t *s, const char *k, kv_pol_amount_t a)
{
    if (a.is_ratio)
        sb(s, "%s=%.17g", k, a.v);
    else
        sb(s, "%s=%.0f", k, a.v);
}

int kv_policy_describe(const kv_policy_t *p, char *buf, size_t len)
{
    if (!p || !buf || !len)
        return KV_EINVAL;
    sbuf_t s = {buf, len, 0, 0};
    const char *sep = "";
    if (p->fp16)
        sb(&s, "fp16");
    switch (p->sel) {
    case KV_POL_SEL_STREAM:
        sb(&s, "streamingllm:sink=%u,", p->sink);
        sb_amount(&s, "recent", p->recent);
        sep = "+";
        break;
    case KV_POL_SEL_H2O:
    case KV_POL_SEL_MINIKV:
        sb(&s, "%s:", p->sel == KV_POL_SEL_H2O ? "h2o" : "minikv");
        sb_amount(&s, "hh", p->hh);
        sb(&s, ",");
        sb_amount(&s, "rw", p->recent);
        if (p->sel == KV_POL_SEL_MINIKV)
            sb(&s, ",pyramid=%u", p->pyramid);
        sep = "+";
        break;
    case KV_POL_SEL_SNAPKV:
        sb(&s, "snapkv:w=%u,k=%u,", p->window, p->kernel);
        sb_amount(&s, "c", p->hh);
        sep = "+";
        break;
    default:
        break;
    }
    if (p->sim) {
        sb(&s, "%ssimlayerkv:delta=%.17g,w=%u,sink=%u,rows=%u,mode=%s", sep,
           p->sim_delta, p->sim_w, p->sim_sink, p->sim_rows,
           p->sim_mode == KV_POL_SIM_PREFILL ? "prefill" : "decode");
        sep = "+";
    }
    if (p->mc) {
        sb(&s, "%sminicache:from=%.17g,t=%.17g,gamma=%.17g,every=%u", sep, p->mc_from,
           p->mc_t, p->mc_gamma, p->mc_every);
        sep = "+";
    }
    if (p->cam) {
        sb(&s, "%scam:m=%u,seed=%llu", sep, p->cam_m, (unsigned long long)p->cam_seed);
        sep = "+";
    }
    if (p->fmt_given)
        sb(&s, "%s%s%c:r=%u", sep, p->fmt_kivi ? "kivi" : "int",
           p->fmt == KV_FMT_INT2 ? '2' : '4', p->residual);
    if (s.over)
        return KV_ERANGE;
    return 0;
}
