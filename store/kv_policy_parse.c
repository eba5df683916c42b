/* SPDX-License-Identifier: MIT */
/*
 * kv_policy_parse.c — policy strings to kv_policy_t and back (the grammar is
 * in docs/policies.md): parts joined by '+', each "method" or
 * "method:key=value,key=value".
 *
 * Two tables say everything about the grammar: the method table (name, the
 * token selection or format it turns on) and the key table (method, key,
 * kind, range, default, field; kv_spec.h). Parsing, the defaults, the
 * canonical text (kv_policy_describe), kv_policy_value and every error
 * message are driven by them; nothing here names a key. Errors are all
 * KV_EINVAL with a message naming the offending part: an unknown method or
 * key, a key given twice, a bad value, a repeated method, an invalid
 * composition. kv_policy_describe writes every key of every method with its
 * value; that text parses back to the same policy.
 *
 * Ownership: kv_policy_parse allocates the policy (kv_mem); the caller
 * destroys it. A parsed policy is never modified (except by the test hook).
 */
#include <string.h>

#include "alloc/kv_mem.h"
#include "kv_policy_int.h"

#define POL_MAX_SPEC 1024u

typedef kv_policy_t P;

/* Methods, in canonical order. A selection (sel != 0) or a format
 * (fmt != FP16) may appear once per policy. */
static const struct pol_method {
    const char *name;
    uint32_t sel;  /* KV_POL_SEL_* of a token selection, else 0     */
    uint32_t fmt;  /* KV_FMT_INT4/INT2 of a format, else KV_FMT_FP16 */
    uint32_t kivi; /* 1: spelled kivi2/kivi4                        */
} methods[KV_POL_M_COUNT] = {
    [KV_POL_M_FP16] = {"fp16", 0, KV_FMT_FP16, 0},
    [KV_POL_M_STREAM] = {"streamingllm", KV_POL_SEL_STREAM, KV_FMT_FP16, 0},
    [KV_POL_M_H2O] = {"h2o", KV_POL_SEL_H2O, KV_FMT_FP16, 0},
    [KV_POL_M_SNAPKV] = {"snapkv", KV_POL_SEL_SNAPKV, KV_FMT_FP16, 0},
    [KV_POL_M_MINIKV] = {"minikv", KV_POL_SEL_MINIKV, KV_FMT_FP16, 0},
    [KV_POL_M_SIM] = {"simlayerkv", 0, KV_FMT_FP16, 0},
    [KV_POL_M_MC] = {"minicache", 0, KV_FMT_FP16, 0},
    [KV_POL_M_CAM] = {"cam", 0, KV_FMT_FP16, 0},
    [KV_POL_M_KIVI2] = {"kivi2", 0, KV_FMT_INT2, 1},
    [KV_POL_M_KIVI4] = {"kivi4", 0, KV_FMT_INT4, 1},
    [KV_POL_M_INT2] = {"int2", 0, KV_FMT_INT2, 0},
    [KV_POL_M_INT4] = {"int4", 0, KV_FMT_INT4, 0},
    [KV_POL_M_EATTN] = {"eattn", KV_POL_SEL_EATTN, KV_FMT_FP16, 0},
    [KV_POL_M_KVZIP] = {"kvzip", KV_POL_SEL_KVZIP, KV_FMT_FP16, 0},
};

/* Canonical order (kv_policy_describe, error lists): the selections
 * together, then the rest, formats last. A method added later takes the
 * next bit (the public KV_POLICY_* numbers stay) and its place here. */
static const uint8_t order[KV_POL_M_COUNT] = {
    KV_POL_M_FP16,  KV_POL_M_STREAM, KV_POL_M_H2O,   KV_POL_M_SNAPKV, KV_POL_M_MINIKV,
    KV_POL_M_EATTN, KV_POL_M_KVZIP,  KV_POL_M_SIM,   KV_POL_M_MC,     KV_POL_M_CAM,
    KV_POL_M_KIVI2, KV_POL_M_KIVI4,  KV_POL_M_INT2,  KV_POL_M_INT4,
};

