/* SPDX-License-Identifier: MIT */
/*
 * test_page_convert.c — the page table across formats: residual conversion
 * (pages/kv_page_convert.c), MiniCache merges (pages/kv_page_merge.c), and
 * fork / compaction / free / check with INT and MERGED pages.
 *
 * Oracle: page_ref.h's model of every list (values, positions), extended
 * with each list's target format and residual start. The model converts by
 * the documented rule, independently of the table: after an append,
 * floor(residual / R) * R tokens from the residual start (kv_page_quantize:
 * all but keep, in whole groups), each 16-token group replaced by what the
 * format's own store + load give for those FP16 values; compaction rounds
 * the kept decoded values to FP16 and makes the whole list residual. The
 * table must match the model bit for bit (ref_diff) after every operation.
 *
 * Checks:
 *   - create: residual (multiple of 16, <= 65536, 0 = 128), default format
 *     (FP16/INT4/INT2 only, pages holding a group), and formats that would
 *     hold > 65535 tokens per page are refused;
 *   - residual conversion with random append sizes, INT2 and INT4, page
 *     sizes whose FP16 capacity R is or is not a multiple of (split
 *     pages): the residual stays < R, converted tokens are a multiple of R,
 *     an INT2 page holds exactly 4x and INT4 8/3x the FP16 tokens, INT
 *     pages fill group-wise (the boundary page keeps its id), quantization
 *     error <= the group's scale/2 (from its min/max), check() passes;
 *   - fork + conversion: a shared boundary INT page and a shared split FP16
 *     page are copied, the other sequence reads exactly what it did;
 *   - set_format / quantize: errors, keep rounding, FP16 stops converting;
 *   - compaction of mixed lists (INT + FP16 residual, with forks);
 *   - allocation failure (kv_fault_arm N = 1..) on append-with-conversion
 *     and quantize: a failed call changes nothing; an append whose
 *     conversion failed succeeds with the conversion deferred (all heads
 *     or none), and a later append catches up to the same bits;
 *   - pool exhaustion defers a conversion the same way;
 *   - MERGED at table level: entry layout [MERGED][RETAINED][residual],
 *     UPPER flags on the deeper layer, refcount 2 per merged page (4 after
 *     a fork), retained tokens bit-exact, merged tokens' norms kept,
 *     positions permuted merged-first, compaction of one layer leaves the
 *     other's reads bit-identical, free releases everything, appends after
 *     a merge never go into RETAINED entries, KV_ESTATE / KV_ERANGE /
 *     KV_EINVAL, allocation-failure sweep of the merge;
 *   - check() detects format-specific corruptions.
 */
#include <string.h>

#include "kernels/kv_backend.h"
#include "page_ref.h"
#include "formats/kv_fmt_int.h"
#include "formats/kv_fmt_merged.h"
#include "pages/kv_page_int.h" /* kv_page_residual: tests may look inside */

#define D 64

/* ---- the model's conversion state ------------------------------------------ */

typedef struct cmodel {
    uint32_t R;
    uint32_t dflt;    /* default target format */
    uint32_t *rs;     /* [S][L][H] residual start (tokens before it: not FP16) */
    uint32_t *target; /* [S][L][H] */
} cmodel_t;

static fix_t F;
static cmodel_t CM;
static int64_t BOUND_FAILS; /* model quantization errors past their bound */

static uint32_t *cm_rs(uint32_t s, uint32_t l, uint32_t h)
{
    return &CM.rs[((size_t)s * F.ref.L + l) * F.ref.H + h];
}
static uint32_t *cm_tg(uint32_t s, uint32_t l, uint32_t h)
{
    return &CM.target[((size_t)s * F.ref.L + l) * F.ref.H + h];
}

static const kv_format_traits_t *fmt_tr(uint32_t f) { return kv_format_get(f); }

static uint32_t new_seq(void);

/* Fixture with a chosen page size, default format and residual; returns
 * its first sequence. */
static uint32_t cfix_open(uint32_t L, uint32_t H, uint32_t page_bytes,
                          uint32_t S, uint32_t cap, uint32_t fmt, uint32_t R)
{
    memset(&F, 0, sizeof F);
    kv_alloc_config_t ac = {.page_bytes = page_bytes, .capacity = cap,
                            .tier = KV_TIER_HOST, .flags = KV_ALLOC_NO_TCACHE};
    kv_page_table_config_t pc = {
        .geom = {.head_dim = D, .page_bytes = page_bytes},
        .n_layers = L, .n_kv_heads = H, .max_seqs = S,
        .default_format = fmt, .residual = R};
    int rc = kv_alloc_pool_create(&ac, &F.pool);
    F.mem0 = kv_mem_live_bytes();
    if (!rc)
        rc = kv_page_table_create(&pc, F.pool, &F.pt);
    if (rc) {
        fprintf(stderr, "fixture: %s\n", kv_strerror(rc));
        exit(2);
    }
    F.T = page_bytes / (4 * D);
    ref_init(&F.ref, S, L, H, D);
    CM.R = R ? R : 128;
    CM.dflt = fmt;
    CM.rs = calloc((size_t)S * L * H, sizeof *CM.rs);
    CM.target = calloc((size_t)S * L * H, sizeof *CM.target);
    for (size_t i = 0; i < (size_t)S * L * H; i++)
        CM.target[i] = fmt;
    return new_seq();
}

/* Closes the fixture (everything returned), after checking that every
 * conversion the model made kept its error bound. */
static void cfix_close(void)
{
    CHECK_EQ(BOUND_FAILS, 0);
    fix_close(&F);
    free(CM.rs), free(CM.target);
}

/* Largest |x - x^| allowed in a group: scale/2 with the codec's rounding
 * (min toward -inf by one FP16 step, scale up by one), plus FP32 slack. */
