/* SPDX-License-Identifier: MIT */
/*
 * stress_verify.c — the verifier of `kvpage stress` (stress_verify.h).
 *
 * Per list (seq, layer, kv_head), with n positions appended and the check c
 * of the sequence's policy:
 *   - length: == n, or <= n when c->select (MiniCache layers: == n);
 *   - positions (kv_read): each in [0, n); 0, 1, ..., n-1 without
 *     selection; strictly increasing with selection; on MiniCache layers
 *     each at most once (merged tokens come first, then the retained, then
 *     the unmerged: a permutation, not an order);
 *   - each token against the regenerated value at its position and
 *     origin: exact (bits 0), within stress_check_qbound(bits), or only
 *     finite and within FP16 range (drift: K and V; CaM: V); on MiniCache
 *     layers a token that does not match is accepted when the norms of its
 *     K and of its V both equal the appended ones to 1e-3 relative (the
 *     merged format restores every vector with its own norm, to FP32).
 * Values are compared as floats: appended elements are exact in FP16, so an
 * FP16 page must return them exactly (tolerance 0).
 *
 * Offload (the shadow's res): a RESIDENT sequence must read; WRITING and
 * ON_FILE lists may answer KV_ENOTRES (counted in enotres), and an ON_FILE
 * sequence must have at least one list that does (pages only come back
 * from the file through a kv_seq_prefetch the driver knows of); READING
 * lists are not read (lengths only), so that verification never takes in
 * a page-in at a moment that depends on the I/O.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "stress_gen.h"
#include "stress_verify.h"

#define VERIFY_NORM_REL 1e-3 /* merged tokens: | |x^| - |x| | <= this * |x| (+1e-6) */

int stress_verifier_init(stress_verifier_t *vf, const kv_store_t *st, uint64_t seed,
                         FILE *log)
{
    memset(vf, 0, sizeof *vf);
    kv_config_t cfg;
    int rc = kv_store_config(st, &cfg);
    if (rc)
        return rc;
    vf->st = st;
    vf->seed = seed;
    vf->n_layers = cfg.n_layers;
    vf->n_kv_heads = cfg.n_kv_heads;
    vf->head_dim = cfg.head_dim;
    vf->log = log;
    vf->max_log = 20;
    vf->ek = malloc(2u * cfg.head_dim * sizeof *vf->ek);
    vf->snap_len = malloc(2u * cfg.n_layers * cfg.n_kv_heads * sizeof *vf->snap_len);
    if (!vf->ek || !vf->snap_len) {
        stress_verifier_destroy(vf);
        return KV_ENOMEM;
    }
    vf->ev = vf->ek + cfg.head_dim;
    return 0;
}

void stress_verifier_destroy(stress_verifier_t *vf)
{
    free(vf->k);
    free(vf->v);
    free(vf->k2);
    free(vf->v2);
    free(vf->pos);
    free(vf->pos2);
    free(vf->seen);
    free(vf->ek);
    free(vf->snap_len);
    memset(vf, 0, sizeof *vf);
}

static void verify_vlog(stress_verifier_t *vf, const char *fmt, va_list ap)
{
    if (!vf->log || vf->logged >= vf->max_log)
        return;
    vf->logged++;
    fprintf(vf->log, "kvpage stress: VIOLATION%s%s: ", vf->context[0] ? " at " : "",
            vf->context);
    vfprintf(vf->log, fmt, ap);
    fputc('\n', vf->log);
    if (vf->logged == vf->max_log)
        fprintf(vf->log, "kvpage stress: (further violations are counted, not printed)\n");
}

void stress_violation(stress_verifier_t *vf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vf->violations++;
    verify_vlog(vf, fmt, ap);
    va_end(ap);
}

void stress_leak(stress_verifier_t *vf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vf->leaks++;
    verify_vlog(vf, fmt, ap);
    va_end(ap);
}

/* Scratch for n tokens; 0 or -1. */
static int verify_grow(stress_verifier_t *vf, uint32_t n)
{
    if (n <= vf->cap)
        return 0;
    uint32_t cap = n + n / 2 + 64;
    size_t row = (size_t)vf->head_dim * sizeof(float);
    float **fl[4] = {&vf->k, &vf->v, &vf->k2, &vf->v2};
    for (int i = 0; i < 4; i++) {
        float *p = realloc(*fl[i], cap * row);
        if (!p)
            return -1;
        *fl[i] = p;
    }
    int32_t **il[2] = {&vf->pos, &vf->pos2};
    for (int i = 0; i < 2; i++) {
        int32_t *p = realloc(*il[i], cap * sizeof(int32_t));
        if (!p)
            return -1;
        *il[i] = p;
    }
    uint8_t *s = realloc(vf->seen, cap);
    if (!s)
        return -1;
    vf->seen = s;
    vf->cap = cap;
    return 0;
}

