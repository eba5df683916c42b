/*
 * plan_closed.c — closed-form KV bytes per policy (see plan_closed.h).
 */
#include "plan_closed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_spec.h"

/* "A" or "A + B/head_dim" at s: A + B / d; NAN if s holds neither. */
static double bits_expr(const char *s, uint32_t d)
{
    char *end = NULL;
    double a = strtod(s, &end);
    if (end == s)
        return NAN;
    if (!strncmp(end, " + ", 3)) {
        char *e2 = NULL;
        double b = strtod(end + 3, &e2);
        if (e2 == end + 3 || strncmp(e2, "/head_dim", 9))
            return NAN;
        return a + b / d;
    }
    return a;
}

double plan_closed_bits(kv_format_t fmt, int int4_dirs, uint32_t d)
{
    const char *note = kv_format_note(fmt);
    const char *at = note ? strstr(note, " = ") : NULL;
    if (!at || d == 0)
        return NAN;
    if (fmt == KV_FMT_MERGED && int4_dirs) {
        const char *key = "INT4 directions: ";
        const char *p = strstr(note, key);
        return p ? bits_expr(p + strlen(key), d) : NAN;
    }
    return bits_expr(at + 3, d);
}

/* A budget of the spec resolved against prompt length P (kv_pol_amount). */
static double amount(const char *canon, const char *m, const char *k, double dflt, uint32_t P)
{
    double v = plan_spec_num(canon, m, k, dflt);
    return v < 1 ? floor(v * P + 0.5) : v;
}

/* Bytes of `held` tokens of a list: KIVI-converted at `bits` except the
 * newest held mod R (FP16); all FP16 when bits is 16. tok16: FP16 bytes of
 * one token of a list. */
static double list_bytes(double held, double bits, double R, double tok16)
{
    if (bits >= 16)
        return held * tok16;
    double resid = fmod(held, R);
    return (held - resid) * tok16 * bits / 16 + resid * tok16;
}

/* Bits per element of a format method ("kivi2", "int4", ...; NULL: FP16). */
static double method_bits(const char *fmt, uint32_t d)
{
    if (!fmt)
        return 16;
    return plan_closed_bits(strchr(fmt, '2') ? KV_FMT_INT2 : KV_FMT_INT4, 0, d);
}

/* Bits per element of the tokens a spec keeps: its format part, else INT2
 * for MiniKV, else FP16. */
static double kept_bits(const char *canon, uint32_t d)
{
    const char *fmt = plan_spec_format(canon);
    return method_bits(fmt ? fmt : plan_spec_has(canon, "minikv") ? "int2" : NULL, d);
}

/* A non-lazy, non-MiniCache list: selection and/or format. */
static double plain_list(const char *canon, uint32_t P, uint32_t G, double R, double tok16,
                         uint32_t d)
{
    double bits = kept_bits(canon, d);
    double budget = P; /* tokens a selection keeps */
    if (plan_spec_has(canon, "minikv") || plan_spec_has(canon, "h2o")) {
        const char *m = plan_spec_has(canon, "minikv") ? "minikv" : "h2o";
        double rw = amount(canon, m, "rw", 0.1, P);
        budget = amount(canon, m, "hh", 0.1, P) + (rw < 1 ? 1 : rw);
    } else if (plan_spec_has(canon, "streamingllm")) {
        double rc = amount(canon, "streamingllm", "recent", 0.2, P);
        budget = plan_spec_num(canon, "streamingllm", "sink", 4) + (rc < 1 ? 1 : rc);
    } else if (plan_spec_has(canon, "snapkv")) {
        budget = amount(canon, "snapkv", "c", 0.2, P);
    }
    /* h2o/streamingllm evict every step down to the budget; the others
     * select once, at prefill end, and keep every decoded token */
    int evicts = plan_spec_has(canon, "h2o") || plan_spec_has(canon, "streamingllm");
    double held = evicts ? fmin((double)P + G, budget) : fmin(P, budget) + G;
    return list_bytes(held, bits, R, tok16);
}

double plan_closed_bytes(const plan_closed_in_t *in, const char *canon, uint32_t prompt,
                         uint32_t out)
{
    const uint32_t L = in->layers, D = in->head_dim;
    const double tok16 = 4.0 * D; /* K and V, 2 bytes each */
    const char *fmt = plan_spec_format(canon);
    const double R = fmt ? plan_spec_num(canon, fmt, "r", 128) : 128;
    double per_head = 0;
    if (plan_spec_has(canon, "minicache")) {
        uint32_t S = (uint32_t)(L * plan_spec_num(canon, "minicache", "from", 0.5));
        uint32_t pairs = S < L ? (L - S) / 2 : 0;
        double every = plan_spec_num(canon, "minicache", "every", 16);
        double tail = out - every * floor(out / every), merged = prompt + (out - tail);
        double mbits = plan_closed_bits(KV_FMT_MERGED, fmt != NULL, D);
        double ubits = method_bits(fmt ? "int4" : NULL, D);
        double pair = (1 - in->retain_frac) * merged * 2 * tok16 * mbits / 16 +
                      2 * (in->retain_frac * merged + tail) * tok16;
        per_head = pairs * pair + (L - 2 * pairs) * list_bytes(prompt + out, ubits, R, tok16);
    } else if (plan_spec_has(canon, "simlayerkv")) {
        double w = plan_spec_num(canon, "simlayerkv", "w", 1024);
        double sink = plan_spec_num(canon, "simlayerkv", "sink", 4);
        int prefill = strstr(canon, "mode=prefill") != NULL;
        double n_at = prompt + (prefill ? 0 : 1);
        int decided = n_at > sink + w && (prefill || out > 0);
        uint32_t lazy = decided ? (uint32_t)llround(in->lazy_frac * L) : 0;
        per_head = lazy * list_bytes(sink + w, kept_bits(canon, D), R, tok16) +
                   (L - lazy) * plain_list(canon, prompt, out, R, tok16, D);
    } else {
        per_head = L * plain_list(canon, prompt, out, R, tok16, D);
    }
    return per_head * in->kv_heads;
}