static double group_bound(const float *x, size_t stride, uint32_t levels)
{
    float mn = x[0], mx = x[0];
    for (uint32_t j = 1; j < 16; j++) {
        mn = fminf(mn, x[j * stride]);
        mx = fmaxf(mx, x[j * stride]);
    }
    if (mx == mn)
        return 0.0;
    double ulp = fmax(fabs(mn), 6.1e-5) * (1.0 / 1024.0);
    double sc = ((double)mx - mn + ulp) / levels * (1.0 + 1.0 / 512.0);
    return sc / 2.0 + 1e-6 * fmax(fabs(mx), fabs(mn));
}

/* Convert tokens [t0, t0+c) of a model list to fmt, group by group. */
static void model_convert(ref_list_t *x, uint32_t t0, uint32_t c, uint32_t fmt)
{
    const kv_format_traits_t *tr = fmt_tr(fmt);
    kv_page_geom_t g = {.head_dim = D, .page_bytes = 16 * 24 * D};
    uint32_t levels = fmt == KV_FMT_INT2 ? 3 : 15;
    void *page = calloc(1, g.page_bytes);
    float k[16 * D], v[16 * D];
    for (uint32_t t = t0; t < t0 + c; t += 16) {
        float *xk = x->k + (size_t)t * D, *xv = x->v + (size_t)t * D;
        tr->store(page, &g, 0, 16, KV_DTYPE_F32, xk, xv, D);
        tr->load(page, &g, 0, 16, k, v);
        for (uint32_t ch = 0; ch < D; ch++) { /* keys per channel */
            double b = group_bound(xk + ch, D, levels);
            for (uint32_t j = 0; j < 16; j++)
                BOUND_FAILS += fabs(k[j * D + ch] - xk[j * D + ch]) > b;
        }
        for (uint32_t j = 0; j < 16; j++) /* values per token and 16 ch */
            for (uint32_t cg = 0; cg < D; cg += 16) {
                double b = group_bound(xv + j * D + cg, 1, levels);
                for (uint32_t i = 0; i < 16; i++)
                    BOUND_FAILS += fabs(v[j * D + cg + i] - xv[j * D + cg + i]) > b;
            }
        memcpy(xk, k, sizeof k);
        memcpy(xv, v, sizeof v);
    }
    free(page);
}

/* The conversion rule on one model list (keep: UINT32_MAX = append rule). */
static void model_rule(uint32_t s, uint32_t l, uint32_t h, uint32_t keep)
{
    ref_list_t *x = ref_at(&F.ref, s, l, h);
    uint32_t *rs = cm_rs(s, l, h), tg = *cm_tg(s, l, h);
    if (tg == KV_FMT_FP16)
        return;
    uint32_t res = x->n - *rs, c;
    if (keep == UINT32_MAX)
        c = res / CM.R * CM.R;
    else
        c = res > keep ? (res - keep) / 16 * 16 : 0;
    model_convert(x, *rs, c, tg);
    *rs += c;
}

/* n random tokens for every head of a layer: k, v as appended (K scaled
 * by 2), kr, vr as the table returns them (FP16-rounded); cnt floats each. */
typedef struct toks {
    size_t cnt;
    float *k, *v, *kr, *vr;
} toks_t;

static toks_t toks_gen(uint64_t *seed, uint32_t n)
{
    toks_t t = {.cnt = (size_t)n * F.ref.H * D};
    t.k = malloc(t.cnt * 4), t.v = malloc(t.cnt * 4);
    t.kr = malloc(t.cnt * 4), t.vr = malloc(t.cnt * 4);
    if (!t.k || !t.v || !t.kr || !t.vr)
        exit(2);
    gen_f32(seed, t.cnt, 2.0f, t.k, t.kr);
    gen_f32(seed, t.cnt, 1.0f, t.v, t.vr);
    return t;
}

static void toks_free(toks_t *t)
{
    free(t->k), free(t->v), free(t->kr), free(t->vr);
}

/* Append n random tokens to (s, l) in table and model, the conversion rule
 * applied in the model unless the table deferred it (*deferred, if not
 * NULL, says which). */
static int do_append(uint64_t *seed, uint32_t s, uint32_t l, uint32_t n,
                     int *deferred)
{
    toks_t t = toks_gen(seed, n);
    int rc = kv_page_append(F.pt, s, l, n, KV_DTYPE_F32, t.k, t.v, NULL);
    if (rc == 0) {
        ref_append(&F.ref, s, l, n, t.kr, t.vr, NULL);
        /* a conversion that could not get memory is deferred: detected by
         * the table's residual still being >= R somewhere */
        int def = 0;
        for (uint32_t h = 0; h < F.ref.H; h++) {
            const kv_page_list_t *pl = kv_page_list_get(F.pt, s, l, h);
            uint32_t r0;
            uint32_t res = kv_page_residual(pl, &r0);
            def |= *cm_tg(s, l, h) != KV_FMT_FP16 && res >= CM.R;
        }
        if (deferred)
            *deferred = def;
        for (uint32_t h = 0; h < F.ref.H && !def; h++)
            model_rule(s, l, h, UINT32_MAX);
    }
    toks_free(&t);
    return rc;
}

static void model_fork(uint32_t p, uint32_t c)
{
    ref_fork(&F.ref, p, c);
    for (uint32_t l = 0; l < F.ref.L; l++)
        for (uint32_t h = 0; h < F.ref.H; h++) {
            *cm_rs(c, l, h) = *cm_rs(p, l, h);
            *cm_tg(c, l, h) = *cm_tg(p, l, h);
        }
}

static void model_clear(uint32_t s)
{
    ref_clear(&F.ref, s);
    for (uint32_t l = 0; l < F.ref.L; l++)
        for (uint32_t h = 0; h < F.ref.H; h++) {
            *cm_rs(s, l, h) = 0;
            *cm_tg(s, l, h) = CM.dflt;
        }
}

static void model_compact(uint32_t s, uint32_t l, uint32_t h,
                          const uint32_t *keep, uint32_t nk)
{
    ref_list_t *x = ref_at(&F.ref, s, l, h);
    ref_compact(&F.ref, s, l, h, keep, nk);
    for (size_t i = 0; i < (size_t)nk * D; i++) {
        x->k[i] = kv_half_to_float(kv_half_from_float(x->k[i]));
        x->v[i] = kv_half_to_float(kv_half_from_float(x->v[i]));
    }
    *cm_rs(s, l, h) = 0;
}