_Static_assert(1u << KV_POL_M_FP16 == KV_POLICY_FP16 &&
                   1u << KV_POL_M_STREAM == KV_POLICY_STREAMINGLLM &&
                   1u << KV_POL_M_H2O == KV_POLICY_H2O &&
                   1u << KV_POL_M_SNAPKV == KV_POLICY_SNAPKV &&
                   1u << KV_POL_M_MINIKV == KV_POLICY_MINIKV &&
                   1u << KV_POL_M_SIM == KV_POLICY_SIMLAYERKV &&
                   1u << KV_POL_M_MC == KV_POLICY_MINICACHE &&
                   1u << KV_POL_M_CAM == KV_POLICY_CAM &&
                   1u << KV_POL_M_KIVI2 == KV_POLICY_KIVI2 &&
                   1u << KV_POL_M_KIVI4 == KV_POLICY_KIVI4 &&
                   1u << KV_POL_M_INT2 == KV_POLICY_INT2 &&
                   1u << KV_POL_M_INT4 == KV_POLICY_INT4 &&
                   1u << KV_POL_M_EATTN == KV_POLICY_EATTN &&
                   1u << KV_POL_M_KVZIP == KV_POLICY_KVZIP,
               "method numbers are the public KV_POLICY_* bits");

static const char *const sim_modes[] = {[KV_POL_SIM_DECODE] = "decode",
                                        [KV_POL_SIM_PREFILL] = "prefill", NULL};
static const char *const rope_layouts[] = {[KV_POL_ROPE_PAIRS] = "pairs",
                                           [KV_POL_ROPE_HALVES] = "halves", NULL};

/* ada=1 (AdaKV per-head budgets; ada=2, one budget across all layers, for
 * the selections made once at the prefill end: hi 2) and its floor alpha,
 * keys of every scoring selection; quiet, so policies without them
 * describe as before. */
#define KV_POL_ADA(m, hi_)                                                     \
    {.part = (m), .name = "ada", .kind = KV_SPEC_UINT, KV_SPEC_FIELD(P, ada),    \
     .lo = 0, .hi = (hi_), .dflt = 0, .quiet = 1},                              \
    {.part = (m), .name = "alpha", .kind = KV_SPEC_REAL, KV_SPEC_FIELD(P, ada_alpha), \
     .rlo = 0.0, .rhi = 1.0, .dflt = 0.2, .quiet = 1}

/* rot=1 (rotated INT pages): quiet, so policies without it describe as
 * before rotation existed. */
#define KV_POL_ROT(m)                                                       \
    {.part = (m), .name = "rot", .kind = KV_SPEC_UINT, KV_SPEC_FIELD(P, rot), \
     .lo = 0, .hi = 1, .dflt = 0, .quiet = 1}

/* Every key of every method (docs/policies.md, "Grammar"; the test
 * test_policy_keys checks that table against this one). */