/* Row x against expected e: 0 if it passes (tol: max |x - e|; range_only:
 * finite and in FP16 range only); *err = max |x - e| seen. */
static int verify_row(const float *x, const float *e, uint32_t d, double tol,
                      int range_only, double *err)
{
    double m = 0;
    for (uint32_t j = 0; j < d; j++) {
        if (!isfinite(x[j]) || fabs(x[j]) > STRESS_FP16_MAX)
            return -1;
        double diff = fabs((double)x[j] - (double)e[j]);
        m = diff > m ? diff : m;
        if (!range_only && diff > tol)
            return -1;
    }
    *err = m;
    return 0;
}

static double verify_norm(const float *x, uint32_t d)
{
    double s = 0;
    for (uint32_t j = 0; j < d; j++)
        s += (double)x[j] * x[j];
    return sqrt(s);
}

static int verify_same_norm(const float *x, const float *e, uint32_t d)
{
    double nx = verify_norm(x, d), ne = verify_norm(e, d);
    return isfinite(nx) && fabs(nx - ne) <= VERIFY_NORM_REL * ne + 1e-6;
}

/* Token i of the list read into vf->k/v/pos against its appended value. */
static int verify_token(stress_verifier_t *vf, const stress_shadow_t *s, uint32_t layer,
                        uint32_t head, uint32_t i, const char **why)
{
    const stress_check_t *c = s->chk;
    const uint32_t d = vf->head_dim;
    const float *k = vf->k + (size_t)i * d, *v = vf->v + (size_t)i * d;
    int32_t p = vf->pos[i];
    vf->tokens++;
    stress_gen_token(vf->seed, stress_shadow_origin(s, p), layer, head, p, d, vf->ek, vf->ev);
    double tol = stress_check_qbound(c->bits), ek = 0, ev = 0;
    int k_ok = verify_row(k, vf->ek, d, tol, c->drift, &ek) == 0;
    int v_ok = verify_row(v, vf->ev, d, tol, c->drift || c->cam, &ev) == 0;
    if (k_ok && v_ok) {
        if (!c->drift) {
            double *m = &vf->max_err[c->bits];
            *m = ek > *m ? ek : *m;
            if (!c->cam)
                *m = ev > *m ? ev : *m;
        }
        return 0;
    }
    if (stress_check_merged(c, layer) && verify_same_norm(k, vf->ek, d) &&
        verify_same_norm(v, vf->ev, d)) {
        vf->by_norm++; /* a merged token: direction shared, norm kept */
        return 0;
    }
    *why = !k_ok ? "key differs from the appended one beyond the format's bound"
                 : "value differs from the appended one beyond the format's bound";
    return -1;
}