static uint32_t new_seq(void)
{
    uint32_t s;
    CHECK_OK(kv_page_seq_create(F.pt, &s));
    F.ref.live[s] = 1;
    model_clear(s);
    F.ref.live[s] = 1;
    return s;
}

/* Tokens of format f in a list, and checks of its entry structure. */
static uint32_t fmt_tokens(const kv_page_list_t *l, uint32_t f)
{
    uint32_t n = 0;
    for (uint32_t e = 0; e < l->n_ents; e++)
        n += l->ents[e].format == f ? l->ents[e].n_tokens : 0;
    return n;
}

/* ---- one step in table and model -------------------------------------------- */

/* The table matches the model and passes its own check (two CHECKs). */
static void table_ok(void)
{
    CHECK_EQ(ref_diff(F.pt, &F.ref), 0);
    CHECK_OK(kv_page_table_check(F.pt));
}

static uint32_t fork_seq(uint32_t parent)
{
    uint32_t c = 0;
    CHECK_OK(kv_page_seq_fork(F.pt, parent, &c));
    model_fork(parent, c);
    return c;
}

static void free_seq(uint32_t s)
{
    CHECK_OK(kv_page_seq_free(F.pt, s));
    model_clear(s);
}

/* Layer l of s converts to fmt from now on (every head). */
static void set_target(uint32_t s, uint32_t l, uint32_t fmt)
{
    CHECK_OK(kv_page_set_format(F.pt, s, l, fmt));
    for (uint32_t h = 0; h < F.ref.H; h++)
        *cm_tg(s, l, h) = fmt;
}

/* kv_page_quantize, and on success the same rule in the model. */
static int quantize(uint32_t s, uint32_t l, uint32_t keep)
{
    int rc = kv_page_quantize(F.pt, s, l, keep);
    for (uint32_t h = 0; rc == 0 && h < F.ref.H; h++)
        model_rule(s, l, h, keep);
    return rc;
}

/* For fault_sweep: quantize(a[0], a[1], a[2]). */
static int quantize_op(fix_t *f, void *a_)
{
    const uint32_t *a = a_;
    (void)f;
    return quantize(a[0], a[1], a[2]);
}

static void compact(uint32_t s, uint32_t l, uint32_t h, const uint32_t *keep,
                    uint32_t nk)
{
    CHECK_OK(kv_page_compact(F.pt, s, l, h, keep, nk));
    model_compact(s, l, h, keep, nk);
}

/* ---- tests ------------------------------------------------------------------ */

static void test_create(void)
{
    kv_alloc_pool_t *pool;
    kv_alloc_config_t ac = {.page_bytes = 4096, .capacity = 4,
                            .tier = KV_TIER_HOST};
    CHECK_OK(kv_alloc_pool_create(&ac, &pool));
    kv_page_table_config_t ok = {.geom = {.head_dim = 64, .page_bytes = 4096},
                                 .n_layers = 1, .n_kv_heads = 1,
                                 .max_seqs = 2};
    kv_page_table_t *pt = NULL;
    kv_page_table_config_t c = ok;
    c.residual = 24;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    c.residual = 65536 + 16;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    c = ok, c.default_format = KV_FMT_MERGED;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    c = ok, c.default_format = 9;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    c = ok, c.residual = 65536, c.default_format = KV_FMT_INT4;
    CHECK_OK(kv_page_table_create(&c, pool, &pt));
    kv_page_table_destroy(pt);
    kv_alloc_pool_destroy(pool);
    /* INT2 pages must hold a group: 512-byte pages at head_dim 64 do not */
    ac.page_bytes = 512;
    CHECK_OK(kv_alloc_pool_create(&ac, &pool));
    c = ok, c.geom.page_bytes = 512, c.default_format = KV_FMT_INT2;
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    c.default_format = KV_FMT_FP16;
    CHECK_OK(kv_page_table_create(&c, pool, &pt));
    uint32_t s;
    CHECK_OK(kv_page_seq_create(pt, &s));
    CHECK_EQ(kv_page_set_format(pt, s, 0, KV_FMT_INT2), KV_ENOTSUP);
    kv_page_table_destroy(pt);
    kv_alloc_pool_destroy(pool);
    /* 16-bit n_tokens: INT2 at head_dim 16 in 1 MiB pages would hold 65536 */
    ac.page_bytes = 1u << 20;
    ac.capacity = 1;
    CHECK_OK(kv_alloc_pool_create(&ac, &pool));
    c = ok, c.geom = (kv_page_geom_t){.head_dim = 16, .page_bytes = 1u << 20};
    CHECK_EQ(kv_page_table_create(&c, pool, &pt), KV_ERANGE);
    kv_alloc_pool_destroy(pool);
    ac.page_bytes = (1u << 20) - 64; /* 65520 INT2 tokens: fits */
    CHECK_OK(kv_alloc_pool_create(&ac, &pool));
    c.geom.page_bytes = ac.page_bytes;
    CHECK_OK(kv_page_table_create(&c, pool, &pt));
    kv_page_table_destroy(pt);
    kv_alloc_pool_destroy(pool);
}

/* Random appends to a 2-layer, 2-head table: layer 0 converts to fmt,
 * layer 1 stays FP16. */