static const kv_spec_key_t keys[] = {
    KV_SPEC_U(KV_POL_M_STREAM, "sink", P, sink, 0, 1u << 20, 4),
    KV_SPEC_A(KV_POL_M_STREAM, "recent", P, recent, 0.2),
    KV_SPEC_A(KV_POL_M_H2O, "hh", P, hh, 0.1),
    KV_SPEC_A(KV_POL_M_H2O, "rw", P, recent, 0.1),
    KV_POL_ADA(KV_POL_M_H2O, 1),
    KV_SPEC_U(KV_POL_M_SNAPKV, "w", P, window, 1, 65536, 32),
    KV_SPEC_U_RULE(KV_POL_M_SNAPKV, "k", P, kernel, 1, 255, 7, 2, 1), /* odd */
    KV_SPEC_A(KV_POL_M_SNAPKV, "c", P, hh, 0.2),
    KV_POL_ADA(KV_POL_M_SNAPKV, 2),
    KV_SPEC_A(KV_POL_M_MINIKV, "hh", P, hh, 0.25),
    KV_SPEC_A(KV_POL_M_MINIKV, "rw", P, recent, 0.25),
    KV_SPEC_U(KV_POL_M_MINIKV, "pyramid", P, pyramid, 0, 1000, 0),
    KV_POL_ROT(KV_POL_M_MINIKV),
    KV_POL_ADA(KV_POL_M_MINIKV, 1),
    /* eattn: c kept tokens, the last rw of them always; w query rows (0: every prompt row past the
     * sinks); RoPE of the engine (theta, layout) to undo it on the queries
     * and average it over the future positions */
    KV_SPEC_A(KV_POL_M_EATTN, "c", P, hh, 0.2),
    KV_SPEC_A(KV_POL_M_EATTN, "rw", P, recent, 32),
    KV_SPEC_U(KV_POL_M_EATTN, "w", P, window, 0, 65536, 0),
    KV_SPEC_U(KV_POL_M_EATTN, "sink", P, ea_sink, 0, 1u << 20, 4),
    KV_SPEC_U(KV_POL_M_EATTN, "future", P, ea_future, 1, 1u << 20, 512),
    KV_SPEC_R(KV_POL_M_EATTN, "theta", P, ea_theta, 1.0, 1e12, 10000.0),
    KV_SPEC_E(KV_POL_M_EATTN, "rope", P, ea_rope, rope_layouts, KV_POL_ROPE_PAIRS),
    KV_SPEC_U(KV_POL_M_EATTN, "cov", P, ea_cov, 0, 1, 1),
    KV_SPEC_U(KV_POL_M_EATTN, "vnorm", P, ea_vnorm, 0, 1, 1),
    KV_POL_ADA(KV_POL_M_EATTN, 2),
    /* kvzip: c kept tokens by reconstruction scores, the first `sink` always */
    KV_SPEC_A(KV_POL_M_KVZIP, "c", P, hh, 0.2),
    KV_SPEC_U(KV_POL_M_KVZIP, "sink", P, sink, 0, 1u << 20, 4),
    KV_POL_ADA(KV_POL_M_KVZIP, 2),
    KV_SPEC_R(KV_POL_M_SIM, "delta", P, sim_delta, 0.0, 1.0, 0.9),
    KV_SPEC_U(KV_POL_M_SIM, "w", P, sim_w, 1, 1u << 24, 1024),
    KV_SPEC_U(KV_POL_M_SIM, "sink", P, sim_sink, 0, 1u << 20, 4),
    KV_SPEC_U(KV_POL_M_SIM, "rows", P, sim_rows, 1, 65536, 32),
    KV_SPEC_E(KV_POL_M_SIM, "mode", P, sim_mode, sim_modes, KV_POL_SIM_DECODE),
    KV_SPEC_R(KV_POL_M_MC, "from", P, mc_from, 0.0, 1.0, 0.5),
    KV_SPEC_R(KV_POL_M_MC, "t", P, mc_t, 0.0, 1.0, 0.6),
    KV_SPEC_R(KV_POL_M_MC, "gamma", P, mc_gamma, 0.0, 1.0, 0.05),
    KV_SPEC_U(KV_POL_M_MC, "every", P, mc_every, 1, 65536, 16),
    KV_SPEC_U(KV_POL_M_CAM, "m", P, cam_m, 1, 4096, 16),
    KV_SPEC_U(KV_POL_M_CAM, "seed", P, cam_seed, 0, UINT64_MAX, 1),
    /* r: a multiple of 16 (whole INT groups) */
    KV_SPEC_U_RULE(KV_POL_M_KIVI2, "r", P, residual, 16, 65536, 128, 16, 0),
    KV_SPEC_U_RULE(KV_POL_M_KIVI4, "r", P, residual, 16, 65536, 128, 16, 0),
    KV_SPEC_U_RULE(KV_POL_M_INT2, "r", P, residual, 16, 65536, 128, 16, 0),
    KV_SPEC_U_RULE(KV_POL_M_INT4, "r", P, residual, 16, 65536, 128, 16, 0),
    /* rot=1: rotated INT pages (head_dim a power of two, else the policy
     * is refused when attached: KV_EINVAL) */
    KV_POL_ROT(KV_POL_M_KIVI2),
    KV_POL_ROT(KV_POL_M_KIVI4),
    KV_POL_ROT(KV_POL_M_INT2),
    KV_POL_ROT(KV_POL_M_INT4),
};

static const kv_spec_table_t table = {keys, sizeof keys / sizeof keys[0]};