/* One list; *missing counts a KV_ENOTRES the shadow allows. */
static uint64_t verify_list(stress_verifier_t *vf, const stress_shadow_t *s, uint32_t layer,
                            uint32_t head, uint32_t *missing)
{
    const stress_check_t *c = s->chk;
    const int merged = stress_check_merged(c, layer);
    const uint32_t n = (uint32_t)s->next[layer];
    uint32_t len = 0;
    int rc = kv_seq_len(vf->st, s->id, layer, head, &len);
    if (rc) {
        stress_violation(vf, "seq %u layer %u head %u: kv_seq_len: %s", s->id, layer, head,
                         kv_strerror(rc));
        return 1;
    }
    if (len > n || ((!c->select || merged) && len != n)) {
        stress_violation(vf, "seq %u layer %u head %u holds %u tokens, %u were appended%s",
                         s->id, layer, head, len, n,
                         c->select ? "" : " (its policy evicts nothing)");
        return 1;
    }
    if (len == 0)
        return 0;
    if (s->res == STRESS_RES_READING) {
        vf->skipped++;
        return 0;
    }
    if (verify_grow(vf, len > n ? len : n)) {
        stress_violation(vf, "verifier out of memory for %u tokens", len);
        return 1;
    }
    vf->reads++;
    rc = kv_read(vf->st, s->id, layer, head, 0, len, vf->k, vf->v, vf->pos);
    if (rc == KV_ENOTRES && s->res != STRESS_RES_RESIDENT) {
        vf->enotres++;
        (*missing)++;
        return 0;
    }
    if (rc) {
        stress_violation(vf, "seq %u layer %u head %u: kv_read of %u tokens: %s%s", s->id,
                         layer, head, len, kv_strerror(rc),
                         rc == KV_ENOTRES ? " (the driver knows of no page on the file)" : "");
        return 1;
    }
    if (merged)
        memset(vf->seen, 0, n);
    for (uint32_t i = 0; i < len; i++) {
        int32_t p = vf->pos[i];
        const char *why = NULL;
        if (p < 0 || (uint32_t)p >= n)
            why = "position was never appended";
        else if (merged ? vf->seen[p]++ != 0
                        : (!c->select ? p != (int32_t)i : (i > 0 && p <= vf->pos[i - 1])))
            why = merged      ? "position appears twice"
                  : c->select ? "positions are not strictly increasing"
                              : "position is not the one appended at this index";
        else if (verify_token(vf, s, layer, head, i, &why) == 0)
            continue;
        stress_violation(vf, "seq %u layer %u head %u token %u (position %d of %u): %s",
                         s->id, layer, head, i, p, n, why);
        return 1;
    }
    return 0;
}

uint64_t stress_verify_seq(stress_verifier_t *vf, const stress_shadow_t *s)
{
    uint64_t bad = 0;
    uint32_t missing = 0;
    for (uint32_t l = 0; l < vf->n_layers; l++)
        for (uint32_t h = 0; h < vf->n_kv_heads; h++)
            bad += verify_list(vf, s, l, h, &missing);
    if (s->res == STRESS_RES_ON_FILE && missing == 0) {
        stress_violation(vf, "seq %u has pages on the page file, yet kv_read of every list "
                         "returned data", s->id);
        bad++;
    }
    return bad;
}

uint64_t stress_verify_same(stress_verifier_t *vf, kv_seq_id_t a, kv_seq_id_t b)
{
    const size_t row = (size_t)vf->head_dim * sizeof(float);
    uint64_t bad = 0;
    for (uint32_t l = 0; l < vf->n_layers; l++)
        for (uint32_t h = 0; h < vf->n_kv_heads; h++) {
            uint32_t la = 0, lb = 0;
            int rc = kv_seq_len(vf->st, a, l, h, &la);
            if (!rc)
                rc = kv_seq_len(vf->st, b, l, h, &lb);
            if (!rc && la != lb)
                rc = KV_ESTATE;
            if (!rc && verify_grow(vf, la))
                rc = KV_ENOMEM;
            if (!rc && la) {
                vf->reads += 2;
                rc = kv_read(vf->st, a, l, h, 0, la, vf->k, vf->v, vf->pos);
                if (!rc)
                    rc = kv_read(vf->st, b, l, h, 0, lb, vf->k2, vf->v2, vf->pos2);
                if (!rc && (memcmp(vf->k, vf->k2, la * row) || memcmp(vf->v, vf->v2, la * row) ||
                            memcmp(vf->pos, vf->pos2, la * sizeof(int32_t))))
                    rc = KV_ECORRUPT;
            }
            if (rc) {
                stress_violation(vf, "fork: seq %u and seq %u differ at layer %u head %u "
                                 "(lengths %u, %u): %s", a, b, l, h, la, lb, kv_strerror(rc));
                bad++;
            }
        }
    return bad;
}

static uint64_t verify_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

int stress_verify_digest(stress_verifier_t *vf, kv_seq_id_t seq, uint64_t *digest)
{
    const size_t row = (size_t)vf->head_dim * sizeof(float);
    uint64_t h = 0xCBF29CE484222325ull;
    for (uint32_t l = 0; l < vf->n_layers; l++)
        for (uint32_t hd = 0; hd < vf->n_kv_heads; hd++) {
            uint32_t len = 0;
            int rc = kv_seq_len(vf->st, seq, l, hd, &len);
            if (!rc && verify_grow(vf, len))
                rc = KV_ENOMEM;
            if (!rc && len) {
                vf->reads++;
                rc = kv_read(vf->st, seq, l, hd, 0, len, vf->k, vf->v, vf->pos);
            }
            if (rc)
                return rc;
            h = verify_fnv(h, &len, sizeof len);
            h = verify_fnv(h, vf->pos, len * sizeof(int32_t));
            h = verify_fnv(h, vf->k, len * row);
            h = verify_fnv(h, vf->v, len * row);
        }
    *digest = h ? h : 1;
    return 0;
}