static void residual_case(uint32_t fmt, uint32_t page_bytes, uint32_t R,
                          uint64_t seed)
{
    uint32_t s = cfix_open(2, 2, page_bytes, 2, 2048, KV_FMT_FP16, R);
    set_target(s, 0, fmt);
    const uint32_t T = F.T, tpp = kv_page_fmt_tpp(F.pt, fmt);
    if (fmt == KV_FMT_INT2)
        CHECK_EQ(tpp, 4 * T);
    if (fmt == KV_FMT_INT4 && page_bytes % (192 * D) == 0)
        CHECK_EQ(tpp * 3, 8 * T);
    int structure_ok = 1, boundary_kept = 1;
    kv_page_id_t last_bound = 0;
    uint32_t last_bound_n = 0;
    for (uint32_t step = 0; step < 40; step++) {
        uint32_t n = 1 + (uint32_t)(kv_test_rand(&seed) % (step % 7 == 0 ? 90 : 12));
        for (uint32_t l = 0; l < 2; l++)
            CHECK_OK(do_append(&seed, s, l, n, NULL));
        for (uint32_t h = 0; h < 2; h++) {
            const kv_page_list_t *pl = kv_page_list_get(F.pt, s, 0, h);
            uint32_t conv = fmt_tokens(pl, fmt), res = fmt_tokens(pl, KV_FMT_FP16);
            structure_ok &= conv % R == 0 && res < R && conv + res == pl->n_tokens;
            structure_ok &= conv == *cm_rs(s, 0, h);
            /* every INT entry but the last INT one is full */
            uint32_t n_int = 0;
            for (uint32_t e = 0; e < pl->n_ents; e++)
                if (pl->ents[e].format == fmt) {
                    n_int++;
                    if (e + 1 < pl->n_ents && pl->ents[e + 1].format == fmt)
                        structure_ok &= pl->ents[e].n_tokens == tpp;
                }
            structure_ok &= n_int == (conv + tpp - 1) / tpp;
            if (n_int && pl->ents[0].format == KV_FMT_FP16)
                structure_ok = 0;
            if (h == 0 && n_int) { /* group-wise fill of one page */
                const kv_page_ent_t *b = &pl->ents[n_int - 1];
                if (b->id == last_bound)
                    boundary_kept &= b->n_tokens >= last_bound_n;
                else if (last_bound && last_bound_n < tpp && n_int == 1)
                    boundary_kept = 0; /* a page with room was replaced */
                last_bound = b->id;
                last_bound_n = b->n_tokens;
            }
            /* layer 1 (FP16 target) never converts */
            structure_ok &= fmt_tokens(kv_page_list_get(F.pt, s, 1, h),
                                       KV_FMT_FP16) ==
                            kv_page_list_get(F.pt, s, 1, h)->n_tokens;
        }
        table_ok();
    }
    CHECK(structure_ok);
    CHECK(boundary_kept);
    kv_page_totals_t tot;
    kv_page_table_totals(F.pt, &tot);
    CHECK(tot.pages_by_format[fmt] > 0);
    free_seq(s);
    kv_page_table_totals(F.pt, &tot);
    CHECK_EQ(tot.pages_by_format[fmt], 0);
    cfix_close();
}

static void test_residual(void)
{
    residual_case(KV_FMT_INT2, 64 * D, 32, 1);       /* T 16, tpp 64   */
    residual_case(KV_FMT_INT4, 192 * D, 32, 2);      /* T 48, tpp 128  */
    residual_case(KV_FMT_INT2, 192 * D, 128, 3);     /* T 48: splits   */
    residual_case(KV_FMT_INT4, 256 * D, 48, 4);      /* boundary fills */
    residual_case(KV_FMT_INT2, 1024 * D, 16, 5);     /* 1024 per page  */
}

/* Fork: a shared boundary INT page and a shared split FP16 page. */
static void test_fork_cow(void)
{
    /* T = 48, INT2 tpp = 192, R = 32: boundary has room, cuts split */
    uint64_t seed = 77;
    uint32_t a = cfix_open(1, 2, 192 * D, 4, 512, KV_FMT_INT2, 32);
    CHECK_OK(do_append(&seed, a, 0, 40, NULL)); /* 32 INT2 + 8 FP16 */
    uint32_t b = fork_seq(a);
    const kv_page_list_t *la = kv_page_list_get(F.pt, a, 0, 0);
    const kv_page_list_t *lb = kv_page_list_get(F.pt, b, 0, 0);
    kv_page_id_t bound = la->ents[0].id, res = la->ents[1].id;
    CHECK_EQ(kv_alloc_refcount(F.pool, bound), 2);
    /* a: 30 more -> residual 38 -> 32 convert into the shared boundary
     * (copied) and cut the shared residual page at 24 of 38 (moved) */
    CHECK_OK(do_append(&seed, a, 0, 30, NULL));
    CHECK(la->ents[0].id != bound && la->ents[0].n_tokens == 64);
    CHECK(lb->ents[0].id == bound && lb->ents[0].n_tokens == 32);
    CHECK(lb->ents[1].id == res && lb->ents[1].n_tokens == 8);
    CHECK_EQ(kv_alloc_refcount(F.pool, bound), 1);
    CHECK_EQ(kv_alloc_refcount(F.pool, res), 1);
    table_ok();
    /* b alone now: its boundary fills in place */
    CHECK_OK(do_append(&seed, b, 0, 30, NULL));
    CHECK(lb->ents[0].id == bound && lb->ents[0].n_tokens == 64);
    table_ok();
    /* a fork sharing INT pages and a partly cut residual head */
    uint32_t c = fork_seq(b);
    for (int i = 0; i < 6; i++) {
        CHECK_OK(do_append(&seed, i % 2 ? b : c, 0, 1 + 13 * (uint32_t)i, NULL));
        table_ok();
    }
    cfix_close();
}