_Static_assert(sizeof keys / sizeof keys[0] <= 64, "kv_spec_set: a bit per row");

/* "a, b, c" of the methods that satisfy want (all: NULL). */
static void method_names(kv_spec_buf_t *b, int (*want)(const struct pol_method *))
{
    const char *sep = "";
    for (uint32_t i = 0; i < KV_POL_M_COUNT; i++) {
        const uint32_t m = order[i];
        if (!want || want(&methods[m])) {
            kv_spec_printf(b, "%s%s", sep, methods[m].name);
            sep = ", ";
        }
    }
}

static int is_sel(const struct pol_method *m) { return m->sel != 0; }
static int is_fmt(const struct pol_method *m) { return m->fmt != KV_FMT_FP16; }

/* The method named name[0..len) into p (*m: its number), with its keys'
 * defaults. */
static int add_method(P *p, const char *name, size_t len, uint32_t *m, char *err,
                      size_t err_len)
{
    const char *names[KV_POL_M_COUNT];
    for (uint32_t i = 0; i < KV_POL_M_COUNT; i++)
        names[i] = methods[i].name;
    *m = kv_spec_lookup(names, KV_POL_M_COUNT, name, len);
    char list[160];
    kv_spec_buf_t b = {list, sizeof list, 0, 0};
    if (*m == KV_POL_M_COUNT) {
        method_names(&b, NULL);
        return kv_spec_err(KV_EINVAL, err, err_len, "unknown method '%.*s' (valid: %s)",
                           (int)len, name, list);
    }
    const struct pol_method *me = &methods[*m];
    if (p->methods >> *m & 1u)
        return kv_spec_err(KV_EINVAL, err, err_len, "method '%s' given twice", me->name);
    if (me->sel && p->sel) {
        method_names(&b, is_sel);
        return kv_spec_err(KV_EINVAL, err, err_len, "'%s': only one token selection (%s) "
                           "per policy", me->name, list);
    }
    if (is_fmt(me) && p->fmt_given) {
        method_names(&b, is_fmt);
        return kv_spec_err(KV_EINVAL, err, err_len, "'%s': only one of %s", me->name, list);
    }
    p->methods |= 1u << *m;
    if (me->sel)
        p->sel = me->sel;
    if (is_fmt(me)) {
        p->fmt_given = 1;
        p->fmt_kivi = me->kivi;
        p->fmt = me->fmt;
    }
    p->sim = (p->methods & KV_POLICY_SIMLAYERKV) != 0;
    p->mc = (p->methods & KV_POLICY_MINICACHE) != 0;
    p->cam = (p->methods & KV_POLICY_CAM) != 0;
    kv_spec_defaults(table, *m, p);
    return 0;
}

/* Valid compositions (docs/policies.md). */
static int check_composition(P *p, char *err, size_t len)
{
    if ((p->methods & KV_POLICY_FP16) && p->methods != KV_POLICY_FP16)
        return kv_spec_err(KV_EINVAL, err, len,
                           "'fp16' is the whole policy: it composes with nothing");
    if (p->cam && p->sel != KV_POL_SEL_STREAM && p->sel != KV_POL_SEL_H2O)
        return kv_spec_err(KV_EINVAL, err, len,
                           "'cam' merges evicted tokens: it needs streamingllm or h2o");
    if (p->cam && p->fmt_given)
        return kv_spec_err(KV_EINVAL, err, len, "'cam' with int2/int4/kivi: CaM writes "
                           "values of FP16 tokens; not supported with quantized formats");
    if (p->mc && (p->sel || p->sim || p->cam))
        return kv_spec_err(KV_EINVAL, err, len, "'minicache' composes only with int4 "
                           "(layer pairs need the same tokens in both layers; no "
                           "selection, simlayerkv or cam)");
    if (p->mc && p->fmt_given && p->fmt != KV_FMT_INT4)
        return kv_spec_err(KV_EINVAL, err, len, "'minicache' with int2: merged directions "
                           "are FP16 or INT4 only (use +int4)");
    if (p->mc && p->rot)
        return kv_spec_err(KV_EINVAL, err, len, "'rot=1' with minicache: merged "
                           "directions are not rotated");
    if (p->ada == 2 && p->sim)
        return kv_spec_err(KV_EINVAL, err, len, "'ada=2' (one budget across layers) with "
                           "simlayerkv: its lazy layers are trimmed, not selected");
    if (p->sel == KV_POL_SEL_MINIKV && !p->fmt_given)
        p->fmt = KV_FMT_INT2; /* MiniKV keeps its tokens INT2 */
    return 0;
}