uint64_t stress_verify_store(stress_verifier_t *vf, const stress_shadow_t *const *live,
                             uint32_t n_live)
{
    uint64_t before = vf->violations;
    kv_stats_t st = {.struct_size = sizeof st};
    int rc = kv_store_check(vf->st);
    if (rc)
        stress_violation(vf, "kv_store_check: %s", kv_strerror(rc));
    rc = kv_store_stats(vf->st, &st);
    if (rc) {
        stress_violation(vf, "kv_store_stats: %s", kv_strerror(rc));
        return vf->violations - before;
    }
    uint64_t by_fmt = 0, bytes = 0, tokens = 0;
    for (int f = 0; f < KV_FMT_COUNT; f++) {
        by_fmt += st.pages_by_format[f];
        bytes += st.bytes_by_format[f];
    }
    if (st.pages_used + st.pages_free != st.pages_capacity)
        stress_violation(vf, "pages: used %llu + free %llu != capacity %llu",
                         (unsigned long long)st.pages_used, (unsigned long long)st.pages_free,
                         (unsigned long long)st.pages_capacity);
    if (by_fmt != st.pages_used || bytes != st.kv_bytes)
        stress_violation(vf, "pages by format sum to %llu (%llu bytes), used %llu (%llu bytes)",
                         (unsigned long long)by_fmt, (unsigned long long)bytes,
                         (unsigned long long)st.pages_used, (unsigned long long)st.kv_bytes);
    if (st.n_seqs != n_live)
        stress_violation(vf, "store has %llu sequences, %u are live",
                         (unsigned long long)st.n_seqs, n_live);
    for (uint32_t i = 0; i < n_live; i++)
        for (uint32_t l = 0; l < vf->n_layers; l++)
            for (uint32_t h = 0; h < vf->n_kv_heads; h++) {
                uint32_t len = 0;
                if (kv_seq_len(vf->st, live[i]->id, l, h, &len) == 0)
                    tokens += len;
            }
    if (tokens != st.tokens)
        stress_violation(vf, "stats count %llu tokens, the live lists hold %llu",
                         (unsigned long long)st.tokens, (unsigned long long)tokens);
    for (uint32_t i = 0; i < n_live; i++)
        stress_verify_seq(vf, live[i]);
    return vf->violations - before;
}

static void verify_lens(stress_verifier_t *vf, const stress_shadow_t *s, uint32_t *len)
{
    for (uint32_t l = 0; l < vf->n_layers; l++)
        for (uint32_t h = 0; h < vf->n_kv_heads; h++) {
            uint32_t *x = &len[l * vf->n_kv_heads + h];
            if (kv_seq_len(vf->st, s->id, l, h, x))
                *x = UINT32_MAX;
        }
}

void stress_snap_take(stress_verifier_t *vf, const stress_shadow_t *s)
{
    vf->snap.struct_size = sizeof vf->snap;
    kv_store_stats(vf->st, &vf->snap);
    vf->snap_seq = s != NULL;
    if (s)
        verify_lens(vf, s, vf->snap_len);
}