static void test_quantize(void)
{
    uint64_t seed = 8;
    uint32_t s = cfix_open(2, 2, 64 * D, 2, 512, KV_FMT_FP16, 64);
    CHECK_OK(do_append(&seed, s, 0, 100, NULL));
    CHECK_EQ(kv_page_set_format(F.pt, s, 0, KV_FMT_MERGED), KV_EINVAL);
    CHECK_EQ(kv_page_set_format(F.pt, s, 0, 7), KV_EINVAL);
    CHECK_EQ(kv_page_set_format(F.pt, s, 2, KV_FMT_INT4), KV_ERANGE);
    CHECK_EQ(kv_page_set_format(F.pt, s + 1, 0, KV_FMT_INT4), KV_ENOENT);
    CHECK_EQ(kv_page_set_format(NULL, s, 0, KV_FMT_INT4), KV_EINVAL);
    CHECK_EQ(kv_page_quantize(F.pt, s, 2, 0), KV_ERANGE);
    CHECK_EQ(kv_page_quantize(F.pt, s + 1, 0, 0), KV_ENOENT);
    /* FP16 target: quantize is a no-op */
    CHECK_OK(quantize(s, 0, 0));
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, s, 0, 0), KV_FMT_FP16), 100);
    set_target(s, 0, KV_FMT_INT4);
    /* keep 10 -> 90 rounded down to 80 convert */
    CHECK_OK(quantize(s, 0, 10));
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, s, 0, 1), KV_FMT_INT4), 80);
    table_ok();
    CHECK_OK(quantize(s, 0, 0)); /* 96 */
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, s, 0, 0), KV_FMT_INT4), 96);
    CHECK_OK(quantize(s, 0, 1000)); /* keep more than held: a no-op */
    CHECK_EQ(ref_diff(F.pt, &F.ref), 0);
    /* switch to FP16: appends stop converting */
    set_target(s, 0, KV_FMT_FP16);
    CHECK_OK(do_append(&seed, s, 0, 200, NULL));
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, s, 0, 0), KV_FMT_INT4), 96);
    /* and back to INT2: the next append converts floor(res / R) * R */
    set_target(s, 0, KV_FMT_INT2);
    CHECK_OK(do_append(&seed, s, 0, 1, NULL));
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, s, 0, 0), KV_FMT_INT2), 192);
    table_ok();
    cfix_close();
}

static void test_compact(void)
{
    uint64_t seed = 99;
    uint32_t a = cfix_open(1, 2, 192 * D, 4, 1024, KV_FMT_INT4, 32);
    CHECK_OK(do_append(&seed, a, 0, 150, NULL));
    uint32_t b = fork_seq(a);
    uint32_t keep[400];
    for (int round = 0; round < 12; round++) {
        uint32_t s = round % 2 ? a : b, h = (uint32_t)round % 2;
        const kv_page_list_t *pl = kv_page_list_get(F.pt, s, 0, h);
        uint32_t nk = 0;
        for (uint32_t i = 0; i < pl->n_tokens; i++)
            if (kv_test_rand(&seed) % 4 != 0)
                keep[nk++] = i;
        compact(s, 0, h, keep, nk);
        table_ok();
        /* everything FP16 after a compaction; the next appends convert */
        CHECK_EQ(fmt_tokens(pl, KV_FMT_FP16), pl->n_tokens);
        CHECK_OK(do_append(&seed, s, 0, 1 + (uint32_t)round * 5, NULL));
        table_ok();
    }
    free_seq(a);
    table_ok();
    cfix_close();
}

/* Allocation failure sweeps. */
static void test_faults(void)
{
    uint64_t seed = 5;
    uint32_t a = cfix_open(2, 3, 192 * D, 4, 1024, KV_FMT_INT2, 32);
    CHECK_OK(do_append(&seed, a, 0, 20, NULL));
    uint32_t b = fork_seq(a);
    int deferrals = 0, fails = 0;
    snap_t before = {0}, after = {0};
    const uint32_t sizes[5] = {30, 1, 70, 13, 64};
    for (int op = 0; op < 5; op++) {
        for (int n = 1; n < 300; n++) {
            snap_take(&F, &before);
            uint64_t sd = seed;
            kv_fault_arm((uint64_t)n);
            int def = 0;
            int rc = do_append(&sd, op % 2 ? b : a, 0, sizes[op], &def);
            int fired = kv_fault_fired();
            kv_fault_arm(0);
            if (rc == 0) {
                seed = sd;
                deferrals += def;
                CHECK(!def || fired); /* deferred only when memory ran out */
                table_ok();
                if (!def)
                    break;
                /* deferred: a later append catches up, same bits */
                CHECK_OK(do_append(&seed, op % 2 ? b : a, 0, 1, &def));
                CHECK(!def);
                CHECK_EQ(ref_diff(F.pt, &F.ref), 0);
                break;
            }
            fails++;
            CHECK_EQ(rc, KV_ENOMEM);
            snap_take(&F, &after);
            CHECK(snap_same(&before, &after));
            CHECK_EQ(ref_diff(F.pt, &F.ref), 0);
        }
    }
    CHECK(fails >= 3);
    CHECK(deferrals >= 3);
    fprintf(stderr, "append sweeps: %d failures, %d deferrals\n", fails,
            deferrals);
    /* quantize: all or nothing */
    set_target(a, 1, KV_FMT_INT4);
    CHECK_OK(do_append(&seed, a, 1, 25, NULL)); /* < R: stays FP16 */
    uint32_t qa[3] = {a, 1, 3}; /* seq, layer, keep */
    CHECK(fault_sweep(&F, quantize_op, qa, 299) >= 2);
    table_ok();
    snap_free(&before);
    snap_free(&after);
    cfix_close();
}

/* Pool exhaustion defers a conversion; freeing pages lets it catch up. */
static void test_pool_deferral(void)
{
    /* T 16, INT2 64/page, R 64; 1 head; 8 pages. */
    uint64_t seed = 12;
    uint32_t a = cfix_open(1, 1, 64 * D, 3, 8, KV_FMT_INT2, 64), b = new_seq();
    set_target(b, 0, KV_FMT_FP16);
    CHECK_OK(do_append(&seed, a, 0, 63, NULL)); /* 4 FP16 pages */
    CHECK_OK(do_append(&seed, b, 0, 64, NULL)); /* 4 FP16 pages: full */
    kv_alloc_stats_t st;
    kv_alloc_stats(F.pool, &st);
    CHECK_EQ(st.free, 0);
    int def = 0;
    /* the 64th token fits a's tail; converting needs an INT2 page */
    CHECK_OK(do_append(&seed, a, 0, 1, &def));
    CHECK(def);
    CHECK_EQ(kv_page_list_get(F.pt, a, 0, 0)->n_tokens, 64);
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, a, 0, 0), KV_FMT_INT2), 0);
    table_ok();
    /* a full pool refuses a new FP16 page: the append itself fails */
    CHECK_EQ(do_append(&seed, a, 0, 1, &def), KV_ENOMEM);
    CHECK_EQ(ref_diff(F.pt, &F.ref), 0);
    free_seq(b);
    CHECK_OK(do_append(&seed, a, 0, 1, &def)); /* catches up: 64 convert */
    CHECK(!def);
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, a, 0, 0), KV_FMT_INT2), 64);
    table_ok();
    kv_alloc_stats(F.pool, &st);
    CHECK_EQ(st.used, 2); /* one INT2 page + the 65th token's FP16 page */
    cfix_close();
}