/* One part "method[:key=value,...]", s[0..n), into p. seen: a bit per key
 * table row given so far. */
static int parse_part(P *p, const char *spec, const char *s, size_t n, uint64_t *seen,
                      char *err, size_t err_len)
{
    const char *colon = memchr(s, ':', n);
    size_t name_n = colon ? (size_t)(colon - s) : n;
    if (name_n == 0)
        return kv_spec_err(KV_EINVAL, err, err_len, "empty method name in '%s'", spec);
    uint32_t m;
    int rc = add_method(p, s, name_n, &m, err, err_len);
    if (rc || !colon)
        return rc;
    const char *name = methods[m].name, *kv = colon + 1, *end = s + n;
    if (kv == end)
        return kv_spec_err(KV_EINVAL, err, err_len, "%s: ':' with no key=value", name);
    for (;;) {
        const char *comma = memchr(kv, ',', (size_t)(end - kv));
        const char *e = comma ? comma : end;
        if ((rc = kv_spec_set(table, m, name, kv, (size_t)(e - kv), p, seen, err, err_len)))
            return rc == KV_ERANGE ? KV_EINVAL : rc; /* policies: all KV_EINVAL */
        if (!comma)
            return 0;
        kv = comma + 1;
    }
}

int kv_policy_parse(const char *spec, kv_policy_t **out, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!spec || !out)
        return kv_spec_err(KV_EINVAL, err, err_len, "NULL policy string or output");
    size_t n = strlen(spec);
    if (n == 0 || n >= POL_MAX_SPEC)
        return kv_spec_err(KV_EINVAL, err, err_len,
                           "policy string empty or longer than %u bytes", POL_MAX_SPEC - 1);
    P p;
    memset(&p, 0, sizeof p);
    p.fmt = KV_FMT_FP16;
    uint64_t seen = 0;
    for (const char *s = spec, *end = spec + n;;) {
        const char *plus = memchr(s, '+', (size_t)(end - s));
        const char *e = plus ? plus : end;
        int rc = parse_part(&p, spec, s, (size_t)(e - s), &seen, err, err_len);
        if (rc)
            return rc;
        if (!plus)
            break;
        s = plus + 1;
    }
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

int kv_policy_describe(const kv_policy_t *p, char *buf, size_t len)
{
    if (!p || !buf || !len)
        return KV_EINVAL;
    kv_spec_buf_t s = {buf, len, 0, 0};
    const char *sep = "";
    for (uint32_t i = 0; i < KV_POL_M_COUNT; i++) {
        const uint32_t m = order[i];
        if (!(p->methods >> m & 1u))
            continue;
        kv_spec_printf(&s, "%s%s", sep, methods[m].name);
        char keys_text[POL_MAX_SPEC];
        kv_spec_buf_t k = {keys_text, sizeof keys_text, 0, 0};
        if (kv_spec_describe(table, m, p, &k))
            kv_spec_printf(&s, ":%s", keys_text);
        sep = "+";
    }
    if (s.over)
        return KV_ERANGE;
    return 0;
}

int kv_policy_value(const kv_policy_t *p, const char *method, const char *key, double *out)
{
    if (!p || !method || !key || !out)
        return KV_EINVAL;
    uint32_t m = 0;
    while (m < KV_POL_M_COUNT && strcmp(methods[m].name, method))
        m++;
    const kv_spec_key_t *k = m < KV_POL_M_COUNT ? kv_spec_find(table, m, key, strlen(key)) : NULL;
    if (!k)
        return KV_EINVAL;
    if (!(p->methods >> m & 1u))
        return KV_ENOENT;
    *out = kv_spec_value(k, p);
    return 0;
}