uint64_t stress_verify_unchanged(stress_verifier_t *vf, const stress_shadow_t *s)
{
    uint64_t before = vf->violations;
    kv_stats_t a = {.struct_size = sizeof a};
    kv_store_stats(vf->st, &a);
    const kv_stats_t *b = &vf->snap;
    /* a refused page evicts cached prefix nodes first (docs/prefix.md):
     * the pages they freed are gone, the call's own effect must not be */
    const uint64_t evicted = a.prefix_evicted_pages - b->prefix_evicted_pages;
    int same = a.pages_used + evicted == b->pages_used && a.n_seqs == b->n_seqs &&
               a.tokens == b->tokens && a.pages_used + a.pages_free == b->pages_used +
               b->pages_free;
    if (a.prefix_evicted == b->prefix_evicted) {
        same = same && a.meta_bytes == b->meta_bytes && a.kv_bytes == b->kv_bytes;
        for (int f = 0; f < KV_FMT_COUNT; f++)
            same = same && a.pages_by_format[f] == b->pages_by_format[f];
    }
    if (!same)
        stress_violation(vf, "a failed call changed the store: pages used %llu -> %llu "
                         "(%llu freed by prefix eviction), sequences %llu -> %llu, tokens "
                         "%llu -> %llu, meta bytes %llu -> %llu",
                         (unsigned long long)b->pages_used, (unsigned long long)a.pages_used,
                         (unsigned long long)evicted,
                         (unsigned long long)b->n_seqs, (unsigned long long)a.n_seqs,
                         (unsigned long long)b->tokens, (unsigned long long)a.tokens,
                         (unsigned long long)b->meta_bytes, (unsigned long long)a.meta_bytes);
    if (s && vf->snap_seq) {
        const uint32_t n = vf->n_layers * vf->n_kv_heads;
        uint32_t *now = vf->snap_len + n;
        verify_lens(vf, s, now);
        for (uint32_t i = 0; i < n; i++)
            if (now[i] != vf->snap_len[i]) {
                stress_violation(vf, "a failed call changed seq %u layer %u head %u: "
                                 "%u -> %u tokens", s->id, i / vf->n_kv_heads,
                                 i % vf->n_kv_heads, vf->snap_len[i], now[i]);
                break;
            }
        stress_verify_seq(vf, s);
    }
    return vf->violations - before;
}

int stress_io_error(int rc)
{
    return rc == KV_EIO || rc == KV_ECORRUPT || (rc < 0 && rc > -1000); /* KV_E*: -1001.. */
}

uint64_t stress_verify_wait(stress_verifier_t *vf, const stress_shadow_t *s, int wait_rc,
                            const kv_residency_t *r)
{
    uint64_t before = vf->violations;
    if (wait_rc && !stress_io_error(wait_rc))
        stress_violation(vf, "kv_seq_wait(seq %u) returned %d (%s), not an I/O error", s->id,
                         wait_rc, kv_strerror(wait_rc));
    if (r->in_flight || r->pages != r->resident + r->on_file || r->lost > r->on_file)
        stress_violation(vf, "seq %u after kv_seq_wait: residency does not add up: pages "
                         "%llu, resident %llu, on file %llu, in flight %llu, lost %llu",
                         s->id, (unsigned long long)r->pages, (unsigned long long)r->resident,
                         (unsigned long long)r->on_file, (unsigned long long)r->in_flight,
                         (unsigned long long)r->lost);
    if (r->lost && wait_rc == 0)
        stress_violation(vf, "seq %u has %llu lost pages, yet kv_seq_wait returned 0 (a "
                         "silent loss)", s->id, (unsigned long long)r->lost);
    return vf->violations - before;
}

uint64_t stress_verify_empty(stress_verifier_t *vf, uint64_t meta0)
{
    uint64_t before = vf->leaks;
    kv_stats_t st = {.struct_size = sizeof st};
    int rc = kv_store_check(vf->st);
    if (rc)
        stress_leak(vf, "empty store: kv_store_check: %s", kv_strerror(rc));
    if (kv_store_stats(vf->st, &st)) {
        stress_leak(vf, "empty store: kv_store_stats failed");
        return vf->leaks - before;
    }
    if (st.pages_used)
        stress_leak(vf, "%llu pages still used after every sequence was freed",
                    (unsigned long long)st.pages_used);
    if (st.tokens || st.n_seqs)
        stress_leak(vf, "%llu tokens in %llu sequences left after every sequence was freed",
                    (unsigned long long)st.tokens, (unsigned long long)st.n_seqs);
    if (st.offload_slots_used || st.pages_on_file || st.pages_in_flight || st.pages_lost)
        stress_leak(vf, "page file after every sequence was freed: %llu slots held, %llu "
                    "pages on the file, %llu in flight, %llu lost",
                    (unsigned long long)st.offload_slots_used,
                    (unsigned long long)st.pages_on_file,
                    (unsigned long long)st.pages_in_flight, (unsigned long long)st.pages_lost);
    if (st.meta_bytes != meta0)
        stress_leak(vf, "metadata: %llu bytes after every sequence was freed, %llu after "
                    "kv_store_create", (unsigned long long)st.meta_bytes,
                    (unsigned long long)meta0);
    return vf->leaks - before;
}