/* ---- MERGED at the table level --------------------------------------------- */

static double vnorm(const float *x)
{
    double s = 0;
    for (uint32_t c = 0; c < D; c++)
        s += (double)x[c] * x[c];
    return sqrt(s);
}

/* Per head, the tokens of the partly filled RETAINED entry that ends at
 * token rs in both lists of the pair (the page a merge from rs that retains
 * a token repacks), else 0. */
static void merge_pre(uint32_t s, uint32_t layer, uint32_t rs, uint32_t *pre)
{
    for (uint32_t h = 0; h < F.ref.H; h++) {
        pre[h] = 0;
        uint32_t n[2] = {0, 0};
        for (uint32_t j = 0; j < 2; j++) {
            const kv_page_list_t *l = kv_page_list_get(F.pt, s, layer - 1 + j, h);
            for (uint32_t e = 0, at = 0; e < l->n_ents; at += l->ents[e++].n_tokens)
                if (at + l->ents[e].n_tokens == rs &&
                    l->ents[e].flags == KV_PAGE_ENT_RETAINED &&
                    l->ents[e].n_tokens < F.pt->fp16_tpp)
                    n[j] = l->ents[e].n_tokens;
        }
        if (n[0] == n[1])
            pre[h] = n[0];
    }
}

/* After merging (s, layer-1/layer) with m tokens from residual start rs
 * (pre: per head, tokens of a repacked previous RETAINED page, from
 * merge_pre before the merge; NULL: none): verify entries, flags,
 * refcounts, values against the model (retained bit-exact, merged norms),
 * positions; then take the table's values into the model (merged tokens'
 * restored values) and return the retained count over heads. */
static uint32_t verify_merge(uint32_t s, uint32_t layer, uint32_t rs0,
                             uint32_t m0, uint32_t refs, const uint32_t *pre)
{
    uint32_t total_ret = 0;
    for (uint32_t h = 0; h < F.ref.H; h++) {
        /* a repacked previous RETAINED page starts the segment earlier */
        const uint32_t rs = rs0 - (pre ? pre[h] : 0), m = m0 + (pre ? pre[h] : 0);
        const kv_page_list_t *pa = kv_page_list_get(F.pt, s, layer - 1, h);
        const kv_page_list_t *pb = kv_page_list_get(F.pt, s, layer, h);
        CHECK_EQ(pa->n_ents, pb->n_ents);
        uint32_t at = 0, n_m = 0, n_r = 0, flags_ok = 1, layout_ok = 1;
        int phase = 0; /* 0 before segment, 1 merged, 2 retained, 3 rest */
        for (uint32_t e = 0; e < pa->n_ents && e < pb->n_ents; e++) {
            const kv_page_ent_t *x = &pa->ents[e], *y = &pb->ents[e];
            if (at >= rs && at < rs + m) {
                if (x->format == KV_FMT_MERGED) {
                    layout_ok &= phase <= 1;
                    phase = 1;
                    n_m += x->n_tokens;
                    flags_ok &= x->id == y->id && x->flags == 0 &&
                                y->flags == KV_PAGE_ENT_UPPER &&
                                kv_alloc_refcount(F.pool, x->id) == refs;
                } else {
                    layout_ok &= x->format == KV_FMT_FP16 &&
                                 x->flags == KV_PAGE_ENT_RETAINED &&
                                 y->flags == KV_PAGE_ENT_RETAINED &&
                                 x->id != y->id;
                    phase = 2;
                    n_r += x->n_tokens;
                }
            }
            at += x->n_tokens;
        }
        CHECK(flags_ok);
        CHECK(layout_ok);
        CHECK_EQ(n_m + n_r, m);
        total_ret += n_r;
        /* values and positions */
        for (uint32_t j = 0; j < 2; j++) {
            uint32_t l = layer - 1 + j;
            ref_list_t *x = ref_at(&F.ref, s, l, h);
            uint32_t n = x->n;
            float *k = malloc((size_t)n * D * 4), *v = malloc((size_t)n * D * 4);
            int32_t *pos = malloc(n * 4);
            CHECK_OK(kv_page_read(F.pt, s, l, h, 0, n, k, v, pos));
            int same = 1, norms = 1, order = 1;
            for (uint32_t i = 0; i < n; i++) {
                /* find the model token with this position */
                uint32_t src = UINT32_MAX;
                for (uint32_t q = 0; q < n && src == UINT32_MAX; q++)
                    if (x->pos[q] == pos[i])
                        src = q;
                if (src == UINT32_MAX) {
                    same = 0;
                    continue;
                }
                const float *mk = x->k + (size_t)src * D, *mv = x->v + (size_t)src * D;
                int merged = i >= rs && i < rs + n_m;
                if (!merged) { /* untouched or retained: bit-exact */
                    same &= memcmp(k + (size_t)i * D, mk, D * 4) == 0 &&
                            memcmp(v + (size_t)i * D, mv, D * 4) == 0;
                } else {
                    double a = vnorm(mk), b = vnorm(k + (size_t)i * D);
                    norms &= fabs(a - b) <= 1e-5 * a + 1e-30;
                    a = vnorm(mv), b = vnorm(v + (size_t)i * D);
                    norms &= fabs(a - b) <= 1e-5 * a + 1e-30;
                }
                if (i > rs && i < rs + n_m)
                    order &= pos[i] > pos[i - 1];
                if (i > rs + n_m && i < rs + m)
                    order &= pos[i] > pos[i - 1];
                if (i < rs || i >= rs + m)
                    order &= src == i;
            }
            CHECK(same);
            CHECK(norms);
            CHECK(order);
            memcpy(x->k, k, (size_t)n * D * 4);
            memcpy(x->v, v, (size_t)n * D * 4);
            memcpy(x->pos, pos, (size_t)n * 4);
            free(k), free(v), free(pos);
        }
    }
    return total_ret;
}

/* Append the same-position tokens to both layers, layer l's values
 * correlated with layer l-1's (what merging is for). */
static void append_pair(uint64_t *seed, uint32_t s, uint32_t l0, uint32_t n)
{
    toks_t t = toks_gen(seed, n);
    for (uint32_t j = 0; j < 2; j++) {
        if (j)
            for (size_t i = 0; i < t.cnt; i++) {
                t.k[i] = t.k[i] * 1.2f + 0.3f * kv_test_randf(seed);
                t.v[i] = t.v[i] * 0.8f + 0.3f * kv_test_randf(seed);
                t.kr[i] = kv_half_to_float(kv_half_from_float(t.k[i]));
                t.vr[i] = kv_half_to_float(kv_half_from_float(t.v[i]));
            }
        CHECK_OK(kv_page_append(F.pt, s, l0 + j, n, KV_DTYPE_F32, t.k, t.v,
                                NULL));
        ref_append(&F.ref, s, l0 + j, n, t.kr, t.vr, NULL);
    }
    toks_free(&t);
}

/* For fault_sweep: merge layer `layer` of seq s into layer - 1. */
typedef struct merge_arg {
    uint32_t s, layer;
    const kv_page_merge_opts_t *o;
} merge_arg_t;

static int merge_op(fix_t *f, void *a_)
{
    const merge_arg_t *a = a_;
    return kv_page_merge_layers(f->pt, a->s, a->layer, a->o);
}

static void test_merge(void)
{
    uint64_t seed = 21;
    uint32_t s = cfix_open(3, 2, 64 * D, 4, 1024, KV_FMT_FP16, 128);
    append_pair(&seed, s, 1, 150);
    kv_page_merge_opts_t o = {.t = 0.6f, .gamma = 0.05f,
                              .dir_format = KV_FMT_FP16, .keep_fp16 = 10};
    CHECK_EQ(kv_page_merge_layers(F.pt, s, 0, &o), KV_ERANGE);
    CHECK_EQ(kv_page_merge_layers(F.pt, s, 3, &o), KV_ERANGE);
    CHECK_EQ(kv_page_merge_layers(F.pt, s + 1, 2, &o), KV_ENOENT);
    kv_page_merge_opts_t bad = o;
    bad.t = -1;
    CHECK_EQ(kv_page_merge_layers(F.pt, s, 2, &bad), KV_EINVAL);
    bad = o, bad.gamma = 2;
    CHECK_EQ(kv_page_merge_layers(F.pt, s, 2, &bad), KV_EINVAL);
    bad = o, bad.dir_format = KV_FMT_INT2;
    CHECK_EQ(kv_page_merge_layers(F.pt, s, 2, &bad), KV_EINVAL);
    CHECK_EQ(kv_page_merge_layers(F.pt, s, 2, NULL), KV_EINVAL);
    /* layer 0 is empty, layer 1 is not: residuals differ */
    CHECK_EQ(kv_page_merge_layers(F.pt, s, 1, &o), KV_ESTATE);
    CHECK_EQ(ref_diff(F.pt, &F.ref), 0);

    /* allocation-failure sweep of the merge */
    merge_arg_t ma = {s, 2, &o};
    CHECK(fault_sweep(&F, merge_op, &ma, 399) >= 3);
    CHECK_OK(kv_page_table_check(F.pt));
    uint32_t nret = verify_merge(s, 2, 0, 140, 2, NULL);
    CHECK(nret >= 2 && nret < 60);
    kv_page_totals_t tot;
    kv_page_table_totals(F.pt, &tot);
    CHECK(tot.pages_by_format[KV_FMT_MERGED] >= 2 * ((140 - 30) / 15));
    CHECK_EQ(ref_diff(F.pt, &F.ref), 0);

    /* appends after a merge go after the residual, never into RETAINED */
    append_pair(&seed, s, 1, 40);
    table_ok();
    /* a second merge of the new tokens (INT4 directions), keep 0 */
    o.dir_format = KV_FMT_INT4;
    o.keep_fp16 = 0;
    uint32_t pre[8], n_pre = 0;
    CHECK(F.ref.H <= 8);
    merge_pre(s, 2, 140, pre);
    for (uint32_t h = 0; h < F.ref.H; h++)
        n_pre += pre[h] > 0;
    CHECK(n_pre > 0); /* the first merge left a partly filled RETAINED page */
    CHECK_OK(kv_page_merge_layers(F.pt, s, 2, &o));
    CHECK_OK(kv_page_table_check(F.pt));
    verify_merge(s, 2, 140, 50, 2, pre);
    /* the tail is RETAINED (or MERGED) now: appending starts a new page */
    append_pair(&seed, s, 1, 3);
    {
        const kv_page_list_t *pl = kv_page_list_get(F.pt, s, 2, 0);
        CHECK(pl->ents[pl->n_ents - 1].flags == 0 &&
              pl->ents[pl->n_ents - 1].n_tokens == 3);
    }
    table_ok();
    /* nothing new to merge but 3 (keep 5): a no-op */
    o.keep_fp16 = 5;
    CHECK_OK(kv_page_merge_layers(F.pt, s, 2, &o));
    CHECK_EQ(ref_diff(F.pt, &F.ref), 0);
    /* residuals of different lengths */
    {
        float k[2 * D] = {0}, v[2 * D] = {0};
        CHECK_OK(kv_page_append(F.pt, s, 2, 1, KV_DTYPE_F32, k, v, NULL));
        ref_append(&F.ref, s, 2, 1, k, v, NULL);
        CHECK_EQ(kv_page_merge_layers(F.pt, s, 2, &o), KV_ESTATE);
        CHECK_OK(kv_page_append(F.pt, s, 1, 1, KV_DTYPE_F32, k, v, NULL));
        ref_append(&F.ref, s, 1, 1, k, v, NULL);
    }

    /* fork: merged pages gain the child's two references */
    uint32_t c = fork_seq(s);
    const kv_page_list_t *pa = kv_page_list_get(F.pt, s, 1, 0);
    kv_page_id_t mid = pa->ents[0].id;
    CHECK_EQ(pa->ents[0].format, KV_FMT_MERGED);
    CHECK_EQ(kv_alloc_refcount(F.pool, mid), 4);
    CHECK_OK(kv_page_table_check(F.pt));
    /* compaction of one layer of the child: its view becomes FP16, the
     * other layer (and the parent) read exactly as before */
    const kv_page_list_t *cl = kv_page_list_get(F.pt, c, 1, 0);
    uint32_t keep[512], nk = 0;
    for (uint32_t i = 0; i < cl->n_tokens; i++)
        if (i % 3)
            keep[nk++] = i;
    compact(c, 1, 0, keep, nk);
    CHECK_EQ(kv_alloc_refcount(F.pool, mid), 3);
    table_ok();
    /* free the parent: the child's deeper layer still holds the page */
    free_seq(s);
    CHECK_EQ(kv_alloc_refcount(F.pool, mid), 1);
    table_ok();
    /* compaction keeping everything of the last holder frees the page */
    cl = kv_page_list_get(F.pt, c, 2, 0);
    nk = cl->n_tokens;
    for (uint32_t i = 0; i < nk; i++)
        keep[i] = i;
    compact(c, 2, 0, keep, nk);
    CHECK_EQ(kv_alloc_refcount(F.pool, mid), 0);
    table_ok();
    free_seq(c);
    kv_page_table_totals(F.pt, &tot);
    CHECK_EQ(tot.pages_by_format[KV_FMT_MERGED], 0);
    cfix_close();
}

/* Conversion of a merged layer's residual to INT2 leaves the merged and
 * retained parts alone. */
static void test_merge_then_int(void)
{
    uint64_t seed = 3;
    uint32_t s = cfix_open(2, 1, 64 * D, 2, 512, KV_FMT_FP16, 32);
    append_pair(&seed, s, 0, 70);
    kv_page_merge_opts_t o = {.t = 0.6f, .gamma = 0.1f,
                              .dir_format = KV_FMT_FP16, .keep_fp16 = 0};
    CHECK_OK(kv_page_merge_layers(F.pt, s, 1, &o));
    verify_merge(s, 1, 0, 70, 2, NULL);
    for (uint32_t l = 0; l < 2; l++) {
        set_target(s, l, KV_FMT_INT2);
        *cm_rs(s, l, 0) = 70; /* the merged segment is not residual */
    }
    for (int i = 0; i < 5; i++) {
        CHECK_OK(do_append(&seed, s, 0, 17, NULL));
        CHECK_OK(do_append(&seed, s, 1, 17, NULL));
        table_ok();
    }
    CHECK_EQ(fmt_tokens(kv_page_list_get(F.pt, s, 1, 0), KV_FMT_INT2), 64);
    cfix_close();
}

static void test_check_detects(void)
{
    uint64_t seed = 1;
    uint32_t s = cfix_open(2, 1, 64 * D, 2, 256, KV_FMT_INT2, 32);
    CHECK_OK(do_append(&seed, s, 0, 40, NULL)); /* INT2 32 + FP16 8 */
    CHECK_OK(kv_page_table_check(F.pt));
    fprintf(stderr, "(the kv_page_table_check lines below are expected)\n");
    kv_page_list_t *l = (kv_page_list_t *)kv_page_list_get(F.pt, s, 0, 0);
    CHECK_EQ(l->ents[0].format, KV_FMT_INT2);
    CHECK_EQ(l->ents[1].format, KV_FMT_FP16);
    l->ents[1].flags = KV_PAGE_ENT_ROT; /* bit 0 on an FP16 entry (one variant) */
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    l->ents[1].flags = 0;
    l->ents[0].flags = KV_PAGE_ENT_RETAINED; /* RETAINED on an INT entry */
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    l->ents[0].flags = 0x80; /* unknown bit */
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    l->ents[0].flags = 0;
    l->ents[0].n_tokens -= 8; /* not whole groups */
    l->ents[1].n_tokens += 8;
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    l->ents[0].n_tokens += 8;
    l->ents[1].n_tokens -= 8;
    l->target = KV_FMT_MERGED;
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    l->target = KV_FMT_INT2;
    CHECK_OK(kv_page_table_check(F.pt));
    cfix_close();

    s = cfix_open(2, 1, 64 * D, 2, 256, KV_FMT_FP16, 32);
    append_pair(&seed, s, 0, 40);
    kv_page_merge_opts_t o = {.t = 0.6f, .gamma = 0.0f,
                              .dir_format = KV_FMT_FP16, .keep_fp16 = 0};
    CHECK_OK(kv_page_merge_layers(F.pt, s, 1, &o));
    CHECK_OK(kv_page_table_check(F.pt));
    l = (kv_page_list_t *)kv_page_list_get(F.pt, s, 0, 0);
    CHECK_EQ(l->ents[0].format, KV_FMT_MERGED);
    l->ents[0].flags = KV_PAGE_ENT_UPPER; /* UPPER in layer 0's list */
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    l->ents[0].flags = 0;
    uint8_t *pg = kv_alloc_page_ptr(F.pool, l->ents[0].id);
    pg[0] = 2; /* direction format INT2: invalid header */
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    pg[0] = 0;
    l->ents[0].n_tokens = 16; /* more than the page's 15 FP16-dir slots */
    l->ents[1].n_tokens--;
    CHECK_EQ(kv_page_table_check(F.pt), KV_ECORRUPT);
    l->ents[0].n_tokens = 15;
    l->ents[1].n_tokens++;
    CHECK_OK(kv_page_table_check(F.pt));
    cfix_close();
}

int main(void)
{
    test_create();
    test_residual();
    test_fork_cow();
    test_quantize();
    test_compact();
    test_faults();
    test_pool_deferral();
    test_merge();
    test_merge_then_int();
    test_check_detects();
    return kv_test_end();
}
